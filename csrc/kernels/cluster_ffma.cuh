/*
 * cluster_ffma.cuh - the FFMA cluster kernel (sm_90): one sequence per
 * cluster, W_hh's rows split over the cluster's registers and shared memory,
 * float32 arithmetic. It runs float32 up to H = 1152; the 16-bit dtypes take
 * the tensor-core cluster kernel (cluster.cuh) up to 1152, faster (bench/NOTES.md
 * step 32). The kernel keeps its element type E generic, as the quads it
 * shares with the cluster grid (cluster_grid.cuh) are, but only float32 is
 * compiled.
 *
 * CTA c owns 8 WR rows of A (WR = 8 or 9 per warp; at least two CTAs). Warp
 * w owns the CTA's rows 8w .. 8w + 7 and, with WR = 9, row 64 + w, so every
 * warp's first 8 rows are one aligned 32-byte block of the state. Lane l
 * holds columns 128j + 4l .. 128j + 4l + 3 (j < KC) of each of its warp's
 * rows, as a quad of 4 elements at their width (Quad<E>): rows [0, RREG) in
 * registers, [RREG, WR) in shared memory, whose quads are read free of bank
 * conflicts. FFMA, not tensor cores: float32 numerics. A step, each warp
 * on its own (no CTA-wide barrier):
 *   wait for s_{t-1} (one mbarrier per state buffer counts the bytes the
 *   cluster sent) -> 4 KC FMAs per row and lane -> 9 shuffles sum the 8 main
 *   rows over the warp (5 more for a ninth) -> lanes 4r (and lane 1 for the
 *   ninth) apply the activation and write out[t] -> the warp's rows into
 *   every CTA's other state buffer by st.async: the 8 main rows as two
 *   16-byte stores per peer, one lane per (peer, half); the ninth as one
 *   4-byte store per peer.
 * The state is float32 in shared memory.
 * Two state buffers are enough: a peer writes buffer X again only for step
 * s + 2, after it had every row of step s + 1, which every warp here sends
 * only after it read buffer X in step s.
 * A fused layer (q.clusters > 0) puts its first q.clusters clusters to
 * computing xp (projection.cuh); the rest step, reading a chunk of xp once
 * its flag is full.
 */
#ifndef PRNN_CLUSTER_FFMA_CUH
#define PRNN_CLUSTER_FFMA_CUH

#include "dsmem.cuh"
#include "exchange.cuh"
#include "ffma.cuh"
#include "projection.cuh"
#include "cells.cuh"
#include "warp_reduce.cuh"

