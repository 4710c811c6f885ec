/*
 * projection.cuh - a layer's input projection inside the recurrence's own
 * launch: xp = x W_ih^T + b_ih + b_hh, computed by CTAs the recurrence leaves
 * idle (a cluster kernel's first clusters: cluster_ffma.cuh in float32,
 * cluster.cuh in 16 bits), chunk of steps by chunk of steps, while the other
 * clusters step through the chunks already done. It saves the separate
 * GEMM's launches on the host and, where the producers keep ahead (the
 * planner's projection_keeps_up), its time on the GPU (0.24 us/step in
 * float32 at B = 4, H = 1024: bench/NOTES.md steps 30 and 31).
 *
 * The work: xp [steps][batch][hidden] (E, contiguous, in the workspace) as
 * items of 32 rows (of W_ih) by the 32 columns (step, sequence) of a chunk
 * of 32 / batch steps, taken in chunk order by producer CTA j = j, j + P, ...
 * A CTA's 8 warps split an item's K (the input size) in blocks of 32; each
 * warp stages its blocks of W_ih and x at their width, row-major with
 * swizzled 16-byte chunks (proj_at, proj_at16), in its own shared memory,
 * the next block (of this item or the next) on its way into a second buffer
 * while one is multiplied (FFMA in float32, mma in 16 bits), and accumulates
 * a 32 x 32 partial tile in fp32; the 8 partial tiles are summed through shared
 * memory, the biases added, the result rounded to E and stored, and then the
 * chunk's flag counts the item: __syncthreads (every store of the CTA done),
 * a GPU-scope fence, an atomic add. A consumer warp waits (acquire) until its
 * chunk's flag counts every row tile - reading the next 31 chunks' flags in
 * the same round trip, so that it waits again only past the run found
 * complete - then reads xp with ld.global.cg: L1 is not coherent, and a line
 * it read before the flag could straddle into the next chunk.
 */
#ifndef PRNN_PROJECTION_CUH
#define PRNN_PROJECTION_CUH

#include "dsmem.cuh"
#include "exchange.cuh"
#include "mma.cuh"
#include "rnn_math.cuh"

