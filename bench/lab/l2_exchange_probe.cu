/*
 * l2_exchange_probe.cu - the floor of a grid-wide state exchange through L2:
 * a persistent launch of one CTA per SM (256 threads) that does nothing but
 * exchange a state of S bytes a step. Every CTA publishes its slice of the
 * state, and every CTA needs the whole state (or a part, rows f) before its
 * next step. Each row of the table is one way of doing that:
 *
 *   a    grid.sync only: the barrier floor, no data
 *   b    slice stores, grid.sync, every CTA reads the whole state (ld.global.cg)
 *   c    slice stores, one release flag per CTA; readers acquire-poll every
 *        CTA's flag (one thread a flag), then read the whole state
 *   d8   tagged words {4 B payload, 32-bit tag} (the grid tier's words): no
 *        fence, no flag; readers load every word, then re-load the stale ones
 *        in rounds (all of them in flight together) until every tag matches
 *   d8 4 / 8 loads in flight: d8 polled as the float32 gated grid kernel
 *        polls (exchange.cuh), a thread's chunks through 4 or 8 slots, a
 *        slot moving on once its chunk is fresh: n chunks, n / slots rounds
 *   d12  16-byte words {12 B payload, one 32-bit tag}
 *   d16  16-byte words of two 8-byte halves {6 B payload, 16-bit tag}
 *   f    d16 where a CTA reads only 1/2, 1/4 or 1/8 of the state
 *   e    sm_90: clusters of C CTAs; rank q of each cluster reads share q of
 *        the state from L2 and hands it to every CTA of its cluster, so that
 *        L2 reads drop by C: "dsmem" polls d16 words and forwards them with
 *        st.async; "bulk" waits for c's flags and copies its share with one
 *        cp.async.bulk ... .multicast::cluster (the cluster grid's pattern)
 *
 * Why d16 and not d12: PTX's memory model (section "Memory Operations on
 * Vector Data Types") is defined on scalars of at most 64 bits; a vector
 * access is a set of scalar accesses in unspecified order. A 16-byte store
 * is not single-copy atomic, but each 64-bit element of an aligned
 * ld/st.v2.u64 is, so a tag in each 8-byte half proves that half's payload.
 * d12 relies on what the model does not promise; its check column shows
 * whether a torn word was ever seen here.
 *
 * Every reader checks every 16-byte chunk it uses against the step number
 * (a racing variant counts mismatches: FAIL), every spin is bounded by a
 * clock64 watchdog that traps after ~2 s; the whole run takes under 20 s.
 *
 *   nvcc -O3 -std=c++17 -arch=sm_90 -I csrc/kernels -I bench/lab bench/lab/l2_exchange_probe.cu -o build/l2_exchange_probe
 *   build/l2_exchange_probe
 * (-arch=sm_80 builds it without the cluster rows.) Prints one table: µs per
 * step (median of 5 launches of 2000 steps) for S = 4-64 KB, and the check.
 */
#include <cooperative_groups.h>

#include <cstdio>
#include <vector>

#include "cluster_grid.cuh"
#include "exchange.cuh"
#include "lab_common.h"

using namespace prnn;

const int kThreads = kClusterThreads; /* 256 */
const int kSteps = 2000;
const long long kWatchdogCycles = 4000000000ll; /* ~2 s at the H200's 1.98 GHz */
/* Buffers of the state in L2. Two suffice where every CTA reads all of it.
 * A CTA that reads a part (f) waits on only some writers, so a writer may
 * run ahead of a reader it never waits on; but the writers it waits on
 * cover every part, so writing step s it has seen every CTA publish step
 * s - 2, i.e. finish reading s - 3: four buffers suffice. */
const int kRing = 4;

enum Variant {
  kGridSync, kBarrierRead, kFlagRead, kTagged8, kTagged12, kTagged16, kRelayDsmem, kRelayBulk,
  kTagged8Slots4, kTagged8Slots8 /* d8 polled with 4 or 8 loads in flight a thread */
};
enum Format { kPlain, kTag8, kTag12, kTag16 };

