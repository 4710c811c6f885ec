/*
 * gated.cu - the gated cells (LSTM, GRU) on CUDA: the planner, an ordered
 * list of families each asked whether it takes a problem (gated_family.cuh:
 * the cluster family, gated_cluster.cu; the grid family, gated_grid.cu; then
 * the two here), and two families templated on the cell policy (cells.cuh):
 *
 *   persistent: one cooperative launch runs every step. CTA c owns U hidden
 *     units and keeps the W_hh rows of all their gates (forward) or the
 *     W_hh columns of those units (backward, A = W_hh^T) in shared memory for
 *     the whole sequence; the cell update of a unit is local to its CTA, and
 *     so are c and the backward's carried gradients. Each step: stage the
 *     exchanged state (h_{t-1}, or the gate gradients of t+1) from L2, a warp
 *     per row multiplies, the unit threads apply the cell and publish, then
 *     one grid-wide barrier. float32 / bfloat16 / float16, no projection.
 *   stepwise: a few launches per step (matrix-vector products and the cell),
 *     the weights re-read from L2 each step: float64, proj_size, and sizes
 *     whose rows do not fit in shared memory.
 *
 * Both keep c and the exchanged state in float32 (float64 for float64) and
 * round h to the element type each step, as a per-step nn.LSTM does.
 */
#include <cooperative_groups.h>
#include <string.h>

#include "cells.cuh"
#include "cuda_status.cuh"
#include "gated.cuh"
#include "gated_family.cuh"
#include "gated_unit.cuh"
#include "prnn_internal.h"

namespace cg = cooperative_groups;