namespace prnn {

/* The projection's operands: x [steps][batch][input] times W_ih^T
 * [input][hidden] plus both biases, into the pass's `in`. The cluster
 * kernels' second parameter, so that the other kernels' parameter block keeps
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

const int kProjTile = 32;                        /* rows and columns of an item, and the K block */
const int kProjBlockFloats = kProjTile * kProjTile; /* one staged [32][32] block */
const int kProjWarpFloats = 4 * kProjBlockFloats;   /* a warp's two buffers of a W_ih block and an x block */
/* the warps' buffers, their partial tiles, x's column offsets */
const int kProjSmemBytes = 8 * (kProjWarpFloats + kProjBlockFloats) * 4 + kProjTile * 8;
/* Where a producer's shared memory starts: at byte 128, past a stepper's
 * mbarriers, so that producer and stepper CTAs never use the same bytes
 * (racecheck reported the tensor-core kernel's mbarrier set-up against a
 * producer's reads when they overlapped: only CTAs run one after another on
 * an SM could see both), and 128-byte aligned (from byte 16 the producers
 * took 4% longer and the steppers beside them ~11%: bench/NOTES.md step 37). */
const int kProjSmemOffset = 128;

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

/* global -> shared, asynchronously: 16 bytes of which the first src_bytes are
 * read and the rest zeroed, or 4 bytes (zeros where !valid; src unread then). */
__device__ __forceinline__ void cp_async16(void *dst, const void *src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
               :: "r"((uint32_t)__cvta_generic_to_shared(dst)), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async4(float *dst, const void *src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;"
               :: "r"((uint32_t)__cvta_generic_to_shared(dst)), "l"(src), "r"(valid ? 4 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all_but_newest() { asm volatile("cp.async.wait_group 1;" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;" ::: "memory"); }
#endif

/* Float offset of (row r, k) in a staged [32 rows][32 k] block: row-major, its
 * 16-byte chunks XORed by r / 4 % 8. Free of bank conflicts for the stores
 * (a 16-byte copy: 8 lanes a row; a 4-byte one: 32 lanes a row) and for the
 * multiply's 16-byte reads (8 rows 4 apart, or 4 columns 8 apart, a warp). */
__device__ __forceinline__ int proj_at(int r, int k) { return r * 32 + ((((k >> 2) ^ (r >> 2)) & 7) << 2) + (k & 3); }
/* Float offset of (column n, row r) in a warp's partial tile, [32 n][32 r]:
 * chunks XORed so that the lanes' 16-byte stores (rows 4 (lane / 4), columns
 * 8 (lane % 4) + c) spread over the banks. */
__device__ __forceinline__ int proj_partial_at(int n, int r) {
  return n * 32 + ((((r >> 2) ^ (2 * ((n >> 3) & 3))) & 7) << 2) + (r & 3);
}

/* Where an item of the projection lies: W_ih's rows row0 .. + 31 by the
 * columns (step t0 + n / batch, sequence n % batch), n < cols, of a chunk. */
struct ProjItem {
  int chunk, row0, t0, cols;
};
__device__ __forceinline__ ProjItem proj_item(int64_t item, int row_tiles, int chunk_steps, int steps, int batch) {
  ProjItem it;
  it.chunk = (int)(item / row_tiles);
  it.row0 = (int)(item % row_tiles) * kProjTile;
  it.t0 = it.chunk * chunk_steps;
  it.cols = (steps - it.t0 < chunk_steps ? steps - it.t0 : chunk_steps) * batch;
  return it;
}

/* Element offset of (row r, k) in a staged 16-bit [32 rows][32 k] block:
 * row-major, its four 16-byte chunks XORed by r / 2 % 4, so that ldmatrix's 8
 * rows of one chunk and the 16-byte copies hit 8 different 16-byte bank groups. */
__device__ __forceinline__ int proj_at16(int r, int k) { return r * 32 + ((((k >> 3) ^ (r >> 1)) & 3) << 3) + (k & 7); }

/* Producer CTA `worker` of `workers`: every item it owns, in chunk order. The
 * 8 warps split an item's K in blocks of 32; each warp stages its blocks
 * (W_ih's 32 rows and x's 32 columns, at the element width) in its own
 * buffers; while it multiplies one block, the next one - of this item or,
 * past its last, of the next item - is on its way by cp.async into the other
 * buffer (16 bytes a lane where x and W_ih are 16-byte aligned along K; else
 * 4-byte copies in float32, plain loads and stores in 16 bits). float32
 * multiplies by FFMA, a 4 x 8 tile per lane; the 16-bit dtypes by mma
 * (fp32 sums), 2 x 4 tiles of 16 x 8 per warp. The 8 partial tiles are summed
 * through shared memory, the biases added, the result rounded to E and
 * stored, and then the chunk's flag counts the item. */
template <typename E>
__device__ void project_inputs(const RecurrenceParams &p, const InputProjection &q, float *smem, int worker,
                               int workers) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr bool F32 = sizeof(E) == 4;
  constexpr int V = 16 / (int)sizeof(E); /* elements per 16-byte copy */
  const E *X = static_cast<const E *>(q.x);
  const E *W = static_cast<const E *>(q.w);
  const E *b_ih = static_cast<const E *>(q.b_ih);
  const E *b_hh = static_cast<const E *>(q.b_hh);
  E *xp = static_cast<E *>(const_cast<void *>(p.in));
  const int T = p.steps, B = p.batch, H = p.hidden, I = q.input;
  const int cs = projection_chunk_steps(B);
  const int row_tiles = (H + kProjTile - 1) / kProjTile;
  const int64_t items = (int64_t)((T + cs - 1) / cs) * row_tiles;
  if (worker >= items) return;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  float *ws = smem + warp * kProjWarpFloats;
  float *partials = smem + 8 * kProjWarpFloats;                          /* [8 warps][32 n][32 r] */
  int64_t *col_offsets = reinterpret_cast<int64_t *>(partials + 8 * kProjBlockFloats); /* [32] */
  /* column n's offset in x from its chunk's first step: the same for every chunk */
  if (tid < kProjTile) col_offsets[tid] = (int64_t)(tid / B) * q.x_stride_t + (int64_t)(tid % B) * q.x_stride_b;
  __syncthreads();

  /* 16-byte copies need 16-byte aligned sources along every row of W_ih and x */
  const bool wide = ((uintptr_t)X % 16 == 0) && ((uintptr_t)W % 16 == 0) && q.w_stride % V == 0 &&
                    q.x_stride_t % V == 0 && q.x_stride_b % V == 0;
  const int k_first = warp * kProjTile, kstep = 8 * kProjTile;
  const int blocks = k_first < I ? (I - k_first + kstep - 1) / kstep : 0; /* this warp's K blocks of an item */

  /* Stage block kb of item `it` into buffer `buf`. float32, 16 bytes: lane
   * copies chunk lane % 8 of rows (columns) 4 i + lane / 8; 4 bytes: lane
   * copies k = kb + lane of each. 16-bit, 16 bytes: chunk lane % 4 of rows
   * 8 i + lane / 4; else k = kb + lane of each, through registers. */
  auto stage = [&](const ProjItem &it, int kb, int buf) {
    float *wb = ws + buf * 2 * kProjBlockFloats, *xb = wb + kProjBlockFloats;
    const E *x_chunk = X + (int64_t)it.t0 * q.x_stride_t;
    if (wide) {
      constexpr int ROWS_PER_COPY = 32 / (kProjTile / V); /* rows one warp-wide copy covers: 4 or 8 */
      const int k = kb + V * (lane % (kProjTile / V)), rest = I - k;
      const int bytes = rest >= V ? 16 : rest > 0 ? (int)sizeof(E) * rest : 0;
#pragma unroll
      for (int i = 0; i < kProjTile / ROWS_PER_COPY; ++i) {
        const int r = ROWS_PER_COPY * i + lane / (kProjTile / V);
        const bool w_ok = it.row0 + r < H && bytes > 0, x_ok = r < it.cols && bytes > 0;
        const int at = F32 ? proj_at(r, k - kb) : proj_at16(r, k - kb);
        cp_async16(F32 ? (void *)&wb[at] : (void *)((unsigned short *)wb + at),
                   w_ok ? W + (int64_t)(it.row0 + r) * q.w_stride + k : W, w_ok ? bytes : 0);
        cp_async16(F32 ? (void *)&xb[at] : (void *)((unsigned short *)xb + at),
                   x_ok ? x_chunk + col_offsets[r] + k : X, x_ok ? bytes : 0);
      }
    } else { /* rows only 4- (float32) or 2-byte aligned: k = kb + lane of each row */
      const int k = kb + lane;
#pragma unroll 8
      for (int r = 0; r < 32; ++r) {
        const bool w_ok = it.row0 + r < H && k < I, x_ok = r < it.cols && k < I;
        const E *w_src = w_ok ? W + (int64_t)(it.row0 + r) * q.w_stride + k : W;
        const E *x_src = x_ok ? x_chunk + col_offsets[r] + k : X;
        if constexpr (F32) {
          cp_async4(&wb[proj_at(r, lane)], w_src, w_ok);
          cp_async4(&xb[proj_at(r, lane)], x_src, x_ok);
        } else { /* no cp.async that narrow: through registers */
          reinterpret_cast<unsigned short *>(wb)[proj_at16(r, lane)] = w_ok ? (unsigned short)bits16(*w_src) : 0;
          reinterpret_cast<unsigned short *>(xb)[proj_at16(r, lane)] = x_ok ? (unsigned short)bits16(*x_src) : 0;
        }
      }
    }
  };

  /* float32: this lane's rows 4 lr .. + 3 and columns 8 lc .. + 7, acc[8 j + c];
   * 16-bit: mma tile (m, n) = rows 16 m .., columns 8 n .., its C fragment at acc[4 (4 m + n)]. */
  const int lr = lane >> 2, lc = lane & 3;
  float acc[32];
  /* The multiply of one staged block. */
  auto multiply = [&](const float *wb, const float *xb) {
    if constexpr (F32) { /* 4 k at a time: 4 rows and 8 columns of 16 bytes each */
      float4 a[4], x[8];
#pragma unroll 2
      for (int kq = 0; kq < kProjTile; kq += 4) {
#pragma unroll
        for (int j = 0; j < 4; ++j) a[j] = *reinterpret_cast<const float4 *>(&wb[proj_at(4 * lr + j, kq)]);
#pragma unroll
        for (int c = 0; c < 8; ++c) x[c] = *reinterpret_cast<const float4 *>(&xb[proj_at(8 * lc + c, kq)]);
        /* k outermost: the 32 FMAs in a row update 32 different sums */
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
#pragma unroll
          for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int c = 0; c < 8; ++c)
              acc[8 * j + c] = fmaf(reinterpret_cast<const float *>(&a[j])[kk],
                                    reinterpret_cast<const float *>(&x[c])[kk], acc[8 * j + c]);
      }
    } else { /* A = W_ih rows (2 m-tiles x 2 k-tiles), B = x columns (4 n-tiles), as the cluster kernel's */
      const uint32_t wbase = (uint32_t)__cvta_generic_to_shared(wb), xbase = (uint32_t)__cvta_generic_to_shared(xb);
      uint32_t a[2][2][4], b[4][4];
#pragma unroll
      for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int kt = 0; kt < 2; ++kt)
          ldmatrix_x4(wbase + 2u * (uint32_t)proj_at16(16 * m + (lane & 15), 16 * kt + 8 * (lane >> 4)), a[m][kt][0],
                      a[m][kt][1], a[m][kt][2], a[m][kt][3]);
#pragma unroll
      for (int n = 0; n < 4; ++n) /* matrices k 0-7, 8-15 (k-tile 0), 16-23, 24-31 (k-tile 1) */
        ldmatrix_x4(xbase + 2u * (uint32_t)proj_at16(8 * n + (lane & 7), 8 * (lane >> 3)), b[n][0], b[n][1], b[n][2],
                    b[n][3]);
#pragma unroll
      for (int kt = 0; kt < 2; ++kt)
#pragma unroll
        for (int m = 0; m < 2; ++m)
#pragma unroll
          for (int n = 0; n < 4; ++n)
            MmaOp<E>::run(*reinterpret_cast<float(*)[4]>(&acc[4 * (4 * m + n)]), a[m][kt], b[n][2 * kt],
                          b[n][2 * kt + 1]);
    }
  };

  int64_t item = worker;
  ProjItem it = proj_item(item, row_tiles, cs, T, B);
  if (blocks > 0) stage(it, k_first, 0);
  cp_async_commit();
  int buf = 0;
  for (;;) {
#pragma unroll
    for (int j = 0; j < 32; ++j) acc[j] = 0.f;
    for (int b = 0; b < blocks; ++b) {
      /* the block after this one: this item's next, or the next item's first */
      const bool last = b + 1 == blocks, more = !last || item + workers < items;
      ProjItem next = it;
      if (last) next = proj_item(item + workers, row_tiles, cs, T, B);
      const int next_kb = last ? k_first : k_first + (b + 1) * kstep;
      if (more) stage(next, next_kb, buf ^ 1);
      cp_async_commit();
      cp_async_wait_all_but_newest();
      __syncwarp();
      multiply(ws + buf * 2 * kProjBlockFloats, ws + buf * 2 * kProjBlockFloats + kProjBlockFloats);
      buf ^= 1;
      __syncwarp(); /* every lane done with the buffer before the next block is staged into it */
    }

    /* The warp's partial tile, then thread: column tid / 8, rows 4 (tid % 8)
     * .. + 3, summed over the warps; 8 threads store one column's 32 rows,
     * consecutive in xp. */
    float *mine = partials + warp * kProjBlockFloats;
    if constexpr (F32) {
#pragma unroll
      for (int c = 0; c < 8; ++c)
        *reinterpret_cast<float4 *>(&mine[proj_partial_at(8 * lc + c, 4 * lr)]) =
            make_float4(acc[c], acc[8 + c], acc[16 + c], acc[24 + c]);
    } else { /* C fragment: rows 16 m + lr (+ 8), columns 8 n + 2 lc (+ 1) */
#pragma unroll
      for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int n = 0; n < 4; ++n) {
          const float *c = &acc[4 * (4 * m + n)];
          const int row = 16 * m + lr, col = 8 * n + 2 * lc;
          mine[proj_partial_at(col, row)] = c[0];
          mine[proj_partial_at(col + 1, row)] = c[1];
          mine[proj_partial_at(col, row + 8)] = c[2];
          mine[proj_partial_at(col + 1, row + 8)] = c[3];
        }
    }
    __syncthreads();
    const int n = tid >> 3, r0 = 4 * (tid & 7);
    float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int w = 0; w < 8; ++w) {
      const float4 v = *reinterpret_cast<const float4 *>(&partials[w * kProjBlockFloats + proj_partial_at(n, r0)]);
      sum.x += v.x;
      sum.y += v.y;
      sum.z += v.z;
      sum.w += v.w;
    }
    if (n < it.cols) {
      const float s[4] = {sum.x, sum.y, sum.z, sum.w};
      E *dst = xp + ((int64_t)(it.t0 + n / B) * B + n % B) * H;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = it.row0 + r0 + e;
        if (row < H) {
          const float bias = b_ih != NULL ? to_accum(b_ih[row]) + to_accum(b_hh[row]) : 0.f;
          dst[row] = Round<E>::to(s[e] + bias);
        }
      }
    }
    __syncthreads(); /* every store of the item done, and the partial tiles free for the next */
    if (tid == 0) {
      __threadfence();
      atomicAdd(&q.flags[it.chunk], 1u);
    }
    item += workers;
    if (item >= items) break;
    it = proj_item(item, row_tiles, cs, T, B);
  }
  cp_async_wait_all();
#endif
}