__host__ __device__ constexpr Format format_of(int v) {
  return (v == kTagged8 || v == kTagged8Slots4 || v == kTagged8Slots8) ? kTag8
         : v == kTagged12                                                ? kTag12
         : (v == kTagged16 || v == kRelayDsmem)                          ? kTag16
                                                                         : kPlain;
}
/* Payload bytes a 16-byte chunk carries in each format. */
__host__ __device__ constexpr int payload_bytes(Format f) { return f == kPlain ? 16 : f == kTag8 ? 8 : 12; }

struct ProbeParams {
  int steps;
  int chunks;       /* 16-byte chunks of the state */
  int read_parts;   /* a CTA reads part (blockIdx % read_parts) of read_parts */
  uint4 *state;     /* [kRing][chunks]: step s in buffer s % kRing */
  unsigned *flags;  /* [CTAs]: the last step a CTA published */
  unsigned *errors; /* chunks that did not hold their step's contents */
};

__device__ __forceinline__ long long sm_clock() {
  long long t;
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(t));
  return t;
}
/* Traps once a spin has gone on for ~2 s: a hang becomes a launch error. */
struct Watchdog {
  long long start;
  __device__ Watchdog() : start(sm_clock()) {}
  __device__ void check() const {
    if (sm_clock() - start > kWatchdogCycles) __trap();
  }
};

/* What chunk idx of step s holds: a payload derived from (s, idx) and, in
 * the tagged formats, the step as the tag (16 bits in kTag16). */
template <Format F>
__device__ __forceinline__ uint4 expected_chunk(unsigned s, int idx) {
  const unsigned p = s * 0x9E3779B1u + (unsigned)idx * 0x85EBCA77u;
  if constexpr (F == kPlain) return make_uint4(p, p + 1, p + 2, p + 3);
  if constexpr (F == kTag8) return make_uint4(p, s, p + 1, s);
  if constexpr (F == kTag12) return make_uint4(p, p + 1, p + 2, s);
  return make_uint4(p, ((p + 1) & 0xffffu) | (s << 16), p + 2, ((p + 3) & 0xffffu) | (s << 16));
}
template <Format F>
__device__ __forceinline__ bool fresh(uint4 c, unsigned s) {
  if constexpr (F == kPlain) return true;
  if constexpr (F == kTag8) return c.y == s && c.w == s;
  if constexpr (F == kTag12) return c.w == s;
  return (c.y >> 16) == (s & 0xffffu) && (c.w >> 16) == (s & 0xffffu);
}
__device__ __forceinline__ bool same(uint4 a, uint4 b) { return a.x == b.x && a.y == b.y && a.z == b.z && a.w == b.w; }

/* Plain chunks are ordered by a barrier or a flag: weak stores, L2 loads.
 * Tagged chunks are polled: relaxed GPU-scope accesses of two 64-bit elements. */
