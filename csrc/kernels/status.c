/*
 * status.c - status and tier names, the thread-local error detail, and the
 * argument checks shared by every implementation of prnn.h.
 *
 * C99, and also valid C++17: torch's extension build compiles .c files with g++.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "prnn_internal.h"

/* Thread-local storage: C++11 keyword, C11 keyword, else the GNU/MSVC extensions
 * (plain C99 has none of its own). */
#if defined(__cplusplus)
#define PRNN_THREAD_LOCAL thread_local
#elif defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L
#define PRNN_THREAD_LOCAL _Thread_local
#elif defined(__GNUC__)
#define PRNN_THREAD_LOCAL __thread
#elif defined(_MSC_VER)
#define PRNN_THREAD_LOCAL __declspec(thread)
#else
#error "no thread-local storage keyword known for this compiler"
#endif

static PRNN_THREAD_LOCAL char last_error[512];

const char *prnn_status_string(prnn_status_t status) {
  switch (status) {
    case PRNN_STATUS_SUCCESS: return "PRNN_STATUS_SUCCESS";
    case PRNN_STATUS_BAD_PARAM: return "PRNN_STATUS_BAD_PARAM";
    case PRNN_STATUS_NOT_SUPPORTED: return "PRNN_STATUS_NOT_SUPPORTED";
    case PRNN_STATUS_WORKSPACE_TOO_SMALL: return "PRNN_STATUS_WORKSPACE_TOO_SMALL";
    case PRNN_STATUS_CUDA_ERROR: return "PRNN_STATUS_CUDA_ERROR";
    case PRNN_STATUS_NOT_COMPILED: return "PRNN_STATUS_NOT_COMPILED";
  }
  return "PRNN_STATUS_UNKNOWN";
}

const char *prnn_tier_string(prnn_tier_t tier) {
  switch (tier) {
    case PRNN_TIER_NONE: return "none";
    case PRNN_TIER_CPU_REFERENCE: return "cpu_reference";
    case PRNN_TIER_PERSISTENT_REGISTERS: return "persistent_registers";
    case PRNN_TIER_PERSISTENT_SHARED: return "persistent_shared";
    case PRNN_TIER_STEPWISE: return "stepwise";
    case PRNN_TIER_PERSISTENT_CLUSTER: return "persistent_cluster";
    case PRNN_TIER_PERSISTENT_CLUSTER_GRID: return "persistent_cluster_grid";
    case PRNN_TIER_FEW_STEPS: return "few_steps";
  }
  return "unknown";
}

const char *prnn_last_error(void) { return last_error; }

void prnn_clear_error(void) { last_error[0] = '\0'; }

int prnn_cluster_tier_disabled(void) {
  const char *v = getenv("PRNN_DISABLE_CLUSTER_TIER");
  return v != NULL && v[0] != '\0' && strcmp(v, "0") != 0;
}

int prnn_gated_ffma_passes(void) {
  const char *v = getenv("PRNN_GATED_FFMA");
  if (v == NULL || v[0] == '\0') return 1;
  return strcmp(v, "0") == 0 ? 0 : strcmp(v, "1") == 0 ? 2 : 1;
}

prnn_status_t prnn_fail(prnn_status_t status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap); /* truncates, always terminates */
  va_end(ap);
  return status;
}

size_t prnn_dtype_size(prnn_dtype_t dtype) {
  switch (dtype) {
    case PRNN_DTYPE_FLOAT32: return 4;
    case PRNN_DTYPE_FLOAT64: return 8;
    case PRNN_DTYPE_FLOAT16: return 2;
    case PRNN_DTYPE_BFLOAT16: return 2;
  }
  return 0;
}

/* The checks below fail on the first bad argument and name it. Enums are
 * compared as int: a caller may hand us any integer in an enum field. */

static prnn_status_t check_size(const char *name, int64_t value) {
  if (value < 1)
    return prnn_fail(PRNN_STATUS_BAD_PARAM, "%s must be >= 1, got %lld", name, (long long)value);
  return PRNN_STATUS_SUCCESS;
}

static prnn_status_t check_stride(const char *name, int64_t value) {
  if (value < 0)
    return prnn_fail(PRNN_STATUS_BAD_PARAM, "%s must be >= 0, got %lld", name, (long long)value);
  return PRNN_STATUS_SUCCESS;
}

static prnn_status_t check_pointer(const char *name, const void *p) {
  if (p == NULL) return prnn_fail(PRNN_STATUS_BAD_PARAM, "%s must not be NULL", name);
  return PRNN_STATUS_SUCCESS;
}

