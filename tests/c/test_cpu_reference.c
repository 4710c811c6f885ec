/*
 * test_cpu_reference.c - checks the CPU reference of prnn.h against a naive
 * double-precision loop written here, and checks every error path.
 *
 * Standalone C99 (no torch): built and run by `make ctest`. Prints one line per
 * group and exits non-zero on any failure.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "prnn.h"

static int failures = 0;

/* ---- fixed-seed PRNG (splitmix64) ---- */

static uint64_t rng_state = 0x5eed5eed12345678ull;

static double uniform(void) { /* in [-1, 1) */
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return (double)(z >> 11) / 4503599627370496.0 - 1.0; /* 2^52 */
}

static int64_t rand_below(int64_t n) { return (int64_t)((uniform() + 1.0) * 0.5 * (double)n); }

/* ---- buffers in the dtype under test ---- */

static void *xmalloc(size_t bytes) {
  void *p = malloc(bytes > 0 ? bytes : 1);
  if (p == NULL) {
    fprintf(stderr, "out of memory\n");
    exit(2);
  }
  return p;
}

static size_t elem_size(prnn_dtype_t dtype) { return dtype == PRNN_DTYPE_FLOAT64 ? 8 : 4; }

static void put(prnn_dtype_t dtype, void *base, int64_t i, double v) {
  if (dtype == PRNN_DTYPE_FLOAT64)
    ((double *)base)[i] = v;
  else
    ((float *)base)[i] = (float)v;
}

static double get(prnn_dtype_t dtype, const void *base, int64_t i) {
  return dtype == PRNN_DTYPE_FLOAT64 ? ((const double *)base)[i] : ((const float *)base)[i];
}

/* Random buffer of n elements (padding included: the kernel must not care). */
static void *random_buffer(prnn_dtype_t dtype, int64_t n, double scale) {
  void *p = xmalloc((size_t)n * elem_size(dtype));
  int64_t i;
  for (i = 0; i < n; ++i) put(dtype, p, i, scale * uniform());
  return p;
}

static void poison(prnn_dtype_t dtype, void *p, int64_t n) {
  int64_t i;
  for (i = 0; i < n; ++i) put(dtype, p, i, NAN);
}

/* Elements spanned by a [T x B x H] view with the given strides. */
static int64_t extent(int64_t T, int64_t B, int64_t H, int64_t st, int64_t sb) {
  return (T - 1) * st + (B - 1) * sb + H;
}

/* ---- the naive double-precision reference ---- */

static double act(prnn_activation_t a, double v) { return a == PRNN_ACT_RELU ? (v > 0 ? v : 0) : tanh(v); }

static double act_grad_from_output(prnn_activation_t a, double y) {
  return a == PRNN_ACT_RELU ? (y > 0 ? 1.0 : 0.0) : 1.0 - y * y;
}

/* ---- one numerical case ---- */

typedef struct {
  const char *name;
  int64_t xp_st, xp_sb, h0_sb, w_s, gy_st, gy_sb; /* strides */
} layout_t;

/* relative error ||out - ref|| / ||ref|| (absolute when ref is zero) */
typedef struct {
  double diff2, ref2;
} err_t;

static double rel_err(err_t e) { return e.ref2 > 0 ? sqrt(e.diff2 / e.ref2) : sqrt(e.diff2); }

/* Runs forward and backward-data on one size and layout; returns 0 if all is well.
 * Adds the errors of forward and backward into fe and be. */