template <Format F>
__device__ __forceinline__ void store_chunk(uint4 *p, uint4 v) {
  if constexpr (F == kPlain) {
    *p = v;
  } else {
    const unsigned long long lo = ((unsigned long long)v.y << 32) | v.x, hi = ((unsigned long long)v.w << 32) | v.z;
    asm volatile("st.relaxed.gpu.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(lo), "l"(hi) : "memory");
  }
}
template <Format F>
__device__ __forceinline__ uint4 load_chunk(const uint4 *p) {
  if constexpr (F == kPlain) {
    return __ldcg(p);
  } else {
    unsigned long long lo, hi;
    load_word_pair(reinterpret_cast<const unsigned long long *>(p), lo, hi);
    return make_uint4((unsigned)lo, (unsigned)(lo >> 32), (unsigned)hi, (unsigned)(hi >> 32));
  }
}

/* Chunks [r0, r1) of a step into w (thread t's k-th: r0 + t + k kThreads, so
 * a warp's loads are contiguous), all loads in flight together; the stale
 * ones are re-loaded together, round after round, until every tag matches.
 * The warp leaves together, as the product kernels' polls do. */
template <Format F, int N>
__device__ __forceinline__ void read_fresh(const uint4 *buf, int r0, int r1, unsigned s, uint4 (&w)[N]) {
  const int first = r0 + (int)threadIdx.x;
#pragma unroll
  for (int k = 0; k < N; ++k) w[k] = first + k * kThreads < r1 ? load_chunk<F>(buf + first + k * kThreads) : uint4{};
  if constexpr (F == kPlain) return;
  const Watchdog dog;
  for (;;) {
    bool all = true;
#pragma unroll
    for (int k = 0; k < N; ++k) all &= first + k * kThreads >= r1 || fresh<F>(w[k], s);
    if (__all_sync(0xffffffffu, all)) break;
#pragma unroll
    for (int k = 0; k < N; ++k)
      if (first + k * kThreads < r1 && !fresh<F>(w[k], s)) w[k] = load_chunk<F>(buf + first + k * kThreads);
    dog.check();
  }
}

/* d8's chunks [r0, r1) polled as the float32 gated grid kernel polls its
 * words (exchange.cuh's poll_word_pairs): SLOTS loads in flight a thread, a
 * slot moving on to its next chunk once its chunk is fresh, so a thread's n
 * chunks take at least n / SLOTS dependent rounds. Returns how many chunks
 * differed from step s's. */
template <int SLOTS>
__device__ __forceinline__ unsigned read_in_slots(const uint4 *buf, int r0, int r1, unsigned s) {
  const int first = r0 + (int)threadIdx.x;
  const int end = first < r1 ? (r1 - first + kThreads - 1) / kThreads : 0; /* this thread's chunks */
  unsigned wrong = 0;
  int start[SLOTS];
#pragma unroll
  for (int j = 0; j < SLOTS; ++j) start[j] = j;
  poll_word_pairs<SLOTS>(
      s, end, start, [&](int c) { return c + SLOTS; },
      [&](int c) { return reinterpret_cast<const unsigned long long *>(buf + first + c * kThreads); },
      [&](int c, unsigned long long w0, unsigned long long w1) {
        const uint4 got = make_uint4((unsigned)w0, (unsigned)(w0 >> 32), (unsigned)w1, (unsigned)(w1 >> 32));
        wrong += !same(got, expected_chunk<kTag8>(s, first + c * kThreads));
      });
  __syncwarp();
  return wrong;
}

/* How many of w's chunks (as read_fresh placed them) differ from step s's. */
template <Format F, int N>
__device__ __forceinline__ unsigned count_wrong(const uint4 (&w)[N], int r0, int r1, unsigned s) {
  const int first = r0 + (int)threadIdx.x;
  unsigned wrong = 0;
#pragma unroll
  for (int k = 0; k < N; ++k) wrong += first + k * kThreads < r1 && !same(w[k], expected_chunk<F>(s, first + k * kThreads));
  return wrong;
}

/* c and bulk: the CTA's stores, then its flag (release); then every CTA's flag (acquire). */
__device__ __forceinline__ void raise_flag(unsigned *flag, unsigned s) {
  __syncthreads();
  if (threadIdx.x == 0) asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(flag), "r"(s) : "memory");
}
__device__ __forceinline__ void wait_flags(const unsigned *flags, unsigned s) {
  if ((int)threadIdx.x < (int)gridDim.x) {
    const Watchdog dog;
    for (;;) {
      unsigned f;
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(f) : "l"(flags + threadIdx.x) : "memory");
      if (reached(f, s)) break;
      dog.check();
    }
  }
  __syncthreads();
}

