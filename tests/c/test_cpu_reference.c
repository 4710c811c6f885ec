/*
 * test_cpu_reference.c - checks the CPU reference of prnn.h against naive
 * double-precision loops written here (Elman, LSTM with and without a
 * projection, GRU), the gated backward against central differences of the
 * forward, and every error path.
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

/* relu': torch's, which passes the gradient wherever y is not <= 0 (NaN too). */
static double act_grad_from_output(prnn_activation_t a, double y) {
  return a == PRNN_ACT_RELU ? (y <= 0 ? 0.0 : 1.0) : 1.0 - y * y;
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
  prnn_problem_t problem = {0};
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

/* ---- relu's derivative at NaN ---- */

/* One step of backward-data with y = {NaN, 0, 0.5}: the gradient passes the
 * NaN and the 0.5 (torch's relu backward) and stops at the 0. */
static void relu_nan_group(prnn_dtype_t dtype) {
  static const double y_values[3] = {NAN, 0.0, 0.5}, gy_values[3] = {2.0, 3.0, 4.0};
  static const double expected[3] = {2.0, 0.0, 4.0};
  prnn_problem_t p = {PRNN_CELL_ELMAN, PRNN_ACT_RELU, PRNN_DTYPE_FLOAT32, 1, 1, 3, 0, 0};
  double y[3], gy[3], w[9], gxp[3], ws[6]; /* float32 uses the first halves */
  prnn_backward_args_t ba;
  int i, bad = 0;
  p.dtype = dtype;
  for (i = 0; i < 3; ++i) {
    put(dtype, y, i, y_values[i]);
    put(dtype, gy, i, gy_values[i]);
  }
  for (i = 0; i < 9; ++i) put(dtype, w, i, 0.25);
  poison(dtype, gxp, 3);
  ba.grad_y = gy;
  ba.grad_y_stride_t = 3;
  ba.grad_y_stride_b = 3;
  ba.y = y;
  ba.w_hh = w;
  ba.w_hh_stride = 3;
  ba.lengths = NULL;
  ba.grad_xp = gxp;
  if (prnn_backward_data_cpu(&p, &ba, ws, 6 * elem_size(dtype)) != PRNN_STATUS_SUCCESS) {
    printf("  backward failed: %s\n", prnn_last_error());
    bad = 1;
  }
  for (i = 0; i < 3; ++i) bad |= get(dtype, gxp, i) != expected[i];
  printf("%s %s relu' at NaN: grad_xp %g %g %g (expected 2 0 4)\n", bad ? "FAIL" : "ok  ",
         dtype == PRNN_DTYPE_FLOAT64 ? "float64" : "float32", get(dtype, gxp, 0), get(dtype, gxp, 1),
         get(dtype, gxp, 2));
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

/* ---- gated cells (LSTM, GRU) ---- */

/* One gated problem's tensors in the dtype under test: inputs (strided, as a
 * caller may lay them out), upstream gradients, and the outputs of both passes. */
typedef struct {
  prnn_problem_t problem;
  int64_t G, S, SAVED; /* gates, state width, saved values per unit */
  int has_bias, has_grad_n;
  int64_t xp_st, xp_sb, h0_sb, c0_sb, w_s, wr_s, gy_st, gy_sb, ghn_sb, gcn_sb; /* strides */
  void *xp, *b_hh, *h0, *c0, *w_hh, *w_hr; /* c0 (LSTM) and w_hr (projection) or NULL */
  int32_t *lengths;
  void *gy, *gh_n, *gc_n; /* gh_n, gc_n NULL without has_grad_n; gc_n LSTM only */
  void *y, *h_n, *c_n, *saved;
  void *gxp, *ghh, *gh, *gh0, *gc0; /* ghh GRU, gh projection, gc0 LSTM only */
  void *ws;
  size_t ws_bytes;
} gated_t;

/* Sizes of the tensors, in elements. */
static int64_t n_xp(const gated_t *g) {
  return extent(g->problem.steps, g->problem.batch, g->G * g->problem.hidden, g->xp_st, g->xp_sb);
}
static int64_t n_rows(int64_t rows, int64_t stride, int64_t cols) { return (rows - 1) * stride + cols; }

static void *zeros_or_null(int want, prnn_dtype_t dtype, int64_t n) {
  return want ? xmalloc((size_t)n * elem_size(dtype)) : NULL;
}

/* layout 0: contiguous; 1: padded rows and steps; 2: batch-major xp, broadcast
 * (stride 0) h0, grad_y and grad_h_n. */
static void gated_setup(gated_t *g, prnn_dtype_t dtype, prnn_cell_t cell, int64_t T, int64_t B,
                        int64_t H, int64_t P, int has_lengths, int has_bias, int has_grad_n,
                        int layout) {
  const int lstm = cell == PRNN_CELL_LSTM;
  const int64_t G = lstm ? PRNN_LSTM_GATES : PRNN_GRU_GATES, S = P > 0 ? P : H;
  const int64_t GH = G * H, SAVED = lstm ? PRNN_LSTM_SAVED : PRNN_GRU_SAVED;
  prnn_plan_t plan;
  int64_t b;
  memset(g, 0, sizeof *g);
  g->problem.cell = cell;
  g->problem.activation = PRNN_ACT_TANH;
  g->problem.dtype = dtype;
  g->problem.steps = T;
  g->problem.batch = B;
  g->problem.hidden = H;
  g->problem.has_lengths = has_lengths;
  g->problem.proj_size = P;
  g->G = G;
  g->S = S;
  g->SAVED = SAVED;
  g->has_bias = has_bias;
  g->has_grad_n = has_grad_n;
  if (layout == 0) {
    g->xp_st = B * GH, g->xp_sb = GH, g->h0_sb = S, g->c0_sb = H, g->w_s = S, g->wr_s = H;
    g->gy_st = B * S, g->gy_sb = S, g->ghn_sb = S, g->gcn_sb = H;
  } else if (layout == 1) {
    g->xp_st = B * (GH + 3) + 5, g->xp_sb = GH + 3, g->h0_sb = S + 2, g->c0_sb = H + 1;
    g->w_s = S + 7, g->wr_s = H + 2, g->gy_st = B * (S + 1) + 2, g->gy_sb = S + 1;
    g->ghn_sb = S + 4, g->gcn_sb = H + 3;
  } else {
    g->xp_st = GH, g->xp_sb = T * GH + 1, g->h0_sb = 0, g->c0_sb = H, g->w_s = S, g->wr_s = H;
    g->gy_st = 0, g->gy_sb = 0, g->ghn_sb = 0, g->gcn_sb = H;
  }
  g->lengths = (int32_t *)xmalloc((size_t)B * sizeof(int32_t));
  /* lengths: first 0, last T, others random (B = 1 gets T) */
  for (b = 0; b < B; ++b) g->lengths[b] = (int32_t)(b == B - 1 ? T : b == 0 ? 0 : rand_below(T + 1));
  g->xp = random_buffer(dtype, n_xp(g), 1.0);
  g->b_hh = has_bias ? random_buffer(dtype, GH, 0.5) : NULL;
  g->h0 = random_buffer(dtype, n_rows(B, g->h0_sb, S), 0.5);
  g->c0 = lstm ? random_buffer(dtype, n_rows(B, g->c0_sb, H), 0.5) : NULL;
  g->w_hh = random_buffer(dtype, n_rows(GH, g->w_s, S), 1.0 / sqrt((double)S));
  g->w_hr = P > 0 ? random_buffer(dtype, n_rows(S, g->wr_s, H), 1.0 / sqrt((double)H)) : NULL;
  g->gy = random_buffer(dtype, extent(T, B, S, g->gy_st, g->gy_sb), 1.0);
  g->gh_n = has_grad_n ? random_buffer(dtype, n_rows(B, g->ghn_sb, S), 1.0) : NULL;
  g->gc_n = has_grad_n && lstm ? random_buffer(dtype, n_rows(B, g->gcn_sb, H), 1.0) : NULL;
  g->y = xmalloc((size_t)(T * B * S) * elem_size(dtype));
  g->h_n = xmalloc((size_t)(B * S) * elem_size(dtype));
  g->c_n = zeros_or_null(lstm, dtype, B * H);
  g->saved = xmalloc((size_t)(T * B * SAVED * H) * elem_size(dtype));
  g->gxp = xmalloc((size_t)(T * B * GH) * elem_size(dtype));
  g->ghh = zeros_or_null(!lstm, dtype, T * B * GH);
  g->gh = zeros_or_null(P > 0, dtype, T * B * S);
  g->gh0 = xmalloc((size_t)(B * S) * elem_size(dtype));
  g->gc0 = zeros_or_null(lstm, dtype, B * H);
  if (prnn_plan_cpu(&g->problem, PRNN_PASS_FORWARD, &plan) != PRNN_STATUS_SUCCESS) {
    printf("  gated plan failed: %s\n", prnn_last_error());
    exit(1);
  }
  g->ws_bytes = plan.workspace_bytes;
  g->ws = xmalloc(g->ws_bytes);
}

static void gated_free(gated_t *g) {
  void *all[] = {g->lengths, g->xp, g->b_hh, g->h0,  g->c0,  g->w_hh, g->w_hr, g->gy,
                 g->gh_n,    g->gc_n, g->y, g->h_n, g->c_n, g->saved, g->gxp, g->ghh,
                 g->gh,      g->gh0, g->gc0, g->ws};
  size_t k;
  for (k = 0; k < sizeof all / sizeof all[0]; ++k) free(all[k]);
}

static prnn_gated_forward_args_t gated_forward_args(const gated_t *g) {
  prnn_gated_forward_args_t a;
  memset(&a, 0, sizeof a);
  a.xp = g->xp;
  a.xp_stride_t = g->xp_st;
  a.xp_stride_b = g->xp_sb;
  a.b_hh = g->b_hh;
  a.h0 = g->h0;
  a.h0_stride_b = g->h0_sb;
  a.c0 = g->c0;
  a.c0_stride_b = g->c0_sb;
  a.w_hh = g->w_hh;
  a.w_hh_stride = g->w_s;
  a.w_hr = g->w_hr;
  a.w_hr_stride = g->wr_s;
  a.lengths = g->problem.has_lengths ? g->lengths : NULL;
  a.y = g->y;
  a.h_n = g->h_n;
  a.c_n = g->c_n;
  a.saved = g->saved;
  return a;
}

static prnn_gated_backward_args_t gated_backward_args(const gated_t *g) {
  prnn_gated_backward_args_t a;
  memset(&a, 0, sizeof a);
  a.grad_y = g->gy;
  a.grad_y_stride_t = g->gy_st;
  a.grad_y_stride_b = g->gy_sb;
  a.grad_h_n = g->gh_n;
  a.grad_h_n_stride_b = g->ghn_sb;
  a.grad_c_n = g->gc_n;
  a.grad_c_n_stride_b = g->gcn_sb;
  a.h0 = g->h0;
  a.h0_stride_b = g->h0_sb;
  a.c0 = g->c0;
  a.c0_stride_b = g->c0_sb;
  a.y = g->y;
  a.saved = g->saved;
  a.w_hh = g->w_hh;
  a.w_hh_stride = g->w_s;
  a.w_hr = g->w_hr;
  a.w_hr_stride = g->wr_s;
  a.lengths = g->problem.has_lengths ? g->lengths : NULL;
  a.grad_xp = g->gxp;
  a.grad_hh = g->ghh;
  a.grad_h = g->gh;
  a.grad_h0 = g->gh0;
  a.grad_c0 = g->gc0;
  return a;
}

static int64_t gated_len(const gated_t *g, int64_t b) {
  return g->problem.has_lengths ? g->lengths[b] : g->problem.steps;
}

/* Forward with its outputs and workspace poisoned; 0 on success. */
static int gated_run_forward(gated_t *g) {
  const prnn_problem_t *p = &g->problem;
  const prnn_dtype_t d = p->dtype;
  const prnn_gated_forward_args_t a = gated_forward_args(g);
  poison(d, g->y, p->steps * p->batch * g->S);
  poison(d, g->h_n, p->batch * g->S);
  if (g->c_n != NULL) poison(d, g->c_n, p->batch * p->hidden);
  poison(d, g->saved, p->steps * p->batch * g->SAVED * p->hidden);
  poison(d, g->ws, (int64_t)(g->ws_bytes / elem_size(d)));
  if (prnn_gated_forward_cpu(p, &a, g->ws, g->ws_bytes) != PRNN_STATUS_SUCCESS) {
    printf("  gated forward failed: %s\n", prnn_last_error());
    return 1;
  }
  return 0;
}

/* Backward-data (of the y and saved in g) with its outputs and workspace poisoned. */
static int gated_run_backward(gated_t *g) {
  const prnn_problem_t *p = &g->problem;
  const prnn_dtype_t d = p->dtype;
  const int64_t TBGH = p->steps * p->batch * g->G * p->hidden;
  const prnn_gated_backward_args_t a = gated_backward_args(g);
  poison(d, g->gxp, TBGH);
  if (g->ghh != NULL) poison(d, g->ghh, TBGH);
  if (g->gh != NULL) poison(d, g->gh, p->steps * p->batch * g->S);
  poison(d, g->gh0, p->batch * g->S);
  if (g->gc0 != NULL) poison(d, g->gc0, p->batch * p->hidden);
  poison(d, g->ws, (int64_t)(g->ws_bytes / elem_size(d)));
  if (prnn_gated_backward_data_cpu(p, &a, g->ws, g->ws_bytes) != PRNN_STATUS_SUCCESS) {
    printf("  gated backward failed: %s\n", prnn_last_error());
    return 1;
  }
  return 0;
}

static double sigmoid(double v) { return 1.0 / (1.0 + exp(-v)); }

/* The cells as written in torch.nn's docs, in double, on g's inputs as the
 * kernel sees them: y [T,B,S], h_n [B,S], c_n [B,H] (LSTM) and saved
 * [T,B,SAVED*H], contiguous. */
static void reference_gated_forward(const gated_t *g, double *y, double *h_n, double *c_n,
                                    double *saved) {
  const prnn_problem_t *p = &g->problem;
  const prnn_dtype_t d = p->dtype;
  const int64_t T = p->steps, B = p->batch, H = p->hidden, S = g->S, GH = g->G * H;
  const int lstm = p->cell == PRNN_CELL_LSTM;
  double *h = (double *)xmalloc((size_t)S * sizeof(double));
  double *c = (double *)xmalloc((size_t)H * sizeof(double));
  double *m = (double *)xmalloc((size_t)H * sizeof(double));
  double *wh = (double *)xmalloc((size_t)GH * sizeof(double)); /* W_hh h + b_hh */
  int64_t t, b, k, j;
  for (b = 0; b < B; ++b) {
    for (j = 0; j < S; ++j) h[j] = get(d, g->h0, b * g->h0_sb + j);
    for (j = 0; lstm && j < H; ++j) c[j] = get(d, g->c0, b * g->c0_sb + j);
    for (t = 0; t < T; ++t) {
      double *yt = y + (t * B + b) * S, *st = saved + (t * B + b) * g->SAVED * H;
      const int64_t x0 = t * g->xp_st + b * g->xp_sb;
      if (t >= gated_len(g, b)) {
        for (j = 0; j < S; ++j) yt[j] = 0;
        for (j = 0; j < g->SAVED * H; ++j) st[j] = 0;
        continue;
      }
      for (k = 0; k < GH; ++k) {
        wh[k] = g->has_bias ? get(d, g->b_hh, k) : 0.0;
        for (j = 0; j < S; ++j) wh[k] += get(d, g->w_hh, k * g->w_s + j) * h[j];
      }
      for (j = 0; j < H; ++j) {
        double x[4];
        for (k = 0; k < g->G; ++k) x[k] = get(d, g->xp, x0 + k * H + j);
        if (lstm) {
          const double i = sigmoid(x[0] + wh[j]), f = sigmoid(x[1] + wh[H + j]);
          const double gg = tanh(x[2] + wh[2 * H + j]), o = sigmoid(x[3] + wh[3 * H + j]);
          c[j] = f * c[j] + i * gg;
          m[j] = o * tanh(c[j]);
          st[j] = i, st[H + j] = f, st[2 * H + j] = gg, st[3 * H + j] = o, st[4 * H + j] = c[j];
        } else {
          const double r = sigmoid(x[0] + wh[j]), z = sigmoid(x[1] + wh[H + j]);
          const double n = tanh(x[2] + r * wh[2 * H + j]);
          st[j] = r, st[H + j] = z, st[2 * H + j] = n, st[3 * H + j] = wh[2 * H + j];
          m[j] = (1 - z) * n + z * h[j]; /* the new h, kept apart until every unit is done */
        }
      }
      for (k = 0; k < S; ++k) {
        if (lstm && g->w_hr != NULL) {
          h[k] = 0;
          for (j = 0; j < H; ++j) h[k] += get(d, g->w_hr, k * g->wr_s + j) * m[j];
        } else {
          h[k] = m[k];
        }
        yt[k] = h[k];
      }
    }
    for (j = 0; j < S; ++j) h_n[b * S + j] = h[j];
    for (j = 0; lstm && j < H; ++j) c_n[b * H + j] = c[j];
  }
  free(h);
  free(c);
  free(m);
  free(wh);
}

static void add_err(err_t *e, double out, double ref) {
  e->diff2 += (out - ref) * (out - ref);
  e->ref2 += ref * ref;
}

/* Every element finite (written over the poison); 1 if not. */
static int all_finite(prnn_dtype_t d, const void *p, int64_t n) {
  int64_t k;
  for (k = 0; k < n; ++k)
    if (!isfinite(get(d, p, k))) return 0;
  return 1;
}

/* Rows [t, b] of width n (of a [T,B,n] tensor) are exactly zero past each length. */
static int zero_past_lengths(const gated_t *g, const void *p, int64_t n) {
  int64_t t, b, k;
  for (b = 0; b < g->problem.batch; ++b)
    for (t = gated_len(g, b); t < g->problem.steps; ++t)
      for (k = 0; k < n; ++k)
        if (get(g->problem.dtype, p, (t * g->problem.batch + b) * n + k) != 0.0) return 0;
  return 1;
}

/* Forward outputs against the reference: errors added into e; 1 if an
 * output is unwritten, non-finite or nonzero past a length. */
static int check_gated_forward(gated_t *g, err_t *e) {
  const prnn_problem_t *p = &g->problem;
  const prnn_dtype_t d = p->dtype;
  const int64_t T = p->steps, B = p->batch, H = p->hidden, S = g->S;
  const int64_t n_saved = T * B * g->SAVED * H;
  double *y = (double *)xmalloc((size_t)(T * B * S) * sizeof(double));
  double *h_n = (double *)xmalloc((size_t)(B * S) * sizeof(double));
  double *c_n = (double *)xmalloc((size_t)(B * H) * sizeof(double));
  double *saved = (double *)xmalloc((size_t)n_saved * sizeof(double));
  int64_t k;
  int bad = gated_run_forward(g);
  reference_gated_forward(g, y, h_n, c_n, saved);
  bad |= !all_finite(d, g->y, T * B * S) || !all_finite(d, g->h_n, B * S) ||
         !all_finite(d, g->saved, n_saved) || (g->c_n != NULL && !all_finite(d, g->c_n, B * H));
  bad |= !zero_past_lengths(g, g->y, S) || !zero_past_lengths(g, g->saved, g->SAVED * H);
  for (k = 0; k < T * B * S; ++k) add_err(e, get(d, g->y, k), y[k]);
  for (k = 0; k < B * S; ++k) add_err(e, get(d, g->h_n, k), h_n[k]);
  for (k = 0; g->c_n != NULL && k < B * H; ++k) add_err(e, get(d, g->c_n, k), c_n[k]);
  for (k = 0; k < n_saved; ++k) add_err(e, get(d, g->saved, k), saved[k]);
  free(y);
  free(h_n);
  free(c_n);
  free(saved);
  return bad;
}

/* 1 if a backward output is unwritten, non-finite or nonzero past a length. */
static int check_gated_backward_written(const gated_t *g) {
  const prnn_problem_t *p = &g->problem;
  const prnn_dtype_t d = p->dtype;
  const int64_t T = p->steps, B = p->batch, H = p->hidden, GH = g->G * H, S = g->S;
  int bad = !all_finite(d, g->gxp, T * B * GH) || !zero_past_lengths(g, g->gxp, GH);
  bad |= !all_finite(d, g->gh0, B * S) || (g->gc0 != NULL && !all_finite(d, g->gc0, B * H));
  if (g->ghh != NULL) bad |= !all_finite(d, g->ghh, T * B * GH) || !zero_past_lengths(g, g->ghh, GH);
  if (g->gh != NULL) bad |= !all_finite(d, g->gh, T * B * S) || !zero_past_lengths(g, g->gh, S);
  return bad;
}

/* An input tensor as rows x cols (row stride) of `steps` blocks (step stride),
 * with the gradient the backward's outputs give for each element. */
typedef struct {
  const char *name;
  void *data;
  int64_t steps, rows, cols, step_stride, row_stride;
} input_view_t;

/* The loss whose gradients the backward computes: sum grad_y y + grad_h_n h_n
 * + grad_c_n c_n, from a fresh forward. */
static double gated_loss(gated_t *g) {
  const prnn_problem_t *p = &g->problem;
  const prnn_dtype_t d = p->dtype;
  const int64_t T = p->steps, B = p->batch, H = p->hidden, S = g->S;
  double loss = 0;
  int64_t t, b, k;
  if (gated_run_forward(g) != 0) exit(1);
  for (t = 0; t < T; ++t)
    for (b = 0; b < B; ++b)
      for (k = 0; k < S; ++k)
        loss += get(d, g->gy, t * g->gy_st + b * g->gy_sb + k) * get(d, g->y, (t * B + b) * S + k);
  for (b = 0; g->gh_n != NULL && b < B; ++b)
    for (k = 0; k < S; ++k) loss += get(d, g->gh_n, b * g->ghn_sb + k) * get(d, g->h_n, b * S + k);
  for (b = 0; g->gc_n != NULL && b < B; ++b)
    for (k = 0; k < H; ++k) loss += get(d, g->gc_n, b * g->gcn_sb + k) * get(d, g->c_n, b * H + k);
  return loss;
}

/* The gradient of input `which` at [s, r, k], from the backward's outputs
 * (in g) and the forward's y and saved, as the caller's GEMMs form it:
 * grad_b_hh = sum grad_hh, grad_W_hh = sum grad_hh^T h_{t-1},
 * grad_W_hr = sum grad_h^T (o tanh(c)). */
static double analytic_grad(const gated_t *g, const char *which, int64_t s, int64_t r, int64_t k) {
  const prnn_problem_t *p = &g->problem;
  const prnn_dtype_t d = p->dtype;
  const int64_t T = p->steps, B = p->batch, H = p->hidden, S = g->S, GH = g->G * H;
  const void *da = g->ghh != NULL ? g->ghh : g->gxp; /* dLoss/d(W_hh h + b_hh) */
  double sum = 0;
  int64_t t, b;
  if (strcmp(which, "xp") == 0) return get(d, g->gxp, (s * B + r) * GH + k);
  if (strcmp(which, "h0") == 0 && g->h0_sb > 0) return get(d, g->gh0, r * S + k);
  if (strcmp(which, "c0") == 0) return get(d, g->gc0, r * H + k);
  for (t = 0; t < T; ++t)
    for (b = 0; b < B; ++b) {
      const int64_t tb = t * B + b;
      if (strcmp(which, "h0") == 0) { /* broadcast: one element for every sequence */
        sum += t == 0 ? get(d, g->gh0, b * S + k) : 0.0;
      } else if (strcmp(which, "b_hh") == 0) {
        sum += get(d, da, tb * GH + k);
      } else if (strcmp(which, "w_hh") == 0) {
        const double h_prev = t > 0 ? get(d, g->y, (tb - B) * S + k) : get(d, g->h0, b * g->h0_sb + k);
        sum += get(d, da, tb * GH + r) * h_prev;
      } else { /* w_hr */
        const int64_t st = tb * g->SAVED * H;
        const double m = get(d, g->saved, st + 3 * H + k) * tanh(get(d, g->saved, st + 4 * H + k));
        sum += get(d, g->gh, tb * S + r) * m;
      }
    }
  return sum;
}

/* Central differences of gated_loss against the backward, for every element
 * of every input; float64 only. Returns the worst relative error over the inputs. */
static double gated_finite_differences(gated_t *g, int *bad) {
  const prnn_problem_t *p = &g->problem;
  const int64_t T = p->steps, B = p->batch, H = p->hidden, S = g->S, GH = g->G * H;
  const double eps = 1e-6;
  input_view_t inputs[6];
  int n_inputs = 0, i;
  double worst = 0;
  /* The analytic gradients first: the perturbed forwards overwrite y and saved. */
  gated_t grads;
  input_view_t xp = {"xp", g->xp, T, B, GH, g->xp_st, g->xp_sb};
  input_view_t h0 = {"h0", g->h0, 1, g->h0_sb > 0 ? B : 1, S, 0, g->h0_sb};
  input_view_t c0 = {"c0", g->c0, 1, B, H, 0, g->c0_sb};
  input_view_t bh = {"b_hh", g->b_hh, 1, 1, GH, 0, 0};
  input_view_t w = {"w_hh", g->w_hh, 1, GH, S, 0, g->w_s};
  input_view_t wr = {"w_hr", g->w_hr, 1, S, H, 0, g->wr_s};
  inputs[n_inputs++] = xp;
  inputs[n_inputs++] = h0;
  if (g->c0 != NULL) inputs[n_inputs++] = c0;
  if (g->b_hh != NULL) inputs[n_inputs++] = bh;
  inputs[n_inputs++] = w;
  if (g->w_hr != NULL) inputs[n_inputs++] = wr;
  *bad |= gated_run_forward(g) || gated_run_backward(g) || check_gated_backward_written(g);
  grads = *g; /* the outputs' buffers, kept while the copies below own new ones */
  g->y = xmalloc((size_t)(T * B * S) * sizeof(double));
  g->h_n = xmalloc((size_t)(B * S) * sizeof(double));
  g->c_n = g->c_n != NULL ? xmalloc((size_t)(B * H) * sizeof(double)) : NULL;
  g->saved = xmalloc((size_t)(T * B * g->SAVED * H) * sizeof(double));
  for (i = 0; i < n_inputs; ++i) {
    const input_view_t *v = &inputs[i];
    err_t e = {0, 0};
    int64_t s, r, k;
    double err;
    for (s = 0; s < v->steps; ++s)
      for (r = 0; r < v->rows; ++r)
        for (k = 0; k < v->cols; ++k) {
          double *x = (double *)v->data + s * v->step_stride + r * v->row_stride + k;
          const double keep = *x;
          double up, down;
          *x = keep + eps;
          up = gated_loss(g);
          *x = keep - eps;
          down = gated_loss(g);
          *x = keep;
          add_err(&e, analytic_grad(&grads, v->name, s, r, k), (up - down) / (2 * eps));
        }
    err = rel_err(e);
    if (!(err < 1e-6)) {
      printf("  FAILED: gradient of %s: rel err %.3g against central differences\n", v->name, err);
      *bad = 1;
    }
    if (err > worst) worst = err;
  }
  free(g->y);
  free(g->h_n);
  free(g->c_n);
  free(g->saved);
  g->y = grads.y, g->h_n = grads.h_n, g->c_n = grads.c_n, g->saved = grads.saved;
  return worst;
}

static void add_errs(err_t *e, const gated_t *out, const void *o, const gated_t *ref, const void *r,
                     int64_t n) {
  int64_t k;
  for (k = 0; o != NULL && k < n; ++k)
    add_err(e, get(out->problem.dtype, o, k), get(ref->problem.dtype, r, k));
}

/* float32's backward (of g's forward) against float64's on the same inputs:
 * the relative error over every gradient output. */
static double float32_backward_error(gated_t *g, int *bad) {
  const prnn_problem_t *p = &g->problem;
  const int64_t T = p->steps, B = p->batch, H = p->hidden, S = g->S, GH = g->G * H;
  gated_t w;
  void **ours[] = {&g->xp, &g->b_hh, &g->h0, &g->c0, &g->w_hh, &g->w_hr, &g->gy, &g->gh_n, &g->gc_n};
  void **wide[] = {&w.xp, &w.b_hh, &w.h0, &w.c0, &w.w_hh, &w.w_hr, &w.gy, &w.gh_n, &w.gc_n};
  int64_t sizes[9];
  err_t e = {0, 0};
  size_t q;
  int64_t k;
  gated_setup(&w, PRNN_DTYPE_FLOAT64, p->cell, T, B, H, p->proj_size, p->has_lengths, g->has_bias,
              g->has_grad_n, 0);
  /* g's layout and values */
  w.xp_st = g->xp_st, w.xp_sb = g->xp_sb, w.h0_sb = g->h0_sb, w.c0_sb = g->c0_sb, w.w_s = g->w_s;
  w.wr_s = g->wr_s, w.gy_st = g->gy_st, w.gy_sb = g->gy_sb, w.ghn_sb = g->ghn_sb, w.gcn_sb = g->gcn_sb;
  memcpy(w.lengths, g->lengths, (size_t)B * sizeof(int32_t));
  sizes[0] = n_xp(g), sizes[1] = GH, sizes[2] = n_rows(B, g->h0_sb, S), sizes[3] = n_rows(B, g->c0_sb, H);
  sizes[4] = n_rows(GH, g->w_s, S), sizes[5] = n_rows(S, g->wr_s, H);
  sizes[6] = extent(T, B, S, g->gy_st, g->gy_sb), sizes[7] = n_rows(B, g->ghn_sb, S);
  sizes[8] = n_rows(B, g->gcn_sb, H);
  for (q = 0; q < 9; ++q) {
    free(*wide[q]);
    *wide[q] = NULL;
    if (*ours[q] == NULL) continue;
    *wide[q] = xmalloc((size_t)sizes[q] * sizeof(double));
    for (k = 0; k < sizes[q]; ++k) put(PRNN_DTYPE_FLOAT64, *wide[q], k, get(p->dtype, *ours[q], k));
  }
  *bad |= gated_run_backward(g) || check_gated_backward_written(g);
  *bad |= gated_run_forward(&w) || gated_run_backward(&w);
  add_errs(&e, g, g->gxp, &w, w.gxp, T * B * GH);
  add_errs(&e, g, g->ghh, &w, w.ghh, T * B * GH);
  add_errs(&e, g, g->gh, &w, w.gh, T * B * S);
  add_errs(&e, g, g->gh0, &w, w.gh0, B * S);
  add_errs(&e, g, g->gc0, &w, w.gc0, B * H);
  gated_free(&w);
  return rel_err(e);
}

static const char *cell_name(prnn_cell_t cell, int64_t P) {
  return cell == PRNN_CELL_GRU ? "gru" : P > 0 ? "lstm+proj" : "lstm";
}

/* Forward values against the reference, in float32 and float64, every
 * output written and zero past a length; float32's backward against
 * float64's on the same (rounded) inputs. */
static void gated_forward_group(prnn_dtype_t dtype) {
  static const int64_t Ts[] = {1, 2, 9}, Bs[] = {1, 3}, Hs[] = {1, 7, 33};
  static const prnn_cell_t cells[] = {PRNN_CELL_LSTM, PRNN_CELL_LSTM, PRNN_CELL_GRU};
  const double tol = dtype == PRNN_DTYPE_FLOAT64 ? 1e-12 : 1e-5;
  const char *dname = dtype == PRNN_DTYPE_FLOAT64 ? "float64" : "float32";
  double worst_f = 0, worst_b = 0;
  int cases = 0, bad = 0;
  size_t ci, ti, bi, hi;
  int layout, has_lengths;
  for (ci = 0; ci < 3; ++ci)
    for (ti = 0; ti < 3; ++ti)
      for (bi = 0; bi < 2; ++bi)
        for (hi = 0; hi < 3; ++hi)
          for (layout = 0; layout < 3; ++layout)
            for (has_lengths = 0; has_lengths <= 1; ++has_lengths) {
              const int64_t T = Ts[ti], B = Bs[bi], H = Hs[hi];
              /* a projection narrower than H, and one of 3 for H = 1 (wider is valid too) */
              const int64_t P = ci == 1 ? (H > 1 ? H / 2 + 1 : 3) : 0;
              const int bias = (int)((ti + hi + layout) % 2 == 0), grad_n = (int)((bi + hi) % 2);
              gated_t g;
              err_t fe = {0, 0};
              double ef, eb = 0;
              int case_bad;
              gated_setup(&g, dtype, cells[ci], T, B, H, P, has_lengths, bias, grad_n, layout);
              case_bad = check_gated_forward(&g, &fe);
              ef = rel_err(fe);
              if (dtype == PRNN_DTYPE_FLOAT32) eb = float32_backward_error(&g, &case_bad);
              if (ef > worst_f) worst_f = ef;
              if (eb > worst_b) worst_b = eb;
              if (case_bad || !(ef < tol) || !(eb < tol)) {
                printf("  FAILED: %s T=%lld B=%lld H=%lld P=%lld lengths=%d layout=%d: rel err forward %.3g "
                       "backward %.3g%s\n",
                       cell_name(cells[ci], P), (long long)T, (long long)B, (long long)H, (long long)P,
                       has_lengths, layout, ef, eb,
                       case_bad ? " (unwritten, non-finite, nonzero past a length, or an error)" : "");
                case_bad = 1;
              }
              bad += case_bad;
              ++cases;
              gated_free(&g);
            }
  if (dtype == PRNN_DTYPE_FLOAT32)
    printf("%s float32 gated: %d cases, max rel err forward %.2g, backward vs float64 %.2g (bound %.0e)\n",
           bad ? "FAIL" : "ok  ", cases, worst_f, worst_b, tol);
  else
    printf("%s %s gated forward: %d cases, max rel err %.2g (bound %.0e)\n", bad ? "FAIL" : "ok  ",
           dname, cases, worst_f, tol);
  failures += bad;
}

/* float64 backward against central differences of the forward, for every
 * input, over cells, lengths (0 and T among them), biases and grad_h_n/c_n. */
static void gated_gradient_group(void) {
  typedef struct {
    prnn_cell_t cell;
    int64_t T, B, H, P;
    int has_lengths, bias, grad_n, layout;
  } fd_case_t;
  static const fd_case_t cases[] = {
      {PRNN_CELL_LSTM, 4, 3, 3, 0, 1, 1, 1, 1}, {PRNN_CELL_LSTM, 4, 3, 3, 0, 0, 0, 0, 0},
      {PRNN_CELL_LSTM, 3, 3, 4, 2, 1, 1, 1, 1}, {PRNN_CELL_LSTM, 3, 2, 2, 3, 0, 1, 1, 2},
      {PRNN_CELL_LSTM, 1, 1, 1, 0, 0, 1, 1, 0}, {PRNN_CELL_LSTM, 1, 1, 1, 1, 1, 0, 0, 0},
      {PRNN_CELL_GRU, 4, 3, 3, 0, 1, 1, 1, 1},  {PRNN_CELL_GRU, 4, 3, 3, 0, 0, 0, 0, 0},
      {PRNN_CELL_GRU, 5, 2, 5, 0, 1, 1, 1, 2},  {PRNN_CELL_GRU, 1, 1, 1, 0, 0, 1, 1, 0},
  };
  double worst = 0;
  int bad = 0;
  size_t i;
  for (i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
    const fd_case_t *c = &cases[i];
    gated_t g;
    int case_bad = 0;
    double err;
    gated_setup(&g, PRNN_DTYPE_FLOAT64, c->cell, c->T, c->B, c->H, c->P, c->has_lengths, c->bias,
                c->grad_n, c->layout);
    err = gated_finite_differences(&g, &case_bad);
    if (err > worst) worst = err;
    if (case_bad)
      printf("  FAILED: %s T=%lld B=%lld H=%lld P=%lld lengths=%d bias=%d grad_n=%d layout=%d\n",
             cell_name(c->cell, c->P), (long long)c->T, (long long)c->B, (long long)c->H,
             (long long)c->P, c->has_lengths, c->bias, c->grad_n, c->layout);
    bad += case_bad;
    gated_free(&g);
  }
  printf("%s float64 gated backward vs central differences: %d cases, every input, "
         "max rel err %.2g (bound 1e-06)\n",
         bad ? "FAIL" : "ok  ", (int)(sizeof cases / sizeof cases[0]), worst);
  failures += bad;
}

/* Bad arguments of the gated passes: each names one check (the status is
 * what counts; the message must be set). */
static void gated_error_group(void) {
  enum { T = 3, B = 2, H = 3, P = 2 };
  gated_t lstm, gru;
  prnn_problem_t p;
  prnn_gated_forward_args_t fa, lf, gf;
  prnn_gated_backward_args_t ba, lb, gb;
  prnn_plan_t plan;
  float dummy[4] = {0, 0, 0, 0};
  const int checks_before = error_checks, before = error_failures;
  gated_setup(&lstm, PRNN_DTYPE_FLOAT32, PRNN_CELL_LSTM, T, B, H, P, 1, 1, 1, 0);
  gated_setup(&gru, PRNN_DTYPE_FLOAT32, PRNN_CELL_GRU, T, B, H, 0, 1, 1, 0, 0);
  lstm.lengths[0] = gru.lengths[0] = 1;
  lf = gated_forward_args(&lstm);
  lb = gated_backward_args(&lstm);
  gf = gated_forward_args(&gru);
  gb = gated_backward_args(&gru);

/* The forward or the backward of `g` (good args fg / bg) with one change to
 * its problem or args; EXPECT_GATED runs both. */
#define EXPECT_FORWARD_OF(g, fg, what, change, want)                                 \
  do {                                                                             \
    p = (g).problem, fa = fg;                                                      \
    change;                                                                        \
    expect("forward: " what, prnn_gated_forward_cpu(&p, &fa, (g).ws, (g).ws_bytes), want); \
  } while (0)
#define EXPECT_BACKWARD_OF(g, bg, what, change, want)                                      \
  do {                                                                                   \
    p = (g).problem, ba = bg;                                                            \
    change;                                                                              \
    expect("backward: " what, prnn_gated_backward_data_cpu(&p, &ba, (g).ws, (g).ws_bytes), \
           want);                                                                        \
  } while (0)
#define EXPECT_GATED(g, fg, bg, what, change, want)                                    \
  do {                                                                               \
    EXPECT_FORWARD_OF(g, fg, what, change, want);                                    \
    EXPECT_BACKWARD_OF(g, bg, what, change, want);                                   \
  } while (0)
#define EXPECT_LSTM(what, change, want) EXPECT_GATED(lstm, lf, lb, "lstm " what, change, want)
#define EXPECT_GRU(what, change, want) EXPECT_GATED(gru, gf, gb, "gru " what, change, want)
#define EXPECT_LSTM_F(what, change) \
  EXPECT_FORWARD_OF(lstm, lf, "lstm " what, change, PRNN_STATUS_BAD_PARAM)
#define EXPECT_LSTM_B(what, change, want) EXPECT_BACKWARD_OF(lstm, lb, "lstm " what, change, want)
#define EXPECT_GRU_B(what, change, want) EXPECT_BACKWARD_OF(gru, gb, "gru " what, change, want)

  /* The good calls (the backward after a forward that saved). */
  EXPECT_LSTM("valid lstm with projection", (void)0, PRNN_STATUS_SUCCESS);
  EXPECT_GRU("valid gru", (void)0, PRNN_STATUS_SUCCESS);
  EXPECT_LSTM("no bias, no lengths", (fa.b_hh = NULL, p.has_lengths = 0, fa.lengths = ba.lengths = NULL),
              PRNN_STATUS_SUCCESS);
  EXPECT_GRU("forward without saved", fa.saved = NULL, PRNN_STATUS_SUCCESS);
  EXPECT_LSTM_B("no grad_h_n, grad_c_n (their strides ignored)",
                (ba.grad_h_n = ba.grad_c_n = NULL, ba.grad_h_n_stride_b = ba.grad_c_n_stride_b = -1),
                PRNN_STATUS_SUCCESS);

  /* The problem: cells, proj_size, and the entry points' cells. */
  EXPECT_LSTM("cell 3", p.cell = (prnn_cell_t)3, PRNN_STATUS_BAD_PARAM);
  EXPECT_LSTM("cell -1", p.cell = (prnn_cell_t)-1, PRNN_STATUS_BAD_PARAM);
  EXPECT_GRU("elman cell in a gated pass", p.cell = PRNN_CELL_ELMAN, PRNN_STATUS_BAD_PARAM);
  EXPECT_LSTM("proj_size -1", p.proj_size = -1, PRNN_STATUS_BAD_PARAM);
  EXPECT_GRU("gru with proj_size", p.proj_size = 2, PRNN_STATUS_BAD_PARAM);
  EXPECT_LSTM("lstm with w_hr but proj_size 0", p.proj_size = 0, PRNN_STATUS_BAD_PARAM);
  EXPECT_LSTM("gru problem, lstm args", p.cell = PRNN_CELL_GRU, PRNN_STATUS_BAD_PARAM);
  EXPECT_GRU("lstm problem, gru args", p.cell = PRNN_CELL_LSTM, PRNN_STATUS_BAD_PARAM);
  EXPECT_LSTM("dtype float16", p.dtype = PRNN_DTYPE_FLOAT16, PRNN_STATUS_NOT_SUPPORTED);
  EXPECT_LSTM("hidden 0", p.hidden = 0, PRNN_STATUS_BAD_PARAM);
  EXPECT_LSTM("lengths[1] = steps + 1", lstm.lengths[1] = T + 1, PRNN_STATUS_BAD_PARAM);
  lstm.lengths[1] = T;
  EXPECT_GRU("lengths[0] = -1", gru.lengths[0] = -1, PRNN_STATUS_BAD_PARAM);
  gru.lengths[0] = 1;
  EXPECT_LSTM("has_lengths without lengths", (fa.lengths = ba.lengths = NULL), PRNN_STATUS_BAD_PARAM);
  EXPECT_GRU("lengths without has_lengths", p.has_lengths = 0, PRNN_STATUS_BAD_PARAM);
  {
    prnn_forward_args_t ef;
    memset(&ef, 0, sizeof ef);
    ef.xp = ef.h0 = ef.w_hh = dummy;
    ef.y = dummy;
    ef.xp_stride_t = ef.xp_stride_b = 1;
    p = lstm.problem;
    p.proj_size = 0;
    p.has_lengths = 0;
    expect("elman forward with an lstm problem", prnn_forward_cpu(&p, &ef, lstm.ws, lstm.ws_bytes),
           PRNN_STATUS_BAD_PARAM);
    p.cell = PRNN_CELL_ELMAN;
    p.proj_size = 1;
    expect("elman plan with proj_size 1", prnn_plan_cpu(&p, PRNN_PASS_FORWARD, &plan),
           PRNN_STATUS_BAD_PARAM);
  }

  /* Pointers and strides. */
  expect("gated forward: args NULL", prnn_gated_forward_cpu(&lstm.problem, NULL, lstm.ws, lstm.ws_bytes),
         PRNN_STATUS_BAD_PARAM);
  expect("gated backward: args NULL",
         prnn_gated_backward_data_cpu(&lstm.problem, NULL, lstm.ws, lstm.ws_bytes), PRNN_STATUS_BAD_PARAM);
  expect("gated forward: problem NULL", prnn_gated_forward_cpu(NULL, &lf, lstm.ws, lstm.ws_bytes),
         PRNN_STATUS_BAD_PARAM);
  EXPECT_LSTM("w_hh NULL", (fa.w_hh = ba.w_hh = NULL), PRNN_STATUS_BAD_PARAM);
  EXPECT_LSTM("w_hh_stride -1", (fa.w_hh_stride = ba.w_hh_stride = -1), PRNN_STATUS_BAD_PARAM);
  EXPECT_LSTM("h0 NULL", (fa.h0 = ba.h0 = NULL), PRNN_STATUS_BAD_PARAM);
  EXPECT_LSTM("h0_stride_b -1", (fa.h0_stride_b = ba.h0_stride_b = -1), PRNN_STATUS_BAD_PARAM);
  EXPECT_LSTM("lstm c0 NULL", (fa.c0 = ba.c0 = NULL), PRNN_STATUS_BAD_PARAM);
  EXPECT_LSTM("c0_stride_b -1", (fa.c0_stride_b = ba.c0_stride_b = -1), PRNN_STATUS_BAD_PARAM);
  EXPECT_LSTM("w_hr NULL with proj_size", (fa.w_hr = ba.w_hr = NULL), PRNN_STATUS_BAD_PARAM);
  EXPECT_LSTM("w_hr_stride -1", (fa.w_hr_stride = ba.w_hr_stride = -1), PRNN_STATUS_BAD_PARAM);
  EXPECT_GRU("gru c0 given", (fa.c0 = ba.c0 = dummy), PRNN_STATUS_BAD_PARAM);
  EXPECT_GRU("gru w_hr given", (fa.w_hr = ba.w_hr = dummy), PRNN_STATUS_BAD_PARAM);
  EXPECT_LSTM_F("xp NULL", fa.xp = NULL);
  EXPECT_LSTM_F("xp_stride_t -1", fa.xp_stride_t = -1);
  EXPECT_LSTM_F("xp_stride_b -2", fa.xp_stride_b = -2);
  EXPECT_LSTM_F("y NULL", fa.y = NULL);
  EXPECT_LSTM_F("h_n NULL", fa.h_n = NULL);
  EXPECT_LSTM_F("lstm c_n NULL", fa.c_n = NULL);
  p = gru.problem, fa = gf, fa.c_n = dummy;
  expect("gru forward: c_n given", prnn_gated_forward_cpu(&p, &fa, gru.ws, gru.ws_bytes),
         PRNN_STATUS_BAD_PARAM);
  EXPECT_LSTM_B("grad_y NULL", ba.grad_y = NULL, PRNN_STATUS_BAD_PARAM);
  EXPECT_LSTM_B("grad_y_stride_t -1", ba.grad_y_stride_t = -1, PRNN_STATUS_BAD_PARAM);
  EXPECT_LSTM_B("grad_h_n_stride_b -1", ba.grad_h_n_stride_b = -1, PRNN_STATUS_BAD_PARAM);
  EXPECT_LSTM_B("grad_c_n_stride_b -1", ba.grad_c_n_stride_b = -1, PRNN_STATUS_BAD_PARAM);
  EXPECT_LSTM_B("y NULL", ba.y = NULL, PRNN_STATUS_BAD_PARAM);
  EXPECT_LSTM_B("saved NULL", ba.saved = NULL, PRNN_STATUS_BAD_PARAM);
  EXPECT_LSTM_B("grad_xp NULL", ba.grad_xp = NULL, PRNN_STATUS_BAD_PARAM);
  EXPECT_LSTM_B("lstm grad_hh given", ba.grad_hh = dummy, PRNN_STATUS_BAD_PARAM);
  EXPECT_LSTM_B("grad_h NULL with proj_size", ba.grad_h = NULL, PRNN_STATUS_BAD_PARAM);
  EXPECT_LSTM_B("grad_h0 NULL", ba.grad_h0 = NULL, PRNN_STATUS_BAD_PARAM);
  EXPECT_LSTM_B("lstm grad_c0 NULL", ba.grad_c0 = NULL, PRNN_STATUS_BAD_PARAM);
  EXPECT_GRU_B("gru grad_hh NULL", ba.grad_hh = NULL, PRNN_STATUS_BAD_PARAM);
  EXPECT_GRU_B("gru grad_h given", ba.grad_h = dummy, PRNN_STATUS_BAD_PARAM);
  EXPECT_GRU_B("gru grad_c0 given", ba.grad_c0 = dummy, PRNN_STATUS_BAD_PARAM);
  EXPECT_GRU_B("gru grad_c_n given", ba.grad_c_n = dummy, PRNN_STATUS_BAD_PARAM);
  EXPECT_GRU_B("gru grad_h_n given", (ba.grad_h_n = gru.h_n, ba.grad_h_n_stride_b = H), PRNN_STATUS_SUCCESS);

  /* Workspace and plan. */
  expect("gated forward: workspace too small",
         prnn_gated_forward_cpu(&lstm.problem, &lf, lstm.ws, lstm.ws_bytes - 1),
         PRNN_STATUS_WORKSPACE_TOO_SMALL);
  expect("gated backward: workspace NULL",
         prnn_gated_backward_data_cpu(&lstm.problem, &lb, NULL, lstm.ws_bytes), PRNN_STATUS_BAD_PARAM);
  p = lstm.problem;
  expect("plan: lstm forward", prnn_plan_cpu(&p, PRNN_PASS_FORWARD, &plan), PRNN_STATUS_SUCCESS);
  if (plan.tier != PRNN_TIER_CPU_REFERENCE || plan.workspace_bytes != (4 + 1) * H * sizeof(float) ||
      plan.rows_per_cta != 4 * H || plan.grid != 1 || plan.block != 1) {
    printf("  FAILED: lstm plan: tier %s workspace %zu rows %d\n", prnn_tier_string(plan.tier),
           plan.workspace_bytes, plan.rows_per_cta);
    ++error_failures;
  }
  expect("plan: lstm backward", prnn_plan_cpu(&p, PRNN_PASS_BACKWARD_DATA, &plan), PRNN_STATUS_SUCCESS);
  if (plan.rows_per_cta != P || plan.workspace_bytes != (4 + 1) * H * sizeof(float)) {
    printf("  FAILED: lstm backward plan: workspace %zu rows %d\n", plan.workspace_bytes, plan.rows_per_cta);
    ++error_failures;
  }
  p = gru.problem;
  p.dtype = PRNN_DTYPE_FLOAT64;
  expect("plan: gru float64", prnn_plan_cpu(&p, PRNN_PASS_FORWARD, &plan), PRNN_STATUS_SUCCESS);
  if (plan.workspace_bytes != (3 + 1) * H * sizeof(double) || plan.rows_per_cta != 3 * H) {
    printf("  FAILED: gru plan: workspace %zu rows %d\n", plan.workspace_bytes, plan.rows_per_cta);
    ++error_failures;
  }
  p.hidden = 1 + INT32_MAX / 3;
  expect("plan: gru hidden past int rows", prnn_plan_cpu(&p, PRNN_PASS_FORWARD, &plan),
         PRNN_STATUS_NOT_SUPPORTED);
  p = gru.problem;
  p.proj_size = 1;
  expect("plan: gru proj_size 1", prnn_plan_cpu(&p, PRNN_PASS_FORWARD, &plan), PRNN_STATUS_BAD_PARAM);

  printf("%s gated errors: %d checks, %d failed\n", error_failures > before ? "FAIL" : "ok  ",
         error_checks - checks_before, error_failures - before);
  failures += error_failures - before;
  gated_free(&lstm);
  gated_free(&gru);
}

/* ---- names ---- */

static void names_group(void) {
  static const prnn_status_t statuses[] = {
      PRNN_STATUS_SUCCESS,           PRNN_STATUS_BAD_PARAM,  PRNN_STATUS_NOT_SUPPORTED,
      PRNN_STATUS_WORKSPACE_TOO_SMALL, PRNN_STATUS_CUDA_ERROR, PRNN_STATUS_NOT_COMPILED};
  static const prnn_tier_t tiers[] = {PRNN_TIER_NONE, PRNN_TIER_CPU_REFERENCE,
                                      PRNN_TIER_PERSISTENT_REGISTERS, PRNN_TIER_PERSISTENT_SHARED,
                                      PRNN_TIER_STEPWISE, PRNN_TIER_PERSISTENT_CLUSTER,
                                      PRNN_TIER_PERSISTENT_CLUSTER_GRID, PRNN_TIER_FEW_STEPS};
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
  for (i = 0; i < 8; ++i) {
    const char *s = prnn_tier_string(tiers[i]);
    bad += s == NULL || s[0] == '\0' || strcmp(s, unknown_tier) == 0;
    for (j = 0; j < i; ++j) bad += strcmp(s, prnn_tier_string(tiers[j])) == 0;
  }
  bad += strcmp(prnn_tier_string(PRNN_TIER_PERSISTENT_REGISTERS), "persistent_registers") != 0;
  bad += strcmp(prnn_tier_string(PRNN_TIER_PERSISTENT_CLUSTER), "persistent_cluster") != 0;
  bad += strcmp(prnn_tier_string(PRNN_TIER_PERSISTENT_CLUSTER_GRID), "persistent_cluster_grid") != 0;
  bad += strcmp(prnn_tier_string(PRNN_TIER_FEW_STEPS), "few_steps") != 0;
  printf("%s names: 6 statuses, 8 tiers (e.g. %s, %s)\n", bad ? "FAIL" : "ok  ",
         prnn_status_string(PRNN_STATUS_WORKSPACE_TOO_SMALL), prnn_tier_string(PRNN_TIER_CPU_REFERENCE));
  failures += bad;
}

int main(void) {
  numerical_group(PRNN_DTYPE_FLOAT32, PRNN_ACT_TANH);
  numerical_group(PRNN_DTYPE_FLOAT32, PRNN_ACT_RELU);
  numerical_group(PRNN_DTYPE_FLOAT64, PRNN_ACT_TANH);
  numerical_group(PRNN_DTYPE_FLOAT64, PRNN_ACT_RELU);
  relu_nan_group(PRNN_DTYPE_FLOAT32);
  relu_nan_group(PRNN_DTYPE_FLOAT64);
  gated_forward_group(PRNN_DTYPE_FLOAT32);
  gated_forward_group(PRNN_DTYPE_FLOAT64);
  gated_gradient_group();
  error_group();
  gated_error_group();
  names_group();
  printf("%s\n", failures ? "test_cpu_reference: FAILED" : "test_cpu_reference: all passed");
  return failures ? 1 : 0;
}
