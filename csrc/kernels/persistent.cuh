/*
 * persistent.cuh - the persistent recurrent kernel (forward and backward-data).
 *
 * One cooperative launch runs all T steps. CTA c owns R consecutive rows of the
 * on-chip matrix A (W_hh forward, W_hh^T backward) and keeps them for the whole
 * sequence: RREG rows in registers, the other R - RREG rows in shared memory.
 * Inside a CTA the K (hidden) dimension is split over threads: thread i holds
 * columns [i*KL, i*KL + KL) of every owned row, so it needs only that slice of
 * the previous state, which it reads straight from L2.
 *
 * Grid-wide exchange without a barrier: the state s_t is published in a
 * workspace of 8-byte words {tag: high 32 bits, payload: low 32 bits} with the
 * tag = step + 1 (the workspace is zeroed before launch). A reader polls its
 * words until every tag matches; an aligned 8-byte access is single-copy
 * atomic, so a matching tag proves the payload is that step's. Two buffers
 * alternate by step parity: a CTA can only write step s after it has seen all
 * of step s-1, which every CTA wrote after it finished reading step s-2.
 * The payload is one float32, or two 16-bit values (consecutive k) for the
 * 16-bit dtypes - the state is carried at the element width, like nn.RNN.
 *
 * One step for a tile of BT sequences (R * BT = 32 outputs):
 *   poll s_{t-1} slice -> R*BT*KL FMAs -> warp reduce-scatter (lane l ends with
 *   output l) -> shared memory -> __syncthreads -> 32 threads sum the warps,
 *   apply the activation, write out[t] and publish s_t.
 */
#ifndef PRNN_PERSISTENT_CUH
#define PRNN_PERSISTENT_CUH

#include "exchange.cuh"
#include "cells.cuh"
#include "warp_reduce.cuh"

namespace prnn {

typedef void (*PersistentKernel)(RecurrenceParams);

/* A compiled tile shape. */
struct PersistentConfig {
  int rows;          /* R: rows of A per CTA */
  int k_per_thread;  /* KL: columns per thread */
  int reg_rows;      /* RREG: rows held in registers; the rest in shared memory */
  int max_threads;   /* launch bound */
  int pack;          /* state values per exchange word */
  PersistentKernel kernel;
};

/* Values per 32-bit register / exchange payload. */
template <typename E> struct Pack { static const int value = 2; };
template <> struct Pack<float> { static const int value = 1; };

/* Two 16-bit values (low = even k) of a 32-bit word as floats. */
template <typename E> __device__ __forceinline__ float2 unpack2(uint32_t v);
template <> __device__ __forceinline__ float2 unpack2<__nv_bfloat16>(uint32_t v) {
  return make_float2(__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u));
}
template <> __device__ __forceinline__ float2 unpack2<__half>(uint32_t v) {
  return make_float2(__half2float(__ushort_as_half((unsigned short)(v & 0xffffu))),
                     __half2float(__ushort_as_half((unsigned short)(v >> 16))));
}

/* A[i][k .. k+PACK) packed as a register word (zero outside [0, H)). */
template <typename E>
__device__ __forceinline__ uint32_t load_a_word(const RecurrenceParams &p, int i, int k) {
  const E *a = static_cast<const E *>(p.a);
  if constexpr (Pack<E>::value == 1) {
    float v = 0.f;
    if (i < p.hidden && k < p.hidden) v = to_accum(a[i * p.a_stride_row + k * p.a_stride_col]);
    return __float_as_uint(v);
  } else {
    uint32_t lo = 0, hi = 0;
    if (i < p.hidden && k < p.hidden) lo = bits16(a[i * p.a_stride_row + k * p.a_stride_col]);
    if (i < p.hidden && k + 1 < p.hidden) hi = bits16(a[i * p.a_stride_row + (k + 1) * p.a_stride_col]);
    return lo | (hi << 16);
  }
}

/* acc += A-row word . h pair, for one packed word. */
template <typename E>
__device__ __forceinline__ float dot_word(uint32_t w, const float *h, float acc) {
  if constexpr (Pack<E>::value == 1) {
    return fmaf(__uint_as_float(w), h[0], acc);
  } else {
    const float2 w2 = unpack2<E>(w);
    return fmaf(w2.y, h[1], fmaf(w2.x, h[0], acc));
  }
}