static int run_case(prnn_dtype_t dtype, prnn_activation_t activation, int64_t T, int64_t B,
                    int64_t H, int has_lengths, const layout_t *L, err_t *fe, err_t *be) {
  const int64_t n_out = T * B * H;
  const int64_t n_xp = extent(T, B, H, L->xp_st, L->xp_sb);
  const int64_t n_h0 = (B - 1) * L->h0_sb + H, n_w = (H - 1) * L->w_s + H;
  const int64_t n_gy = extent(T, B, H, L->gy_st, L->gy_sb);
  prnn_problem_t problem;
  prnn_forward_args_t fa;
  prnn_backward_args_t ba;
  prnn_plan_t plan;
  void *xp, *h0, *w, *gy, *y, *y_in, *gxp, *ws;
  double *hist, *ref_y, *ref_d;
  int32_t *lengths = (int32_t *)xmalloc((size_t)B * sizeof(int32_t));
  int64_t t, b, i, j;
  int bad = 0;

  problem.cell = PRNN_CELL_ELMAN;
  problem.activation = activation;
  problem.dtype = dtype;
  problem.steps = T;
  problem.batch = B;
  problem.hidden = H;
  problem.has_lengths = has_lengths;

  /* lengths: first 0, last T, others random (B = 1 gets T) */
  for (b = 0; b < B; ++b)
    lengths[b] = (int32_t)(b == B - 1 ? T : b == 0 ? 0 : rand_below(T + 1));

  xp = random_buffer(dtype, n_xp, 1.0);
  h0 = random_buffer(dtype, n_h0, 1.0);
  w = random_buffer(dtype, n_w, 1.0 / sqrt((double)H));
  gy = random_buffer(dtype, n_gy, 1.0);
  y = xmalloc((size_t)n_out * elem_size(dtype));
  y_in = xmalloc((size_t)n_out * elem_size(dtype));
  gxp = xmalloc((size_t)n_out * elem_size(dtype));
  hist = (double *)xmalloc((size_t)((T + 1) * B * H) * sizeof(double));
  ref_y = (double *)xmalloc((size_t)n_out * sizeof(double));
  ref_d = (double *)xmalloc((size_t)((T + 1) * B * H) * sizeof(double));

  if (prnn_plan_cpu(&problem, PRNN_PASS_FORWARD, &plan) != PRNN_STATUS_SUCCESS) {
    printf("  plan failed: %s\n", prnn_last_error());
    exit(1);
  }
  ws = xmalloc(plan.workspace_bytes);

  /* Reference forward on the inputs as the kernel sees them (rounded to dtype).
   * hist[t + 1] is the state after step t; hist[0] = h0. */
  for (b = 0; b < B; ++b) {
    const int64_t len = has_lengths ? lengths[b] : T;
    for (i = 0; i < H; ++i) hist[b * H + i] = get(dtype, h0, b * L->h0_sb + i);
    for (t = 0; t < T; ++t) {
      const double *prev = hist + (t * B + b) * H;
      double *cur = hist + ((t + 1) * B + b) * H;
      for (i = 0; i < H; ++i) {
        double a = get(dtype, xp, t * L->xp_st + b * L->xp_sb + i);
        for (j = 0; j < H; ++j) a += get(dtype, w, i * L->w_s + j) * prev[j];
        cur[i] = t < len ? act(activation, a) : prev[i];
        ref_y[(t * B + b) * H + i] = t < len ? cur[i] : 0.0;
      }
    }
  }

  /* Kernel forward, outputs and workspace poisoned. */
  poison(dtype, y, n_out);
  poison(dtype, ws, (int64_t)(plan.workspace_bytes / elem_size(dtype)));
  fa.xp = xp;
  fa.xp_stride_t = L->xp_st;
  fa.xp_stride_b = L->xp_sb;
  fa.h0 = h0;
  fa.h0_stride_b = L->h0_sb;
  fa.w_hh = w;
  fa.w_hh_stride = L->w_s;
  fa.lengths = has_lengths ? lengths : NULL;
  fa.y = y;
  if (prnn_forward_cpu(&problem, &fa, ws, plan.workspace_bytes) != PRNN_STATUS_SUCCESS) {
    printf("  forward failed: %s\n", prnn_last_error());
    bad = 1;
  }

  /* The backward takes the reference y, rounded to dtype, so it is tested on its own. */
  for (i = 0; i < n_out; ++i) put(dtype, y_in, i, ref_y[i]);

  /* Reference backward by explicit recursion; ref_d[T] = 0. act' uses the y
   * the kernel is given, as the API defines it. */
  for (i = 0; i < B * H; ++i) ref_d[T * B * H + i] = 0.0;
  for (t = T - 1; t >= 0; --t)
    for (b = 0; b < B; ++b) {
      const int64_t len = has_lengths ? lengths[b] : T;
      const double *next = ref_d + ((t + 1) * B + b) * H;
      double *cur = ref_d + (t * B + b) * H;
      for (j = 0; j < H; ++j) {
        double g = get(dtype, gy, t * L->gy_st + b * L->gy_sb + j);
        for (i = 0; i < H; ++i) g += get(dtype, w, i * L->w_s + j) * next[i];
        cur[j] = t < len ? act_grad_from_output(activation, get(dtype, y_in, (t * B + b) * H + j)) * g
                         : 0.0;
      }
    }

  poison(dtype, gxp, n_out);
  poison(dtype, ws, (int64_t)(plan.workspace_bytes / elem_size(dtype)));
  ba.grad_y = gy;
  ba.grad_y_stride_t = L->gy_st;
  ba.grad_y_stride_b = L->gy_sb;
  ba.y = y_in;
  ba.w_hh = w;
  ba.w_hh_stride = L->w_s;
  ba.lengths = has_lengths ? lengths : NULL;
  ba.grad_xp = gxp;
  if (prnn_backward_data_cpu(&problem, &ba, ws, plan.workspace_bytes) != PRNN_STATUS_SUCCESS) {
    printf("  backward failed: %s\n", prnn_last_error());
    bad = 1;
  }

  /* Every element written and finite; exactly zero past a length; error norms. */
  for (t = 0; t < T; ++t)
    for (b = 0; b < B; ++b)
      for (i = 0; i < H; ++i) {
        const int64_t k = (t * B + b) * H + i;
        const double yo = get(dtype, y, k), go = get(dtype, gxp, k);
        const int past = has_lengths && t >= lengths[b];
        if (!isfinite(yo) || !isfinite(go) || (past && (yo != 0.0 || go != 0.0))) bad = 1;
        fe->diff2 += (yo - ref_y[k]) * (yo - ref_y[k]);
        fe->ref2 += ref_y[k] * ref_y[k];
        be->diff2 += (go - ref_d[k]) * (go - ref_d[k]);
        be->ref2 += ref_d[k] * ref_d[k];
      }
  if (bad)
    printf("  FAILED: T=%lld B=%lld H=%lld lengths=%d layout=%s (non-finite, unwritten, nonzero past a length, or an error)\n",
           (long long)T, (long long)B, (long long)H, has_lengths, L->name);

  free(lengths);
  free(xp);
  free(h0);
  free(w);
  free(gy);
  free(y);
  free(y_in);
  free(gxp);
  free(hist);
  free(ref_y);
  free(ref_d);
  free(ws);
  return bad;
}

