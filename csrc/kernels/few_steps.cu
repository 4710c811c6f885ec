/*
 * few_steps.cu - a whole layer of a few steps of a small batch (one timestep
 * a call: an inference server's, a robot's), where bringing W_hh on chip
 * costs more than the steps: one plain launch a step computes the step's
 * input projection and recurrence together, a warp per hidden unit (its G
 * gate rows), W_ih and W_hh read from L2 (or HBM) each step, the cell a
 * policy (cells.cuh). No workspace; the last step writes h_n (and c_n). Also
 * the final state of an Elman layer another family ran.
 */
#include "cells.cuh"
#include "cuda_status.cuh"
#include "few_steps.cuh"
#include "prnn_internal.h"

namespace prnn {
namespace {

const int kThreads = 256;    /* 8 warps, a hidden unit each */
const int kSeqTile = 4;      /* sequences a warp multiplies per pass over its rows */

/* n elements from p as accumulators: one 16-byte load (p aligned) for n > 1. */
template <int N, typename E, typename A>
__device__ __forceinline__ void load_elements(const E *p, A (&v)[N]) {
  if (N == 1) {
    v[0] = to_accum(__ldg(p));
  } else {
    static_assert(N == 1 || N * sizeof(E) == 16, "a vector is 16 bytes");
    const uint4 q = __ldg(reinterpret_cast<const uint4 *>(p));
    const E *e = reinterpret_cast<const E *>(&q);
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = to_accum(e[i]);
  }
}

/* The sizes of a layer's launch. */
struct FewStepsShape {
  int steps, batch, hidden, input, activation;
};

/* acc[g][j] = row_g . v_j over K, summed over the warp (lanes take V
 * elements at a time, 32 V apart), for G rows gate_stride apart and the
 * n <= kSeqTile vectors v + j * v_stride. */
template <int G, int V, typename E, typename A>
__device__ __forceinline__ void row_products(const E *row, int64_t gate_stride, const E *v, int64_t v_stride, int K,
                                             int n, int lane, A (&acc)[G][kSeqTile]) {
  constexpr int kUnroll = G == 1 ? 4 : 1; /* loads in flight; a gated unit has G rows a step of k already */
#pragma unroll
  for (int g = 0; g < G; ++g)
#pragma unroll
    for (int j = 0; j < kSeqTile; ++j) acc[g][j] = A(0);
#pragma unroll kUnroll
  for (int k = lane * V; k < K; k += 32 * V) {
    A e[kSeqTile][V];
#pragma unroll
    for (int j = 0; j < kSeqTile; ++j)
      if (j < n) load_elements<V>(v + j * v_stride + k, e[j]);
#pragma unroll
    for (int g = 0; g < G; ++g) {
      A w[V];
      load_elements<V>(row + g * gate_stride + k, w);
#pragma unroll
      for (int j = 0; j < kSeqTile; ++j)
        if (j < n)
#pragma unroll
          for (int i = 0; i < V; ++i) acc[g][j] += w[i] * e[j][i];
    }
  }
#pragma unroll
  for (int g = 0; g < G; ++g)
#pragma unroll
    for (int j = 0; j < kSeqTile; ++j)
#pragma unroll
      for (int off = 16; off >= 1; off >>= 1) acc[g][j] += __shfl_xor_sync(0xffffffffu, acc[g][j], off);
}

/* Unit u's output for sequence b from its gate sums, x side `in` and h side
 * `rec`, as the whole-sequence passes compute it (h: the state the step
 * reads, h_stride apart). Gated cells: xp = round(W_ih x + b_ih), as the
 * GEMM before the gated passes gives it, b_hh added to the h side; an
 * LSTM's c comes from c0 (the gated cells run one step here) and goes to c_n. */
template <class Cell, typename E, typename A>
struct FewStepsUnit {
  static __device__ __forceinline__ E output(const prnn_layer_args_t &a, const FewStepsShape &s, int u, int b,
                                             const E *h, int64_t h_stride, const A (&in)[Cell::kGates],
                                             const A (&rec)[Cell::kGates]) {
    const int G = Cell::kGates, H = s.hidden;
    const E *b_ih = static_cast<const E *>(a.b_ih), *b_hh = static_cast<const E *>(a.b_hh);
    A xp[G], hh[G], saved[Cell::kSaved];
#pragma unroll
    for (int g = 0; g < G; ++g) {
      xp[g] = to_accum(Round<E>::to(in[g] + (b_ih != NULL ? A(to_accum(b_ih[g * H + u])) : A(0))));
      hh[g] = rec[g] + (b_hh != NULL ? A(to_accum(b_hh[g * H + u])) : A(0));
    }
    const A prev = Cell::kCarriesCell ? A(to_accum(static_cast<const E *>(a.c0)[b * a.c0_stride_b + u]))
                                      : A(to_accum(h[b * h_stride + u]));
    A carry;
    const A out = Cell::template forward<A, PreciseMath>(xp, hh, prev, &carry, saved);
    if (Cell::kCarriesCell && a.c_n != NULL) static_cast<E *>(a.c_n)[(size_t)b * H + u] = Round<E>::to(carry);
    return Round<E>::to(out);
  }
};

/* Elman: act(xp + W_hh h) with xp = round(W_ih x + round(b_ih + b_hh)), as
 * the projection GEMM (both biases folded into it) gives xp. */
template <typename E, typename A>
struct FewStepsUnit<ElmanCell, E, A> {
  static __device__ __forceinline__ E output(const prnn_layer_args_t &a, const FewStepsShape &s, int u, int,
                                             const E *, int64_t, const A (&in)[1], const A (&rec)[1]) {
    const E *b_ih = static_cast<const E *>(a.b_ih), *b_hh = static_cast<const E *>(a.b_hh);
    const A bias = b_ih != NULL ? A(to_accum(Round<E>::to(to_accum(b_ih[u]) + to_accum(b_hh[u])))) : A(0);
    const A xp = to_accum(Round<E>::to(in[0] + bias));
    return Round<E>::to(ElmanCell::activate(s.activation, rec[0] + xp));
  }
};

/* Step t of every sequence for hidden unit u (a warp): its G rows of W_ih
 * and W_hh times x_t and h_{t-1} (h0 at t = 0, else y_{t-1}, written by the
 * previous launch), then the cell. */
template <class Cell, typename E, int V>
__global__ void __launch_bounds__(kThreads)
    few_steps_kernel(const prnn_layer_args_t a, const FewStepsShape s, int t) {
  typedef typename AccumOf<E>::type A;
  const int G = Cell::kGates;
  const int lane = threadIdx.x & 31;
  const int u = blockIdx.x * (kThreads / 32) + (threadIdx.x >> 5);
  if (u >= s.hidden) return; /* the whole warp leaves together */
  const int B = s.batch, H = s.hidden;
  E *y = static_cast<E *>(a.y);
  const E *x = static_cast<const E *>(a.x) + (int64_t)t * a.x_stride_t;
  const E *h = t == 0 ? static_cast<const E *>(a.h0) : y + (size_t)(t - 1) * B * H;
  const int64_t h_stride = t == 0 ? a.h0_stride_b : H;
  const E *w_ih = static_cast<const E *>(a.w_ih) + (int64_t)u * a.w_ih_stride;
  const E *w_hh = static_cast<const E *>(a.w_hh) + (int64_t)u * a.w_hh_stride;

  for (int b0 = 0; b0 < B; b0 += kSeqTile) {
    const int n = B - b0 < kSeqTile ? B - b0 : kSeqTile;
    A in[G][kSeqTile], rec[G][kSeqTile];
    row_products<G, V>(w_ih, (int64_t)H * a.w_ih_stride, x + b0 * a.x_stride_b, a.x_stride_b, s.input, n, lane, in);
    row_products<G, V>(w_hh, (int64_t)H * a.w_hh_stride, h + b0 * h_stride, h_stride, H, n, lane, rec);
    if (lane < n) {
      A in_b[G], rec_b[G]; /* lane j's sequence, chosen without a run-time index */
#pragma unroll
      for (int g = 0; g < G; ++g) in_b[g] = in[g][0], rec_b[g] = rec[g][0];
#pragma unroll
      for (int j = 1; j < kSeqTile; ++j)
        if (lane == j)
#pragma unroll
          for (int g = 0; g < G; ++g) in_b[g] = in[g][j], rec_b[g] = rec[g][j];
      const int b = b0 + lane;
      const E out = FewStepsUnit<Cell, E, A>::output(a, s, u, b, h, h_stride, in_b, rec_b);
      y[((size_t)t * B + b) * H + u] = out;
      if (a.h_n != NULL && t == s.steps - 1) static_cast<E *>(a.h_n)[(size_t)b * H + u] = out;
    }
  }
}

bool aligned16(const void *ptr) { return (uintptr_t)ptr % 16 == 0; }

template <class Cell, typename E>
prnn_status_t run_few_steps(const prnn_problem_t *pb, const prnn_layer_args_t &a, cudaStream_t stream) {
  const int V = 16 / sizeof(E);
  const FewStepsShape s = {(int)pb->steps, (int)pb->batch, (int)pb->hidden, (int)a.input, (int)pb->activation};
  const bool vectors = aligned16(a.x) && a.x_stride_t % V == 0 && a.x_stride_b % V == 0 && a.input % V == 0 &&
                       aligned16(a.w_ih) && a.w_ih_stride % V == 0 && aligned16(a.w_hh) && a.w_hh_stride % V == 0 &&
                       s.hidden % V == 0 && aligned16(a.h0) && a.h0_stride_b % V == 0 && aligned16(a.y);
  const int grid = (s.hidden + kThreads / 32 - 1) / (kThreads / 32);
  for (int t = 0; t < s.steps; ++t) {
    if (vectors)
      few_steps_kernel<Cell, E, V><<<grid, kThreads, 0, stream>>>(a, s, t);
    else
      few_steps_kernel<Cell, E, 1><<<grid, kThreads, 0, stream>>>(a, s, t);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return cuda_fail(err, "few_steps_kernel launch");
  }
  return PRNN_STATUS_SUCCESS;
}

template <class Cell>
prnn_status_t few_steps_of(const prnn_problem_t *pb, const prnn_layer_args_t &a, cudaStream_t stream) {
  switch (pb->dtype) {
    case PRNN_DTYPE_FLOAT32: return run_few_steps<Cell, float>(pb, a, stream);
    case PRNN_DTYPE_FLOAT64: return run_few_steps<Cell, double>(pb, a, stream);
    case PRNN_DTYPE_FLOAT16: return run_few_steps<Cell, __half>(pb, a, stream);
    case PRNN_DTYPE_BFLOAT16: return run_few_steps<Cell, __nv_bfloat16>(pb, a, stream);
  }
  return prnn_fail(PRNN_STATUS_BAD_PARAM, "dtype %d", (int)pb->dtype);
}

template <typename E>
__global__ void final_state_kernel(const RecurrenceParams p, E *h_n) {
  const int B = p.batch, H = p.hidden;
  const E *y = static_cast<const E *>(p.out), *h0 = static_cast<const E *>(p.h0);
  for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < (int64_t)B * H;
       idx += (int64_t)gridDim.x * blockDim.x) {
    const int b = (int)(idx / H), j = (int)(idx % H);
    const int length = sequence_length(p.lengths, b, p.steps);
    h_n[idx] = length > 0 ? y[((int64_t)(length - 1) * B + b) * H + j] : h0[b * p.h0_stride_b + j];
  }
}

template <typename E>
prnn_status_t run_final_state(const RecurrenceParams &p, void *h_n, cudaStream_t stream) {
  const int64_t total = (int64_t)p.batch * p.hidden;
  const int blocks = (int)((total + kThreads - 1) / kThreads < 1024 ? (total + kThreads - 1) / kThreads : 1024);
  final_state_kernel<E><<<blocks, kThreads, 0, stream>>>(p, static_cast<E *>(h_n));
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return cuda_fail(err, "final_state_kernel launch");
  return PRNN_STATUS_SUCCESS;
}

}  // namespace