template <int V, int N>
__global__ void __launch_bounds__(kThreads, 1) exchange_kernel(const ProbeParams p) {
  constexpr Format F = format_of(V);
  const int tid = threadIdx.x, ctas = gridDim.x, cta = blockIdx.x;
  const int mine0 = cta * p.chunks / ctas, mine1 = (cta + 1) * p.chunks / ctas; /* this CTA's slice */
  unsigned wrong = 0;
  if constexpr (V == kRelayDsmem || V == kRelayBulk) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    /* shared memory: the state [2][chunks] as it lands, then an mbarrier per buffer */
    extern __shared__ __align__(16) unsigned char smem[];
    const uint4 *landing = reinterpret_cast<const uint4 *>(smem);
    const uint32_t landing_addr = (uint32_t)__cvta_generic_to_shared(smem);
    const uint32_t bar_addr = landing_addr + 2u * p.chunks * 16u;
    const unsigned rank = cluster_rank(), C = cluster_size();
    const int share0 = (int)rank * p.chunks / (int)C, share1 = (int)(rank + 1) * p.chunks / (int)C;
    const unsigned state_bytes = (unsigned)p.chunks * 16u;
    if (tid == 0) { /* armed for steps 1 and 2; re-armed after each wait for the step after next */
      mbarrier_init(bar_addr, 1);
      mbarrier_init(bar_addr + 8u, 1);
      asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
      mbarrier_expect_bytes(bar_addr, state_bytes);
      mbarrier_expect_bytes(bar_addr + 8u, state_bytes);
    }
    __syncthreads();
    cluster_arrive(); /* every CTA's barriers ready before any share is sent into it */
    cluster_wait();
    for (unsigned s = 1; s <= (unsigned)p.steps; ++s) {
      const int b = (int)(s & 1); /* the landing buffer */
      uint4 *buf = p.state + (size_t)(s % kRing) * p.chunks;
      const uint32_t bar = bar_addr + 8u * b, dst = landing_addr + (uint32_t)(b * p.chunks) * 16u;
      for (int i = mine0 + tid; i < mine1; i += kThreads) store_chunk<F>(buf + i, expected_chunk<F>(s, i));
      if constexpr (V == kRelayDsmem) {
        uint4 w[N];
        read_fresh<F, N>(buf, share0, share1, s, w);
#pragma unroll
        for (int k = 0; k < N; ++k) {
          const int i = share0 + tid + k * kThreads;
          if (i < share1)
            for (unsigned peer = 0; peer < C; ++peer)
              store_peer16_async(peer_address(dst + (uint32_t)i * 16u, peer), w[k], peer_address(bar, peer));
        }
      } else {
        raise_flag(p.flags + cta, s);
        wait_flags(p.flags, s);
        if (tid == 0)
          bulk_multicast(dst + (uint32_t)share0 * 16u, buf + share0, (unsigned)(share1 - share0) * 16u, bar,
                         (unsigned short)((1u << C) - 1));
      }
      const Watchdog dog;
      while (!mbarrier_done(bar, ((s - 1) >> 1) & 1)) dog.check();
      if (tid == 0 && s + 2 <= (unsigned)p.steps) mbarrier_expect_bytes(bar, state_bytes);
      for (int i = tid; i < p.chunks; i += kThreads) wrong += !same(landing[b * p.chunks + i], expected_chunk<F>(s, i));
      __syncthreads(); /* the whole step read before this CTA publishes the next */
    }
    cluster_arrive(); /* no CTA leaves while a share may still be landing in it */
    cluster_wait();
#else
    __trap(); /* clusters need sm_90; the host does not launch these rows elsewhere */
#endif
  } else {
    /* the part this CTA reads */
    const int part = cta % p.read_parts;
    const int read0 = part * p.chunks / p.read_parts, read1 = (part + 1) * p.chunks / p.read_parts;
    for (unsigned s = 1; s <= (unsigned)p.steps; ++s) {
      if constexpr (V == kGridSync) {
        cooperative_groups::this_grid().sync();
        continue;
      }
      uint4 *buf = p.state + (size_t)(s % kRing) * p.chunks;
      for (int i = mine0 + tid; i < mine1; i += kThreads) store_chunk<F>(buf + i, expected_chunk<F>(s, i));
      if constexpr (V == kBarrierRead) cooperative_groups::this_grid().sync();
      if constexpr (V == kFlagRead) {
        raise_flag(p.flags + cta, s);
        wait_flags(p.flags, s);
      }
      if constexpr (V == kTagged8Slots4 || V == kTagged8Slots8) {
        wrong += read_in_slots<V == kTagged8Slots4 ? 4 : 8>(buf, read0, read1, s);
      } else {
        uint4 w[N];
        read_fresh<F, N>(buf, read0, read1, s, w);
        wrong += count_wrong<F, N>(w, read0, read1, s);
      }
      __syncthreads(); /* the whole step read before this CTA publishes the next */
    }
  }
  if (wrong) atomicAdd(p.errors, wrong);
}

