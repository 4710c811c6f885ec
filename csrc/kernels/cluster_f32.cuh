/*
 * cluster_f32.cuh - the cluster tier for float32 (H <= 1024, sm_90): one
 * sequence per cluster of one CTA per 64 rows of A (at least two CTAs).
 *
 * W_hh in float32 is 4 MiB at H = 1024, 256 KiB per CTA of a 16-CTA cluster:
 * more than a register file holds beside the rest. Warp w of CTA c owns rows
 * 64c + 8w .. 64c + 8w + 7 of A over all of K; lane l holds columns
 * 128j + 4l .. 128j + 4l + 3 (j < KC) of each, rows [0, RREG) in registers
 * and [RREG, 8) in shared memory, read as float4s free of bank conflicts.
 * FFMA, not tensor cores: float32 numerics. A step, each warp on its own
 * (no CTA-wide barrier):
 *   wait for s_{t-1} (one mbarrier per state buffer counts the bytes the
 *   cluster sent) -> 32 KC FMAs per row and lane -> 9 shuffles sum the 8 rows
 *   over the warp -> lanes 4r apply the activation and write out[t] -> the
 *   warp's 8 rows (32 bytes) into every CTA's other state buffer by st.async,
 *   one lane per (peer, half).
 * Two state buffers are enough: a peer writes buffer X again only for step
 * s + 2, after it had every row of step s + 1, which every warp here sends
 * only after it read buffer X in step s.
 */
#ifndef PRNN_CLUSTER_F32_CUH
#define PRNN_CLUSTER_F32_CUH

#include "cluster.cuh"

