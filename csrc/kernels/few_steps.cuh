/*
 * few_steps.cuh - a whole layer of a few steps of a small batch, one plain
 * launch a step, every cell (few_steps.cu), and the final state h_n of an
 * Elman layer another family ran: what the layer entry point (cuda_api.cu)
 * calls.
 */
#ifndef PRNN_FEW_STEPS_CUH
#define PRNN_FEW_STEPS_CUH

#include <cuda_runtime.h>

#include "prnn.h"
#include "rnn_math.cuh"

namespace prnn {

/* Whether the few-steps kernel runs this checked layer (input > 0): a few
 * steps of a small batch without lengths, where bringing W_hh on chip costs
 * more than the steps; and, beside a resident kernel (the persistent
 * families cannot run), an Elman layer of any length and batch without
 * lengths, whose input projection then needs no GEMM. Its plan: no workspace. */
bool few_steps_takes(const prnn_problem_t *problem, int64_t input, bool beside_resident);
void few_steps_plan(const prnn_problem_t *problem, prnn_plan_t *plan);

/* The layer on the stream, args checked (prnn_check_layer_args); it writes y
 * and, where given, h_n and c_n. */
prnn_status_t few_steps_layer(const prnn_problem_t *problem, const prnn_layer_args_t &args, cudaStream_t stream);

/* h_n [batch][hidden] (contiguous) from a finished Elman forward: each
 * sequence's y at its last step, h0 where its length is 0. */
prnn_status_t launch_final_state(const prnn_problem_t *problem, const RecurrenceParams &params, void *h_n,
                                 cudaStream_t stream);

}  // namespace prnn

#endif /* PRNN_FEW_STEPS_CUH */