/* A warp's wait for chunk `chunk` of xp (every row tile stored), called by
 * all its lanes: lane l reads the flag of chunk `chunk` + l (acquire), so one
 * round trip sees 32 chunks, and the warp barrier orders every lane's later
 * loads after those acquires. Returns the end of the run of complete chunks
 * from `chunk` (warp-uniform; `chunks`, the launch's count, and past it count
 * as complete): with the producers ahead, the waits for the chunks before it
 * cost nothing. One acquire per chunk (lane 0, then the warp barrier) took
 * a round trip to L2 at every chunk on the steppers' critical path. */
__device__ __forceinline__ int wait_projection_run(const InputProjection &q, int hidden, int chunk, int chunks) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const unsigned want = (unsigned)((hidden + kProjTile - 1) / kProjTile);
  const int c = chunk + (int)(threadIdx.x & 31);
  unsigned long long since = 0;
  for (unsigned round = 1;; ++round) {
    const bool complete = c >= chunks || load_acquire_u32(&q.flags[c]) >= want;
    const unsigned missing = __ballot_sync(0xffffffffu, !complete);
    if ((missing & 1u) == 0) {
      __syncwarp();
      return missing ? chunk + __ffs(missing) - 1 : chunk + 32;
    }
    watchdog(round, &since);
  }
