/*
 * few_steps.cuh - a whole Elman layer of a few steps of a small batch, one
 * plain launch a step (few_steps.cu), and the final state h_n of a layer
 * another family ran: what the layer entry point (cuda_api.cu) calls.
 */
#ifndef PRNN_FEW_STEPS_CUH
#define PRNN_FEW_STEPS_CUH

#include <cuda_runtime.h>

#include "prnn.h"
#include "projection.cuh"
#include "rnn_math.cuh"

namespace prnn {

/* Whether the few-steps kernel runs this checked Elman layer (input > 0):
 * a few steps of a small batch without lengths, where bringing W_hh on chip
 * costs more than the steps. Its plan: no workspace. */
bool few_steps_takes(const prnn_problem_t *problem, int64_t input);
void few_steps_plan(const prnn_problem_t *problem, prnn_plan_t *plan);

/* The layer on the stream: params and proj as the layer entry point filled
 * them, h_n (batch x hidden, contiguous) written by the last step, or NULL. */
prnn_status_t few_steps_layer(const prnn_problem_t *problem, const RecurrenceParams &params,
                              const InputProjection &proj, void *h_n, cudaStream_t stream);

/* h_n [batch][hidden] (contiguous) from a finished forward: each sequence's
 * y at its last step, h0 where its length is 0. */
prnn_status_t launch_final_state(const prnn_problem_t *problem, const RecurrenceParams &params, void *h_n,
                                 cudaStream_t stream);

}  // namespace prnn

#endif /* PRNN_FEW_STEPS_CUH */
