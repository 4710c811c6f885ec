/*
 * gated_grid.cu - the gated cells (LSTM, GRU) on one cooperative grid
 * without clusters, forward and backward data, 16-bit dtypes: W_hh in the
 * register files as tensor-core fragments for the whole sequence
 * (gated_mma.cuh), the exchanged state (h, or the backward's gate gradients)
 * through L2 as tagged words (exchange.cuh). sm_80 and later, H up to 1024,
 * no projection; where clusters run, the cluster family (gated_cluster.cu)
 * takes H <= 512 first.
 *
 * A group of C = ceil(H / 16) CTAs carries up to 8 sequences, groups side by
 * side; CTA r of a group owns the 16 hidden units [16 r, 16 r + 16): in the
 * forward all G of their gate rows (local row 16 g + ul is W_hh row
 * g H + 16 r + ul), in the backward their columns, so that a unit's cell
 * update and c (or carried gradients) stay in the thread that owns the unit.
 * One forward step (the backward's, below, is alike):
 *   a block barrier (no warp polls while another still runs its epilogue)
 *   -> the unit threads store step t - 1's y and saved values and load the
 *   next inputs (off the path: the poll waits for other CTAs anyway) ->
 *   warp w polls the words of its own K slice of h_{t-1} (state columns
 *   [16 KT w, 16 KT w + 16 KT) of the group's live sequences; words {tag:
 *   high 32 bits, two 16-bit values}, tag = t, all in flight, the stale ones
 *   loaded again in rounds until every tag matches) into the shared state
 *   buffer and runs its mma.m16n8k16 over them at once: a late writer delays
 *   only the warps that need its units -> partial sums -> one block barrier
 *   -> warp n, lane ul: the cell of unit ul of sequence n -> units 2i, 2i + 1
 *   of h_t in one word of tag t + 1, stored at GPU scope. An aligned 8-byte
 *   access is single-copy atomic, so a matching tag proves the values: no
 *   fence, no flag.
 * The words lie in two buffers by step parity. A CTA writes step t + 1's
 * words over step t - 1's only after its warps have read every word of step t
 * (their slices cover the group's units; the barrier orders them before the
 * epilogue), and each of those was written after its writer had read all of
 * step t - 1.
 */
#include "cuda_status.cuh"
#include "exchange.cuh"
#include "gated_family.cuh"
#include "gated_mma.cuh"

