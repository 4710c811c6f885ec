/*
 * cluster.cuh - the cluster-local persistent kernel for the 16-bit dtypes
 * (forward and backward-data), sm_90 and later.
 *
 * One thread-block cluster of C <= 16 CTAs (co-scheduled by the hardware, so
 * no cooperative launch and no deadlock; a fused layer's launch, whose
 * steppers wait for its producers, is cooperative) holds all of A (W_hh forward, W_hh^T
 * backward) in its register files as tensor-core fragments and runs all T
 * steps for one group of up to 8 sequences. Clusters of other groups never
 * talk to each other, so a batch of any size is just more clusters; the
 * launcher makes the groups as small as the device's room for clusters
 * allows (a step's exchange carries only a group's sequences).
 *
 * CTA c of a cluster owns rows [R c, R c + R) of A, R = 64 (4 m-tiles) or 72
 * (4 m-tiles and half of a fifth, whose padding rows take no registers: 16
 * CTAs then cover H = 1152). Its 8 warps split K: warp w holds the A
 * fragments of its m-tiles for k-tiles [w*KT, w*KT + KT).
 * Every CTA keeps the whole previous state s_{t-1}, [8 sequences][K] 16-bit,
 * in its own shared memory. One step:
 *   ldmatrix s_{t-1} -> mma.m16n8k16 (fp32 accumulate) -> warp partial sums
 *   to shared memory -> warp n sums the 8 warps' partials of sequence n's R
 *   rows, applies the activation and writes out[t] (warps past the group's
 *   live sequences skip this) -> the CTA's R-row slice of s_t goes into every CTA's
 *   shared memory by st.async (distributed shared memory), 16 bytes (8 rows
 *   of one sequence) a store and only the group's live sequences, each store
 *   counting its bytes down on an mbarrier of the receiver.
 * Each warp has its own mbarrier per state buffer, for the rows of its K
 * slice only, and starts its mma as soon as those rows are in: the exchange
 * and the tensor-core work overlap. No cluster barrier per step (its release
 * is a GPU-wide fence). The state buffers alternate by step parity; that
 * suffices: a CTA writes step s + 1 into a peer's buffer (s + 2) % 2 only
 * after all of its warps had their rows of step s, the peer's included,
 * which the peer sent after its last read of that buffer (in step s).
 *
 * The state is carried at the element width, like the grid-wide kernel and
 * nn.RNN; sums are fp32.
 * A fused layer (proj.clusters > 0, either shape) puts its first
 * proj.clusters clusters to computing xp (projection.cuh, by mma); the rest
 * step, reading a chunk of xp once its flag is full, as the FFMA kernel's
 * steppers do (at R = 72 that fits in 255 registers, no local memory, only
 * because a warp waits once per run of chunks, not once per chunk).
 */
#ifndef PRNN_CLUSTER_CUH
#define PRNN_CLUSTER_CUH

#include "dsmem.cuh"
#include "exchange.cuh"
#include "mma.cuh"
#include "projection.cuh"
#include "cells.cuh"

