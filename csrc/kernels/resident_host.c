/*
 * resident_host.c - the host half of the resident mode's mailbox protocol
 * (prnn.h): posting a command and waiting for its answer. Plain loads and
 * stores with release / acquire ordering on host-mapped memory that the
 * kernel reads and writes over the bus; no CUDA call, so every build has it.
 * Also the count of SMs that resident kernels hold, which the planners read.
 *
 * C99 with the GCC/Clang __atomic builtins, and also valid C++17 (torch's
 * extension build compiles .c files with g++).
 */
#if !defined(_POSIX_C_SOURCE) || _POSIX_C_SOURCE < 199309L
#undef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 199309L /* clock_gettime */
#endif

#include <string.h>
#include <time.h>

#include "prnn_internal.h"

static int64_t monotonic_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void prnn_resident_mailbox_init(prnn_resident_mailbox_t *mailbox) {
  memset(mailbox, 0, sizeof *mailbox);
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
}

size_t prnn_resident_x_words(size_t x_bytes) {
  const size_t words = x_bytes / 4 + (x_bytes % 4 != 0); /* no x_bytes + 3: it would wrap */
  return words + (words & 1);
}

static void post_request(prnn_resident_mailbox_t *mailbox, uint32_t seq, prnn_resident_command_t command) {
  mailbox->posted = seq;
  /* Release: what the command reads (the state, the reset mask), written
   * before, is visible to whoever sees this request. One 8-byte store: the
   * kernel reads number and kind together. */
  __atomic_store_n(&mailbox->request, (uint64_t)command << 32 | seq, __ATOMIC_RELEASE);
}

uint32_t prnn_resident_post_step(prnn_resident_mailbox_t *mailbox, uint64_t *x_words, const void *x,
                                 size_t x_bytes) {
  uint32_t seq = mailbox->posted + 1;
  /* The words carry x_tag until now: a STEP numbered x_tag (the numbers
   * wrapped) would take them for current. */
  if (seq == mailbox->x_tag) ++seq;
  const unsigned char *bytes = (const unsigned char *)x;
  const size_t words = prnn_resident_x_words(x_bytes), whole = x_bytes / 4;
  const uint64_t tag = (uint64_t)seq << 32;
  size_t w;
  /* The kernel trusts a word whose tag is current, so no word may be seen
   * half written: each is an aligned 8-byte store, or an aligned 8-byte part
   * of a vector store that the compiler makes of several (x86-64 and
   * AArch64 perform those at least 8 bytes at a time). Plain stores, not
   * atomic ones: those would not vectorise (1 word a cycle, +0.3 us a step
   * at 4 KiB of x_t). */
  for (w = 0; w < whole; ++w) {
    uint32_t payload;
    memcpy(&payload, bytes + 4 * w, 4);
    x_words[w] = tag | payload;
  }
  for (; w < words; ++w) { /* the last bytes of x_t, zero-padded, and the pad word */
    uint32_t payload = 0;
    if (4 * w < x_bytes) memcpy(&payload, bytes + 4 * w, x_bytes - 4 * w);
    x_words[w] = tag | payload;
  }
  mailbox->x_tag = seq;
  post_request(mailbox, seq, PRNN_RESIDENT_STEP);
  return seq;
}

uint32_t prnn_resident_post(prnn_resident_mailbox_t *mailbox, prnn_resident_command_t command) {
  const uint32_t seq = mailbox->posted + 1;
  post_request(mailbox, seq, command);
  return seq;
}

/* The first of the answer words [from, ctas) that does not hold seq yet, or ctas. */
static int first_unanswered(const prnn_resident_mailbox_t *mailbox, uint32_t seq, int from, int ctas) {
  /* Acquire: what CTA c wrote before its answer (its part of y, of the
   * state) is visible to the reads that follow. */
  while (from < ctas && __atomic_load_n(&mailbox->answer[from], __ATOMIC_ACQUIRE) == seq) ++from;
  return from;
}

int prnn_resident_wait(const prnn_resident_mailbox_t *mailbox, uint32_t seq, int ctas, int64_t timeout_ns) {
  if (ctas > PRNN_RESIDENT_MAX_CTAS) ctas = PRNN_RESIDENT_MAX_CTAS;
  /* Words only move on to seq while it is awaited: a word seen answered
   * stays answered, so each poll starts at the first one not seen yet. */
  int from = first_unanswered(mailbox, seq, 0, ctas);
  if (from == ctas) return 1;
  const int64_t now = monotonic_ns(), wait = timeout_ns > 0 ? timeout_ns : 0;
  const int64_t deadline = wait > INT64_MAX - now ? INT64_MAX : now + wait; /* no signed overflow */
  /* The clock is read every few dozen polls: an answer is usually a few
   * microseconds away, and a poll costs a few nanoseconds. */
  for (;;) {
    int poll;
    for (poll = 0; poll < 64; ++poll) {
      from = first_unanswered(mailbox, seq, from, ctas);
      if (from == ctas) return 1;
    }
    if (monotonic_ns() >= deadline) return first_unanswered(mailbox, seq, from, ctas) == ctas;
  }
}

int prnn_resident_is_ready(const prnn_resident_mailbox_t *mailbox) {
  return __atomic_load_n(&mailbox->ready, __ATOMIC_ACQUIRE) != 0;
}

/* Per device; the planners read it at every plan, so that a plan never needs
 * SMs a resident kernel holds. */
static int64_t g_held_sms[PRNN_MAX_DEVICES];

prnn_status_t prnn_resident_hold_sms(int device, int64_t delta) {
  prnn_clear_error();
  if (device < 0 || device >= PRNN_MAX_DEVICES)
    return prnn_fail(PRNN_STATUS_BAD_PARAM, "device %d out of range [0, %d)", device, PRNN_MAX_DEVICES);
  int64_t held = __atomic_load_n(&g_held_sms[device], __ATOMIC_RELAXED);
  do {
    if (held + delta < 0)
      return prnn_fail(PRNN_STATUS_BAD_PARAM, "releasing %lld SMs of device %d, which holds %lld",
                       (long long)-delta, device, (long long)held);
  } while (!__atomic_compare_exchange_n(&g_held_sms[device], &held, held + delta, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_RELAXED));
  return PRNN_STATUS_SUCCESS;
}

int64_t prnn_resident_held_sms(int device) {
  return device < 0 || device >= PRNN_MAX_DEVICES ? 0 : __atomic_load_n(&g_held_sms[device], __ATOMIC_ACQUIRE);
}
