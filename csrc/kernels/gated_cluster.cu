/*
 * gated_cluster.cu - the forward of the gated cells (LSTM, GRU) on one
 * thread-block cluster per group of sequences, W_hh in the register files as
 * tensor-core fragments: 16-bit dtypes, sm_90 and later, H up to 512, no
 * projection (gated.cu's persistent and stepwise families take the rest and
 * the backward).
 *
 * The cell is a policy (cells.cuh) and so are the unit's memory accesses
 * (gated_unit.cuh). CTA c of a cluster owns the U = 8 KT hidden units
 * [U c, U c + U) and all G of their gate rows: local row g U + ul of A is
 * W_hh row g H + U c + ul, so a unit's cell update is local to its CTA and c
 * stays in a register of the thread that owns the unit. Its 8 warps split K
 * (= H, the state's width) as the Elman cluster kernel (cluster.cuh) does:
 * warp w holds the fragments of every m-tile for k-tiles [w KT, w KT + KT).
 * One step:
 *   ldmatrix h_{t-1} -> mma.m16n8k16 (fp32 accumulate) -> partial sums to
 *   shared memory -> warp n, lane ul: unit ul of sequence n sums its G gate
 *   rows over the 8 warps and runs the cell -> the CTA's U new h values of
 *   each live sequence go into every CTA's next state buffer by st.async,
 *   counted on the mbarrier of the warp whose K slice they are.
 * The exchange carries U values a sequence a CTA (a row of W is a gate, not
 * a state slot), so the state buffer and the slice are sized by units, the
 * fragments by gate rows. h is exchanged at the element width, as the
 * persistent family and nn.LSTM / nn.GRU round it each step; sums are fp32.
 */
#include <string.h>

#include "cuda_status.cuh"
#include "dsmem.cuh"
#include "exchange.cuh"
#include "gated_cluster.cuh"
#include "mma.cuh"

