/*
 * kernel_lab.cu - times the persistent kernel alone (no torch, no launcher),
 * per step, at fixed tile shapes: the harness for kernel experiments (edit
 * persistent.cuh, build, compare labels; bench/NOTES.md has the ones run).
 *
 *   nvcc -O3 -std=c++17 -arch=sm_90 -I csrc/kernels -I bench/lab bench/lab/kernel_lab.cu -o build/lab
 *   build/lab <label>
 * Prints {"label", "dtype", "batch", "hidden", "us_per_step"} lines (slope over T = 64 and 1024).
 */
#include "persistent.cuh"

#include "lab_common.h"

using namespace prnn;

template <typename E, int R, int KL, int RREG, int MAXT>
static float time_ms(int steps, int batch, int hidden, void *a, void *in, void *h0, void *out, void *xchg) {
  const int block = (hidden + 32 * KL - 1) / (32 * KL) * 32, grid = (hidden + R - 1) / R;
  RecurrenceParams p = dense_params(steps, batch, hidden, a, in, h0, out);
  p.grid.hidden_padded = block * KL;
  p.exchange = (unsigned long long *)xchg;
  const size_t xbytes = 2 * (size_t)batch * (p.grid.hidden_padded / Pack<E>::value) * 8;
  const int smem = 2 * (block / 32) * (R >= 32 ? R : 32) * 4 + (R - RREG) * p.grid.hidden_padded * (int)sizeof(E);
  void (*fn)(RecurrenceParams) = persistent_rnn_kernel<ElmanCell, E, R, KL, RREG, MAXT>;
  CHECK(cudaFuncSetAttribute((const void *)fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  void *args[] = {&p};
  return median_launch_ms(
      7, [&] { CHECK(cudaMemset(xchg, 0, xbytes)); },
      [&] { CHECK(cudaLaunchCooperativeKernel((const void *)fn, grid, block, args, smem, 0)); });
}

template <typename E, int R, int KL, int RREG, int MAXT>
static void run(const char *label, const char *dtype, int batch, int hidden) {
  const int steps_max = 1024;
  /* small values: any bit pattern of 0x20 bytes is a small normal number in every dtype */
  const DenseBuffers b(steps_max, batch, hidden, sizeof(E), 0x20, 0x20);
  void *xchg;
  CHECK(cudaMalloc(&xchg, 2 * (size_t)batch * 4096 * 8));
  const float lo = time_ms<E, R, KL, RREG, MAXT>(64, batch, hidden, b.a, b.in, b.h0, b.out, xchg);
  const float hi = time_ms<E, R, KL, RREG, MAXT>(steps_max, batch, hidden, b.a, b.in, b.h0, b.out, xchg);
  printf("{\"label\": \"%s\", \"dtype\": \"%s\", \"batch\": %d, \"hidden\": %d, \"us_per_step\": %.3f}\n", label,
         dtype, batch, hidden, 1000.f * (hi - lo) / (steps_max - 64));
  CHECK(cudaFree(xchg));
}

int main(int argc, char **argv) {
  const char *label = argc > 1 ? argv[1] : "base";
  for (int batch : {1, 4, 16}) {
    run<float, 8, 8, 8, 256>(label, "float32", batch, 1024);
    run<__nv_bfloat16, 8, 8, 8, 256>(label, "bfloat16", batch, 1024);
  }
  run<float, 16, 8, 16, 256>(label, "float32/R16", 4, 1024);
  run<__nv_bfloat16, 16, 8, 16, 256>(label, "bfloat16/R16", 4, 1024);
  CHECK(cudaGetLastError());
  return 0;
}
