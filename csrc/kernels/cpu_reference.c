/*
 * cpu_reference.c - the CPU reference of prnn.h's Elman cell, and the plan
 * query and call checks of every CPU entry point (the gated cells' loops are in
 * cpu_gated.c): plain loops, float32 and float64, accumulating (and carrying
 * the state) in the tensors' own type.
 *
 * C99, and also valid C++17 (torch's extension build compiles .c files with g++):
 * explicit casts from void *, no VLAs, no restrict.
 */
#include <limits.h>
#include <math.h>
#include <stdint.h>

#include "prnn_internal.h"

/* Defines forward_<suffix> and backward_data_<suffix> for one element type.
 * A macro rather than a template so the file stays C. Arguments are already
 * checked; `ws` holds 2 x batch x hidden elements. */
#define PRNN_DEFINE_CPU_PASSES(real, suffix, tanh_fn)                                   \
  static void forward_##suffix(const prnn_problem_t *p, const prnn_forward_args_t *a,   \
                               real *ws) {                                              \
    const int64_t T = p->steps, B = p->batch, H = p->hidden;                            \
    const int relu = p->activation == PRNN_ACT_RELU;                                    \
    const real *xp = (const real *)a->xp;     /* steps x batch x hidden, strided */     \
    const real *h0 = (const real *)a->h0;     /* batch x hidden, strided */             \
    const real *w = (const real *)a->w_hh;    /* hidden x hidden, row stride */         \
    real *y = (real *)a->y;                   /* steps x batch x hidden, contiguous */  \
    real *h = ws;                             /* batch x hidden: the carried state */   \
    real *next = ws + B * H;                  /* batch x hidden: the new state */       \
    int64_t t, b, i, j;                                                                 \
    for (b = 0; b < B; ++b)                                                             \
      for (i = 0; i < H; ++i) h[b * H + i] = h0[b * a->h0_stride_b + i];                \
    for (t = 0; t < T; ++t) {                                                           \
      for (b = 0; b < B; ++b) {                                                         \
        real *yb = y + (t * B + b) * H;                                                 \
        real *hb = h + b * H, *nb = next + b * H;                                       \
        const real *xpb = xp + t * a->xp_stride_t + b * a->xp_stride_b;                 \
        if (a->lengths != NULL && t >= a->lengths[b]) { /* finished: state frozen */    \
          for (i = 0; i < H; ++i) yb[i] = 0;                                            \
          continue;                                                                     \
        }                                                                               \
        for (i = 0; i < H; ++i) { /* row i of W: contiguous */                          \
          const real *wi = w + i * a->w_hh_stride;                                      \
          real acc = xpb[i];                                                            \
          for (j = 0; j < H; ++j) acc += wi[j] * hb[j];                                 \
          /* relu written so that NaN propagates, as in torch */                        \
          nb[i] = relu ? (acc < 0 ? (real)0 : acc) : tanh_fn(acc);                      \
        }                                                                               \
        for (i = 0; i < H; ++i) hb[i] = yb[i] = nb[i];                                  \
      }                                                                                 \
    }                                                                                   \
  }                                                                                     \
                                                                                        \
  static void backward_data_##suffix(const prnn_problem_t *p,                           \
                                     const prnn_backward_args_t *a, real *ws) {         \
    const int64_t T = p->steps, B = p->batch, H = p->hidden;                            \
    const int relu = p->activation == PRNN_ACT_RELU;                                    \
    const real *gy = (const real *)a->grad_y; /* steps x batch x hidden, strided */     \
    const real *y = (const real *)a->y;       /* steps x batch x hidden, contiguous */  \
    const real *w = (const real *)a->w_hh;    /* hidden x hidden, row stride */         \
    real *gxp = (real *)a->grad_xp;           /* steps x batch x hidden, contiguous */  \
    real *g = ws;                             /* batch x hidden: W^T delta_{t+1} */     \
    real *d = ws + B * H;                     /* batch x hidden: delta_t */             \
    int64_t t, b, i, j;                                                                 \
    /* delta_T = 0. While t >= length, delta_t = 0 and so g stays 0. */                 \
    for (i = 0; i < B * H; ++i) g[i] = 0;                                               \
    for (t = T - 1; t >= 0; --t) {                                                      \
      for (b = 0; b < B; ++b) {                                                         \
        const real *yb = y + (t * B + b) * H;                                           \
        const real *gyb = gy + t * a->grad_y_stride_t + b * a->grad_y_stride_b;         \
        real *outb = gxp + (t * B + b) * H;                                             \
        real *gb = g + b * H, *db = d + b * H;                                          \
        if (a->lengths != NULL && t >= a->lengths[b]) {                                 \
          for (j = 0; j < H; ++j) outb[j] = 0;                                          \
          continue;                                                                     \
        }                                                                               \
        for (j = 0; j < H; ++j) {                                                       \
          /* relu': 0 where y <= 0, else 1 (NaN too), as torch's relu backward */       \
          const real dact = relu ? (real)!(yb[j] <= 0) : 1 - yb[j] * yb[j];             \
          outb[j] = db[j] = dact * (gyb[j] + gb[j]);                                    \
        }                                                                               \
        if (t == 0) continue; /* W^T delta_0 is grad_h0: the caller's GEMM */           \
        /* g = W^T delta_t, by rows of W so that W is read contiguously */              \
        for (j = 0; j < H; ++j) gb[j] = 0;                                              \
        for (i = 0; i < H; ++i) {                                                       \
          const real *wi = w + i * a->w_hh_stride;                                      \
          const real di = db[i];                                                        \
          for (j = 0; j < H; ++j) gb[j] += wi[j] * di;                                  \
        }                                                                               \
      }                                                                                 \
    }                                                                                   \
  }