namespace prnn {
namespace {

const int kWarps = kClusterThreads / 32;
const int kSeqs = 8;         /* sequences a cluster carries: mma n = 8, a warp's epilogue each */
const int kMaxKTiles = 4;    /* U = 8 KT <= 32: a lane per unit; K extent 128 KT >= H */
const int kMaxCtas = 16;

template <class Cell, int KT>
struct GatedClusterShape {
  static const int kUnits = 8 * KT;                          /* U: hidden units a CTA */
  static const int kRows = Cell::kGates * kUnits;            /* live rows of A a CTA */
  static const int kMTiles = (kRows + 15) / 16;              /* padding rows are zero */
  static const int kKExtent = kWarps * KT * 16;              /* columns of A a CTA covers */
  static const int kStatePitch = kKExtent + 8;               /* 16-bit [8][K + 8]: ldmatrix free of conflicts */
  static const int kPartialPitch = 16 * kMTiles + 4;         /* fp32: the C fragments' stores hit 32 banks */
  static const int kSlicePitch = kUnits + 8;                 /* 16-bit [8][U + 8]: rows 16-byte aligned */
  static const int kBarBytes = 2 * kWarps * 8;               /* mbarriers [2 buffers][8 warps] */
  static const int kStepBytes = 2 * kSeqs * kStatePitch * 2 + kWarps * kSeqs * kPartialPitch * 4 +
                                kSeqs * kSlicePitch * 2;
  static const int kStageBytes = 16 * kMTiles * kStatePitch * 2; /* A staged [16 MT][K + 8] for ldmatrix */
  static const int kSmemBytes = kBarBytes + (kStepBytes > kStageBytes ? kStepBytes : kStageBytes);
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
/* The G gate inputs xp of unit u of sequence b at step t (read-only here: written before the launch). */
template <class Cell, typename E>
__device__ __forceinline__ void load_gate_inputs(const GatedParams &p, int t, int b, int u, bool mine,
                                                 float (&xp)[Cell::kGates]) {
  const E *src = static_cast<const E *>(p.xp) + t * p.xp_stride_t + b * p.xp_stride_b + u;
#pragma unroll
  for (int g = 0; g < Cell::kGates; ++g) xp[g] = mine && t < p.steps ? to_accum(__ldg(src + (size_t)g * p.hidden)) : 0.f;
}
#endif

template <class Cell, typename E, int KT>
__global__ void __launch_bounds__(kClusterThreads, 1) gated_cluster_forward(const GatedParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  typedef GatedClusterShape<Cell, KT> S;
  const int G = Cell::kGates, U = S::kUnits, MT = S::kMTiles, KEXT = S::kKExtent;
  const int SPITCH = S::kStatePitch, PPITCH = S::kPartialPitch, SLPITCH = S::kSlicePitch;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int T = p.steps, B = p.batch, H = p.hidden;
  const unsigned rank = cluster_rank(), ctas = cluster_size();
  const int u0 = (int)rank * U;
  if (p.group_seqs < 1 || p.group_seqs > kSeqs) __trap(); /* the launcher's contract: 1..8 */
  const int seq0 = (int)cluster_index() * p.group_seqs;
  const int live = B - seq0 < p.group_seqs ? B - seq0 : p.group_seqs;
  extern __shared__ __align__(16) unsigned char smem[];
  uint64_t *bars = reinterpret_cast<uint64_t *>(smem);
  unsigned char *space = smem + S::kBarBytes;
  unsigned short *state = reinterpret_cast<unsigned short *>(space);
  float *partial = reinterpret_cast<float *>(space + 2 * kSeqs * SPITCH * 2);
  unsigned short *slice = reinterpret_cast<unsigned short *>(partial + kWarps * kSeqs * PPITCH);

  /* A fragments: a[m][kt] = local rows 16m + {g, g+8}, k = 16 (warp KT + kt) + {2q, 2q+8} (+1),
   * staged through shared memory as 16-byte chunks along k. */
  const int g8 = lane >> 2, q = lane & 3;
  uint32_t a[MT][KT][4];
  {
    unsigned short *stage = reinterpret_cast<unsigned short *>(space);
    const E *w_hh = static_cast<const E *>(p.w_hh);
    const bool wide = p.w_hh_stride % 8 == 0 && (reinterpret_cast<uintptr_t>(w_hh) & 15) == 0;
    const int chunks = 16 * MT * (KEXT / 8);
#pragma unroll 4
    for (int c = tid; c < chunks; c += kClusterThreads) {
      const int r = c / (KEXT / 8), k = (c % (KEXT / 8)) * 8;
      const int gate = r / U, ul = r % U;
      const bool row_live = r < S::kRows && u0 + ul < H;
      const E *src = w_hh + (int64_t)(gate * H + u0 + ul) * p.w_hh_stride + k;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (row_live && wide && k + 8 <= H) {
        v = __ldg(reinterpret_cast<const uint4 *>(src));
      } else if (row_live) {
        uint32_t w[4] = {0, 0, 0, 0};
#pragma unroll
        for (int j = 0; j < 8; ++j)
          if (k + j < H) w[j / 2] |= bits16(src[j]) << (16 * (j & 1));
        v = make_uint4(w[0], w[1], w[2], w[3]);
      }
      *reinterpret_cast<uint4 *>(stage + r * SPITCH + k) = v;
    }
    __syncthreads();
    const uint32_t stage_base = (uint32_t)__cvta_generic_to_shared(stage);
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int kt = 0; kt < KT; ++kt) {
        const int r = 16 * m + (lane & 15), k = (warp * KT + kt) * 16 + 8 * (lane >> 4);
        ldmatrix_x4(stage_base + (uint32_t)((r * SPITCH + k) * 2), a[m][kt][0], a[m][kt][1], a[m][kt][2],
                    a[m][kt][3]);
      }
    __syncthreads(); /* the staging area is the state buffers' */
  }

  /* Both state buffers zero (padding columns stay zero), then h_{-1} = h0. */
  for (int i = tid; i < 2 * kSeqs * SPITCH / 8; i += kClusterThreads)
    reinterpret_cast<uint4 *>(state)[i] = make_uint4(0, 0, 0, 0);
  __syncthreads();
  const E *h0 = static_cast<const E *>(p.h0);
  for (int i = tid; i < live * H; i += kClusterThreads) {
    const int n = i / H, k = i % H;
    state[n * SPITCH + k] = (unsigned short)bits16(h0[(size_t)(seq0 + n) * p.h0_stride_b + k]);
  }

