/* cuda_check.h - CHECK(call) for the standalone bench programs: print the failing
 * CUDA call with its error string and exit. */
#ifndef PRNN_BENCH_CUDA_CHECK_H
#define PRNN_BENCH_CUDA_CHECK_H

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(call)                                                                             \
  do {                                                                                          \
    cudaError_t err_ = (call);                                                                  \
    if (err_ != cudaSuccess) {                                                                  \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(err_)); \
      exit(1);                                                                                  \
    }                                                                                           \
  } while (0)

#endif /* PRNN_BENCH_CUDA_CHECK_H */