static prnn_status_t check_lengths(const prnn_problem_t *problem, const int32_t *lengths) {
  if (problem->has_lengths && lengths == NULL)
    return prnn_fail(PRNN_STATUS_BAD_PARAM, "lengths must not be NULL when has_lengths is %d",
                     problem->has_lengths);
  if (!problem->has_lengths && lengths != NULL)
    return prnn_fail(PRNN_STATUS_BAD_PARAM, "lengths must be NULL when has_lengths is 0");
  return PRNN_STATUS_SUCCESS;
}

/* Evaluates a check and returns its status from the enclosing function if it failed. */
#define PRNN_TRY(check)                           \
  do {                                            \
    prnn_status_t try_status_ = (check);          \
    if (try_status_ != PRNN_STATUS_SUCCESS) return try_status_; \
  } while (0)

int prnn_cell_gates(prnn_cell_t cell) {
  switch (cell) {
    case PRNN_CELL_ELMAN: return 1;
    case PRNN_CELL_LSTM: return PRNN_LSTM_GATES;
    case PRNN_CELL_GRU: return PRNN_GRU_GATES;
  }
  return 0;
}

int prnn_cell_saved(prnn_cell_t cell) {
  return cell == PRNN_CELL_LSTM ? PRNN_LSTM_SAVED : cell == PRNN_CELL_GRU ? PRNN_GRU_SAVED : 0;
}

int64_t prnn_state_size(const prnn_problem_t *problem) {
  return problem->proj_size > 0 ? problem->proj_size : problem->hidden;
}

prnn_status_t prnn_check_problem(const prnn_problem_t *problem) {
  PRNN_TRY(check_pointer("problem", problem));
  if (prnn_cell_gates(problem->cell) == 0)
    return prnn_fail(PRNN_STATUS_BAD_PARAM,
                     "cell must be PRNN_CELL_ELMAN (0), PRNN_CELL_LSTM (1) or PRNN_CELL_GRU (2), "
                     "got %d",
                     (int)problem->cell);
  if ((int)problem->activation != PRNN_ACT_TANH && (int)problem->activation != PRNN_ACT_RELU)
    return prnn_fail(PRNN_STATUS_BAD_PARAM,
                     "activation must be PRNN_ACT_TANH (0) or PRNN_ACT_RELU (1), got %d",
                     (int)problem->activation);
  if (prnn_dtype_size(problem->dtype) == 0)
    return prnn_fail(PRNN_STATUS_BAD_PARAM,
                     "dtype must be a prnn_dtype_t (0 float32, 1 float64, 2 float16, "
                     "3 bfloat16), got %d",
                     (int)problem->dtype);
  PRNN_TRY(check_size("steps", problem->steps));
  PRNN_TRY(check_size("batch", problem->batch));
  PRNN_TRY(check_size("hidden", problem->hidden));
  if (problem->proj_size < 0)
    return prnn_fail(PRNN_STATUS_BAD_PARAM, "proj_size must be >= 0, got %lld",
                     (long long)problem->proj_size);
  if (problem->proj_size != 0 && (int)problem->cell != PRNN_CELL_LSTM)
    return prnn_fail(PRNN_STATUS_BAD_PARAM,
                     "proj_size must be 0 for cell %d (only an LSTM has a projection), got %lld",
                     (int)problem->cell, (long long)problem->proj_size);
  return PRNN_STATUS_SUCCESS;
}

/* The Elman entry points take only the Elman cell; the gated ones only LSTM and GRU. */
static prnn_status_t check_elman(const prnn_problem_t *problem) {
  PRNN_TRY(prnn_check_problem(problem));
  if ((int)problem->cell != PRNN_CELL_ELMAN)
    return prnn_fail(PRNN_STATUS_BAD_PARAM,
                     "cell must be PRNN_CELL_ELMAN (0) here (the gated cells run through "
                     "prnn_gated_*), got %d",
                     (int)problem->cell);
  return PRNN_STATUS_SUCCESS;
}

static prnn_status_t check_gated(const prnn_problem_t *problem) {
  PRNN_TRY(prnn_check_problem(problem));
  if ((int)problem->cell != PRNN_CELL_LSTM && (int)problem->cell != PRNN_CELL_GRU)
    return prnn_fail(PRNN_STATUS_BAD_PARAM,
                     "cell must be PRNN_CELL_LSTM (1) or PRNN_CELL_GRU (2) in the gated passes, "
                     "got %d",
                     (int)problem->cell);
  return PRNN_STATUS_SUCCESS;
}

