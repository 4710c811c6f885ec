/*
 * cpu_gated.c - the CPU reference of prnn.h's gated cells (LSTM with and
 * without a projection, GRU): plain loops, float32 and float64, accumulating
 * (and carrying the state) in the tensors' own type, one sequence at a time.
 * The plan query and the call checks it shares with the Elman cell are in
 * cpu_reference.c.
 *
 * C99, and also valid C++17 (torch's extension build compiles .c files with g++):
 * explicit casts from void *, no VLAs, no restrict.
 */
#include <math.h>
#include <stdint.h>

#include "prnn_internal.h"

/* Defines gated_forward_<suffix> and gated_backward_data_<suffix> for one
 * element type (a macro rather than a template so the file stays C). Arguments
 * are already checked; `ws` holds (gates + 1) x hidden elements. The forward
 * carries the state in h_n and c_n, the backward dLoss/dh and dLoss/dc in
 * grad_h0 and grad_c0: each ends as that output. */
#define PRNN_DEFINE_GATED_PASSES(real, suffix, exp_fn, tanh_fn)                                    \
  static real sigmoid_##suffix(real v) { return (real)1 / ((real)1 + exp_fn(-v)); }                \
                                                                                                   \
  static void fill_##suffix(real *out, int64_t n, real value) {                                    \
    int64_t k;                                                                                     \
    for (k = 0; k < n; ++k) out[k] = value;                                                        \
  }                                                                                                \
                                                                                                   \
  /* out = W v (+ bias): W rows x n with row stride w_stride, bias of rows or NULL */              \
  static void matvec_##suffix(real *out, const real *w, int64_t w_stride, int64_t rows,            \
                              const real *v, int64_t n, const real *bias) {                        \
    int64_t r, j;                                                                                  \
    for (r = 0; r < rows; ++r) {                                                                   \
      const real *wr = w + r * w_stride;                                                           \
      real acc = bias != NULL ? bias[r] : (real)0;                                                 \
      for (j = 0; j < n; ++j) acc += wr[j] * v[j];                                                 \
      out[r] = acc;                                                                                \
    }                                                                                              \
  }                                                                                                \
                                                                                                   \
  /* out += W^T d, by rows of W so that W is read contiguously */                                  \
  static void matvec_t_add_##suffix(real *out, const real *w, int64_t w_stride, int64_t rows,      \
                                    const real *d, int64_t n) {                                    \
    int64_t r, j;                                                                                  \
    for (r = 0; r < rows; ++r) {                                                                   \
      const real *wr = w + r * w_stride;                                                           \
      const real dr = d[r];                                                                        \
      for (j = 0; j < n; ++j) out[j] += wr[j] * dr;                                                \
    }                                                                                              \
  }                                                                                                \
                                                                                                   \
  static void gated_forward_##suffix(const prnn_problem_t *p,                                      \
                                     const prnn_gated_forward_args_t *a, real *ws) {               \
    const int64_t T = p->steps, B = p->batch, H = p->hidden, S = prnn_state_size(p);               \
    const int lstm = p->cell == PRNN_CELL_LSTM;                                                    \
    const int64_t G = prnn_cell_gates(p->cell), SAVED = prnn_cell_saved(p->cell);                  \
    const real *xp = (const real *)a->xp;     /* steps x batch x G*hidden, strided */              \
    const real *b_hh = (const real *)a->b_hh; /* G*hidden, or NULL */                              \
    const real *h0 = (const real *)a->h0;     /* batch x S, strided */                             \
    const real *c0 = (const real *)a->c0;     /* LSTM: batch x hidden, strided */                  \
    const real *w = (const real *)a->w_hh;    /* G*hidden x S, row stride */                       \
    const real *w_hr = (const real *)a->w_hr; /* S x hidden, row stride, or NULL */                \
    real *y = (real *)a->y;                   /* steps x batch x S */                              \
    real *saved = (real *)a->saved;           /* steps x batch x SAVED*hidden, or NULL */          \
    real *hh = ws;                            /* G*hidden: W_hh h_{t-1} + b_hh */                  \
    real *m = ws + G * H;                     /* hidden: LSTM's o tanh(c_t) */                     \
    int64_t t, b, u;                                                                               \
    for (b = 0; b < B; ++b) {                                                                      \
      const int64_t len = a->lengths != NULL ? a->lengths[b] : T;                                  \
      real *h = (real *)a->h_n + b * S;                        /* the state h */                   \
      real *c = lstm ? (real *)a->c_n + b * H : (real *)NULL; /* LSTM: the state c */              \
      for (u = 0; u < S; ++u) h[u] = h0[b * a->h0_stride_b + u];                                   \
      for (u = 0; lstm && u < H; ++u) c[u] = c0[b * a->c0_stride_b + u];                           \
      for (t = 0; t < T; ++t) {                                                                    \
        const real *x = xp + t * a->xp_stride_t + b * a->xp_stride_b;                              \
        real *yt = y + (t * B + b) * S;                                                            \
        real *st = saved != NULL ? saved + (t * B + b) * SAVED * H : (real *)NULL;                 \
        if (t >= len) { /* finished: state frozen, outputs zero */                                 \
          fill_##suffix(yt, S, 0);                                                                 \
          if (st != NULL) fill_##suffix(st, SAVED * H, 0);                                         \
          continue;                                                                                \
        }                                                                                          \
        matvec_##suffix(hh, w, a->w_hh_stride, G * H, h, S, b_hh);                                 \
        if (lstm) {                                                                                \
          for (u = 0; u < H; ++u) {                                                                \
            const real i = sigmoid_##suffix(x[u] + hh[u]);                                         \
            const real f = sigmoid_##suffix(x[H + u] + hh[H + u]);                                 \
            const real g = tanh_fn(x[2 * H + u] + hh[2 * H + u]);                                  \
            const real o = sigmoid_##suffix(x[3 * H + u] + hh[3 * H + u]);                         \
            c[u] = f * c[u] + i * g;                                                               \
            m[u] = o * tanh_fn(c[u]);                                                              \
            if (st != NULL) {                                                                      \
              st[u] = i;                                                                           \
              st[H + u] = f;                                                                       \
              st[2 * H + u] = g;                                                                   \
              st[3 * H + u] = o;                                                                   \
              st[4 * H + u] = c[u];                                                                \
            }                                                                                      \
          }                                                                                        \
          if (w_hr != NULL)                                                                        \
            matvec_##suffix(h, w_hr, a->w_hr_stride, S, m, H, (const real *)NULL);                 \
          else                                                                                     \
            for (u = 0; u < H; ++u) h[u] = m[u];                                                   \
        } else {                                                                                   \
          for (u = 0; u < H; ++u) {                                                                \
            const real r = sigmoid_##suffix(x[u] + hh[u]);                                         \
            const real z = sigmoid_##suffix(x[H + u] + hh[H + u]);                                 \
            const real n = tanh_fn(x[2 * H + u] + r * hh[2 * H + u]);                              \
            if (st != NULL) {                                                                      \
              st[u] = r;                                                                           \
              st[H + u] = z;                                                                       \
              st[2 * H + u] = n;                                                                   \
              st[3 * H + u] = hh[2 * H + u];                                                       \
            }                                                                                      \
            h[u] = (1 - z) * n + z * h[u];                                                         \
          }                                                                                        \
        }                                                                                          \
        for (u = 0; u < S; ++u) yt[u] = h[u];                                                      \
      }                                                                                            \
    }                                                                                              \
  }                                                                                                \
                                                                                                   \
  static void gated_backward_data_##suffix(const prnn_problem_t *p,                                \
                                           const prnn_gated_backward_args_t *a, real *ws) {        \
    const int64_t T = p->steps, B = p->batch, H = p->hidden, S = prnn_state_size(p);               \
    const int lstm = p->cell == PRNN_CELL_LSTM;                                                    \
    const int64_t G = prnn_cell_gates(p->cell), SAVED = prnn_cell_saved(p->cell);                  \
    const real *gy = (const real *)a->grad_y;     /* steps x batch x S, strided */                 \
    const real *gh_n = (const real *)a->grad_h_n; /* batch x S, strided, or NULL */                \
    const real *gc_n = (const real *)a->grad_c_n; /* LSTM: batch x hidden, strided, or NULL */     \
    const real *h0 = (const real *)a->h0;         /* batch x S, strided */                         \
    const real *c0 = (const real *)a->c0;         /* LSTM: batch x hidden, strided */              \
    const real *y = (const real *)a->y;           /* steps x batch x S */                          \
    const real *saved = (const real *)a->saved;   /* steps x batch x SAVED*hidden */               \
    const real *w = (const real *)a->w_hh;        /* G*hidden x S, row stride */                   \
    const real *w_hr = (const real *)a->w_hr;     /* S x hidden, row stride, or NULL */            \
    real *gxp = (real *)a->grad_xp;               /* steps x batch x G*hidden */                   \
    real *ghh = (real *)a->grad_hh;               /* GRU: steps x batch x G*hidden */              \
    real *gh = (real *)a->grad_h;                 /* projection: steps x batch x S */              \
    real *dm_proj = ws;                           /* hidden: W_hr^T dh */                          \
    int64_t t, b, u;                                                                               \
    for (b = 0; b < B; ++b) {                                                                      \
      const int64_t len = a->lengths != NULL ? a->lengths[b] : T;                                  \
      real *dh = (real *)a->grad_h0 + b * S;                        /* dLoss/dh_t */               \
      real *dc = lstm ? (real *)a->grad_c0 + b * H : (real *)NULL; /* LSTM: dLoss/dc_t */          \
      for (u = 0; u < S; ++u) dh[u] = gh_n != NULL ? gh_n[b * a->grad_h_n_stride_b + u] : 0;       \
      for (u = 0; lstm && u < H; ++u) dc[u] = gc_n != NULL ? gc_n[b * a->grad_c_n_stride_b + u] : 0; \
      for (t = T - 1; t >= 0; --t) {                                                               \
        const real *st = saved + (t * B + b) * SAVED * H;                                          \
        const real *gyt = gy + t * a->grad_y_stride_t + b * a->grad_y_stride_b;                    \
        real *gxt = gxp + (t * B + b) * G * H;                                                     \
        real *ghht = ghh != NULL ? ghh + (t * B + b) * G * H : (real *)NULL;                       \
        real *ght = gh != NULL ? gh + (t * B + b) * S : (real *)NULL;                              \
        const real *da; /* G*hidden: dLoss/d(W_hh h_{t-1} + b_hh) */                               \
        if (t >= len) { /* frozen: dh and dc pass through to the last valid step */                \
          fill_##suffix(gxt, G * H, 0);                                                            \
          if (ghht != NULL) fill_##suffix(ghht, G * H, 0);                                         \
          if (ght != NULL) fill_##suffix(ght, S, 0);                                               \
          continue;                                                                                \
        }                                                                                          \
        for (u = 0; u < S; ++u) dh[u] += gyt[u];                                                   \
        if (lstm) {                                                                                \
          const real *dm = dh; /* dLoss/dm_t */                                                    \
          if (w_hr != NULL) {                                                                      \
            for (u = 0; u < S; ++u) ght[u] = dh[u];                                                \
            fill_##suffix(dm_proj, H, 0);                                                          \
            matvec_t_add_##suffix(dm_proj, w_hr, a->w_hr_stride, S, dh, H);                        \
            dm = dm_proj;                                                                          \
          }                                                                                        \
          for (u = 0; u < H; ++u) {                                                                \
            const real i = st[u], f = st[H + u], g = st[2 * H + u], o = st[3 * H + u];             \
            const real c_prev = t > 0 ? st[4 * H + u - B * SAVED * H] : c0[b * a->c0_stride_b + u]; \
            const real tc = tanh_fn(st[4 * H + u]);                                                \
            const real dct = dc[u] + dm[u] * o * (1 - tc * tc);                                    \
            gxt[u] = dct * g * i * (1 - i);                                                        \
            gxt[H + u] = dct * c_prev * f * (1 - f);                                               \
            gxt[2 * H + u] = dct * i * (1 - g * g);                                                \
            gxt[3 * H + u] = dm[u] * tc * o * (1 - o);                                             \
            dc[u] = dct * f;                                                                       \
          }                                                                                        \
          fill_##suffix(dh, S, 0); /* dm is read: dh_{t-1} = W_hh^T da below */                    \
          da = gxt;                                                                                \
        } else {                                                                                   \
          const real *h_prev = t > 0 ? y + ((t - 1) * B + b) * S : h0 + b * a->h0_stride_b;        \
          for (u = 0; u < H; ++u) {                                                                \
            const real r = st[u], z = st[H + u], n = st[2 * H + u], hn = st[3 * H + u];            \
            const real dn = dh[u] * (1 - z) * (1 - n * n); /* d of n's pre-activation */           \
            const real dr = dn * hn * r * (1 - r);                                                 \
            const real dz = dh[u] * (h_prev[u] - n) * z * (1 - z);                                 \
            gxt[u] = ghht[u] = dr;                                                                 \
            gxt[H + u] = ghht[H + u] = dz;                                                         \
            gxt[2 * H + u] = dn;                                                                   \
            ghht[2 * H + u] = dn * r;                                                              \
            dh[u] *= z; /* h_t's direct term z h_{t-1} */                                          \
          }                                                                                        \
          da = ghht;                                                                               \
        }                                                                                          \
        matvec_t_add_##suffix(dh, w, a->w_hh_stride, G * H, da, S);                                \
      }                                                                                            \
    }                                                                                              \
  }