namespace prnn {

/* Fixed geometry: 8 warps (dsmem.cuh), 8 sequences (mma n = 8) per cluster; rows per CTA are compiled (64 or 72). */
const int kClusterSeqs = 8;

/* A compiled shape: K extent 8 warps x KT k-tiles x 16 = 128 * KT columns, `rows` rows of A per CTA. */
struct ClusterConfig {
  int k_tiles; /* KT per warp */
  int rows;    /* R */
  const void *kernel; /* cluster_rnn_kernel (RecurrenceParams, InputProjection) */
};

/* Row pitches (16-bit elements) of the state ([8][K + 8]) and of the outgoing
 * slice ([8][R + 8]): 16 bytes of padding keep ldmatrix and the epilogue's
 * stores free of bank conflicts and every row 16-byte aligned. */
__host__ __device__ constexpr int cluster_state_pitch(int k_extent) { return k_extent + 8; }
__host__ __device__ constexpr int cluster_slice_pitch(int rows) { return rows + 8; }
/* Row pitch (fp32) of the warps' partial sums [8 warps][8 sequences][R + 4]:
 * the mma's C fragments go in as scalar stores that hit 32 different banks
 * (sequence 2q's row starts 8q or 24q banks on, row g adds g). */
__host__ __device__ constexpr int cluster_partial_pitch(int rows) { return rows + 4; }

/* Dynamic shared memory of the kernel for a K extent and R: first the mbarriers
 * [2 buffers][8 warps], a space of their own (no other access ever touches
 * them); then, while stepping, two state buffers [8][K + 8] 16-bit, the warps'
 * partial sums [8][8][R + 4] fp32 and the outgoing slice [8][R + 8] 16-bit; before
 * stepping, the same space stages A (cluster_stage_smem). */
const int kClusterBarBytes = 2 * kClusterWarps * 8;
__host__ __device__ constexpr int cluster_step_smem(int k_extent, int rows) {
  return 2 * kClusterSeqs * cluster_state_pitch(k_extent) * 2 +
         kClusterWarps * kClusterSeqs * cluster_partial_pitch(rows) * 4 + kClusterSeqs * cluster_slice_pitch(rows) * 2;
}
/* The A staging area: [R][K + 8] forward (rows of W_hh contiguous), [K][R + 8]
 * backward (A = W_hh^T, whose columns are contiguous): either way 16-byte
 * stores along the contiguous dimension, free of bank conflicts at R = 64. */
__host__ __device__ constexpr int cluster_stage_smem(int k_extent, int rows) {
  return (rows * (k_extent + 8) > k_extent * (rows + 8) ? rows * (k_extent + 8) : k_extent * (rows + 8)) * 2;
}
__host__ __device__ constexpr int cluster_smem_bytes(int k_extent, int rows) {
  return kClusterBarBytes + (cluster_step_smem(k_extent, rows) > cluster_stage_smem(k_extent, rows)
                                 ? cluster_step_smem(k_extent, rows)
                                 : cluster_stage_smem(k_extent, rows));
}

template <class Cell, typename E, int KT, int ROWS>
__global__ void __launch_bounds__(kClusterThreads, 1)
    cluster_rnn_kernel(const RecurrenceParams p, const InputProjection proj) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int MT = ROWS / 16;          /* whole m-tiles per CTA */
  constexpr bool HALF = ROWS % 16 == 8;  /* and rows 16 MT .. + 8 as half of one more */
  constexpr int KEXT = kClusterWarps * KT * 16;
  constexpr int SPITCH = cluster_state_pitch(KEXT);
  constexpr int PPITCH = cluster_partial_pitch(ROWS), SLPITCH = cluster_slice_pitch(ROWS);
  constexpr int OPT = (ROWS + 31) / 32;  /* outputs per thread: rows lane + 32 i of its warp's sequence */
  static_assert(ROWS % 8 == 0 && MT >= 1 && OPT <= 3, "bad cluster shape");
  static_assert(Cell::kGates == 1, "an Elman family: one row of A an output");

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int T = p.steps, B = p.batch, H = p.hidden;
  const unsigned rank = cluster_rank(), ctas = cluster_size();
  const int row0 = (int)rank * ROWS;
  if (p.cluster.group_seqs < 1 || p.cluster.group_seqs > kClusterSeqs) __trap(); /* the launcher's contract: 1..8 */
  extern __shared__ __align__(16) unsigned char smem[];
  if (project_if_producer<E>(p, proj, smem, rank, ctas)) return;
  const int producers = proj.clusters;
  const int seq0 = ((int)cluster_index() - producers) * p.cluster.group_seqs;
  const int live = B - seq0 < p.cluster.group_seqs ? B - seq0 : p.cluster.group_seqs; /* sequences of this group, >= 1 */
  E *out;
  const E *in, *yfwd, *h0;
  typed_tensors(p, out, in, yfwd, h0);

  /* shared memory: bars[2][8] mbarriers, then state[2][8][SPITCH] 16-bit,
   * partial[8 warps][8 sequences][PPITCH] fp32, slice[8][SLPITCH] 16-bit (or the A staging area) */
  uint64_t *bars = reinterpret_cast<uint64_t *>(smem);
  unsigned char *space = smem + kClusterBarBytes;
  unsigned short *state = reinterpret_cast<unsigned short *>(space);
  float *partial = reinterpret_cast<float *>(space + 2 * kClusterSeqs * SPITCH * 2);
  unsigned short *slice = reinterpret_cast<unsigned short *>(partial + kClusterWarps * kClusterSeqs * PPITCH);