  /* This thread's unit: sequence b = seq0 + warp, unit u = u0 + lane. Its b_hh and c stay in registers. */
  const int b = seq0 + warp, ul = lane, u = u0 + lane;
  const bool mine = warp < live && lane < U && u < H;
  UnitInputs<Cell, float> in;
  const E *b_hh = static_cast<const E *>(p.b_hh);
#pragma unroll
  for (int g = 0; g < G; ++g) in.bias[g] = mine && b_hh != NULL ? to_accum(b_hh[g * H + u]) : 0.f;
  float cell = mine && Cell::kCarriesCell ? to_accum(static_cast<const E *>(p.c0)[b * p.c0_stride_b + u]) : 0.f;
  /* xp of this step and the next two (loads run two steps ahead, as in cluster.cuh) */
  float next_xp[G], after_xp[G];
  load_gate_inputs<Cell, E>(p, 0, b, u, mine, in.xp);
  load_gate_inputs<Cell, E>(p, 1, b, u, mine, next_xp);
  load_gate_inputs<Cell, E>(p, 2, b, u, mine, after_xp);

  /* Every CTA of the cluster has initialised its state and barriers before any peer writes into them. */
  const uint32_t bar_base = (uint32_t)__cvta_generic_to_shared(bars);
  auto bar = [&](int buffer, int w) { return bar_base + 8u * (uint32_t)(buffer * kWarps + w); };
  if (tid < 2 * kWarps) mbarrier_init(bar_base + 8u * tid, 1);
  if (tid == 0) asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  cluster_arrive();
  cluster_wait();
  /* Warp w's K slice is state columns [16 KT w, 16 KT (w + 1)); columns past C U are never sent. */
  const int WCOLS = 16 * KT;
  const int sent_cols = (int)ctas * U - warp * WCOLS;
  const unsigned warp_bytes =
      (unsigned)(sent_cols <= 0 ? 0 : (sent_cols < WCOLS ? sent_cols : WCOLS)) * (unsigned)live * 2;
  const bool exchange = warp_bytes > 0;
  const SliceStores<U> stores(live, tid); /* a step's stores: 8 units of one live sequence each */
  E *y = static_cast<E *>(p.y);

  const uint32_t state_base = (uint32_t)__cvta_generic_to_shared(state);
  for (int t = 0; t < T; ++t) {
    const int cur = t & 1;
    const unsigned short *prev = state + cur * kSeqs * SPITCH;
    if (exchange && lane == 0 && t + 1 < T) mbarrier_expect_bytes(bar(1 - cur, warp), warp_bytes);
    if (exchange && t > 0) {
      unsigned long long since = 0; /* for the watchdog */
      for (unsigned round = 1; !mbarrier_done(bar(cur, warp), ((t - 1) >> 1) & 1); ++round) watchdog(round, &since);
    }

    /* W_hh h_{t-1} for the CTA's gate rows x 8 sequences, this warp's K slice. */
    float acc[MT][4];
#pragma unroll
    for (int m = 0; m < MT; ++m) acc[m][0] = acc[m][1] = acc[m][2] = acc[m][3] = 0.f;
#pragma unroll
    for (int kt = 0; kt < KT; kt += 2) {
      const int k0 = (warp * KT + kt) * 16;
      const uint32_t b_addr = state_base + (uint32_t)(((cur * kSeqs + (lane & 7)) * SPITCH + k0 + 8 * (lane >> 3)) * 2);
      uint32_t b0, b1, b2, b3;
      if (kt + 1 < KT) {
        ldmatrix_x4(b_addr, b0, b1, b2, b3);
#pragma unroll
        for (int m = 0; m < MT; ++m) MmaOp<E>::run(acc[m], a[m][kt], b0, b1);
#pragma unroll
        for (int m = 0; m < MT; ++m) MmaOp<E>::run(acc[m], a[m][kt + 1], b2, b3);
      } else {
        ldmatrix_x2(b_addr, b0, b1);
#pragma unroll
        for (int m = 0; m < MT; ++m) MmaOp<E>::run(acc[m], a[m][kt], b0, b1);
      }
    }
    /* C fragment: acc[m] = rows 16m + {g, g+8}, sequences 2q, 2q+1. */
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      float *part = partial + (warp * kSeqs + 2 * q) * PPITCH + 16 * m + g8;
      part[0] = acc[m][0];
      part[PPITCH] = acc[m][1];
      part[8] = acc[m][2];
      part[PPITCH + 8] = acc[m][3];
    }
    __syncthreads();

