/*
 * gated_cluster.cu - the gated cells (LSTM, GRU) on one thread-block cluster
 * per group of up to 8 sequences, the recurrent weights in the register files
 * as tensor-core fragments for the whole sequence: forward and backward
 * data, 16-bit dtypes, sm_90 and later, H up to 512, no projection (the grid
 * family, gated_grid.cu, and gated.cu's persistent and stepwise families take
 * the rest).
 *
 * The cell is a policy (cells.cuh) and so are the unit's memory accesses
 * (gated_unit.cuh). CTA c of a cluster owns the U = 8 KT hidden units
 * [U c, U c + U): in the forward all G of their gate rows of W_hh, in the
 * backward their columns, so that a unit's cell update (and c, or the
 * backward's carried gradients) stays in a register of the thread that owns
 * it. Both passes run the same step: mma over the warp's K slice of the
 * exchanged state (fp32 sums), the partial sums summed over the 8 warps by
 * the unit's thread, the cell, and the CTA's new values into every CTA's next
 * state buffer by st.async, counted on the mbarrier of the warp whose K slice
 * they are. The exchange carries units, not rows (a row of W is a gate, not a
 * state slot), at the element width: h as the persistent family and
 * nn.LSTM / nn.GRU round it each step, gate gradients as grad_hh is written.
 */
#include "cuda_status.cuh"
#include "dsmem.cuh"
#include "exchange.cuh"
#include "gated_family.cuh"
#include "gated_mma.cuh"

