/*
 * cluster_grid.cuh - the cluster-grid kernel (sm_90): for H past what one
 * cluster holds (1153 .. 2048), G = ceil(H / 160) clusters of 8 CTAs run together
 * in one cooperative launch, each CTA keeping 20 rows of A = W_hh (forward)
 * or W_hh^T (backward) on chip for the whole sequence. A group of up to 8
 * sequences runs at once; larger batches run group after group in the same
 * launch. FFMA on float32 values (16-bit weights widen exactly), the state
 * rounded to the dtype, as the other kernels do.
 *
 * CTA rank q of cluster c owns rows (q G + c) 20 .. + 19, so slice q, the
 * rows of the CTAs of rank q in every cluster, is the contiguous range
 * [20 G q, 20 G (q + 1)) of the team's 160 G rows. Warp w is row group
 * g = w % 4 (the CTA's rows 5g .. 5g + 4) and K half h = w / 4 (chunks
 * j = 2i + h of 128 columns); lane l holds columns 128j + 4l .. + 3 of each
 * of its 5 rows as a quad of elements at their width (Quad<E>): RREG rows in
 * registers, the fifth in shared memory.
 * Five rows a warp make a state float4 feed 20 FMAs a sequence, so a step's
 * shared-memory reads of the state stay below its FMAs (2 rows a warp over
 * all of K were bound by them: bench/NOTES.md step 29).
 *
 * A step:
 *   wait for s_{t-1} (one mbarrier per state buffer counts the bytes that
 *   arrived) -> 20 FMAs per (chunk, sequence) -> shuffles sum rows 0-3 of 8
 *   sequences (31) and row 4 (9) over the warp -> the two warps of a row
 *   group swap partial sums (named barrier, 64 threads): the K-half-0 warp
 *   finishes rows 0-3, the K-half-1 warp row 4 -> each applies the
 *   activation, writes the state to a global exchange buffer, raises its
 *   flag (release), then writes out[t]. Warp 0 of rank q is then its
 *   cluster's relay for slice q: it polls the slice's G x 8 flags
 *   (acquire) and multicasts the slice, one bulk copy a sequence, from L2
 *   into the other state buffer of all 8 CTAs of its cluster (TMA
 *   multicast: one L2 read feeds a cluster, where every SM reading every row
 *   was what made the grid tier's exchange slow: bench/NOTES.md "The floor").
 *
 * Why two buffers (of shared memory, and of the global exchange) suffice:
 * a relay sends step u into a CTA's buffer (u+1)&1 only after it had all of
 * s_{u-1}, which holds every row that CTA published in step u-1, after all
 * its warps had read that buffer (every warp raises a flag). The hand-over
 * buffers alternate by step too, so a warp writes one again only after the
 * named barrier of the step between, which its partner reaches after its
 * read (ordered inside the CTA, where compute-sanitizer's racecheck sees it;
 * one buffer was safe only through the flags). The exchange buffer u&1 is
 * written again in step u + 2, by a warp that had all of s_{u+1}; the
 * relays that read step u's slices published their rows of u + 1 after
 * their own copy of s_u arrived. Steps are counted over the whole launch (u), so a new group's
 * first step waits for the last step's delivery of the one before and only
 * then puts h0 in its place.
 *
 * Every CTA must be resident at once (the flags wait across clusters): the
 * launch is cooperative, and the planner checks the device holds G clusters.
 */
#ifndef PRNN_CLUSTER_GRID_CUH
#define PRNN_CLUSTER_GRID_CUH

#include "dsmem.cuh"
#include "exchange.cuh"
#include "ffma.cuh"
#include "cells.cuh"
#include "warp_reduce.cuh"

