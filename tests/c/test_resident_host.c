/*
 * test_resident_host.c - checks the host half of the resident mode's mailbox
 * protocol (prnn.h): the mailbox layout the kernel relies on, sequence
 * numbers (including their wrap), answers, and that a wait without an answer
 * returns at its timeout instead of hanging. The kernel's side is played by
 * this test writing the answer words itself.
 *
 * Standalone C99 (no torch, no CUDA): built and run by `make ctest`.
 */
#if !defined(_POSIX_C_SOURCE) || _POSIX_C_SOURCE < 199309L
#undef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 199309L
#endif

#include <stddef.h>
#include <stdio.h>
#include <time.h>

#include "prnn.h"

static int failures = 0;

#define CHECK(cond)                                                  \
  do {                                                               \
    if (!(cond)) {                                                   \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                    \
    }                                                                \
  } while (0)

static double seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The kernel's side: answer command `seq`. */
static void answer(prnn_resident_mailbox_t *m, uint32_t seq) { __atomic_store_n(&m->response, seq, __ATOMIC_RELEASE); }

static void layout_group(void) {
  /* Host-written and kernel-written words on separate 128-byte lines. */
  CHECK(offsetof(prnn_resident_mailbox_t, request) == 0);
  CHECK(offsetof(prnn_resident_mailbox_t, command) == 4);
  CHECK(offsetof(prnn_resident_mailbox_t, response) == 128);
  CHECK(offsetof(prnn_resident_mailbox_t, ready) == 132);
  CHECK(sizeof(prnn_resident_mailbox_t) == 256);
  CHECK(PRNN_RESIDENT_MAILBOX_ALIGNMENT == 128);
  printf("layout: done\n");
}

static void protocol_group(void) {
  static prnn_resident_mailbox_t m;
  prnn_resident_mailbox_init(&m);
  CHECK(m.request == 0 && m.response == 0 && m.ready == 0 && m.posted == 0);
  CHECK(!prnn_resident_is_ready(&m));
  __atomic_store_n(&m.ready, 1u, __ATOMIC_RELEASE);
  CHECK(prnn_resident_is_ready(&m));

  const uint32_t first = prnn_resident_post(&m, PRNN_RESIDENT_STEP);
  CHECK(first == 1 && m.request == 1 && m.command == PRNN_RESIDENT_STEP);
  CHECK(!prnn_resident_wait(&m, first, 0)); /* no answer yet */
  answer(&m, first);
  CHECK(prnn_resident_wait(&m, first, 0));
  CHECK(prnn_resident_wait(&m, first, 1000000000)); /* answered: returns at once */

  const uint32_t second = prnn_resident_post(&m, PRNN_RESIDENT_GET_STATE);
  CHECK(second == 2 && m.command == PRNN_RESIDENT_GET_STATE);
  CHECK(!prnn_resident_wait(&m, second, 0)); /* the answer to the first is not the second's */
  answer(&m, second);
  CHECK(prnn_resident_wait(&m, second, 0));

  /* Sequence numbers wrap; only equality counts. */
  m.posted = 0xffffffffu;
  const uint32_t wrapped = prnn_resident_post(&m, PRNN_RESIDENT_RESET);
  CHECK(wrapped == 0 && m.request == 0);
  CHECK(!prnn_resident_wait(&m, wrapped, 0));
  answer(&m, wrapped);
  CHECK(prnn_resident_wait(&m, wrapped, 0));
  CHECK(prnn_resident_post(&m, PRNN_RESIDENT_STOP) == 1);
  printf("protocol: done\n");
}

static void timeout_group(void) {
  static prnn_resident_mailbox_t m;
  prnn_resident_mailbox_init(&m);
  const uint32_t seq = prnn_resident_post(&m, PRNN_RESIDENT_STEP);
  const double start = seconds();
  CHECK(!prnn_resident_wait(&m, seq, 20000000)); /* 20 ms, never answered */
  const double waited = seconds() - start;
  CHECK(waited >= 0.020 && waited < 2.0);
  CHECK(!prnn_resident_wait(&m, seq, -5)); /* a negative timeout looks once */
  printf("timeout: waited %.1f ms for 20 ms\n", 1e3 * waited);
}

int main(void) {
  layout_group();
  protocol_group();
  timeout_group();
  printf("%s\n", failures ? "test_resident_host: FAILED" : "test_resident_host: all passed");
  return failures ? 1 : 0;
}
