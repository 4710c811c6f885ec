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
    unsigned long long *words;     /* grid families: 2 x batch x a row a sequence, the exchanged state */
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

/* The forward of unit u of sequence b at step t, computed apart from its
 * stores so that a family can publish the unit's state first and store the
 * rest after, off the step's path. */
template <class Cell, typename E, typename A>
struct UnitForward {
  E out;                /* the output as stored: zero past the length */
  A sv[Cell::kSaved];   /* the saved values: zero past the length */
  /* From mat = W_hh h_{t-1} of its gates, its loaded inputs and what it
   * carries in `prev`: returns whether the step is active; then *y is the
   * unit's output and *carry what the cell carries (Cell::forward). */
  template <class Math>
  __device__ __forceinline__ bool run(const GatedParams &p, int t, int b, const UnitInputs<Cell, A> &in,
                                      const A (&mat)[Cell::kGates], A prev, A *y, A *carry) {
    const bool active = t < sequence_length(p.lengths, b, p.steps);
    *y = A(0);
#pragma unroll
    for (int k = 0; k < Cell::kSaved; ++k) sv[k] = A(0);
    if (active) {
      A hh[Cell::kGates];
#pragma unroll
      for (int g = 0; g < Cell::kGates; ++g) hh[g] = mat[g] + in.bias[g];
      *y = Cell::template forward<A, Math>(in.xp, hh, prev, carry, sv);
    }
    out = Round<E>::to(*y);
    return active;
  }
  __device__ __forceinline__ void store_saved(const GatedParams &p, int t, int b, int u) const {
    const int SV = Cell::kSaved, H = p.hidden;
    E *saved = static_cast<E *>(p.saved);
    if (saved != NULL)
#pragma unroll
      for (int k = 0; k < SV; ++k) saved[((size_t)t * p.batch + b) * SV * H + u + (size_t)k * H] = Round<E>::to(sv[k]);
  }
  /* y and the saved values of step t. */
  __device__ __forceinline__ void store(const GatedParams &p, int t, int b, int u) const {
    static_cast<E *>(p.y)[((size_t)t * p.batch + b) * p.state + u] = out;
    store_saved(p, t, b, u);
  }
};

/* Forward of unit u of sequence b at step t from mat = W_hh h_{t-1} of its
 * gates and its loaded inputs. Writes its saved values (zero past the
 * length) and returns whether the step is active; then *out is the unit's
 * output (else zero) and *carry what the cell carries (Cell::forward). */
