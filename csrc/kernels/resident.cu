/*
 * resident.cu - the resident (streaming) mode of prnn.h: one cooperative
 * launch that holds a module's layers on chip and runs one timestep per
 * command from the host, for every cell (Elman through an Elman policy here,
 * LSTM and GRU through cells.cuh's).
 *
 * CTA c owns hidden units [c U, c U + U) of every layer and keeps, in shared
 * memory for as long as it runs, their rows of every gate: [W_ih row | W_hh
 * row], each padded to kKAlign, then the biases. The state h of every layer
 * is exchanged through L2 in float32 (rounded to the element type), in two
 * buffers by parity: a command that changes the state writes the other
 * buffer, so a CTA still reading the current one is never overwritten. Each
 * CTA also keeps its own units' h (and an LSTM's c) in shared memory.
 *
 * A command, as CTAs see it:
 *   CTA 0 polls the mailbox (host memory) for a new request - soon after an
 *   answer, reading x_t's tagged words with each poll, so that a STEP's
 *   input arrives with its request - and copies a STEP's x_t into device
 *   memory; then it relays the command through a device word that the other
 *   CTAs poll (L2);
 *   STEP: for each layer, stage its input (x_t, or the layer below's h_t from
 *   L2), multiply the input side (a warp per row), add the recurrent side
 *   computed after the previous command, apply the cell, publish h_t (the top
 *   layer also into y in host memory); layers are separated by a grid-wide
 *   arrival barrier;
 *   every CTA answers in its own word of the mailbox once its part is
 *   written. After a command that changed the state every CTA arrives on a
 *   counter, waits for all arrivals and multiplies W_hh by the new state for
 *   the next step: the recurrent half of a step runs while the host turns
 *   the answer around, not after the next request.
 *
 * No watchdog: a stream may idle for hours between commands. The host waits
 * with a timeout instead, and a STOP ends the kernel.
 */
#include <stddef.h>
#include <string.h>

#include "cells.cuh"
#include "cuda_status.cuh"
#include "device_info.cuh"
#include "prnn_internal.h"