namespace prnn {
namespace {

const int kThreads = 256;
const int kVec = 4;             /* elements a lane reads at once in the persistent products */
const int kKAlign = 32 * kVec;  /* a row's K extent in shared memory is padded to this */
const int kSeqGroup = 4;        /* sequences a warp multiplies per pass over a row */
const int kMaxBatchTile = 16;   /* sequences staged at once by the persistent family */
const size_t kAlign = 256;

__host__ __device__ inline size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

/* ----------------------------------------------------------- persistent */

/* kVec elements of a shared-memory row as floats (aligned: k % kVec == 0). */
__device__ __forceinline__ void load_vec(const float *w, float (&v)[kVec]) {
  const float4 q = *reinterpret_cast<const float4 *>(w);
  v[0] = q.x; v[1] = q.y; v[2] = q.z; v[3] = q.w;
}
template <typename E>
__device__ __forceinline__ void load_vec(const E *w, float (&v)[kVec]) {
  const uint2 q = *reinterpret_cast<const uint2 *>(w);
  const E *e = reinterpret_cast<const E *>(&q);
#pragma unroll
  for (int i = 0; i < kVec; ++i) v[i] = to_accum(e[i]);
}

/* sums[r * tile + bl] = w[r] . hs[bl] for the rows r < rows of this CTA's
 * units (r % U < units) and the nb staged sequences: a warp per row. */
template <typename E>
__device__ void block_products(const E *w, int rows, int U, int units, int Kp, const float *hs, int nb,
                               float *sums, int tile) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  for (int r = warp; r < rows; r += nwarps) {
    if (r % U >= units) continue;
    const E *wr = w + (size_t)r * Kp;
    for (int bq = 0; bq < nb; bq += kSeqGroup) {
      float acc[kSeqGroup];
#pragma unroll
      for (int j = 0; j < kSeqGroup; ++j) acc[j] = 0.f;
      for (int k = lane * kVec; k < Kp; k += 32 * kVec) {
        float wv[kVec];
        load_vec(wr + k, wv);
#pragma unroll
        for (int j = 0; j < kSeqGroup; ++j) {
          if (bq + j < nb) {
            const float4 h = *reinterpret_cast<const float4 *>(hs + (size_t)(bq + j) * Kp + k);
            acc[j] = fmaf(wv[3], h.w, fmaf(wv[2], h.z, fmaf(wv[1], h.y, fmaf(wv[0], h.x, acc[j]))));
          }
        }
      }
#pragma unroll
      for (int j = 0; j < kSeqGroup; ++j) {
#pragma unroll
        for (int off = 16; off >= 1; off >>= 1) acc[j] += __shfl_xor_sync(0xffffffffu, acc[j], off);
        if (lane == 0 && bq + j < nb) sums[r * tile + bq + j] = acc[j];
      }
    }
  }
}

/* Shared memory of the persistent kernels: the on-chip matrix, then floats. */
__host__ __device__ inline size_t matrix_bytes(int rows, int Kp, size_t elem) { return align_up((size_t)rows * Kp * elem, 16); }

/* dst[0 .. n) = src[0 .. n) for n floats (a multiple of 4) from L2, never a
 * stale L1 line: kStageDepth 16-byte loads a thread in flight before any store. */
const int kStageDepth = 8;
__device__ __forceinline__ void stage_from_l2(const float *src, float *dst, int n) {
  const float4 *s4 = reinterpret_cast<const float4 *>(src);
  float4 *d4 = reinterpret_cast<float4 *>(dst);
  const int n4 = n / 4, stride = blockDim.x;
  for (int base = threadIdx.x; base < n4; base += stride * kStageDepth) {
    float4 v[kStageDepth];
#pragma unroll
    for (int j = 0; j < kStageDepth; ++j)
      if (base + j * stride < n4) v[j] = __ldcg(s4 + base + j * stride);
#pragma unroll
    for (int j = 0; j < kStageDepth; ++j)
      if (base + j * stride < n4) d4[base + j * stride] = v[j];
  }
}

/* Exchange buffers: 2 x batch rows of Kp floats, by step parity; the columns
 * past K are zeroed before launch and never written. A thread of a CTA's
 * pointwise work owns unit ul of staged sequence bl (tid < units * tile). */

template <class Cell, typename E>
__global__ void __launch_bounds__(kThreads, 1) gated_forward_persistent(const GatedParams p) {
  const int G = Cell::kGates;
  cg::grid_group grid = cg::this_grid();
  const int tid = threadIdx.x, nthreads = blockDim.x;
  const int T = p.steps, B = p.batch, H = p.hidden, K = p.state, Kp = p.persistent.k_padded;
  const int U = p.persistent.units_per_cta, tile = p.persistent.batch_tile, R = G * U;
  const int u0 = blockIdx.x * U, units = min(U, H - u0);
  extern __shared__ __align__(16) unsigned char smem[];
  E *w = reinterpret_cast<E *>(smem);  /* R x Kp: local row g*U + ul is W_hh row g*H + u0 + ul */
  float *hs = reinterpret_cast<float *>(smem + matrix_bytes(R, Kp, sizeof(E)));  /* tile x Kp: h_{t-1} */
  float *sums = hs + (size_t)tile * Kp;  /* R x tile: W_hh h_{t-1} */
  float *cell = sums + (size_t)R * tile; /* U x B: c of the CTA's units (LSTM) */
  const E *w_hh = static_cast<const E *>(p.w_hh), *h0 = static_cast<const E *>(p.h0);
  E *y = static_cast<E *>(p.y);

  for (int idx = tid; idx < R * Kp; idx += nthreads) {
    const int r = idx / Kp, k = idx % Kp, g = r / U, ul = r % U;
    w[idx] = (ul < units && k < K) ? w_hh[(int64_t)(g * H + u0 + ul) * p.w_hh_stride + k] : Round<E>::to(0.f);
  }
  if (Cell::kCarriesCell)
    for (int idx = tid; idx < units * B; idx += nthreads) {
      const int ul = idx % units, b = idx / units;
      cell[ul * B + b] = to_accum(static_cast<const E *>(p.c0)[b * p.c0_stride_b + u0 + ul]);
    }
  __syncthreads();

  const int ul = tid % units, bl = tid / units, u = u0 + ul;
  for (int t = 0; t < T; ++t) {
    const float *prev = p.persistent.xchg + (size_t)((t + 1) & 1) * B * Kp;
    float *next = p.persistent.xchg + (size_t)(t & 1) * B * Kp;
    for (int b0 = 0; b0 < B; b0 += tile) {
      const int nb = min(tile, B - b0), b = b0 + bl;
      const bool mine = tid < units * nb;
      UnitInputs<Cell, float> in;
      if (mine) load_unit_inputs<Cell, E, float>(p, t, b, u, &in);
      if (t == 0) {
        for (int idx = tid; idx < nb * Kp; idx += nthreads) {
          const int sl = idx / Kp, k = idx % Kp;
          hs[idx] = k < K ? to_accum(h0[(b0 + sl) * p.h0_stride_b + k]) : 0.f;
        }
      } else {
        stage_from_l2(prev + (size_t)b0 * Kp, hs, nb * Kp);
      }
      __syncthreads();
      block_products(w, R, U, units, Kp, hs, nb, sums, tile);
      __syncthreads();
      if (mine) {
        float mat[G];
#pragma unroll
        for (int g = 0; g < G; ++g) mat[g] = sums[(g * U + ul) * tile + bl];
        const float own = hs[bl * Kp + u]; /* h_{t-1} of this unit */
        const float prev_carry = Cell::kCarriesCell ? cell[ul * B + b] : own;
        float out, carry, state = own;     /* past the length the state stays */
        const size_t o = ((size_t)t * B + b) * K + u;
        if (forward_unit<Cell, E, float>(p, t, b, u, in, mat, prev_carry, &out, &carry)) {
          const E oe = Round<E>::to(out);
          y[o] = oe;
          state = to_accum(oe);
          if (Cell::kCarriesCell) cell[ul * B + b] = carry;
        } else {
          y[o] = Round<E>::to(0.f);
        }
        next[(size_t)b * Kp + u] = state;
        if (t == T - 1) {
          static_cast<E *>(p.h_n)[(size_t)b * K + u] = Round<E>::to(state);
          if (Cell::kCarriesCell) static_cast<E *>(p.c_n)[(size_t)b * H + u] = Round<E>::to(cell[ul * B + b]);
        }
      }
      __syncthreads();
    }
    grid.sync();
  }
}

template <class Cell, typename E>
__global__ void __launch_bounds__(kThreads, 1) gated_backward_persistent(const GatedParams p) {
  const int G = Cell::kGates;
  cg::grid_group grid = cg::this_grid();
  const int tid = threadIdx.x, nthreads = blockDim.x;
  const int T = p.steps, B = p.batch, H = p.hidden, K = G * H, Kp = p.persistent.k_padded;
  const int U = p.persistent.units_per_cta, tile = p.persistent.batch_tile;
  const int u0 = blockIdx.x * U, units = min(U, H - u0);
  extern __shared__ __align__(16) unsigned char smem[];
  E *w = reinterpret_cast<E *>(smem);  /* U x Kp: local row ul is column u0 + ul of W_hh */
  float *ds = reinterpret_cast<float *>(smem + matrix_bytes(U, Kp, sizeof(E))); /* tile x Kp: hh grads of t+1 */
  float *sums = ds + (size_t)tile * Kp;   /* U x tile: W_hh^T (hh grads of t+1) */
  float *carry_h = sums + (size_t)U * tile; /* U x B: dLoss/dh_t from later steps */
  float *carry_c = carry_h + (size_t)U * B; /* U x B: dLoss/dc_t from later steps (LSTM) */
  float *direct = carry_c + (size_t)U * B;  /* U x B: the part of dLoss/dh_{t-1} bypassing W_hh (GRU) */
  const E *w_hh = static_cast<const E *>(p.w_hh), *grad_y = static_cast<const E *>(p.grad_y);
  const E *grad_h_n = static_cast<const E *>(p.grad_h_n), *grad_c_n = static_cast<const E *>(p.grad_c_n);

  /* consecutive threads read consecutive columns of one row */
  for (int idx = tid; idx < U * Kp; idx += nthreads) {
    const int ul = idx % U, k = idx / U;
    w[ul * Kp + k] = (ul < units && k < K) ? w_hh[(int64_t)k * p.w_hh_stride + u0 + ul] : Round<E>::to(0.f);
  }
  for (int idx = tid; idx < units * B; idx += nthreads) {
    const int ul = idx % units, b = idx / units, u = u0 + ul;
    carry_h[ul * B + b] = grad_h_n != NULL ? to_accum(grad_h_n[b * p.grad_h_n_stride_b + u]) : 0.f;
    carry_c[ul * B + b] = grad_c_n != NULL ? to_accum(grad_c_n[b * p.grad_c_n_stride_b + u]) : 0.f;
    direct[ul * B + b] = 0.f;
  }
  __syncthreads();

  const int ul = tid % units, bl = tid / units, u = u0 + ul;
  /* s = T runs t = -1: the products with step 0's gradients give grad_h0 */
  for (int s = 0; s <= T; ++s) {
    const int t = T - 1 - s;
    const float *prev = p.persistent.xchg + (size_t)((s + 1) & 1) * B * Kp;
    float *next = p.persistent.xchg + (size_t)(s & 1) * B * Kp;
    for (int b0 = 0; b0 < B; b0 += tile) {
      const int nb = min(tile, B - b0), b = b0 + bl, c = ul * B + b;
      const bool mine = tid < units * nb;
      const int len = mine ? sequence_length(p.lengths, b, T) : 0;
      const bool active = mine && t >= 0 && t < len;
      UnitSaved<Cell, float> in;
      float dy = 0.f;
      if (active) {
        load_unit_saved<Cell, E, float>(p, t, b, u, &in);
        dy = to_accum(grad_y[t * p.grad_y_stride_t + b * p.grad_y_stride_b + u]);
      }
      if (s > 0) {
        stage_from_l2(prev + (size_t)b0 * Kp, ds, nb * Kp);
        __syncthreads();
        block_products(w, U, U, units, Kp, ds, nb, sums, tile);
        __syncthreads();
      }
      if (mine) {
        float ch = carry_h[c];
        if (s > 0 && t + 1 < len) ch = sums[ul * tile + bl] + direct[c];
        carry_h[c] = ch;
        if (t < 0) {
          static_cast<E *>(p.grad_h0)[(size_t)b * H + u] = Round<E>::to(ch);
          if (Cell::kCarriesCell) static_cast<E *>(p.grad_c0)[(size_t)b * H + u] = Round<E>::to(carry_c[c]);
        } else {
          float *dst = next + (size_t)b * Kp + u;
          if (active) {
            float dhh[G];
            backward_unit<Cell, E, float>(p, t, b, u, in, dy + ch, &carry_c[c], &direct[c], dhh);
#pragma unroll
            for (int g = 0; g < G; ++g) dst[(size_t)g * H] = dhh[g];
          } else {
            zero_unit_grads<Cell, E>(p, t, b, u);
            for (int g = 0; g < G; ++g) dst[(size_t)g * H] = 0.f;
          }
        }
      }
      __syncthreads();
    }
    if (s < T) grid.sync();
  }
}

/* ------------------------------------------------------------- stepwise */

/* out[b * ldo + r] = sum_k A[r][k] x[b * ldx + k], r < rows: a warp per row. */
template <typename E, typename A>
__global__ void matvec_kernel(const E *a, int64_t lda, int rows, int K, const A *x, int64_t ldx, int B, A *out,
                              int64_t ldo) {
  const int lane = threadIdx.x & 31;
  const int r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (r >= rows) return;
  const E *ar = a + (int64_t)r * lda;
  for (int b0 = 0; b0 < B; b0 += kSeqGroup) {
    A acc[kSeqGroup];
#pragma unroll
    for (int j = 0; j < kSeqGroup; ++j) acc[j] = A(0);
    for (int k = lane; k < K; k += 32) {
      const A wv = to_accum(ar[k]);
#pragma unroll
      for (int j = 0; j < kSeqGroup; ++j)
        if (b0 + j < B) acc[j] += wv * x[(int64_t)(b0 + j) * ldx + k];
    }
#pragma unroll
    for (int j = 0; j < kSeqGroup; ++j) {
#pragma unroll
      for (int off = 16; off >= 1; off >>= 1) acc[j] += __shfl_xor_sync(0xffffffffu, acc[j], off);
      if (lane == 0 && b0 + j < B) out[(int64_t)(b0 + j) * ldo + r] = acc[j];
    }
  }
}

/* dst[j * rows + i] = src[i][j]: a contiguous transpose, so that the backward's rows read coalesced. */
template <typename E>
__global__ void transpose_kernel(const E *src, int64_t ld, int rows, int cols, E *dst) {
  const int64_t total = (int64_t)rows * cols;
  for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < total;
       idx += (int64_t)gridDim.x * blockDim.x) {
    const int64_t j = idx / rows, i = idx % rows;
    dst[idx] = src[i * ld + j];
  }
}

