/*
 * warp_reduce.cuh - warp-wide reductions by shuffles.
 */
#ifndef PRNN_WARP_REDUCE_CUH
#define PRNN_WARP_REDUCE_CUH

namespace prnn {

/*
 * Warp reduce-scatter of N partial sums: afterwards v[0 .. N/32) of lane l
 * hold the warp-wide sums of outputs l*N/32 .. l*N/32 + N/32 - 1. Each level
 * halves the live values: a lane keeps the half selected by its lane bit D and
 * sends the other half to lane ^ D. N - N/32 shuffles in all.
 */
template <int N, int LEN, int D>
struct ReduceScatter {
  static __device__ __forceinline__ void run(float (&v)[N], int lane) {
    const bool upper = (lane & D) != 0;
#pragma unroll
    for (int i = 0; i < LEN / 2; ++i) {
      const float send = upper ? v[i] : v[i + LEN / 2];
      const float keep = upper ? v[i + LEN / 2] : v[i];
      v[i] = keep + __shfl_xor_sync(0xffffffffu, send, D);
    }
    ReduceScatter<N, LEN / 2, D / 2>::run(v, lane);
  }
};
template <int N, int LEN>
struct ReduceScatter<N, LEN, 0> {
  static __device__ __forceinline__ void run(float (&)[N], int) {}
};

}  // namespace prnn

#endif /* PRNN_WARP_REDUCE_CUH */
