/*
 * projection.cuh - a layer's input projection inside the recurrence's own
 * launch: xp = x W_ih^T + b_ih + b_hh, computed by CTAs the recurrence leaves
 * idle (the FFMA cluster kernel's first clusters: cluster_ffma.cuh), chunk
 * of steps by chunk of steps, while the other clusters step through the
 * chunks already done. It saves the separate GEMM's launches on the host
 * and, where the producers keep ahead (the planner's projection_keeps_up),
 * its time on the GPU (0.24 us/step in float32 at B = 4, H = 1024, where
 * they do not yet: bench/NOTES.md step 30).
 *
 * The work: xp [steps][batch][hidden] (E, contiguous, in the workspace) as
 * items of 32 rows (of W_ih) by the 32 columns (step, sequence) of a chunk
 * of 32 / batch steps, taken in chunk order by producer CTA j = j, j + P, ...
 * A CTA's 8 warps split an item's K (the input size) in blocks of 32; each
 * warp stages its block of W_ih and x as float32, k-major, in its own 8 KiB
 * buffer of shared memory (two, alternating, for float32, which cp.async
 * fills while the other is multiplied; the 16-bit dtypes load the next block
 * into registers instead) and accumulates a 4 x 8 tile per lane; the 8 partial
 * tiles are summed through shared memory, the biases added, the result
 * rounded to E and stored, and then the chunk's flag counts the item:
 * __syncthreads (every store of the CTA done), a GPU-scope fence, an atomic
 * add. A consumer waits (acquire) until its chunk's flag counts every row
 * tile, then reads xp with ld.global.cg: L1 is not coherent, and a line it
 * read before the flag could straddle into the next chunk.
 */
#ifndef PRNN_PROJECTION_CUH
#define PRNN_PROJECTION_CUH

#include "persistent.cuh"
#include "rnn_math.cuh"