    if (warp < live && lane < U) {
      unsigned short h_bits = 0; /* padding units publish zeros */
      if (mine) {
        float mat[G];
#pragma unroll
        for (int g = 0; g < G; ++g) {
          const float *part = partial + warp * PPITCH + g * U + ul; /* the 8 warps' sums, as a tree */
          float s4[4];
#pragma unroll
          for (int w = 0; w < 4; ++w) s4[w] = part[w * kSeqs * PPITCH] + part[(w + 4) * kSeqs * PPITCH];
          mat[g] = (s4[0] + s4[1]) + (s4[2] + s4[3]);
        }
        const float own = from_bits<E>(prev[warp * SPITCH + u]); /* h_{t-1} of this unit */
        float out, carry;
        const size_t o = ((size_t)t * B + b) * H + u;
        h_bits = prev[warp * SPITCH + u]; /* past the length the state stays */
        if (forward_unit<Cell, E, float, FastMath>(p, t, b, u, in, mat, Cell::kCarriesCell ? cell : own, &out, &carry)) {
          const E oe = Round<E>::to(out);
          y[o] = oe;
          h_bits = (unsigned short)bits16(oe);
          if (Cell::kCarriesCell) cell = carry;
        } else {
          y[o] = Round<E>::to(0.f);
        }
        if (t == T - 1) {
          static_cast<unsigned short *>(p.h_n)[(size_t)b * H + u] = h_bits;
          if (Cell::kCarriesCell) static_cast<E *>(p.c_n)[(size_t)b * H + u] = Round<E>::to(cell);
        }
      }
      slice[warp * SLPITCH + ul] = h_bits;
    }
    __syncthreads();

