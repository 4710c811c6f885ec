/*
 * cluster_f32.cuh - DRAFT, NOT RUN ON A GPU: the cluster tier for float32
 * (H <= 1024, one sequence per cluster, sm_90).
 *
 * W_hh in float32 is 4 MiB at H = 1024: 256 KiB per CTA of a 16-CTA cluster,
 * more than a register file. CTA c owns rows [64c, 64c + 64) of A; its 256
 * threads split K as the grid tier does (thread tid holds columns
 * word_index(j), j < KL, of every owned row): rows [0, RREG) in registers,
 * rows [RREG, 64) in shared memory (thread-private, one 16-byte load per row
 * a step). FFMA, not tensor cores: float32 numerics. One step:
 *   s_{t-1} slice from shared memory -> 64 x KL FMAs per thread -> warp
 *   reduce-scatter -> shared memory -> 64 threads sum the 8 warps, apply the
 *   activation, write out[t] -> the CTA's 64-row slice of s_t (256 bytes)
 *   into every CTA's shared memory by st.async, 16 bytes a store, counted
 *   down on one mbarrier per state buffer of the receiver.
 * The exchange and barrier protocol is the 16-bit cluster kernel's
 * (cluster.cuh), with one barrier per CTA instead of one per warp.
 *
 * Predicted (bench/NOTES.md "Next"): 1.2-1.6 us/step at H = 1024 (the
 * shared-memory half of A ~0.5 us, the reduce-scatter's shuffles ~0.25, the
 * step's fixed part as in the 16-bit kernel ~0.65) against the grid tier's
 * 2.6 at B = 4. Ideas after a first measurement: per-warp mbarriers (warp w
 * reads only the rows of CTAs w and w + 8), a warp-owns-8-rows split of K
 * (fewer shuffles).
 */
#ifndef PRNN_CLUSTER_F32_CUH
#define PRNN_CLUSTER_F32_CUH

#include "cluster.cuh"