/* The stepwise family's workspace, in its order. */
template <typename E, typename A>
struct StepwiseBuffers {
  A *state[2]; /* forward: batch x S, h_{t-1} / h_t by step parity (state_of) */
  A *gates;    /* forward: batch x G*H, W_hh h_{t-1} */
  A *cell;     /* forward: batch x H, c (LSTM) */
  A *m;        /* forward with proj: batch x H, o tanh(c_t) */
  A *hproj;    /* forward with proj: batch x S, W_hr m_t */
  E *w_hh_t;   /* backward: S x G*H, W_hh^T */
  E *w_hr_t;   /* backward with proj: H x S, W_hr^T */
  A *dgh;      /* backward: batch x G*H, hh-side gate gradients of the last step run */
  A *mh;       /* backward: batch x S, W_hh^T dgh */
  A *carry_h;  /* backward: batch x S */
  A *dh;       /* backward: batch x S, dLoss/dh_t */
  A *dm;       /* backward with proj: batch x H, W_hr^T dh */
  A *carry_c;  /* backward: batch x H (LSTM) */
  A *direct;   /* backward: batch x H (GRU) */
};

/* buf.state[i & 1], chosen without a run-time index into the parameter (which would copy it to local memory). */
template <typename E, typename A>
__device__ __forceinline__ A *state_of(const StepwiseBuffers<E, A> &buf, int i) {
  return (i & 1) ? buf.state[1] : buf.state[0];
}