    /* The slice's live sequences into every CTA's next buffer; the last step's is not needed. */
    if (t + 1 < T)
      stores.template send<kSeqs>(ctas, slice, SLPITCH, state_base, 1 - cur, SPITCH, u0,
                  [&](int col) { return bar(1 - cur, col / WCOLS); });
#pragma unroll
    for (int g = 0; g < G; ++g) {
      in.xp[g] = next_xp[g];
      next_xp[g] = after_xp[g];
    }
    if (t + 3 < T) load_gate_inputs<Cell, E>(p, t + 3, b, u, mine, after_xp);
  }
#else
  __trap(); /* never launched: the planner requires compute capability 9.0 */
#endif
}

/* The kernel of a cell, dtype and KT (1..kMaxKTiles), and its shared memory. */
template <class Cell, typename E>
void kernel_of(int k_tiles, const void **fn, int *smem) {
  switch (k_tiles) {
#define PRNN_GATED_CLUSTER_CASE(KT)                                       \
  case KT:                                                                \
    *fn = (const void *)gated_cluster_forward<Cell, E, KT>;               \
    *smem = GatedClusterShape<Cell, KT>::kSmemBytes;                      \
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
void kernel_of_cell(prnn_dtype_t dtype, int k_tiles, const void **fn, int *smem) {
  if (dtype == PRNN_DTYPE_BFLOAT16) kernel_of<Cell, __nv_bfloat16>(k_tiles, fn, smem);
  else kernel_of<Cell, __half>(k_tiles, fn, smem);
}

/* Clusters of a kernel the device holds at once, cached per device, cell,
 * dtype, KT and cluster size (0: not asked yet; -1: none). */
const int kMaxDevices = 64;
int g_room[kMaxDevices][2][2][kMaxKTiles][kMaxCtas + 1];

/* The room of a kernel, cached in g_room. A kernel the device cannot run
 * as compiled (a build without sm_90 code: the PTX of older architectures
 * only traps), or whose attributes or occupancy it refuses (a cluster size
 * the part does not take), has none: the family declines, and the next one
 * runs the problem. */
int cluster_room(int device, const prnn_problem_t *pb, int k_tiles, const void *fn, int ctas, int smem) {
  int *known = &g_room[device][pb->cell == PRNN_CELL_LSTM][pb->dtype == PRNN_DTYPE_BFLOAT16][k_tiles - 1][ctas];
  int room = __atomic_load_n(known, __ATOMIC_ACQUIRE);
  if (room != 0) return room;
  cudaFuncAttributes fa;
  cudaError_t err = cudaFuncGetAttributes(&fa, fn);
  if (err == cudaSuccess && (fa.binaryVersion < 90 || fa.ptxVersion < 90)) err = cudaErrorNoKernelImageForDevice;
  if (err == cudaSuccess) err = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err == cudaSuccess) err = cudaFuncSetAttribute(fn, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  int clusters = 0;
  if (err == cudaSuccess) {
    cudaLaunchAttribute attr;
    const cudaLaunchConfig_t cfg = cluster_launch_config(ctas, ctas, smem, 0, &attr);
    err = cudaOccupancyMaxActiveClusters(&clusters, fn, &cfg);
  }
  if (err != cudaSuccess) (void)cudaGetLastError(); /* a refusal, not a sticky error: clear it */
  room = err == cudaSuccess && clusters >= 1 ? clusters : -1;
  __atomic_store_n(known, room, __ATOMIC_RELEASE);
  return room;
}

}  // namespace

void choose_gated_cluster(const prnn_problem_t *pb, bool backward, int device, bool clusters,
                          GatedClusterLaunch *l) {
  memset(l, 0, sizeof *l);
  const bool half = pb->dtype == PRNN_DTYPE_BFLOAT16 || pb->dtype == PRNN_DTYPE_FLOAT16;
  if (!clusters || backward || !half || pb->proj_size > 0 || pb->hidden > 128 * kMaxKTiles || device < 0 ||
      device >= kMaxDevices || prnn_cluster_tier_disabled())
    return;
  const int H = (int)pb->hidden, k_tiles = (H + 127) / 128, units = 8 * k_tiles;
  /* at least two CTAs: compute-sanitizer refuses st.async within a cluster of one */
  const int ctas = (H + units - 1) / units < 2 ? 2 : (H + units - 1) / units;
  const void *fn = NULL;
  int smem = 0;
  if (pb->cell == PRNN_CELL_LSTM) kernel_of_cell<LstmCell>(pb->dtype, k_tiles, &fn, &smem);
  else kernel_of_cell<GruCell>(pb->dtype, k_tiles, &fn, &smem);
  const int room = cluster_room(device, pb, k_tiles, fn, ctas, smem);
  /* groups as small as the room allows: a step's exchange carries only a group's sequences */
  const int64_t most_groups = room < 1 ? 0 : room;
  if ((pb->batch + kSeqs - 1) / kSeqs > most_groups) return;
  const int group = (int)((pb->batch + most_groups - 1) / most_groups);
  l->kernel = fn;
  l->ctas = ctas;
  l->rows = prnn_cell_gates(pb->cell) * units;
  l->group_seqs = group;
  l->grid = ctas * (int)((pb->batch + group - 1) / group);
  l->smem_bytes = smem;
}

prnn_status_t launch_gated_cluster(const GatedClusterLaunch &l, GatedParams p, cudaStream_t stream) {
  p.group_seqs = l.group_seqs;
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t cfg = cluster_launch_config(l.grid, l.ctas, l.smem_bytes, stream, &attr);
  void *args[] = {&p};
  const cudaError_t err = cudaLaunchKernelExC(&cfg, l.kernel, args);
  if (err != cudaSuccess) return cuda_fail(err, "cudaLaunchKernelEx(gated cluster kernel)");
  return PRNN_STATUS_SUCCESS;
}

}  // namespace prnn