namespace prnn {

/* Dynamic shared memory of shape (element size, KC, WR, RREG): mbarriers
 * [2] (padded to kFfmaSmemLead), then, while stepping, the shared-memory
 * rows of A [WR - RREG][KC][8 warps][32 slots] quads and the state [2][128 KC]
 * fp32; before stepping, the same space stages the register rows
 * [RREG][KC][8][32] quads. */
__host__ __device__ constexpr int cluster_ffma_smem_bytes(int elem_bytes, int kc, int wr, int rreg) {
  return kFfmaSmemLead + ((wr - rreg) * kc * 256 * 4 * elem_bytes + 2 * kc * 128 * 4 > rreg * kc * 256 * 4 * elem_bytes
                   ? (wr - rreg) * kc * 256 * 4 * elem_bytes + 2 * kc * 128 * 4
                   : rreg * kc * 256 * 4 * elem_bytes);
}

/* The quad slot of (row rr of warp w, column k) within its [32 slots] group:
 * lane (k % 128) / 4, swizzled by (w + rr) % 8. Reads (one lane per slot)
 * stay free of bank conflicts, and the backward's staging, where the lanes
 * of a warp store one column k of 32 rows, spreads them over 8 banks
 * instead of one (16- to 24-way conflicts, ~19 us per call at H = 1024 by a
 * review's count). */
__device__ __forceinline__ int a_slot(int lane, int w, int rr) { return lane ^ ((w + rr) & 7); }

/* The CTA-local row of warp w's row rr: its 8 main rows 8w + rr, then row 64 + w. */
__device__ __forceinline__ int ffma_local_row(int w, int rr) { return rr < 8 ? 8 * w + rr : 64 + 8 * (rr - 8) + w; }

/* Rows RB .. RE - 1 of every warp's WR into dst, laid out
 * [rr - RB][KC][8 warps][32 slots] quads: element k of a row sits in quad
 * (k / 128, a_slot((k % 128) / 4, w, rr)), place k % 4. The staged rows are
 * taken in increasing CTA-local row (the main rows warp by warp, then the
 * ninth rows), so that the backward, whose A = W_hh^T has its rows
 * contiguous, reads runs of consecutive elements a warp load (32 where a
 * warp stages all 8 main rows; runs of 6 and 2, or 5 and 3, otherwise), 16
 * loads in flight per thread; the forward reads 4 consecutive k a thread
 * (one 16- or 8-byte load where the layout allows), 8 in flight. W_hh^T
 * element by element with lanes 2H apart was 32 sectors a load (the 16-bit
 * kernel's NOTES step 16). */
template <typename E, int KC, int RB, int RE>
__device__ __forceinline__ void stage_a_rows(typename Quad<E>::type *dst, const RecurrenceParams &p, int row0,
                                             int tid) {
  typedef typename Quad<E>::type Q;
  constexpr int KEXT = 128 * KC, INFLIGHT = 8;
  constexpr int MAIN = (RE < 8 ? RE : 8) > RB ? (RE < 8 ? RE : 8) - RB : 0; /* main rows staged per warp */
  constexpr int NR = kClusterWarps * (RE - RB);
  const E *A = static_cast<const E *>(p.a);
  const E zero = Round<E>::to(0.f);
  const int H = p.hidden;
  const bool k_fastest = p.a_stride_col == 1;
  const bool wide = k_fastest && p.a_stride_row % 4 == 0 && (reinterpret_cast<uintptr_t>(A) % sizeof(Q)) == 0;
  /* chunk c: forward, row slot c / (KEXT/4) and columns 4 (c % (KEXT/4)) .. + 3;
   * backward, column c / NR and row slot c % NR */
  const int chunks = k_fastest ? NR * KEXT / 4 : NR * KEXT;
  auto chunk_origin = [&](int c, int &w, int &rr, int &k) {
    const int q = k_fastest ? c / (KEXT / 4) : c % NR;
    k = k_fastest ? (c % (KEXT / 4)) * 4 : c / NR;
    if (q < kClusterWarps * MAIN) {
      w = q / (MAIN > 0 ? MAIN : 1);
      rr = RB + q % (MAIN > 0 ? MAIN : 1);
    } else {
      w = (q - kClusterWarps * MAIN) % kClusterWarps;
      rr = (RB > 8 ? RB : 8) + (q - kClusterWarps * MAIN) / kClusterWarps;
    }
  };
  auto at = [&](int rr, int w, int k) { /* dst quad index of (row rr of warp w, column k) */
    return (((rr - RB) * KC + k / 128) * kClusterWarps + w) * 32 + a_slot((k % 128) / 4, w, rr);
  };
  auto element = [&](int i, int k) { return (i < H && k < H) ? A[i * p.a_stride_row + k * p.a_stride_col] : zero; };
  if (k_fastest) {
    for (int c0 = 0; c0 < chunks; c0 += kClusterThreads * INFLIGHT) {
      Q v[INFLIGHT]; /* 4 columns each */
#pragma unroll
      for (int u = 0; u < INFLIGHT; ++u) {
        const int c = c0 + u * kClusterThreads + tid;
        if (c >= chunks) continue;
        int w, rr, k;
        chunk_origin(c, w, rr, k);
        const int i = row0 + ffma_local_row(w, rr);
        if (wide && i < H && k + 3 < H) {
          v[u] = *reinterpret_cast<const Q *>(A + i * p.a_stride_row + k);
        } else { /* an edge of A, or a layout wide loads cannot read */
#pragma unroll
          for (int e = 0; e < 4; ++e) Quad<E>::put(&v[u], e, element(i, k + e));
        }
      }
#pragma unroll
      for (int u = 0; u < INFLIGHT; ++u) {
        const int c = c0 + u * kClusterThreads + tid;
        if (c >= chunks) continue;
        int w, rr, k;
        chunk_origin(c, w, rr, k);
        dst[at(rr, w, k)] = v[u];
      }
    }
  } else { /* one element a chunk, twice as many in flight: they are coalesced across lanes already */
    constexpr int INFLIGHT_B = 2 * INFLIGHT;
    for (int c0 = 0; c0 < chunks; c0 += kClusterThreads * INFLIGHT_B) {
      E v[INFLIGHT_B];
#pragma unroll
      for (int u = 0; u < INFLIGHT_B; ++u) {
        const int c = c0 + u * kClusterThreads + tid;
        if (c >= chunks) continue;
        int w, rr, k;
        chunk_origin(c, w, rr, k);
        v[u] = element(row0 + ffma_local_row(w, rr), k);
      }
#pragma unroll
      for (int u = 0; u < INFLIGHT_B; ++u) {
        const int c = c0 + u * kClusterThreads + tid;
        if (c >= chunks) continue;
        int w, rr, k;
        chunk_origin(c, w, rr, k);
        Quad<E>::put(&dst[at(rr, w, k)], k % 4, v[u]);
      }
    }
  }
}

/* 4 bytes into a peer's shared memory, counted down on the peer's mbarrier. */
__device__ __forceinline__ void store_peer4_async(uint32_t remote, uint32_t v, uint32_t remote_bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];"
               :: "r"(remote), "r"(v), "r"(remote_bar) : "memory");