/* Lays the buffers out from `base` (NULL: only sizes); returns the bytes. */
template <typename E, typename A>
size_t stepwise_layout(const prnn_problem_t *pb, int gates, bool backward, char *base, StepwiseBuffers<E, A> *buf) {
  const size_t B = (size_t)pb->batch, H = (size_t)pb->hidden, P = (size_t)pb->proj_size, S = P > 0 ? P : H;
  const size_t GH = (size_t)gates * H;
  size_t off = 0;
  auto take = [&](size_t count, size_t elem) -> char * {
    char *ptr = base != NULL ? base + off : NULL;
    off += align_up(count * elem, kAlign);
    return ptr;
  };
  memset(buf, 0, sizeof *buf);
  if (!backward) {
    buf->state[0] = (A *)take(B * S, sizeof(A));
    buf->state[1] = (A *)take(B * S, sizeof(A));
    buf->gates = (A *)take(B * GH, sizeof(A));
    buf->cell = (A *)take(B * H, sizeof(A));
    if (P > 0) {
      buf->m = (A *)take(B * H, sizeof(A));
      buf->hproj = (A *)take(B * S, sizeof(A));
    }
  } else {
    buf->w_hh_t = (E *)take(S * GH, sizeof(E));
    if (P > 0) buf->w_hr_t = (E *)take(H * S, sizeof(E));
    buf->dgh = (A *)take(B * GH, sizeof(A));
    buf->mh = (A *)take(B * S, sizeof(A));
    buf->carry_h = (A *)take(B * S, sizeof(A));
    buf->dh = (A *)take(B * S, sizeof(A));
    if (P > 0) buf->dm = (A *)take(B * H, sizeof(A));
    buf->carry_c = (A *)take(B * H, sizeof(A));
    buf->direct = (A *)take(B * H, sizeof(A));
  }
  return off;
}

/* Forward: the initial state into the buffers. */
template <typename E, typename A>
__global__ void forward_init_kernel(const GatedParams p, A *state, A *cell) {
  const int64_t total = (int64_t)p.batch * (p.state > p.hidden ? p.state : p.hidden);
  for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < total;
       idx += (int64_t)gridDim.x * blockDim.x) {
    const int b = (int)(idx / (total / p.batch)), j = (int)(idx % (total / p.batch));
    if (j < p.state) state[(size_t)b * p.state + j] = to_accum(static_cast<const E *>(p.h0)[b * p.h0_stride_b + j]);
    if (j < p.hidden)
      cell[(size_t)b * p.hidden + j] =
          p.c0 != NULL ? A(to_accum(static_cast<const E *>(p.c0)[b * p.c0_stride_b + j])) : A(0);
  }
}

/* Forward, one step: the cell of every unit of every sequence. Without a
 * projection it writes y and the next state; with one, m_t for W_hr. */
template <class Cell, typename E, typename A>
__global__ void forward_cell_kernel(const GatedParams p, int t, StepwiseBuffers<E, A> buf) {
  const int G = Cell::kGates, H = p.hidden, S = p.state, B = p.batch;
  const int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= B * H) return;
  const int b = idx / H, u = idx % H;
  const A *prev_state = state_of(buf, t + 1);
  A *next_state = state_of(buf, t);
  A mat[G];
#pragma unroll
  for (int g = 0; g < G; ++g) mat[g] = buf.gates[(size_t)b * G * H + (size_t)g * H + u];
  const bool proj = buf.m != NULL;
  const A own = proj ? A(0) : prev_state[(size_t)b * S + u];
  A *cell = &buf.cell[(size_t)b * H + u];
  UnitInputs<Cell, A> in;
  load_unit_inputs<Cell, E, A>(p, t, b, u, &in);
  A out, carry;
  const bool active = forward_unit<Cell, E, A>(p, t, b, u, in, mat, Cell::kCarriesCell ? *cell : own, &out, &carry);
  if (active && Cell::kCarriesCell) *cell = carry;
  if (proj) {
    buf.m[(size_t)b * H + u] = active ? out : A(0);
  } else {
    const E oe = Round<E>::to(active ? out : A(0));
    static_cast<E *>(p.y)[((size_t)t * B + b) * S + u] = oe;
    const A state = active ? A(to_accum(oe)) : own;
    next_state[(size_t)b * S + u] = state;
    if (t == p.steps - 1) static_cast<E *>(p.h_n)[(size_t)b * S + u] = Round<E>::to(state);
  }
  if (Cell::kCarriesCell && t == p.steps - 1) static_cast<E *>(p.c_n)[(size_t)b * H + u] = Round<E>::to(*cell);
}

/* Forward with a projection, one step: h_t = W_hr m_t into y and the state. */
template <typename E, typename A>
__global__ void forward_project_kernel(const GatedParams p, int t, StepwiseBuffers<E, A> buf) {
  const int S = p.state, B = p.batch;
  const int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= B * S) return;
  const int b = idx / S, j = idx % S;
  const bool active = t < sequence_length(p.lengths, b, p.steps);
  const E oe = Round<E>::to(active ? buf.hproj[idx] : A(0));
  static_cast<E *>(p.y)[((size_t)t * B + b) * S + j] = oe;
  const A state = active ? A(to_accum(oe)) : state_of(buf, t + 1)[idx];
  state_of(buf, t)[idx] = state;
  if (t == p.steps - 1) static_cast<E *>(p.h_n)[idx] = Round<E>::to(state);
}

