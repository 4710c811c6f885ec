/*
 * stepwise.cuh - the slow tier: one kernel launch per step, A re-read from
 * L2/HBM every step. It runs what the persistent kernel cannot hold on chip
 * (large hidden sizes, float64) with the same arithmetic (rnn_math.cuh).
 */
#ifndef PRNN_STEPWISE_CUH
#define PRNN_STEPWISE_CUH

#include "rnn_math.cuh"

namespace prnn {

/* Workspace of the stepwise tier: a contiguous copy of A, then 2 x batch x hidden states. */
size_t stepwise_workspace_bytes(int batch, int hidden, size_t elem_size);

/* Runs all steps on `stream`; returns the first CUDA error. */
cudaError_t launch_stepwise(prnn_dtype_t dtype, const RecurrenceParams &params,
                            void *workspace, cudaStream_t stream);

}  // namespace prnn

#endif /* PRNN_STEPWISE_CUH */
