/*
 * mma.cuh - the warp-level tensor-core operations shared by the tensor-core
 * cluster kernel (cluster.cuh) and the 16-bit input projection
 * (projection.cuh): mma.sync m16n8k16 with fp32 accumulation, and ldmatrix.
 */
#ifndef PRNN_MMA_CUH
#define PRNN_MMA_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace prnn {

/* D = A B + D for a 16 x 16 A (row-major fragments a[4]), a 16 x 8 B (b0, b1)
 * and a 16 x 8 fp32 D. */
template <typename E> struct MmaOp;
#define PRNN_MMA_OP(E, PTX_TYPE)                                                                            \
  template <> struct MmaOp<E> {                                                                             \
    static __device__ __forceinline__ void run(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) { \
      asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." PTX_TYPE "." PTX_TYPE                           \
                   ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"                            \
                   : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                                         \
                   : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));                         \
    }                                                                                                       \
  };
PRNN_MMA_OP(__nv_bfloat16, "bf16")
PRNN_MMA_OP(__half, "f16")
#undef PRNN_MMA_OP

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
/* 8 x 8 16-bit matrices from shared memory: x4 takes the row addresses of
 * lanes 0-31, x2 those of lanes 0-15; .trans transposes each matrix. */
__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t &r0, uint32_t &r1, uint32_t &r2,
                                            uint32_t &r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr) : "memory");
}
__device__ __forceinline__ void ldmatrix_x2(uint32_t addr, uint32_t &r0, uint32_t &r1) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];" : "=r"(r0), "=r"(r1) : "r"(addr) : "memory");
}
__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t addr, uint32_t &r0, uint32_t &r1) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];"
               : "=r"(r0), "=r"(r1) : "r"(addr) : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t addr, uint32_t &r0, uint32_t &r1, uint32_t &r2,
                                                  uint32_t &r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr) : "memory");
}
#endif

}  // namespace prnn

#endif /* PRNN_MMA_CUH */