namespace prnn {
namespace {

const int kWarps = kMmaWarps;
const int kSeqs = kMmaSeqs;  /* sequences a cluster carries */
const int kMaxKTiles = 4;    /* U = 8 KT <= 32: a lane per unit; K extent 128 KT >= H */
const int kMaxCtas = 16;

/* Forward: A = the CTA's G U gate rows of W_hh, K = H (<= 128 KT), a CTA
 * sends its U new h values. Backward: A = W_hh^T's rows of the CTA's U
 * units, K = the gate gradients of t+1 in G blocks of Hp = C U (<= 16 U =
 * 128 G KT), a CTA sends its G U gate gradients. */
template <class Cell, int KT>
struct ForwardShape : MmaShape<Cell::kGates * 8 * KT, KT, 8 * KT> {};
template <class Cell, int KT>
struct BackwardShape : MmaShape<8 * KT, Cell::kGates * KT, Cell::kGates * 8 * KT> {};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
/* Where this CTA sits: its rank among the cluster's CTAs, the cluster's
 * first sequence and how many of its p.group.seqs sequences exist. */
struct ClusterPlace {
  unsigned rank, ctas;
  int seq0, live;
  __device__ __forceinline__ explicit ClusterPlace(const GatedParams &p) : rank(cluster_rank()), ctas(cluster_size()) {
    if (p.group.seqs < 1 || p.group.seqs > kSeqs) __trap(); /* the launcher's contract: 1..8 */
    seq0 = (int)cluster_index() * p.group.seqs;
    live = p.batch - seq0 < p.group.seqs ? p.batch - seq0 : p.group.seqs;
  }
};

/* Both state buffers zero (padding columns stay zero), the barriers set, and
 * every CTA of the cluster past that before any peer writes into it. */
template <class S>
__device__ __forceinline__ void start_exchange(const MmaSmem<S> &sm, int tid) {
  for (int i = tid; i < 2 * kSeqs * S::kStatePitch / 8; i += kClusterThreads)
    reinterpret_cast<uint4 *>(sm.state)[i] = make_uint4(0, 0, 0, 0);
  const uint32_t bar_base = (uint32_t)__cvta_generic_to_shared(sm.bars);
  if (tid < 2 * kWarps) mbarrier_init(bar_base + 8u * tid, 1);
  if (tid == 0) asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  __syncthreads();
}

/* The bytes a step's exchange brings into warp w's K slice: columns
 * [16 KT w, 16 KT (w + 1)) of the `sent` columns peers write, for `live` sequences. */
template <class S>
__device__ __forceinline__ unsigned slice_bytes(int warp, int sent, int live) {
  const int cols = 16 * S::kKTiles, mine = sent - warp * cols;
  return (unsigned)(mine <= 0 ? 0 : (mine < cols ? mine : cols)) * (unsigned)live * 2;
}

/* Wait for step `use` (1, 2, ...) of a state buffer: its mbarrier's phase (use - 1) / 2. */
__device__ __forceinline__ void wait_state(uint32_t bar, int use) {
  unsigned long long since = 0; /* for the watchdog */
  for (unsigned round = 1; !mbarrier_done(bar, ((use - 1) >> 1) & 1); ++round) watchdog(round, &since);
}

#endif

/*
 * Forward. The 8 warps split K (= H, the state's width) as the Elman cluster
 * kernel (cluster.cuh) does: warp w holds the fragments of every m-tile for
 * k-tiles [w KT, w KT + KT). Local row g U + ul of A is W_hh row
 * g H + U c + ul. One step:
 *   ldmatrix h_{t-1} -> mma.m16n8k16 (fp32 accumulate) -> partial sums to
 *   shared memory -> warp n, lane ul: unit ul of sequence n sums its G gate
 *   rows over the 8 warps and runs the cell -> the CTA's U new h values of
 *   each live sequence go into every CTA's next state buffer by st.async,
 *   counted on the mbarrier of the warp whose K slice they are.
 */
template <class Cell, typename E, int KT>
__global__ void __launch_bounds__(kClusterThreads, 1) gated_cluster_forward(const GatedParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  typedef ForwardShape<Cell, KT> S;
  const int U = 8 * KT, SPITCH = S::kStatePitch, SLPITCH = S::kSlicePitch;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int T = p.steps, H = p.hidden;
  const ClusterPlace at(p);
  const unsigned ctas = at.ctas;
  const int u0 = (int)at.rank * U, seq0 = at.seq0, live = at.live;
  extern __shared__ __align__(16) unsigned char smem[];
  const MmaSmem<S> sm(smem);

  uint32_t a[S::kMTiles][S::kKTiles][4];
  load_gate_rows<S, E, U>(p, u0, reinterpret_cast<unsigned short *>(sm.space), tid, a); /* the staging area is the state buffers' */
  start_exchange<S>(sm, tid);
  load_initial_state<S, E>(p, sm.state, seq0, live, tid);

  /* This thread's unit: sequence b = seq0 + warp, unit u = u0 + lane. */
  const int b = seq0 + warp, ul = lane, u = u0 + lane;
  const bool mine = warp < live && lane < U && u < H;
  ForwardUnitState<Cell, E> unit(p, b, u, mine);

  cluster_arrive();
  cluster_wait();
  const uint32_t bar_base = (uint32_t)__cvta_generic_to_shared(sm.bars);
  auto bar = [&](int buffer, int w) { return bar_base + 8u * (uint32_t)(buffer * kWarps + w); };
  /* columns past C U are never sent */
  const unsigned warp_bytes = slice_bytes<S>(warp, (int)ctas * U, live);
  const bool exchange = warp_bytes > 0;
  const SliceStores<U> stores(live, tid); /* a step's stores: 8 units of one live sequence each */
  const uint32_t state_base = (uint32_t)__cvta_generic_to_shared(sm.state);

  unsigned short h_bits = 0; /* padding units publish zeros */
  for (int t = 0; t < T; ++t) {
    const int cur = t & 1;
    const unsigned short *prev = sm.state + cur * kSeqs * SPITCH;
    if (exchange && lane == 0 && t + 1 < T) mbarrier_expect_bytes(bar(1 - cur, warp), warp_bytes);
    if (exchange && t > 0) wait_state(bar(cur, warp), t);

    /* W_hh h_{t-1} for the CTA's gate rows x 8 sequences, this warp's K slice. */
    products_to_partials<S, E>(a, sm, cur, warp, lane);
    __syncthreads();

    if (mine) {
      float mat[Cell::kGates];
      unit_gate_sums<Cell, S, U>(sm, warp, ul, mat);
      const unsigned short own = prev[warp * SPITCH + u]; /* h_{t-1} of this unit */
      const bool active = unit.template step<FastMath>(p, t, b, mat, from_bits<E>(own));
      h_bits = active ? (unsigned short)bits16(unit.last.out) : own;
    }
    if (warp < live && lane < U) sm.slice[warp * SLPITCH + ul] = h_bits;
    __syncthreads();

    /* The slice's live sequences into every CTA's next buffer (the last
     * step's is not needed), then the unit's other stores, off the path. */
    if (t + 1 < T)
      stores.template send<kSeqs>(ctas, sm.slice, SLPITCH, state_base, 1 - cur, SPITCH,
                                  [&](int r) { return u0 + r; },
                                  [&](int col) { return bar(1 - cur, col / (16 * KT)); });
    if (mine) unit.retire(p, t, b, u);
  }
  if (mine) unit.finish(p, b, u, h_bits);
#else
  __trap(); /* never launched: the planner requires compute capability 9.0 */
#endif
}

/*
 * Backward data. Local row ul of A is column U c + ul of W_hh, so the
 * products give W_hh^T (gate gradients of t+1) for the CTA's units, and
 * the cell's backward of a unit (its carried dc, and a GRU's direct part of
 * dh) stays in the registers of the thread that owns it. The state a step
 * exchanges is the hh-side gate gradients of every unit, laid out as G blocks
 * of Hp = C U columns, so that each CTA's G chunks of U land 16-byte aligned;
 * they are exchanged in 16 bits, the element width grad_hh is written in. Step
 * s runs t = T - 1 - s; s = T (t = -1) gives grad_h0.
 */
template <class Cell, typename E, int KT>
__global__ void __launch_bounds__(kClusterThreads, 1) gated_cluster_backward(const GatedParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  typedef BackwardShape<Cell, KT> S;
  const int G = Cell::kGates, U = 8 * KT, SPITCH = S::kStatePitch, SLPITCH = S::kSlicePitch;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int T = p.steps, H = p.hidden;
  const ClusterPlace at(p);
  const unsigned ctas = at.ctas;
  const int u0 = (int)at.rank * U, Hp = (int)ctas * U, seq0 = at.seq0, live = at.live;
  extern __shared__ __align__(16) unsigned char smem[];
  const MmaSmem<S> sm(smem);

  /* A = the CTA's columns of W_hh, transposed (the staging area is the state buffers') */
  uint32_t a[S::kMTiles][S::kKTiles][4];
  load_unit_columns<S, Cell, E, U>(p, u0, Hp, reinterpret_cast<unsigned short *>(sm.space), tid, a);
  start_exchange<S>(sm, tid);

  /* This thread's unit: sequence b = seq0 + warp, unit u = u0 + lane. */
  const int b = seq0 + warp, ul = lane, u = u0 + lane;
  const bool mine = warp < live && lane < U && u < H;
  BackwardUnitState<Cell, E> unit(p, b, u, mine);

  cluster_arrive();
  cluster_wait();
  const uint32_t bar_base = (uint32_t)__cvta_generic_to_shared(sm.bars);
  auto bar = [&](int buffer, int w) { return bar_base + 8u * (uint32_t)(buffer * kWarps + w); };
  const unsigned warp_bytes = slice_bytes<S>(warp, G * Hp, live);
  const bool exchange = warp_bytes > 0; /* a warp past G Hp multiplies zeros no peer writes */
  const SliceStores<G * U> stores(live, tid);
  const uint32_t state_base = (uint32_t)__cvta_generic_to_shared(sm.state);

  for (int s = 0; s <= T; ++s) {
    const int t = T - 1 - s, cur = s & 1;
    if (exchange && lane == 0 && s < T) mbarrier_expect_bytes(bar(1 - cur, warp), warp_bytes);
    if (s > 0) {
      if (exchange) wait_state(bar(cur, warp), s);
      products_to_partials<S, E>(a, sm, cur, warp, lane);
      __syncthreads();
    }

    if (warp < live && lane < U) {
      float dhh[G];
#pragma unroll
      for (int g = 0; g < G; ++g) dhh[g] = 0.f; /* padding units and steps past the length send zeros */
      if (mine) unit.step(p, s, b, u, dhh, [&] { return sum_partials<S>(sm, warp, ul); });
      if (s < T)
#pragma unroll
        for (int g = 0; g < G; ++g) sm.slice[warp * SLPITCH + g * U + ul] = round_bits<E>(dhh[g]);
    }
    __syncthreads();

    if (s < T)
      stores.template send<kSeqs>(ctas, sm.slice, SLPITCH, state_base, 1 - cur, SPITCH,
                                  [&](int r) { return r / U * Hp + u0 + r % U; },
                                  [&](int col) { return bar(1 - cur, col / (16 * S::kKTiles)); });
    if (mine && t >= 0) unit.store(p, t, b, u); /* after the sends: off the path */
    unit.load(p, t - 1, b, u);
  }
#else
  __trap(); /* never launched: the planner requires compute capability 9.0 */
#endif
}

/* The kernel of a cell, dtype, pass and KT (1..kMaxKTiles), and its shared memory. */
template <class Cell, typename E>
void kernel_of(bool backward, int k_tiles, const void **fn, int *smem) {
  switch (k_tiles) {
#define PRNN_GATED_CLUSTER_CASE(KT)                                                                   \
  case KT:                                                                                            \
    *fn = backward ? (const void *)gated_cluster_backward<Cell, E, KT> : (const void *)gated_cluster_forward<Cell, E, KT>; \
    *smem = backward ? BackwardShape<Cell, KT>::kSmemBytes : ForwardShape<Cell, KT>::kSmemBytes;     \
    return;
    PRNN_GATED_CLUSTER_CASE(1)
    PRNN_GATED_CLUSTER_CASE(2)
    PRNN_GATED_CLUSTER_CASE(3)
    PRNN_GATED_CLUSTER_CASE(4)
#undef PRNN_GATED_CLUSTER_CASE
  }
  *fn = NULL;
}

template <class Cell>
void kernel_of_cell(prnn_dtype_t dtype, bool backward, int k_tiles, const void **fn, int *smem) {
  if (dtype == PRNN_DTYPE_BFLOAT16) kernel_of<Cell, __nv_bfloat16>(backward, k_tiles, fn, smem);
  else kernel_of<Cell, __half>(backward, k_tiles, fn, smem);
}

/* Clusters of a kernel the device holds at once, cached per device, cell,
 * dtype, pass, KT and cluster size (0: not asked yet; -1: none). */
int g_room[kMaxDevices][2][2][2][kMaxKTiles][kMaxCtas + 1];

/* The room of a kernel (*room, -1 for none), cached in g_room. A kernel the
 * device cannot run as compiled (a build without sm_90 code: the PTX of
 * older architectures only traps), or whose attributes or occupancy it
 * refuses (a cluster size the part does not take), has none: the family
 * declines, and the next one runs the problem. Other errors are returned. */
prnn_status_t cluster_room(int device, const prnn_problem_t *pb, bool backward, int k_tiles, const void *fn,
                           int ctas, int smem, int *room) {
  int *known =
      &g_room[device][pb->cell == PRNN_CELL_LSTM][pb->dtype == PRNN_DTYPE_BFLOAT16][backward][k_tiles - 1][ctas];
  *room = __atomic_load_n(known, __ATOMIC_ACQUIRE);
  if (*room != 0) return PRNN_STATUS_SUCCESS;
  cudaError_t err = prepare_kernel(fn, 90, smem);
  if (err == cudaSuccess) err = cudaFuncSetAttribute(fn, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  int clusters = 0;
  if (err == cudaSuccess) {
    cudaLaunchAttribute attr;
    const cudaLaunchConfig_t cfg = cluster_launch_config(ctas, ctas, smem, 0, &attr);
    err = cudaOccupancyMaxActiveClusters(&clusters, fn, &cfg);
  }
  return remember_capacity(known, err, clusters, "planning the gated cluster kernel", room);
}

/* Whether the family takes the request: 16 bits, no projection, H up to
 * 128 kMaxKTiles, on compute capability 9.0 or later with cluster launches
 * and the cluster tier not disabled, and the batch's groups of at most 8
 * sequences all resident at once. */
prnn_status_t take(const GatedRequest &request, GatedPlan *plan, bool *taken) {
  const prnn_problem_t *pb = request.problem;
  const bool backward = request.backward;
  const int device = request.device;
  const bool half = pb->dtype == PRNN_DTYPE_BFLOAT16 || pb->dtype == PRNN_DTYPE_FLOAT16;
  if (!request.dev.cluster_launch || request.dev.major < 9 || !half || pb->proj_size > 0 ||
      pb->hidden > 128 * kMaxKTiles || device < 0 || device >= kMaxDevices || prnn_cluster_tier_disabled())
    return PRNN_STATUS_SUCCESS;
  const int H = (int)pb->hidden, k_tiles = (H + 127) / 128, units = 8 * k_tiles;
  /* at least two CTAs: compute-sanitizer refuses st.async within a cluster of one */
  const int ctas = (H + units - 1) / units < 2 ? 2 : (H + units - 1) / units;
  const void *fn = NULL;
  int smem = 0;
  if (pb->cell == PRNN_CELL_LSTM) kernel_of_cell<LstmCell>(pb->dtype, backward, k_tiles, &fn, &smem);
  else kernel_of_cell<GruCell>(pb->dtype, backward, k_tiles, &fn, &smem);
  int room;
  const prnn_status_t st = cluster_room(device, pb, backward, k_tiles, fn, ctas, smem, &room);
  if (st != PRNN_STATUS_SUCCESS) return st;
  /* groups as small as the room allows: a step's exchange carries only a group's sequences */
  const int64_t most_groups = room < 1 ? 0 : room;
  if ((pb->batch + kSeqs - 1) / kSeqs > most_groups) return PRNN_STATUS_SUCCESS;
  const int group = (int)((pb->batch + most_groups - 1) / most_groups);
  plan->summary.tier = PRNN_TIER_PERSISTENT_CLUSTER;
  plan->summary.grid = ctas * (int)((pb->batch + group - 1) / group);
  plan->summary.block = kClusterThreads;
  plan->summary.rows_per_cta = backward ? units : prnn_cell_gates(pb->cell) * units; /* of W_hh, or of W_hh^T */
  plan->summary.smem_bytes = smem;
  plan->kernel = fn;
  plan->group.ctas = ctas;
  plan->group.seqs = group;
  *taken = true;
  return PRNN_STATUS_SUCCESS;
}

prnn_status_t launch(const GatedPlan &plan, const prnn_problem_t *, bool, GatedParams p, void *,
                     cudaStream_t stream) {
  p.group.seqs = plan.group.seqs;
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t cfg =
      cluster_launch_config(plan.summary.grid, plan.group.ctas, plan.summary.smem_bytes, stream, &attr);
  void *args[] = {&p};
  const cudaError_t err = cudaLaunchKernelExC(&cfg, plan.kernel, args);
  if (err != cudaSuccess) return cuda_fail(err, "cudaLaunchKernelEx(gated cluster kernel)");
  return PRNN_STATUS_SUCCESS;
}

}  // namespace

extern const GatedFamily gated_cluster_family = {take, launch, true};

}  // namespace prnn
