/*
 * cluster_lab.cu - times the cluster kernel alone (no torch), per step, as the
 * slope over T = 64 and 1024: the harness for cluster-kernel experiments.
 *
 *   nvcc -O3 -std=c++17 -arch=sm_90 -I csrc/kernels -I bench/lab bench/lab/cluster_lab.cu -o build/clab
 *   build/clab <label>
 * Prints {"label", "hidden", "batch", "group", "clusters", "room", "waves", "us_per_step",
 * "intercept_us", "t1_us" (one step: launch, prologue, step)} lines for the bfloat16
 * kernel, and {"label", "hidden", "batch", "us_per_step", "intercept_us", "t1_us"}
 * for the FFMA one (cluster_ffma.cuh) and the cluster grid (cluster_grid.cuh, with
 * "clusters" and "room").
 */
#include <cstdio>
#include <cstdlib>

#include "cluster.cuh"
#include "cluster_ffma.cuh"
#include "cluster_grid.cuh"

#include "lab_common.h"

using namespace prnn;

/* The kernel with its attributes set; *room = how many of its clusters the device holds at once. */
template <int KT, int ROWS>
static void (*prepared_kernel(int hidden, int *room))(RecurrenceParams, InputProjection) {
  void (*fn)(RecurrenceParams, InputProjection) = cluster_rnn_kernel<ElmanCell, __nv_bfloat16, KT, ROWS>;
  const int smem = cluster_smem_bytes(128 * KT, ROWS), ctas = (hidden + ROWS - 1) / ROWS;
  CHECK(cudaFuncSetAttribute((const void *)fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  CHECK(cudaFuncSetAttribute((const void *)fn, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t one = cluster_launch_config(ctas, ctas, smem, 0, &attr);
  CHECK(cudaOccupancyMaxActiveClusters(room, (const void *)fn, &one));
  return fn;
}

template <int KT, int ROWS>
static float time_ms(void (*fn)(RecurrenceParams, InputProjection), int steps, int batch, int group, int hidden, void *a, void *in,
                     void *h0, void *out) {
  RecurrenceParams p = dense_params(steps, batch, hidden, a, in, h0, out);
  p.cluster.group_seqs = group;
  const int ctas = (hidden + ROWS - 1) / ROWS, groups = (batch + group - 1) / group;
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t cfg =
      cluster_launch_config(ctas * groups, ctas, cluster_smem_bytes(128 * KT, ROWS), 0, &attr);
  const InputProjection none = {}; /* xp given */
  return median_launch_ms(9, [] {}, [&] { CHECK(cudaLaunchKernelEx(&cfg, fn, p, none)); });
}

/* `group`: sequences per cluster (the library spreads a batch over as many clusters as fit at
 * once, `room`; more clusters than that run in `waves`). */
template <int KT, int ROWS = 64>
static void run(const char *label, int batch, int hidden, int group = 8) {
  if (group < 1 || group > kClusterSeqs) {
    fprintf(stderr, "group must be in 1..%d, got %d\n", kClusterSeqs, group);
    exit(1);
  }
  int room;
  void (*fn)(RecurrenceParams, InputProjection) = prepared_kernel<KT, ROWS>(hidden, &room);
  const int groups = (batch + group - 1) / group, waves = (groups + room - 1) / room;
  const int big = 1024;
  const DenseBuffers b(big, batch, hidden, 2, 0x3c, 0); /* bf16 0x3c3c = 0.0115 */
  const float short_ms = time_ms<KT, ROWS>(fn, 64, batch, group, hidden, b.a, b.in, b.h0, b.out);
  const float long_ms = time_ms<KT, ROWS>(fn, big, batch, group, hidden, b.a, b.in, b.h0, b.out);
  const float one_ms = time_ms<KT, ROWS>(fn, 1, batch, group, hidden, b.a, b.in, b.h0, b.out);
  printf("{\"label\": \"%s\", \"hidden\": %d, \"batch\": %d, \"group\": %d, \"clusters\": %d, \"room\": %d, "
         "\"waves\": %d, \"us_per_step\": %.3f, \"intercept_us\": %.1f, \"t1_us\": %.1f}\n", label, hidden, batch,
         group, groups, room, waves, 1000.f * (long_ms - short_ms) / (big - 64),
         1000.f * short_ms - 64 * 1000.f * (long_ms - short_ms) / (big - 64), 1000.f * one_ms);
}

/* The FFMA kernel (cluster_ffma.cuh): one sequence per cluster, `batch` clusters. */
template <typename E, int KC, int WR, int RREG>
static void run_ffma(const char *label, const char *dtype, int batch, int hidden) {
  void (*fn)(RecurrenceParams, InputProjection) = cluster_ffma_kernel<ElmanCell, E, KC, WR, RREG>;
  const int rows = 8 * WR, ctas = hidden > rows ? (hidden + rows - 1) / rows : 2;
  const int smem = cluster_ffma_smem_bytes((int)sizeof(E), KC, WR, RREG);
  CHECK(cudaFuncSetAttribute((const void *)fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  CHECK(cudaFuncSetAttribute((const void *)fn, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  const int big = 1024;
  const DenseBuffers b(big, batch, hidden, sizeof(E), 0, 0);
  auto time_ms = [&](int steps) {
    const RecurrenceParams p = dense_params(steps, batch, hidden, b.a, b.in, b.h0, b.out);
    cudaLaunchAttribute attr;
    const cudaLaunchConfig_t cfg = cluster_launch_config(ctas * batch, ctas, smem, 0, &attr);
    const InputProjection none = {}; /* xp given */
    return median_launch_ms(9, [] {}, [&] { CHECK(cudaLaunchKernelEx(&cfg, fn, p, none)); });
  };
  const float short_ms = time_ms(64), long_ms = time_ms(big), one_ms = time_ms(1);
  printf("{\"label\": \"%s %s\", \"hidden\": %d, \"batch\": %d, \"us_per_step\": %.3f, \"intercept_us\": %.1f, "
         "\"t1_us\": %.1f}\n", label, dtype, hidden, batch, 1000.f * (long_ms - short_ms) / (big - 64),
         1000.f * short_ms - 64 * 1000.f * (long_ms - short_ms) / (big - 64), 1000.f * one_ms);
}

/* The cluster grid (cluster_grid.cuh): ceil(H / 160) clusters of 8 CTAs in one
 * cooperative launch, groups of 8 sequences in turn. */
template <typename E>
static void run_grid(const char *label, const char *dtype, int batch, int hidden) {
  constexpr int RREG = 4;
  void (*fn)(RecurrenceParams) = cluster_grid_kernel<ElmanCell, E, 16, RREG>;
  const int clusters = (hidden + kGridClusterRows - 1) / kGridClusterRows;
  const int smem = cluster_grid_smem_bytes((int)sizeof(E), 16, RREG);
  CHECK(cudaFuncSetAttribute((const void *)fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  cudaLaunchAttribute attrs[2];
  cudaLaunchConfig_t one = cluster_launch_config(kGridClusterCtas, kGridClusterCtas, smem, 0, &attrs[0]);
  int room = 0;
  CHECK(cudaOccupancyMaxActiveClusters(&room, (const void *)fn, &one));
  const int big = 1024;
  const DenseBuffers b(big, batch, hidden, sizeof(E), 0, 0);
  void *ws;
  const size_t ws_bytes = cluster_grid_workspace_bytes(clusters * kGridClusterRows);
  CHECK(cudaMalloc(&ws, ws_bytes));
  const cudaLaunchConfig_t cfg = cluster_grid_launch_config(clusters, smem, 0, attrs);
  auto params = [&](int steps) {
    RecurrenceParams p = dense_params(steps, batch, hidden, b.a, b.in, b.h0, b.out);
    p.cluster_grid.team_rows = clusters * kGridClusterRows;
    p.exchange = static_cast<unsigned long long *>(ws);
    return p;
  };
  auto zero_flags = [&] { CHECK(cudaMemsetAsync(ws, 0, (size_t)kGridFlagWords * 4)); };
  auto time_ms = [&](int steps) {
    const RecurrenceParams p = params(steps);
    return median_launch_ms(9, zero_flags, [&] { CHECK(cudaLaunchKernelEx(&cfg, fn, p)); });
  };
  const float short_ms = time_ms(64), long_ms = time_ms(big), one_ms = time_ms(1);
  printf("{\"label\": \"%s %s grid\", \"hidden\": %d, \"batch\": %d, \"clusters\": %d, \"room\": %d, "
         "\"us_per_step\": %.3f, \"intercept_us\": %.1f, \"t1_us\": %.1f}\n", label, dtype, hidden, batch, clusters,
         room, 1000.f * (long_ms - short_ms) / (big - 64),
         1000.f * short_ms - 64 * 1000.f * (long_ms - short_ms) / (big - 64), 1000.f * one_ms);
  CHECK(cudaFree(ws));
}

int main(int argc, char **argv) {
  const char *label = argc > 1 ? argv[1] : "cluster";
  run<8>(label, 4, 1024);
  run<8>(label, 1, 1024);
  run<4>(label, 4, 512);
  run<2>(label, 4, 256);
  run<8>(label, 16, 1024);
  /* smaller groups, more clusters */
  run<8>(label, 4, 1024, 1);
  run<8>(label, 4, 1024, 2);
  run<8>(label, 8, 1024, 1);
  run<8>(label, 16, 1024, 2);
  run<8>(label, 32, 1024, 4);
  /* 72 rows a CTA: H = 1152 on 16 CTAs */
  run<9, 72>(label, 4, 1152, 1);
  run<9, 72>(label, 1, 1152);
  run<9, 72>(label, 8, 1152, 1);
  run<9, 72>(label, 16, 1152, 2);
  run<9, 72>(label, 16, 1152);
  run_ffma<float, 8, 8, 6>(label, "f32", 4, 1024);
  run_ffma<float, 8, 8, 6>(label, "f32", 1, 1024);
  run_ffma<float, 8, 8, 6>(label, "f32", 16, 1024); /* more clusters than the device holds at once: waves */
  run_ffma<float, 4, 8, 8>(label, "f32", 4, 512);
  run_ffma<float, 2, 8, 8>(label, "f32", 4, 256);
  run_ffma<float, 9, 9, 5>(label, "f32", 4, 1152);
  for (int batch : {1, 4, 8, 16}) run_grid<float>(label, "f32", batch, 2048);
  for (int batch : {1, 4, 8, 16}) run_grid<__nv_bfloat16>(label, "bf16", batch, 2048);
  run_grid<__half>(label, "f16", 8, 2048);
  return 0;
}
