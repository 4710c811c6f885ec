/*
 * exchange.cuh - grid-wide exchange through L2 without a barrier: 8-byte
 * words {tag: high 32 bits, payload: low 32 bits} stored and polled at GPU
 * scope, and the watchdog that turns a poll that can never end into a trap.
 * An aligned 8-byte access is single-copy atomic, so a word whose tag
 * matches carries that step's payload; no fence or separate flag is needed.
 */
#ifndef PRNN_EXCHANGE_CUH
#define PRNN_EXCHANGE_CUH

#include <stdint.h>

namespace prnn {

/* Exchange-word accesses at GPU scope (L2; never a stale L1 line). */
__device__ __forceinline__ unsigned long long load_word(const unsigned long long *p) {
  unsigned long long v;
  asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void load_word_pair(const unsigned long long *p,
                                               unsigned long long &a, unsigned long long &b) {
  asm volatile("ld.relaxed.gpu.global.v2.u64 {%0, %1}, [%2];"
               : "=l"(a), "=l"(b) : "l"(p) : "memory");
}
__device__ __forceinline__ void store_word(unsigned long long *p, unsigned long long v) {
  asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" : : "l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ unsigned long long global_timer_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

/* Trap (a loud launch failure) if a poll has waited this long: with every CTA
 * co-resident it cannot happen; it turns a bug into an error, not a hang. */
#define PRNN_POLL_TIMEOUT_NS 20000000000ull

/* Called once per polling round: traps once rounds have gone on for the timeout. */
__device__ __forceinline__ void watchdog(unsigned round, unsigned long long *since) {
  if ((round & 1023) == 0) {
    const unsigned long long now = global_timer_ns();
    if (*since == 0) *since = now;
    else if (now - *since > PRNN_POLL_TIMEOUT_NS) __trap();
  }
}

/* The word of payload bits v under tag. */
__device__ __forceinline__ unsigned long long tagged_word(unsigned tag, uint32_t v) {
  return ((unsigned long long)tag << 32) | v;
}
__device__ __forceinline__ unsigned tag_of(unsigned long long w) { return (unsigned)(w >> 32); }
__device__ __forceinline__ float payload_float(unsigned long long w) { return __uint_as_float((uint32_t)w); }

/* Polls the 16-byte pairs w[j] of the slots j where live(j) until both
 * words of each carry `tag`: the warp together, re-loading only the stale
 * ones from word(j), so that each round is one wave of loads a warp. */
template <int SLOTS, class Live, class Word>
__device__ __forceinline__ void poll_batch(unsigned tag, Live live, Word word, unsigned long long (&w)[SLOTS][2]) {
  unsigned long long since = 0; /* for the watchdog */
  unsigned round = 0;
  for (;;) {
    bool in = true;
#pragma unroll
    for (int j = 0; j < SLOTS; ++j) in &= !live(j) || (tag_of(w[j][0]) == tag && tag_of(w[j][1]) == tag);
    if (__all_sync(0xffffffffu, in)) return;
#pragma unroll
    for (int j = 0; j < SLOTS; ++j)
      if (live(j) && (tag_of(w[j][0]) != tag || tag_of(w[j][1]) != tag)) load_word_pair(word(j), w[j][0], w[j][1]);
    watchdog(++round, &since);
  }
}

/* Polls 16-byte pairs of words until both words of each carry `tag`, with
 * SLOTS loads in flight a lane: a cursor c < end names a pair, word(c) its
 * first word; start[j] is slot j's first cursor (a caller whose cursors are
 * the same every step may set them once, so that a step's first loads go
 * out at once); store(c, w0, w1) takes a pair that is in, and the slot moves
 * to next(c). The warp polls a batch (each lane's SLOTS current pairs) until
 * every lane's is in (poll_batch), then takes the batch and loads the next.
 * Returns when every lane's cursors are past end; the whole warp calls it.
 * The grid families' exchange (gated_grid.cu, gated_ffma.cu): each warp
 * polls the words its products need. */
template <int SLOTS, class Next, class Word, class Store>
__device__ __forceinline__ void poll_word_pairs(unsigned tag, int end, const int (&start)[SLOTS], Next next, Word word,
                                                Store store) {
  int at[SLOTS];
#pragma unroll
  for (int j = 0; j < SLOTS; ++j) at[j] = start[j];
  unsigned long long w[SLOTS][2];
#pragma unroll
  for (int j = 0; j < SLOTS; ++j)
    if (at[j] < end) load_word_pair(word(at[j]), w[j][0], w[j][1]);
  for (;;) {
    poll_batch<SLOTS>(tag, [&](int j) { return at[j] < end; }, [&](int j) { return word(at[j]); }, w);
    bool more = false;
#pragma unroll
    for (int j = 0; j < SLOTS; ++j) {
      if (at[j] >= end) continue;
      store(at[j], w[j][0], w[j][1]);
      at[j] = next(at[j]);
      if (at[j] < end) {
        load_word_pair(word(at[j]), w[j][0], w[j][1]);
        more = true;
      }
    }
    if (!__any_sync(0xffffffffu, more)) break;
  }
}

/* The same for a lane whose pairs fit its slots: slot j holds one pair,
 * word(j), where live(j); all loaded at once, polled as one batch and
 * stored (store(j, w0, w1)). With j known at compile time a caller's
 * addresses can be one base and constant offsets. */
template <int SLOTS, class Live, class Word, class Store>
__device__ __forceinline__ void poll_word_pairs_once(unsigned tag, Live live, Word word, Store store) {
  unsigned long long w[SLOTS][2];
#pragma unroll
  for (int j = 0; j < SLOTS; ++j)
    if (live(j)) load_word_pair(word(j), w[j][0], w[j][1]);
  poll_batch<SLOTS>(tag, live, word, w);
#pragma unroll
  for (int j = 0; j < SLOTS; ++j)
    if (live(j)) store(j, w[j][0], w[j][1]);
}

/* A warp's slice of P pairs a sequence where a lane's pairs fit its slots,
 * without cursors: lane l polls pairs l + 32 m (m < M) of each live
 * sequence, slot n M + m, so that with n and m known at compile time a
 * slot's addresses are the lane's plus constant offsets. The slots come for
 * SEQS of 1, 2, 4 or 8 sequences up to SEQS_MAX, the fewest that hold the
 * live ones. The grid families' polls where the slice is small enough
 * (gated_grid.cu, gated_ffma.cu). */
template <int M, int SEQS_MAX>
struct LanePairs {
  static_assert(SEQS_MAX * M <= 32, "a bit a slot");
  int held; /* M = 1: how many sequences the lane polls (0: none); else bit j: slot j holds a pair */
  __device__ __forceinline__ LanePairs(int pairs, int live, int lane) {
    held = M == 1 && lane < pairs ? live : 0;
#pragma unroll
    for (int j = 0; M > 1 && j < SEQS_MAX * M; ++j)
      if (j / M < live && lane + 32 * (j % M) < pairs) held |= 1 << j;
  }
  __device__ __forceinline__ bool holds(int j) const { return M == 1 ? j < held : (held >> j & 1) != 0; }
  template <int SEQS, class Word, class Store>
  __device__ __forceinline__ void poll(unsigned tag, Word word, Store store) const {
    poll_word_pairs_once<SEQS * M>(
        tag, [&](int j) { return holds(j); }, [&](int j) { return word(j / M, j % M); },
        [&](int j, unsigned long long w0, unsigned long long w1) { store(j / M, j % M, w0, w1); });
  }
  /* Pair m of sequence n at word(n, m), polled until its words carry `tag`,
   * to store(n, m, w0, w1), for the `live` sequences (as constructed); the
   * whole warp calls it, and ends it with __syncwarp unless no lane holds a
   * pair. */
  template <class Word, class Store>
  __device__ __forceinline__ void load(unsigned tag, int live, Word word, Store store) const {
    if (__all_sync(0xffffffffu, held == 0)) return; /* columns past the exchanged values: zero since the start */
    if (SEQS_MAX == 1 || live <= 1) poll<1>(tag, word, store);
    else if constexpr (SEQS_MAX > 1) {
      if (SEQS_MAX == 2 || live <= 2) poll<2>(tag, word, store);
      else if constexpr (SEQS_MAX > 2) {
        if (SEQS_MAX == 4 || live <= 4) poll<4>(tag, word, store);
        else if constexpr (SEQS_MAX > 4) poll<8>(tag, word, store);
      }
    }
    __syncwarp(); /* the warp's stores seen by its next reads */
  }
};

}  // namespace prnn

#endif /* PRNN_EXCHANGE_CUH */