/* Elman: one step of up to 16 sequences, or two of up to 4 (a pass over the
 * rows each): where the launches a step cost less than the persistent
 * kernels' start, in a CUDA graph and eager (H200, H 256-2048:
 * bench/NOTES.md); and beside a resident kernel, where no persistent
 * family runs, any number of steps of any batch. The gated cells one step
 * (c would be rounded to the element type between steps), without a
 * projection. */
bool few_steps_takes(const prnn_problem_t *pb, int64_t input, bool beside_resident) {
  const int64_t kIndexLimit = 0x7fffff00; /* G*H rows and the K loop's indices stay in int */
  if (input <= 0 || pb->has_lengths || input > kIndexLimit) return false;
  if ((int64_t)prnn_cell_gates(pb->cell) * pb->hidden > kIndexLimit) return false;
  if (pb->cell != PRNN_CELL_ELMAN) return pb->proj_size == 0 && pb->steps == 1 && pb->batch <= 16;
  if (beside_resident) return pb->steps <= kIndexLimit && pb->batch <= kIndexLimit;
  return (pb->steps == 1 && pb->batch <= 16) || (pb->steps == 2 && pb->batch <= kSeqTile);
}

void few_steps_plan(const prnn_problem_t *pb, prnn_plan_t *plan) {
  plan->tier = PRNN_TIER_FEW_STEPS;
  plan->workspace_bytes = 0;
  plan->grid = (int)((pb->hidden + kThreads / 32 - 1) / (kThreads / 32));
  plan->block = kThreads;
  plan->rows_per_cta = kThreads / 32 * prnn_cell_gates(pb->cell);
  plan->smem_bytes = 0;
}

