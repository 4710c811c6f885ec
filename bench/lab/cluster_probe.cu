/*
 * cluster_probe.cu - the cluster tier's exchange protocol in small, for
 * compute-sanitizer: a cluster of CTAS CTAs of 256 threads, launched like
 * cluster_rnn_kernel (cudaLaunchKernelEx with the cluster size as a launch
 * attribute, dynamic shared memory), with the same helpers (cluster.cuh). In
 * each of ROUNDS rounds every thread sends 16 bytes into the inbox of the next
 * CTA of the cluster with st.async ... complete_tx, counting them down on one
 * of BARS mbarriers of the receiver (per warp when BARS = 8, one per round
 * buffer pair when 16, like the kernel's [2 buffers][8 warps]); each receiver
 * checks what arrived. "late" arms a barrier only after the sends of its round
 * (the peer's bytes usually land first, tx-count below zero until the arm, as
 * PTX allows), which is what the cluster kernel does after its first step.
 *
 *   nvcc -O3 -std=c++17 -arch=sm_90 -I csrc/kernels -I bench/lab bench/lab/cluster_probe.cu -o build/cluster_probe
 *   build/cluster_probe CTAS BARS ROUNDS [late]   e.g. 2 1 1, 3 16 4 late
 * Prints "probe ...: OK" or the mismatch count; exit status 0 on OK.
 */
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "cluster.cuh"
#include "../cuda_check.h"

using namespace prnn;

const int kThreads = kClusterThreads; /* cluster_launch_config's block size */

__global__ void probe_kernel(int bars, int rounds, int late, int *mismatches) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 /* the helpers exist for sm_90 only */
  extern __shared__ __align__(16) unsigned char smem[];
  uint4 *inbox = reinterpret_cast<uint4 *>(smem);                       /* [2][kThreads] */
  uint64_t *bar = reinterpret_cast<uint64_t *>(inbox + 2 * kThreads); /* [bars] */
  const unsigned rank = cluster_rank(), ctas = cluster_size(), tid = threadIdx.x;
  const uint32_t inbox_addr = (uint32_t)__cvta_generic_to_shared(inbox);
  const uint32_t bar_addr = (uint32_t)__cvta_generic_to_shared(bar);
  /* the barrier that the bytes of thread `t` in round `r` count on, and its share of the bytes */
  const int per_round = bars == 16 ? 8 : bars; /* barriers in use per round */
  auto bar_of = [&](int r, unsigned t) {
    return (bars == 16 ? (r & 1) * 8 : 0) + (int)(t / (kThreads / per_round));
  };
  const unsigned bytes_per_bar = 16u * kThreads / per_round;
  if ((int)tid < bars) mbarrier_init(bar_addr + 8u * tid, 1);
  if (tid == 0) asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  __syncthreads();
  auto arm = [&](int r) {
    if (tid % (kThreads / per_round) == 0) mbarrier_expect_bytes(bar_addr + 8u * bar_of(r, tid), bytes_per_bar);
  };
  if (!late) arm(0);
  cluster_arrive(); /* every barrier initialised before any peer sends */
  cluster_wait();
  const unsigned to = (rank + 1) % ctas, from = (rank + ctas - 1) % ctas;
  for (int r = 0; r < rounds; ++r) {
    const int buf = r & 1;
    const uint4 v = make_uint4(rank, tid, r, 9);
    store_peer16_async(peer_address(inbox_addr + 16u * (buf * kThreads + tid), to), v,
                       peer_address(bar_addr + 8u * bar_of(r, tid), to));
    if (late) arm(r);
    const int b = bar_of(r, tid);
    const unsigned parity = bars == 16 ? (r >> 1) & 1 : r & 1; /* phase of barrier b used in round r */
    unsigned long long since = 0;
    for (unsigned round = 1; !mbarrier_done(bar_addr + 8u * b, parity); ++round) watchdog(round, &since);
    const uint4 got = inbox[buf * kThreads + tid];
    if (got.x != from || got.y != tid || got.z != (unsigned)r || got.w != 9) atomicAdd(mismatches, 1);
    /* everyone has read buffer `buf` (and armed the next round's barrier) before it is written again */
    if (!late && r + 1 < rounds) arm(r + 1);
    cluster_arrive();
    cluster_wait();
  }
#endif
}

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: %s CTAS BARS(1|8|16) ROUNDS [late]\n", argv[0]);
    return 2;
  }
  const int ctas = atoi(argv[1]), bars = atoi(argv[2]), rounds = atoi(argv[3]);
  const int late = argc > 4 && strcmp(argv[4], "late") == 0;
  const int smem = 2 * kThreads * 16 + 16 * 8;
  CHECK(cudaFuncSetAttribute((const void *)probe_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  int *mismatches, host = -1;
  CHECK(cudaMalloc(&mismatches, sizeof(int)));
  CHECK(cudaMemset(mismatches, 0, sizeof(int)));
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t cfg = cluster_launch_config(ctas, ctas, smem, 0, &attr);
  CHECK(cudaLaunchKernelEx(&cfg, probe_kernel, bars, rounds, late, mismatches));
  CHECK(cudaMemcpy(&host, mismatches, sizeof(int), cudaMemcpyDeviceToHost));
  CHECK(cudaFree(mismatches));
  printf("probe ctas=%d bars=%d rounds=%d%s: %s (%d mismatches)\n", ctas, bars, rounds, late ? " late" : "",
         host == 0 ? "OK" : "WRONG", host);
  return host == 0 ? 0 : 1;
}