/* Backward: the carried gradients from grad_h_n and grad_c_n. */
template <typename E, typename A>
__global__ void backward_init_kernel(const GatedParams p, StepwiseBuffers<E, A> buf) {
  const int w = p.state > p.hidden ? p.state : p.hidden;
  const int64_t total = (int64_t)p.batch * w;
  const E *ghn = static_cast<const E *>(p.grad_h_n), *gcn = static_cast<const E *>(p.grad_c_n);
  for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < total;
       idx += (int64_t)gridDim.x * blockDim.x) {
    const int b = (int)(idx / w), j = (int)(idx % w);
    if (j < p.state)
      buf.carry_h[(size_t)b * p.state + j] = ghn != NULL ? A(to_accum(ghn[b * p.grad_h_n_stride_b + j])) : A(0);
    if (j < p.hidden) {
      buf.carry_c[(size_t)b * p.hidden + j] = gcn != NULL ? A(to_accum(gcn[b * p.grad_c_n_stride_b + j])) : A(0);
      buf.direct[(size_t)b * p.hidden + j] = A(0);
    }
  }
}

/* Backward, one step of the state's gradient: dh_t = grad_y_t + what later
 * steps send back (t = -1: grad_h0). `products`: whether mh holds W_hh^T dgh_{t+1}. */
template <typename E, typename A>
__global__ void backward_state_kernel(const GatedParams p, int t, int products, StepwiseBuffers<E, A> buf) {
  const int S = p.state, B = p.batch;
  const int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= B * S) return;
  const int b = idx / S, j = idx % S;
  const int len = sequence_length(p.lengths, b, p.steps);
  A ch = buf.carry_h[idx];
  if (products && t + 1 < len) ch = buf.mh[idx] + (buf.dm == NULL ? buf.direct[(size_t)b * p.hidden + j] : A(0));
  buf.carry_h[idx] = ch;
  if (t < 0) {
    static_cast<E *>(p.grad_h0)[idx] = Round<E>::to(ch);
    return;
  }
  const bool active = t < len;
  const A dh = active ? A(to_accum(static_cast<const E *>(p.grad_y)[t * p.grad_y_stride_t + b * p.grad_y_stride_b + j])) + ch
                      : A(0);
  buf.dh[idx] = dh;
  if (p.grad_h != NULL) static_cast<E *>(p.grad_h)[((size_t)t * B + b) * S + j] = Round<E>::to(dh);
}

/* Backward, one step of the cells (t = -1: grad_c0). */
template <class Cell, typename E, typename A>
__global__ void backward_cell_kernel(const GatedParams p, int t, StepwiseBuffers<E, A> buf) {
  const int G = Cell::kGates, H = p.hidden, B = p.batch;
  const int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= B * H) return;
  const int b = idx / H, u = idx % H;
  if (t < 0) {
    if (Cell::kCarriesCell) static_cast<E *>(p.grad_c0)[idx] = Round<E>::to(buf.carry_c[idx]);
    return;
  }
  A *dgh = buf.dgh + (size_t)b * G * H + u;
  if (t < sequence_length(p.lengths, b, p.steps)) {
    const A dh = buf.dm != NULL ? buf.dm[idx] : buf.dh[(size_t)b * p.state + u];
    UnitSaved<Cell, A> in;
    load_unit_saved<Cell, E, A>(p, t, b, u, &in);
    A dhh[G];
    backward_unit<Cell, E, A>(p, t, b, u, in, dh, &buf.carry_c[idx], &buf.direct[idx], dhh);
#pragma unroll
    for (int g = 0; g < G; ++g) dgh[(size_t)g * H] = dhh[g];
  } else {
    zero_unit_grads<Cell, E>(p, t, b, u);
    for (int g = 0; g < G; ++g) dgh[(size_t)g * H] = A(0);
  }
}

/* ------------------------------------------------------------ planning */

/* The persistent kernel of a cell, dtype and pass (NULL for float64). */
const void *persistent_kernel(prnn_cell_t cell, prnn_dtype_t dtype, bool backward) {
#define PRNN_GATED_KERNEL(Cell, E) \
  (backward ? (const void *)gated_backward_persistent<Cell, E> : (const void *)gated_forward_persistent<Cell, E>)
  const bool lstm = cell == PRNN_CELL_LSTM;
  switch (dtype) {
    case PRNN_DTYPE_FLOAT32: return lstm ? PRNN_GATED_KERNEL(LstmCell, float) : PRNN_GATED_KERNEL(GruCell, float);
    case PRNN_DTYPE_BFLOAT16:
      return lstm ? PRNN_GATED_KERNEL(LstmCell, __nv_bfloat16) : PRNN_GATED_KERNEL(GruCell, __nv_bfloat16);
    case PRNN_DTYPE_FLOAT16: return lstm ? PRNN_GATED_KERNEL(LstmCell, __half) : PRNN_GATED_KERNEL(GruCell, __half);
    default: return NULL;
  }
#undef PRNN_GATED_KERNEL
}

size_t persistent_smem(const prnn_problem_t *pb, bool backward, int units, int Kp, int tile) {
  const int G = prnn_cell_gates(pb->cell), rows = backward ? units : G * units;
  const size_t floats = (size_t)tile * Kp + (size_t)rows * tile + (size_t)(backward ? 3 : 1) * units * pb->batch;
  return matrix_bytes(rows, Kp, prnn_dtype_size(pb->dtype)) + floats * sizeof(float);
}

/* Whether the persistent family takes the request: any dtype but float64,
 * no projection, cooperative launches, the rows of a CTA's units and a tile
 * of at least one sequence in shared memory, every CTA resident at once. */
