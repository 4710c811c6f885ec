/*
 * gated_ffma.cu - the gated cells (LSTM, GRU) in float32 on one cooperative
 * grid, forward and backward data: W_hh in the register files for the whole
 * sequence, multiplied by FFMA, and the exchanged state (h, or the
 * backward's gate gradients) through L2 as tagged words {tag, one float32}
 * (exchange.cuh). sm_80 and later, H up to 1024, no projection; the 16-bit
 * dtypes run on the tensor-core families (gated_cluster.cu, gated_grid.cu),
 * whose grid layout this one follows. Planned for the forward; the backward
 * only with PRNN_GATED_FFMA=1, since it is slower than the persistent
 * family's (bench/NOTES.md step 75), which reads the same saved values.
 *
 * A group of C = ceil(H / 8) CTAs carries up to S sequences (S = 1, 2, 4 or 8,
 * compiled), groups side by side; CTA r of a group owns the 8 hidden units
 * [8 r, 8 r + 8): in the forward all G of their gate rows (local row 8 g + ul
 * is W_hh row g H + 8 r + ul), in the backward their columns (local row ul is
 * column 8 r + ul of W_hh; K is the gate gradients of every unit, in G blocks
 * of Hp = 8 C columns), so that a unit's cell update and c (or carried
 * gradients) stay in the thread that owns the unit.
 *
 * The R local rows over the CTA's 8 warps: warp w holds the K slice
 * [w KW, w KW + KW); there lane (rl, part) holds rows rl and rl + R / 2 at
 * the 4-column chunks part, part + PL, part + 2 PL, ... (PL = 32 / (R / 2)
 * lanes share a pair of rows: 2 forward, 8 backward). A lane's 2 KL values
 * stay in registers; the state it multiplies them with is read from shared
 * memory as broadcasts, the PL parts' chunks side by side (no bank conflict),
 * and the parts' sums meet by shuffles.
 *
 * One forward step (the backward's is alike, s = T - 1 - t, s = T giving
 * grad_h0):
 *   a block barrier (the last step's epilogue has read the state buffer and
 *   the partial sums) -> the unit threads store step t - 1's y and saved
 *   values and load the next inputs (beside the poll, which waits for other
 *   CTAs anyway) -> warp w polls the words of its K slice of h_{t-1}
 *   (tag t) into the shared state buffer and multiplies them: a late writer
 *   delays only the warps that need its units -> partial sums -> a block
 *   barrier -> thread (n, ul): the cell of unit ul of the group's sequence n
 *   from the 8 warps' partial sums -> its h_t as a word of tag t + 1, stored
 *   at GPU scope.
 * The words lie in two buffers by step parity: a CTA writes step t + 1's words
 * over step t - 1's only after its warps have read every word of step t, each
 * written after its writer had read all of step t - 1.
 */
#include <type_traits>

#include "cuda_status.cuh"
#include "exchange.cuh"
#include "gated_family.cuh"
#include "staging.cuh"