namespace prnn {

/* Dynamic shared memory for K extent KEXT (= 256 KL) with RSH of the 64 rows
 * of A in shared memory: mbarriers [2], then, while stepping, A [RSH][256][KL]
 * fp32, state [2][KEXT], partial sums [8 warps][64], the outgoing slice [64];
 * before stepping, the same space stages the register rows [64 - RSH][256][KL]. */
__host__ __device__ constexpr int cluster_f32_smem_bytes(int kext, int rsh) {
  return 16 + ((rsh * kext + 2 * kext + kClusterWarps * kClusterRows + kClusterRows) > (kClusterRows - rsh) * kext
                   ? (rsh * kext + 2 * kext + kClusterWarps * kClusterRows + kClusterRows)
                   : (kClusterRows - rsh) * kext) * 4;
}

/* Rows [r_begin, r_begin + ROWS) of this CTA's A into dst, in the kernel's
 * thread-private layout: dst[((r - r_begin) * 256 + t) * KL + j] = A[row0 + r][k],
 * k = thread t's j-th column (word_index). A goes in as 16-byte chunks of 4
 * elements along its contiguous dimension (k forward, rows backward), 8 chunks
 * in flight per thread: W_hh^T read element by element, lanes 2H apart, was
 * 32 sectors a load (the 16-bit kernel's NOTES step 16 and 20). */
template <int KL, int ROWS>
__device__ __forceinline__ void stage_a_rows(float *dst, const RecurrenceParams &p, int row0, int r_begin, int tid) {
  constexpr int KEXT = kClusterThreads * KL, CHUNK = 4, INFLIGHT = 8;
  constexpr int ROUNDS = ROWS * KEXT / (CHUNK * kClusterThreads * INFLIGHT);
  static_assert(ROUNDS * CHUNK * kClusterThreads * INFLIGHT == ROWS * KEXT, "bad staging split");
  const float *A = static_cast<const float *>(p.a);
  const int H = p.hidden;
  const bool k_fastest = p.a_stride_col == 1;
  const int64_t line_stride = k_fastest ? p.a_stride_row : p.a_stride_col;
  const bool wide = (k_fastest || p.a_stride_row == 1) && line_stride % CHUNK == 0 &&
                    (reinterpret_cast<uintptr_t>(A) & 15) == 0;
  /* chunk c: forward (row c / (KEXT/4), k 4 (c % (KEXT/4)) + e); backward (row 4 (c % (ROWS/4)) + e, k c / (ROWS/4)) */
  auto chunk_origin = [&](int c, int &r, int &k) {
    r = k_fastest ? c / (KEXT / CHUNK) : (c % (ROWS / CHUNK)) * CHUNK;
    k = k_fastest ? (c % (KEXT / CHUNK)) * CHUNK : c / (ROWS / CHUNK);
  };
  for (int round = 0; round < ROUNDS; ++round) {
    float v[INFLIGHT][CHUNK];
#pragma unroll
    for (int u = 0; u < INFLIGHT; ++u) {
      int r, k;
      chunk_origin((round * INFLIGHT + u) * kClusterThreads + tid, r, k);
      const int i = row0 + r_begin + r;
      const int last_i = k_fastest ? i : i + CHUNK - 1, last_k = k_fastest ? k + CHUNK - 1 : k;
      if (wide && last_i < H && last_k < H) {
        const float4 w = *reinterpret_cast<const float4 *>(A + i * p.a_stride_row + k * p.a_stride_col);
        v[u][0] = w.x;
        v[u][1] = w.y;
        v[u][2] = w.z;
        v[u][3] = w.w;
      } else { /* an edge of A, or a layout 16-byte loads cannot read */
#pragma unroll
        for (int e = 0; e < CHUNK; ++e) {
          const int ii = k_fastest ? i : i + e, kk = k_fastest ? k + e : k;
          v[u][e] = (ii < H && kk < H) ? A[ii * p.a_stride_row + kk * p.a_stride_col] : 0.f;
        }
      }
    }
#pragma unroll
    for (int u = 0; u < INFLIGHT; ++u) {
      int r, k;
      chunk_origin((round * INFLIGHT + u) * kClusterThreads + tid, r, k);
#pragma unroll
      for (int e = 0; e < CHUNK; ++e) {
        const int rr = k_fastest ? r : r + e, kk = k_fastest ? k + e : k; /* kk = word_index(j) of thread t: */
        const int t = (kk >> 1) % kClusterThreads, j = 2 * (kk / (2 * kClusterThreads)) + (kk & 1);
        dst[(rr * kClusterThreads + t) * KL + j] = v[u][e];
      }
    }
  }
}

template <int KL, int RREG>
__global__ void __launch_bounds__(kClusterThreads, 1) cluster_f32_kernel(const RecurrenceParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int R = kClusterRows, RSH = R - RREG, KEXT = kClusterThreads * KL;
  constexpr int N = R, M = N / 32; /* outputs per CTA and step; per lane after the reduce-scatter */
  static_assert(KL % 2 == 0 && RREG >= 1 && RREG <= R && (RSH == 0 || KL % 4 == 0), "bad f32 cluster shape");

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int T = p.steps, B = p.batch, H = p.hidden;
  const unsigned rank = cluster_rank(), ctas = cluster_size();
  const int row0 = (int)rank * R;
  const int seq = (int)cluster_index(); /* one sequence per cluster */
  float *out = static_cast<float *>(p.out);
  const float *in = static_cast<const float *>(p.in);
  const float *yfwd = static_cast<const float *>(p.y);
  const float *h0 = static_cast<const float *>(p.h0);
  const float *A = static_cast<const float *>(p.a);
  /* Thread tid's j-th column: (j/2 * 256 + tid) * 2 + j%2, pairs of consecutive k (8-byte loads). */
  auto word_index = [&](int j) { return ((j >> 1) * kClusterThreads + tid) * 2 + (j & 1); };

  extern __shared__ __align__(16) unsigned char smem[];
  uint64_t *bars = reinterpret_cast<uint64_t *>(smem);
  float *a_smem = reinterpret_cast<float *>(smem + 16);
  float *state = a_smem + RSH * KEXT;
  float *partial = state + 2 * KEXT;
  float *slice = partial + kClusterWarps * R;

  /* A: the register rows pass through the space the shared-memory rows and
   * the state later take, then the shared-memory rows go to their place. */
  float a_reg[RREG][KL];
  stage_a_rows<KL, RREG>(a_smem, p, row0, 0, tid);
  __syncthreads();
#pragma unroll
  for (int r = 0; r < RREG; ++r)
#pragma unroll
    for (int j = 0; j < KL; j += 2) {
      const float2 v = *reinterpret_cast<const float2 *>(&a_smem[(r * kClusterThreads + tid) * KL + j]);
      a_reg[r][j] = v.x;
      a_reg[r][j + 1] = v.y;
    }
  __syncthreads();
  if constexpr (RSH > 0) stage_a_rows<KL, RSH>(a_smem, p, row0, RREG, tid);

  /* Both state buffers zero (rows past H stay zero), then s_{-1} = h0 (zero backward). */
  for (int i = tid; i < 2 * KEXT; i += kClusterThreads) state[i] = 0.f;
  __syncthreads();
  if (!p.backward)
    for (int k = tid; k < H; k += kClusterThreads) state[k] = h0[(size_t)seq * p.h0_stride_b + k];

  /* Epilogue: thread tid < 64 owns row row0 + tid; operands loaded two steps ahead. */
  const bool o_valid = tid < R && row0 + tid < H;
  const int o_row = row0 + tid, o_len = o_valid ? sequence_length(p.lengths, seq, T) : 0;
  auto load_in = [&](int s_at) {
    const int t = p.backward ? T - 1 - s_at : s_at;
    return o_valid ? in[t * p.in_stride_t + seq * p.in_stride_b + o_row] : 0.f;
  };
  auto load_y = [&](int s_at) {
    const int t = p.backward ? T - 1 - s_at : s_at;
    return (o_valid && p.backward) ? yfwd[((size_t)t * B + seq) * H + o_row] : 0.f;
  };
  float o_in = load_in(0), o_y = load_y(0);
  float next_in = T > 1 ? load_in(1) : 0.f, next_y = T > 1 ? load_y(1) : 0.f;
  float after_in = T > 2 ? load_in(2) : 0.f, after_y = T > 2 ? load_y(2) : 0.f;

  const uint32_t bar_base = (uint32_t)__cvta_generic_to_shared(bars);
  if (tid == 0) {
    mbarrier_init(bar_base, 1);
    mbarrier_init(bar_base + 8u, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  cluster_arrive();
  cluster_wait();
  /* Every CTA sends all 64 rows (zeros past H): C * 256 bytes per step into each CTA. */
  const unsigned step_bytes = ctas * (unsigned)R * 4u;
  const int chunk = tid & 15, peer = tid >> 4; /* 16 chunks of 4 rows, one store per (peer, chunk) */
  const uint32_t state_base = (uint32_t)__cvta_generic_to_shared(state);

  for (int s = 0; s < T; ++s) {
    const int t = p.backward ? T - 1 - s : s;
    const int cur = s & 1;
    const float *prev = state + cur * KEXT;
    if (tid == 0 && s + 1 < T) mbarrier_expect_bytes(bar_base + 8u * (1 - cur), step_bytes);
    if (s > 0) {
      unsigned long long since = 0; /* for the watchdog */
      for (unsigned round = 1; !mbarrier_done(bar_base + 8u * cur, ((s - 1) >> 1) & 1); ++round)
        watchdog(round, &since);
    }

    float h[KL];
#pragma unroll
    for (int j = 0; j < KL; j += 2) {
      const float2 v = *reinterpret_cast<const float2 *>(prev + word_index(j));
      h[j] = v.x;
      h[j + 1] = v.y;
    }
    float acc[N];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float a[KL];
      if (r < RREG) {
#pragma unroll
        for (int j = 0; j < KL; ++j) a[j] = a_reg[r < RREG ? r : 0][j];
      } else if constexpr (RSH > 0) {
#pragma unroll
        for (int j = 0; j < KL; j += 4) {
          const float4 v = *reinterpret_cast<const float4 *>(&a_smem[((r - RREG) * kClusterThreads + tid) * KL + j]);
          a[j] = v.x;
          a[j + 1] = v.y;
          a[j + 2] = v.z;
          a[j + 3] = v.w;
        }
      }
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < KL; ++j) sum = fmaf(a[j], h[j], sum);
      acc[r] = sum;
    }
    ReduceScatter<N, N, 16>::run(acc, lane);
#pragma unroll
    for (int m = 0; m < M; ++m) partial[warp * N + lane * M + m] = acc[m];
    __syncthreads();

    if (tid < R) {
      float mat = 0.f;
#pragma unroll
      for (int w = 0; w < kClusterWarps; ++w) mat += partial[w * N + tid];
      const bool active = o_valid && t < o_len;
      /* past the length the state stays s_{t-1}: this CTA's own buffer holds it */
      const float frozen = (o_valid && !active && !p.backward) ? prev[o_row] : 0.f;
      float st;
      const float value = step_output(p.backward, p.activation, active, mat, o_in, o_y, frozen, &st);
      if (o_valid) out[((size_t)t * B + seq) * H + o_row] = value;
      slice[tid] = o_valid ? st : 0.f; /* padding publishes zeros */
    }
    __syncthreads();

    if (s + 1 < T && peer < (int)ctas) {
      const uint4 v = *reinterpret_cast<const uint4 *>(slice + 4 * chunk);
      const uint32_t local = state_base + (uint32_t)(((1 - cur) * KEXT + row0 + 4 * chunk) * 4);
      store_peer16_async(peer_address(local, (unsigned)peer), v,
                         peer_address(bar_base + 8u * (1 - cur), (unsigned)peer));
    }
    if (s + 1 < T) {
      o_in = next_in;
      o_y = next_y;
      next_in = after_in;
      next_y = after_y;
      if (s + 3 < T) {
        after_in = load_in(s + 3);
        after_y = load_y(s + 3);
      }
    }
  }
#else
  __trap(); /* never launched: the planner requires compute capability 9.0 */
#endif
}

/* The float32 shapes: KL = 2 (H <= 512, all 64 rows in registers), KL = 4
 * (H <= 1024, 32 rows in registers and 32 in shared memory). */
struct ClusterF32Config {
  int k_per_thread; /* KL */
  int reg_rows;     /* RREG */
  PersistentKernel kernel;
};
extern const ClusterF32Config cluster_configs_f32[];
extern const int cluster_config_count_f32;

}  // namespace prnn

#endif /* PRNN_CLUSTER_F32_CUH */
