/*
 * rnn_math.cuh - element conversions and the per-output arithmetic shared by
 * the persistent and the stepwise kernels, so both tiers compute the same
 * function.
 */
#ifndef PRNN_RNN_MATH_CUH
#define PRNN_RNN_MATH_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "prnn.h"

namespace prnn {

/* One pass of one layer, for every Elman kernel family; plain old data filled
 * by the entry point, then by the family's launcher for its own fields. Those
 * of different families share their place (an anonymous union), so that every
 * field keeps its offset in the kernels' parameter block. (A union around
 * xchg changed the code nvcc makes for one grid-tier shape.) */
struct RecurrenceParams {
  int steps;              /* T */
  int batch;              /* B */
  int hidden;             /* H */
  union {
    int hidden_padded;    /* grid tier: blockDim.x * KL >= H, the K extent a CTA covers */
    int team_rows;        /* cluster grid: 160 G >= H, the rows its G clusters cover */
  };
  int backward;           /* 0: forward pass, 1: backward-data pass */
  int activation;         /* prnn_activation_t */
  const void *a;          /* A = W_hh (forward) or W_hh^T (backward): A[i][k] at a[i*a_stride_row + k*a_stride_col] */
  int64_t a_stride_row;
  int64_t a_stride_col;
  const void *in;         /* steps x batch x hidden: xp (forward) or grad_y (backward) */
  int64_t in_stride_t;
  int64_t in_stride_b;
  const void *y;          /* steps x batch x hidden, contiguous: forward output (backward only) */
  const void *h0;         /* batch x hidden: initial state (forward only) */
  int64_t h0_stride_b;
  const int32_t *lengths; /* batch, or NULL */
  void *out;              /* steps x batch x hidden, contiguous: y or grad_xp */
  unsigned long long *xchg; /* the grid-wide exchange, in the workspace: grid tier, 2 x batch x
                               hidden_padded/PACK tagged words (zeroed); cluster grid, flags
                               [8][16][8] u32 (zeroed), then [2][8][team_rows] fp32 */
  int group_seqs;         /* cluster tier: sequences per cluster, 1..8 */
};

/* Arithmetic type of an element type: float for every dtype but double. */
/* The bit pattern of a 16-bit value. */
__device__ __forceinline__ uint32_t bits16(__nv_bfloat16 x) { return __bfloat16_as_ushort(x); }
__device__ __forceinline__ uint32_t bits16(__half x) { return __half_as_ushort(x); }

template <typename E> struct AccumOf { typedef float type; };
template <> struct AccumOf<double> { typedef double type; };

__device__ __forceinline__ float to_accum(float x) { return x; }
__device__ __forceinline__ double to_accum(double x) { return x; }
__device__ __forceinline__ float to_accum(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_accum(__half x) { return __half2float(x); }

/* Rounds an accumulator value to the element type. */
template <typename E> struct Round;
template <> struct Round<float> { static __device__ __forceinline__ float to(float x) { return x; } };
template <> struct Round<double> { static __device__ __forceinline__ double to(double x) { return x; } };
template <> struct Round<__nv_bfloat16> {
  static __device__ __forceinline__ __nv_bfloat16 to(float x) { return __float2bfloat16_rn(x); }
};
template <> struct Round<__half> {
  static __device__ __forceinline__ __half to(float x) { return __float2half_rn(x); }
};

/* act(x). relu keeps NaN (like torch.relu): NaN < 0 is false. */
template <typename A>
__device__ __forceinline__ A activate(int activation, A x) {
  if (activation == PRNN_ACT_RELU) return x < A(0) ? A(0) : x;
  return tanh(x);
}
template <>
__device__ __forceinline__ float activate<float>(int activation, float x) {
  if (activation == PRNN_ACT_RELU) return x < 0.f ? 0.f : x;
  return tanhf(x);
}

/* act'(x) written in terms of y = act(x). relu's is 0 where y <= 0 and 1
 * elsewhere, NaN included, as torch's relu backward passes the gradient. */
template <typename A>
__device__ __forceinline__ A activation_grad(int activation, A y) {
  if (activation == PRNN_ACT_RELU) return y <= A(0) ? A(0) : A(1);
  return A(1) - y * y;
}

/*
 * One output of one step.
 *   mat:    (A s_prev)[row] for this sequence, A = W_hh (forward) or W_hh^T (backward)
 *   in:     xp_t (forward) or grad_y_t (backward) at (b, row)
 *   y:      forward output at (t, b, row), backward only
 *   frozen: the previous state at (b, row), forward only (used past the length)
 * Returns the output element and sets *state to the carried state.
 */
template <typename A>
__device__ __forceinline__ A step_output(int backward, int activation, bool active,
                                         A mat, A in, A y, A frozen, A *state) {
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

/* The pass's tensors at their element type E (every kernel's first lines):
 * out, and in, y and h0 as RecurrenceParams documents them. */
template <typename E>
__device__ __forceinline__ void typed_tensors(const RecurrenceParams &p, E *&out, const E *&in, const E *&y,
                                              const E *&h0) {
  out = static_cast<E *>(p.out);
  in = static_cast<const E *>(p.in);
  y = static_cast<const E *>(p.y);
  h0 = static_cast<const E *>(p.h0);
}

/* Sequence length of b, clamped to [0, steps]; steps without lengths. */
__device__ __forceinline__ int sequence_length(const int32_t *lengths, int b, int steps) {
  if (lengths == NULL) return steps;
  const int len = lengths[b];
  return len < 0 ? 0 : (len > steps ? steps : len);
}

}  // namespace prnn

#endif /* PRNN_RNN_MATH_CUH */
