/*
 * gated_mma.cuh - the step of the gated cells' tensor-core families
 * (gated_cluster.cu: one cluster per group, state exchanged through DSMEM;
 * gated_grid.cu: one cooperative grid, state exchanged through L2), 16-bit
 * W_hh in the register files as mma fragments: the on-chip layout, the
 * staging of a CTA's gate rows (forward) or unit columns (backward), the
 * products of a state buffer and the partial sums over the 8 warps.
 *
 * A CTA runs 8 warps; its A (rows of the recurrent matrix it owns) is split
 * along K as the Elman cluster kernel (cluster.cuh) splits it: warp w holds
 * the fragments of every m-tile for k-tiles [w KT, w KT + KT). A step's
 * state is up to 8 sequences (mma n = 8), as 16-bit rows of a shared buffer.
 */
#ifndef PRNN_GATED_MMA_CUH
#define PRNN_GATED_MMA_CUH

#include "dsmem.cuh" /* the 16-bit bit patterns */
#include "gated_unit.cuh"
#include "mma.cuh"
#include "staging.cuh"

namespace prnn {

const int kMmaThreads = 256;
const int kMmaWarps = kMmaThreads / 32;
const int kMmaSeqs = 8; /* sequences a group carries: mma n = 8, a warp's epilogue each */

/* A pass's on-chip layout: ROWS live rows of A (zero-padded to m-tiles of
 * 16), KTILES k-tiles a warp, SLICE 16-bit values a sequence a CTA sends,
 * PARTIALS buffers of partial sums (two: a step's may be written while the
 * previous step's are still read). */
template <int ROWS, int KTILES, int SLICE, int PARTIALS = 1>
struct MmaShape {
  static const int kRows = ROWS;
  static const int kMTiles = (ROWS + 15) / 16;
  static const int kKTiles = KTILES;
  static const int kKExtent = kMmaWarps * KTILES * 16;              /* columns of A a CTA covers */
  static const int kStatePitch = kKExtent + 8;                      /* 16-bit [8][K + 8]: ldmatrix free of conflicts */
  static const int kPartialPitch = 16 * kMTiles + 4;                /* fp32: the C fragments' stores hit 32 banks */
  static const int kPartialFloats = kMmaWarps * kMmaSeqs * kPartialPitch; /* one buffer of partial sums */
  static const int kPartialBuffers = PARTIALS;
  static const int kSlice = SLICE;
  static const int kSlicePitch = SLICE + 8;                         /* 16-bit [8][SLICE + 8]: rows 16-byte aligned */
  static const int kBarBytes = 2 * kMmaWarps * 8;                   /* mbarriers [2 buffers][8 warps] (clusters) */
  static const int kStepBytes = 2 * kMmaSeqs * kStatePitch * 2 + PARTIALS * kPartialFloats * 4 +
                                kMmaSeqs * kSlicePitch * 2;
  static const int kStageBytes = 16 * kMTiles * kStatePitch * 2;    /* A staged [16 MT][K + 8] for ldmatrix */
  static const int kSmemBytes = kBarBytes + (kStepBytes > kStageBytes ? kStepBytes : kStageBytes);
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
/* The shared memory of a pass: barriers, two state buffers, the partial sums, the slice. */
template <class S>
struct MmaSmem {
  uint64_t *bars;
  unsigned char *space;    /* the step's buffers, or A staged before the steps */
  unsigned short *state;   /* [2][kMmaSeqs][kStatePitch] */
  float *partial;          /* [kMmaWarps][kMmaSeqs][kPartialPitch], the first of kPartialBuffers */
  unsigned short *slice;   /* [kMmaSeqs][kSlicePitch] */
  __device__ __forceinline__ explicit MmaSmem(unsigned char *smem)
      : bars(reinterpret_cast<uint64_t *>(smem)),
        space(smem + S::kBarBytes),
        state(reinterpret_cast<unsigned short *>(space)),
        partial(reinterpret_cast<float *>(space + 2 * kMmaSeqs * S::kStatePitch * 2)),
        slice(reinterpret_cast<unsigned short *>(partial + S::kPartialBuffers * S::kPartialFloats)) {}
  /* The same layout with partial sums buffer `buffer` as the one the step's pieces use. */
  __device__ __forceinline__ MmaSmem with_partials(int buffer) const {
    MmaSmem s = *this;
    s.partial += buffer * S::kPartialFloats;
    return s;
  }
};

/* A fragments from A staged in shared memory as [16 MT][kStatePitch]:
 * a[m][kt] = rows 16m + {g, g+8}, k = 16 (warp KT + kt) + {2q, 2q+8} (+1). */
template <class S>
__device__ __forceinline__ void load_fragments(const unsigned short *stage, int warp, int lane,
                                               uint32_t (&a)[S::kMTiles][S::kKTiles][4]) {
  const uint32_t stage_base = (uint32_t)__cvta_generic_to_shared(stage);
#pragma unroll
  for (int m = 0; m < S::kMTiles; ++m)
#pragma unroll
    for (int kt = 0; kt < S::kKTiles; ++kt) {
      const int r = 16 * m + (lane & 15), k = (warp * S::kKTiles + kt) * 16 + 8 * (lane >> 4);
      ldmatrix_x4(stage_base + (uint32_t)((r * S::kStatePitch + k) * 2), a[m][kt][0], a[m][kt][1], a[m][kt][2],
                  a[m][kt][3]);
    }
}

/* The fragments of a forward's A: the G gate rows of units [u0, u0 + U),
 * local row g U + ul = W_hh row g H + u0 + ul (zero past H), staged through
 * `stage` as 16-byte chunks along k (one 16-byte load each where W_hh's rows
 * are 16-byte aligned and H a multiple of 8). Ends with the staging area free. */
template <class S, typename E, int U>
__device__ __forceinline__ void load_gate_rows(const GatedParams &p, int u0, unsigned short *stage, int tid,
                                               uint32_t (&a)[S::kMTiles][S::kKTiles][4]) {
  const int H = p.hidden, KEXT = S::kKExtent, CHUNKS = 16 * S::kMTiles * (KEXT / 8);
  const unsigned short *w_hh = static_cast<const unsigned short *>(p.w_hh);
  const bool wide = p.w_hh_stride % 8 == 0 && (reinterpret_cast<uintptr_t>(w_hh) & 15) == 0 && H % 8 == 0;
  auto row_of = [&](int c) { /* W_hh's row of chunk c, or -1 (a zero chunk) */
    const int r = c / (KEXT / 8), ul = r % U;
    return r < S::kRows && u0 + ul < H ? r / U * H + u0 + ul : -1;
  };
  auto store = [&](int c, uint4 v) {
    *reinterpret_cast<uint4 *>(stage + c / (KEXT / 8) * S::kStatePitch + c % (KEXT / 8) * 8) = v;
  };
  if (wide) {
    batched_copy<kMmaThreads, 8>(CHUNKS, tid, [&](int c) {
      const int row = row_of(c), k = c % (KEXT / 8) * 8;
      return masked_load(reinterpret_cast<const uint4 *>(w_hh), ((int64_t)row * p.w_hh_stride + k) / 8,
                         c < CHUNKS && row >= 0 && k < H);
    }, store);
  } else {
    batched_copy<kMmaThreads, 2>(CHUNKS, tid, [&](int c) {
      const int row = row_of(c), k = c % (KEXT / 8) * 8;
      const bool live = c < CHUNKS && row >= 0;
      uint32_t w[4];
#pragma unroll
      for (int j = 0; j < 8; j += 2)
        w[j / 2] = masked_load(w_hh, (int64_t)row * p.w_hh_stride + k + j, live && k + j < H) |
                   (uint32_t)masked_load(w_hh, (int64_t)row * p.w_hh_stride + k + j + 1, live && k + j + 1 < H) << 16;
      return make_uint4(w[0], w[1], w[2], w[3]);
    }, store);
  }
  __syncthreads();
  load_fragments<S>(stage, tid >> 5, tid & 31, a);
  __syncthreads();
}

/* The fragments of a backward's A: the columns of W_hh of units
 * [u0, u0 + U) transposed, staged as [unit][g Hp + v] = W_hh[g H + v][u0 +
 * unit] (zero elsewhere), so that K is the gate gradients of every unit in G
 * blocks of Hp columns. Ends with the staging area free. */
template <class S, class Cell, typename E, int U>
__device__ __forceinline__ void load_unit_columns(const GatedParams &p, int u0, int Hp, unsigned short *stage,
                                                  int tid, uint32_t (&a)[S::kMTiles][S::kKTiles][4]) {
  const int G = Cell::kGates, H = p.hidden, SPITCH = S::kStatePitch;
  for (int i = tid; i < 16 * S::kMTiles * SPITCH / 8; i += kMmaThreads)
    reinterpret_cast<uint4 *>(stage)[i] = make_uint4(0, 0, 0, 0);
  __syncthreads();
  const unsigned short *w_hh = static_cast<const unsigned short *>(p.w_hh);
  const int units = min(U, max(H - u0, 0)), n = G * H * units;
  batched_copy<kMmaThreads, 8>(n, tid, [&](int i) {
    return masked_load(w_hh, (int64_t)(i / units) * p.w_hh_stride + u0 + i % units, i < n);
  }, [&](int i, unsigned short v) {
    const int row = i / units, ul = i % units;
    stage[ul * SPITCH + row / H * Hp + row % H] = v;
  });
  __syncthreads();
  load_fragments<S>(stage, tid >> 5, tid & 31, a);
  __syncthreads();
}

/* h_{-1} = h0 of the `live` sequences from seq0 into the state buffer (zero
 * before: its padding columns stay zero). */
template <class S, typename E>
__device__ __forceinline__ void load_initial_state(const GatedParams &p, unsigned short *state, int seq0, int live,
                                                   int tid) {
  const unsigned short *h0 = static_cast<const unsigned short *>(p.h0);
  const int H = p.hidden, n = live * H;
  batched_copy<kMmaThreads, 8>(n, tid, [&](int i) {
    return masked_load(h0, (int64_t)(seq0 + i / H) * p.h0_stride_b + i % H, i < n);
  }, [&](int i, unsigned short v) { state[i / H * S::kStatePitch + i % H] = v; });
}

/* A times the state buffer `buffer` (8 sequences) over this warp's K slice,
 * then the C fragments (rows 16m + {g, g+8}, sequences 2q, 2q+1) into the
 * warp's partial sums [sequence][row]. k-tile kt accumulates into chain
 * kt % CHAINS of its m-tile, summed at the end: with few m-tiles and many
 * k-tiles, more chains shorten the dependent run of mma. */
template <class S, typename E, int CHAINS = 1>
__device__ __forceinline__ void products_to_partials(const uint32_t (&a)[S::kMTiles][S::kKTiles][4],
                                                     const MmaSmem<S> &sm, int buffer, int warp, int lane) {
  const int MT = S::kMTiles, KT = S::kKTiles, SPITCH = S::kStatePitch, PPITCH = S::kPartialPitch;
  const uint32_t state_base = (uint32_t)__cvta_generic_to_shared(sm.state);
  float acc[MT][CHAINS][4];
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int c = 0; c < CHAINS; ++c) acc[m][c][0] = acc[m][c][1] = acc[m][c][2] = acc[m][c][3] = 0.f;
#pragma unroll
  for (int kt = 0; kt < KT; kt += 2) {
    const int k0 = (warp * KT + kt) * 16;
    const uint32_t b_addr = state_base + (uint32_t)(((buffer * kMmaSeqs + (lane & 7)) * SPITCH + k0 + 8 * (lane >> 3)) * 2);
    uint32_t b0, b1, b2, b3;
    if (kt + 1 < KT) {
      ldmatrix_x4(b_addr, b0, b1, b2, b3);
#pragma unroll
      for (int m = 0; m < MT; ++m) MmaOp<E>::run(acc[m][kt % CHAINS], a[m][kt], b0, b1);
#pragma unroll
      for (int m = 0; m < MT; ++m) MmaOp<E>::run(acc[m][(kt + 1) % CHAINS], a[m][kt + 1], b2, b3);
    } else {
      ldmatrix_x2(b_addr, b0, b1);
#pragma unroll
      for (int m = 0; m < MT; ++m) MmaOp<E>::run(acc[m][kt % CHAINS], a[m][kt], b0, b1);
    }
  }
  const int g8 = lane >> 2, q = lane & 3;
#pragma unroll
  for (int m = 0; m < MT; ++m) {
#pragma unroll
    for (int c = 1; c < CHAINS; ++c)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[m][0][i] += acc[m][c][i];
    float *part = sm.partial + (warp * kMmaSeqs + 2 * q) * PPITCH + 16 * m + g8;
    part[0] = acc[m][0][0];
    part[PPITCH] = acc[m][0][1];
    part[8] = acc[m][0][2];
    part[PPITCH + 8] = acc[m][0][3];
  }
}

/* Row r of sequence n summed over the 8 warps' partial sums, as a tree. */
template <class S>
__device__ __forceinline__ float sum_partials(const MmaSmem<S> &sm, int n, int r) {
  const float *part = sm.partial + n * S::kPartialPitch + r;
  const int stride = kMmaSeqs * S::kPartialPitch;
  float s4[4];
#pragma unroll
  for (int w = 0; w < 4; ++w) s4[w] = part[w * stride] + part[(w + 4) * stride];
  return (s4[0] + s4[1]) + (s4[2] + s4[3]);
}

/* The gate sums of unit ul of sequence n: row g U + ul of the partial sums
 * for each gate g. */
template <class Cell, class S, int U>
__device__ __forceinline__ void unit_gate_sums(const MmaSmem<S> &sm, int n, int ul, float (&mat)[Cell::kGates]) {
#pragma unroll
  for (int g = 0; g < Cell::kGates; ++g) mat[g] = sum_partials<S>(sm, n, g * U + ul);
}

/* The same on both halves of a warp whose lanes 0-15 own the units (U =
 * 16): lane ul sums the even gates and lane ul + 16 the odd ones (rows 16
 * apart: other banks), and they swap, so that a lane's chain of shared loads
 * is half as long; the sums are unit_gate_sums' (the same bits). Every lane
 * of the warp calls it. */
template <class Cell, class S, int U>
__device__ __forceinline__ void unit_gate_sums_paired(const MmaSmem<S> &sm, int n, int lane,
                                                      float (&mat)[Cell::kGates]) {
  static_assert(U == 16, "a unit on lanes ul and ul + 16");
  const int G = Cell::kGates, odd = lane >> 4, ul = lane & 15;
#pragma unroll
  for (int g = 0; g < G; g += 2) {
    const float own = g + 1 < G || odd == 0 ? sum_partials<S>(sm, n, (g + odd) * U + ul) : 0.f;
    const float other = __shfl_xor_sync(0xffffffffu, own, 16);
    mat[g] = odd ? other : own;
    if (g + 1 < G) mat[g + 1] = odd ? own : other;
  }
}

#endif

}  // namespace prnn

#endif /* PRNN_GATED_MMA_CUH */
