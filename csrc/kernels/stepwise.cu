/*
 * stepwise.cu - the slow tier: one kernel launch per step, A re-read from
 * L2/HBM every step. It runs what the persistent kernels cannot hold on chip
 * (large hidden sizes, float64) with the same arithmetic (cells.cuh).
 * Its kernels, its plan and its launch.
 */
#include "cuda_status.cuh"
#include "elman_family.cuh"
#include "prnn_internal.h"
#include "cells.cuh"

namespace prnn {

/* Largest hidden size of the stepwise tier: its workspace holds a copy of W_hh. */
static const int64_t kMaxStepwiseHidden = 32768;
static const size_t kAlign = 256;

static size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

/* Workspace: a contiguous copy of A, then 2 x batch x hidden states. */
static size_t stepwise_workspace_bytes(int batch, int hidden, size_t elem_size) {
  return align_up((size_t)hidden * hidden * elem_size) + 2 * (size_t)batch * hidden * elem_size;
}

/* dst[i*n + k] = A[i][k]: a contiguous copy, so that a warp reads rows coalesced. */
template <typename E>
__global__ void copy_matrix_kernel(const E *src, int64_t stride_row, int64_t stride_col, int n, E *dst) {
  const int64_t total = (int64_t)n * n;
  for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < total;
       idx += (int64_t)gridDim.x * blockDim.x) {
    const int64_t i = idx / n, k = idx % n;
    dst[idx] = src[i * stride_row + k * stride_col];
  }
}

/* One step: a warp per output row, lanes split K, BT sequences at a time. */
template <class Cell, typename E>
__global__ void stepwise_rnn_kernel(const RecurrenceParams p, const E *a, E *state, int s) {
  static_assert(Cell::kGates == 1, "an Elman family: one row of A an output");
  typedef typename AccumOf<E>::type A;
  const int BT = 4;
  const int lane = threadIdx.x & 31;
  const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= p.hidden) return; /* the whole warp leaves together */
  const int T = p.steps, B = p.batch, H = p.hidden;
  const int t = p.backward ? T - 1 - s : s;
  const E *a_row = a + (size_t)row * H;
  const E *prev = state + (size_t)((s + 1) & 1) * B * H; /* s_{t-1}, written by launch s-1 */
  E *next = state + (size_t)(s & 1) * B * H;
  E *out;
  const E *in, *yfwd, *h0;
  typed_tensors(p, out, in, yfwd, h0);

  /* by tile index: b0 += BT would overflow for B near 2^31 */
  const int tiles = (int)(((int64_t)B + BT - 1) / BT);
  for (int tile = 0; tile < tiles; ++tile) {
    const int b0 = tile * BT;
    A acc[BT];
#pragma unroll
    for (int bl = 0; bl < BT; ++bl) acc[bl] = A(0);
    if (s > 0 || !p.backward) {
      for (int k = lane; k < H; k += 32) {
        const A w = to_accum(a_row[k]);
#pragma unroll
        for (int bl = 0; bl < BT; ++bl) {
          const int b = b0 + bl;
          if (b < B) acc[bl] += w * to_accum(s == 0 ? h0[b * p.h0_stride_b + k] : prev[(size_t)b * H + k]);
        }
      }
    }
#pragma unroll
    for (int bl = 0; bl < BT; ++bl)
#pragma unroll
      for (int off = 16; off >= 1; off >>= 1) acc[bl] += __shfl_xor_sync(0xffffffffu, acc[bl], off);

    const int b = b0 + (lane < BT ? lane : 0);
    if (lane < BT && b < B) {
      A mat = acc[0];
#pragma unroll
      for (int bl = 1; bl < BT; ++bl)
        if (lane == bl) mat = acc[bl];
      const bool active = t < sequence_length(p.lengths, b, T);
      const A in_v = to_accum(in[t * p.in_stride_t + b * p.in_stride_b + row]);
      const A y_v = p.backward ? to_accum(yfwd[((size_t)t * B + b) * H + row]) : A(0);
      const A frozen = p.backward ? A(0)
                                  : to_accum(s == 0 ? h0[b * p.h0_stride_b + row] : prev[(size_t)b * H + row]);
      A st;
      const A value = Cell::step(p.backward, p.activation, active, mat, in_v, y_v, frozen, &st);
      out[((size_t)t * B + b) * H + row] = Round<E>::to(value);
      next[(size_t)b * H + row] = Round<E>::to(st);
    }
  }
}

