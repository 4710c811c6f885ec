/*
 * dsmem.cuh - thread-block cluster primitives (sm_90 and later): cluster
 * launch configurations, the CTA's rank, cluster barriers, distributed shared
 * memory addresses, mbarriers with transaction counts and st.async stores
 * into a peer's shared memory; and the 16-bit bit patterns the cluster
 * kernels exchange.
 */
#ifndef PRNN_DSMEM_CUH
#define PRNN_DSMEM_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "rnn_math.cuh"

namespace prnn {

/* Every cluster kernel runs 8 warps a CTA. */
const int kClusterThreads = 256;
const int kClusterWarps = 8;
/* The most CTAs a cluster may have (a non-portable size, allowed per kernel). */
const int kClusterMaxCtas = 16;

/* The launch of `grid` CTAs of kClusterThreads threads in clusters of `ctas`
 * (a launch attribute, so the size is chosen at run time); *attr must outlive
 * the returned config. Shared by the library and the bench programs. */
inline cudaLaunchConfig_t cluster_launch_config(int grid, int ctas, int smem_bytes, cudaStream_t stream,
                                                cudaLaunchAttribute *attr) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((unsigned)grid);
  cfg.blockDim = dim3(kClusterThreads);
  cfg.dynamicSmemBytes = (size_t)smem_bytes;
  cfg.stream = stream;
  attr->id = cudaLaunchAttributeClusterDimension;
  attr->val.clusterDim.x = (unsigned)ctas;
  attr->val.clusterDim.y = 1;
  attr->val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cfg;
}

/* The same, cooperative: every CTA resident at once (or a launch error), for
 * kernels whose clusters wait for each other. */
inline cudaLaunchConfig_t cooperative_cluster_launch_config(int grid, int ctas, int smem_bytes, cudaStream_t stream,
                                                            cudaLaunchAttribute (&attrs)[2]) {
  cudaLaunchConfig_t cfg = cluster_launch_config(grid, ctas, smem_bytes, stream, &attrs[0]);
  attrs[1].id = cudaLaunchAttributeCooperative;
  attrs[1].val.cooperative = 1;
  cfg.attrs = attrs;
  cfg.numAttrs = 2;
  return cfg;
}

/* 16-bit bits of a float, rounded to E. */
template <typename E>
__device__ __forceinline__ unsigned short round_bits(float x) {
  return (unsigned short)bits16(Round<E>::to(x));
}
template <typename E> __device__ __forceinline__ float from_bits(unsigned short v);
template <> __device__ __forceinline__ float from_bits<__nv_bfloat16>(unsigned short v) {
  return __uint_as_float((uint32_t)v << 16);
}
template <> __device__ __forceinline__ float from_bits<__half>(unsigned short v) {
  return __half2float(__ushort_as_half(v));
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ unsigned cluster_rank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
__device__ __forceinline__ unsigned cluster_size() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(r));
  return r;
}
__device__ __forceinline__ unsigned cluster_index() {
  unsigned r;
  asm volatile("mov.u32 %0, %%clusterid.x;" : "=r"(r));
  return r;
}
/* Cluster barrier, used once at the start: the release costs a GPU-scope fence. */
__device__ __forceinline__ void cluster_arrive() {
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}
/* The shared-memory address of the same variable in CTA `rank` of the cluster. */
__device__ __forceinline__ uint32_t peer_address(uint32_t local, unsigned rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
  return remote;
}
/* mbarrier with a transaction count: peers' st.async stores count down the bytes. */
__device__ __forceinline__ void mbarrier_init(uint32_t bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbarrier_expect_bytes(uint32_t bar, unsigned bytes) {
  asm volatile("{ .reg .b64 state; mbarrier.arrive.expect_tx.shared::cta.b64 state, [%0], %1; }"
               :: "r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ bool mbarrier_done(uint32_t bar, unsigned parity) {
  uint32_t done;
  asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
               : "=r"(done) : "r"(bar), "r"(parity) : "memory");
  return done != 0;
}
/* 16 bytes into a peer's shared memory; the store counts them down on the
 * peer's mbarrier. (Narrower stores, 4 or 8 bytes a row, were 0.5 us/step
 * slower: bench/NOTES.md step 11; the state's layout lets a 16-byte store
 * carry 8 rows of one sequence instead, step 17.) */
__device__ __forceinline__ void store_peer16_async(uint32_t remote, uint4 v, uint32_t remote_bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];"
               :: "r"(remote), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "r"(remote_bar) : "memory");
}
#endif

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
/* A CTA's slice of the next state into every CTA of its cluster (itself
 * too), as 16-byte st.async stores of 8 values of one of `live` sequences
 * (WIDTH values a sequence), each counted on the receiver's mbarrier of the
 * warp whose K slice holds those columns. The (peer, chunk) pairs are spread
 * over the CTA's threads: this thread's first pair and its stride are set
 * once, so that a step needs no division. */
template <int WIDTH>
struct SliceStores {
  int chunks, first_peer, first_chunk, peer_stride, chunk_stride;
  __device__ __forceinline__ SliceStores(int live, int tid)
      : chunks(live * (WIDTH / 8)),
        first_peer(tid / chunks),
        first_chunk(tid % chunks),
        peer_stride(kClusterThreads / chunks),
        chunk_stride(kClusterThreads % chunks) {}

  /* slice: [sequence][slice_pitch] 16-bit; value r of a sequence goes into
   * each peer's state buffer `buffer` of the kSeqs-sequence buffers
   * [buffer][sequence][state_pitch] at `state` (this CTA's shared address),
   * column col_of(r) (r a multiple of 8: the 8 values stay contiguous);
   * bar_of(column): this CTA's shared address of the mbarrier that counts it. */
  template <int kSeqs, class ColOf, class BarOf>
  __device__ __forceinline__ void send(unsigned ctas, const unsigned short *slice, int slice_pitch, uint32_t state,
                                       int buffer, int state_pitch, ColOf col_of, BarOf bar_of) const {
    int peer = first_peer, chunk = first_chunk;
    while (peer < (int)ctas) {
      const int n = chunk / (WIDTH / 8), r = chunk % (WIDTH / 8) * 8; /* values [r, r + 8) of sequence n */
      const uint4 v = *reinterpret_cast<const uint4 *>(slice + n * slice_pitch + r);
      const int col = col_of(r);
      const uint32_t local = state + (uint32_t)(((buffer * kSeqs + n) * state_pitch + col) * 2);
      store_peer16_async(peer_address(local, peer), v, peer_address(bar_of(col), peer));
      peer += peer_stride;
      chunk += chunk_stride;
      if (chunk >= chunks) {
        chunk -= chunks;
        ++peer;
      }
    }
  }
};
#endif

}  // namespace prnn

#endif /* PRNN_DSMEM_CUH */