#endif
}

template <class Cell, typename E, int KC, int WR, int RREG>
__global__ void __launch_bounds__(kClusterThreads, 1)
    cluster_ffma_kernel(const RecurrenceParams p, const InputProjection q) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  typedef typename Quad<E>::type Q;
  constexpr int RSH = WR - RREG, KEXT = 128 * KC, R = kClusterWarps * WR;
  static_assert((WR == 8 || WR == 9) && RREG >= 1 && RREG <= WR && KEXT % R == 0, "bad FFMA cluster shape");
  static_assert(Cell::kGates == 1, "an Elman family: one row of A an output");

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int T = p.steps, B = p.batch, H = p.hidden;
  const unsigned rank = cluster_rank(), ctas = cluster_size();
  const int row0 = (int)rank * R;
  if (ctas * R > KEXT) __trap(); /* the launcher's contract: the cluster's rows fit the K extent */
  extern __shared__ __align__(16) unsigned char smem[];
  if (project_if_producer<E>(p, q, smem, rank, ctas)) return; /* the rest step, one sequence a cluster */
  const int producers = q.clusters;
  const int seq = (int)cluster_index() - producers;
  E *out;
  const E *in, *yfwd, *h0;
  typed_tensors(p, out, in, yfwd, h0);

  uint64_t *bars = reinterpret_cast<uint64_t *>(smem);
  Q *a_smem = reinterpret_cast<Q *>(smem + kFfmaSmemLead);
  float *state = reinterpret_cast<float *>(a_smem + RSH * KC * kClusterWarps * 32);
  /* quad (row rr, chunk j) of this lane, in the layout stage_a_rows wrote starting at row `first` */
  auto quad_at = [&](int first, int rr, int j) {
    return a_smem[((rr - first) * KC + j) * kClusterWarps * 32 + warp * 32 + a_slot(lane, warp, rr)];
  };

  /* A: the register rows pass through the space the shared-memory rows and
   * the state take later; then the shared-memory rows go to their place. */
  Q a_reg[RREG][KC];
  stage_a_rows<E, KC, 0, RREG>(a_smem, p, row0, tid);
  __syncthreads();
#pragma unroll
  for (int rr = 0; rr < RREG; ++rr)
