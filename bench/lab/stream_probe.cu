/*
 * stream_probe.cu - the resident stream's protocol without its math: what a
 * step's round trip costs, host to host, for each way of passing the request
 * on to the CTAs and the answer back (bench/NOTES.md, issue 21's bar).
 *
 * A grid of `ctas` CTAs (one an SM, 256 threads) runs a command loop like
 * resident.cu's. A STEP carries x_t (`x` 4-byte values in tagged 8-byte
 * words, {value, seq}, host-mapped) and returns y_t (`y` values, each CTA a
 * share). The ways, by flags:
 *   relay   CTA 0 polls the host's request and hands the command on through a
 *           device word (release/acquire at GPU scope), with x_t copied into
 *           device memory before it; without it every CTA polls the host.
 *   eager   CTA 0 reads x_t's words with every poll of the request.
 *   tagrelay the relayed x_t keeps its tags and the command word is stored
 *           relaxed: the other CTAs poll the device word and re-read x_t's
 *           words until they carry the step's number (no release fence).
 *   tagy    y_t as tagged 8-byte words {value, seq} the host polls, no answer
 *           word; else y_t plain (st.relaxed.sys) and each CTA's answer word
 *           after it (st.release.sys), the host polling every answer.
 *   after   after answering, a grid-wide arrival and wait (as before the
 *           resident kernel's recurrent product) and ~`after_ns` of spin.
 * Every CTA reads all of x_t (its W_ih x_t needs it) and sums it into y.
 *
 *   nvcc -O3 -std=c++17 -arch=sm_90 -I bench bench/lab/stream_probe.cu -o build/stream_probe
 *   build/stream_probe [steps]
 * Prints one line a case: flags, ctas, x, y, p50 and p99 in µs, and "ok" when
 * every y_t held what the step should have returned.
 */
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <time.h>
#include <vector>

#include "cuda_check.h"

const int kThreads = 256;
const int kMaxCtas = 256;
const unsigned kStep = 1, kStop = 2;

struct Mailbox {
  unsigned long long request; /* seq (low), command (high) */
  uint32_t pad[30];
  uint32_t answer[kMaxCtas];
};

struct Control {
  unsigned long long go; /* relayed seq (low), command (high) */
  unsigned pad0[30];
  unsigned arrivals;
  unsigned pad1[31];
};

struct Flags {
  int relay, eager, tagrelay, tagy, after;
};

struct Params {
  Flags f;
  Mailbox *mailbox;
  const unsigned long long *x_words; /* host: 2 x_pairs tagged words */
  int x_pairs;
  unsigned long long *x_relay;       /* device: 2 x_pairs words */
  float *y_plain;                    /* host: y values */
  unsigned long long *y_tagged;      /* host: y tagged words */
  int y;
  int after_ns;
  Control *control;
};

