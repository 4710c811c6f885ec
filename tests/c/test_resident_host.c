/*
 * test_resident_host.c - checks the host half of the resident mode's mailbox
 * protocol (prnn.h): the mailbox layout the kernel relies on, sequence
 * numbers (including their wrap), x_t's tagged words, answers from several
 * CTAs in any order, and that a wait without an answer returns at its timeout
 * instead of hanging. The kernel's side is played by this test writing the
 * answer words itself. Also the count of SMs resident kernels hold, which
 * the planners read.
 *
 * Standalone C99 (no torch, no CUDA): built and run by `make ctest`.
 */
#if !defined(_POSIX_C_SOURCE) || _POSIX_C_SOURCE < 200809L
#undef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS */

#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

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

/* The kernel's side: CTA c answers command `seq`. */
static void answer_as(prnn_resident_mailbox_t *m, int c, uint32_t seq) {
  __atomic_store_n(&m->answer[c], seq, __ATOMIC_RELEASE);
}
static void answer(prnn_resident_mailbox_t *m, uint32_t seq) { answer_as(m, 0, seq); }
static uint32_t request_seq(const prnn_resident_mailbox_t *m) { return (uint32_t)m->request; }
static uint32_t request_command(const prnn_resident_mailbox_t *m) { return (uint32_t)(m->request >> 32); }

static void layout_group(void) {
  /* Host-written and kernel-written words on separate 128-byte lines. */
  CHECK(offsetof(prnn_resident_mailbox_t, request) == 0);
  CHECK(offsetof(prnn_resident_mailbox_t, posted) == 8);
  CHECK(offsetof(prnn_resident_mailbox_t, x_tag) == 12);
  CHECK(offsetof(prnn_resident_mailbox_t, ready) == 128);
  CHECK(offsetof(prnn_resident_mailbox_t, answer) == 256);
  CHECK(sizeof(prnn_resident_mailbox_t) == 256 + 4 * PRNN_RESIDENT_MAX_CTAS);
  CHECK(PRNN_RESIDENT_MAILBOX_ALIGNMENT == 128);
  CHECK(prnn_resident_x_words(0) == 0 && prnn_resident_x_words(1) == 2 && prnn_resident_x_words(4) == 2);
  CHECK(prnn_resident_x_words(8) == 2 && prnn_resident_x_words(9) == 4 && prnn_resident_x_words(4096) == 1024);
  CHECK(prnn_resident_x_words(SIZE_MAX) == SIZE_MAX / 4 + 1); /* no wrap to 0 */
  printf("layout: done\n");
}

static void protocol_group(void) {
  static prnn_resident_mailbox_t m;
  prnn_resident_mailbox_init(&m);
  CHECK(m.request == 0 && m.answer[0] == 0 && m.ready == 0 && m.posted == 0 && m.x_tag == 0);
  CHECK(!prnn_resident_is_ready(&m));
  __atomic_store_n(&m.ready, 1u, __ATOMIC_RELEASE);
  CHECK(prnn_resident_is_ready(&m));

  const uint32_t first = prnn_resident_post(&m, PRNN_RESIDENT_GET_STATE);
  CHECK(first == 1 && request_seq(&m) == 1 && request_command(&m) == PRNN_RESIDENT_GET_STATE);
  CHECK(!prnn_resident_wait(&m, first, 1, 0)); /* no answer yet */
  answer(&m, first);
  CHECK(prnn_resident_wait(&m, first, 1, 0));
  CHECK(prnn_resident_wait(&m, first, 1, 1000000000)); /* answered: returns at once */

  const uint32_t second = prnn_resident_post(&m, PRNN_RESIDENT_RESET);
  CHECK(second == 2 && request_command(&m) == PRNN_RESIDENT_RESET);
  CHECK(!prnn_resident_wait(&m, second, 1, 0)); /* the answer to the first is not the second's */
  answer(&m, second);
  CHECK(prnn_resident_wait(&m, second, 1, 0));

  /* Every CTA answers for itself, in any order: the wait ends with the last. */
  const uint32_t third = prnn_resident_post(&m, PRNN_RESIDENT_SET_STATE);
  const int order[] = {3, 0, 4, 2};
  for (int i = 0; i < 4; ++i) {
    answer_as(&m, order[i], third);
    CHECK(!prnn_resident_wait(&m, third, 5, 0)); /* CTA 1 has not answered */
  }
  answer_as(&m, 1, third - 1); /* a stale answer is no answer */
  CHECK(!prnn_resident_wait(&m, third, 5, 0));
  answer_as(&m, 1, third);
  CHECK(prnn_resident_wait(&m, third, 5, 0));
  CHECK(!prnn_resident_wait(&m, third, 6, 0)); /* CTA 5 never answered this */

  /* Sequence numbers wrap; only equality counts. */
  m.posted = 0xffffffffu;
  const uint32_t wrapped = prnn_resident_post(&m, PRNN_RESIDENT_RESET);
  CHECK(wrapped == 0 && request_seq(&m) == 0);
  CHECK(!prnn_resident_wait(&m, wrapped, 1, 0));
  answer(&m, wrapped);
  CHECK(prnn_resident_wait(&m, wrapped, 1, 0));
  CHECK(prnn_resident_post(&m, PRNN_RESIDENT_STOP) == 1);
  printf("protocol: done\n");
}

/* A STEP's x_t in tagged words: each 4 bytes of it (zero-padded) with the
 * STEP's number in the high half, and never a number the words carry now. */