PRNN_DEFINE_CPU_PASSES(float, f32, tanhf)
PRNN_DEFINE_CPU_PASSES(double, f64, tanh)

/* Workspace of a supported problem, in the accumulator type. Elman: the
 * carried state and the matrix-vector product, batch x hidden each. Gated
 * cells (cpu_gated.c): one sequence's gates and m = o tanh(c_t) (W_hr^T dh in
 * the backward), (gates + 1) x hidden; they carry the state in h_n and c_n
 * (grad_h0 and grad_c0). Fails for dtypes the reference does not take and for
 * sizes whose plan does not fit the types. */
static prnn_status_t cpu_workspace_bytes(const prnn_problem_t *problem, size_t *bytes) {
  const int64_t gates = prnn_cell_gates(problem->cell);
  size_t elem;
  if (problem->dtype != PRNN_DTYPE_FLOAT32 && problem->dtype != PRNN_DTYPE_FLOAT64)
    return prnn_fail(PRNN_STATUS_NOT_SUPPORTED,
                     "the CPU reference takes float32 or float64 (dtype 0 or 1), got dtype %d",
                     (int)problem->dtype);
  /* The plan's rows_per_cta, an int: gates x hidden rows of W_hh, the state's of W_hh^T. */
  if (problem->hidden > INT_MAX / gates)
    return prnn_fail(PRNN_STATUS_NOT_SUPPORTED, "hidden must be <= %d for cell %d, got %lld",
                     (int)(INT_MAX / gates), (int)problem->cell, (long long)problem->hidden);
  if (problem->proj_size > INT_MAX)
    return prnn_fail(PRNN_STATUS_NOT_SUPPORTED, "proj_size must be <= %d, got %lld", INT_MAX,
                     (long long)problem->proj_size);
  elem = prnn_dtype_size(problem->dtype);
  if (problem->cell != PRNN_CELL_ELMAN) {
    const uint64_t count = (uint64_t)(gates + 1) * (uint64_t)problem->hidden;
    if (count > SIZE_MAX / elem)
      return prnn_fail(PRNN_STATUS_NOT_SUPPORTED, "hidden = %lld is too large for a size_t workspace",
                       (long long)problem->hidden);
    *bytes = (size_t)count * elem;
    return PRNN_STATUS_SUCCESS;
  }
  if ((uint64_t)problem->batch > (SIZE_MAX / (2 * elem)) / (uint64_t)problem->hidden)
    return prnn_fail(PRNN_STATUS_NOT_SUPPORTED,
                     "batch x hidden = %lld x %lld is too large for a size_t workspace",
                     (long long)problem->batch, (long long)problem->hidden);
  *bytes = 2 * (size_t)problem->batch * (size_t)problem->hidden * elem;
  return PRNN_STATUS_SUCCESS;
}

