/*
 * rnn_math.cuh - element conversions and rounding for every kernel, and what
 * the Elman kernel families read besides: their params, their tensors and the
 * sequences' lengths (the cell's arithmetic is cells.cuh's ElmanCell).
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
 * by the entry point, then by the family's launcher for its own part. The
 * grid tier's and the cluster grid's parts share their place (an anonymous
 * union), so that every field keeps its offset in the kernels' parameter
 * block. (A union around the exchange pointer changed the code nvcc makes for
 * one grid-tier shape.) */
struct RecurrenceParams {
  int steps;              /* T */
  int batch;              /* B */
  int hidden;             /* H */
  union {
    struct {
      int hidden_padded;  /* blockDim.x * KL >= H, the K extent a CTA covers */
    } grid;               /* grid tier (persistent.cuh) */
    struct {
      int team_rows;      /* 160 G >= H, the rows its G clusters cover */
    } cluster_grid;       /* cluster grid (cluster_grid.cuh) */
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
  unsigned long long *exchange; /* the grid-wide exchange, in the workspace (zeroed), laid out by its
                                   family: grid tier, 2 x batch x hidden_padded/PACK tagged words;
                                   cluster grid, flags [8][16][8] u32, then [2][8][team_rows] fp32 */
  struct {
    int group_seqs;       /* sequences a cluster, 1..8 */
  } cluster;              /* cluster tier, tensor-core kernel (cluster.cuh) */
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
