/*
 * ffma.cuh - what the two FFMA cluster kernels (cluster_ffma.cuh, and the
 * cluster grid, cluster_grid.cuh) share: rows of A held as quads of 4
 * elements at their width and multiplied in float32, and the lead of their
 * shared memory.
 */
#ifndef PRNN_FFMA_CUH
#define PRNN_FFMA_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "rnn_math.cuh"

namespace prnn {

/* The mbarriers' 16 bytes, padded so that the shared buffers after them
 * start at a 128-byte boundary (in both FFMA kernels):
 * from byte 16 the cluster grid stepped 3-7% slower at H = 2048, B = 4-16
 * (the FFMA kernel alike either way; bench/NOTES.md step 38). */
const int kFfmaSmemLead = 128;

/* 4 consecutive elements of a row of A at their width, widened to float32,
 * and their dot product with 4 float32 state values. */
__device__ __forceinline__ float dot4(float4 a, float4 h, float acc) {
  acc = fmaf(a.x, h.x, acc);
  acc = fmaf(a.y, h.y, acc);
  acc = fmaf(a.z, h.z, acc);
  return fmaf(a.w, h.w, acc);
}
template <typename E> struct Quad;
template <> struct Quad<float> {
  typedef float4 type;
  static __device__ __forceinline__ float4 widen4(type a) { return a; }
  static __device__ __forceinline__ float dot(type a, float4 h, float acc) { return dot4(a, h, acc); }
  static __device__ __forceinline__ void put(type *q, int e, float v) { reinterpret_cast<float *>(q)[e] = v; }
};
/* 16-bit: element e in bits 16 (e % 2) of word e / 2 */
template <typename E> struct Quad16 {
  typedef uint2 type;
  static __device__ __forceinline__ float2 widen(uint32_t w);
  static __device__ __forceinline__ float4 widen4(type a) {
    const float2 lo = widen(a.x), hi = widen(a.y);
    return make_float4(lo.x, lo.y, hi.x, hi.y);
  }
  static __device__ __forceinline__ float dot(type a, float4 h, float acc) { return dot4(widen4(a), h, acc); }
  static __device__ __forceinline__ void put(type *q, int e, E v) {
    reinterpret_cast<unsigned short *>(q)[e] = (unsigned short)bits16(v);
  }
};
template <> __device__ __forceinline__ float2 Quad16<__nv_bfloat16>::widen(uint32_t w) {
  return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
}
template <> __device__ __forceinline__ float2 Quad16<__half>::widen(uint32_t w) {
  return make_float2(__half2float(__ushort_as_half((unsigned short)(w & 0xffffu))),
                     __half2float(__ushort_as_half((unsigned short)(w >> 16))));
}
template <> struct Quad<__nv_bfloat16> : Quad16<__nv_bfloat16> {};
template <> struct Quad<__half> : Quad16<__half> {};

}  // namespace prnn

#endif /* PRNN_FFMA_CUH */