static void step_group(void) {
  static prnn_resident_mailbox_t m;
  static uint64_t words[8];
  prnn_resident_mailbox_init(&m);
  const unsigned char x[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  const uint32_t seq = prnn_resident_post_step(&m, words, x, sizeof x);
  CHECK(seq == 1 && request_seq(&m) == 1 && request_command(&m) == PRNN_RESIDENT_STEP && m.x_tag == 1);
  CHECK(prnn_resident_x_words(sizeof x) == 4);
  for (int w = 0; w < 4; ++w) {
    uint32_t payload = 0, want = 0;
    memcpy(&payload, &words[w], 4); /* little-endian: the low half */
    if (4 * w < (int)sizeof x) memcpy(&want, x + 4 * w, sizeof x - 4 * w < 4 ? sizeof x - 4 * w : 4);
    CHECK(payload == want);
    CHECK((uint32_t)(words[w] >> 32) == seq);
  }
  CHECK(words[4] == 0); /* nothing past the words */
  answer(&m, seq);
  CHECK(prnn_resident_wait(&m, seq, 1, 0));
  CHECK(prnn_resident_post(&m, PRNN_RESIDENT_GET_STATE) == 2 && m.x_tag == 1);

  /* The numbers wrapped round to the one the words carry: the STEP skips it. */
  m.posted = 0;
  const uint32_t skipped = prnn_resident_post_step(&m, words, x, sizeof x);
  CHECK(skipped == 2 && (uint32_t)(words[0] >> 32) == 2 && request_seq(&m) == 2 && m.x_tag == 2);
  printf("step: done\n");
}

static void timeout_group(void) {
  static prnn_resident_mailbox_t m;
  prnn_resident_mailbox_init(&m);
  const uint32_t seq = prnn_resident_post(&m, PRNN_RESIDENT_GET_STATE);
  answer_as(&m, 0, seq); /* one of two CTAs */
  const double start = seconds();
  CHECK(!prnn_resident_wait(&m, seq, 2, 20000000)); /* 20 ms, never answered by CTA 1 */
  const double waited = seconds() - start;
  CHECK(waited >= 0.020 && waited < 2.0);
  CHECK(!prnn_resident_wait(&m, seq, 2, -5)); /* a negative timeout looks once */
  printf("timeout: waited %.1f ms for 20 ms\n", 1e3 * waited);
}

/* INT64_MAX as a timeout waits (its deadline does not overflow into the
 * past): a child process answers after 20 ms through shared memory. */
static void forever_group(void) {
  prnn_resident_mailbox_t *m = (prnn_resident_mailbox_t *)mmap(
      NULL, sizeof *m, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  CHECK(m != MAP_FAILED);
  if (m == MAP_FAILED) return;
  prnn_resident_mailbox_init(m);
  const uint32_t seq = prnn_resident_post(m, PRNN_RESIDENT_GET_STATE);
  const pid_t child = fork();
  CHECK(child >= 0);
  if (child == 0) {
    const struct timespec pause = {0, 20000000};
    nanosleep(&pause, NULL);
    answer(m, seq);
    _exit(0);
  }
  const double start = seconds();
  CHECK(prnn_resident_wait(m, seq, 1, INT64_MAX));
  const double waited = seconds() - start;
  CHECK(waited >= 0.015);
  int status = 0;
  if (child > 0) waitpid(child, &status, 0);
  munmap(m, sizeof *m);
  printf("forever: answered after %.1f ms\n", 1e3 * waited);
}

/* The held SMs: per device, never negative, a refused change leaves the count. */
static void held_sms_group(void) {
  CHECK(prnn_resident_held_sms(0) == 0 && prnn_resident_held_sms(1) == 0);
  CHECK(prnn_resident_hold_sms(0, 16) == PRNN_STATUS_SUCCESS);
  CHECK(prnn_resident_hold_sms(0, 100) == PRNN_STATUS_SUCCESS);
  CHECK(prnn_resident_held_sms(0) == 116 && prnn_resident_held_sms(1) == 0);
  CHECK(prnn_resident_hold_sms(0, -117) == PRNN_STATUS_BAD_PARAM);
  CHECK(strstr(prnn_last_error(), "releasing 117 SMs of device 0, which holds 116") != NULL);
  CHECK(prnn_resident_held_sms(0) == 116);
  CHECK(prnn_resident_hold_sms(0, -100) == PRNN_STATUS_SUCCESS);
  CHECK(prnn_last_error()[0] == '\0'); /* cleared by the call */
  CHECK(prnn_resident_hold_sms(0, -16) == PRNN_STATUS_SUCCESS && prnn_resident_held_sms(0) == 0);
  CHECK(prnn_resident_hold_sms(PRNN_MAX_DEVICES - 1, 3) == PRNN_STATUS_SUCCESS);
  CHECK(prnn_resident_held_sms(PRNN_MAX_DEVICES - 1) == 3);
  CHECK(prnn_resident_hold_sms(PRNN_MAX_DEVICES - 1, -3) == PRNN_STATUS_SUCCESS);
  CHECK(prnn_resident_hold_sms(-1, 1) == PRNN_STATUS_BAD_PARAM);
  CHECK(prnn_resident_hold_sms(PRNN_MAX_DEVICES, 1) == PRNN_STATUS_BAD_PARAM);
  CHECK(strstr(prnn_last_error(), "out of range") != NULL);
  CHECK(prnn_resident_held_sms(-1) == 0 && prnn_resident_held_sms(PRNN_MAX_DEVICES) == 0);
}

int main(void) {
  held_sms_group();
  layout_group();
  protocol_group();
  step_group();
  timeout_group();
  forever_group();
  printf("%s\n", failures ? "test_resident_host: FAILED" : "test_resident_host: all passed");
  return failures ? 1 : 0;
}