#else
  return chunks;
#endif
}

/* The first step of xp not yet known stored, after making sure step `s` is
 * (`ready_step`: the one before); steps come in chunks of
 * projection_chunk_steps(batch). From the kernel's parameters, so that the
 * chunk sizes cost no registers in the step loop. */
__device__ __forceinline__ int wait_projection_step(const RecurrenceParams &p, const InputProjection &q, int s,
                                                    int ready_step) {
  if (s < ready_step) return ready_step;
  const int chunk_steps = projection_chunk_steps(p.batch);
  return chunk_steps * wait_projection_run(q, p.hidden, s / chunk_steps, (p.steps + chunk_steps - 1) / chunk_steps);
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
/* A fused layer's launch (proj.clusters > 0, either cluster kernel): its
 * first proj.clusters clusters compute xp (project_inputs) and this returns
 * true when done; the rest step, and get false. */
template <typename E>
__device__ __forceinline__ bool project_if_producer(const RecurrenceParams &p, const InputProjection &proj,
                                                    unsigned char *smem, unsigned rank, unsigned ctas) {
  if ((int)cluster_index() >= proj.clusters) return false;
  project_inputs<E>(p, proj, reinterpret_cast<float *>(smem + kProjSmemOffset), (int)(cluster_index() * ctas + rank),
                    proj.clusters * (int)ctas);
  return true;
}
#endif

}  // namespace prnn

#endif /* PRNN_PROJECTION_CUH */