template <class Cell, typename E, typename A, class Math = PreciseMath>
__device__ __forceinline__ bool forward_unit(const GatedParams &p, int t, int b, int u, const UnitInputs<Cell, A> &in,
                                             const A (&mat)[Cell::kGates], A prev, A *out, A *carry) {
  UnitForward<Cell, E, A> step;
  const bool active = step.template run<Math>(p, t, b, in, mat, prev, out, carry);
  step.store_saved(p, t, b, u);
  return active;
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

/* grad_xp (and grad_hh, where the pass keeps it) of unit u of sequence b
 * at step t, from the gate gradients of its two sides. */
template <class Cell, typename E, typename A>
__device__ __forceinline__ void store_unit_grads(const GatedParams &p, int t, int b, int u,
                                                 const A (&dxp)[Cell::kGates], const A (&dhh)[Cell::kGates]) {
  const int G = Cell::kGates, H = p.hidden;
  const size_t row = ((size_t)t * p.batch + b) * G * H + u;
  E *gxp = static_cast<E *>(p.grad_xp), *ghh = static_cast<E *>(p.grad_hh);
#pragma unroll
  for (int g = 0; g < G; ++g) {
    gxp[row + (size_t)g * H] = Round<E>::to(dxp[g]);
    if (ghh != NULL) ghh[row + (size_t)g * H] = Round<E>::to(dhh[g]);
  }
}

/* Backward of unit u of sequence b at an active step t; dh = dLoss/d(unit
 * output). Writes grad_xp (and grad_hh) and returns the hh-side gradients in
 * dhh; *carry (in: from t+1, out: for t-1) and *dh_direct as Cell::backward. */
template <class Cell, typename E, typename A>
__device__ __forceinline__ void backward_unit(const GatedParams &p, int t, int b, int u, const UnitSaved<Cell, A> &in,
                                              A dh, A *carry, A *dh_direct, A (&dhh)[Cell::kGates]) {
  A dxp[Cell::kGates];
  Cell::backward(dh, *carry, in.sv, in.prev, dxp, dhh, carry, dh_direct);
  store_unit_grads<Cell, E, A>(p, t, b, u, dxp, dhh);
}

/* Zero gradients of unit u of sequence b at a step past its length. */
template <class Cell, typename E>
__device__ __forceinline__ void zero_unit_grads(const GatedParams &p, int t, int b, int u) {
  float zero[Cell::kGates];
#pragma unroll
  for (int g = 0; g < Cell::kGates; ++g) zero[g] = 0.f;
  store_unit_grads<Cell, E, float>(p, t, b, u, zero, zero);
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
 * through the forward: its b_hh and c in registers, xp of this step and the
 * next two (loads run two steps ahead, as in cluster.cuh), and the last
 * step's output and saved values until they are stored. A family's step
 * runs step(), publishes the unit's state, and calls retire() later (after
 * its next barrier, or after its sends), so that the stores and the next
 * loads leave the step's path; finish() after the last. The next steps' xp
 * stay as stored until their step: converting a value waits for its load. */
template <class Cell, typename E>
struct ForwardUnitState {
  UnitInputs<Cell, float> in;
  float cell;
  E next_xp[Cell::kGates], after_xp[Cell::kGates];
  UnitForward<Cell, E, float> last;
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
  /* Step t from its gate sums and the unit's h_{t-1} (`own`): returns
   * whether it is active; then last.out is the unit's new state (past the
   * length the state stays `own`). */
  template <class Math>
  __device__ __forceinline__ bool step(const GatedParams &p, int t, int b, const float (&mat)[Cell::kGates],
                                       float own) {
    float y, carry;
    const bool active = last.template run<Math>(p, t, b, in, mat, Cell::kCarriesCell ? cell : own, &y, &carry);
    if (active && Cell::kCarriesCell) cell = carry;
    return active;
  }
  /* After step t: its stores, step t + 1's inputs in place, step t + 3's on their way. */
  __device__ __forceinline__ void retire(const GatedParams &p, int t, int b, int u) {
    last.store(p, t, b, u);
#pragma unroll
    for (int g = 0; g < Cell::kGates; ++g) {
      in.xp[g] = to_accum(next_xp[g]);
      next_xp[g] = after_xp[g];
    }
    if (t + 3 < p.steps) load_gate_inputs<Cell, E>(p, t + 3, b, u, true, after_xp);
  }
  /* After the last step's retire(): h_n (h as stored: E, or its 16 bits) and c_n. */
  template <typename V>
  __device__ __forceinline__ void finish(const GatedParams &p, int b, int u, V h) const {
    static_cast<V *>(p.h_n)[(size_t)b * p.hidden + u] = h;
    if (Cell::kCarriesCell) static_cast<E *>(p.c_n)[(size_t)b * p.hidden + u] = Round<E>::to(cell);
  }
};

/* What a thread's unit (sequence b, unit u; mine: it has one) carries
 * through the backward: dLoss/dh and dc from later steps, a GRU's direct part
 * of dh_{t-1}, the saved values and dy of the next step to run, loaded a
 * step ahead, and the last step's gradients until they are stored. Step s
 * runs t = T - 1 - s; s = T (t = -1) gives grad_h0. A family's step runs
 * step(), publishes the gate gradients, and calls store() and load() later
 * (after its next barrier, or after its sends), off the step's path. */
template <class Cell, typename E>
struct BackwardUnitState {
  int len;
  float carry_h, carry_c, direct;
  UnitSaved<Cell, E> next; /* as stored until their step: converting a value waits for its load */
  E next_dy;
  float grad_xp[Cell::kGates], grad_hh[Cell::kGates]; /* of the last step: zero past the length */
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
   * s > 0 and t + 1 is within the length): keeps its gradients of t for
   * store() (writes grad_h0, grad_c0 at t = -1) and returns the hh-side gate
   * gradients of t in dhh (zeros past the length). */
  template <class Later>
  __device__ __forceinline__ void step(const GatedParams &p, int s, int b, int u, float (&dhh)[Cell::kGates],
                                       Later later) {
    const int t = p.steps - 1 - s, H = p.hidden;
    if (s > 0 && t + 1 < len) carry_h = later() + direct;
#pragma unroll
    for (int g = 0; g < Cell::kGates; ++g) grad_xp[g] = grad_hh[g] = 0.f;
    if (t < 0) {
      static_cast<E *>(p.grad_h0)[(size_t)b * H + u] = Round<E>::to(carry_h);
      if (Cell::kCarriesCell) static_cast<E *>(p.grad_c0)[(size_t)b * H + u] = Round<E>::to(carry_c);
    } else if (t < len) {
      float sv[Cell::kSaved];
#pragma unroll
      for (int k = 0; k < Cell::kSaved; ++k) sv[k] = to_accum(next.sv[k]);
      Cell::backward(to_accum(next_dy) + carry_h, carry_c, sv, to_accum(next.prev), grad_xp, grad_hh, &carry_c,
                     &direct);
#pragma unroll
      for (int g = 0; g < Cell::kGates; ++g) dhh[g] = grad_hh[g];
    }
  }
  /* The gradients of step t (0 <= t < T), kept by step(). */
  __device__ __forceinline__ void store(const GatedParams &p, int t, int b, int u) const {
    store_unit_grads<Cell, E, float>(p, t, b, u, grad_xp, grad_hh);
  }
};
}  // namespace prnn

#endif /* PRNN_GATED_UNIT_CUH */