/* The kernel of variant V holding up to n chunks a thread (nullptr past 32). */
template <int V>
static const void *kernel_for(int n) {
  if (n <= 1) return (const void *)exchange_kernel<V, 1>;
  if (n <= 2) return (const void *)exchange_kernel<V, 2>;
  if (n <= 4) return (const void *)exchange_kernel<V, 4>;
  if (n <= 8) return (const void *)exchange_kernel<V, 8>;
  if (n <= 16) return (const void *)exchange_kernel<V, 16>;
  if (n <= 32) return (const void *)exchange_kernel<V, 32>;
  return nullptr;
}
static const void *kernel_for(int variant, int n) {
  switch (variant) {
    case kGridSync: return (const void *)exchange_kernel<kGridSync, 1>;
    case kBarrierRead: return kernel_for<kBarrierRead>(n);
    case kFlagRead: return kernel_for<kFlagRead>(n);
    case kTagged8: return kernel_for<kTagged8>(n);
    case kTagged12: return kernel_for<kTagged12>(n);
    case kTagged16: return kernel_for<kTagged16>(n);
    case kRelayDsmem: return kernel_for<kRelayDsmem>(n);
    case kTagged8Slots4: return (const void *)exchange_kernel<kTagged8Slots4, 1>; /* holds no chunks */
    case kTagged8Slots8: return (const void *)exchange_kernel<kTagged8Slots8, 1>;
    default: return (const void *)exchange_kernel<kRelayBulk, 1>; /* holds no chunks */
  }
}

struct Row {
  const char *name;
  int variant;
  int read_parts; /* f: a CTA reads 1/read_parts of the state */
  int cluster;    /* e: CTAs a cluster; 0 for a plain cooperative launch */
};

struct Result {
  float us_per_step; /* < 0: not run (the shared memory does not fit) */
  int ctas;
  unsigned errors;
};

struct Device {
  int sms, major, smem_optin;
  int one_cta_smem; /* dynamic shared memory that keeps a second CTA off an SM */
};

static Result run_case(const Device &dev, const Row &row, int state_bytes, uint4 *state, unsigned *flags,
                       unsigned *errors) {
  const Format f = format_of(row.variant);
  ProbeParams p;
  p.steps = kSteps;
  p.chunks = (state_bytes + payload_bytes(f) - 1) / payload_bytes(f);
  p.read_parts = row.read_parts;
  p.state = state;
  p.flags = flags;
  p.errors = errors;
  const int C = row.cluster;
  /* chunks a thread holds: of the part it reads (f) or of its cluster rank's share (dsmem) */
  const int per_cta = C ? (p.chunks + C - 1) / C : (p.chunks + row.read_parts - 1) / row.read_parts;
  const void *fn = kernel_for(row.variant, (per_cta + kThreads - 1) / kThreads);
  const int landing = C ? 2 * p.chunks * 16 + 16 : 0;
  const int smem = landing > dev.one_cta_smem ? landing : dev.one_cta_smem;
  if (!fn || smem > dev.smem_optin) return {-1.f, 0, 0};
  CHECK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));

  int ctas = dev.sms;
  cudaLaunchAttribute attrs[2];
  cudaLaunchConfig_t cfg = {};
  if (C) {
    int clusters = 0;
    cudaLaunchConfig_t query = cluster_launch_config(C, C, smem, 0, &attrs[0]);
    CHECK(cudaOccupancyMaxActiveClusters(&clusters, fn, &query));
    ctas = clusters * C;
    cfg = cooperative_cluster_launch_config(ctas, C, smem, 0, attrs);
  }
  if (ctas > kThreads) return {-1.f, 0, 0}; /* wait_flags polls a CTA's flag a thread */
  void *args[] = {&p};
  CHECK(cudaMemset(errors, 0, sizeof(unsigned)));
  const float ms = median_launch_ms(
      7,
      [&] { /* tags and flags start from zero at every launch */
            CHECK(cudaMemset(state, 0, kRing * (size_t)p.chunks * 16));
            CHECK(cudaMemset(flags, 0, (size_t)ctas * sizeof(unsigned)));
      },
      [&] {
        if (C) CHECK(cudaLaunchKernelExC(&cfg, fn, args));
        else CHECK(cudaLaunchCooperativeKernel(fn, ctas, kThreads, args, (size_t)smem, 0));
      });
  unsigned host_errors = 0;
  CHECK(cudaMemcpy(&host_errors, errors, sizeof(unsigned), cudaMemcpyDeviceToHost));
  return {1000.f * ms / kSteps, ctas, host_errors};
}