static void numerical_group(prnn_dtype_t dtype, prnn_activation_t activation) {
  static const int64_t Ts[] = {1, 2, 17}, Bs[] = {1, 3}, Hs[] = {1, 7, 33};
  const double tol = dtype == PRNN_DTYPE_FLOAT64 ? 1e-12 : 1e-5;
  const char *dname = dtype == PRNN_DTYPE_FLOAT64 ? "float64" : "float32";
  const char *aname = activation == PRNN_ACT_RELU ? "relu" : "tanh";
  double worst_f = 0, worst_b = 0;
  int cases = 0, bad = 0;
  size_t ti, bi, hi, li;
  int has_lengths;
  for (ti = 0; ti < 3; ++ti)
    for (bi = 0; bi < 2; ++bi)
      for (hi = 0; hi < 3; ++hi)
        for (li = 0; li < 3; ++li)
          for (has_lengths = 0; has_lengths <= 1; ++has_lengths) {
            const int64_t T = Ts[ti], B = Bs[bi], H = Hs[hi];
            /* contiguous; padded rows and steps; batch-major xp, broadcast h0 and grad_y */
            const layout_t layouts[3] = {
                {"contiguous", B * H, H, H, H, B * H, H},
                {"padded", B * (H + 3) + 5, H + 3, H + 2, H + 7, B * (H + 1) + 2, H + 1},
                {"batch-major/stride-0", H, T * H + 1, 0, H, 0, 0}};
            err_t fe = {0, 0}, be = {0, 0};
            double ef, eb;
            int case_bad = run_case(dtype, activation, T, B, H, has_lengths, &layouts[li], &fe, &be);
            ef = rel_err(fe);
            eb = rel_err(be);
            if (ef > worst_f) worst_f = ef;
            if (eb > worst_b) worst_b = eb;
            if (!(ef < tol) || !(eb < tol)) {
              printf("  FAILED: T=%lld B=%lld H=%lld lengths=%d layout=%s: rel err forward %.3g backward %.3g\n",
                     (long long)T, (long long)B, (long long)H, has_lengths, layouts[li].name, ef, eb);
              case_bad = 1;
            }
            bad += case_bad;
            ++cases;
          }
  printf("%s %s %s: %d cases, max rel err forward %.2g backward %.2g (bound %.0e)\n",
         bad ? "FAIL" : "ok  ", dname, aname, cases, worst_f, worst_b, tol);
  failures += bad;
}

