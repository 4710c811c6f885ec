/*
 * no_cuda.c - the CUDA entry points of prnn.h for builds without CUDA: each
 * says so, so that callers get a clear error instead of a link failure.
 *
 * C99, and also valid C++17 (torch's extension build compiles .c files with g++).
 */
#include "prnn_internal.h"

static prnn_status_t not_compiled(void) {
  prnn_clear_error();
  return prnn_fail(PRNN_STATUS_NOT_COMPILED, "torch_prnn was built without CUDA");
}

static prnn_status_t no_plan(prnn_plan_t *plan) {
  if (plan != NULL) {
    plan->tier = PRNN_TIER_NONE;
    plan->workspace_bytes = 0;
    plan->grid = plan->block = plan->rows_per_cta = plan->smem_bytes = 0;
  }
  return not_compiled();
}

prnn_status_t prnn_plan_cuda(const prnn_problem_t *problem, prnn_pass_t pass, int device,
                             prnn_plan_t *plan) {
  (void)problem;
  (void)pass;
  (void)device;
  return no_plan(plan);
}

prnn_status_t prnn_plan_layer_cuda(const prnn_problem_t *problem, int64_t input, int device,
                                   prnn_plan_t *plan) {
  (void)problem;
  (void)input;
  (void)device;
  return no_plan(plan);
}

prnn_status_t prnn_layer_forward_cuda(const prnn_problem_t *problem, const prnn_layer_args_t *args,
                                      void *workspace, size_t workspace_bytes, prnn_stream_t stream) {
  (void)problem;
  (void)args;
  (void)workspace;
  (void)workspace_bytes;
  (void)stream;
  return not_compiled();
}

prnn_status_t prnn_forward_cuda(const prnn_problem_t *problem, const prnn_forward_args_t *args,
                                void *workspace, size_t workspace_bytes, prnn_stream_t stream) {
  (void)problem;
  (void)args;
  (void)workspace;
  (void)workspace_bytes;
  (void)stream;
  return not_compiled();
}

prnn_status_t prnn_backward_data_cuda(const prnn_problem_t *problem,
                                      const prnn_backward_args_t *args, void *workspace,
                                      size_t workspace_bytes, prnn_stream_t stream) {
  (void)problem;
  (void)args;
  (void)workspace;
  (void)workspace_bytes;
  (void)stream;
  return not_compiled();
}

prnn_status_t prnn_gated_forward_cuda(const prnn_problem_t *problem,
                                      const prnn_gated_forward_args_t *args, void *workspace,
                                      size_t workspace_bytes, prnn_stream_t stream) {
  (void)problem;
  (void)args;
  (void)workspace;
  (void)workspace_bytes;
  (void)stream;
  return not_compiled();
}

prnn_status_t prnn_gated_backward_data_cuda(const prnn_problem_t *problem,
                                            const prnn_gated_backward_args_t *args,
                                            void *workspace, size_t workspace_bytes,
                                            prnn_stream_t stream) {
  (void)problem;
  (void)args;
  (void)workspace;
  (void)workspace_bytes;
  (void)stream;
  return not_compiled();
}

prnn_status_t prnn_resident_plan_cuda(const prnn_resident_problem_t *problem, int device,
                                      prnn_resident_plan_t *plan) {
  (void)problem;
  (void)device;
  if (plan != NULL) {
    plan->grid = plan->block = plan->units_per_cta = plan->smem_bytes = 0;
    plan->workspace_bytes = 0;
  }
  return not_compiled();
}

prnn_status_t prnn_resident_launch_cuda(const prnn_resident_problem_t *problem,
                                        const prnn_resident_args_t *args, void *workspace,
                                        size_t workspace_bytes, prnn_stream_t stream) {
  (void)problem;
  (void)args;
  (void)workspace;
  (void)workspace_bytes;
  (void)stream;
  return not_compiled();
}
