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

/* Polls 16-byte pairs of words until both words of each carry `tag`, with
 * SLOTS loads in flight: a cursor c < end names a pair, word(c) its first
 * word; init(at) sets each slot's first cursor; once a slot's pair is in,
 * store(c, w0, w1) takes it and the slot moves to next(c). Returns when every
 * slot's cursor is past end. The grid families' exchange (gated_grid.cu,
 * gated_ffma.cu): each warp polls the words its products need. */
template <int SLOTS, class Init, class Next, class Word, class Store>
__device__ __forceinline__ void poll_word_pairs(unsigned tag, int end, Init init, Next next, Word word, Store store) {
  int at[SLOTS];
  init(at);
  unsigned long long w[SLOTS][2];
#pragma unroll
  for (int j = 0; j < SLOTS; ++j)
    if (at[j] < end) load_word_pair(word(at[j]), w[j][0], w[j][1]);
  unsigned long long since = 0; /* for the watchdog */
  for (unsigned round = 1;; ++round) {
    bool busy = false;
#pragma unroll
    for (int j = 0; j < SLOTS; ++j) {
      if (at[j] >= end) continue;
      busy = true;
      if (tag_of(w[j][0]) == tag && tag_of(w[j][1]) == tag) {
        store(at[j], w[j][0], w[j][1]);
        at[j] = next(at[j]);
        if (at[j] >= end) continue;
      }
      load_word_pair(word(at[j]), w[j][0], w[j][1]);
    }
    if (!busy) break;
    watchdog(round, &since);
  }
}

}  // namespace prnn

#endif /* PRNN_EXCHANGE_CUH */