namespace prnn {

const int kClusterF32WarpRows = kClusterRows / kClusterWarps; /* 8 rows of A per warp */

/* Dynamic shared memory of shape <KC, RREG> (K extent 128 KC, RREG of a
 * warp's 8 rows in registers): mbarriers [2], then, while stepping, the
 * shared-memory rows of A [8 - RREG][KC][8 warps][32 lanes] float4 and the
 * state [2][128 KC] fp32; before stepping, the same space stages the
 * register rows [RREG][KC][8][32] float4. */
__host__ __device__ constexpr int cluster_f32_smem_bytes(int kc, int rreg) {
  return 16 + ((kClusterF32WarpRows - rreg) * kc * 1024 + 2 * kc * 128 > rreg * kc * 1024
                   ? (kClusterF32WarpRows - rreg) * kc * 1024 + 2 * kc * 128
                   : rreg * kc * 1024) * 4;
}

/* The float4 slot of (row rr of warp w, column k) within its [32 lanes]
 * group: lane (k % 128) / 4, swizzled by (w + rr) % 8. Reads (one lane per
 * slot) stay free of bank conflicts, and the backward's staging, where the
 * lanes of a warp store one column k of up to 24 rows, spreads them over
 * 8 banks instead of one (16- to 24-way conflicts, ~19 us per call at
 * H = 1024 by a review's count). */
__device__ __forceinline__ int a_slot(int lane, int w, int rr) { return lane ^ ((w + rr) & 7); }

/* Rows rr_begin .. rr_begin + ROWS8 - 1 of each warp's 8 (CTA rows
 * 8w + rr) into dst, laid out [rr - rr_begin][KC][8 warps][32 slots] float4:
 * element k of a row sits in float4 (k / 128, a_slot((k % 128) / 4, w, rr)). A goes in
 * as 16-byte chunks of 4 elements along its contiguous dimension (k forward,
 * rows backward), 8 chunks in flight per thread: W_hh^T read element by
 * element has lanes 2H elements apart (the 16-bit kernel's NOTES step 16). */
template <int KC, int ROWS8>
__device__ __forceinline__ void stage_a_rows(float *dst, const RecurrenceParams &p, int row0, int rr_begin,
                                             int tid) {
  constexpr int KEXT = 128 * KC, NR = kClusterWarps * ROWS8, INFLIGHT = 8;
  /* chunk lengths: 4 columns forward; 4 rows backward, 2 if a warp stages 2 or 6 */
  constexpr int KCH = 4, RCH = ROWS8 % 4 == 0 ? 4 : 2;
  static_assert(ROWS8 % RCH == 0 && (NR * KEXT) % (KCH * kClusterThreads * INFLIGHT) == 0 &&
                    (NR * KEXT) % (RCH * kClusterThreads * INFLIGHT) == 0, "bad staging split");
  const float *A = static_cast<const float *>(p.a);
  const int H = p.hidden;
  const bool k_fastest = p.a_stride_col == 1;
  const int chunk = k_fastest ? KCH : RCH;
  const int64_t line_stride = k_fastest ? p.a_stride_row : p.a_stride_col;
  const bool wide = (k_fastest || p.a_stride_row == 1) && line_stride % chunk == 0 &&
                    (reinterpret_cast<uintptr_t>(A) & (4 * chunk - 1)) == 0;
  const int rounds = NR * KEXT / (chunk * kClusterThreads * INFLIGHT);
  /* chunk c: forward, row slot c / (KEXT/4) and k 4 (c % (KEXT/4)) + e; backward,
   * column k = c / (NR/RCH) and row slots RCH (c % (NR/RCH)) + e. A row slot q
   * is warp q / ROWS8's row rr_begin + q % ROWS8. */
  auto chunk_origin = [&](int c, int &w, int &rr, int &k) {
    const int q = k_fastest ? c / (KEXT / KCH) : (c % (NR / RCH)) * RCH;
    k = k_fastest ? (c % (KEXT / KCH)) * KCH : c / (NR / RCH);
    w = q / ROWS8;
    rr = rr_begin + q % ROWS8;
  };
  auto at = [&](int rr, int w, int k) { /* dst index of (row rr of warp w, column k) */
    return ((((rr - rr_begin) * KC + k / 128) * kClusterWarps + w) * 32 + a_slot((k % 128) / 4, w, rr)) * 4 + k % 4;
  };
  for (int round = 0; round < rounds; ++round) {
    float v[INFLIGHT][4];
#pragma unroll
    for (int u = 0; u < INFLIGHT; ++u) {
      int w, rr, k;
      chunk_origin((round * INFLIGHT + u) * kClusterThreads + tid, w, rr, k);
      const int i = row0 + kClusterF32WarpRows * w + rr;
      const int last_i = k_fastest ? i : i + RCH - 1, last_k = k_fastest ? k + KCH - 1 : k;
      const float *src = A + i * p.a_stride_row + k * p.a_stride_col;
      if (wide && last_i < H && last_k < H && (k_fastest || RCH == 4)) {
        const float4 x = *reinterpret_cast<const float4 *>(src);
        v[u][0] = x.x;
        v[u][1] = x.y;
        v[u][2] = x.z;
        v[u][3] = x.w;
      } else if (wide && last_i < H && last_k < H) {
        const float2 x = *reinterpret_cast<const float2 *>(src);
        v[u][0] = x.x;
        v[u][1] = x.y;
      } else { /* an edge of A, or a layout wide loads cannot read */
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int ii = k_fastest ? i : i + e, kk = k_fastest ? k + e : k;
          if (e < chunk) v[u][e] = (ii < H && kk < H) ? A[ii * p.a_stride_row + kk * p.a_stride_col] : 0.f;
        }
      }
    }
#pragma unroll
    for (int u = 0; u < INFLIGHT; ++u) {
      int w, rr, k;
      chunk_origin((round * INFLIGHT + u) * kClusterThreads + tid, w, rr, k);
      if (k_fastest) { /* the 4 columns are one float4 of dst */
        *reinterpret_cast<float4 *>(dst + at(rr, w, k)) = make_float4(v[u][0], v[u][1], v[u][2], v[u][3]);
      } else {
#pragma unroll
        for (int e = 0; e < RCH; ++e) dst[at(rr + e, w, k)] = v[u][e];
      }
    }
  }
}

