/*
 * resident_host.c - the host half of the resident mode's mailbox protocol
 * (prnn.h): posting a command and waiting for its answer. Plain loads and
 * stores with release / acquire ordering on host-mapped memory that the
 * kernel reads and writes over the bus; no CUDA call, so every build has it.
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

#include "prnn.h"

static int64_t monotonic_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void prnn_resident_mailbox_init(prnn_resident_mailbox_t *mailbox) {
  memset(mailbox, 0, sizeof *mailbox);
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
}

uint32_t prnn_resident_post(prnn_resident_mailbox_t *mailbox, prnn_resident_command_t command) {
  const uint32_t seq = mailbox->posted + 1;
  mailbox->posted = seq;
  __atomic_store_n(&mailbox->command, (uint32_t)command, __ATOMIC_RELAXED);
  /* Release: what the command reads (x, the state, the mask), written before,
   * is visible to whoever sees this sequence number. */
  __atomic_store_n(&mailbox->request, seq, __ATOMIC_RELEASE);
  return seq;
}

static int answered(const prnn_resident_mailbox_t *mailbox, uint32_t seq) {
  /* Acquire: what the kernel wrote before answering (y, the state) is
   * visible to the reads that follow. */
  return __atomic_load_n(&mailbox->response, __ATOMIC_ACQUIRE) == seq;
}

int prnn_resident_wait(const prnn_resident_mailbox_t *mailbox, uint32_t seq, int64_t timeout_ns) {
  if (answered(mailbox, seq)) return 1;
  const int64_t deadline = monotonic_ns() + (timeout_ns > 0 ? timeout_ns : 0);
  /* The clock is read every few dozen polls: an answer is usually a few
   * microseconds away, and a poll costs a few nanoseconds. */
  for (;;) {
    int poll;
    for (poll = 0; poll < 64; ++poll)
      if (answered(mailbox, seq)) return 1;
    if (monotonic_ns() >= deadline) return answered(mailbox, seq);
  }
}

int prnn_resident_is_ready(const prnn_resident_mailbox_t *mailbox) {
  return __atomic_load_n(&mailbox->ready, __ATOMIC_ACQUIRE) != 0;
}