  /* A fragments (mma row-major 16x16): a[m][kt] = rows 16m + {g, g+8}, k = 16(w KT + kt) + {2q, 2q+8} (+1).
   * Staged through shared memory (coalesced global reads, then ldmatrix) so the
   * prologue needs no more registers than the fragments themselves. The half
   * tile keeps only its live rows' registers (a0, a2; a1 and a3 are zero). */
  const int g = lane >> 2, q = lane & 3;
  uint32_t a[MT][KT][4];
  uint32_t a_half[HALF ? KT : 1][2];
  {
    unsigned short *stage = reinterpret_cast<unsigned short *>(space); /* cluster_stage_smem: padded, no bank conflicts */
    const E *A = static_cast<const E *>(p.a);
    /* A goes in as 16-byte chunks of 8 elements along its contiguous dimension
     * (k forward, rows backward), 8 chunks in flight per thread: one element
     * per load was 256 dependent L2 round trips, ~30 us per call (NOTES.md). */
    const bool k_fastest = p.a_stride_col == 1;
    const int64_t line_stride = k_fastest ? p.a_stride_row : p.a_stride_col;
    const bool wide = (k_fastest || p.a_stride_row == 1) && line_stride % 8 == 0 &&
                      (reinterpret_cast<uintptr_t>(A) & 15) == 0;
    constexpr int CHUNK = 8, INFLIGHT = 8;
    constexpr int CHUNKS = ROWS * KEXT / CHUNK;
    constexpr int ROUNDS = (CHUNKS + kClusterThreads * INFLIGHT - 1) / (kClusterThreads * INFLIGHT);
    /* chunk c: forward (row c / (KEXT/8), k 8 (c % (KEXT/8)) + j); backward (row 8 (c % (R/8)) + j, k c / (R/8)) */
    auto chunk_origin = [&](int c, int &r, int &k) {
      r = k_fastest ? c / (KEXT / CHUNK) : (c % (ROWS / CHUNK)) * CHUNK;
      k = k_fastest ? (c % (KEXT / CHUNK)) * CHUNK : c / (ROWS / CHUNK);
    };
    for (int round = 0; round < ROUNDS; ++round) {
      uint4 v[INFLIGHT];
#pragma unroll
      for (int u = 0; u < INFLIGHT; ++u) {
        int r, k;
        const int c = (round * INFLIGHT + u) * kClusterThreads + tid;
        chunk_origin(c, r, k);
        const int i = row0 + r;
        const int last_i = k_fastest ? i : i + CHUNK - 1, last_k = k_fastest ? k + CHUNK - 1 : k;
        if (c >= CHUNKS) { /* past the last chunk when R K / 8 is not a whole number of rounds */
          v[u] = make_uint4(0, 0, 0, 0);
        } else if (wide && last_i < H && last_k < H) {
          v[u] = *reinterpret_cast<const uint4 *>(A + i * p.a_stride_row + k * p.a_stride_col);
        } else { /* an edge of A, or a layout 16-byte loads cannot read */
          uint32_t w[CHUNK / 2];
#pragma unroll
          for (int j = 0; j < CHUNK; j += 2) {
            uint32_t pair = 0;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const int ii = k_fastest ? i : i + j + h, kk = k_fastest ? k + j + h : k;
              if (ii < H && kk < H) pair |= bits16(A[ii * p.a_stride_row + kk * p.a_stride_col]) << (16 * h);
            }
            w[j / 2] = pair;
          }
          v[u] = make_uint4(w[0], w[1], w[2], w[3]);
        }
      }
#pragma unroll
      for (int u = 0; u < INFLIGHT; ++u) {
        int r, k;
        const int c = (round * INFLIGHT + u) * kClusterThreads + tid;
        if (c >= CHUNKS) break;
        chunk_origin(c, r, k);
        /* forward [r][k], chunk = k .. k+7 of row r; backward [k][r], chunk = rows r .. r+7 of column k */
        unsigned short *dst = k_fastest ? stage + r * (KEXT + 8) + k : stage + k * (ROWS + 8) + r;
        *reinterpret_cast<uint4 *>(dst) = v[u];
      }
    }
    __syncthreads();
    const uint32_t stage_base = (uint32_t)__cvta_generic_to_shared(stage);
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int kt = 0; kt < KT; ++kt) {
        /* matrices (rows 0-7 | 8-15) x (k 0-7 | 8-15) of the 16 x 16 tile at (16m, k0) */
        const int k0 = (warp * KT + kt) * 16;
        if (k_fastest) { /* lane l: row 16m + l % 16, columns k0 + 8 (l / 16) */
          const int r = 16 * m + (lane & 15), k = k0 + 8 * (lane >> 4);
          ldmatrix_x4(stage_base + (uint32_t)((r * (KEXT + 8) + k) * 2), a[m][kt][0], a[m][kt][1], a[m][kt][2],
                      a[m][kt][3]);
        } else { /* [k][r]: lane l points at k row k0 + l % 8 + 8 (l / 16), rows 16m + 8 (l / 8 % 2); .trans */
          const int k = k0 + (lane & 7) + 8 * (lane >> 4), r = 16 * m + 8 * ((lane >> 3) & 1);
          ldmatrix_x4_trans(stage_base + (uint32_t)((k * (ROWS + 8) + r) * 2), a[m][kt][0], a[m][kt][1],
                            a[m][kt][2], a[m][kt][3]);
        }
      }
    if (HALF) {
#pragma unroll
      for (int kt = 0; kt < KT; ++kt) {
        /* matrices rows 16 MT .. + 8 x (k 0-7 | 8-15): lanes 0-15 give the addresses */
        const int k0 = (warp * KT + kt) * 16, r = 16 * MT, k = k0 + 8 * ((lane >> 3) & 1);
        if (k_fastest)
          ldmatrix_x2(stage_base + (uint32_t)(((r + (lane & 7)) * (KEXT + 8) + k) * 2), a_half[kt][0],
                      a_half[kt][1]);
        else
          ldmatrix_x2_trans(stage_base + (uint32_t)(((k + (lane & 7)) * (ROWS + 8) + r) * 2), a_half[kt][0],
                            a_half[kt][1]);
      }
    }
    __syncthreads(); /* the staging area is the state buffers' */
  }

  /* Both state buffers zero (padding rows stay zero), then s_{-1} = h0 (zero backward). */
  for (int i = tid; i < 2 * kClusterSeqs * SPITCH / 8; i += kClusterThreads)
    reinterpret_cast<uint4 *>(state)[i] = make_uint4(0, 0, 0, 0);
  __syncthreads();
  if (!p.backward) {
#pragma unroll 8
    for (int i = tid; i < live * H; i += kClusterThreads) {
      const int n = i / H, k = i % H;
      state[n * SPITCH + k] = (unsigned short)bits16(h0[(size_t)(seq0 + n) * p.h0_stride_b + k]);
    }
  }

  /* This thread's outputs: sequence n = warp, local rows lane + 32 i, so that a
   * warp's loads of xp and stores of y are 32 consecutive elements (2-byte
   * accesses 8 sequences apart kept the memory pipe busy: bench/NOTES.md),
   * and warps of sequences past the group's live ones skip the epilogue. */
  static_assert(kClusterWarps == kClusterSeqs, "one warp per sequence");
  /* the warp's sequence and its length; rows are row0 + lane + 32 i (recomputed: registers are short at R = 72) */
  const int o_b = seq0 + warp;
  const int o_len = warp < live ? sequence_length(p.lengths, o_b, T) : 0;
  bool o_valid[OPT];
  /* Epilogue operands, in (bits 0-15) and y (16-31) of a row packed in one
   * register (registers are short at R = 72): of this step, the next, and the
   * step after (loads run two steps ahead). */
  uint32_t o_op[OPT], next_op[OPT], after_op[OPT];