template <typename E>
static cudaError_t run_stepwise(const RecurrenceParams &p, void *workspace, cudaStream_t stream) {
  E *a = static_cast<E *>(workspace);
  E *state = reinterpret_cast<E *>(static_cast<char *>(workspace) +
                                   align_up((size_t)p.hidden * p.hidden * sizeof(E)));
  const int threads = 256;
  const int64_t total = (int64_t)p.hidden * p.hidden;
  const int64_t blocks_needed = (total + threads - 1) / threads;
  const int copy_blocks = blocks_needed < 4096 ? (int)blocks_needed : 4096; /* grid-stride beyond */
  copy_matrix_kernel<E><<<copy_blocks, threads, 0, stream>>>(static_cast<const E *>(p.a), p.a_stride_row,
                                                            p.a_stride_col, p.hidden, a);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  const int rows_per_block = threads / 32;
  const int blocks = (p.hidden + rows_per_block - 1) / rows_per_block;
  for (int s = 0; s < p.steps; ++s) {
    stepwise_rnn_kernel<ElmanCell, E><<<blocks, threads, 0, stream>>>(p, a, state, s);
    err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

/* Runs all steps on `stream`; returns the first CUDA error. */
static cudaError_t launch_stepwise(prnn_dtype_t dtype, const RecurrenceParams &params, void *workspace,
                                   cudaStream_t stream) {
  switch (dtype) {
    case PRNN_DTYPE_FLOAT32: return run_stepwise<float>(params, workspace, stream);
    case PRNN_DTYPE_FLOAT64: return run_stepwise<double>(params, workspace, stream);
    case PRNN_DTYPE_FLOAT16: return run_stepwise<__half>(params, workspace, stream);
    case PRNN_DTYPE_BFLOAT16: return run_stepwise<__nv_bfloat16>(params, workspace, stream);
  }
  return cudaErrorInvalidValue;
}

/* The last family: it takes every problem up to its largest hidden size, and
 * past it no family can run the problem. */
static prnn_status_t take(const ElmanRequest &request, ElmanPlan *plan, bool *taken) {
  const prnn_problem_t *pb = request.problem;
  if (pb->hidden > kMaxStepwiseHidden)
    return prnn_fail(PRNN_STATUS_NOT_SUPPORTED,
                     "hidden=%lld is larger than the largest supported hidden size, %lld",
                     (long long)pb->hidden, (long long)kMaxStepwiseHidden);
  plan->summary.tier = PRNN_TIER_STEPWISE;
  plan->summary.workspace_bytes = stepwise_workspace_bytes((int)pb->batch, (int)pb->hidden, prnn_dtype_size(pb->dtype));
  plan->summary.grid = (int)((pb->hidden + 7) / 8);
  plan->summary.block = 256;
  plan->summary.rows_per_cta = 8;
  *taken = true;
  return PRNN_STATUS_SUCCESS;
}

static prnn_status_t launch(const ElmanPlan &, const prnn_problem_t *problem, RecurrenceParams params,
                            InputProjection, void *workspace, cudaStream_t stream) {
  const cudaError_t err = launch_stepwise(problem->dtype, params, workspace, stream);
  if (err != cudaSuccess) return cuda_fail(err, "stepwise_rnn_kernel launch");
  return PRNN_STATUS_SUCCESS;
}

extern const ElmanFamily stepwise_family = {take, launch, false, false};

prnn_status_t load_stepwise_kernels() {
  return for_each_element_type([](auto element) {
    using E = decltype(element);
    return load_kernels(copy_matrix_kernel<E>, stepwise_rnn_kernel<ElmanCell, E>);
  });
}

}  // namespace prnn