namespace prnn {

const int kGridClusterCtas = 8;                          /* C: CTAs a cluster (the portable size) */
const int kGridRowGroups = 4;                            /* warps w and w + 4 share rows, split K */
const int kGridWarpRows = 5;                             /* rows a row group */
const int kGridRows = kGridRowGroups * kGridWarpRows;    /* 20 rows a CTA */
const int kGridClusterRows = kGridClusterCtas * kGridRows; /* 160 rows a cluster */
const int kGridSeqs = 8;                                 /* sequences a group */
const int kGridMaxClusters = 16;                         /* G <= 16: the relay reads its flags in one warp load */
const int kGridFlagWords = kGridClusterCtas * kGridMaxClusters * kClusterWarps; /* [rank][cluster][warp] */

/* The state's pitch per sequence for K extent 128 KC: the team's rows (up
 * to 159 past H <= 128 KC) land in it, the FMAs read the first 128 KC. */
__host__ __device__ constexpr int cluster_grid_state_pitch(int kc) { return 128 * kc + kGridClusterRows; }

/* Dynamic shared memory: mbarriers [2] (16 bytes), the K halves' hand-over
 * [2][8 warps][32 lanes] fp32, then A's shared-memory rows
 * [5 - RREG][8 warps][KC / 2][32 lanes] quads and the state [2][8
 * sequences][pitch] fp32; before stepping, the space of the last two stages
 * A's 20 rows at a pitch of 128 KC elements and one 32-bit word. */
__host__ __device__ constexpr int cluster_grid_smem_bytes(int elem_bytes, int kc, int rreg) {
  return kFfmaSmemLead + 2 * kClusterWarps * 32 * 4 +
         ((kGridWarpRows - rreg) * 8 * (kc / 2) * 32 * 4 * elem_bytes + 2 * kGridSeqs * cluster_grid_state_pitch(kc) * 4 >
                  kGridRows * (128 * kc * elem_bytes + 4)
              ? (kGridWarpRows - rreg) * 8 * (kc / 2) * 32 * 4 * elem_bytes +
                    2 * kGridSeqs * cluster_grid_state_pitch(kc) * 4
              : kGridRows * (128 * kc * elem_bytes + 4));
}

/* Workspace: the flags [8][16][8] u32 (zeroed before each launch), then the
 * exchange buffer [2][8 sequences][160 G] fp32. */
__host__ __device__ constexpr size_t cluster_grid_workspace_bytes(int team_rows) {
  return (size_t)kGridFlagWords * 4 + 2 * (size_t)kGridSeqs * team_rows * 4;
}

/* The launch of G clusters of 8 CTAs, cooperative (all resident at once, or
 * an error); attrs must outlive the returned config. Shared by the library
 * and the bench programs. */
inline cudaLaunchConfig_t cluster_grid_launch_config(int clusters, int smem_bytes, cudaStream_t stream,
                                                     cudaLaunchAttribute (&attrs)[2]) {
  return cooperative_cluster_launch_config(clusters * kGridClusterCtas, kGridClusterCtas, smem_bytes, stream, attrs);
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ uint4 load_flags_acquire(const unsigned *p) {
  uint4 v;
  asm volatile("ld.acquire.gpu.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void store_flag_relaxed(unsigned *p, unsigned v) {
  asm volatile("st.relaxed.gpu.global.u32 [%0], %1;" :: "l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void fence_acq_rel_gpu() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }
/* bytes from global memory into the same shared-memory offset of every CTA
 * in cta_mask, each CTA's mbarrier at bar counting them */
__device__ __forceinline__ void bulk_multicast(uint32_t dst, const void *src, unsigned bytes, uint32_t bar,
                                               unsigned short cta_mask) {
  asm volatile("fence.proxy.async.global;" ::: "memory"); /* the generic stores observed through the flags */
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1], %2, [%3], %4;"
      :: "r"(dst), "l"(src), "r"(bytes), "r"(bar), "h"(cta_mask) : "memory");
}
#endif

/* flag >= want, counting with wrap-around */
__device__ __forceinline__ bool reached(unsigned flag, unsigned want) { return (int)(flag - want) >= 0; }

template <class Cell, typename E, int KC, int RREG>
__global__ void __launch_bounds__(kClusterThreads, 1) cluster_grid_kernel(const RecurrenceParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  typedef typename Quad<E>::type Q;
  constexpr int KEXT = 128 * KC, KH = KC / 2, WR = kGridWarpRows, SP = cluster_grid_state_pitch(KC);
  constexpr int NB = kGridSeqs;
  static_assert(KC % 2 == 0 && RREG >= 1 && RREG <= WR, "bad cluster-grid shape");
  static_assert(Cell::kGates == 1, "an Elman family: one row of A an output");

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = warp % kGridRowGroups, half = warp / kGridRowGroups;
  const int T = p.steps, B = p.batch, H = p.hidden;
  const int team_rows = p.cluster_grid.team_rows; /* 160 G */
  const int G = team_rows / kGridClusterRows;
  const unsigned q = cluster_rank();
  const int c = (int)cluster_index();
  /* the launcher's contract */
  if (cluster_size() != kGridClusterCtas || (int)gridDim.x != G * kGridClusterCtas || H > KEXT ||
      G > kGridMaxClusters || team_rows < H || team_rows > SP)
    __trap();
  const int row0 = ((int)q * G + c) * kGridRows;
  const int slice0 = (int)q * G * kGridRows, slice_bytes = G * kGridRows * 4;
  unsigned *flags = reinterpret_cast<unsigned *>(p.exchange);
  float *xbuf = reinterpret_cast<float *>(flags + kGridFlagWords);
  E *out;
  const E *in, *yfwd, *h0;
  typed_tensors(p, out, in, yfwd, h0);

  extern __shared__ __align__(16) unsigned char smem[];
  uint64_t *bars = reinterpret_cast<uint64_t *>(smem);
  float *handover = reinterpret_cast<float *>(smem + kFfmaSmemLead);
  Q *a_smem = reinterpret_cast<Q *>(smem + kFfmaSmemLead + 2 * kClusterWarps * 32 * 4);
  float *state = reinterpret_cast<float *>(a_smem + (WR - RREG) * 8 * KH * 32);
  auto a_smem_at = [&](int rr, int i) -> Q & { return a_smem[(((rr - RREG) * 8 + warp) * KH + i) * 32 + lane]; };

  /* A's 20 rows through shared memory: reads coalesced along whichever of
   * A's dimensions is contiguous (rows forward, columns backward), 16 in
   * flight a thread; the pitch (one 32-bit word past KEXT) spreads a column's
   * rows over the banks. Then each lane takes its quads. */
  Q a_reg[RREG][KH];
  {
    constexpr int PITCH = KEXT + 4 / (int)sizeof(E), INFLIGHT = 16, TOTAL = kGridRows * KEXT;
    E *stage = reinterpret_cast<E *>(a_smem);
    const E *A = static_cast<const E *>(p.a);
    const E zero = Round<E>::to(0.f);
    const bool k_fastest = p.a_stride_col == 1;
    for (int e0 = 0; e0 < TOTAL; e0 += kClusterThreads * INFLIGHT) {
      E v[INFLIGHT];
#pragma unroll
      for (int u = 0; u < INFLIGHT; ++u) {
        const int e = e0 + u * kClusterThreads + tid;
        const int r = k_fastest ? e / KEXT : e % kGridRows, k = k_fastest ? e % KEXT : e / kGridRows;
        const int i = row0 + r;
        v[u] = (e < TOTAL && i < H && k < H) ? A[i * p.a_stride_row + k * p.a_stride_col] : zero;
      }
#pragma unroll
      for (int u = 0; u < INFLIGHT; ++u) {
        const int e = e0 + u * kClusterThreads + tid;
        const int r = k_fastest ? e / KEXT : e % kGridRows, k = k_fastest ? e % KEXT : e / kGridRows;
        if (e < TOTAL) stage[r * PITCH + k] = v[u];
      }
    }
    __syncthreads();
    Q a_tmp[WR - RREG > 0 ? WR - RREG : 1][KH]; /* the shared-memory rows, until the staging is done with */
#pragma unroll
    for (int rr = 0; rr < WR; ++rr)
#pragma unroll
      for (int i = 0; i < KH; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const E v = stage[(WR * g + rr) * PITCH + 128 * (2 * i + half) + 4 * lane + e];
          Quad<E>::put(rr < RREG ? &a_reg[rr < RREG ? rr : 0][i] : &a_tmp[rr < RREG ? 0 : rr - RREG][i], e, v);
        }
    __syncthreads();
#pragma unroll
    for (int rr = RREG; rr < WR; ++rr)
#pragma unroll
      for (int i = 0; i < KH; ++i) a_smem_at(rr, i) = a_tmp[rr - RREG][i];
  }

  /* Both state buffers zero: rows past H stay so; slots past a group's
   * sequences are zero in the first group and stale after it, never published. */
  for (int i = tid; i < 2 * kGridSeqs * SP; i += kClusterThreads) state[i] = 0.f;
  const uint32_t bar_base = (uint32_t)__cvta_generic_to_shared(bars);
  const uint32_t state_base = (uint32_t)__cvta_generic_to_shared(state);
  if (tid == 0) {
    mbarrier_init(bar_base, 1);
    mbarrier_init(bar_base + 8u, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  /* Every CTA of the cluster has its barriers ready before its relays copy into it. */
  cluster_arrive();
  cluster_wait();

  /* The epilogue, split between a row group's two warps: lane l of the
   * K-half-0 warp owns (sequence l / 4, row l % 4), lane 4b of the K-half-1
   * warp (sequence b, row 4). */
  const int ob = lane >> 2;
  const int o_row = half == 0 ? row0 + WR * g + (lane & 3) : ((lane & 3) == 0 ? row0 + WR * g + 4 : -1);
  unsigned *my_flag = flags + ((int)q * kGridMaxClusters + c) * kClusterWarps + warp;
  const unsigned *slice_flags = flags + (int)q * kGridMaxClusters * kClusterWarps;

  const int groups = (B + NB - 1) / NB;
  const unsigned total_steps = (unsigned)groups * (unsigned)T;
  unsigned u = 0; /* step over the launch */
  for (int group = 0; group < groups; ++group) {
    const int seq0 = group * NB, nb = B - seq0 < NB ? B - seq0 : NB;
    const int seq = seq0 + ob;
    const bool o_valid = ob < nb && o_row >= 0 && o_row < H;
    const int o_len = o_valid ? sequence_length(p.lengths, seq, T) : 0;
    for (int s = 0; s < T; ++s, ++u) {
      const int t = p.backward ? T - 1 - s : s;
      const int cur = (int)(u & 1);
      const bool deliver = u + 1 < total_steps; /* someone waits for this step's state */
      /* epilogue operands first: their latency hides behind the wait */
      const float o_in = o_valid ? to_accum(in[t * p.in_stride_t + seq * p.in_stride_b + o_row]) : 0.f;
      const float o_y = (o_valid && p.backward) ? to_accum(yfwd[((size_t)t * B + seq) * H + o_row]) : 0.f;
      if (tid == 0 && deliver) mbarrier_expect_bytes(bar_base + 8u * (1 - cur), (unsigned)(nb * team_rows * 4));
      if (u > 0) {
        unsigned long long since = 0; /* for the watchdog */
        for (unsigned round = 1; !mbarrier_done(bar_base + 8u * cur, ((u - 1) >> 1) & 1); ++round)
          watchdog(round, &since);
      }
      float *prev = state + cur * kGridSeqs * SP;
      if (s == 0) { /* a new group: s_{-1} = h0 (zero backward) */
        for (int i = tid; i < nb * SP; i += kClusterThreads) {
          const int b = i / SP, k = i % SP;
          prev[i] = (!p.backward && k < H) ? to_accum(h0[(size_t)(seq0 + b) * p.h0_stride_b + k]) : 0.f;
        }
        __syncthreads();
      }

      /* all 8 sequences, the ones past a last partial group too (their sums
       * are never published): no branch keeps the loads apart */
      float acc[NB][WR];
#pragma unroll
      for (int b = 0; b < NB; ++b)
#pragma unroll
        for (int rr = 0; rr < WR; ++rr) acc[b][rr] = 0.f;
#pragma unroll
      for (int i = 0; i < KH; ++i) {
        const int j = 2 * i + half;
        if (128 * j >= H) break; /* A's columns past H are zero */
        float4 h[NB];
#pragma unroll
        for (int b = 0; b < NB; ++b) h[b] = reinterpret_cast<const float4 *>(prev + b * SP)[32 * j + lane];
#pragma unroll
        for (int rr = 0; rr < WR; ++rr) { /* one row widened at a time: registers */
          const float4 a = Quad<E>::widen4(rr < RREG ? a_reg[rr < RREG ? rr : 0][i] : a_smem_at(rr, i));
#pragma unroll
          for (int b = 0; b < NB; ++b) acc[b][rr] = dot4(a, h[b], acc[b][rr]);
        }
      }
      /* rows 0-3: lane l ends with (sequence l / 4, row l % 4); row 4: lanes 4b .. 4b + 3 with sequence b */
      float main_sums[32], fifth[kGridSeqs];
#pragma unroll
      for (int b = 0; b < kGridSeqs; ++b) {
#pragma unroll
        for (int rr = 0; rr < 4; ++rr) main_sums[4 * b + rr] = acc[b][rr];
        fifth[b] = acc[b][4];
      }
      ReduceScatter<32, 32, 16>::run(main_sums, lane);
      ReduceScatter<kGridSeqs, kGridSeqs, 16>::run(fifth, lane);
      float fifth_sum = fifth[0] + __shfl_xor_sync(0xffffffffu, fifth[0], 2);
      fifth_sum += __shfl_xor_sync(0xffffffffu, fifth_sum, 1);
      /* the K halves meet (named barrier 1 + g, the row group's two warps):
       * each hands over its partial sums of the rows the other finishes */
      float *swap = handover + cur * kClusterWarps * 32;
      swap[warp * 32 + lane] = half == 0 ? fifth_sum : main_sums[0];
      asm volatile("bar.sync %0, %1;" :: "r"(1 + g), "r"(64) : "memory");
      const float mat = swap[(warp ^ kGridRowGroups) * 32 + lane] + (half == 0 ? main_sums[0] : fifth_sum);

      const bool active = o_valid && t < o_len;
      /* past the length the state stays s_{t-1}: this CTA's buffer holds it */
      const float frozen = (o_valid && !active && !p.backward) ? prev[ob * SP + o_row] : 0.f;
      float st;
      const E value = Round<E>::to(Cell::step(p.backward, p.activation, active, mat, o_in, o_y, frozen, &st));
      /* padding rows (past H) publish zeros */
      if (deliver && ob < nb && o_row >= 0)
        xbuf[((size_t)cur * kGridSeqs + ob) * team_rows + o_row] = o_valid ? to_accum(Round<E>::to(st)) : 0.f;
      if (deliver) {
        __syncwarp();
        if (lane == 0) {
          fence_acq_rel_gpu(); /* release: the warp's stores before its flag */
          store_flag_relaxed(my_flag, u + 1);
        }
      }
      /* after the flag, so that its fence does not wait for these */
      if (o_valid) out[((size_t)t * B + seq) * H + o_row] = value;
      if (!deliver) continue;
      if (warp == 0) { /* the relay of slice q: lanes 2c', 2c' + 1 poll the flags of CTA (c', q) */
        unsigned long long since = 0;
        for (unsigned round = 1;; ++round) {
          bool ready = true;
          if (lane < 2 * G) {
            const uint4 f = load_flags_acquire(slice_flags + 4 * lane);
            ready = reached(f.x, u + 1) && reached(f.y, u + 1) && reached(f.z, u + 1) && reached(f.w, u + 1);
          }
          if (__all_sync(0xffffffffu, ready)) break;
          watchdog(round, &since);
        }
        __syncwarp(); /* the lanes' acquires before the copies */
        if (lane < nb)
          bulk_multicast(state_base + (uint32_t)(((1 - cur) * kGridSeqs + lane) * SP + slice0) * 4u,
                         xbuf + ((size_t)cur * kGridSeqs + lane) * team_rows + slice0, (unsigned)slice_bytes,
                         bar_base + 8u * (1 - cur), (unsigned short)((1u << kGridClusterCtas) - 1));
      }
    }
  }
  /* No CTA leaves while a multicast of its relay may still be landing in a peer. */
  cluster_arrive();
  cluster_wait();
#else
  __trap(); /* never launched: the planner requires compute capability 9.0 */
#endif
}

/* A compiled kernel (cluster_grid.cu): K extent 2048, by dtype, 4 of a
 * warp's 5 rows in registers (all 5 spill at 16 bits: the compiler hoists
 * the widened rows out of the step loop). */
struct ClusterGridConfig {
  prnn_dtype_t dtype;
  int k_chunks;       /* KC: K extent 128 KC */
  int reg_rows;       /* RREG of a warp's 5 rows in registers */
  const void *kernel; /* cluster_grid_kernel (RecurrenceParams) */
};
const int cluster_grid_config_count = 3; /* cluster_grid.cu checks the table's length against it */
extern const ClusterGridConfig cluster_grid_configs[];

}  // namespace prnn

#endif /* PRNN_CLUSTER_GRID_CUH */