namespace prnn {
namespace {

const int kUnits = 16;      /* hidden units a CTA: all their gate rows (forward) or their columns (backward) */
const int kMaxKTiles = 8;   /* the forward's k-tiles a warp: K extent 128 KT >= H, H <= 1024 */
const int kBackwardSlots = 8;  /* 16-byte pairs a lane has in flight in the backward's poll */
const int kBackwardChains = 4; /* accumulator chains of its one m-tile: 8 dependent mma, not 32 */

/* Forward: A = the G U gate rows of the CTA's units (3-4 m-tiles), K = H.
 * Backward: A = the CTA's U columns of W_hh transposed (one m-tile), K = the
 * hh-side gate gradients of t + 1 in G blocks of Hp = C U columns (128 G KT
 * >= G Hp: 32 k-tiles a warp for an LSTM at H = 1024, 128 registers of
 * fragments). Two buffers of partial sums: a step's are written while the
 * last step's may still be read. */
template <class Cell, int KT>
struct GridShape : MmaShape<Cell::kGates * kUnits, KT, kUnits, 2> {};
template <class Cell, int KT>
struct GridBackwardShape : MmaShape<kUnits, Cell::kGates * KT, Cell::kGates * kUnits, 2> {};

/* The words of a sequence's exchanged state, two 16-bit values a word: C
 * CTAs of kUnits values in `blocks` blocks (1 forward, G backward); even, so
 * that a 16-byte pair of words never straddles two sequences. */
__host__ __device__ inline int words_per_seq(int ctas, int blocks) { return blocks * ctas * kUnits / 2; }

/* The buffers keep a row of the whole K extent a sequence, 64 KT words a
 * block (at least words_per_seq(C, blocks); the rest stays zero), so that
 * the poll's sequences lie a compile-time stride apart: S::kKExtent / 2. */
__host__ __device__ inline int row_words(int blocks, int k_tiles) { return blocks * kMmaWarps * k_tiles * 16 / 2; }

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
/* Where this CTA sits: its group's CTAs, its rank there and first unit, the
 * group's first sequence and how many of its p.group.seqs sequences exist. */
struct GridPlace {
  int ctas, rank, u0, seq0, live;
  __device__ __forceinline__ explicit GridPlace(const GatedParams &p) {
    if (p.group.seqs < 1 || p.group.seqs > kMmaSeqs) __trap(); /* the launcher's contract: 1..8 */
    ctas = (p.hidden + kUnits - 1) / kUnits;
    rank = (int)blockIdx.x % ctas;
    u0 = rank * kUnits;
    seq0 = (int)blockIdx.x / ctas * p.group.seqs;
    live = p.batch - seq0 < p.group.seqs ? p.batch - seq0 : p.group.seqs;
  }
};

/* Both state buffers zero: columns no word covers (padding units, sequences
 * past the live ones, K past the exchanged values) stay zero. */
template <class S>
__device__ __forceinline__ void zero_state(const MmaSmem<S> &sm, int tid) {
  for (int i = tid; i < 2 * kMmaSeqs * S::kStatePitch / 8; i += kMmaThreads)
    reinterpret_cast<uint4 *>(sm.state)[i] = make_uint4(0, 0, 0, 0);
  __syncthreads();
}

/* Warp `warp`'s K slice of the exchanged state: state columns [16 KT warp,
 * 16 KT warp + 16 KT) (KT = S::kKTiles), word k = columns 2k, 2k + 1, of
 * each of the `live` sequences of `words` words (rows `row` words apart in
 * the buffer: row_words). A lane's 16-byte pairs
 * lane, lane + 32, ... (pair i: sequence i / P, pair i % P of its P in the
 * slice) go through SLOTS loads in flight, slot j taking the lane's pairs
 * j, j + SLOTS, ..., in batches the warp polls together (poll_word_pairs).
 * The cursors are the same every step, so they are set once, before the
 * steps; a slot's cursor steps without a division, so that a polling round
 * costs a few instructions a slot. */
template <class S, int SLOTS>
struct SlicePoll {
  int first, P, end, dS;
  int start[SLOTS]; /* slot j's first cursor: 256 n + r for pair r of sequence n (P <= 4 G KT <= 128) */
  __device__ __forceinline__ SlicePoll(int words, int live, int warp, int lane) {
    first = 8 * S::kKTiles * warp;
    P = min(8 * S::kKTiles, max(words - first, 0)) / 2; /* even width: a pair never straddles two sequences */
    end = P > 0 ? 256 * live : 0;                       /* none left once >= 256 live */
    const int p = max(P, 1), d32 = 32 / p * 256 + 32 % p;
    dS = SLOTS * 32 / p * 256 + SLOTS * 32 % p;
    start[0] = lane / p * 256 + lane % p;
#pragma unroll
    for (int j = 1; j < SLOTS; ++j) start[j] = step(start[j - 1], d32);
  }
  __device__ __forceinline__ int step(int c, int d) const {
    c += d;
    return (c & 255) >= P ? c + 256 - P : c;
  }
  /* The slice of tag `tag` from `src`, polled until every tag matches, into
   * `state` ([sequence][kStatePitch]); then __syncwarp, so that the warp's
   * ldmatrix sees it. */
  __device__ __forceinline__ void load(const unsigned long long *src, int row, int /* live */, unsigned tag,
                                       unsigned short *state) const {
    if (P == 0) return; /* columns past the exchanged values: zero since the start */
    poll_word_pairs<SLOTS>(
        tag, end, start, [&](int c) { return step(c, dS); },
        [&](int c) { return src + (c >> 8) * row + first + 2 * (c & 255); },
        [&](int c, unsigned long long w0, unsigned long long w1) { /* words first + 2 r, + 1: columns 2 first + 4 r .. + 3 */
          *reinterpret_cast<uint2 *>(state + (c >> 8) * S::kStatePitch + 2 * first + 4 * (c & 255)) =
              make_uint2((uint32_t)w0, (uint32_t)w1);
        });
    __syncwarp();
  }
};

/* The same slice where a lane's pairs fit its slots, without cursors
 * (LanePairs): the forward's slice (P <= 4 KT <= 32 pairs) takes M = 1;
 * the backward's (P <= 4 G KT) up to M = 4, for two sequences. */
template <class S, int M, int SEQS_MAX>
struct SlicePollOnce {
  int first, lane;
  LanePairs<M, SEQS_MAX> pairs;
  __device__ __forceinline__ SlicePollOnce(int words, int live, int warp, int lane_)
      : first(8 * S::kKTiles * warp), lane(lane_),
        pairs(min(8 * S::kKTiles, max(words - 8 * S::kKTiles * warp, 0)) / 2, live, lane_) {}
  /* The slice of tag `tag` from `src` (rows `row` words apart) into
   * `state`, as SlicePoll::load, for up to SEQS_MAX live sequences. */
  __device__ __forceinline__ void load(const unsigned long long *src, int row, int live, unsigned tag,
                                       unsigned short *state) const {
    const unsigned long long *at = src + first + 2 * lane;
    unsigned short *to = state + 2 * first + 4 * lane;
    pairs.load(
        tag, live, [&](int n, int m) { return at + n * row + 64 * m; },
        [&](int n, int m, unsigned long long w0, unsigned long long w1) {
          *reinterpret_cast<uint2 *>(to + n * S::kStatePitch + 128 * m) =
              make_uint2((uint32_t)w0, (uint32_t)w1);
        });
  }
};
#endif

/* Forward: the step as the file's header says. */
template <class Cell, typename E, int KT>
__global__ void __launch_bounds__(kMmaThreads, 1) gated_grid_forward(const GatedParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  typedef GridShape<Cell, KT> S;
  const int U = kUnits, SPITCH = S::kStatePitch, ROW = S::kKExtent / 2; /* row_words */
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int T = p.steps, B = p.batch, H = p.hidden;
  const GridPlace at(p);
  const int words = words_per_seq(at.ctas, 1), u0 = at.u0, seq0 = at.seq0, live = at.live;
  extern __shared__ __align__(16) unsigned char smem[];
  const MmaSmem<S> sm(smem);

  uint32_t a[S::kMTiles][S::kKTiles][4];
  load_gate_rows<S, E, U>(p, u0, reinterpret_cast<unsigned short *>(sm.space), tid, a);
  zero_state<S>(sm, tid);
  load_initial_state<S, E>(p, sm.state, seq0, live, tid); /* h_{-1} = h0 into buffer 0 */
  __syncthreads();

  /* This thread's unit: sequence b = seq0 + warp, unit u = u0 + lane. */
  const int b = seq0 + warp, u = u0 + lane;
  const bool mine = warp < live && lane < U && u < H;
  ForwardUnitState<Cell, E> unit(p, b, u, mine);
  unsigned long long *xchg = p.group.words;
  const SlicePollOnce<S, 1, kMmaSeqs> slice(words, live, warp, lane);

  /* Step t uses state buffer and partial sums t & 1: a warp writes buffer
   * t & 1 again at t + 2, after step t + 1's barriers, which every warp
   * reaches only once its step-t epilogue is done. (With the barrier before
   * each poll one buffer of each would do; the second costs shared memory
   * only.) A unit's step ends with its word; its other stores and the next
   * inputs' loads wait past the next barrier, beside the poll. */
  unsigned short h_bits = 0; /* padding units publish zeros */
  for (int t = 0; t < T; ++t) {
    const int cur = t & 1;
    unsigned short *state = sm.state + cur * kMmaSeqs * SPITCH;
    const MmaSmem<S> step = sm.with_partials(cur);
    if (t > 0) {
      __syncthreads(); /* every epilogue of step t - 1 done before the poll */
      if (mine) unit.retire(p, t - 1, b, u);
      slice.load(xchg + ((size_t)((t - 1) & 1) * B + seq0) * ROW, ROW, live, (unsigned)t, state);
    }
    products_to_partials<S, E>(a, step, cur, warp, lane);
    __syncthreads(); /* every warp's partial sums (and K slice of h_{t-1}) in */

    if (warp < live) {
      float mat[Cell::kGates];
      unit_gate_sums_paired<Cell, S, U>(step, warp, lane, mat);
      if (mine) {
        const unsigned short own = state[warp * SPITCH + u]; /* h_{t-1} of this unit */
        const bool active = unit.template step<FastMath>(p, t, b, mat, from_bits<E>(own));
        h_bits = active ? (unsigned short)bits16(unit.last.out) : own;
      }
    }
    const unsigned odd = __shfl_down_sync(0xffffffffu, (unsigned)h_bits, 1);
    if (t + 1 < T && warp < live && lane < U && (lane & 1) == 0)
      store_word(xchg + ((size_t)cur * B + b) * ROW + (u0 + lane) / 2,
                 tagged_word((unsigned)t + 1, (uint32_t)h_bits | odd << 16));
  }
  if (mine) {
    unit.retire(p, T - 1, b, u);
    unit.finish(p, b, u, h_bits);
  }
#else
  __trap(); /* never launched: the planner requires compute capability 8.0 */
#endif
}

/*
 * Backward data, the cluster backward's layout (gated_cluster.cu) on the
 * grid: local row ul of A is column u0 + ul of W_hh, so the products give
 * W_hh^T (gate gradients of t + 1) for the CTA's units, and a unit's carried
 * dc (and a GRU's direct part of dh) stays in its thread's registers. Step s
 * (t = T - 1 - s) exchanges the hh-side gate gradients of every unit, column
 * g Hp + v, as words of two 16-bit values (grad_hh's width) and tag s + 1:
 * after a block barrier warp w polls its K slice of them and runs its mma,
 * another barrier, the unit threads' backward, each even lane publishing its
 * and its neighbour's G values; a unit's gradients of the step and the next
 * step's saved values wait past the next barrier, as the forward's stores.
 * s = T (t = -1) gives grad_h0. The epilogue reads no state, so
 * the state buffers' and partial sums' argument is the forward's.
 */
template <class Cell, typename E, int KT>
__global__ void __launch_bounds__(kMmaThreads, 1) gated_grid_backward(const GatedParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  typedef GridBackwardShape<Cell, KT> S;
  const int G = Cell::kGates, U = kUnits, ROW = S::kKExtent / 2; /* row_words */
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int T = p.steps, B = p.batch, H = p.hidden;
  const GridPlace at(p);
  const int words = words_per_seq(at.ctas, G), Hp = at.ctas * U, u0 = at.u0, seq0 = at.seq0, live = at.live;
  extern __shared__ __align__(16) unsigned char smem[];
  const MmaSmem<S> sm(smem);

  uint32_t a[S::kMTiles][S::kKTiles][4];
  load_unit_columns<S, Cell, E, U>(p, u0, Hp, reinterpret_cast<unsigned short *>(sm.space), tid, a);
  zero_state<S>(sm, tid);

  /* This thread's unit: sequence b = seq0 + warp, unit u = u0 + lane. */
  const int b = seq0 + warp, ul = lane, u = u0 + lane;
  const bool mine = warp < live && lane < U && u < H;
  BackwardUnitState<Cell, E> unit(p, b, u, mine);
  unsigned long long *xchg = p.group.words;
  /* The steps with either poll: a group of one or two sequences (every
   * group at B <= 2 groups' worth, or a batch's last group) has a lane's
   * pairs fit its slots; one grid may run both. */
  auto steps = [&](const auto &slice) {
    for (int s = 0; s <= T; ++s) {
      const int cur = s & 1;
      const MmaSmem<S> step = sm.with_partials(cur);
      if (s > 0) {
        __syncthreads(); /* as the forward's */
        if (mine) { /* step s - 1's gradients and step s's saved values, beside the poll */
          unit.store(p, T - s, b, u);
          unit.load(p, T - 1 - s, b, u);
        }
        slice.load(xchg + ((size_t)((s - 1) & 1) * B + seq0) * ROW, ROW, live, (unsigned)s,
                   sm.state + cur * kMmaSeqs * S::kStatePitch);
        products_to_partials<S, E, kBackwardChains>(a, step, cur, warp, lane);
        __syncthreads(); /* every warp's partial sums in */
      }
      float dhh[G];
#pragma unroll
      for (int g = 0; g < G; ++g) dhh[g] = 0.f; /* padding units and steps past the length publish zeros */
      if (mine) unit.step(p, s, b, u, dhh, [&] { return sum_partials<S>(step, warp, ul); });
      if (s < T)
#pragma unroll
        for (int g = 0; g < G; ++g) {
          const unsigned bits = round_bits<E>(dhh[g]), odd = __shfl_down_sync(0xffffffffu, bits, 1);
          if (warp < live && lane < U && (lane & 1) == 0)
            store_word(xchg + ((size_t)cur * B + b) * ROW + (g * Hp + u0 + lane) / 2,
                       tagged_word((unsigned)s + 1, bits | odd << 16));
        }
    }
  };
  if (live <= 2) steps(SlicePollOnce<S, (S::kKTiles + 7) / 8, 2>(words, live, warp, lane));
  else steps(SlicePoll<S, kBackwardSlots>(words, live, warp, lane));
#else
  __trap(); /* never launched: the planner requires compute capability 8.0 */
#endif
}

/* The kernel of a cell, dtype, pass and KT (1..kMaxKTiles), and its shared memory. */
template <class Cell, typename E>
void kernel_of(bool backward, int k_tiles, const void **fn, int *smem) {
  switch (k_tiles) {
#define PRNN_GATED_GRID_CASE(KT)                                                                         \
  case KT:                                                                                               \
    *fn = backward ? (const void *)gated_grid_backward<Cell, E, KT> : (const void *)gated_grid_forward<Cell, E, KT>; \
    *smem = backward ? GridBackwardShape<Cell, KT>::kSmemBytes : GridShape<Cell, KT>::kSmemBytes;       \
    return;
    PRNN_GATED_GRID_CASE(1)
    PRNN_GATED_GRID_CASE(2)
    PRNN_GATED_GRID_CASE(3)
    PRNN_GATED_GRID_CASE(4)
    PRNN_GATED_GRID_CASE(5)
    PRNN_GATED_GRID_CASE(6)
    PRNN_GATED_GRID_CASE(7)
    PRNN_GATED_GRID_CASE(8)
#undef PRNN_GATED_GRID_CASE
  }
  *fn = NULL;
}

template <class Cell>
void kernel_of_cell(prnn_dtype_t dtype, bool backward, int k_tiles, const void **fn, int *smem) {
  if (dtype == PRNN_DTYPE_BFLOAT16) kernel_of<Cell, __nv_bfloat16>(backward, k_tiles, fn, smem);
  else kernel_of<Cell, __half>(backward, k_tiles, fn, smem);
}

/* CTAs of a kernel each multiprocessor holds at once, cached per device,
 * cell, dtype, pass and KT (0: not asked yet; -1: none: a build without code
 * the device runs, or attributes it refuses: shared memory past the part's;
 * other errors are returned, not cached). */
int g_per_sm[kMaxDevices][2][2][2][kMaxKTiles];

prnn_status_t ctas_per_sm(int device, const prnn_problem_t *pb, bool backward, int k_tiles, const void *fn, int smem,
                          int *per_sm) {
  int *known = &g_per_sm[device][pb->cell == PRNN_CELL_LSTM][pb->dtype == PRNN_DTYPE_BFLOAT16][backward][k_tiles - 1];
  *per_sm = __atomic_load_n(known, __ATOMIC_ACQUIRE);
  if (*per_sm != 0) return PRNN_STATUS_SUCCESS;
  cudaError_t err = prepare_kernel(fn, 80, smem);
  int blocks = 0;
  if (err == cudaSuccess) err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, fn, kMmaThreads, smem);
  return remember_capacity(known, err, blocks, "planning the gated grid kernel", per_sm);
}

/* Whether the family takes the request: 16 bits, no projection, H up to
 * 128 kMaxKTiles, compute capability 8.0 or later with cooperative launches,
 * and every CTA of the batch's groups of at most 8 sequences resident at once. */
prnn_status_t take(const GatedRequest &request, GatedPlan *plan, bool *taken) {
  const prnn_problem_t *pb = request.problem;
  const bool backward = request.backward;
  const int device = request.device;
  const bool half = pb->dtype == PRNN_DTYPE_BFLOAT16 || pb->dtype == PRNN_DTYPE_FLOAT16;
  if (!half || pb->proj_size > 0 || request.dev.major < 8 || !request.dev.cooperative ||
      pb->hidden > 128 * kMaxKTiles || device < 0 || device >= kMaxDevices)
    return PRNN_STATUS_SUCCESS;
  const int H = (int)pb->hidden, G = prnn_cell_gates(pb->cell), k_tiles = (H + 127) / 128;
  const int ctas = (H + kUnits - 1) / kUnits;
  const void *fn = NULL;
  int smem = 0;
  if (pb->cell == PRNN_CELL_LSTM) kernel_of_cell<LstmCell>(pb->dtype, backward, k_tiles, &fn, &smem);
  else kernel_of_cell<GruCell>(pb->dtype, backward, k_tiles, &fn, &smem);
  int per_sm;
  const prnn_status_t st = ctas_per_sm(device, pb, backward, k_tiles, fn, smem, &per_sm);
  if (st != PRNN_STATUS_SUCCESS) return st;
  /* every CTA resident at once (a cooperative launch); groups as small as that allows */
  const int64_t most_groups = per_sm < 1 ? 0 : (int64_t)per_sm * request.dev.sms / ctas;
  if (most_groups < 1 || (pb->batch + kMmaSeqs - 1) / kMmaSeqs > most_groups) return PRNN_STATUS_SUCCESS;
  const int group = (int)((pb->batch + most_groups - 1) / most_groups);
  plan->summary.tier = PRNN_TIER_PERSISTENT_REGISTERS;
  plan->summary.workspace_bytes = 2 * (size_t)pb->batch *
                                  row_words(backward ? G : 1, k_tiles) *
                                  sizeof(unsigned long long);
  plan->summary.grid = ctas * (int)((pb->batch + group - 1) / group);
  plan->summary.block = kMmaThreads;
  plan->summary.rows_per_cta = backward ? kUnits : G * kUnits; /* of W_hh, or of W_hh^T backward */
  plan->summary.smem_bytes = smem;
  plan->kernel = fn;
  plan->group.ctas = ctas;
  plan->group.seqs = group;
  *taken = true;
  return PRNN_STATUS_SUCCESS;
}

}  // namespace

extern const GatedFamily gated_grid_family = {take, launch_grouped_words, true};

}  // namespace prnn
