/*
 * gated.cuh - the CUDA families of the gated cells (LSTM, GRU): their plan,
 * called by prnn_plan_cuda for problem->cell != PRNN_CELL_ELMAN.
 */
#ifndef PRNN_GATED_CUH
#define PRNN_GATED_CUH

#include "prnn.h"

namespace prnn {

/* The plan of a checked gated problem on `device` (the current device). */
prnn_status_t gated_plan(const prnn_problem_t *problem, prnn_pass_t pass, int device, prnn_plan_t *plan);

}  // namespace prnn

#endif /* PRNN_GATED_CUH */
