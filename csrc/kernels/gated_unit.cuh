/*
 * gated_unit.cuh - what every gated family (gated.cu, gated_cluster.cu,
 * gated_grid.cu, gated_ffma.cu) shares: the params of one pass of a gated
 * layer and the memory side of one hidden unit's forward and backward around
 * the cell policy (cells.cuh): its inputs, its saved values, lengths and
 * gradients, and what a thread that owns a unit for every step carries.
 */
#ifndef PRNN_GATED_UNIT_CUH
#define PRNN_GATED_UNIT_CUH

#include "cells.cuh"
#include "prnn_internal.h"

namespace prnn {

/* One pass of one gated layer, filled from the C API's args. */
struct GatedParams {
  int steps, batch, hidden, state; /* T, B, H, S */
  const void *xp;                  /* steps x batch x G*H */
  int64_t xp_stride_t, xp_stride_b;
  const void *b_hh;                /* G*H or NULL */
  const void *h0;                  /* batch x S */
  int64_t h0_stride_b;
  const void *c0;                  /* batch x H (LSTM) */
  int64_t c0_stride_b;
  const void *w_hh;                /* G*H x S */
  int64_t w_hh_stride;
  const void *w_hr;                /* S x H or NULL */
  int64_t w_hr_stride;
  const int32_t *lengths;
  void *y, *h_n, *c_n, *saved;     /* forward outputs, prnn_gated_forward_args_t */
  const void *grad_y;              /* backward inputs, prnn_gated_backward_args_t */
  int64_t grad_y_stride_t, grad_y_stride_b;
  const void *grad_h_n;
  int64_t grad_h_n_stride_b;
  const void *grad_c_n;
  int64_t grad_c_n_stride_b;
  void *grad_xp, *grad_hh, *grad_h, *grad_h0, *grad_c0;
  struct {
    int units_per_cta;             /* U */
    int k_padded;                  /* K of the on-chip matrix, padded to kKAlign */
    int batch_tile;                /* sequences staged at once */
    float *xchg;                   /* 2 x batch x k_padded exchanged values (K = S forward, G*H backward) */
  } persistent;                    /* persistent family (gated.cu) */
  struct {
    int seqs;                      /* sequences a cluster or group carries, 1..8 */
    unsigned long long *words;     /* grid family: 2 x batch x words a sequence, the exchanged state */
  } group;                         /* cluster and grid families (gated_cluster.cu, gated_grid.cu, gated_ffma.cu) */
};

/* ---------------------------------------------------------------- units */

/* What the forward of hidden unit u of sequence b at step t reads from
 * memory besides the gate sums, loaded ahead of them so that their latency
 * overlaps the exchange: the input side xp and the bias b_hh of its gates. */
template <class Cell, typename A>
struct UnitInputs {
  A xp[Cell::kGates];
  A bias[Cell::kGates];
};

template <class Cell, typename E, typename A>
__device__ __forceinline__ void load_unit_inputs(const GatedParams &p, int t, int b, int u,
                                                 UnitInputs<Cell, A> *in) {
  const int H = p.hidden;
  const E *xp = static_cast<const E *>(p.xp) + t * p.xp_stride_t + b * p.xp_stride_b + u;
  const E *bias = static_cast<const E *>(p.b_hh);
#pragma unroll
  for (int g = 0; g < Cell::kGates; ++g) {
    in->xp[g] = to_accum(xp[(size_t)g * H]);
    in->bias[g] = bias != NULL ? A(to_accum(bias[g * H + u])) : A(0);
  }
}

/* Forward of unit u of sequence b at step t from mat = W_hh h_{t-1} of its
 * gates and its loaded inputs. Writes its saved values (zero past the
 * length) and returns whether the step is active; then *out is the unit's
 * output and *carry what the cell carries (Cell::forward). */
template <class Cell, typename E, typename A, class Math = PreciseMath>
__device__ __forceinline__ bool forward_unit(const GatedParams &p, int t, int b, int u, const UnitInputs<Cell, A> &in,
                                             const A (&mat)[Cell::kGates], A prev, A *out, A *carry) {
  const int SV = Cell::kSaved, H = p.hidden;
  E *saved = static_cast<E *>(p.saved);
  const size_t srow = ((size_t)t * p.batch + b) * SV * H + u;
  if (t >= sequence_length(p.lengths, b, p.steps)) {
    if (saved != NULL)
      for (int k = 0; k < SV; ++k) saved[srow + (size_t)k * H] = Round<E>::to(A(0));
    return false;
  }
  A hh[Cell::kGates], sv[SV];
#pragma unroll
  for (int g = 0; g < Cell::kGates; ++g) hh[g] = mat[g] + in.bias[g];
  *out = Cell::template forward<A, Math>(in.xp, hh, prev, carry, sv);
  if (saved != NULL)
#pragma unroll
    for (int k = 0; k < SV; ++k) saved[srow + (size_t)k * H] = Round<E>::to(sv[k]);
  return true;
}

/* What the backward of unit u of sequence b at an active step t reads from
 * memory, loaded ahead of the gate-gradient products: its saved values and
 * what the forward's step carried in (c_{t-1} for an LSTM, h_{t-1} for a GRU). */
template <class Cell, typename A>
struct UnitSaved {
  A sv[Cell::kSaved];
  A prev;
};

/* A stored value x of type E as A: converted, or as stored where A is E. */
template <typename A, typename E> struct Loaded {
  static __device__ __forceinline__ A as(E x) { return A(to_accum(x)); }
};
template <typename E> struct Loaded<E, E> {
  static __device__ __forceinline__ E as(E x) { return x; }
};

template <class Cell, typename E, typename A>
__device__ __forceinline__ void load_unit_saved(const GatedParams &p, int t, int b, int u, UnitSaved<Cell, A> *in) {
  const int SV = Cell::kSaved, H = p.hidden, B = p.batch;
  const E *saved = static_cast<const E *>(p.saved);
  const size_t srow = ((size_t)t * B + b) * SV * H + u;
#pragma unroll
  for (int k = 0; k < SV; ++k) in->sv[k] = Loaded<A, E>::as(saved[srow + (size_t)k * H]);
  if (Cell::kCarriesCell)
    in->prev = Loaded<A, E>::as(t > 0 ? saved[srow - (size_t)B * SV * H + (size_t)(SV - 1) * H]
                                      : static_cast<const E *>(p.c0)[b * p.c0_stride_b + u]);
  else
    in->prev = Loaded<A, E>::as(t > 0 ? static_cast<const E *>(p.y)[((size_t)(t - 1) * B + b) * p.state + u]
                                      : static_cast<const E *>(p.h0)[b * p.h0_stride_b + u]);
}

/* Backward of unit u of sequence b at an active step t; dh = dLoss/d(unit
 * output). Writes grad_xp (and grad_hh) and returns the hh-side gradients in
 * dhh; *carry (in: from t+1, out: for t-1) and *dh_direct as Cell::backward. */
template <class Cell, typename E, typename A>
__device__ __forceinline__ void backward_unit(const GatedParams &p, int t, int b, int u, const UnitSaved<Cell, A> &in,
                                              A dh, A *carry, A *dh_direct, A (&dhh)[Cell::kGates]) {
  const int G = Cell::kGates, H = p.hidden, B = p.batch;
  A dxp[G];
  Cell::backward(dh, *carry, in.sv, in.prev, dxp, dhh, carry, dh_direct);
  E *gxp = static_cast<E *>(p.grad_xp) + ((size_t)t * B + b) * G * H + u;
  E *ghh = static_cast<E *>(p.grad_hh);
#pragma unroll
  for (int g = 0; g < G; ++g) {
    gxp[(size_t)g * H] = Round<E>::to(dxp[g]);
    if (ghh != NULL) ghh[((size_t)t * B + b) * G * H + (size_t)g * H + u] = Round<E>::to(dhh[g]);
  }
}

/* Zero gradients of unit u of sequence b at a step past its length. */
template <class Cell, typename E>
__device__ __forceinline__ void zero_unit_grads(const GatedParams &p, int t, int b, int u) {
  const int G = Cell::kGates, H = p.hidden;
  const size_t row = ((size_t)t * p.batch + b) * G * H + u;
  E *gxp = static_cast<E *>(p.grad_xp), *ghh = static_cast<E *>(p.grad_hh);
  for (int g = 0; g < G; ++g) {
    gxp[row + (size_t)g * H] = Round<E>::to(0.f);
    if (ghh != NULL) ghh[row + (size_t)g * H] = Round<E>::to(0.f);
  }
}

/* ------------------------------------------------- a unit across steps */

/* The G gate inputs xp of unit u of sequence b at step t as stored (zero
 * for no unit or past the steps; read-only here: written before the launch). */
template <class Cell, typename E>
__device__ __forceinline__ void load_gate_inputs(const GatedParams &p, int t, int b, int u, bool mine,
                                                 E (&xp)[Cell::kGates]) {
  const E *src = static_cast<const E *>(p.xp) + t * p.xp_stride_t + b * p.xp_stride_b + u;
#pragma unroll
  for (int g = 0; g < Cell::kGates; ++g) {
    xp[g] = Round<E>::to(0.f);
    if (mine && t < p.steps) xp[g] = __ldg(src + (size_t)g * p.hidden);
  }
}

/* What a thread's unit (sequence b, unit u; mine: it has one) carries
 * through the forward: its b_hh and c in registers, and xp of this step and
 * the next two (loads run two steps ahead, as in cluster.cuh). The next
 * steps' xp stay as stored until their step: converting a value waits for
 * its load. */
template <class Cell, typename E>
struct ForwardUnitState {
  UnitInputs<Cell, float> in;
  float cell;
  E next_xp[Cell::kGates], after_xp[Cell::kGates];
  __device__ __forceinline__ ForwardUnitState(const GatedParams &p, int b, int u, bool mine) {
    const E *b_hh = static_cast<const E *>(p.b_hh);
#pragma unroll
    for (int g = 0; g < Cell::kGates; ++g) in.bias[g] = mine && b_hh != NULL ? to_accum(b_hh[g * p.hidden + u]) : 0.f;
    cell = mine && Cell::kCarriesCell ? to_accum(static_cast<const E *>(p.c0)[b * p.c0_stride_b + u]) : 0.f;
    load_gate_inputs<Cell, E>(p, 0, b, u, mine, next_xp);
#pragma unroll
    for (int g = 0; g < Cell::kGates; ++g) in.xp[g] = to_accum(next_xp[g]);
    load_gate_inputs<Cell, E>(p, 1, b, u, mine, next_xp);
    load_gate_inputs<Cell, E>(p, 2, b, u, mine, after_xp);
  }
  /* After step t: step t + 1's inputs in place, step t + 3's on their way. */
  __device__ __forceinline__ void advance(const GatedParams &p, int t, int b, int u, bool mine) {
#pragma unroll
    for (int g = 0; g < Cell::kGates; ++g) {
      in.xp[g] = to_accum(next_xp[g]);
      next_xp[g] = after_xp[g];
    }
    if (t + 3 < p.steps) load_gate_inputs<Cell, E>(p, t + 3, b, u, mine, after_xp);
  }
};

/* What a thread's unit (sequence b, unit u; mine: it has one) carries
 * through the backward: dLoss/dh and dc from later steps, a GRU's direct part
 * of dh_{t-1}, and the saved values and dy of the next step to run, loaded a
 * step ahead. Step s runs t = T - 1 - s; s = T (t = -1) gives grad_h0. */
template <class Cell, typename E>
struct BackwardUnitState {
  int len;
  float carry_h, carry_c, direct;
  UnitSaved<Cell, E> next; /* as stored until their step: converting a value waits for its load */
  E next_dy;
  __device__ __forceinline__ BackwardUnitState(const GatedParams &p, int b, int u, bool mine)
      : len(mine ? sequence_length(p.lengths, b, p.steps) : 0), direct(0.f), next_dy(Round<E>::to(0.f)) {
    const E *grad_h_n = static_cast<const E *>(p.grad_h_n), *grad_c_n = static_cast<const E *>(p.grad_c_n);
    carry_h = mine && grad_h_n != NULL ? to_accum(grad_h_n[b * p.grad_h_n_stride_b + u]) : 0.f;
    carry_c = mine && grad_c_n != NULL ? to_accum(grad_c_n[b * p.grad_c_n_stride_b + u]) : 0.f;
    load(p, p.steps - 1, b, u);
  }
  /* The saved values and dy of step t (nothing past the length or for no unit). */
  __device__ __forceinline__ void load(const GatedParams &p, int t, int b, int u) {
    if (t >= 0 && t < len) {
      load_unit_saved<Cell, E, E>(p, t, b, u, &next);
      next_dy = static_cast<const E *>(p.grad_y)[t * p.grad_y_stride_t + b * p.grad_y_stride_b + u];
    }
  }
  /* Step s of this thread's unit from `later()`, its row of W_hh^T times the
   * gate gradients of t + 1 (its family's products, asked for only when
   * s > 0 and t + 1 is within the length): writes its gradients of t
   * (grad_h0, grad_c0 at t = -1) and returns the hh-side gate gradients of t
   * in dhh (zeros past the length). */
  template <class Later>
  __device__ __forceinline__ void step(const GatedParams &p, int s, int b, int u, float (&dhh)[Cell::kGates],
                                       Later later) {
    const int t = p.steps - 1 - s, H = p.hidden;
    if (s > 0 && t + 1 < len) carry_h = later() + direct;
    if (t < 0) {
      static_cast<E *>(p.grad_h0)[(size_t)b * H + u] = Round<E>::to(carry_h);
      if (Cell::kCarriesCell) static_cast<E *>(p.grad_c0)[(size_t)b * H + u] = Round<E>::to(carry_c);
    } else if (t < len) {
      UnitSaved<Cell, float> in;
#pragma unroll
      for (int k = 0; k < Cell::kSaved; ++k) in.sv[k] = to_accum(next.sv[k]);
      in.prev = to_accum(next.prev);
      backward_unit<Cell, E, float>(p, t, b, u, in, to_accum(next_dy) + carry_h, &carry_c, &direct, dhh);
    } else {
      zero_unit_grads<Cell, E>(p, t, b, u);
    }
  }
};
}  // namespace prnn

#endif /* PRNN_GATED_UNIT_CUH */