int main(void) {
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  Device dev;
  dev.sms = prop.multiProcessorCount;
  dev.major = prop.major;
  dev.smem_optin = (int)prop.sharedMemPerBlockOptin;
  dev.one_cta_smem = (int)(prop.sharedMemPerMultiprocessor / 2) + 1024;
  if (dev.one_cta_smem > dev.smem_optin) dev.one_cta_smem = dev.smem_optin;

  const Row rows[] = {
      {"a  grid.sync only", kGridSync, 1, 0},
      {"b  grid.sync + read all", kBarrierRead, 1, 0},
      {"c  flag per CTA + read all", kFlagRead, 1, 0},
      {"d8  tagged {4 B, tag32}", kTagged8, 1, 0},
      {"d8  4 loads in flight", kTagged8Slots4, 1, 0},
      {"d8  8 loads in flight", kTagged8Slots8, 1, 0},
      {"d12 tagged {12 B, tag32}", kTagged12, 1, 0},
      {"d16 tagged 2x{6 B, tag16}", kTagged16, 1, 0},
      {"f  d16, read 1/2", kTagged16, 2, 0},
      {"f  d16, read 1/4", kTagged16, 4, 0},
      {"f  d16, read 1/8", kTagged16, 8, 0},
      {"e  dsmem relay, C = 2", kRelayDsmem, 1, 2},
      {"e  dsmem relay, C = 4", kRelayDsmem, 1, 4},
      {"e  dsmem relay, C = 8", kRelayDsmem, 1, 8},
      {"e  bulk multicast, C = 2", kRelayBulk, 1, 2},
      {"e  bulk multicast, C = 4", kRelayBulk, 1, 4},
      {"e  bulk multicast, C = 8", kRelayBulk, 1, 8},
  };
  const int sizes[] = {4096, 8192, 16384, 32768, 65536};

  uint4 *state;
  unsigned *flags, *errors;
  CHECK(cudaMalloc(&state, kRing * 65536 / 8 * 16)); /* the largest: 64 KB as kTag8 chunks */
  CHECK(cudaMalloc(&flags, 1024 * sizeof(unsigned)));
  CHECK(cudaMalloc(&errors, sizeof(unsigned)));

  printf("%s, %d SMs; µs per step, median of 5 launches of %d steps, %d threads a CTA\n", prop.name, dev.sms,
         kSteps, kThreads);
  printf("S = state bytes a step (16 bits: 4 KB = H 2048 B 1, 16 KB = H 2048 B 4 or H 4096 B 2, 64 KB = H 2048 B 16;"
         " fp32 twice the bytes)\n");
  printf("%-28s %5s", "variant", "CTAs");
  for (int s : sizes) printf(" %7dK", s / 1024);
  printf("  check\n");
  for (const Row &row : rows) {
    if (row.cluster && dev.major < 9) continue;
    printf("%-28s", row.name);
    fflush(stdout); /* a trap names its row */
    std::vector<Result> results;
    unsigned errors_total = 0;
    for (int s : sizes) {
      results.push_back(run_case(dev, row, s, state, flags, errors));
      errors_total += results.back().errors;
    }
    printf(" %5d", results[0].ctas);
    for (const Result &r : results)
      if (r.us_per_step < 0) printf(" %8s", "-");
      else printf(" %8.3f", r.us_per_step);
    if (row.variant == kGridSync) printf("  -\n");
    else if (errors_total == 0) printf("  ok\n");
    else printf("  FAIL (%u chunks)\n", errors_total);
    fflush(stdout);
  }
  CHECK(cudaFree(state));
  CHECK(cudaFree(flags));
  CHECK(cudaFree(errors));
  return 0;
}
