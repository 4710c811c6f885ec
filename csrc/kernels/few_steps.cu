/*
 * few_steps.cu - a whole Elman layer of a few steps of a small batch (one
 * timestep a call: an inference server's, a robot's), where bringing W_hh
 * on chip costs more than the steps: one plain launch a step computes the
 * step's input projection and recurrence together, a warp per hidden unit,
 * W_ih and W_hh read from L2 (or HBM) each step. No workspace; the last step
 * writes h_n. Also the final state of a layer another family ran.
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

/* acc[j] = this lane's part of row . v_j over K, for the n <= kSeqTile vectors
 * v + j * v_stride; lanes take V elements at a time, 32 V apart. */
template <int V, typename E, typename A>
__device__ __forceinline__ void row_products(const E *row, const E *v, int64_t v_stride, int K, int n, int lane,
                                             A (&acc)[kSeqTile]) {
#pragma unroll
  for (int j = 0; j < kSeqTile; ++j) acc[j] = A(0);
#pragma unroll 4
  for (int k = lane * V; k < K; k += 32 * V) {
    A w[V];
    load_elements<V>(row + k, w);
#pragma unroll
    for (int j = 0; j < kSeqTile; ++j) {
      if (j < n) {
        A e[V];
        load_elements<V>(v + j * v_stride + k, e);
#pragma unroll
        for (int i = 0; i < V; ++i) acc[j] += w[i] * e[i];
      }
    }
  }
#pragma unroll
  for (int j = 0; j < kSeqTile; ++j)
#pragma unroll
    for (int off = 16; off >= 1; off >>= 1) acc[j] += __shfl_xor_sync(0xffffffffu, acc[j], off);
}

/* Step t of every sequence for hidden unit `row`: y_t = act(xp_t + W_hh h_{t-1})
 * with xp_t rounded as the projection GEMM's output is,
 * round(W_ih x_t + round(b_ih + b_hh)); h_{t-1} is y_{t-1} (h0 at t = 0),
 * written by the previous launch. */
template <typename E, int V>
__global__ void __launch_bounds__(kThreads)
    few_steps_kernel(const RecurrenceParams p, const InputProjection proj, E *h_n, int t) {
  typedef typename AccumOf<E>::type A;
  const int lane = threadIdx.x & 31;
  const int row = blockIdx.x * (kThreads / 32) + (threadIdx.x >> 5);
  if (row >= p.hidden) return; /* the whole warp leaves together */
  const int B = p.batch, H = p.hidden;
  E *y = static_cast<E *>(p.out);
  const E *x = static_cast<const E *>(proj.x) + (int64_t)t * proj.x_stride_t;
  const E *h = t == 0 ? static_cast<const E *>(p.h0) : y + (size_t)(t - 1) * B * H;
  const int64_t h_stride = t == 0 ? p.h0_stride_b : H;
  const E *w_ih = static_cast<const E *>(proj.w) + (int64_t)row * proj.w_stride;
  const E *w_hh = static_cast<const E *>(p.a) + (int64_t)row * p.a_stride_row;
  const E *b_ih = static_cast<const E *>(proj.b_ih), *b_hh = static_cast<const E *>(proj.b_hh);
  const A bias = b_ih != NULL ? A(to_accum(Round<E>::to(to_accum(b_ih[row]) + to_accum(b_hh[row])))) : A(0);

  for (int b0 = 0; b0 < B; b0 += kSeqTile) {
    const int n = B - b0 < kSeqTile ? B - b0 : kSeqTile;
    A in[kSeqTile], rec[kSeqTile];
    row_products<V>(w_ih, x + b0 * proj.x_stride_b, proj.x_stride_b, proj.input, n, lane, in);
    row_products<V>(w_hh, h + b0 * h_stride, h_stride, H, n, lane, rec);
    if (lane < n) {
      A in_b = in[0], rec_b = rec[0]; /* lane j's sequence, chosen without a run-time index */
#pragma unroll
      for (int j = 1; j < kSeqTile; ++j)
        if (lane == j) in_b = in[j], rec_b = rec[j];
      const A xp = to_accum(Round<E>::to(in_b + bias));
      const E out = Round<E>::to(ElmanCell::activate(p.activation, rec_b + xp));
      const int b = b0 + lane;
      y[((size_t)t * B + b) * H + row] = out;
      if (h_n != NULL && t == p.steps - 1) h_n[(size_t)b * H + row] = out;
    }
  }
}

bool aligned16(const void *ptr) { return (uintptr_t)ptr % 16 == 0; }

template <typename E>
prnn_status_t run_few_steps(const RecurrenceParams &p, const InputProjection &proj, void *h_n, cudaStream_t stream) {
  const int V = 16 / sizeof(E);
  const bool vectors = aligned16(proj.x) && proj.x_stride_t % V == 0 && proj.x_stride_b % V == 0 &&
                       proj.input % V == 0 && aligned16(proj.w) && proj.w_stride % V == 0 && aligned16(p.a) &&
                       p.a_stride_row % V == 0 && p.hidden % V == 0 && aligned16(p.h0) && p.h0_stride_b % V == 0 &&
                       aligned16(p.out);
  const int grid = (p.hidden + kThreads / 32 - 1) / (kThreads / 32);
  for (int t = 0; t < p.steps; ++t) {
    if (vectors)
      few_steps_kernel<E, V><<<grid, kThreads, 0, stream>>>(p, proj, static_cast<E *>(h_n), t);
    else
      few_steps_kernel<E, 1><<<grid, kThreads, 0, stream>>>(p, proj, static_cast<E *>(h_n), t);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return cuda_fail(err, "few_steps_kernel launch");
  }
  return PRNN_STATUS_SUCCESS;
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

/* One step of up to 16 sequences, or two of up to 4 (a pass over the rows
 * each): where the launches a step cost less than the persistent kernels'
 * start, in a CUDA graph and eager (H200, H 256-2048: bench/NOTES.md). */
bool few_steps_takes(const prnn_problem_t *pb, int64_t input) {
  if (pb->cell != PRNN_CELL_ELMAN || input <= 0 || pb->has_lengths) return false;
  return (pb->steps == 1 && pb->batch <= 16) || (pb->steps == 2 && pb->batch <= kSeqTile);
}

void few_steps_plan(const prnn_problem_t *pb, prnn_plan_t *plan) {
  plan->tier = PRNN_TIER_FEW_STEPS;
  plan->workspace_bytes = 0;
  plan->grid = (int)((pb->hidden + kThreads / 32 - 1) / (kThreads / 32));
  plan->block = kThreads;
  plan->rows_per_cta = kThreads / 32;
  plan->smem_bytes = 0;
}

prnn_status_t few_steps_layer(const prnn_problem_t *pb, const RecurrenceParams &params, const InputProjection &proj,
                              void *h_n, cudaStream_t stream) {
  switch (pb->dtype) {
    case PRNN_DTYPE_FLOAT32: return run_few_steps<float>(params, proj, h_n, stream);
    case PRNN_DTYPE_FLOAT64: return run_few_steps<double>(params, proj, h_n, stream);
    case PRNN_DTYPE_FLOAT16: return run_few_steps<__half>(params, proj, h_n, stream);
    case PRNN_DTYPE_BFLOAT16: return run_few_steps<__nv_bfloat16>(params, proj, h_n, stream);
  }
  return prnn_fail(PRNN_STATUS_BAD_PARAM, "dtype %d", (int)pb->dtype);
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