/* ---- error paths ---- */

static int error_checks = 0, error_failures = 0;

static void expect(const char *what, prnn_status_t got, prnn_status_t want) {
  const char *msg = prnn_last_error();
  ++error_checks;
  if (got != want || (want != PRNN_STATUS_SUCCESS) != (msg[0] != '\0')) {
    printf("  FAILED: %s: got %s (\"%s\"), want %s\n", what, prnn_status_string(got), msg,
           prnn_status_string(want));
    ++error_failures;
  }
}

static void error_group(void) {
  enum { T = 3, B = 2, H = 4 };
  float xp[T * B * H], h0[B * H], w[H * H], gy[T * B * H], y[T * B * H], gxp[T * B * H];
  double ws[2 * B * H]; /* big enough for float64, aligned for both */
  int32_t lengths[B] = {1, T};
  prnn_problem_t good = {PRNN_CELL_ELMAN, PRNN_ACT_TANH, PRNN_DTYPE_FLOAT32, T, B, H, 1, 0};
  prnn_forward_args_t fgood = {xp, B * H, H, h0, H, w, H, lengths, y};
  prnn_backward_args_t bgood = {gy, B * H, H, y, w, H, lengths, gxp};
  const size_t wsb = 2 * B * H * sizeof(float);
  prnn_problem_t p;
  prnn_forward_args_t fa;
  prnn_backward_args_t ba;
  prnn_plan_t plan;
  int k;
  for (k = 0; k < T * B * H; ++k) xp[k] = gy[k] = y[k] = 0.5f;
  for (k = 0; k < B * H; ++k) h0[k] = 0.25f;
  for (k = 0; k < H * H; ++k) w[k] = 0.125f;

/* Runs forward and backward-data with one change to the good problem or args. */
#define EXPECT_BOTH(what, change, want)                                     \
  do {                                                                      \
    p = good;                                                               \
    fa = fgood;                                                             \
    ba = bgood;                                                             \
    change;                                                                 \
    expect("forward: " what, prnn_forward_cpu(&p, &fa, ws, wsb), want);     \
    expect("backward: " what, prnn_backward_data_cpu(&p, &ba, ws, wsb), want); \
  } while (0)

  EXPECT_BOTH("valid call", (void)0, PRNN_STATUS_SUCCESS);
  EXPECT_BOTH("cell 1", p.cell = (prnn_cell_t)1, PRNN_STATUS_BAD_PARAM);
  EXPECT_BOTH("activation 2", p.activation = (prnn_activation_t)2, PRNN_STATUS_BAD_PARAM);
  EXPECT_BOTH("activation -1", p.activation = (prnn_activation_t)-1, PRNN_STATUS_BAD_PARAM);
  EXPECT_BOTH("dtype 4", p.dtype = (prnn_dtype_t)4, PRNN_STATUS_BAD_PARAM);
  EXPECT_BOTH("dtype float16", p.dtype = PRNN_DTYPE_FLOAT16, PRNN_STATUS_NOT_SUPPORTED);
  EXPECT_BOTH("dtype bfloat16", p.dtype = PRNN_DTYPE_BFLOAT16, PRNN_STATUS_NOT_SUPPORTED);
  EXPECT_BOTH("steps 0", p.steps = 0, PRNN_STATUS_BAD_PARAM);
  EXPECT_BOTH("batch 0", p.batch = 0, PRNN_STATUS_BAD_PARAM);
  EXPECT_BOTH("hidden 0", p.hidden = 0, PRNN_STATUS_BAD_PARAM);
  EXPECT_BOTH("hidden -5", p.hidden = -5, PRNN_STATUS_BAD_PARAM);
  EXPECT_BOTH("lengths without has_lengths", p.has_lengths = 0, PRNN_STATUS_BAD_PARAM);
  EXPECT_BOTH("has_lengths without lengths", (fa.lengths = NULL, ba.lengths = NULL),
              PRNN_STATUS_BAD_PARAM);
  EXPECT_BOTH("no lengths", (p.has_lengths = 0, fa.lengths = NULL, ba.lengths = NULL),
              PRNN_STATUS_SUCCESS);
  EXPECT_BOTH("lengths[0] = -1", lengths[0] = -1, PRNN_STATUS_BAD_PARAM);
  lengths[0] = 1;
  EXPECT_BOTH("lengths[1] = steps + 1", lengths[1] = T + 1, PRNN_STATUS_BAD_PARAM);
  lengths[1] = T;
  EXPECT_BOTH("w_hh NULL", (fa.w_hh = NULL, ba.w_hh = NULL), PRNN_STATUS_BAD_PARAM);
  EXPECT_BOTH("w_hh_stride -1", (fa.w_hh_stride = -1, ba.w_hh_stride = -1), PRNN_STATUS_BAD_PARAM);
  EXPECT_BOTH("y NULL", (fa.y = NULL, ba.y = NULL), PRNN_STATUS_BAD_PARAM);

  p = good;
  fa = fgood;
  ba = bgood;
  expect("forward: problem NULL", prnn_forward_cpu(NULL, &fa, ws, wsb), PRNN_STATUS_BAD_PARAM);
  expect("backward: problem NULL", prnn_backward_data_cpu(NULL, &ba, ws, wsb), PRNN_STATUS_BAD_PARAM);
  expect("forward: args NULL", prnn_forward_cpu(&p, NULL, ws, wsb), PRNN_STATUS_BAD_PARAM);
  expect("backward: args NULL", prnn_backward_data_cpu(&p, NULL, ws, wsb), PRNN_STATUS_BAD_PARAM);
  expect("forward: workspace NULL", prnn_forward_cpu(&p, &fa, NULL, wsb), PRNN_STATUS_BAD_PARAM);
  expect("backward: workspace NULL", prnn_backward_data_cpu(&p, &ba, NULL, wsb), PRNN_STATUS_BAD_PARAM);
  expect("forward: workspace misaligned", prnn_forward_cpu(&p, &fa, (char *)ws + 1, wsb),
         PRNN_STATUS_BAD_PARAM);
  expect("forward: workspace too small", prnn_forward_cpu(&p, &fa, ws, wsb - 1),
         PRNN_STATUS_WORKSPACE_TOO_SMALL);
  expect("backward: workspace too small", prnn_backward_data_cpu(&p, &ba, ws, wsb - 1),
         PRNN_STATUS_WORKSPACE_TOO_SMALL);
  expect("forward: workspace 0", prnn_forward_cpu(&p, &fa, ws, 0), PRNN_STATUS_WORKSPACE_TOO_SMALL);
  p.dtype = PRNN_DTYPE_FLOAT64; /* needs twice the float32 workspace */
  expect("forward: float64 with float32 workspace", prnn_forward_cpu(&p, &fa, ws, wsb),
         PRNN_STATUS_WORKSPACE_TOO_SMALL);
  p = good;

#define EXPECT_FORWARD(what, change)                                                   \
  do {                                                                                 \
    fa = fgood;                                                                        \
    change;                                                                            \
    expect("forward: " what, prnn_forward_cpu(&p, &fa, ws, wsb), PRNN_STATUS_BAD_PARAM); \
  } while (0)
#define EXPECT_BACKWARD(what, change)                                                         \
  do {                                                                                        \
    ba = bgood;                                                                               \
    change;                                                                                   \
    expect("backward: " what, prnn_backward_data_cpu(&p, &ba, ws, wsb), PRNN_STATUS_BAD_PARAM); \
  } while (0)

  EXPECT_FORWARD("xp NULL", fa.xp = NULL);
  EXPECT_FORWARD("h0 NULL", fa.h0 = NULL);
  EXPECT_FORWARD("xp_stride_t -1", fa.xp_stride_t = -1);
  EXPECT_FORWARD("xp_stride_b -3", fa.xp_stride_b = -3);
  EXPECT_FORWARD("h0_stride_b -1", fa.h0_stride_b = -1);
  EXPECT_BACKWARD("grad_y NULL", ba.grad_y = NULL);
  EXPECT_BACKWARD("grad_xp NULL", ba.grad_xp = NULL);
  EXPECT_BACKWARD("grad_y_stride_t -1", ba.grad_y_stride_t = -1);
  EXPECT_BACKWARD("grad_y_stride_b -1", ba.grad_y_stride_b = -1);

  /* A success after a failure clears the error. */
  expect("forward: problem NULL before a valid call", prnn_forward_cpu(NULL, &fgood, ws, wsb),
         PRNN_STATUS_BAD_PARAM);
  expect("forward: valid call clears the error", prnn_forward_cpu(&good, &fgood, ws, wsb),
         PRNN_STATUS_SUCCESS);

  /* The plan query. */
  p = good;
  expect("plan: valid forward", prnn_plan_cpu(&p, PRNN_PASS_FORWARD, &plan), PRNN_STATUS_SUCCESS);
  if (plan.tier != PRNN_TIER_CPU_REFERENCE || plan.workspace_bytes != wsb || plan.grid != 1 ||
      plan.block != 1 || plan.rows_per_cta != H || plan.smem_bytes != 0) {
    printf("  FAILED: plan fields: tier %s workspace %zu grid %d block %d rows %d smem %d\n",
           prnn_tier_string(plan.tier), plan.workspace_bytes, plan.grid, plan.block,
           plan.rows_per_cta, plan.smem_bytes);
    ++error_failures;
  }
  p.dtype = PRNN_DTYPE_FLOAT64;
  expect("plan: valid backward float64", prnn_plan_cpu(&p, PRNN_PASS_BACKWARD_DATA, &plan),
         PRNN_STATUS_SUCCESS);
  if (plan.workspace_bytes != 2 * B * H * sizeof(double)) {
    printf("  FAILED: plan float64 workspace %zu\n", plan.workspace_bytes);
    ++error_failures;
  }
  p = good;
  expect("plan: pass 2", prnn_plan_cpu(&p, (prnn_pass_t)2, &plan), PRNN_STATUS_BAD_PARAM);
  expect("plan: plan NULL", prnn_plan_cpu(&p, PRNN_PASS_FORWARD, NULL), PRNN_STATUS_BAD_PARAM);
  expect("plan: problem NULL", prnn_plan_cpu(NULL, PRNN_PASS_FORWARD, &plan), PRNN_STATUS_BAD_PARAM);
  p.batch = 0;
  expect("plan: batch 0", prnn_plan_cpu(&p, PRNN_PASS_FORWARD, &plan), PRNN_STATUS_BAD_PARAM);
  p = good;
  p.dtype = PRNN_DTYPE_BFLOAT16;
  expect("plan: bfloat16", prnn_plan_cpu(&p, PRNN_PASS_FORWARD, &plan), PRNN_STATUS_NOT_SUPPORTED);
  if (plan.tier != PRNN_TIER_NONE) {
    printf("  FAILED: unsupported plan has tier %s\n", prnn_tier_string(plan.tier));
    ++error_failures;
  }
  p = good;
  p.batch = INT64_MAX;
  expect("plan: huge batch", prnn_plan_cpu(&p, PRNN_PASS_FORWARD, &plan), PRNN_STATUS_NOT_SUPPORTED);

  printf("%s errors: %d checks, %d failed\n", error_failures ? "FAIL" : "ok  ", error_checks,
         error_failures);
  failures += error_failures;
}