#pragma unroll
  for (int i = 0; i < OPT; ++i) after_op[i] = 0; /* T = 2 never loads them */
  E o_out[OPT];
  auto load_operands = [&](int s_at, uint32_t (&op)[OPT]) {
    const int t = p.backward ? T - 1 - s_at : s_at;
#pragma unroll
    for (int i = 0; i < OPT; ++i) {
      const int row = row0 + lane + 32 * i;
      /* ld.global.cg: a fused layer's xp is written while the kernel runs */
      const uint32_t vin = o_valid[i] ? bits16(__ldcg(in + t * p.in_stride_t + o_b * p.in_stride_b + row)) : 0u;
      const uint32_t vy = (o_valid[i] && p.backward) ? bits16(yfwd[((size_t)t * B + o_b) * H + row]) : 0u;
      op[i] = vin | vy << 16;
    }
  };
#pragma unroll
  for (int i = 0; i < OPT; ++i) {
    /* n >= live: another group's sequence, or none; lane + 32 i >= R: another CTA's row */
    o_valid[i] = lane + 32 * i < ROWS && row0 + lane + 32 * i < H && warp < live;
  }
  /* xp of a step is read once its chunk's flag is full: here steps 0-2, in the loop step s + 3 (the
   * warps of live sequences only: the others load nothing). ready_step: the first step whose xp is
   * not known stored. */
  int ready_step = producers > 0 && warp < live ? 0 : 0x7fffffff;
  for (int s0 = 0; s0 < (T < 3 ? T : 3); ++s0)
    ready_step = wait_projection_step(p, proj, s0, ready_step);
  load_operands(0, o_op);
  if (T > 1) load_operands(1, next_op);
  if (T > 2) load_operands(2, after_op);

  /* mbarriers [2 buffers][8 warps]; every CTA of the cluster has started and
   * initialised its state and barriers before any peer writes into them. */
  const uint32_t bar_base = (uint32_t)__cvta_generic_to_shared(bars);
  auto bar = [&](int buffer, int w) { return bar_base + 8u * (uint32_t)(buffer * kClusterWarps + w); };
  if (tid < 2 * kClusterWarps) mbarrier_init(bar_base + 8u * tid, 1);
  if (tid == 0) asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  cluster_arrive();
  cluster_wait();
  /* This warp's K slice is state rows [16 KT warp, 16 KT (warp + 1)), of the
   * live sequences; rows past the cluster's C * R and sequences past the
   * group's live ones are never sent (they stay zero). */
  constexpr int WROWS = 16 * KT;
  const int sent_rows = (int)ctas * ROWS - warp * WROWS;
  const unsigned warp_bytes =
      (unsigned)(sent_rows <= 0 ? 0 : (sent_rows < WROWS ? sent_rows : WROWS)) * (unsigned)live * 2;
  /* The stores of a step: (peer, chunk) pairs, chunk = 8 rows of one live
   * sequence (live * R / 8 per peer), spread over the threads; this thread's
   * first pair and its stride, so the step needs no division. */
  const int chunks = live * (ROWS / 8);
  const int first_peer = tid / chunks, first_chunk = tid % chunks;
  const int peer_stride = kClusterThreads / chunks, chunk_stride = kClusterThreads % chunks;
  const bool exchange = warp_bytes > 0;

  const uint32_t state_base = (uint32_t)__cvta_generic_to_shared(state);
  for (int s = 0; s < T; ++s) {
    const int t = p.backward ? T - 1 - s : s;
    const int cur = s & 1;
    const unsigned short *prev = state + cur * kClusterSeqs * SPITCH;
    /* Arm this warp's barrier of the next buffer (its previous phase ended
     * before step s - 1), then wait for this step's rows (sent in step s - 1). */
    if (exchange && lane == 0 && s + 1 < T) mbarrier_expect_bytes(bar(1 - cur, warp), warp_bytes);
    if (exchange && s > 0) {
      unsigned long long since = 0; /* for the watchdog */
      for (unsigned round = 1; !mbarrier_done(bar(cur, warp), ((s - 1) >> 1) & 1); ++round) watchdog(round, &since);
    }

    /* (A s_{t-1}) for the CTA's R rows x 8 sequences, this warp's K slice. */
    float acc[MT + HALF][4];
#pragma unroll
    for (int m = 0; m < MT + HALF; ++m) acc[m][0] = acc[m][1] = acc[m][2] = acc[m][3] = 0.f;
    auto mma_k_tile = [&](int kt, uint32_t b0, uint32_t b1) {
#pragma unroll
      for (int m = 0; m < MT; ++m) MmaOp<E>::run(acc[m], a[m][kt], b0, b1);
      if (HALF) {
        const uint32_t ah[4] = {a_half[kt][0], 0u, a_half[kt][1], 0u};
        MmaOp<E>::run(acc[MT], ah, b0, b1);
      }
    };
#pragma unroll
    for (int kt = 0; kt < KT; kt += 2) {
      /* lane l points at sequence l % 8, columns k0 + 8 (l / 8): matrices 0..3 = k [k0, k0+8), [+8, +16), [+16, +24), [+24, +32) */
      const int k0 = (warp * KT + kt) * 16;
      const uint32_t b_addr =
          state_base + (uint32_t)(((cur * kClusterSeqs + (lane & 7)) * SPITCH + k0 + 8 * (lane >> 3)) * 2);
      uint32_t b0, b1, b2, b3;
      if (kt + 1 < KT) {
        ldmatrix_x4(b_addr, b0, b1, b2, b3);
        mma_k_tile(kt, b0, b1);
        mma_k_tile(kt + 1, b2, b3);
      } else { /* the last of an odd KT: matrices 0, 1 (lanes 0-15's addresses) */
        ldmatrix_x2(b_addr, b0, b1);
        mma_k_tile(kt, b0, b1);
      }
    }
    /* C fragment: acc[m] = rows 16m + {g, g+8}, sequences 2q, 2q+1 (rows 16 MT + g only, of the half tile). */
#pragma unroll
    for (int m = 0; m < MT + HALF; ++m) {
      float *part = partial + (warp * kClusterSeqs + 2 * q) * PPITCH + 16 * m + g;
      part[0] = acc[m][0];
      part[PPITCH] = acc[m][1];
      if (m < MT) {
        part[8] = acc[m][2];
        part[PPITCH + 8] = acc[m][3];
      }
    }
    __syncthreads();

    if (warp < live) { /* warp-uniform: the slices of sequences past live are never sent */
#pragma unroll
      for (int i = 0; i < OPT; ++i) {
        const int r = lane + 32 * i; /* local row; the sequence is n = warp */
        if (r >= ROWS) break;
        float mat = 0.f;
#pragma unroll
        for (int w = 0; w < kClusterWarps; ++w) mat += partial[(w * kClusterSeqs + warp) * PPITCH + r];
        const bool active = o_valid[i] && t < o_len;
        /* past the length the state stays s_{t-1}: it is in this CTA's own buffer */
        const float frozen =
            (o_valid[i] && !active && !p.backward) ? from_bits<E>(prev[warp * SPITCH + row0 + r]) : 0.f;
        float st;
        o_out[i] = Round<E>::to(Cell::step(p.backward, p.activation, active, mat, from_bits<E>(o_op[i] & 0xffffu),
                                                 from_bits<E>(o_op[i] >> 16), frozen, &st));
        slice[warp * SLPITCH + r] = o_valid[i] ? round_bits<E>(st) : (unsigned short)0; /* padding publishes zeros */
      }
    }
    __syncthreads();

    /* The slice's live sequences into every CTA's next buffer; the last step's is not needed. */
    if (s + 1 < T) {
      int peer = first_peer, chunk = first_chunk;
      while (peer < (int)ctas) {
        const int n = chunk / (ROWS / 8), r = chunk % (ROWS / 8) * 8; /* rows [r, r + 8) of sequence n */
        const uint4 v = *reinterpret_cast<const uint4 *>(slice + n * SLPITCH + r);
        const uint32_t local = state_base + (uint32_t)((((1 - cur) * kClusterSeqs + n) * SPITCH + row0 + r) * 2);
        /* counted on the barrier of the peer's warp that reads these rows */
        store_peer16_async(peer_address(local, peer), v, peer_address(bar(1 - cur, (row0 + r) / WROWS), peer));
        peer += peer_stride;
        chunk += chunk_stride;
        if (chunk >= chunks) {
          chunk -= chunks;
          ++peer;
        }
      }
    }
#pragma unroll
    for (int i = 0; i < OPT; ++i)
      if (o_valid[i]) out[((size_t)t * B + o_b) * H + row0 + lane + 32 * i] = o_out[i];
    /* Operand loads run two steps ahead: one loaded behind this step's wait
     * came back late, and one a step ahead still stalled the step's end. */
    if (s + 1 < T) {
#pragma unroll
      for (int i = 0; i < OPT; ++i) {
        o_op[i] = next_op[i];
        next_op[i] = after_op[i];
      }
      if (s + 3 < T) {
        if (s + 3 >= ready_step) ready_step = wait_projection_step(p, proj, s + 3, ready_step);
        load_operands(s + 3, after_op);
      }
    }
  }
#else
  __trap(); /* never launched: the planner requires compute capability 9.0 */
#endif
}

#define PRNN_CLUSTER_CONFIG(E, KT, ROWS) \
  { KT, ROWS, (const void *)cluster_rnn_kernel<ElmanCell, E, KT, ROWS> }

/* The compiled shapes of each 16-bit dtype, smallest K extent first (cluster.cu). */
const int cluster_config_count = 4; /* cluster.cu checks its tables' lengths against it */
extern const ClusterConfig cluster_configs_bf16[];
extern const ClusterConfig cluster_configs_f16[];

}  // namespace prnn

#endif /* PRNN_CLUSTER_CUH */