#pragma unroll
    for (int j = 0; j < KC; ++j) a_reg[rr][j] = quad_at(0, rr, j);
  __syncthreads();
  if constexpr (RSH > 0) stage_a_rows<E, KC, RREG, WR>(a_smem, p, row0, tid);

  /* Both state buffers zero (rows past H stay zero), then s_{-1} = h0 (zero backward). */
  for (int i = tid; i < 2 * KEXT; i += kClusterThreads) state[i] = 0.f;
  __syncthreads();
  if (!p.backward)
    for (int k = tid; k < H; k += kClusterThreads) state[k] = to_accum(h0[(size_t)seq * p.h0_stride_b + k]);
  __syncthreads();

  /* Epilogue: lane 4r owns the warp's main row r, lane 1 its ninth row;
   * their operands are loaded two steps ahead. */
  const int o_local = (lane & 3) == 0 ? 8 * warp + (lane >> 2) : (WR == 9 && lane == 1 ? 64 + warp : -1);
  const int o_row = row0 + o_local;
  const bool o_valid = o_local >= 0 && o_row < H;
  const int o_len = o_valid ? sequence_length(p.lengths, seq, T) : 0;
  /* ld.global.cg: with the projection in this launch, xp is written while
   * the kernel runs (projection.cuh), and each element is read once anyway. */
  auto load_in = [&](int s_at) {
    const int t = p.backward ? T - 1 - s_at : s_at;
    return o_valid ? to_accum(__ldcg(in + t * p.in_stride_t + seq * p.in_stride_b + o_row)) : 0.f;
  };
  auto load_y = [&](int s_at) {
    const int t = p.backward ? T - 1 - s_at : s_at;
    return (o_valid && p.backward) ? to_accum(yfwd[((size_t)t * B + seq) * H + o_row]) : 0.f;
  };
  /* xp of a step is read once its chunk's flag is full: here steps 0-2, in the loop step s + 3. */
  int ready_step = producers > 0 ? 0 : 0x7fffffff; /* the first step whose xp is not known stored */
  for (int s0 = 0; s0 < (T < 3 ? T : 3); ++s0) ready_step = wait_projection_step(p, q, s0, ready_step);
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
  /* Every warp of every CTA sends its WR rows (zeros past H): C * R * 4 bytes
   * into each CTA a step. Lane l sends main rows 4 (l % 2) .. 4 (l % 2) + 3
   * to CTA l / 2, and the ninth row to CTA l. */
  const unsigned step_bytes = ctas * (unsigned)R * 4u;
  const unsigned peer = (unsigned)lane >> 1;
  const int half = lane & 1;
  const bool sender = peer < ctas, ninth_sender = WR == 9 && (unsigned)lane < ctas;
  const uint32_t state_base = (uint32_t)__cvta_generic_to_shared(state);
  /* buffer 0's rows and barrier in the peer; buffer 1's are KEXT floats and 8 bytes on */
  const uint32_t peer_state = sender ? peer_address(state_base + (uint32_t)((row0 + 8 * warp + 4 * half) * 4), peer) : 0;
  const uint32_t peer_bar = sender ? peer_address(bar_base, peer) : 0;
  const uint32_t ninth_state =
      ninth_sender ? peer_address(state_base + (uint32_t)((row0 + 64 + warp) * 4), (unsigned)lane) : 0;
  const uint32_t ninth_bar = ninth_sender ? peer_address(bar_base, (unsigned)lane) : 0;

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
        const Q a = rr < RREG ? a_reg[rr < RREG ? rr : 0][j] : quad_at(RREG, rr, j);
        acc[rr] = Quad<E>::dot(a, h, acc[rr]);
      }
    }
    /* acc[0] of lane l: main row l / 4 summed over lanes with the same l / 4, then over those 4 */
    ReduceScatter<WR, 8, 16>::run(acc, lane);
    float mat = acc[0] + __shfl_xor_sync(0xffffffffu, acc[0], 2);
    mat += __shfl_xor_sync(0xffffffffu, mat, 1);
    if constexpr (WR == 9) { /* the ninth row summed over the whole warp */
      float ninth = acc[WR - 1];
#pragma unroll
      for (int d = 16; d >= 1; d >>= 1) ninth += __shfl_xor_sync(0xffffffffu, ninth, d);
      if (lane == 1) mat = ninth;
    }

    const bool active = o_valid && t < o_len;
    /* past the length the state stays s_{t-1}: this CTA's own buffer holds it */
    const float frozen = (o_valid && !active && !p.backward) ? prev[o_row] : 0.f;
    float st;
    const E value = Round<E>::to(Cell::step(p.backward, p.activation, active, mat, o_in, o_y, frozen, &st));
    const float publish = o_valid ? to_accum(Round<E>::to(st)) : 0.f; /* padding publishes zeros */
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
    if constexpr (WR == 9) {
      const float ninth_value = __shfl_sync(0xffffffffu, publish, 1);
      if (s + 1 < T && ninth_sender)
        store_peer4_async(ninth_state + (uint32_t)((1 - cur) * KEXT * 4), __float_as_uint(ninth_value),
                          ninth_bar + 8u * (1 - cur));
    }
    if (o_valid) out[((size_t)t * B + seq) * H + o_row] = value;
    if (s + 1 < T) {
      o_in = next_in;
      o_y = next_y;
      next_in = after_in;
      next_y = after_y;
      if (s + 3 < T) {
        if (s + 3 >= ready_step) ready_step = wait_projection_step(p, q, s + 3, ready_step);
        after_in = load_in(s + 3);
        after_y = load_y(s + 3);
      }
    }
  }
#else
  __trap(); /* never launched: the planner requires compute capability 9.0 */
#endif
}

/* A compiled shape of the FFMA kernel (cluster_ffma.cu), per dtype smallest
 * K extent first - float32: KC = 2 and 4 (H <= 256, 512) with all 8 rows of
 * a warp in registers, 8 (H <= 1024) with 6 of 8, 9 (H <= 1152, 72 rows a
 * CTA) with 5 of 9. */
struct ClusterFfmaConfig {
  prnn_dtype_t dtype;
  int k_chunks;  /* KC: K extent 128 KC */
  int warp_rows; /* WR: rows per warp, 8 WR per CTA */
  int reg_rows;  /* RREG of them in registers */
  const void *kernel; /* cluster_ffma_kernel (RecurrenceParams, InputProjection) */
};
const int cluster_ffma_config_count = 4; /* cluster_ffma.cu checks the table's length against it */
extern const ClusterFfmaConfig cluster_ffma_configs[];

}  // namespace prnn

#endif /* PRNN_CLUSTER_FFMA_CUH */