template <int KC, int RREG>
__global__ void __launch_bounds__(kClusterThreads, 1) cluster_f32_kernel(const RecurrenceParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int WR = kClusterF32WarpRows, RSH = WR - RREG, KEXT = 128 * KC;
  static_assert(RREG >= 1 && RREG <= WR && RREG % 2 == 0, "bad f32 cluster shape");

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int T = p.steps, B = p.batch, H = p.hidden;
  const unsigned rank = cluster_rank(), ctas = cluster_size();
  const int row0 = (int)rank * kClusterRows;
  const int seq = (int)cluster_index(); /* one sequence per cluster */
  float *out = static_cast<float *>(p.out);
  const float *in = static_cast<const float *>(p.in);
  const float *yfwd = static_cast<const float *>(p.y);
  const float *h0 = static_cast<const float *>(p.h0);

  extern __shared__ __align__(16) unsigned char smem[];
  uint64_t *bars = reinterpret_cast<uint64_t *>(smem);
  float *a_smem = reinterpret_cast<float *>(smem + 16);
  float *state = a_smem + RSH * KC * kClusterWarps * 32 * 4;
  const float4 *a_smem4 = reinterpret_cast<const float4 *>(a_smem);
  /* float4 (row rr >= RREG, chunk j) of this lane */
  auto smem_row = [&](int rr, int j) {
    return a_smem4[((rr - RREG) * KC + j) * kClusterWarps * 32 + warp * 32 + a_slot(lane, warp, rr)];
  };

  /* A: the register rows pass through the space the shared-memory rows and
   * the state take later; then the shared-memory rows go to their place. */
  float4 a_reg[RREG][KC];
  stage_a_rows<KC, RREG>(a_smem, p, row0, 0, tid);
  __syncthreads();
#pragma unroll
  for (int rr = 0; rr < RREG; ++rr)
#pragma unroll
    for (int j = 0; j < KC; ++j) a_reg[rr][j] = a_smem4[(rr * KC + j) * kClusterWarps * 32 + warp * 32 + a_slot(lane, warp, rr)];
  __syncthreads();
  if constexpr (RSH > 0) stage_a_rows<KC, RSH>(a_smem, p, row0, RREG, tid);

  /* Both state buffers zero (rows past H stay zero), then s_{-1} = h0 (zero backward). */
  for (int i = tid; i < 2 * KEXT; i += kClusterThreads) state[i] = 0.f;
  __syncthreads();
  if (!p.backward)
    for (int k = tid; k < H; k += kClusterThreads) state[k] = h0[(size_t)seq * p.h0_stride_b + k];
  __syncthreads();

  /* Epilogue: lane 4r of the warp owns row row0 + 8 warp + r; its operands are loaded two steps ahead. */
  const int o_row = row0 + WR * warp + (lane >> 2);
  const bool o_valid = (lane & 3) == 0 && o_row < H;
  const int o_len = o_valid ? sequence_length(p.lengths, seq, T) : 0;
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
  /* Every CTA of the cluster has its state and barriers ready before any peer writes into them. */
  cluster_arrive();
  cluster_wait();
  /* Every warp of every CTA sends its 8 rows (zeros past H): C * 256 bytes into each CTA a step.
   * Lane l sends rows 4 (l % 2) .. 4 (l % 2) + 3 of the warp's to CTA l / 2. */
  const unsigned step_bytes = ctas * (unsigned)kClusterRows * 4u;
  const unsigned peer = (unsigned)lane >> 1;
  const int half = lane & 1;
  const bool sender = peer < ctas;
  const uint32_t state_base = (uint32_t)__cvta_generic_to_shared(state);
  /* buffer 0's rows and barrier in the peer; buffer 1's are KEXT floats and 8 bytes on */
  const uint32_t peer_state = sender ? peer_address(state_base + (uint32_t)((row0 + WR * warp + 4 * half) * 4), peer) : 0;
  const uint32_t peer_bar = sender ? peer_address(bar_base, peer) : 0;

  for (int s = 0; s < T; ++s) {
    const int t = p.backward ? T - 1 - s : s;
    const int cur = s & 1;
    const float *prev = state + cur * KEXT;
    /* Arm the next buffer's barrier (its previous phase ended during step s - 1),
     * then wait for this step's rows (sent in step s - 1). */
    if (tid == 0 && s + 1 < T) mbarrier_expect_bytes(bar_base + 8u * (1 - cur), step_bytes);
    if (s > 0) {
      unsigned long long since = 0; /* for the watchdog */
      for (unsigned round = 1; !mbarrier_done(bar_base + 8u * cur, ((s - 1) >> 1) & 1); ++round)
        watchdog(round, &since);
    }

    /* chunk by chunk of K, so that only one float4 of the state is live:
     * the registers go to A's rows instead */
    float acc[WR];
#pragma unroll
    for (int rr = 0; rr < WR; ++rr) acc[rr] = 0.f;
#pragma unroll
    for (int j = 0; j < KC; ++j) {
      const float4 h = reinterpret_cast<const float4 *>(prev)[j * 32 + lane];
#pragma unroll
      for (int rr = 0; rr < WR; ++rr) {
        const float4 a = rr < RREG ? a_reg[rr < RREG ? rr : 0][j] : smem_row(rr, j);
        acc[rr] = fmaf(a.x, h.x, acc[rr]);
        acc[rr] = fmaf(a.y, h.y, acc[rr]);
        acc[rr] = fmaf(a.z, h.z, acc[rr]);
        acc[rr] = fmaf(a.w, h.w, acc[rr]);
      }
    }
    /* acc[0] of lane l: row l / 4 summed over lanes with the same l / 4, then over those 4 */
    ReduceScatter<WR, WR, 16>::run(acc, lane);
    float mat = acc[0] + __shfl_xor_sync(0xffffffffu, acc[0], 2);
    mat += __shfl_xor_sync(0xffffffffu, mat, 1);

    const bool active = o_valid && t < o_len;
    /* past the length the state stays s_{t-1}: this CTA's own buffer holds it */
    const float frozen = (o_valid && !active && !p.backward) ? prev[o_row] : 0.f;
    float st;
    const float value = step_output(p.backward, p.activation, active, mat, o_in, o_y, frozen, &st);
    const float publish = o_valid ? st : 0.f; /* padding publishes zeros */
    float4 v;
    v.x = __shfl_sync(0xffffffffu, publish, 16 * half);
    v.y = __shfl_sync(0xffffffffu, publish, 16 * half + 4);
    v.z = __shfl_sync(0xffffffffu, publish, 16 * half + 8);
    v.w = __shfl_sync(0xffffffffu, publish, 16 * half + 12);
    if (s + 1 < T && sender)
      store_peer16_async(peer_state + (uint32_t)((1 - cur) * KEXT * 4),
                         make_uint4(__float_as_uint(v.x), __float_as_uint(v.y), __float_as_uint(v.z),
                                    __float_as_uint(v.w)),
                         peer_bar + 8u * (1 - cur));
    if (o_valid) out[((size_t)t * B + seq) * H + o_row] = value;
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

/* The float32 shapes, smallest K extent first: KC = 2 (H <= 256) and 4
 * (H <= 512) with all 8 rows in registers, 8 (H <= 1024) with 6 in registers
 * and 2 in shared memory. */
struct ClusterF32Config {
  int k_chunks; /* KC: K extent 128 KC */
  int reg_rows; /* RREG of each warp's 8 rows */
  PersistentKernel kernel;
};
const int cluster_config_count_f32 = 3; /* cluster_f32.cu checks the table's length against it */
extern const ClusterF32Config cluster_configs_f32[];

}  // namespace prnn

#endif /* PRNN_CLUSTER_F32_CUH */