/* The recurrence's own tensors, as the forward and the whole layer take them. */
static prnn_status_t check_recurrence(const prnn_problem_t *problem, const void *h0, int64_t h0_stride_b,
                                      const void *w_hh, int64_t w_hh_stride, const int32_t *lengths,
                                      const void *y) {
  PRNN_TRY(check_pointer("h0", h0));
  PRNN_TRY(check_stride("h0_stride_b", h0_stride_b));
  PRNN_TRY(check_pointer("w_hh", w_hh));
  PRNN_TRY(check_stride("w_hh_stride", w_hh_stride));
  PRNN_TRY(check_lengths(problem, lengths));
  PRNN_TRY(check_pointer("y", y));
  return PRNN_STATUS_SUCCESS;
}

/* The args checks validate the problem first, so one call covers an entry point. */
prnn_status_t prnn_check_forward_args(const prnn_problem_t *problem,
                                      const prnn_forward_args_t *args) {
  PRNN_TRY(check_elman(problem));
  PRNN_TRY(check_pointer("args", args));
  PRNN_TRY(check_pointer("xp", args->xp));
  PRNN_TRY(check_stride("xp_stride_t", args->xp_stride_t));
  PRNN_TRY(check_stride("xp_stride_b", args->xp_stride_b));
  return check_recurrence(problem, args->h0, args->h0_stride_b, args->w_hh, args->w_hh_stride, args->lengths,
                          args->y);
}

prnn_status_t prnn_check_backward_args(const prnn_problem_t *problem,
                                       const prnn_backward_args_t *args) {
  PRNN_TRY(check_elman(problem));
  PRNN_TRY(check_pointer("args", args));
  PRNN_TRY(check_pointer("grad_y", args->grad_y));
  PRNN_TRY(check_stride("grad_y_stride_t", args->grad_y_stride_t));
  PRNN_TRY(check_stride("grad_y_stride_b", args->grad_y_stride_b));
  PRNN_TRY(check_pointer("y", args->y));
  PRNN_TRY(check_pointer("w_hh", args->w_hh));
  PRNN_TRY(check_stride("w_hh_stride", args->w_hh_stride));
  PRNN_TRY(check_lengths(problem, args->lengths));
  PRNN_TRY(check_pointer("grad_xp", args->grad_xp));
  return PRNN_STATUS_SUCCESS;
}

static prnn_status_t check_presence(const char *name, const void *p, const char *stride_name,
                                    int64_t stride, int required, const char *when);

prnn_status_t prnn_check_layer_args(const prnn_problem_t *problem, const prnn_layer_args_t *args) {
  int lstm;
  PRNN_TRY(prnn_check_problem(problem));
  PRNN_TRY(check_pointer("args", args));
  lstm = (int)problem->cell == PRNN_CELL_LSTM;
  PRNN_TRY(check_pointer("x", args->x));
  PRNN_TRY(check_stride("x_stride_t", args->x_stride_t));
  PRNN_TRY(check_stride("x_stride_b", args->x_stride_b));
  PRNN_TRY(check_size("input", args->input));
  PRNN_TRY(check_pointer("w_ih", args->w_ih));
  PRNN_TRY(check_stride("w_ih_stride", args->w_ih_stride));
  if ((args->b_ih == NULL) != (args->b_hh == NULL))
    return prnn_fail(PRNN_STATUS_BAD_PARAM, "b_ih and b_hh must both be NULL or both be given");
  PRNN_TRY(check_presence("c0", args->c0, "c0_stride_b", args->c0_stride_b, lstm,
                          lstm ? "for an LSTM" : "but for an LSTM"));
  if (!lstm && args->c_n != NULL) return prnn_fail(PRNN_STATUS_BAD_PARAM, "c_n must be NULL but for an LSTM");
  return check_recurrence(problem, args->h0, args->h0_stride_b, args->w_hh, args->w_hh_stride, args->lengths,
                          args->y);
}

/* A pointer the cell requires (`required`), or one it must leave NULL; `when`
 * completes the message ("for an LSTM"). A given pointer's stride must be >= 0. */
static prnn_status_t check_presence(const char *name, const void *p, const char *stride_name,
                                    int64_t stride, int required, const char *when) {
  if (required && p == NULL)
    return prnn_fail(PRNN_STATUS_BAD_PARAM, "%s must not be NULL %s", name, when);
  if (!required && p != NULL)
    return prnn_fail(PRNN_STATUS_BAD_PARAM, "%s must be NULL %s", name, when);
  if (p != NULL && stride_name != NULL) PRNN_TRY(check_stride(stride_name, stride));
  return PRNN_STATUS_SUCCESS;
}

