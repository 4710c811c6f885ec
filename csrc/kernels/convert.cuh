/*
 * convert.cuh - the bits of a 16-bit element, as the kernels pack weights,
 * states and staged tiles two to a 32-bit word.
 */
#ifndef PRNN_CONVERT_CUH
#define PRNN_CONVERT_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace prnn {

__device__ __forceinline__ uint32_t bits16(__nv_bfloat16 x) { return __bfloat16_as_ushort(x); }
__device__ __forceinline__ uint32_t bits16(__half x) { return __half_as_ushort(x); }

}  // namespace prnn

#endif /* PRNN_CONVERT_CUH */