/* Described in prnn_internal.h. */
prnn_status_t prnn_check_cpu_call(const prnn_problem_t *problem, const int32_t *lengths,
                                  const void *workspace, size_t workspace_bytes) {
  size_t need = 0;
  int64_t b;
  prnn_status_t status = cpu_workspace_bytes(problem, &need);
  if (status != PRNN_STATUS_SUCCESS) return status;
  if (workspace_bytes < need)
    return prnn_fail(PRNN_STATUS_WORKSPACE_TOO_SMALL, "workspace_bytes must be >= %zu, got %zu",
                     need, workspace_bytes);
  if (workspace == NULL) return prnn_fail(PRNN_STATUS_BAD_PARAM, "workspace must not be NULL");
  if ((uintptr_t)workspace % prnn_dtype_size(problem->dtype) != 0)
    return prnn_fail(PRNN_STATUS_BAD_PARAM, "workspace must be aligned to %zu bytes",
                     prnn_dtype_size(problem->dtype));
  for (b = 0; lengths != NULL && b < problem->batch; ++b)
    if (lengths[b] < 0 || lengths[b] > problem->steps)
      return prnn_fail(PRNN_STATUS_BAD_PARAM, "lengths[%lld] must be in [0, %lld], got %d",
                       (long long)b, (long long)problem->steps, (int)lengths[b]);
  return PRNN_STATUS_SUCCESS;
}

prnn_status_t prnn_plan_cpu(const prnn_problem_t *problem, prnn_pass_t pass,
                            prnn_plan_t *plan) {
  size_t bytes = 0;
  prnn_status_t status;
  prnn_clear_error();
  if (plan == NULL) return prnn_fail(PRNN_STATUS_BAD_PARAM, "plan must not be NULL");
  plan->tier = PRNN_TIER_NONE;
  plan->workspace_bytes = 0;
  plan->grid = plan->block = plan->rows_per_cta = plan->smem_bytes = 0;
  status = prnn_check_problem(problem);
  if (status != PRNN_STATUS_SUCCESS) return status;
  if ((int)pass != PRNN_PASS_FORWARD && (int)pass != PRNN_PASS_BACKWARD_DATA)
    return prnn_fail(PRNN_STATUS_BAD_PARAM,
                     "pass must be PRNN_PASS_FORWARD (0) or PRNN_PASS_BACKWARD_DATA (1), got %d",
                     (int)pass);
  status = cpu_workspace_bytes(problem, &bytes);
  if (status != PRNN_STATUS_SUCCESS) return status;
  plan->tier = PRNN_TIER_CPU_REFERENCE;
  plan->workspace_bytes = bytes;
  plan->grid = plan->block = 1;
  /* the rows of W_hh, or of W_hh^T in the backward (the state's width) */
  plan->rows_per_cta = pass == PRNN_PASS_FORWARD
                           ? prnn_cell_gates(problem->cell) * (int)problem->hidden
                           : (int)prnn_state_size(problem);
  return PRNN_STATUS_SUCCESS;
}

prnn_status_t prnn_forward_cpu(const prnn_problem_t *problem, const prnn_forward_args_t *args,
                               void *workspace, size_t workspace_bytes) {
  prnn_status_t status;
  prnn_clear_error();
  status = prnn_check_forward_args(problem, args);
  if (status != PRNN_STATUS_SUCCESS) return status;
  status = prnn_check_cpu_call(problem, args->lengths, workspace, workspace_bytes);
  if (status != PRNN_STATUS_SUCCESS) return status;
  if (problem->dtype == PRNN_DTYPE_FLOAT32)
    forward_f32(problem, args, (float *)workspace);
  else
    forward_f64(problem, args, (double *)workspace);
  return PRNN_STATUS_SUCCESS;
}

prnn_status_t prnn_backward_data_cpu(const prnn_problem_t *problem,
                                     const prnn_backward_args_t *args, void *workspace,
                                     size_t workspace_bytes) {
  prnn_status_t status;
  prnn_clear_error();
  status = prnn_check_backward_args(problem, args);
  if (status != PRNN_STATUS_SUCCESS) return status;
  status = prnn_check_cpu_call(problem, args->lengths, workspace, workspace_bytes);
  if (status != PRNN_STATUS_SUCCESS) return status;
  if (problem->dtype == PRNN_DTYPE_FLOAT32)
    backward_data_f32(problem, args, (float *)workspace);
  else
    backward_data_f64(problem, args, (double *)workspace);
  return PRNN_STATUS_SUCCESS;
}