prnn_status_t take_persistent(const GatedRequest &request, GatedPlan *plan, bool *taken) {
  const prnn_problem_t *pb = request.problem;
  const bool backward = request.backward;
  const DeviceInfo &dev = request.dev;
  const void *fn = persistent_kernel(pb->cell, pb->dtype, backward);
  if (fn == NULL || pb->proj_size > 0 || !dev.cooperative) return PRNN_STATUS_SUCCESS;
  const int H = (int)pb->hidden, G = prnn_cell_gates(pb->cell);
  const int units = (H + dev.sms - 1) / dev.sms;
  const int K = backward ? G * H : H;
  const int Kp = (int)align_up((size_t)K, kKAlign);
  /* a thread per (unit, staged sequence) in the cell update */
  const int most = kThreads / units < kMaxBatchTile ? kThreads / units : kMaxBatchTile;
  int tile = pb->batch < most ? (int)pb->batch : most;
  while (tile > 0 && persistent_smem(pb, backward, units, Kp, tile) > (size_t)dev.smem_optin) --tile;
  if (tile == 0) return PRNN_STATUS_SUCCESS;
  const size_t smem = persistent_smem(pb, backward, units, Kp, tile);
  cudaError_t err = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, dev.smem_optin);
  if (err != cudaSuccess) return cuda_fail(err, "cudaFuncSetAttribute");
  int per_sm = 0;
  err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fn, kThreads, smem);
  if (err != cudaSuccess) return cuda_fail(err, "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  const int grid = (H + units - 1) / units;
  if (per_sm < 1 || grid > per_sm * dev.sms) return PRNN_STATUS_SUCCESS;
  plan->summary.tier = PRNN_TIER_PERSISTENT_SHARED;
  plan->summary.workspace_bytes = 2 * (size_t)pb->batch * Kp * sizeof(float);
  plan->summary.grid = grid;
  plan->summary.block = kThreads;
  plan->summary.rows_per_cta = backward ? units : G * units;
  plan->summary.smem_bytes = (int)smem;
  plan->kernel = fn;
  plan->persistent.units = units;
  plan->persistent.k_padded = Kp;
  plan->persistent.batch_tile = tile;
  *taken = true;
  return PRNN_STATUS_SUCCESS;
}

size_t stepwise_bytes(const prnn_problem_t *pb, bool backward) {
  const int G = prnn_cell_gates(pb->cell);
  switch (pb->dtype) {
    case PRNN_DTYPE_FLOAT64: {
      StepwiseBuffers<double, double> b;
      return stepwise_layout(pb, G, backward, NULL, &b);
    }
    case PRNN_DTYPE_FLOAT32: {
      StepwiseBuffers<float, float> b;
      return stepwise_layout(pb, G, backward, NULL, &b);
    }
    default: {
      StepwiseBuffers<__half, float> b; /* bfloat16 alike: 2-byte elements */
      return stepwise_layout(pb, G, backward, NULL, &b);
    }
  }
}

/* The stepwise family, the last: it takes every problem whose B x G x H fits in 32 bits. */
prnn_status_t take_stepwise(const GatedRequest &request, GatedPlan *plan, bool *taken) {
  const prnn_problem_t *pb = request.problem;
  const int G = prnn_cell_gates(pb->cell);
  if ((int64_t)G * pb->hidden * pb->batch > 0x7fffffff)
    return prnn_fail(PRNN_STATUS_NOT_SUPPORTED, "batch x %d x hidden must be < 2^31 for the stepwise tier", G);
  plan->summary.tier = PRNN_TIER_STEPWISE;
  plan->summary.workspace_bytes = stepwise_bytes(pb, request.backward);
  plan->summary.grid = (int)((G * pb->hidden + 7) / 8);
  plan->summary.block = kThreads;
  plan->summary.rows_per_cta = 8;
  *taken = true;
  return PRNN_STATUS_SUCCESS;
}

/* ------------------------------------------------------------- launches */

int blocks_for(int64_t n) { return (int)((n + kThreads - 1) / kThreads); }

#define PRNN_CHECK_LAUNCH(what)                                  \
  do {                                                           \
    const cudaError_t err_ = cudaGetLastError();                 \
    if (err_ != cudaSuccess) return cuda_fail(err_, what);       \
  } while (0)

template <typename E, typename A>
prnn_status_t launch_matvec(const E *a, int64_t lda, int rows, int K, const A *x, int64_t ldx, int B, A *out,
                            int64_t ldo, cudaStream_t stream) {
  const int rows_per_block = kThreads / 32;
  matvec_kernel<E, A><<<(rows + rows_per_block - 1) / rows_per_block, kThreads, 0, stream>>>(a, lda, rows, K, x, ldx,
                                                                                            B, out, ldo);
  PRNN_CHECK_LAUNCH("matvec_kernel launch");
  return PRNN_STATUS_SUCCESS;
}

template <class Cell, typename E>
prnn_status_t run_stepwise_forward(const prnn_problem_t *pb, const GatedParams &p, void *workspace,
                                   cudaStream_t stream) {
  typedef typename AccumOf<E>::type A;
  const int G = Cell::kGates, B = p.batch, H = p.hidden, S = p.state;
  StepwiseBuffers<E, A> buf;
  stepwise_layout(pb, G, false, static_cast<char *>(workspace), &buf);
  const int wide = S > H ? S : H;
  forward_init_kernel<E, A><<<blocks_for((int64_t)B * wide), kThreads, 0, stream>>>(p, buf.state[1], buf.cell);
  PRNN_CHECK_LAUNCH("forward_init_kernel launch");
  const E *w_hh = static_cast<const E *>(p.w_hh), *w_hr = static_cast<const E *>(p.w_hr);
  for (int t = 0; t < p.steps; ++t) {
    prnn_status_t st = launch_matvec<E, A>(w_hh, p.w_hh_stride, G * H, S, buf.state[(t + 1) & 1], S, B, buf.gates,
                                           (int64_t)G * H, stream);
    if (st != PRNN_STATUS_SUCCESS) return st;
    forward_cell_kernel<Cell, E, A><<<blocks_for((int64_t)B * H), kThreads, 0, stream>>>(p, t, buf);
    PRNN_CHECK_LAUNCH("forward_cell_kernel launch");
    if (buf.m != NULL) {
      st = launch_matvec<E, A>(w_hr, p.w_hr_stride, S, H, buf.m, H, B, buf.hproj, S, stream);
      if (st != PRNN_STATUS_SUCCESS) return st;
      forward_project_kernel<E, A><<<blocks_for((int64_t)B * S), kThreads, 0, stream>>>(p, t, buf);
      PRNN_CHECK_LAUNCH("forward_project_kernel launch");
    }
  }
  return PRNN_STATUS_SUCCESS;
}