namespace prnn {
namespace {

const int kThreads = 256;
const int kVec = 4;             /* elements a lane reads at once in the products */
const int kKAlign = 32 * kVec;  /* a row's input and recurrent parts are padded to this */
const int kMaxBatchTile = 8;    /* sequences staged at once */
const int kLoadsInFlight = 8;   /* loads a thread issues before it stores what they return */
/* Weight bytes a CTA aims to hold: fewer CTAs make a cheaper barrier, fewer
 * rows a CTA a shorter product; the least grid that fits comes first. */
const size_t kTargetCtaWeightBytes = 64 * 1024;
const int kMaxDevices = 64;
/* CTA 0 reads x_t's words with every poll of the request only this soon
 * after its last answer (a stream stepped in a loop) and only for an x_t of
 * at most kEagerPairsPerThread pairs of words a thread (16 KiB of words, 8
 * KiB of x_t): each such poll reads all of them over the bus. */
const unsigned long long kEagerPollNs = 100 * 1000;
const int kEagerPairsPerThread = 4;

__host__ __device__ inline size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

/* The resident kernel's cells: cells.cuh's, forward only, with both of an
 * Elman cell's biases in the input side (PersistentRNN's GEMM folds b_ih +
 * b_hh into xp) and its activation fixed at compile time. */
template <int Activation>
struct ResidentElman {
  static const int kGates = 1;
  static const bool kCarriesCell = false;
  static const bool kBiasesInInput = true;
  static __device__ __forceinline__ float forward(const float (&xp)[1], const float (&hh)[1], float, float *) {
    return ElmanCell::activate<float>(Activation, hh[0] + xp[0]);
  }
};

/* A gated cell, without the values it saves for a backward pass. */
template <class Cell>
struct ResidentGated {
  static const int kGates = Cell::kGates;
  static const bool kCarriesCell = Cell::kCarriesCell;
  static const bool kBiasesInInput = false;
  static __device__ __forceinline__ float forward(const float (&xp)[kGates], const float (&hh)[kGates], float prev,
                                                  float *carry) {
    float saved[Cell::kSaved];
    return Cell::forward(xp, hh, prev, carry, saved);
  }
};

/* Device words of the launch, each group on its own 128-byte line (zeroed
 * before the launch). */
struct Control {
  /* The command CTA 0 relays: its sequence number (low half) and kind (high
   * half), one word, so that a CTA reads both in one load. */
  unsigned long long go_command;
  unsigned pad0[30];
  unsigned arrivals;  /* every CTA adds 1 per phase: phase p is complete at p * grid */
  unsigned pad1[31];
};

struct ResidentParams {
  int layers, batch, input, hidden; /* L, B, I, H */
  int units;                        /* U: hidden units a CTA owns in every layer */
  int kx0;                          /* I padded to kKAlign: layer 0's input part */
  int kh;                           /* H padded to kKAlign: the recurrent part, and the input part above */
  int tile;                         /* sequences staged at once */
  prnn_resident_layer_t layer[PRNN_RESIDENT_MAX_LAYERS];
  prnn_resident_mailbox_t *mailbox; /* host-mapped */
  const unsigned long long *x_words; /* host-mapped: x_t's tagged words (prnn.h), in pairs */
  int x_pairs;
  void *y;                          /* host-mapped, batch x hidden */
  float *h_host, *c_host;           /* host-mapped, layers x batch x hidden */
  const uint8_t *mask;              /* host-mapped, batch */
  Control *control;                 /* device workspace */
  void *x_relay;                    /* device workspace: x_t (batch x input elements), 8 bytes a pair of words */
  float *state;                     /* device workspace, 2 x layers x batch x hidden: h by parity */
};

/* Byte offsets of a CTA's shared memory. */
struct SmemLayout {
  size_t words;      /* 4 unsigned: the command's number and kind, the last-arrival flag */
  size_t weights;    /* every layer's R x row-width elements: layer 0 rows kx0 + kh wide, the others 2 kh */
  size_t bias_x;     /* layers x R floats: the input side's bias */
  size_t bias_h;     /* layers x R floats: the recurrent side's bias */
  size_t staged;     /* tile x max(kx0, kh) floats: the sequences' input or state */
  size_t sums;       /* R x tile floats: the input side's products */
  size_t recurrent;  /* layers x R x batch floats: W_hh h of the current state */
  size_t own_h;      /* layers x U x batch floats: the CTA's units' h */
  size_t cell;       /* layers x U x batch floats: their c (LSTM) */
  size_t total;
};

__host__ __device__ inline SmemLayout smem_layout(int gates, bool carries_cell, size_t elem, int layers, int batch,
                                                  int units, int kx0, int kh, int tile) {
  const size_t R = (size_t)gates * units;
  SmemLayout s;
  size_t at = 0;
  s.words = at;
  at = 16;
  s.weights = at;
  at = align_up(at + R * ((size_t)kx0 + kh + (size_t)(layers - 1) * 2 * kh) * elem, 16);
  s.bias_x = at;
  at = align_up(at + (size_t)layers * R * sizeof(float), 16);
  s.bias_h = at;
  at = align_up(at + (size_t)layers * R * sizeof(float), 16);
  s.staged = at;
  at = align_up(at + (size_t)tile * (kx0 > kh ? kx0 : kh) * sizeof(float), 16);
  s.sums = at;
  at = align_up(at + R * tile * sizeof(float), 16);
  s.recurrent = at;
  at = align_up(at + (size_t)layers * R * batch * sizeof(float), 16);
  s.own_h = at;
  at = align_up(at + (size_t)layers * units * batch * sizeof(float), 16);
  s.cell = at;
  if (carries_cell) at = align_up(at + (size_t)layers * units * batch * sizeof(float), 16);
  s.total = at;
  return s;
}

/* Where layer l's rows start among the weights (elements), and their width. */
__device__ __forceinline__ size_t layer_offset(const ResidentParams &p, int R, int l) {
  return l == 0 ? 0 : (size_t)R * (p.kx0 + p.kh) + (size_t)(l - 1) * R * 2 * p.kh;
}
__device__ __forceinline__ int input_part(const ResidentParams &p, int l) { return l == 0 ? p.kx0 : p.kh; }

/* ------------------------------------------------------------ memory access */

/* Host-mapped memory: every access at system scope, so it reaches the host's
 * memory (no stale or withheld cached copy). */

/* The mailbox's request: the sequence number in the low half, the command
 * in the high half, one 8-byte word the host writes in one store. Relaxed:
 * a poll must not hold back the loads of x_t's words issued with it (a STEP
 * needs no ordering, its words carry their number); fence_acquire_sys makes
 * it an acquire for the other commands. */
__device__ __forceinline__ unsigned long long host_load_request(const prnn_resident_mailbox_t *m) {
  unsigned long long v;
  asm volatile("ld.relaxed.sys.u64 %0, [%1];" : "=l"(v) : "l"(&m->request) : "memory");
  return v;
}
__device__ __forceinline__ void fence_acquire_sys() { asm volatile("fence.acq_rel.sys;" : : : "memory"); }
/* Two tagged words of x_t: each 8-byte half is read whole (a vector access is
 * one access per element), which is what makes its tag vouch for its payload. */
__device__ __forceinline__ ulonglong2 host_load_pair(const unsigned long long *p) {
  ulonglong2 v;
  asm volatile("ld.relaxed.sys.v2.u64 {%0, %1}, [%2];" : "=l"(v.x), "=l"(v.y) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ unsigned host_load_u8(const uint8_t *p) {
  unsigned short v;
  asm volatile("ld.relaxed.sys.u8 %0, [%1];" : "=h"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ float host_load(const float *p) {
  float v;
  asm volatile("ld.relaxed.sys.f32 %0, [%1];" : "=f"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void host_store(float *p, float v) {
  asm volatile("st.relaxed.sys.f32 [%0], %1;" : : "l"(p), "f"(v) : "memory");
}
__device__ __forceinline__ void host_store_u16(void *p, unsigned short v) {
  asm volatile("st.relaxed.sys.u16 [%0], %1;" : : "l"(p), "h"(v) : "memory");
}
__device__ __forceinline__ void host_store(__nv_bfloat16 *p, __nv_bfloat16 v) { host_store_u16(p, __bfloat16_as_ushort(v)); }
__device__ __forceinline__ void host_store(__half *p, __half v) { host_store_u16(p, __half_as_ushort(v)); }
__device__ __forceinline__ void host_store_release(uint32_t *p, unsigned v) {
  asm volatile("st.release.sys.u32 [%0], %1;" : : "l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

/* Device words shared by the CTAs, at GPU scope (L2). */
__device__ __forceinline__ unsigned load_acquire(const unsigned *p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ unsigned long long load_acquire(const unsigned long long *p) {
  unsigned long long v;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void store_release(unsigned long long *p, unsigned long long v) {
  asm volatile("st.release.gpu.global.u64 [%0], %1;" : : "l"(p), "l"(v) : "memory");
}
/* Adds v at GPU scope, releasing what this thread's CTA wrote before (a
 * barrier orders the CTA's writes before it) and acquiring what the CTAs
 * that added before released. */
__device__ __forceinline__ unsigned atomic_add_acq_rel(unsigned *p, unsigned v) {
  unsigned old;
  asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}

/* x rounded to the element type, as a float. */
template <typename E> __device__ __forceinline__ float rounded(float x) { return to_accum(Round<E>::to(x)); }

/* ------------------------------------------------------------- barriers */

/* Every CTA arrives once a phase; true (in every thread) in the CTA that
 * completed `phase`. Writes before it are visible at GPU scope to whoever
 * waits for the phase, and to the CTA that completed it (acq_rel: no
 * separate fence, which was a sequentially consistent one). */
__device__ bool arrive(const ResidentParams &p, unsigned phase, unsigned *s_last) {
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned before = atomic_add_acq_rel(&p.control->arrivals, 1u);
    *s_last = before + 1u == phase * gridDim.x;  /* unsigned: the counter may wrap */
  }
  __syncthreads();
  return *s_last != 0;
}

/* Returns once every CTA arrived at `phase`. */
__device__ void wait_phase(const ResidentParams &p, unsigned phase) {
  if (threadIdx.x == 0) {
    const unsigned target = phase * gridDim.x;
    while ((int)(load_acquire(&p.control->arrivals) - target) < 0) {
    }
  }
  __syncthreads();
}

/* ------------------------------------------------------------- products */

/* kVec elements of a shared-memory row as floats (k % kVec == 0). */
__device__ __forceinline__ void row_vec(const float *w, float (&v)[kVec]) {
  const float4 q = *reinterpret_cast<const float4 *>(w);
  v[0] = q.x; v[1] = q.y; v[2] = q.z; v[3] = q.w;
}
template <typename E>
__device__ __forceinline__ void row_vec(const E *w, float (&v)[kVec]) {
  const uint2 q = *reinterpret_cast<const uint2 *>(w);
  const E *e = reinterpret_cast<const E *>(&q);
#pragma unroll
  for (int i = 0; i < kVec; ++i) v[i] = to_accum(e[i]);
}

/* out[r * ld + j] = w_r . staged_j over K (a multiple of kKAlign) for the
 * CTA's rows r < rows that belong to one of its units (r % U < units) and the
 * nb staged sequences (each K floats): a warp per row, lanes across K, kSeqs
 * sequences a pass over the row. */
template <int kSeqs, typename E>
__device__ void row_products_of(const E *w, int w_stride, int K, int rows, int U, int units, const float *staged,
                                int nb, float *out, int ld) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  for (int r = warp; r < rows; r += nwarps) {
    if (r % U >= units) continue;
    const E *wr = w + (size_t)r * w_stride;
    for (int j0 = 0; j0 < nb; j0 += kSeqs) {
      float acc[kSeqs];
#pragma unroll
      for (int j = 0; j < kSeqs; ++j) acc[j] = 0.f;
      for (int k = lane * kVec; k < K; k += 32 * kVec) {
        float wv[kVec];
        row_vec(wr + k, wv);
#pragma unroll
        for (int j = 0; j < kSeqs; ++j) {
          if (j0 + j < nb) {
            const float4 s = *reinterpret_cast<const float4 *>(staged + (size_t)(j0 + j) * K + k);
            acc[j] = fmaf(wv[3], s.w, fmaf(wv[2], s.z, fmaf(wv[1], s.y, fmaf(wv[0], s.x, acc[j]))));
          }
        }
      }
#pragma unroll
      for (int j = 0; j < kSeqs; ++j) {
#pragma unroll
        for (int off = 16; off >= 1; off >>= 1) acc[j] += __shfl_xor_sync(0xffffffffu, acc[j], off);
        if (lane == 0 && j0 + j < nb) out[(size_t)r * ld + j0 + j] = acc[j];
      }
    }
  }
}

/* row_products_of with one or two sequences a pass where nb is one or two
 * (a step of one sequence issues no multiply-adds or reductions for absent
 * ones), else four: eight a pass were slower at B = 8. */
template <typename E>
__device__ void row_products(const E *w, int w_stride, int K, int rows, int U, int units, const float *staged,
                             int nb, float *out, int ld) {
  if (nb == 1) row_products_of<1>(w, w_stride, K, rows, U, units, staged, nb, out, ld);
  else if (nb == 2) row_products_of<2>(w, w_stride, K, rows, U, units, staged, nb, out, ld);
  else row_products_of<4>(w, w_stride, K, rows, U, units, staged, nb, out, ld);
}

/* kVec consecutive elements from L2 as floats (4-element aligned). */
__device__ __forceinline__ float4 load4(const float *p) { return __ldcg(reinterpret_cast<const float4 *>(p)); }
template <typename E>
__device__ __forceinline__ float4 load4(const E *p) {
  const uint2 q = __ldcg(reinterpret_cast<const uint2 *>(p));
  const E *e = reinterpret_cast<const E *>(&q);
  return make_float4(to_accum(e[0]), to_accum(e[1]), to_accum(e[2]), to_accum(e[3]));
}

/* staged[j * K + k] = src[(b0 + j) * width + k] for k < width, else 0, for the
 * nb sequences (src in L2, written by other CTAs). Each thread issues
 * kLoadsInFlight loads before storing what they return: the step waits for
 * one L2 round trip, not one a load. */
template <typename S>
__device__ void stage(const S *src, int width, int b0, int nb, int K, float *staged) {
  if (width % kVec == 0) { /* whole, aligned 4-element chunks (K is a multiple of kVec too) */
    const int chunks = nb * K / kVec;
    for (int i0 = threadIdx.x; i0 < chunks; i0 += kLoadsInFlight * blockDim.x) {
      float4 v[kLoadsInFlight];
#pragma unroll
      for (int i = 0; i < kLoadsInFlight; ++i) {
        const int chunk = i0 + i * blockDim.x, j = chunk * kVec / K, k = chunk * kVec % K;
        v[i] = chunk < chunks && k < width ? load4(src + (size_t)(b0 + j) * width + k) : make_float4(0.f, 0.f, 0.f, 0.f);
      }
#pragma unroll
      for (int i = 0; i < kLoadsInFlight; ++i)
        if (i0 + i * blockDim.x < chunks) reinterpret_cast<float4 *>(staged)[i0 + i * blockDim.x] = v[i];
    }
    return;
  }
  const int n = nb * K;
  for (int i0 = threadIdx.x; i0 < n; i0 += kLoadsInFlight * blockDim.x) {
    float v[kLoadsInFlight];
#pragma unroll
    for (int i = 0; i < kLoadsInFlight; ++i) {
      const int idx = i0 + i * blockDim.x, j = idx / K, k = idx % K;
      v[i] = idx < n && k < width ? to_accum(__ldcg(src + (size_t)(b0 + j) * width + k)) : 0.f;
    }
#pragma unroll
    for (int i = 0; i < kLoadsInFlight; ++i)
      if (i0 + i * blockDim.x < n) staged[i0 + i * blockDim.x] = v[i];
  }
}

/* x_t's tagged words (prnn.h), a pair at a time. */
__device__ __forceinline__ bool is_current(const ulonglong2 &v, unsigned seq) {
  return (unsigned)(v.x >> 32) == seq && (unsigned)(v.y >> 32) == seq;
}
/* Pair `pair` of x_t into x_relay, from v re-read until both words carry seq
 * (a poll may read a word before the host wrote it). */
__device__ __forceinline__ void settle_pair(const ResidentParams &p, int pair, unsigned seq, ulonglong2 v) {
  while (!is_current(v, seq)) v = host_load_pair(p.x_words + 2 * (size_t)pair);
  reinterpret_cast<uint2 *>(p.x_relay)[pair] = make_uint2((unsigned)v.x, (unsigned)v.y);
}

/* CTA 0's copy of a STEP's x_t into x_relay when no poll read it: every
 * thread kLoadsInFlight pairs in flight, so the copy costs about one round
 * trip over the bus. */
__device__ void take_input(const ResidentParams &p, unsigned seq) {
  for (int i0 = threadIdx.x; i0 < p.x_pairs; i0 += kLoadsInFlight * blockDim.x) {
    ulonglong2 v[kLoadsInFlight];
#pragma unroll
    for (int i = 0; i < kLoadsInFlight; ++i)
      if (i0 + i * blockDim.x < p.x_pairs) v[i] = host_load_pair(p.x_words + 2 * (size_t)(i0 + i * blockDim.x));
#pragma unroll
    for (int i = 0; i < kLoadsInFlight; ++i)
      if (i0 + i * blockDim.x < p.x_pairs) settle_pair(p, i0 + i * blockDim.x, seq, v[i]);
  }
}

/* CTA 0, every thread: waits for the request after `seen` (its number and
 * kind into s_seq, s_command) and copies a STEP's x_t into x_relay. Within
 * kEagerPollNs of the last answer (answered_ns, thread 0's) every poll also
 * reads x_t's words, so that a STEP finds its input already read: one round
 * trip over the bus instead of two. */
__device__ void take_request(const ResidentParams &p, unsigned seen, unsigned long long answered_ns, unsigned *s_seq,
                             unsigned *s_command, unsigned *s_eager) {
  const bool small = p.x_pairs <= kEagerPairsPerThread * (int)blockDim.x;
  ulonglong2 v[kEagerPairsPerThread];
  bool eager;
  for (;;) {
    if (threadIdx.x == 0) *s_eager = small && global_ns() - answered_ns < kEagerPollNs;
    __syncthreads();
    eager = *s_eager != 0;
    if (eager) { /* issued before the request's load: no load waits for another */
#pragma unroll
      for (int i = 0; i < kEagerPairsPerThread; ++i) {
        const int pair = threadIdx.x + i * blockDim.x;
        if (pair < p.x_pairs) v[i] = host_load_pair(p.x_words + 2 * (size_t)pair);
      }
    }
    bool found = false;
    if (threadIdx.x == 0) {
      const unsigned long long word = host_load_request(p.mailbox);
      if ((unsigned)word != seen) {
        *s_seq = (unsigned)word;
        *s_command = (unsigned)(word >> 32);
        found = true;
      }
    }
    if (__syncthreads_or(found)) break;
  }
  const unsigned seq = *s_seq;
  if (*s_command != PRNN_RESIDENT_STEP) {
    if (threadIdx.x == 0) fence_acquire_sys(); /* the state or mask the host wrote before the request */
  } else if (eager) {
#pragma unroll
    for (int i = 0; i < kEagerPairsPerThread; ++i) {
      const int pair = threadIdx.x + i * blockDim.x;
      if (pair < p.x_pairs) settle_pair(p, pair, seq, v[i]);
    }
  } else {
    take_input(p, seq);
  }
}

/* ------------------------------------------------------------- the kernel */

/* The CTA's view of its shared memory. */
template <typename E>
struct Smem {
  E *weights;
  float *bias_x, *bias_h, *staged, *sums, *recurrent, *own_h, *cell;
};

/* Load the CTA's rows and biases of every layer (the weights are read only here). */
template <class Cell, typename E>
__device__ void load_layers(const ResidentParams &p, const Smem<E> &s, int u0, int units) {
  const int G = Cell::kGates, U = p.units, R = G * U, H = p.hidden;
#pragma unroll
  for (int l = 0; l < PRNN_RESIDENT_MAX_LAYERS; ++l) { /* unrolled: p.layer[l] at a constant index */
    if (l < p.layers) {
      const E *w_ih = static_cast<const E *>(p.layer[l].w_ih), *w_hh = static_cast<const E *>(p.layer[l].w_hh);
      const E *b_ih = static_cast<const E *>(p.layer[l].b_ih), *b_hh = static_cast<const E *>(p.layer[l].b_hh);
      const int64_t ih_stride = p.layer[l].w_ih_stride, hh_stride = p.layer[l].w_hh_stride;
      const int width = l == 0 ? p.input : H, kx = input_part(p, l), row = kx + p.kh;
      E *w = s.weights + layer_offset(p, R, l);
      for (int idx = threadIdx.x; idx < R * row; idx += blockDim.x) {
        const int r = idx / row, k = idx % row, ul = r % U;
        const int64_t i = (int64_t)(r / U) * H + u0 + ul; /* the row of W_ih / W_hh */
        E v = Round<E>::to(0.f);
        if (ul < units) {
          if (k < width) v = w_ih[i * ih_stride + k];
          else if (k >= kx && k - kx < H) v = w_hh[i * hh_stride + (k - kx)];
        }
        w[idx] = v;
      }
      for (int r = threadIdx.x; r < R; r += blockDim.x) {
        const int ul = r % U;
        const int64_t i = (int64_t)(r / U) * H + u0 + ul;
        const bool has = ul < units && b_ih != NULL;
        const float bi = has ? to_accum(b_ih[i]) : 0.f, bh = has ? to_accum(b_hh[i]) : 0.f;
        s.bias_x[l * R + r] = Cell::kBiasesInInput ? rounded<E>(bi + bh) : bi;
        s.bias_h[l * R + r] = Cell::kBiasesInInput ? 0.f : bh;
      }
    }
  }
}

/* s.recurrent = W_hh h for the state in buffer `parity` (all CTAs wrote it). */
template <class Cell, typename E>
__device__ void multiply_state(const ResidentParams &p, const Smem<E> &s, int parity, int units) {
  const int G = Cell::kGates, U = p.units, R = G * U, B = p.batch, H = p.hidden, L = p.layers;
  for (int l = 0; l < L; ++l) {
    const float *h = p.state + ((size_t)parity * L + l) * B * H;
    const int kx = input_part(p, l), row = kx + p.kh;
    for (int b0 = 0; b0 < B; b0 += p.tile) {
      const int nb = min(p.tile, B - b0);
      stage(h, H, b0, nb, p.kh, s.staged);
      __syncthreads();
      row_products(s.weights + layer_offset(p, R, l) + kx, row, p.kh, R, U, units, s.staged, nb,
                   s.recurrent + (size_t)l * R * B + b0, B);
      __syncthreads();
    }
  }
}

/* One timestep of every layer from the relayed x_t: the state in buffer
 * `parity` becomes h_t in buffer parity ^ 1, y gets the top layer's h_t. */
template <class Cell, typename E>
__device__ void run_step(const ResidentParams &p, const Smem<E> &s, int parity, int u0, int units, unsigned *phase,
                         unsigned *s_last) {
  const int G = Cell::kGates, U = p.units, R = G * U, B = p.batch, H = p.hidden, L = p.layers;
  float *next = p.state + (size_t)(parity ^ 1) * L * B * H;
  E *y = static_cast<E *>(p.y);
  for (int l = 0; l < L; ++l) {
    const int width = l == 0 ? p.input : H, kx = input_part(p, l);
    for (int b0 = 0; b0 < B; b0 += p.tile) {
      const int nb = min(p.tile, B - b0);
      if (l == 0) stage(static_cast<const E *>(p.x_relay), width, b0, nb, kx, s.staged);
      else stage(next + (size_t)(l - 1) * B * H, width, b0, nb, kx, s.staged);
      __syncthreads();
      row_products(s.weights + layer_offset(p, R, l), kx + p.kh, kx, R, U, units, s.staged, nb, s.sums, p.tile);
      __syncthreads();
      for (int idx = threadIdx.x; idx < units * nb; idx += blockDim.x) {
        const int ul = idx % units, j = idx / units, b = b0 + j, u = u0 + ul, c = (l * U + ul) * B + b;
        float xp[G], hh[G];
#pragma unroll
        for (int g = 0; g < G; ++g) {
          const int r = g * U + ul;
          xp[g] = rounded<E>(s.sums[r * p.tile + j] + s.bias_x[l * R + r]); /* as the projection GEMM's output */
          hh[g] = s.recurrent[((size_t)l * R + r) * B + b] + s.bias_h[l * R + r];
        }
        float carry = 0.f;
        const E out = Round<E>::to(Cell::forward(xp, hh, Cell::kCarriesCell ? s.cell[c] : s.own_h[c], &carry));
        const float h = to_accum(out);
        s.own_h[c] = h;
        if (Cell::kCarriesCell) s.cell[c] = carry;
        next[((size_t)l * B + b) * H + u] = h;
        if (l == L - 1) host_store(y + (size_t)b * H + u, out);
      }
      __syncthreads();
    }
    if (l < L - 1) { /* the layer above reads every unit's h_t */
      arrive(p, ++*phase, s_last);
      wait_phase(p, *phase);
    }
  }
}

/* SET_STATE, GET_STATE and RESET on the CTA's units: the state in buffer
 * `parity`, the new one (SET_STATE, RESET) into parity ^ 1. */
template <class Cell, typename E>
__device__ void run_state_command(const ResidentParams &p, const Smem<E> &s, unsigned command, int parity, int u0,
                                  int units) {
  const int U = p.units, B = p.batch, H = p.hidden, L = p.layers;
  float *next = p.state + (size_t)(parity ^ 1) * L * B * H;
  for (int idx = threadIdx.x; idx < L * B * units; idx += blockDim.x) {
    const int ul = idx % units, b = (idx / units) % B, l = idx / (units * B), u = u0 + ul;
    const int c = (l * U + ul) * B + b;
    const size_t o = ((size_t)l * B + b) * H + u;
    if (command == PRNN_RESIDENT_GET_STATE) {
      host_store(p.h_host + o, s.own_h[c]);
      if (Cell::kCarriesCell) host_store(p.c_host + o, s.cell[c]);
      continue;
    }
    if (command == PRNN_RESIDENT_SET_STATE) {
      s.own_h[c] = host_load(p.h_host + o);
      if (Cell::kCarriesCell) s.cell[c] = host_load(p.c_host + o);
    } else if (host_load_u8(p.mask + b) != 0) { /* RESET */
      s.own_h[c] = 0.f;
      if (Cell::kCarriesCell) s.cell[c] = 0.f;
    }
    next[o] = s.own_h[c];
  }
}

/* The next command's number and kind, in every thread of every CTA. CTA 0
 * takes it from the mailbox (and relays a STEP's x_t), the others from CTA 0. */
__device__ unsigned next_command(const ResidentParams &p, unsigned seen, unsigned long long answered_ns,
                                 unsigned *s_seq, unsigned *s_command, unsigned *s_eager) {
  if (blockIdx.x == 0) {
    take_request(p, seen, answered_ns, s_seq, s_command, s_eager);
    __syncthreads();
    if (threadIdx.x == 0) /* release: the relayed x_t (ordered before by the barrier) before the command */
      store_release(&p.control->go_command, (unsigned long long)*s_command << 32 | *s_seq);
  } else if (threadIdx.x == 0) {
    unsigned long long word;
    do {
      word = load_acquire(&p.control->go_command);
    } while ((unsigned)word == seen);
    *s_seq = (unsigned)word;
    *s_command = (unsigned)(word >> 32);
  }
  __syncthreads();
  return *s_command;
}

template <class Cell, typename E>
__global__ void __launch_bounds__(kThreads, 1) resident_kernel(const ResidentParams p) {
  const int U = p.units, u0 = blockIdx.x * U, units = min(U, p.hidden - u0);
  extern __shared__ __align__(16) unsigned char smem[]; /* all dynamic: the kernel may take the opt-in limit */
  const SmemLayout lay = smem_layout(Cell::kGates, Cell::kCarriesCell, sizeof(E), p.layers, p.batch, U, p.kx0, p.kh,
                                     p.tile);
  unsigned *words = reinterpret_cast<unsigned *>(smem + lay.words);
  unsigned *s_seq = words, *s_command = words + 1, *s_last = words + 2, *s_eager = words + 3;
  Smem<E> s;
  s.weights = reinterpret_cast<E *>(smem + lay.weights);
  s.bias_x = reinterpret_cast<float *>(smem + lay.bias_x);
  s.bias_h = reinterpret_cast<float *>(smem + lay.bias_h);
  s.staged = reinterpret_cast<float *>(smem + lay.staged);
  s.sums = reinterpret_cast<float *>(smem + lay.sums);
  s.recurrent = reinterpret_cast<float *>(smem + lay.recurrent);
  s.own_h = reinterpret_cast<float *>(smem + lay.own_h);
  s.cell = reinterpret_cast<float *>(smem + lay.cell);

  load_layers<Cell, E>(p, s, u0, units);
  /* The state starts at zero (the workspace is zeroed), and so does W_hh h. */
  const int R = Cell::kGates * U;
  for (int i = threadIdx.x; i < p.layers * R * p.batch; i += blockDim.x) s.recurrent[i] = 0.f;
  for (int i = threadIdx.x; i < p.layers * U * p.batch; i += blockDim.x) {
    s.own_h[i] = 0.f;
    if (Cell::kCarriesCell) s.cell[i] = 0.f;
  }

  unsigned phase = 1;
  if (arrive(p, phase, s_last) && threadIdx.x == 0) /* every CTA holds its rows (acquired by arrive) */
    host_store_release(&p.mailbox->ready, 1u);

  unsigned seen = 0;
  unsigned long long answered_ns = global_ns(); /* thread 0's: when this CTA last answered */
  int parity = 0;
  for (;;) {
    const unsigned command = next_command(p, seen, answered_ns, s_seq, s_command, s_eager);
    seen = *s_seq;
    bool changed = false;
    if (command == PRNN_RESIDENT_STEP) {
      run_step<Cell, E>(p, s, parity, u0, units, &phase, s_last);
      changed = true;
    } else if (command == PRNN_RESIDENT_SET_STATE || command == PRNN_RESIDENT_GET_STATE ||
               command == PRNN_RESIDENT_RESET) {
      run_state_command<Cell, E>(p, s, command, parity, u0, units);
      changed = command != PRNN_RESIDENT_GET_STATE;
    }
    /* Each CTA answers for itself: the barrier orders its threads' writes (its
     * part of y or of the state) before thread 0's release, which passes them
     * on to the host with the answer - no grid-wide barrier on the way back. */
    __syncthreads();
    if (threadIdx.x == 0) {
      host_store_release(&p.mailbox->answer[blockIdx.x], seen);
      answered_ns = global_ns();
    }
    if (command == PRNN_RESIDENT_STOP) return;
    if (changed) { /* every CTA's part of the new state written before any multiplies by it */
      arrive(p, ++phase, s_last);
      parity ^= 1;
      wait_phase(p, phase);
      multiply_state<Cell, E>(p, s, parity, units);
    }
  }
}

/* ------------------------------------------------------------- host side */

typedef void (*ResidentKernel)(ResidentParams);

ResidentKernel kernel_of(prnn_cell_t cell, prnn_activation_t activation, prnn_dtype_t dtype) {
#define PRNN_RESIDENT_KERNELS(E)                                                                       \
  switch (cell) {                                                                                      \
    case PRNN_CELL_ELMAN:                                                                              \
      return activation == PRNN_ACT_RELU ? resident_kernel<ResidentElman<PRNN_ACT_RELU>, E>            \
                                         : resident_kernel<ResidentElman<PRNN_ACT_TANH>, E>;           \
    case PRNN_CELL_LSTM: return resident_kernel<ResidentGated<LstmCell>, E>;                           \
    case PRNN_CELL_GRU: return resident_kernel<ResidentGated<GruCell>, E>;                             \
  }                                                                                                    \
  return NULL;
  switch (dtype) {
    case PRNN_DTYPE_FLOAT32: PRNN_RESIDENT_KERNELS(float)
    case PRNN_DTYPE_BFLOAT16: PRNN_RESIDENT_KERNELS(__nv_bfloat16)
    case PRNN_DTYPE_FLOAT16: PRNN_RESIDENT_KERNELS(__half)
    default: return NULL;
  }
#undef PRNN_RESIDENT_KERNELS
}

struct ResidentDevice {
  int sms, smem_optin, cooperative, unified;
};

/* The device's attributes. The first query of a device also loads every
 * resident kernel: with CUDA's lazy loading a kernel is loaded at its first
 * use, which may wait for the device to be idle, and a device with a resident
 * kernel running never is. */
prnn_status_t resident_device(int device, ResidentDevice *d) {
  static int loaded[kMaxDevices];
  if (device < 0 || device >= kMaxDevices)
    return prnn_fail(PRNN_STATUS_BAD_PARAM, "device %d out of range [0, %d)", device, kMaxDevices);
  cudaError_t err = cudaDeviceGetAttribute(&d->sms, cudaDevAttrMultiProcessorCount, device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&d->smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&d->cooperative, cudaDevAttrCooperativeLaunch, device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&d->unified, cudaDevAttrUnifiedAddressing, device);
  if (err != cudaSuccess) return cuda_fail(err, "cudaDeviceGetAttribute");
  if (!__atomic_load_n(&loaded[device], __ATOMIC_ACQUIRE)) {
    const prnn_cell_t cells[] = {PRNN_CELL_ELMAN, PRNN_CELL_LSTM, PRNN_CELL_GRU};
    const prnn_activation_t activations[] = {PRNN_ACT_TANH, PRNN_ACT_RELU};
    const prnn_dtype_t dtypes[] = {PRNN_DTYPE_FLOAT32, PRNN_DTYPE_BFLOAT16, PRNN_DTYPE_FLOAT16};
    for (prnn_cell_t cell : cells)
      for (prnn_activation_t activation : activations)
        for (prnn_dtype_t dtype : dtypes) {
          const void *fn = (const void *)kernel_of(cell, activation, dtype);
          cudaFuncAttributes attributes;
          err = cudaFuncGetAttributes(&attributes, fn); /* loads it */
          if (err != cudaSuccess) return cuda_fail(err, "cudaFuncGetAttributes(resident kernel)");
          /* The device's whole opt-in limit, set once; the plan checks each size. */
          err = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, d->smem_optin);
          if (err != cudaSuccess) return cuda_fail(err, "cudaFuncSetAttribute(resident kernel)");
        }
    __atomic_store_n(&loaded[device], 1, __ATOMIC_RELEASE);
  }
  return PRNN_STATUS_SUCCESS;
}

int gates_of(prnn_cell_t cell) {
  return cell == PRNN_CELL_LSTM ? PRNN_LSTM_GATES : cell == PRNN_CELL_GRU ? PRNN_GRU_GATES : 1;
}

prnn_status_t check_problem(const prnn_resident_problem_t *pb) {
  if (pb == NULL) return prnn_fail(PRNN_STATUS_BAD_PARAM, "problem is NULL");
  if ((int)pb->cell < PRNN_CELL_ELMAN || (int)pb->cell > PRNN_CELL_GRU)
    return prnn_fail(PRNN_STATUS_BAD_PARAM, "cell %d is not a prnn_cell_t", (int)pb->cell);
  if ((int)pb->activation != PRNN_ACT_TANH && (int)pb->activation != PRNN_ACT_RELU)
    return prnn_fail(PRNN_STATUS_BAD_PARAM, "activation %d is not a prnn_activation_t", (int)pb->activation);
  if ((int)pb->dtype < PRNN_DTYPE_FLOAT32 || (int)pb->dtype > PRNN_DTYPE_BFLOAT16)
    return prnn_fail(PRNN_STATUS_BAD_PARAM, "dtype %d is not a prnn_dtype_t", (int)pb->dtype);
  if (pb->layers < 1 || pb->layers > PRNN_RESIDENT_MAX_LAYERS)
    return prnn_fail(PRNN_STATUS_BAD_PARAM, "layers must be in [1, %d], got %lld", PRNN_RESIDENT_MAX_LAYERS,
                     (long long)pb->layers);
  if (pb->batch < 1 || pb->input < 1 || pb->hidden < 1 || pb->max_ctas < 1)
    return prnn_fail(PRNN_STATUS_BAD_PARAM, "batch, input, hidden and max_ctas must be >= 1, got %lld, %lld, %lld, %lld",
                     (long long)pb->batch, (long long)pb->input, (long long)pb->hidden, (long long)pb->max_ctas);
  if (pb->dtype == PRNN_DTYPE_FLOAT64)
    return prnn_fail(PRNN_STATUS_NOT_SUPPORTED, "the resident mode runs float32, bfloat16 and float16, not float64");
  const int64_t limit = 0x7fffffff;
  if (pb->batch * pb->input > limit || 2 * pb->layers * pb->batch * pb->hidden > limit ||
      gates_of(pb->cell) * pb->hidden > limit)
    return prnn_fail(PRNN_STATUS_NOT_SUPPORTED, "batch x input, 2 x layers x batch x hidden and gates x hidden must be < 2^31");
  return PRNN_STATUS_SUCCESS;
}

/* Pairs of x_t's tagged words. */
size_t x_pairs(const prnn_resident_problem_t *pb) {
  return prnn_resident_x_words((size_t)pb->batch * pb->input * prnn_dtype_size(pb->dtype)) / 2;
}

/* A planned launch. */
struct ResidentLaunch {
  ResidentKernel kernel;
  int grid, units, kx0, kh, tile;
  size_t smem_bytes, workspace_bytes, x_relay_offset, state_offset;
};

size_t smem_for(const prnn_resident_problem_t *pb, int units, int kx0, int kh, int tile) {
  return smem_layout(gates_of(pb->cell), pb->cell == PRNN_CELL_LSTM, prnn_dtype_size(pb->dtype), (int)pb->layers,
                     (int)pb->batch, units, kx0, kh, tile)
      .total;
}

prnn_status_t plan_resident(const prnn_resident_problem_t *pb, int device, ResidentLaunch *l) {
  memset(l, 0, sizeof *l);
  prnn_status_t st = check_problem(pb);
  if (st != PRNN_STATUS_SUCCESS) return st;
  ResidentDevice dev;
  st = resident_device(device, &dev);
  if (st != PRNN_STATUS_SUCCESS) return st;
  if (!dev.cooperative)
    return prnn_fail(PRNN_STATUS_NOT_SUPPORTED, "device %d does not support cooperative launches", device);
  if (!dev.unified)
    return prnn_fail(PRNN_STATUS_NOT_SUPPORTED, "device %d has no unified addressing (host-mapped memory)", device);
  const int H = (int)pb->hidden, G = gates_of(pb->cell);
  const int kx0 = (int)align_up((size_t)pb->input, kKAlign), kh = (int)align_up((size_t)H, kKAlign);
  const int tile = pb->batch < kMaxBatchTile ? (int)pb->batch : kMaxBatchTile;
  const size_t optin = (size_t)dev.smem_optin;
  if (smem_for(pb, 1, kx0, kh, tile) > optin)
    return prnn_fail(PRNN_STATUS_NOT_SUPPORTED,
                     "one hidden unit's rows and buffers need %zu bytes of shared memory, more than the %zu a CTA "
                     "may have on device %d",
                     smem_for(pb, 1, kx0, kh, tile), optin, device);
  int lo = 1, hi = H; /* the most units a CTA holds: shared memory grows with them */
  while (lo < hi) {
    const int mid = lo + (hi - lo + 1) / 2;
    if (smem_for(pb, mid, kx0, kh, tile) <= optin) lo = mid;
    else hi = mid - 1;
  }
  const int most_units = lo;
  const int least_grid = (H + most_units - 1) / most_units;
  int64_t allowed = pb->max_ctas < dev.sms ? pb->max_ctas : dev.sms;
  if (allowed > PRNN_RESIDENT_MAX_CTAS) allowed = PRNN_RESIDENT_MAX_CTAS; /* one answer word each */
  if (least_grid > allowed)
    return prnn_fail(PRNN_STATUS_NOT_SUPPORTED,
                     "the weights need at least %d CTAs (one an SM, %d units each) to fit in shared memory; %lld "
                     "allowed of the device's %d SMs",
                     least_grid, most_units, (long long)allowed, dev.sms);
  const size_t unit_bytes = (size_t)G * ((size_t)kx0 + kh + (size_t)(pb->layers - 1) * 2 * kh) * prnn_dtype_size(pb->dtype);
  const size_t wanted_units = kTargetCtaWeightBytes / unit_bytes > 0 ? kTargetCtaWeightBytes / unit_bytes : 1;
  int64_t grid = (H + (int64_t)wanted_units - 1) / (int64_t)wanted_units;
  if (grid < least_grid) grid = least_grid;
  if (grid > allowed) grid = allowed;
  l->units = (int)((H + grid - 1) / grid);
  l->grid = (H + l->units - 1) / l->units;
  l->kx0 = kx0;
  l->kh = kh;
  l->tile = tile;
  l->smem_bytes = smem_for(pb, l->units, kx0, kh, tile);
  l->kernel = kernel_of(pb->cell, pb->activation, pb->dtype);
  int per_sm = 0;
  cudaError_t err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, (const void *)l->kernel, kThreads, l->smem_bytes);
  if (err != cudaSuccess) return cuda_fail(err, "cudaOccupancyMaxActiveBlocksPerMultiprocessor(resident kernel)");
  if (per_sm < 1)
    return prnn_fail(PRNN_STATUS_NOT_SUPPORTED, "a resident CTA of %zu bytes of shared memory does not fit on an SM",
                     l->smem_bytes);
  const size_t kWorkspaceAlign = 256;
  l->x_relay_offset = align_up(sizeof(Control), kWorkspaceAlign);
  l->state_offset = align_up(l->x_relay_offset + x_pairs(pb) * 8, kWorkspaceAlign);
  l->workspace_bytes = l->state_offset + 2 * (size_t)pb->layers * pb->batch * pb->hidden * sizeof(float);
  return PRNN_STATUS_SUCCESS;
}

prnn_status_t check_args(const prnn_resident_problem_t *pb, const prnn_resident_args_t *a) {
  if (a == NULL) return prnn_fail(PRNN_STATUS_BAD_PARAM, "args is NULL");
  if (a->mailbox == NULL || a->x_words == NULL || a->y == NULL || a->h == NULL || a->mask == NULL)
    return prnn_fail(PRNN_STATUS_BAD_PARAM, "mailbox, x_words, y, h and mask must not be NULL");
  if ((uintptr_t)a->mailbox % PRNN_RESIDENT_MAILBOX_ALIGNMENT != 0)
    return prnn_fail(PRNN_STATUS_BAD_PARAM, "mailbox must be aligned to %d bytes, got %p",
                     PRNN_RESIDENT_MAILBOX_ALIGNMENT, (const void *)a->mailbox);
  if ((uintptr_t)a->x_words % 16 != 0)
    return prnn_fail(PRNN_STATUS_BAD_PARAM, "x_words must be aligned to 16 bytes, got %p", (const void *)a->x_words);
  if ((pb->cell == PRNN_CELL_LSTM) != (a->c != NULL))
    return prnn_fail(PRNN_STATUS_BAD_PARAM, "c must be given for an LSTM and NULL otherwise");
  for (int64_t l = 0; l < pb->layers; ++l) {
    const prnn_resident_layer_t &w = a->layer[l];
    const int64_t width = l == 0 ? pb->input : pb->hidden;
    if (w.w_ih == NULL || w.w_hh == NULL)
      return prnn_fail(PRNN_STATUS_BAD_PARAM, "layer %lld: w_ih and w_hh must not be NULL", (long long)l);
    if (w.w_ih_stride < width || w.w_hh_stride < pb->hidden)
      return prnn_fail(PRNN_STATUS_BAD_PARAM, "layer %lld: w_ih_stride (%lld) must be >= %lld and w_hh_stride (%lld) >= %lld",
                       (long long)l, (long long)w.w_ih_stride, (long long)width, (long long)w.w_hh_stride,
                       (long long)pb->hidden);
    if ((w.b_ih == NULL) != (w.b_hh == NULL))
      return prnn_fail(PRNN_STATUS_BAD_PARAM, "layer %lld: b_ih and b_hh must both be given or both be NULL", (long long)l);
  }
  return PRNN_STATUS_SUCCESS;
}

}  // namespace
}  // namespace prnn

using namespace prnn;

extern "C" {

prnn_status_t prnn_resident_plan_cuda(const prnn_resident_problem_t *problem, int device, prnn_resident_plan_t *plan) {
  prnn_clear_error();
  if (plan == NULL) return prnn_fail(PRNN_STATUS_BAD_PARAM, "plan is NULL");
  memset(plan, 0, sizeof *plan);
  ResidentLaunch l;
  const prnn_status_t st = plan_resident(problem, device, &l);
  if (st != PRNN_STATUS_SUCCESS) return st;
  plan->grid = l.grid;
  plan->block = kThreads;
  plan->units_per_cta = l.units;
  plan->smem_bytes = (int)l.smem_bytes;
  plan->workspace_bytes = l.workspace_bytes;
  return PRNN_STATUS_SUCCESS;
}

prnn_status_t prnn_resident_launch_cuda(const prnn_resident_problem_t *problem, const prnn_resident_args_t *args,
                                        void *workspace, size_t workspace_bytes, prnn_stream_t stream) {
  prnn_clear_error();
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return cuda_fail(err, "cudaGetDevice");
  ResidentLaunch l;
  prnn_status_t st = plan_resident(problem, device, &l);
  if (st != PRNN_STATUS_SUCCESS) return st;
  st = check_args(problem, args);
  if (st != PRNN_STATUS_SUCCESS) return st;
  st = check_workspace(workspace, workspace_bytes, l.workspace_bytes);
  if (st == PRNN_STATUS_SUCCESS) st = load_plain_kernels(); /* what the layers run beside it */
  if (st != PRNN_STATUS_SUCCESS) return st;
  ResidentParams p;
  memset(&p, 0, sizeof p);
  p.layers = (int)problem->layers;
  p.batch = (int)problem->batch;
  p.input = (int)problem->input;
  p.hidden = (int)problem->hidden;
  p.units = l.units;
  p.kx0 = l.kx0;
  p.kh = l.kh;
  p.tile = l.tile;
  for (int64_t i = 0; i < problem->layers; ++i) p.layer[i] = args->layer[i];
  p.mailbox = args->mailbox;
  p.x_words = reinterpret_cast<const unsigned long long *>(args->x_words);
  p.x_pairs = (int)x_pairs(problem);
  p.y = args->y;
  p.h_host = args->h;
  p.c_host = args->c;
  p.mask = args->mask;
  char *ws = static_cast<char *>(workspace);
  p.control = reinterpret_cast<Control *>(ws);
  p.x_relay = ws + l.x_relay_offset;
  p.state = reinterpret_cast<float *>(ws + l.state_offset);
  void *kernel_args[] = {&p};
  return launch_cooperative_zeroed((const void *)l.kernel, l.grid, kThreads, kernel_args, l.smem_bytes, workspace,
                                   l.workspace_bytes, (cudaStream_t)stream,
                                   "cudaLaunchCooperativeKernel(resident kernel)");
}

}  // extern "C"
