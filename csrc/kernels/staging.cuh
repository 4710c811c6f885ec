/*
 * staging.cuh - copies from global memory into shared memory before a
 * kernel's steps (its part of W_hh, the initial state) with many loads of a
 * thread in flight at once. A load behind a branch, or one whose value is
 * stored before the next is issued, waits for the one before it: a thread's
 * copy then costs a memory round trip an element.
 */
#ifndef PRNN_STAGING_CUH
#define PRNN_STAGING_CUH

#include <stdint.h>

namespace prnn {

/* src[offset] where ok, else zero; the load is issued either way (from
 * src[0], which must be readable), so a loop of them has no branch. */
template <typename T>
__device__ __forceinline__ T masked_load(const T *src, int64_t offset, bool ok) {
  const T v = __ldg(src + (ok ? offset : 0));
  return ok ? v : T{};
}

/* store(i, load(i)) for i = tid, tid + THREADS, ... below n, the BATCH loads
 * of a round issued before any of its stores. load(i) must read a valid
 * address for every i (masked_load). */
template <int THREADS, int BATCH, class Load, class Store>
__device__ __forceinline__ void batched_copy(int n, int tid, Load load, Store store) {
  for (int i0 = tid; i0 < n; i0 += BATCH * THREADS) {
    decltype(load(0)) v[BATCH];
#pragma unroll
    for (int j = 0; j < BATCH; ++j) v[j] = load(i0 + j * THREADS);
#pragma unroll
    for (int j = 0; j < BATCH; ++j)
      if (i0 + j * THREADS < n) store(i0 + j * THREADS, v[j]);
  }
}

} // namespace prnn

#endif
