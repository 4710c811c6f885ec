/*
 * cells.cuh - the cells as compile-time policies: gates per hidden unit,
 * values saved for the backward pass, and the pointwise forward and backward
 * of one hidden unit of one sequence (PyTorch's nn.RNN / nn.LSTM / nn.GRU,
 * prnn.h). Every kernel family is templated on its cell and calls these, so
 * all tiers compute the same function; a family only decides where the gate
 * sums come from. The Elman families take a cell of one gate (a row of A is
 * an output and an exchanged state value); the gated families the LSTM's
 * and the GRU's (G rows of W_hh a unit).
 *
 * Gated cells:
 * A is the arithmetic type (float, or double for float64). In the forward,
 * `hh` holds W_hh h_{t-1} + b_hh of the unit's G gates and `prev` what the
 * cell carries per unit (LSTM: c_{t-1}; GRU: h_{t-1}). In the backward, `dh`
 * is dLoss/d(the unit's output) at t, `carry` the cell's local gradient from
 * t+1 (LSTM: dLoss/dc_t), `prev` as in the forward.
 */
#ifndef PRNN_CELLS_CUH
#define PRNN_CELLS_CUH

#include "rnn_math.cuh"

namespace prnn {

/* The gates' functions, a policy of the forward: Precise (the libm functions
 * of A) for float32 and float64 values; Fast for sums whose results are kept
 * in 16 bits, where its error (under 1e-5 relative) is far below their rounding. */
struct PreciseMath {
  template <typename A> static __device__ __forceinline__ A sigmoid(A x) { return A(1) / (A(1) + exp(-x)); }
  static __device__ __forceinline__ float sigmoid(float x) { return 1.f / (1.f + expf(-x)); }
  template <typename A> static __device__ __forceinline__ A tanh_of(A x) { return tanh(x); }
  static __device__ __forceinline__ float tanh_of(float x) { return tanhf(x); }
};
struct FastMath {
  static __device__ __forceinline__ float sigmoid(float x) { return __fdividef(1.f, 1.f + __expf(-x)); }
  /* 1 - 2 / (e^{2x} + 1), exact at +-inf (e^{2x} = inf gives 1, 0 gives -1);
   * below |x| = 1/16, where that cancels, x - x^3 / 3 + 2 x^5 / 15 (relative
   * error of either under 1e-5 in float32; NaN stays NaN). */
  static __device__ __forceinline__ float tanh_of(float x) {
    const float x2 = x * x, series = fmaf(x * x2, fmaf(x2, 2.f / 15.f, -1.f / 3.f), x);
    return fabsf(x) < 0.0625f ? series : 1.f - __fdividef(2.f, __expf(2.f * x) + 1.f);
  }
};

/* Elman's cell: h_t = act(xp_t + W_hh h_{t-1}), xp holding both biases. The
 * activation (prnn_activation_t) is a value of the pass, so that one kernel
 * serves tanh and relu; the backward needs only the output y = act(x). */
struct ElmanCell {
  static const int kGates = 1;
  static const bool kCarriesCell = false;

  /* act(x). relu keeps NaN (like torch.relu): NaN < 0 is false. */
  template <typename A>
  static __device__ __forceinline__ A activate(int activation, A x) {
    if (activation == PRNN_ACT_RELU) return x < A(0) ? A(0) : x;
    return PreciseMath::tanh_of(x);
  }

  /* act'(x) written in terms of y = act(x). relu's is 0 where y <= 0 and 1
   * elsewhere, NaN included, as torch's relu backward passes the gradient. */
  template <typename A>
  static __device__ __forceinline__ A activation_grad(int activation, A y) {
    if (activation == PRNN_ACT_RELU) return y <= A(0) ? A(0) : A(1);
    return A(1) - y * y;
  }