prnn_status_t few_steps_layer(const prnn_problem_t *pb, const prnn_layer_args_t &args, cudaStream_t stream) {
  switch (pb->cell) {
    case PRNN_CELL_ELMAN: return few_steps_of<ElmanCell>(pb, args, stream);
    case PRNN_CELL_LSTM: return few_steps_of<LstmCell>(pb, args, stream);
    case PRNN_CELL_GRU: return few_steps_of<GruCell>(pb, args, stream);
  }
  return prnn_fail(PRNN_STATUS_BAD_PARAM, "cell %d", (int)pb->cell);
}

prnn_status_t load_few_steps_kernels() {
  return for_each_element_type([](auto element) {
    using E = decltype(element);
    const int V = 16 / sizeof(E);
    return load_kernels(few_steps_kernel<ElmanCell, E, 1>, few_steps_kernel<ElmanCell, E, V>,
                        few_steps_kernel<LstmCell, E, 1>, few_steps_kernel<LstmCell, E, V>,
                        few_steps_kernel<GruCell, E, 1>, few_steps_kernel<GruCell, E, V>);
  });
}

prnn_status_t launch_final_state(const prnn_problem_t *pb, const RecurrenceParams &params, void *h_n,
                                 cudaStream_t stream) {
  switch (pb->dtype) {
    case PRNN_DTYPE_FLOAT32: return run_final_state<float>(params, h_n, stream);
    case PRNN_DTYPE_FLOAT64: return run_final_state<double>(params, h_n, stream);
    case PRNN_DTYPE_FLOAT16: return run_final_state<__half>(params, h_n, stream);
    case PRNN_DTYPE_BFLOAT16: return run_final_state<__nv_bfloat16>(params, h_n, stream);
  }
  return prnn_fail(PRNN_STATUS_BAD_PARAM, "dtype %d", (int)pb->dtype);
}

}  // namespace prnn