namespace prnn {

/* The projection's operands: x [steps][batch][input] times W_ih^T
 * [input][hidden] plus both biases, into the pass's `in`. The FFMA cluster
 * kernel's second parameter, so that the other kernels' parameter block keeps
 * its size (one more field in it turned 212 registers of the sm_80 float32
 * grid-tier kernel into 255 and a spill). */
struct InputProjection {
  int clusters;           /* producer clusters (the launch's first ones); 0: xp is given in `in` */
  int input;              /* I */
  const void *x;          /* steps x batch x input, unit stride along input */
  int64_t x_stride_t;
  int64_t x_stride_b;
  const void *w;          /* hidden x input: W_ih[i][k] at w[i * w_stride + k] */
  int64_t w_stride;
  const void *b_ih;       /* hidden each, or both NULL */
  const void *b_hh;
  unsigned *flags;        /* per chunk of steps: row tiles stored (zeroed by the launcher) */
};

const int kProjTile = 32;                 /* rows and columns of an item, and the K block */
const int kProjBufFloats = 2 * 32 * 32;          /* a staging buffer: W and x blocks, [32 k][32] floats each */
const int kProjWarpFloats = 2 * kProjBufFloats; /* a warp's two buffers */
const int kProjSmemBytes = 8 * kProjWarpFloats * 4 + kProjTile * 8; /* the warps' buffers, x's column offsets */

/* Steps per chunk: 32 columns of (step, sequence). */
__host__ __device__ inline int projection_chunk_steps(int batch) { return batch >= kProjTile ? 1 : kProjTile / batch; }

/* Workspace: the chunk flags (zeroed by the launcher), then xp. */
__host__ __device__ inline size_t projection_flag_bytes(int64_t steps, int batch) {
  const int64_t chunks = (steps + projection_chunk_steps(batch) - 1) / projection_chunk_steps(batch);
  return (size_t)((chunks * 4 + 255) / 256 * 256);
}
__host__ __device__ inline size_t projection_workspace_bytes(int64_t steps, int64_t batch, int64_t hidden,
                                                              size_t elem_bytes) {
  return projection_flag_bytes(steps, (int)batch) + (size_t)(steps * batch * hidden) * elem_bytes;
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ unsigned load_acquire_u32(const unsigned *p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

/* 4 bytes global -> shared, asynchronously; zeros where !valid (src unread). */
__device__ __forceinline__ void cp_async4(float *dst, const void *src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;"
               :: "r"((uint32_t)__cvta_generic_to_shared(dst)), "l"(src), "r"(valid ? 4 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all_but_newest() { asm volatile("cp.async.wait_group 1;" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;" ::: "memory"); }
#endif

/* The swizzled float offset of column c (a multiple of 4) of row k of a [32 k][32] block:
 * 16-byte groups XORed by k % 8, so that a warp's stores (lane = k) and reads
 * (8 lanes a row) are free of bank conflicts. */
__device__ __forceinline__ int proj_at(int k, int c) { return k * 32 + (c ^ (4 * (k & 7))); }

/* Producer CTA `worker` of `workers`: every item it owns, in chunk order. */
template <typename E>
__device__ void project_inputs(const RecurrenceParams &p, const InputProjection &q, float *smem, int worker,
                               int workers) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const E *X = static_cast<const E *>(q.x);
  const E *W = static_cast<const E *>(q.w);
  const E *b_ih = static_cast<const E *>(q.b_ih);
  const E *b_hh = static_cast<const E *>(q.b_hh);
  E *xp = static_cast<E *>(const_cast<void *>(p.in));
  const int T = p.steps, B = p.batch, H = p.hidden, I = q.input;
  const int cs = projection_chunk_steps(B);
  const int row_tiles = (H + kProjTile - 1) / kProjTile;
  const int64_t items = (int64_t)((T + cs - 1) / cs) * row_tiles;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  float *ws = smem + warp * kProjWarpFloats;
  int64_t *col_offsets = reinterpret_cast<int64_t *>(smem + 8 * kProjWarpFloats); /* [32] */
  const int lr = lane >> 2, lc = lane & 3; /* this lane's rows 4 lr .. + 3 and columns 8 lc .. + 7 */

  for (int64_t item = worker; item < items; item += workers) {
    const int chunk = (int)(item / row_tiles), row0 = (int)(item % row_tiles) * kProjTile;
    const int t0 = chunk * cs;
    const int cols = (T - t0 < cs ? T - t0 : cs) * B; /* column n: step t0 + n / B, sequence n % B */
    if (tid < kProjTile) {
      const int n = tid < cols ? tid : 0;
      col_offsets[tid] = (int64_t)(t0 + n / B) * q.x_stride_t + (int64_t)(n % B) * q.x_stride_b;
    }
    __syncthreads();
    float acc[4][8];
#pragma unroll
    for (int r = 0; r < 4; ++r)
#pragma unroll
      for (int c = 0; c < 8; ++c) acc[r][c] = 0.f;

    /* The warp's blocks of K in turn, each staged (W_ih's 32 rows and x's 32
     * columns at column k = kb + lane: loads coalesced along k) while the
     * block before is multiplied: float32 by cp.async into the other of two
     * buffers, the 16-bit dtypes through registers (widened on the way). */
    const int64_t *x_col = col_offsets; /* column n's offset in x */
    auto compute = [&](const float *wb, const float *xb) {
#pragma unroll 4
      for (int kk = 0; kk < kProjTile; ++kk) {
        const float4 a = *reinterpret_cast<const float4 *>(&wb[proj_at(kk, 4 * lr)]);
        const float4 x0 = *reinterpret_cast<const float4 *>(&xb[proj_at(kk, 8 * lc)]);
        const float4 x1 = *reinterpret_cast<const float4 *>(&xb[proj_at(kk, 8 * lc + 4)]);
        const float av[4] = {a.x, a.y, a.z, a.w}, xv[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
        for (int r = 0; r < 4; ++r)
#pragma unroll
          for (int c = 0; c < 8; ++c) acc[r][c] = fmaf(av[r], xv[c], acc[r][c]);
      }
    };
    const int kstep = 8 * kProjTile;
    if constexpr (sizeof(E) == 4) {
      auto stage = [&](int kb, int buf) {
        const int k = kb + lane;
        float *wb = ws + buf * kProjBufFloats, *xb = wb + 32 * 32;
#pragma unroll
        for (int r = 0; r < 32; ++r) {
          const bool ok = row0 + r < H && k < I;
          cp_async4(&wb[proj_at(lane, r & ~3) + (r & 3)], ok ? W + (int64_t)(row0 + r) * q.w_stride + k : W, ok);
        }
#pragma unroll
        for (int n = 0; n < 32; ++n) {
          const bool ok = n < cols && k < I;
          cp_async4(&xb[proj_at(lane, n & ~3) + (n & 3)], ok ? X + x_col[n] + k : X, ok);
        }
      };
      int buf = 0;
      if (warp * kProjTile < I) stage(warp * kProjTile, 0);
      cp_async_commit();
      for (int kb = warp * kProjTile; kb < I; kb += kstep, buf ^= 1) {
        if (kb + kstep < I) stage(kb + kstep, buf ^ 1);
        cp_async_commit();
        cp_async_wait_all_but_newest();
        __syncwarp();
        compute(ws + buf * kProjBufFloats, ws + buf * kProjBufFloats + 32 * 32);
        __syncwarp(); /* every lane done with buf before the next block is staged into it */
      }
      cp_async_wait_all();
      __syncwarp();
    } else {
      float w_next[32], x_next[32];
      auto load_block = [&](int kb) {
        const int k = kb + lane;
#pragma unroll
        for (int r = 0; r < 32; ++r)
          w_next[r] = (row0 + r < H && k < I) ? to_accum(W[(int64_t)(row0 + r) * q.w_stride + k]) : 0.f;
#pragma unroll
        for (int n = 0; n < 32; ++n) x_next[n] = (n < cols && k < I) ? to_accum(X[x_col[n] + k]) : 0.f;
      };
      if (warp * kProjTile < I) load_block(warp * kProjTile);
      for (int kb = warp * kProjTile; kb < I; kb += kstep) {
#pragma unroll
        for (int g = 0; g < 8; ++g) {
          *reinterpret_cast<float4 *>(&ws[proj_at(lane, 4 * g)]) =
              make_float4(w_next[4 * g], w_next[4 * g + 1], w_next[4 * g + 2], w_next[4 * g + 3]);
          *reinterpret_cast<float4 *>(&ws[32 * 32 + proj_at(lane, 4 * g)]) =
              make_float4(x_next[4 * g], x_next[4 * g + 1], x_next[4 * g + 2], x_next[4 * g + 3]);
        }
        __syncwarp();
        if (kb + kstep < I) load_block(kb + kstep);
        compute(ws, ws + 32 * 32);
        __syncwarp();
      }
    }

    /* The warp's partial tile into its own staging space, [column][row]. */
#pragma unroll
    for (int c = 0; c < 8; ++c)
      *reinterpret_cast<float4 *>(&ws[(8 * lc + c) * 32 + 4 * lr]) =
          make_float4(acc[0][c], acc[1][c], acc[2][c], acc[3][c]);
    __syncthreads();
    /* Thread: column tid / 8, rows 4 (tid % 8) .. + 3, summed over the warps;
     * 8 threads store one column's 32 rows, consecutive in xp. */
    const int n = tid >> 3, r0 = 4 * (tid & 7);
    float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int w = 0; w < 8; ++w) {
      const float4 v = *reinterpret_cast<const float4 *>(&smem[w * kProjWarpFloats + n * 32 + r0]);
      sum.x += v.x;
      sum.y += v.y;
      sum.z += v.z;
      sum.w += v.w;
    }
    if (n < cols) {
      const float s[4] = {sum.x, sum.y, sum.z, sum.w};
      E *dst = xp + ((int64_t)(t0 + n / B) * B + n % B) * H;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = row0 + r0 + e;
        if (row < H) {
          const float bias = b_ih != NULL ? to_accum(b_ih[row]) + to_accum(b_hh[row]) : 0.f;
          dst[row] = Round<E>::to(s[e] + bias);
        }
      }
    }
    __syncthreads(); /* every store of the item done, and the staging free for the next */
    if (tid == 0) {
      __threadfence();
      atomicAdd(&q.flags[chunk], 1u);
    }
  }
#endif
}

/* A consumer's wait for chunk `chunk` of xp (every row tile stored). */
__device__ __forceinline__ void wait_projection(const InputProjection &q, int hidden, int chunk) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const unsigned want = (unsigned)((hidden + kProjTile - 1) / kProjTile);
  unsigned long long since = 0;
  for (unsigned round = 1; load_acquire_u32(&q.flags[chunk]) < want; ++round) watchdog(round, &since);
#endif
}

}  // namespace prnn

#endif /* PRNN_PROJECTION_CUH */
