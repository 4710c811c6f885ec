/*
 * projection_lab.cu - where a fused layer's time goes (projection.cuh): the
 * float32 FFMA cluster kernel at H = I = 1024, T = 256, timed alone (no torch)
 * as (a) the recurrence with xp given, (b) the producers alone (only the
 * producer clusters launched: their throughput), (c) both in one launch.
 *
 *   nvcc -O3 -std=c++17 -arch=sm_90 -I csrc/kernels -I bench/lab bench/lab/projection_lab.cu -o build/plab
 *   build/plab <label> [sustain]
 * Prints one line per case: microseconds per launch and per step; with
 * "sustain", runs the recurrence alone and fused in turn for about a second
 * each (for nvidia-smi's clock and power readings beside it).
 */
#include <cstdio>

#include "cluster_ffma.cuh"
#include "lab_common.h"

using namespace prnn;

int main(int argc, char **argv) {
  const char *label = argc > 1 ? argv[1] : "projection";
  void (*fn)(RecurrenceParams, InputProjection) = cluster_ffma_kernel<ElmanCell, float, 8, 8, 6>;
  const int hidden = 1024, input = 1024, steps = 256, ctas = 16;
  const int smem_rec = cluster_ffma_smem_bytes(4, 8, 8, 6);
  const int smem = smem_rec > kProjSmemOffset + kProjSmemBytes ? smem_rec : kProjSmemOffset + kProjSmemBytes;
  CHECK(cudaFuncSetAttribute((const void *)fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  CHECK(cudaFuncSetAttribute((const void *)fn, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  cudaLaunchAttribute one_attr;
  const cudaLaunchConfig_t one = cluster_launch_config(ctas, ctas, smem, 0, &one_attr);
  int room = 0;
  CHECK(cudaOccupancyMaxActiveClusters(&room, (const void *)fn, &one));
  printf("{\"label\": \"%s\", \"room\": %d}\n", label, room);

  const int max_batch = 4;
  const DenseBuffers b(steps, max_batch, hidden, 4, 0, 0); /* a = W_hh and W_ih, in = x (and xp given) */
  void *ws;
  const size_t ws_bytes = projection_workspace_bytes(steps, max_batch, hidden, 4);
  CHECK(cudaMalloc(&ws, ws_bytes));

  /* producers clusters of producers, `steppers` clusters stepping (batch = steppers, or max_batch if none) */
  auto time_us = [&](int producers, int batch, bool stepping) {
    RecurrenceParams p = dense_params(steps, batch, hidden, b.a, b.in, b.h0, b.out);
    InputProjection q = {};
    size_t flag_bytes = 0;
    if (producers > 0) {
      flag_bytes = projection_flag_bytes(steps, batch);
      q = {producers, input, b.in, (int64_t)batch * input, input, b.a, input, NULL, NULL,
           static_cast<unsigned *>(ws)};
      p.in = static_cast<unsigned char *>(ws) + flag_bytes;
    }
    const int grid = ctas * (producers + (stepping ? batch : 0));
    cudaLaunchAttribute attrs[2];
    const cudaLaunchConfig_t cfg = cooperative_cluster_launch_config(grid, ctas, smem, 0, attrs);
    auto zero = [&] {
      if (flag_bytes > 0) CHECK(cudaMemsetAsync(ws, 0, flag_bytes));
    };
    return 1000.f * median_launch_ms(11, zero, [&] { CHECK(cudaLaunchKernelEx(&cfg, fn, p, q)); });
  };
  auto report = [&](const char *what, int producers, int batch, float us) {
    printf("{\"label\": \"%s\", \"case\": \"%s\", \"batch\": %d, \"producers\": %d, \"us\": %.1f, "
           "\"us_per_step\": %.3f, \"proj_gflops\": %.0f}\n",
           label, what, batch, producers, us, us / steps,
           producers > 0 ? 2e-3 * steps * batch * (double)input * hidden / us : 0.0);
  };
  if (argc > 2) { /* "sustain": ~1 s of each case back to back, for a clock and power trace beside it */
    for (int rounds = 0; rounds < 3; ++rounds) {
      for (int i = 0; i < 300; ++i) time_us(0, 4, true);
      printf("recurrence done\n");
      fflush(stdout);
      for (int i = 0; i < 300; ++i) time_us(room - 4, 4, true);
      printf("fused done\n");
      fflush(stdout);
    }
    return 0;
  }
  for (int batch : {1, 2, 4}) {
    const int producers = room - batch;
    report("recurrence", 0, batch, time_us(0, batch, true));
    report("producers alone", producers, batch, time_us(producers, batch, false));
    report("fused", producers, batch, time_us(producers, batch, true));
  }
  for (int producers : {1, 2, 3, room}) report("producers alone", producers, 4, time_us(producers, 4, false));
  CHECK(cudaFree(ws));
  return 0;
}