/* ---- names ---- */

static void names_group(void) {
  static const prnn_status_t statuses[] = {
      PRNN_STATUS_SUCCESS,           PRNN_STATUS_BAD_PARAM,  PRNN_STATUS_NOT_SUPPORTED,
      PRNN_STATUS_WORKSPACE_TOO_SMALL, PRNN_STATUS_CUDA_ERROR, PRNN_STATUS_NOT_COMPILED};
  static const prnn_tier_t tiers[] = {PRNN_TIER_NONE, PRNN_TIER_CPU_REFERENCE,
                                      PRNN_TIER_PERSISTENT_REGISTERS, PRNN_TIER_PERSISTENT_SHARED,
                                      PRNN_TIER_STEPWISE, PRNN_TIER_PERSISTENT_CLUSTER,
                                      PRNN_TIER_PERSISTENT_CLUSTER_GRID};
  const char *unknown_status = prnn_status_string((prnn_status_t)99);
  const char *unknown_tier = prnn_tier_string((prnn_tier_t)99);
  int bad = 0;
  size_t i, j;
  /* Each known name is non-empty and differs from the others and from the unknown one. */
  for (i = 0; i < 6; ++i) {
    const char *s = prnn_status_string(statuses[i]);
    bad += s == NULL || s[0] == '\0' || strcmp(s, unknown_status) == 0;
    for (j = 0; j < i; ++j) bad += strcmp(s, prnn_status_string(statuses[j])) == 0;
  }
  for (i = 0; i < 7; ++i) {
    const char *s = prnn_tier_string(tiers[i]);
    bad += s == NULL || s[0] == '\0' || strcmp(s, unknown_tier) == 0;
    for (j = 0; j < i; ++j) bad += strcmp(s, prnn_tier_string(tiers[j])) == 0;
  }
  bad += strcmp(prnn_tier_string(PRNN_TIER_PERSISTENT_REGISTERS), "persistent_registers") != 0;
  bad += strcmp(prnn_tier_string(PRNN_TIER_PERSISTENT_CLUSTER), "persistent_cluster") != 0;
  bad += strcmp(prnn_tier_string(PRNN_TIER_PERSISTENT_CLUSTER_GRID), "persistent_cluster_grid") != 0;
  printf("%s names: 6 statuses, 7 tiers (e.g. %s, %s)\n", bad ? "FAIL" : "ok  ",
         prnn_status_string(PRNN_STATUS_WORKSPACE_TOO_SMALL), prnn_tier_string(PRNN_TIER_CPU_REFERENCE));
  failures += bad;
}

int main(void) {
  numerical_group(PRNN_DTYPE_FLOAT32, PRNN_ACT_TANH);
  numerical_group(PRNN_DTYPE_FLOAT32, PRNN_ACT_RELU);
  numerical_group(PRNN_DTYPE_FLOAT64, PRNN_ACT_TANH);
  numerical_group(PRNN_DTYPE_FLOAT64, PRNN_ACT_RELU);
  error_group();
  names_group();
  printf("%s\n", failures ? "test_cpu_reference: FAILED" : "test_cpu_reference: all passed");
  return failures ? 1 : 0;
}