PRNN_DEFINE_GATED_PASSES(float, f32, expf, tanhf)
PRNN_DEFINE_GATED_PASSES(double, f64, exp, tanh)

prnn_status_t prnn_gated_forward_cpu(const prnn_problem_t *problem,
                                     const prnn_gated_forward_args_t *args, void *workspace,
                                     size_t workspace_bytes) {
  prnn_status_t status;
  prnn_clear_error();
  status = prnn_check_gated_forward_args(problem, args);
  if (status != PRNN_STATUS_SUCCESS) return status;
  status = prnn_check_cpu_call(problem, args->lengths, workspace, workspace_bytes);
  if (status != PRNN_STATUS_SUCCESS) return status;
  if (problem->dtype == PRNN_DTYPE_FLOAT32)
    gated_forward_f32(problem, args, (float *)workspace);
  else
    gated_forward_f64(problem, args, (double *)workspace);
  return PRNN_STATUS_SUCCESS;
}

prnn_status_t prnn_gated_backward_data_cpu(const prnn_problem_t *problem,
                                           const prnn_gated_backward_args_t *args,
                                           void *workspace, size_t workspace_bytes) {
  prnn_status_t status;
  prnn_clear_error();
  status = prnn_check_gated_backward_args(problem, args);
  if (status != PRNN_STATUS_SUCCESS) return status;
  status = prnn_check_cpu_call(problem, args->lengths, workspace, workspace_bytes);
  if (status != PRNN_STATUS_SUCCESS) return status;
  if (problem->dtype == PRNN_DTYPE_FLOAT32)
    gated_backward_data_f32(problem, args, (float *)workspace);
  else
    gated_backward_data_f64(problem, args, (double *)workspace);
  return PRNN_STATUS_SUCCESS;
}