__device__ __forceinline__ unsigned long long ld_sys(const unsigned long long *p) {
  unsigned long long v;
  asm volatile("ld.relaxed.sys.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ ulonglong2 ld_sys2(const unsigned long long *p) {
  ulonglong2 v;
  asm volatile("ld.relaxed.sys.v2.u64 {%0, %1}, [%2];" : "=l"(v.x), "=l"(v.y) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ ulonglong2 ld_gpu2(const unsigned long long *p) {
  ulonglong2 v;
  asm volatile("ld.relaxed.gpu.v2.u64 {%0, %1}, [%2];" : "=l"(v.x), "=l"(v.y) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_gpu2(unsigned long long *p, ulonglong2 v) {
  asm volatile("st.relaxed.gpu.v2.u64 [%0], {%1, %2};" : : "l"(p), "l"(v.x), "l"(v.y) : "memory");
}
__device__ __forceinline__ unsigned long long ld_acquire_gpu(const unsigned long long *p) {
  unsigned long long v;
  asm volatile("ld.acquire.gpu.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ unsigned long long ld_relaxed_gpu(const unsigned long long *p) {
  unsigned long long v;
  asm volatile("ld.relaxed.gpu.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_release_gpu(unsigned long long *p, unsigned long long v) {
  asm volatile("st.release.gpu.u64 [%0], %1;" : : "l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ void st_relaxed_gpu(unsigned long long *p, unsigned long long v) {
  asm volatile("st.relaxed.gpu.u64 [%0], %1;" : : "l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ void st_sys_f32(float *p, float v) {
  asm volatile("st.relaxed.sys.f32 [%0], %1;" : : "l"(p), "f"(v) : "memory");
}
__device__ __forceinline__ void st_sys_u64(unsigned long long *p, unsigned long long v) {
  asm volatile("st.relaxed.sys.u64 [%0], %1;" : : "l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ void st_release_sys(uint32_t *p, unsigned v) {
  asm volatile("st.release.sys.u32 [%0], %1;" : : "l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ unsigned atom_add(unsigned *p, unsigned v) {
  unsigned old;
  asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}
__device__ __forceinline__ unsigned ld_acquire_u32(const unsigned *p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ unsigned long long now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ bool current(ulonglong2 v, unsigned seq) {
  return (unsigned)(v.x >> 32) == seq && (unsigned)(v.y >> 32) == seq;
}
__device__ __forceinline__ float payload_sum(ulonglong2 v) {
  return __uint_as_float((unsigned)v.x) + __uint_as_float((unsigned)v.y);
}

const int kPairsPerThread = 4; /* x_pairs <= 4 x 256 */

/* Polls the host's request (thread 0) until it differs from `seen`; with
 * `eager`, every thread also reads its pairs of x_t's words in each poll.
 * Returns the request in every thread; v gets the pairs of the last poll. */
__device__ unsigned long long poll_host(const Params &p, unsigned seen, bool eager, ulonglong2 (&v)[kPairsPerThread],
                                        unsigned long long *s_word) {
  for (;;) {
    if (eager) {
#pragma unroll
      for (int i = 0; i < kPairsPerThread; ++i) {
        const int pair = threadIdx.x + i * blockDim.x;
        if (pair < p.x_pairs) v[i] = ld_sys2(p.x_words + 2 * pair);
      }
    }
    bool found = false;
    if (threadIdx.x == 0) {
      const unsigned long long w = ld_sys(&p.mailbox->request);
      if ((unsigned)w != seen) {
        *s_word = w;
        found = true;
      }
    }
    if (__syncthreads_or(found)) break;
  }
  return *s_word;
}

__global__ void __launch_bounds__(kThreads, 1) probe_kernel(const Params p) {
  __shared__ unsigned long long s_word;
  __shared__ float s_sum[kThreads / 32];
  const Flags f = p.f;
  unsigned seen = 0, phase = 0;
  for (;;) {
    ulonglong2 v[kPairsPerThread];
    unsigned long long word;
    const bool host_poller = !f.relay || blockIdx.x == 0;
    if (host_poller) {
      word = poll_host(p, seen, f.eager && blockIdx.x == 0, v, &s_word);
    } else {
      for (;;) { /* the relayed command; with tagrelay also x_t's relayed words in each poll */
        if (f.tagrelay) {
#pragma unroll
          for (int i = 0; i < kPairsPerThread; ++i) {
            const int pair = threadIdx.x + i * blockDim.x;
            if (pair < p.x_pairs) v[i] = ld_gpu2(p.x_relay + 2 * pair);
          }
        }
        bool found = false;
        if (threadIdx.x == 0) {
          const unsigned long long w = f.tagrelay ? ld_relaxed_gpu(&p.control->go) : ld_acquire_gpu(&p.control->go);
          if ((unsigned)w != seen) {
            s_word = w;
            found = true;
          }
        }
        if (__syncthreads_or(found)) break;
      }
      word = s_word;
    }
    const unsigned seq = (unsigned)word, command = (unsigned)(word >> 32);
    seen = seq;
    float sum = 0.f;
    if (command == kStep) {
      if (blockIdx.x == 0) { /* x_t from the host (settled), relayed */
#pragma unroll
        for (int i = 0; i < kPairsPerThread; ++i) {
          const int pair = threadIdx.x + i * blockDim.x;
          if (pair < p.x_pairs) {
            if (!f.eager) v[i] = ld_sys2(p.x_words + 2 * pair);
            while (!current(v[i], seq)) v[i] = ld_sys2(p.x_words + 2 * pair);
            sum += payload_sum(v[i]);
            st_gpu2(p.x_relay + 2 * pair, v[i]);
          }
        }
        if (f.relay) {
          __syncthreads();
          if (threadIdx.x == 0) {
            if (f.tagrelay) st_relaxed_gpu(&p.control->go, word);
            else st_release_gpu(&p.control->go, word);
          }
        }
      } else { /* x_t from the relay: tagged words re-read until current, else trusted after the acquire */
#pragma unroll
        for (int i = 0; i < kPairsPerThread; ++i) {
          const int pair = threadIdx.x + i * blockDim.x;
          if (pair < p.x_pairs) {
            if (!(f.tagrelay && f.relay)) v[i] = ld_gpu2(p.x_relay + 2 * pair); /* else read with the poll */
            while (f.tagrelay && !current(v[i], seq)) v[i] = ld_gpu2(p.x_relay + 2 * pair);
            sum += payload_sum(v[i]);
          }
        }
      }
      for (int off = 16; off >= 1; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
      if ((threadIdx.x & 31) == 0) s_sum[threadIdx.x >> 5] = sum;
      __syncthreads();
      float total = 0.f;
      for (int w = 0; w < kThreads / 32; ++w) total += s_sum[w];
      const int share = (p.y + gridDim.x - 1) / gridDim.x, y0 = blockIdx.x * share, y1 = min(p.y, y0 + share);
      for (int i = y0 + threadIdx.x; i < y1; i += blockDim.x) {
        const float value = total + (float)i;
        if (f.tagy) st_sys_u64(p.y_tagged + i, (unsigned long long)seq << 32 | __float_as_uint(value));
        else st_sys_f32(p.y_plain + i, value);
      }
    } else if (blockIdx.x == 0 && f.relay) {
      __syncthreads();
      if (threadIdx.x == 0) st_release_gpu(&p.control->go, word);
    }
    __syncthreads();
    if (threadIdx.x == 0 && (!f.tagy || command != kStep)) st_release_sys(&p.mailbox->answer[blockIdx.x], seq);
    if (command == kStop) return;
    if (f.after) {
      ++phase;
      if (threadIdx.x == 0) {
        atom_add(&p.control->arrivals, 1u);
        while ((int)(ld_acquire_u32(&p.control->arrivals) - phase * gridDim.x) < 0) {
        }
        const unsigned long long until = now_ns() + p.after_ns;
        while (now_ns() < until) {
        }
      }
      __syncthreads();
    }
  }
}

static int64_t host_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

struct Case {
  Flags f;
  int ctas, x, y;
};

static void run(const Case &c, int steps) {
  const int x_pairs = (c.x + 1) / 2, y = c.y;
  Mailbox *mb;
  unsigned long long *x_words, *y_tagged;
  float *y_plain;
  CHECK(cudaHostAlloc(&mb, sizeof(Mailbox), cudaHostAllocMapped));
  CHECK(cudaHostAlloc(&x_words, (2 * x_pairs + 2) * 8, cudaHostAllocMapped));
  CHECK(cudaHostAlloc(&y_tagged, (y + 1) * 8, cudaHostAllocMapped));
  CHECK(cudaHostAlloc(&y_plain, (y + 1) * 4, cudaHostAllocMapped));
  memset(mb, 0, sizeof *mb);
  memset(x_words, 0, (2 * x_pairs + 2) * 8);
  memset(y_tagged, 0, (y + 1) * 8);
  Control *control;
  unsigned long long *x_relay;
  CHECK(cudaMalloc(&control, sizeof(Control)));
  CHECK(cudaMalloc(&x_relay, (2 * x_pairs + 2) * 8));
  CHECK(cudaMemset(control, 0, sizeof(Control)));
  CHECK(cudaMemset(x_relay, 0, (2 * x_pairs + 2) * 8));
  CHECK(cudaDeviceSynchronize());
  Params p = {};
  p.f = c.f;
  p.mailbox = mb;
  p.x_words = x_words;
  p.x_pairs = x_pairs;
  p.x_relay = x_relay;
  p.y_plain = y_plain;
  p.y_tagged = y_tagged;
  p.y = y;
  p.after_ns = 500;
  p.control = control;
  void *args[] = {&p};
  CHECK(cudaLaunchCooperativeKernel((const void *)probe_kernel, c.ctas, kThreads, args, 0, 0));
  std::vector<float> x(2 * x_pairs), out(y);
  std::vector<int64_t> times;
  bool ok = true, hung = false;
  const int warm = 300;
  for (int s = 1; s <= warm + steps + 1 && !hung; ++s) {
    const bool stop = s == warm + steps + 1;
    const unsigned seq = (unsigned)s;
    float expected = 0.f;
    for (int i = 0; i < 2 * x_pairs; ++i) {
      x[i] = (float)((s * 7 + i) % 13);
      expected += x[i];
    }
    const int64_t t0 = host_ns();
    if (!stop)
      for (int i = 0; i < 2 * x_pairs; ++i) {
        unsigned bits;
        memcpy(&bits, &x[i], 4);
        x_words[i] = (unsigned long long)seq << 32 | bits;
      }
    __atomic_store_n(&mb->request, (uint64_t)(stop ? kStop : kStep) << 32 | seq, __ATOMIC_RELEASE);
    const int64_t deadline = t0 + 2000000000;
    if (c.f.tagy && !stop) {
      for (int i = 0; i < y && !hung; ++i) {
        unsigned long long w;
        int polls = 0;
        while ((unsigned)((w = __atomic_load_n(&y_tagged[i], __ATOMIC_ACQUIRE)) >> 32) != seq)
          if (++polls % 64 == 0 && host_ns() > deadline) hung = true, w = 0;
        const unsigned bits = (unsigned)w;
        memcpy(&out[i], &bits, 4);
      }
    } else {
      for (int cta = 0; cta < c.ctas && !hung; ++cta) {
        int polls = 0;
        while (__atomic_load_n(&mb->answer[cta], __ATOMIC_ACQUIRE) != seq)
          if (++polls % 64 == 0 && host_ns() > deadline) {
            hung = true;
            break;
          }
      }
      if (!stop) memcpy(out.data(), y_plain, y * 4);
    }
    const int64_t t1 = host_ns();
    if (stop) break;
    if (s > warm) times.push_back(t1 - t0);
    for (int i = 0; i < y; ++i)
      if (out[i] != expected + (float)i) ok = false;
  }
  if (hung) {
    printf("HUNG\n");
    exit(1);
  }
  CHECK(cudaDeviceSynchronize());
  std::sort(times.begin(), times.end());
  printf("relay=%d eager=%d tagrelay=%d tagy=%d after=%d ctas=%3d x=%5d y=%5d  p50 %6.2f  p99 %6.2f  %s\n", c.f.relay,
         c.f.eager, c.f.tagrelay, c.f.tagy, c.f.after, c.ctas, c.x, c.y, times[times.size() / 2] / 1e3,
         times[times.size() * 99 / 100] / 1e3, ok ? "ok" : "WRONG");
  fflush(stdout);
  CHECK(cudaFreeHost(mb));
  CHECK(cudaFreeHost(x_words));
  CHECK(cudaFreeHost(y_tagged));
  CHECK(cudaFreeHost(y_plain));
  CHECK(cudaFree(control));
  CHECK(cudaFree(x_relay));
}

int main(int argc, char **argv) {
  const int steps = argc > 1 ? atoi(argv[1]) : 3000;
  /* relay eager tagrelay tagy after */
  const Flags floor_ = {0, 0, 0, 0, 0}, direct = {0, 0, 0, 0, 0};
  const Flags now = {1, 1, 0, 0, 1}, now_tagy = {1, 1, 0, 1, 1}, tagged = {1, 1, 1, 1, 1};
  const Flags now_noafter = {1, 1, 0, 0, 0}, tagged_noafter = {1, 1, 1, 1, 0};
  const Flags direct_tagy = {0, 1, 1, 1, 1};
  const Case cases[] = {
      {floor_, 1, 0, 0},        {floor_, 1, 0, 1024},     {direct, 8, 0, 0},       {direct, 128, 0, 0},
      {{1, 0, 0, 0, 0}, 8, 0, 0}, {{1, 0, 0, 0, 0}, 128, 0, 0},
      {now_noafter, 128, 1024, 1024}, {now, 8, 256, 256},  {now, 128, 1024, 1024},  {now, 64, 512, 1024},
      {now_tagy, 8, 256, 256},  {now_tagy, 128, 1024, 1024}, {now_tagy, 64, 512, 1024},
      {tagged_noafter, 128, 1024, 1024}, {tagged, 8, 256, 256}, {tagged, 128, 1024, 1024}, {tagged, 64, 512, 1024},
      {direct_tagy, 128, 1024, 1024}, {tagged, 128, 1024, 8192}, {now, 128, 1024, 8192},
  };
  for (const Case &c : cases) run(c, steps);
  return 0;
}
