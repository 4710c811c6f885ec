/* lab_common.h - what the standalone kernel labs (kernel_lab.cu, cluster_lab.cu,
 * projection_lab.cu) share: the buffers and forward parameters of a dense
 * problem and the median time of a launch. */
#ifndef PRNN_BENCH_LAB_COMMON_H
#define PRNN_BENCH_LAB_COMMON_H

#include <algorithm>
#include <vector>

#include "../cuda_check.h" /* beside floor.cu, which bench.py runs */
#include "rnn_math.cuh"

/* Forward over contiguous tensors: A = W_hh [hidden x hidden], in = xp
 * [steps x batch x hidden], h0 [batch x hidden], out [steps x batch x hidden]. */
static prnn::RecurrenceParams dense_params(int steps, int batch, int hidden, void *a, void *in, void *h0,
                                           void *out) {
  prnn::RecurrenceParams p = {};
  p.steps = steps;
  p.batch = batch;
  p.hidden = hidden;
  p.a = a;
  p.a_stride_row = hidden;
  p.a_stride_col = 1;
  p.in = in;
  p.in_stride_t = (int64_t)batch * hidden;
  p.in_stride_b = hidden;
  p.h0 = h0;
  p.h0_stride_b = hidden;
  p.out = out;
  return p;
}

/* The device buffers of a dense problem of up to `steps` steps, elements of
 * elem_bytes: A and xp filled with the byte fill_a_in, h0 with fill_h0 (out
 * unset), freed with the object. */
struct DenseBuffers {
  void *a = nullptr, *in = nullptr, *h0 = nullptr, *out = nullptr;
  DenseBuffers(int steps, int batch, int hidden, size_t elem_bytes, int fill_a_in, int fill_h0) {
    const size_t matrix = (size_t)hidden * hidden * elem_bytes, seq = (size_t)steps * batch * hidden * elem_bytes;
    CHECK(cudaMalloc(&a, matrix));
    CHECK(cudaMalloc(&in, seq));
    CHECK(cudaMalloc(&h0, (size_t)batch * hidden * elem_bytes));
    CHECK(cudaMalloc(&out, seq));
    CHECK(cudaMemset(a, fill_a_in, matrix));
    CHECK(cudaMemset(in, fill_a_in, seq));
    CHECK(cudaMemset(h0, fill_h0, (size_t)batch * hidden * elem_bytes));
  }
  ~DenseBuffers() {
    CHECK(cudaFree(a));
    CHECK(cudaFree(in));
    CHECK(cudaFree(h0));
    CHECK(cudaFree(out));
  }
  DenseBuffers(const DenseBuffers &) = delete;
  DenseBuffers &operator=(const DenseBuffers &) = delete;
};

/* Median over reps - 2 timed launches (the first two warm up); before() runs
 * untimed ahead of each launch(). */
template <typename Before, typename Launch>
static float median_launch_ms(int reps, Before before, Launch launch) {
  std::vector<float> times;
  cudaEvent_t t0, t1;
  CHECK(cudaEventCreate(&t0));
  CHECK(cudaEventCreate(&t1));
  for (int rep = 0; rep < reps; ++rep) {
    before();
    CHECK(cudaEventRecord(t0));
    launch();
    CHECK(cudaEventRecord(t1));
    CHECK(cudaEventSynchronize(t1));
    float ms;
    CHECK(cudaEventElapsedTime(&ms, t0, t1));
    if (rep >= 2) times.push_back(ms);
  }
  CHECK(cudaEventDestroy(t0));
  CHECK(cudaEventDestroy(t1));
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

#endif /* PRNN_BENCH_LAB_COMMON_H */