  /*
   * One output of one step, either pass.
   *   mat:    (A s_prev)[row] for this sequence, A = W_hh (forward) or W_hh^T (backward)
   *   in:     xp_t (forward) or grad_y_t (backward) at (b, row)
   *   y:      forward output at (t, b, row), backward only
   *   frozen: the previous state at (b, row), forward only (used past the length)
   * Returns the output element and sets *state to the carried state.
   */
  template <typename A>
  static __device__ __forceinline__ A step(int backward, int activation, bool active, A mat, A in, A y, A frozen,
                                           A *state) {
    if (backward) {
      const A delta = active ? activation_grad(activation, y) * (mat + in) : A(0);
      *state = delta;
      return delta;
    }
    if (active) {
      *state = activate(activation, mat + in);
      return *state;
    }
    *state = frozen;
    return A(0);
  }
};

struct LstmCell {
  static const int kGates = PRNN_LSTM_GATES;  /* i, f, g, o */
  static const int kSaved = PRNN_LSTM_SAVED;  /* i, f, g, o after activation, c_t */
  static const bool kCarriesCell = true;      /* prev is c, kept beside h */

  /* Returns the unit's output m_t = o tanh(c_t); *carry = c_t. */
  template <typename A, class M = PreciseMath>
  static __device__ __forceinline__ A forward(const A (&xp)[kGates], const A (&hh)[kGates], A prev, A *carry,
                                              A (&saved)[kSaved]) {
    const A i = M::sigmoid(xp[0] + hh[0]), f = M::sigmoid(xp[1] + hh[1]);
    const A g = M::tanh_of(xp[2] + hh[2]), o = M::sigmoid(xp[3] + hh[3]);
    const A c = f * prev + i * g;
    saved[0] = i; saved[1] = f; saved[2] = g; saved[3] = o; saved[4] = c;
    *carry = c;
    return o * M::tanh_of(c);
  }

  /* Gradients of the gate pre-activations (both sides alike), the cell's
   * gradient for t-1 (*carry_out) and the part of dh_{t-1} that bypasses
   * W_hh (*dh_direct: none for an LSTM). */
  template <typename A>
  static __device__ __forceinline__ void backward(A dh, A carry, const A (&sv)[kSaved], A prev,
                                                  A (&dxp)[kGates], A (&dhh)[kGates], A *carry_out,
                                                  A *dh_direct) {
    const A i = sv[0], f = sv[1], g = sv[2], o = sv[3], tc = PreciseMath::tanh_of(sv[4]);
    const A dc = carry + dh * o * (A(1) - tc * tc);
    dxp[0] = dc * g * i * (A(1) - i);
    dxp[1] = dc * prev * f * (A(1) - f);
    dxp[2] = dc * i * (A(1) - g * g);
    dxp[3] = dh * tc * o * (A(1) - o);
#pragma unroll
    for (int k = 0; k < kGates; ++k) dhh[k] = dxp[k];
    *carry_out = dc * f;
    *dh_direct = A(0);
  }
};

struct GruCell {
  static const int kGates = PRNN_GRU_GATES;  /* r, z, n */
  static const int kSaved = PRNN_GRU_SAVED;  /* r, z, n, W_hn h_{t-1} + b_hn */
  static const bool kCarriesCell = false;    /* prev is the unit's own h_{t-1} */

  template <typename A, class M = PreciseMath>
  static __device__ __forceinline__ A forward(const A (&xp)[kGates], const A (&hh)[kGates], A prev, A *carry,
                                              A (&saved)[kSaved]) {
    const A r = M::sigmoid(xp[0] + hh[0]), z = M::sigmoid(xp[1] + hh[1]);
    const A n = M::tanh_of(xp[2] + r * hh[2]);
    saved[0] = r; saved[1] = z; saved[2] = n; saved[3] = hh[2];
    const A h = (A(1) - z) * n + z * prev;
    *carry = h;
    return h;
  }

  template <typename A>
  static __device__ __forceinline__ void backward(A dh, A carry, const A (&sv)[kSaved], A prev,
                                                  A (&dxp)[kGates], A (&dhh)[kGates], A *carry_out,
                                                  A *dh_direct) {
    (void)carry;
    const A r = sv[0], z = sv[1], n = sv[2], hn = sv[3];
    const A dn = dh * (A(1) - z) * (A(1) - n * n);
    const A dr = dn * hn * r * (A(1) - r);
    const A dz = dh * (prev - n) * z * (A(1) - z);
    dxp[0] = dr; dxp[1] = dz; dxp[2] = dn;
    dhh[0] = dr; dhh[1] = dz; dhh[2] = dn * r;
    *carry_out = A(0);
    *dh_direct = dh * z;
  }
};

}  // namespace prnn

#endif /* PRNN_CELLS_CUH */