template <class Cell, typename E>
prnn_status_t run_stepwise_backward(const prnn_problem_t *pb, const GatedParams &p, void *workspace,
                                    cudaStream_t stream) {
  typedef typename AccumOf<E>::type A;
  const int G = Cell::kGates, B = p.batch, H = p.hidden, S = p.state;
  StepwiseBuffers<E, A> buf;
  stepwise_layout(pb, G, true, static_cast<char *>(workspace), &buf);
  const int copy_blocks = 1024;
  transpose_kernel<E><<<copy_blocks, kThreads, 0, stream>>>(static_cast<const E *>(p.w_hh), p.w_hh_stride, G * H, S,
                                                            buf.w_hh_t);
  PRNN_CHECK_LAUNCH("transpose_kernel launch");
  if (buf.w_hr_t != NULL) {
    transpose_kernel<E><<<copy_blocks, kThreads, 0, stream>>>(static_cast<const E *>(p.w_hr), p.w_hr_stride, S, H,
                                                              buf.w_hr_t);
    PRNN_CHECK_LAUNCH("transpose_kernel launch");
  }
  const int wide = S > H ? S : H;
  backward_init_kernel<E, A><<<blocks_for((int64_t)B * wide), kThreads, 0, stream>>>(p, buf);
  PRNN_CHECK_LAUNCH("backward_init_kernel launch");
  for (int s = 0; s <= p.steps; ++s) {
    const int t = p.steps - 1 - s;
    if (s > 0) {
      const prnn_status_t st =
          launch_matvec<E, A>(buf.w_hh_t, (int64_t)G * H, S, G * H, buf.dgh, (int64_t)G * H, B, buf.mh, S, stream);
      if (st != PRNN_STATUS_SUCCESS) return st;
    }
    backward_state_kernel<E, A><<<blocks_for((int64_t)B * S), kThreads, 0, stream>>>(p, t, s > 0, buf);
    PRNN_CHECK_LAUNCH("backward_state_kernel launch");
    if (buf.dm != NULL && t >= 0) {
      const prnn_status_t st = launch_matvec<E, A>(buf.w_hr_t, S, H, S, buf.dh, S, B, buf.dm, H, stream);
      if (st != PRNN_STATUS_SUCCESS) return st;
    }
    backward_cell_kernel<Cell, E, A><<<blocks_for((int64_t)B * H), kThreads, 0, stream>>>(p, t, buf);
    PRNN_CHECK_LAUNCH("backward_cell_kernel launch");
  }
  return PRNN_STATUS_SUCCESS;
}

template <class Cell, typename E>
prnn_status_t run_stepwise(const prnn_problem_t *pb, bool backward, const GatedParams &p, void *workspace,
                           cudaStream_t stream) {
  return backward ? run_stepwise_backward<Cell, E>(pb, p, workspace, stream)
                  : run_stepwise_forward<Cell, E>(pb, p, workspace, stream);
}

template <class Cell>
prnn_status_t run_stepwise_cell(const prnn_problem_t *pb, bool backward, const GatedParams &p, void *workspace,
                                cudaStream_t stream) {
  switch (pb->dtype) {
    case PRNN_DTYPE_FLOAT32: return run_stepwise<Cell, float>(pb, backward, p, workspace, stream);
    case PRNN_DTYPE_FLOAT64: return run_stepwise<Cell, double>(pb, backward, p, workspace, stream);
    case PRNN_DTYPE_FLOAT16: return run_stepwise<Cell, __half>(pb, backward, p, workspace, stream);
    case PRNN_DTYPE_BFLOAT16: return run_stepwise<Cell, __nv_bfloat16>(pb, backward, p, workspace, stream);
  }
  return prnn_fail(PRNN_STATUS_BAD_PARAM, "invalid dtype %d", (int)pb->dtype);
}

prnn_status_t launch_stepwise(const GatedPlan &, const prnn_problem_t *pb, bool backward, GatedParams p,
                              void *workspace, cudaStream_t stream) {
  return pb->cell == PRNN_CELL_LSTM ? run_stepwise_cell<LstmCell>(pb, backward, p, workspace, stream)
                                    : run_stepwise_cell<GruCell>(pb, backward, p, workspace, stream);
}

/* Zero the exchange (its padding columns read as zero), then one cooperative launch. */
prnn_status_t launch_persistent(const GatedPlan &plan, const prnn_problem_t *, bool, GatedParams p, void *workspace,
                                cudaStream_t stream) {
  p.persistent.units_per_cta = plan.persistent.units;
  p.persistent.k_padded = plan.persistent.k_padded;
  p.persistent.batch_tile = plan.persistent.batch_tile;
  p.persistent.xchg = static_cast<float *>(workspace);
  const prnn_plan_t &s = plan.summary;
  void *args[] = {&p};
  return launch_cooperative_zeroed(plan.kernel, s.grid, kThreads, args, (size_t)s.smem_bytes, workspace,
                                   s.workspace_bytes, stream, "cudaLaunchCooperativeKernel(gated persistent kernel)");
}

}  // namespace

extern const GatedFamily gated_persistent_family = {take_persistent, launch_persistent, true};

prnn_status_t load_gated_stepwise_kernels() {
  return for_each_element_type([](auto element) {
    using E = decltype(element);
    using A = typename AccumOf<E>::type;
    return load_kernels(matvec_kernel<E, A>, transpose_kernel<E>, forward_init_kernel<E, A>,
                        forward_cell_kernel<LstmCell, E, A>, forward_cell_kernel<GruCell, E, A>,
                        forward_project_kernel<E, A>, backward_init_kernel<E, A>, backward_state_kernel<E, A>,
                        backward_cell_kernel<LstmCell, E, A>, backward_cell_kernel<GruCell, E, A>);
  });
}
extern const GatedFamily gated_stepwise_family = {take_stepwise, launch_stepwise, false};

