/*
 * floor.cu - the per-step floor of a grid-wide persistent loop on this GPU.
 *
 *   grid_sync:  cooperative_groups grid.sync() per step, one CTA per SM
 *   exchange:   the tagged-word exchange of persistent.cuh with no arithmetic:
 *               each of G CTAs publishes its rows of s_t for B sequences and
 *               polls all of s_{t-1} (B x H float32), as the real kernel does
 *   barrier_data: a counter barrier, then every CTA reads s_{t-1} (plain floats)
 *
 * Prints one JSON object per line: {"what", "ctas", "batch", "hidden", "us_per_step"}.
 * Build: nvcc -O3 -std=c++17 -arch=sm_90 floor.cu -o floor
 */
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include "cuda_check.h"

__global__ void grid_sync_kernel(int steps, int *sink) {
  cooperative_groups::grid_group grid = cooperative_groups::this_grid();
  int x = 0;
  for (int s = 0; s < steps; ++s) {
    x += s;
    grid.sync();
  }
  if (x == -1) *sink = x;
}

__device__ __forceinline__ unsigned long long load_word(const unsigned long long *p) {
  unsigned long long v;
  asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void store_word(unsigned long long *p, unsigned long long v) {
  asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" : : "l"(p), "l"(v) : "memory");
}

/* The tagged-word exchange: each thread polls B*H/blockDim words of s_{t-1},
 * warp-coalesced (word i*blockDim + tid), eight loads in flight, re-polling the
 * missing ones per round; threads < rows*batch then publish one word of s_t. */
__global__ void exchange_kernel(int steps, int batch, int hidden, int rows, unsigned long long *xchg, float *sink) {
  const int per_thread = batch * hidden / blockDim.x; /* a multiple of 8 for the shapes below */
  float acc = 0.f;
  for (int s = 1; s < steps; ++s) {
    const unsigned long long *prev = xchg + (size_t)((s + 1) & 1) * batch * hidden + threadIdx.x;
    unsigned long long *next = xchg + (size_t)(s & 1) * batch * hidden;
    const unsigned tag = (unsigned)s - 1;
    for (int i0 = 0; s > 1 && i0 < per_thread; i0 += 8) {
      unsigned long long v[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = load_word(prev + (i0 + i) * blockDim.x);
      for (;;) {
        bool all = true;
#pragma unroll
        for (int i = 0; i < 8; ++i) all &= (unsigned)(v[i] >> 32) == tag;
        if (all) break;
#pragma unroll
        for (int i = 0; i < 8; ++i)
          if ((unsigned)(v[i] >> 32) != tag) v[i] = load_word(prev + (i0 + i) * blockDim.x);
      }
#pragma unroll
      for (int i = 0; i < 8; ++i) acc += __uint_as_float((unsigned)v[i]);
    }
    __syncthreads();
    if (threadIdx.x < rows * batch) {
      const int b = threadIdx.x / rows, r = blockIdx.x * rows + threadIdx.x % rows;
      store_word(next + (size_t)b * hidden + r, ((unsigned long long)s << 32) | __float_as_uint(acc));
    }
  }
  if (acc == -1.f) *sink = acc;
}

/* The same step with a counter barrier and plain float data: publish, arrive
 * (release), wait for all CTAs (acquire), then read all of s_{t-1} coalesced. */
__global__ void barrier_data_kernel(int steps, int batch, int hidden, int rows, unsigned long long *buffer,
                                    float *sink) {
  unsigned *counter = (unsigned *)buffer;
  float *data = (float *)(buffer + 16);
  const int per_thread = batch * hidden / blockDim.x;
  float acc = 0.f;
  for (int s = 1; s < steps; ++s) {
    const float *prev = data + (size_t)((s + 1) & 1) * batch * hidden + threadIdx.x;
    float *next = data + (size_t)(s & 1) * batch * hidden;
    if (threadIdx.x == 0 && s > 1) {
      unsigned seen;
      do {
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(counter) : "memory");
      } while (seen < (unsigned)(s - 1) * gridDim.x);
    }
    __syncthreads();
    for (int i0 = 0; s > 1 && i0 < per_thread; i0 += 8) {
      float v[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = __ldcg(prev + (i0 + i) * blockDim.x);
#pragma unroll
      for (int i = 0; i < 8; ++i) acc += v[i];
    }
    if (threadIdx.x < rows * batch) {
      const int b = threadIdx.x / rows, r = blockIdx.x * rows + threadIdx.x % rows;
      next[(size_t)b * hidden + r] = acc;
    }
    __syncthreads();
    if (threadIdx.x == 0) asm volatile("red.release.gpu.global.add.u32 [%0], 1;" : : "l"(counter) : "memory");
  }
  if (acc == -1.f) *sink = acc;
}

/* Best of five timed cooperative launches after two warm-ups, in ms; `reset` runs before each. */
static float time_coop(const void *fn, int grid, int block, void **args, void (*reset)(void *), void *ctx) {
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  float best = 1e30f;
  for (int rep = 0; rep < 7; ++rep) {
    if (reset) reset(ctx);
    CHECK(cudaEventRecord(a));
    CHECK(cudaLaunchCooperativeKernel(fn, grid, block, args, 0, 0));
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    float ms;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    if (rep >= 2 && ms < best) best = ms;
  }
  CHECK(cudaEventDestroy(a));
  CHECK(cudaEventDestroy(b));
  return best;
}

struct Buffer {
  void *ptr;
  size_t bytes;
};
static void zero_buffer(void *ctx) { /* tags restart at every launch */
  Buffer *buf = (Buffer *)ctx;
  CHECK(cudaMemset(buf->ptr, 0, buf->bytes));
}

int main(void) {
  int sms;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  int *sink;
  CHECK(cudaMalloc(&sink, 16));
  const int steps = 4096;
  {
    int st = steps;
    void *args[] = {&st, &sink};
    const float ms = time_coop((const void *)grid_sync_kernel, sms, 256, args, NULL, NULL);
    printf("{\"what\": \"grid_sync\", \"ctas\": %d, \"batch\": 0, \"hidden\": 0, \"us_per_step\": %.4f}\n", sms,
           1000.f * ms / steps);
  }
  const int shapes[][3] = {{128, 1, 1024}, {128, 4, 1024}, {64, 4, 1024}, {32, 4, 1024}, {128, 16, 1024},
                           {64, 16, 1024}, {128, 4, 2048}};
  for (int i = 0; i < (int)(sizeof shapes / sizeof shapes[0]); ++i) {
    int ctas = shapes[i][0], batch = shapes[i][1], hidden = shapes[i][2], rows = hidden / ctas, st = steps;
    int threads = rows * batch > 128 ? rows * batch : 128;
    if (ctas > sms || threads > 1024) continue;
    Buffer buf = {NULL, 2 * (size_t)batch * hidden * sizeof(unsigned long long) + 128};
    CHECK(cudaMalloc(&buf.ptr, buf.bytes));
    float *fsink = (float *)sink;
    void *args[] = {&st, &batch, &hidden, &rows, &buf.ptr, &fsink};
    const void *kernels[] = {(const void *)exchange_kernel, (const void *)barrier_data_kernel};
    const char *names[] = {"exchange", "barrier_data"};
    for (int mode = 0; mode < 2; ++mode) {
      const float ms = time_coop(kernels[mode], ctas, threads, args, zero_buffer, &buf);
      printf("{\"what\": \"%s\", \"ctas\": %d, \"batch\": %d, \"hidden\": %d, \"us_per_step\": %.4f}\n",
             names[mode], ctas, batch, hidden, 1000.f * ms / steps);
    }
    CHECK(cudaFree(buf.ptr));
  }
  CHECK(cudaGetLastError());
  return 0;
}