template <class Cell, typename E, int R, int KL, int RREG, int MAXT>
__global__ void __launch_bounds__(MAXT, 1) persistent_rnn_kernel(const RecurrenceParams p) {
  constexpr int PACK = Pack<E>::value;
  constexpr int WPT = KL / PACK;           /* words per thread per row / per sequence */
  constexpr int BT = R >= 32 ? 1 : 32 / R; /* sequences per tile */
  constexpr int N = R * BT;                /* outputs per tile */
  constexpr int M = N / 32;                /* outputs per lane after the reduce-scatter */
  constexpr int RSH = R - RREG;            /* rows in shared memory */
  static_assert(N % 32 == 0 && WPT % 2 == 0 && RREG >= 1 && RREG <= R, "bad tile shape");
  static_assert(Cell::kGates == 1, "an Elman family: one row of A an output");

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int nthreads = blockDim.x, nwarps = nthreads >> 5;
  const int T = p.steps, B = p.batch, H = p.hidden;
  const int row0 = blockIdx.x * R;
  /* Thread tid's j-th word of a row (of A) or of a sequence (of the state) is
   * word (j/2 * nthreads + tid) * 2 + j%2: a warp's 16-byte loads are contiguous. */
  auto word_index = [&](int j) { return ((j >> 1) * nthreads + tid) * 2 + (j & 1); };
  const int words_per_seq = p.grid.hidden_padded / PACK;
  E *out;
  const E *in, *yfwd, *h0;
  typed_tensors(p, out, in, yfwd, h0);

  /* shared memory: [RSH][nthreads][WPT] A words (thread-private), then [2][nwarps][N] partial sums */
  extern __shared__ __align__(16) unsigned char smem[];
  uint32_t *a_smem = reinterpret_cast<uint32_t *>(smem);
  float *partial = reinterpret_cast<float *>(smem + (size_t)RSH * nthreads * WPT * sizeof(uint32_t));

  /* Stash this thread's slice of the CTA's rows for the whole sequence. */
  uint32_t a_reg[RREG][WPT];
#pragma unroll
  for (int r = 0; r < RREG; ++r)
#pragma unroll
    for (int j = 0; j < WPT; ++j) a_reg[r][j] = load_a_word<E>(p, row0 + r, word_index(j) * PACK);
#pragma unroll 1
  for (int r = RREG; r < R; ++r) /* not unrolled: the loads need not all be in flight */
#pragma unroll
    for (int j = 0; j < WPT; ++j)
      a_smem[((r - RREG) * nthreads + tid) * WPT + j] = load_a_word<E>(p, row0 + r, word_index(j) * PACK);

  int buf = 0;
  const int tiles = (B + BT - 1) / BT;
  for (int s = 0; s < T; ++s) {
    const int t = p.backward ? T - 1 - s : s;
    const unsigned tag = (unsigned)s; /* the tag of s_{t-1}; s_t is published as s + 1 */
    const unsigned long long *prev_state = p.exchange + (size_t)((s + 1) & 1) * B * words_per_seq;
    unsigned long long *next_state = p.exchange + (size_t)(s & 1) * B * words_per_seq;
    for (int tile = 0; tile < tiles; ++tile) {
      const int b0 = tile * BT;

      /* Epilogue operands first, so their latency hides behind the poll. */
      const int o_row = row0 + tid % R, o_b = b0 + tid / R;
      const bool o_valid = tid < N && o_row < H && o_b < B;
      float o_in = 0.f, o_y = 0.f;
      int o_len = 0;
      if (o_valid) {
        o_in = to_accum(in[t * p.in_stride_t + o_b * p.in_stride_b + o_row]);
        if (p.backward) o_y = to_accum(yfwd[((size_t)t * B + o_b) * H + o_row]);
        o_len = sequence_length(p.lengths, o_b, T);
      }

      /* The previous state, this thread's K slice, for the tile's sequences. */
      float h[BT][KL];
      if (s == 0) {
#pragma unroll
        for (int bl = 0; bl < BT; ++bl)
#pragma unroll
          for (int e = 0; e < KL; ++e) {
            const int b = b0 + bl, k = word_index(e / PACK) * PACK + e % PACK;
            h[bl][e] = (!p.backward && b < B && k < H) ? to_accum(h0[b * p.h0_stride_b + k]) : 0.f;
          }
      } else {
        const unsigned long long ready = (unsigned long long)tag << 32; /* payload 0 */
        unsigned long long word[BT][WPT];
        /* Words j, j+1 of sequence b0+bl in one coalesced 16-byte load; a word past
         * H (or of a sequence past B) is never written and counts as ready zero. */
        auto load_pair = [&](int bl, int j) {
          const int b = b0 + bl, w = word_index(j);
          if (b < B && w * PACK < H)
            load_word_pair(prev_state + (size_t)b * words_per_seq + w, word[bl][j], word[bl][j + 1]);
          else
            word[bl][j] = ready;
          if (!(b < B && (w + 1) * PACK < H)) word[bl][j + 1] = ready;
        };
#pragma unroll
        for (int bl = 0; bl < BT; ++bl)
#pragma unroll
          for (int j = 0; j < WPT; j += 2) load_pair(bl, j);
        /* Re-poll the pairs whose tags are not there yet, all of them per round.
         * The warp leaves together: a warp left diverged here would run every
         * shuffle of the reduction below on the slow, collective path. */
        unsigned long long since = 0; /* for the watchdog */
        for (unsigned round = 1;; ++round) {
          bool all = true;
#pragma unroll
          for (int bl = 0; bl < BT; ++bl)
#pragma unroll
            for (int j = 0; j < WPT; ++j) all &= (unsigned)(word[bl][j] >> 32) == tag;
          if (__all_sync(0xffffffffu, all)) break;
#pragma unroll
          for (int bl = 0; bl < BT; ++bl)
#pragma unroll
            for (int j = 0; j < WPT; j += 2)
              if ((unsigned)(word[bl][j] >> 32) != tag || (unsigned)(word[bl][j + 1] >> 32) != tag)
                load_pair(bl, j);
          watchdog(round, &since);
        }
#pragma unroll
        for (int bl = 0; bl < BT; ++bl)
#pragma unroll
          for (int j = 0; j < WPT; ++j) {
            const uint32_t v = (uint32_t)word[bl][j];
            if constexpr (PACK == 1) {
              h[bl][j] = __uint_as_float(v);
            } else {
              const float2 f = unpack2<E>(v);
              h[bl][j * PACK] = f.x;
              h[bl][j * PACK + 1] = f.y;
            }
          }
      }

      /* Partial dot products of the owned rows with the slice. */
      float acc[N];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        uint32_t a[WPT];
#pragma unroll
        for (int j = 0; j < WPT; ++j)
          a[j] = r < RREG ? a_reg[r < RREG ? r : 0][j]
                          : a_smem[((r - RREG) * nthreads + tid) * WPT + j];
#pragma unroll
        for (int bl = 0; bl < BT; ++bl) {
          float sum = 0.f;
#pragma unroll
          for (int j = 0; j < WPT; ++j) sum = dot_word<E>(a[j], &h[bl][j * PACK], sum);
          acc[bl * R + r] = sum;
        }
      }

      ReduceScatter<N, N, 16>::run(acc, lane);
      float *part = partial + (size_t)buf * nwarps * N;
#pragma unroll
      for (int m = 0; m < M; ++m) part[warp * N + lane * M + m] = acc[m];
      __syncthreads();

      if (tid < N) {
        float mat = 0.f;
        for (int w = 0; w < nwarps; ++w) mat += part[w * N + tid];
        float frozen = 0.f;
        const bool active = o_valid && t < o_len;
        if (o_valid && !active && !p.backward) {
          if (s == 0) {
            frozen = to_accum(h0[o_b * p.h0_stride_b + o_row]);
          } else {
            const uint32_t v = (uint32_t)load_word(prev_state + (size_t)o_b * words_per_seq + o_row / PACK);
            if constexpr (PACK == 1) frozen = __uint_as_float(v);
            else frozen = (o_row & 1) ? unpack2<E>(v).y : unpack2<E>(v).x;
          }
        }
        float state;
        const float value = Cell::step(p.backward, p.activation, active, mat, o_in, o_y, frozen, &state);
        if (!o_valid) state = 0.f; /* padding rows publish zeros */
        const E state_e = Round<E>::to(state);
        if (o_valid) out[((size_t)t * B + o_b) * H + o_row] = Round<E>::to(value);

        unsigned long long *dst = next_state + (size_t)o_b * words_per_seq;
        const unsigned long long tagged = (unsigned long long)(tag + 1) << 32;
        if constexpr (PACK == 1) {
          if (o_valid) store_word(dst + o_row, tagged | __float_as_uint((float)state_e));
        } else {
          /* rows 2i and 2i+1 of one sequence sit in lanes 2i, 2i+1 (R is even) */
          const uint32_t mine = bits16(state_e);
          const uint32_t other = __shfl_xor_sync(0xffffffffu, mine, 1);
          if ((tid & 1) == 0 && o_row < H && o_b < B) store_word(dst + o_row / 2, tagged | mine | (other << 16));
        }
      }
      buf ^= 1;
    }
  }
}

/* A table entry for one compiled tile shape. */
#define PRNN_PERSISTENT_CONFIG(E, R, KL, RREG, MAXT) \
  { R, KL, RREG, MAXT, Pack<E>::value, persistent_rnn_kernel<ElmanCell, E, R, KL, RREG, MAXT> }

/* The compiled shapes of each dtype, smallest R first (persistent_<dtype>.cu). */
extern const PersistentConfig persistent_configs_f32[];
extern const int persistent_config_count_f32;
extern const PersistentConfig persistent_configs_bf16[];
extern const int persistent_config_count_bf16;
extern const PersistentConfig persistent_configs_f16[];
extern const int persistent_config_count_f16;

}  // namespace prnn

#endif /* PRNN_PERSISTENT_CUH */