/* An optional pointer (NULL: zero): its stride is checked when it is given. */
static prnn_status_t check_optional(const void *p, const char *stride_name, int64_t stride) {
  if (p != NULL) PRNN_TRY(check_stride(stride_name, stride));
  return PRNN_STATUS_SUCCESS;
}

static const char *cell_words(int lstm) { return lstm ? "for an LSTM" : "for a GRU"; }

static const char *proj_words(int proj) {
  return proj ? "with proj_size > 0" : "without a projection (proj_size 0)";
}

prnn_status_t prnn_check_gated_forward_args(const prnn_problem_t *problem,
                                            const prnn_gated_forward_args_t *args) {
  int lstm, proj;
  PRNN_TRY(check_gated(problem));
  PRNN_TRY(check_pointer("args", args));
  lstm = (int)problem->cell == PRNN_CELL_LSTM;
  proj = problem->proj_size > 0;
  PRNN_TRY(check_pointer("xp", args->xp));
  PRNN_TRY(check_stride("xp_stride_t", args->xp_stride_t));
  PRNN_TRY(check_stride("xp_stride_b", args->xp_stride_b));
  PRNN_TRY(check_pointer("h0", args->h0));
  PRNN_TRY(check_stride("h0_stride_b", args->h0_stride_b));
  PRNN_TRY(check_presence("c0", args->c0, "c0_stride_b", args->c0_stride_b, lstm, cell_words(lstm)));
  PRNN_TRY(check_pointer("w_hh", args->w_hh));
  PRNN_TRY(check_stride("w_hh_stride", args->w_hh_stride));
  PRNN_TRY(check_presence("w_hr", args->w_hr, "w_hr_stride", args->w_hr_stride, proj, proj_words(proj)));
  PRNN_TRY(check_lengths(problem, args->lengths));
  PRNN_TRY(check_pointer("y", args->y));
  PRNN_TRY(check_pointer("h_n", args->h_n));
  return check_presence("c_n", args->c_n, NULL, 0, lstm, cell_words(lstm));
}

prnn_status_t prnn_check_gated_backward_args(const prnn_problem_t *problem,
                                             const prnn_gated_backward_args_t *args) {
  int lstm, proj;
  PRNN_TRY(check_gated(problem));
  PRNN_TRY(check_pointer("args", args));
  lstm = (int)problem->cell == PRNN_CELL_LSTM;
  proj = problem->proj_size > 0;
  PRNN_TRY(check_pointer("grad_y", args->grad_y));
  PRNN_TRY(check_stride("grad_y_stride_t", args->grad_y_stride_t));
  PRNN_TRY(check_stride("grad_y_stride_b", args->grad_y_stride_b));
  PRNN_TRY(check_optional(args->grad_h_n, "grad_h_n_stride_b", args->grad_h_n_stride_b));
  if (lstm)
    PRNN_TRY(check_optional(args->grad_c_n, "grad_c_n_stride_b", args->grad_c_n_stride_b));
  else
    PRNN_TRY(check_presence("grad_c_n", args->grad_c_n, NULL, 0, 0, cell_words(lstm)));
  PRNN_TRY(check_pointer("h0", args->h0));
  PRNN_TRY(check_stride("h0_stride_b", args->h0_stride_b));
  PRNN_TRY(check_presence("c0", args->c0, "c0_stride_b", args->c0_stride_b, lstm, cell_words(lstm)));
  PRNN_TRY(check_pointer("y", args->y));
  PRNN_TRY(check_pointer("saved", args->saved));
  PRNN_TRY(check_pointer("w_hh", args->w_hh));
  PRNN_TRY(check_stride("w_hh_stride", args->w_hh_stride));
  PRNN_TRY(check_presence("w_hr", args->w_hr, "w_hr_stride", args->w_hr_stride, proj, proj_words(proj)));
  PRNN_TRY(check_lengths(problem, args->lengths));
  PRNN_TRY(check_pointer("grad_xp", args->grad_xp));
  PRNN_TRY(check_presence("grad_hh", args->grad_hh, NULL, 0, !lstm, cell_words(lstm)));
  PRNN_TRY(check_presence("grad_h", args->grad_h, NULL, 0, proj, proj_words(proj)));
  PRNN_TRY(check_pointer("grad_h0", args->grad_h0));
  return check_presence("grad_c0", args->grad_c0, NULL, 0, lstm, cell_words(lstm));
}