namespace prnn {
namespace {

const int kThreads = 256;
const int kWarps = kThreads / 32;
const int kUnits = 8;   /* hidden units a CTA */
const int kMaxHidden = 1024;

/* A pass's on-chip layout for KL columns of a row a lane and S sequences a group. */
template <class Cell, bool BACKWARD, int KL, int S>
struct FfmaShape {
  static const int kRows = BACKWARD ? kUnits : Cell::kGates * kUnits; /* R: 32 LSTM, 24 GRU forward; 8 backward */
  static const int kRowLanes = kRows / 2;                            /* a lane holds rows rl and rl + R / 2 */
  static const int kParts = 32 / kRowLanes;                          /* PL lanes a pair of rows */
  static const int kSliceWidth = kParts * KL;                        /* KW: columns of a warp */
  static const int kExtent = kWarps * kSliceWidth;                   /* columns of A a CTA covers */
  static const int kPartialPitch = kRows + 1;
  /* 16-byte pairs a lane has in flight in a poll: at KL = 64 a lane has 2 S
   * pairs, all in flight up to S = 4; more slots than pairs cost registers */
  static const int kSlots = KL < 64 || S == 4 ? 8 : 4;
  static const int kStepBytes = (S * kExtent + kWarps * S * kPartialPitch) * (int)sizeof(float);
  static const int kStagePitch = kExtent + 4;                        /* half of A staged [R / 2][kExtent + 4] */
  static const int kStageBytes = kRowLanes * kStagePitch * (int)sizeof(float);
  static const int kSmemBytes = kStepBytes > kStageBytes ? kStepBytes : kStageBytes;
  static const bool kBackward = BACKWARD;
  static_assert(kRows % 2 == 0 && (kParts & (kParts - 1)) == 0 && kParts * kRowLanes <= 32, "lanes of a warp");
  static_assert(KL % 4 == 0 && ((kSliceWidth / 2) & (kSliceWidth / 2 - 1)) == 0, "chunks, and pairs a power of 2");
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
/* Where this CTA sits: its group's CTAs, its first unit, the group's first
 * sequence and how many of its p.group.seqs sequences exist. */
struct FfmaPlace {
  int ctas, u0, seq0, live;
  __device__ __forceinline__ FfmaPlace(const GatedParams &p, int most_seqs) {
    if (p.group.seqs < 1 || p.group.seqs > most_seqs) __trap(); /* the launcher's contract */
    ctas = (p.hidden + kUnits - 1) / kUnits;
    u0 = (int)blockIdx.x % ctas * kUnits;
    seq0 = (int)blockIdx.x / ctas * p.group.seqs;
    live = min(p.batch - seq0, p.group.seqs);
  }
};

/* This lane's values of A: a[i][4 j + e] = A[rl + i R / 2][w KW + 4 (PL j +
 * part) + e], from value(row, column) (zero outside A, read without a
 * branch: masked_load), staged through
 * shared memory half of A at a time, so that each lane reads its values
 * 16 bytes at a time from one base (loads straight from memory, each with
 * its own bounds, spill on sm_80). The staging reads consecutive columns of
 * W_hh's rows with consecutive threads: along k forward, along the units
 * backward. Ends with the staging area free. */
template <class Sh, int KL, class Value>
__device__ __forceinline__ void load_rows(float (&a)[2][KL], float *stage, int tid, Value value) {
  const int lane = tid & 31, warp = tid >> 5, rl = lane / Sh::kParts, part = lane % Sh::kParts;
  const int RL = Sh::kRowLanes, KEXT = Sh::kExtent, PITCH = Sh::kStagePitch;
  const bool live = rl < RL;
  const float *src = stage + (live ? rl : 0) * PITCH + warp * Sh::kSliceWidth + 4 * part;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    batched_copy<kThreads, 16>(RL * KEXT, tid, [&](int idx) {
      idx = min(idx, RL * KEXT - 1); /* a last round's loads past the half read its last value, not stored */
      return value((Sh::kBackward ? idx % RL : idx / KEXT) + i * RL, Sh::kBackward ? idx / RL : idx % KEXT);
    }, [&](int idx, float v) {
      stage[Sh::kBackward ? idx % RL * PITCH + idx / RL : idx / KEXT * PITCH + idx % KEXT] = v;
    });
    __syncthreads();
#pragma unroll
    for (int j = 0; j < KL / 4; ++j) {
      const float4 v = *reinterpret_cast<const float4 *>(src + 4 * Sh::kParts * j);
      a[i][4 * j] = live ? v.x : 0.f;
      a[i][4 * j + 1] = live ? v.y : 0.f;
      a[i][4 * j + 2] = live ? v.z : 0.f;
      a[i][4 * j + 3] = live ? v.w : 0.f;
    }
    __syncthreads();
  }
}

/* This warp's rows times its K slice of the S sequences in `state`
 * ([S][kExtent]) into its partial sums [warp][sequence][row]. */
template <class Sh, int KL, int S>
__device__ __forceinline__ void products(const float (&a)[2][KL], const float *state, float *partial, int warp,
                                         int lane) {
  const int rl = lane / Sh::kParts, part = lane % Sh::kParts;
  float acc[2][S];
#pragma unroll
  for (int n = 0; n < S; ++n) acc[0][n] = acc[1][n] = 0.f;
#pragma unroll
  for (int j = 0; j < KL / 4; ++j) {
    const int k = warp * Sh::kSliceWidth + 4 * (Sh::kParts * j + part);
#pragma unroll
    for (int n = 0; n < S; ++n) {
      const float4 h = *reinterpret_cast<const float4 *>(state + n * Sh::kExtent + k);
#pragma unroll
      for (int i = 0; i < 2; ++i)
        acc[i][n] = fmaf(a[i][4 * j + 3], h.w,
                         fmaf(a[i][4 * j + 2], h.z, fmaf(a[i][4 * j + 1], h.y, fmaf(a[i][4 * j], h.x, acc[i][n]))));
    }
  }
#pragma unroll
  for (int off = 1; off < Sh::kParts; off <<= 1)
#pragma unroll
    for (int n = 0; n < S; ++n) {
      acc[0][n] += __shfl_xor_sync(0xffffffffu, acc[0][n], off);
      acc[1][n] += __shfl_xor_sync(0xffffffffu, acc[1][n], off);
    }
  if (part == 0 && rl < Sh::kRowLanes)
#pragma unroll
    for (int n = 0; n < S; ++n) {
      float *row = partial + (warp * S + n) * Sh::kPartialPitch + rl;
      row[0] = acc[0][n];
      row[Sh::kRowLanes] = acc[1][n];
    }
}

/* Row `row` of sequence n summed over the 8 warps' partial sums, as a tree. */
template <class Sh, int S>
__device__ __forceinline__ float sum_partials(const float *partial, int n, int row) {
  const float *q = partial + n * Sh::kPartialPitch + row;
  const int stride = S * Sh::kPartialPitch;
  float s4[4];
#pragma unroll
  for (int w = 0; w < 4; ++w) s4[w] = q[w * stride] + q[(w + 4) * stride];
  return (s4[0] + s4[1]) + (s4[2] + s4[3]);
}

/* Warp `warp`'s K slice of the exchanged state: words [w KW, w KW + KW),
 * cut at `words`, of each of the `live` sequences (`row` words apart in the
 * buffer: K extent forward, `words` backward). Pair i
 * of the slice (sequence i / P, words 2 (i % P), + 1 of the slice;
 * P = KW / 2) goes to lane i % 32; a lane's pairs go through kSlots loads
 * in flight (fewer where the lane's values of A leave fewer registers),
 * slot j taking its pairs j, j + kSlots, ..., in batches the warp polls
 * together (poll_word_pairs). The slots' first cursors are set each step
 * (a few instructions with P a power of 2): registers to hold them across
 * the steps would spill. */
template <class Sh>
struct SlicePoll {
  static const int P = Sh::kSliceWidth / 2, kSlots = Sh::kSlots;
  int first, pairs, end, lane;
  __device__ __forceinline__ SlicePoll(int words, int live, int warp, int lane_) : lane(lane_) {
    first = warp * Sh::kSliceWidth;
    pairs = min(Sh::kSliceWidth, words - first) / 2; /* words is even: a pair never straddles sequences */
    end = pairs > 0 ? live * P : 0;                  /* none past columns no word covers: zero since the start */
  }
  /* the first of a slot's pairs from i that lies in the slice (the last warp's is cut at `words`) */
  __device__ __forceinline__ int live_from(int i) const {
    while (i < end && i % P >= pairs) i += 32 * kSlots;
    return i;
  }
  /* The slice of tag `tag` from `src`, polled until every tag matches, into
   * `state` ([sequence][kExtent]); then __syncwarp, so that the warp's
   * products see it. */
  __device__ __forceinline__ void load(const unsigned long long *src, int row, int /* live */, unsigned tag,
                                       float *state) const {
    if (end == 0) return;
    int start[kSlots];
#pragma unroll
    for (int j = 0; j < kSlots; ++j) start[j] = live_from(lane + 32 * j);
    poll_word_pairs<kSlots>(
        tag, end, start, [&](int i) { return live_from(i + 32 * kSlots); },
        [&](int i) { return src + i / P * row + first + 2 * (i % P); },
        [&](int i, unsigned long long w0, unsigned long long w1) {
          *reinterpret_cast<float2 *>(state + i / P * Sh::kExtent + first + 2 * (i % P)) =
              make_float2(payload_float(w0), payload_float(w1));
        });
    __syncwarp();
  }
};

/* The same slice where a lane's pairs fit its slots (LanePairs, M =
 * ceil(P / 32)), without cursors: sequences a compile-time ROW words apart. */
template <class Sh, int S, int ROW>
struct SliceLanes {
  static const int M = (Sh::kSliceWidth / 2 + 31) / 32;
  int first, lane;
  LanePairs<M, S> pairs;
  __device__ __forceinline__ SliceLanes(int words, int live, int warp, int lane_)
      : first(warp * Sh::kSliceWidth), lane(lane_),
        pairs(max(min(Sh::kSliceWidth, words - first), 0) / 2, live, lane_) {}
  /* As SlicePoll::load, with rows ROW words apart (the caller's `row`). */
  __device__ __forceinline__ void load(const unsigned long long *src, int /* row: ROW */, int live, unsigned tag,
                                       float *state) const {
    const unsigned long long *at = src + first + 2 * lane;
    float *to = state + first + 2 * lane;
    pairs.load(
        tag, live, [&](int n, int m) { return at + n * ROW + 64 * m; },
        [&](int n, int m, unsigned long long w0, unsigned long long w1) {
          *reinterpret_cast<float2 *>(to + n * Sh::kExtent + 64 * m) =
              make_float2(payload_float(w0), payload_float(w1));
        });
  }
};

/* The forward's poll: SliceLanes where S M pairs fit a lane's slots. */
template <class Sh, int S>
using ForwardSlice = typename std::conditional<S * SliceLanes<Sh, S, Sh::kExtent>::M <= Sh::kSlots,
                                               SliceLanes<Sh, S, Sh::kExtent>, SlicePoll<Sh>>::type;
#endif

/* Forward: the step as the file's header says. */
template <class Cell, int KL, int S>
__global__ void __launch_bounds__(kThreads, 1) gated_ffma_forward(const GatedParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  typedef FfmaShape<Cell, false, KL, S> Sh;
  const int G = Cell::kGates, U = kUnits, KEXT = Sh::kExtent;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int T = p.steps, B = p.batch, H = p.hidden;
  const FfmaPlace at(p, S);
  const int words = at.ctas * U, u0 = at.u0, seq0 = at.seq0, live = at.live; /* words exchanged a sequence */
  extern __shared__ __align__(16) float smem[];
  float *state = smem;                  /* [S][KEXT]: h_{t-1} */
  float *partial = smem + S * KEXT;     /* [warps][S][kPartialPitch] */

  float a[2][KL];
  const float *w_hh = static_cast<const float *>(p.w_hh);
  load_rows<Sh, KL>(a, smem, tid, [&](int row, int k) {
    const int u = u0 + row % U;
    return masked_load(w_hh, (int64_t)(row / U * H + u) * p.w_hh_stride + k, u < H && k < H);
  });
  const float *h0 = static_cast<const float *>(p.h0);
  batched_copy<kThreads, 8>(S * KEXT, tid, [&](int i) {
    const int n = i / KEXT, k = i % KEXT;
    return masked_load(h0, (int64_t)(seq0 + n) * p.h0_stride_b + k, n < live && k < H);
  }, [&](int i, float v) { state[i] = v; });
  __syncthreads();

  /* This thread's unit: sequence b = seq0 + n, unit u = u0 + ul; padding units publish zeros. */
  const int n = tid / U, ul = tid % U, b = seq0 + n, u = u0 + ul;
  const bool publishes = n < live, mine = publishes && u < H;
  ForwardUnitState<Cell, float> unit(p, b, u, mine);
  unsigned long long *xchg = p.group.words; /* rows of KEXT words */
  const ForwardSlice<Sh, S> slice(words, live, warp, lane);

  /* A unit's step ends with its word; its other stores and the next
   * inputs' loads wait past the next barrier, beside the poll. */
  float h = 0.f; /* padding units publish zeros */
  for (int t = 0; t < T; ++t) {
    if (t > 0) {
      __syncthreads(); /* every epilogue of step t - 1 done before the poll */
      if (mine) unit.retire(p, t - 1, b, u);
      slice.load(xchg + ((size_t)((t - 1) & 1) * B + seq0) * KEXT, KEXT, live, (unsigned)t, state);
    }
    products<Sh, KL, S>(a, state, partial, warp, lane);
    __syncthreads(); /* every warp's partial sums (and K slice of h_{t-1}) in */

    if (mine) {
      float mat[G];
#pragma unroll
      for (int g = 0; g < G; ++g) mat[g] = sum_partials<Sh, S>(partial, n, g * U + ul);
      const float own = state[n * KEXT + u]; /* h_{t-1} of this unit, kept past the length */
      h = unit.template step<PreciseMath>(p, t, b, mat, own) ? unit.last.out : own;
    }
    if (publishes && t + 1 < T)
      store_word(xchg + ((size_t)(t & 1) * B + b) * KEXT + u, tagged_word((unsigned)t + 1, __float_as_uint(h)));
  }
  if (mine) {
    unit.retire(p, T - 1, b, u);
    unit.finish(p, b, u, h);
  }
#else
  __trap(); /* never launched: the planner requires compute capability 8.0 */
#endif
}

/* Backward data: A = the CTA's columns of W_hh transposed; step s exchanges
 * the hh-side gate gradients of every unit, column g Hp + v, one word each. */
template <class Cell, int KL, int S>
__global__ void __launch_bounds__(kThreads, 1) gated_ffma_backward(const GatedParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  typedef FfmaShape<Cell, true, KL, S> Sh;
  const int G = Cell::kGates, U = kUnits;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int T = p.steps, B = p.batch, H = p.hidden;
  const FfmaPlace at(p, S);
  const int Hp = at.ctas * U, words = G * Hp, u0 = at.u0, seq0 = at.seq0, live = at.live;
  extern __shared__ __align__(16) float smem[];
  float *state = smem;                      /* [S][kExtent]: the gate gradients of t + 1 */
  float *partial = smem + S * Sh::kExtent;  /* [warps][S][kPartialPitch] */

  float a[2][KL];
  const float *w_hh = static_cast<const float *>(p.w_hh);
  load_rows<Sh, KL>(a, smem, tid, [&](int ul, int k) {
    const int g = k / Hp, v = k % Hp, u = u0 + ul;
    return masked_load(w_hh, (int64_t)(g * H + v) * p.w_hh_stride + u, g < G && v < H && u < H);
  });
  for (int i = tid; i < S * Sh::kExtent; i += kThreads) state[i] = 0.f;
  __syncthreads();

  const int n = tid / U, ul = tid % U, b = seq0 + n, u = u0 + ul;
  const bool publishes = n < live, mine = publishes && u < H;
  BackwardUnitState<Cell, float> unit(p, b, u, mine);
  unsigned long long *xchg = p.group.words;
  const SlicePoll<Sh> slice(words, live, warp, lane);

  for (int s = 0; s <= T; ++s) {
    if (s > 0) {
      __syncthreads(); /* as the forward's */
      if (mine) { /* step s - 1's gradients and step s's saved values, beside the poll */
        unit.store(p, T - s, b, u);
        unit.load(p, T - 1 - s, b, u);
      }
      slice.load(xchg + ((size_t)((s - 1) & 1) * B + seq0) * words, words, live, (unsigned)s, state);
      products<Sh, KL, S>(a, state, partial, warp, lane);
      __syncthreads(); /* every warp's partial sums in */
    }
    float dhh[G];
#pragma unroll
    for (int g = 0; g < G; ++g) dhh[g] = 0.f; /* padding units and steps past the length publish zeros */
    if (mine) unit.step(p, s, b, u, dhh, [&] { return sum_partials<Sh, S>(partial, n, ul); });
    if (s < T && publishes)
#pragma unroll
      for (int g = 0; g < G; ++g)
        store_word(xchg + ((size_t)(s & 1) * B + b) * words + g * Hp + u,
                   tagged_word((unsigned)s + 1, __float_as_uint(dhh[g])));
  }
#else
  __trap(); /* never launched: the planner requires compute capability 8.0 */
#endif
}

/* ------------------------------------------------------------ planning */

/* The compiled KL (columns of a row a lane) and S (sequences a group). */
const int kColumnsPerLane[] = {16, 32, 64};
const int kGroupSeqs[] = {1, 2, 4, 8};
const int kShapesKL = sizeof(kColumnsPerLane) / sizeof(kColumnsPerLane[0]);
const int kShapesS = sizeof(kGroupSeqs) / sizeof(kGroupSeqs[0]);

/* A compiled kernel: its function, shared memory and K extent. */
struct FfmaKernel {
  const void *fn;
  int smem, extent;
};

template <class Cell, int KL, int S>
FfmaKernel kernel_of_shape(bool backward) {
  if (backward)
    return {(const void *)gated_ffma_backward<Cell, KL, S>, FfmaShape<Cell, true, KL, S>::kSmemBytes,
            FfmaShape<Cell, true, KL, S>::kExtent};
  return {(const void *)gated_ffma_forward<Cell, KL, S>, FfmaShape<Cell, false, KL, S>::kSmemBytes,
          FfmaShape<Cell, false, KL, S>::kExtent};
}

template <class Cell, int KL>
FfmaKernel kernel_of_seqs(bool backward, int s_index) {
  switch (s_index) {
    case 0: return kernel_of_shape<Cell, KL, 1>(backward);
    case 1: return kernel_of_shape<Cell, KL, 2>(backward);
    case 2: return kernel_of_shape<Cell, KL, 4>(backward);
    default: return kernel_of_shape<Cell, KL, 8>(backward);
  }
}

template <class Cell>
FfmaKernel kernel_of_cell(bool backward, int kl_index, int s_index) {
  switch (kl_index) {
    case 0: return kernel_of_seqs<Cell, 16>(backward, s_index);
    case 1: return kernel_of_seqs<Cell, 32>(backward, s_index);
    default: return kernel_of_seqs<Cell, 64>(backward, s_index);
  }
}

FfmaKernel kernel_of(prnn_cell_t cell, bool backward, int kl_index, int s_index) {
  return cell == PRNN_CELL_LSTM ? kernel_of_cell<LstmCell>(backward, kl_index, s_index)
                                : kernel_of_cell<GruCell>(backward, kl_index, s_index);
}

/* CTAs of a kernel each multiprocessor holds at once, cached per device,
 * cell, pass and shape (0: not asked yet; -1: none, as in gated_grid.cu). */
int g_per_sm[kMaxDevices][2][2][kShapesKL][kShapesS];

prnn_status_t ctas_per_sm(int device, const prnn_problem_t *pb, bool backward, int kl_index, int s_index,
                          const FfmaKernel &k, int *per_sm) {
  int *known = &g_per_sm[device][pb->cell == PRNN_CELL_LSTM][backward][kl_index][s_index];
  *per_sm = __atomic_load_n(known, __ATOMIC_ACQUIRE);
  if (*per_sm != 0) return PRNN_STATUS_SUCCESS;
  cudaError_t err = prepare_kernel(k.fn, 80, k.smem);
  int blocks = 0;
  if (err == cudaSuccess) err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, k.fn, kThreads, k.smem);
  /* One CTA a multiprocessor, as the family's plans were measured: the few
   * shapes whose registers would let two share one (H <= 512, S <= 2) are
   * not measured that way, and their polls would share its issue slots. */
  if (blocks > 1) blocks = 1;
  return remember_capacity(known, err, blocks, "planning the gated float32 grid kernel", per_sm);
}

/* Whether the family takes the request: the forward (the backward with
 * PRNN_GATED_FFMA=1: prnn_internal.h), float32, no projection, H up to
 * 1024, compute capability 8.0 or later with cooperative launches; the
 * smallest KL whose K extent covers the pass's K, then the fewest sequences
 * a group (S) whose groups of the batch all fit on the GPU at once, with as
 * many groups as fit. */
prnn_status_t take(const GatedRequest &request, GatedPlan *plan, bool *taken) {
  const prnn_problem_t *pb = request.problem;
  const bool backward = request.backward;
  const int device = request.device;
  if (prnn_gated_ffma_passes() < (backward ? 2 : 1) || pb->dtype != PRNN_DTYPE_FLOAT32 || pb->proj_size > 0 ||
      request.dev.major < 8 || !request.dev.cooperative || pb->hidden > kMaxHidden || device < 0 ||
      device >= kMaxDevices)
    return PRNN_STATUS_SUCCESS;
  const int H = (int)pb->hidden, G = prnn_cell_gates(pb->cell);
  const int ctas = (H + kUnits - 1) / kUnits, Hp = ctas * kUnits, K = backward ? G * Hp : H;
  int kl = 0;
  while (kl < kShapesKL && kernel_of(pb->cell, backward, kl, 0).extent < K) ++kl;
  if (kl == kShapesKL) return PRNN_STATUS_SUCCESS;
  for (int s = 0; s < kShapesS; ++s) {
    const FfmaKernel k = kernel_of(pb->cell, backward, kl, s);
    int per_sm;
    const prnn_status_t st = ctas_per_sm(device, pb, backward, kl, s, k, &per_sm);
    if (st != PRNN_STATUS_SUCCESS) return st;
    const int64_t fit = per_sm < 1 ? 0 : (int64_t)per_sm * request.dev.sms / ctas; /* groups at once */
    if (fit < 1 || (pb->batch + kGroupSeqs[s] - 1) / kGroupSeqs[s] > fit) continue;
    const int64_t groups = pb->batch < fit ? pb->batch : fit;
    const int seqs = (int)((pb->batch + groups - 1) / groups);
    plan->summary.tier = PRNN_TIER_PERSISTENT_REGISTERS;
    plan->summary.workspace_bytes = /* rows of G Hp words backward, of the K extent forward */
        2 * (size_t)pb->batch * (backward ? G * Hp : k.extent) * sizeof(unsigned long long);
    plan->summary.grid = ctas * (int)((pb->batch + seqs - 1) / seqs);
    plan->summary.block = kThreads;
    plan->summary.rows_per_cta = backward ? kUnits : G * kUnits; /* of W_hh, or of W_hh^T backward */
    plan->summary.smem_bytes = k.smem;
    plan->kernel = k.fn;
    plan->group.ctas = ctas;
    plan->group.seqs = seqs;
    *taken = true;
    return PRNN_STATUS_SUCCESS;
  }
  return PRNN_STATUS_SUCCESS;
}

}  // namespace

extern const GatedFamily gated_ffma_family = {take, launch_grouped_words, true};

}  // namespace prnn
