/*
 * prnn_internal.h - helpers shared by the CPU and CUDA implementations of
 * prnn.h. Not part of the public API.
 */
#ifndef PRNN_INTERNAL_H
#define PRNN_INTERNAL_H

#include "prnn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Records the detail returned by prnn_last_error() (printf-style, thread-local,
 * truncated to a few hundred characters) and returns `status`, so that a check
 * reads:  if (bad) return prnn_fail(PRNN_STATUS_BAD_PARAM, "hidden=%lld < 1", h); */
prnn_status_t prnn_fail(prnn_status_t status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Clears prnn_last_error(); every entry point calls it first. */
void prnn_clear_error(void);

/* PRNN_DISABLE_CLUSTER_TIER set (to anything but empty or "0"): plan as on
 * GPUs without clusters, so that their path is testable on sm_90 too. */
int prnn_cluster_tier_disabled(void);

/* Which passes of float32 LSTM and GRU layers the float32 grid family
 * (gated_ffma.cu) may take: 1, the forward (the default: its backward is
 * slower than the persistent family's, bench/NOTES.md step 75); 2, both
 * (PRNN_GATED_FFMA=1, for its tests); 0, neither (PRNN_GATED_FFMA=0). */
int prnn_gated_ffma_passes(void);

/* Size in bytes of one element of a dtype (0 for an invalid dtype). */
size_t prnn_dtype_size(prnn_dtype_t dtype);

/* Gates per hidden unit (Elman 1, LSTM 4, GRU 3; 0 for an invalid cell), values
 * per hidden unit the gated forward saves (PRNN_*_SAVED; 0 for Elman), and the
 * width S of the state h (proj_size when set, else hidden). */
int prnn_cell_gates(prnn_cell_t cell);
int prnn_cell_saved(prnn_cell_t cell);
int64_t prnn_state_size(const prnn_problem_t *problem);

/* Validate the problem, and the args of a pass against it: enums in range,
 * sizes >= 1, non-NULL pointers, non-negative strides (0 broadcasts), a
 * lengths pointer iff problem->has_lengths. They do not read tensor memory. */
prnn_status_t prnn_check_problem(const prnn_problem_t *problem);
prnn_status_t prnn_check_forward_args(const prnn_problem_t *problem,
                                      const prnn_forward_args_t *args);
prnn_status_t prnn_check_backward_args(const prnn_problem_t *problem,
                                       const prnn_backward_args_t *args);
prnn_status_t prnn_check_layer_args(const prnn_problem_t *problem,
                                    const prnn_layer_args_t *args);
prnn_status_t prnn_check_gated_forward_args(const prnn_problem_t *problem,
                                            const prnn_gated_forward_args_t *args);
prnn_status_t prnn_check_gated_backward_args(const prnn_problem_t *problem,
                                             const prnn_gated_backward_args_t *args);

/* What the CPU entry points check beyond the args checks: dtype, workspace
 * (size for the problem's cell, alignment), and the host lengths' values
 * (which the args checks do not read). */
prnn_status_t prnn_check_cpu_call(const prnn_problem_t *problem, const int32_t *lengths,
                                  const void *workspace, size_t workspace_bytes);

#ifdef __cplusplus
}
#endif

#endif /* PRNN_INTERNAL_H */