namespace {

/* The gated families, asked in this order; the first that takes a problem
 * runs it: one cluster per group of sequences (16-bit, H <= 512, sm_90+),
 * the cooperative grids (16-bit tensor cores, or float32 FFMA, its backward
 * with PRNN_GATED_FFMA=1; H <= 1024, sm_80+), the persistent family (W_hh in
 * shared memory), then a few launches a step. */
const GatedFamily *const kGatedFamilies[] = {&gated_cluster_family, &gated_grid_family, &gated_ffma_family,
                                             &gated_persistent_family, &gated_stepwise_family};

/* How a pass of a checked problem runs on `device` (the current device). */
prnn_status_t plan(const prnn_problem_t *pb, bool backward, int device, GatedPlan *out) {
  memset(out, 0, sizeof *out);
  if (pb->steps > 0x7fffffff || pb->batch > 0x7fffffff || pb->hidden > 0x7fffffff || pb->proj_size > 0x7fffffff)
    return prnn_fail(PRNN_STATUS_NOT_SUPPORTED, "steps, batch, hidden and proj_size must be < 2^31");
  GatedRequest request = {pb, backward, device, {}};
  prnn_status_t st = device_info(device, &request.dev);
  if (st != PRNN_STATUS_SUCCESS) return st;
  bool taken = false;
  st = ask_families(kGatedFamilies, request, [](const GatedFamily &) { return true; }, out, &taken);
  if (st != PRNN_STATUS_SUCCESS || taken) return st;
  return prnn_fail(PRNN_STATUS_NOT_SUPPORTED, "no kernel runs this problem"); /* the stepwise family takes or fails */
}

/* Plan, check the workspace, launch the chosen family. */
prnn_status_t run_gated(const prnn_problem_t *pb, bool backward, const GatedParams &p, void *workspace,
                        size_t workspace_bytes, cudaStream_t stream) {
  int device = 0;
  const cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return cuda_fail(err, "cudaGetDevice");
  GatedPlan pl;
  prnn_status_t st = plan(pb, backward, device, &pl);
  if (st != PRNN_STATUS_SUCCESS) return st;
  st = check_workspace(workspace, workspace_bytes, pl.summary.workspace_bytes);
  if (st != PRNN_STATUS_SUCCESS) return st;
  return pl.family->launch(pl, pb, backward, p, workspace, stream);
}

GatedParams params_of(const prnn_problem_t *pb) {
  GatedParams p;
  memset(&p, 0, sizeof p);
  p.steps = (int)pb->steps;
  p.batch = (int)pb->batch;
  p.hidden = (int)pb->hidden;
  p.state = (int)(pb->proj_size > 0 ? pb->proj_size : pb->hidden);
  return p;
}

}  // namespace

prnn_status_t gated_plan(const prnn_problem_t *problem, prnn_pass_t pass, int device, prnn_plan_t *out) {
  GatedPlan pl;
  const prnn_status_t st = plan(problem, pass == PRNN_PASS_BACKWARD_DATA, device, &pl);
  *out = pl.summary;
  return st;
}

}  // namespace prnn

using namespace prnn;

extern "C" {

prnn_status_t prnn_gated_forward_cuda(const prnn_problem_t *problem, const prnn_gated_forward_args_t *args,
                                      void *workspace, size_t workspace_bytes, prnn_stream_t stream) {
  prnn_clear_error();
  const prnn_status_t st = prnn_check_gated_forward_args(problem, args);
  if (st != PRNN_STATUS_SUCCESS) return st;
  GatedParams p = params_of(problem);
  p.xp = args->xp;
  p.xp_stride_t = args->xp_stride_t;
  p.xp_stride_b = args->xp_stride_b;
  p.b_hh = args->b_hh;
  p.h0 = args->h0;
  p.h0_stride_b = args->h0_stride_b;
  p.c0 = args->c0;
  p.c0_stride_b = args->c0_stride_b;
  p.w_hh = args->w_hh;
  p.w_hh_stride = args->w_hh_stride;
  p.w_hr = args->w_hr;
  p.w_hr_stride = args->w_hr_stride;
  p.lengths = problem->has_lengths ? args->lengths : NULL;
  p.y = args->y;
  p.h_n = args->h_n;
  p.c_n = args->c_n;
  p.saved = args->saved;
  return run_gated(problem, false, p, workspace, workspace_bytes, (cudaStream_t)stream);
}

prnn_status_t prnn_gated_backward_data_cuda(const prnn_problem_t *problem, const prnn_gated_backward_args_t *args,
                                            void *workspace, size_t workspace_bytes, prnn_stream_t stream) {
  prnn_clear_error();
  const prnn_status_t st = prnn_check_gated_backward_args(problem, args);
  if (st != PRNN_STATUS_SUCCESS) return st;
  GatedParams p = params_of(problem);
  p.grad_y = args->grad_y;
  p.grad_y_stride_t = args->grad_y_stride_t;
  p.grad_y_stride_b = args->grad_y_stride_b;
  p.grad_h_n = args->grad_h_n;
  p.grad_h_n_stride_b = args->grad_h_n_stride_b;
  p.grad_c_n = args->grad_c_n;
  p.grad_c_n_stride_b = args->grad_c_n_stride_b;
  p.h0 = args->h0;
  p.h0_stride_b = args->h0_stride_b;
  p.c0 = args->c0;
  p.c0_stride_b = args->c0_stride_b;
  p.y = const_cast<void *>(args->y); /* read only in the backward */
  p.saved = const_cast<void *>(args->saved);
  p.w_hh = args->w_hh;
  p.w_hh_stride = args->w_hh_stride;
  p.w_hr = args->w_hr;
  p.w_hr_stride = args->w_hr_stride;
  p.lengths = problem->has_lengths ? args->lengths : NULL;
  p.grad_xp = args->grad_xp;
  p.grad_hh = args->grad_hh;
  p.grad_h = args->grad_h;
  p.grad_h0 = args->grad_h0;
  p.grad_c0 = args->grad_c0;
  return run_gated(problem, true, p, workspace, workspace_bytes, (cudaStream_t)stream);
}

}  // extern "C"
