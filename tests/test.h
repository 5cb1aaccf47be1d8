/* test.h: the tiny test harness every test binary uses.
 *
 * TEST(name) { ... } registers a test. test_main.c runs each one in its own
 * child process with a timeout (libuv's runner does the same), so a crash or
 * a hang fails that test alone. Assertions print the expression and both
 * values, then abort the child. A test that cannot run here (a missing tool,
 * not root) calls TEST_SKIP("why"): it is counted as skipped, never passed.
 *
 *   build/tests/unit_engine              run every test of the file
 *   build/tests/unit_engine put_append   run one
 */
#ifndef KVC_TEST_H
#define KVC_TEST_H

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void (*test_fn)(void);
void test_register(const char *name, test_fn fn, unsigned timeout_s);
/* Long-run mode (make check): KVC_LONG=1 in the environment. */
int test_long(void);
/* Ends the running test as skipped, with a reason ("SKIP name (reason)"). */
void test_skip(const char *reason) __attribute__((noreturn));
#define TEST_SKIP(reason) test_skip(reason)

#define TEST_TIMEOUT(name, secs)                                               \
  static void test_##name(void);                                               \
  __attribute__((constructor)) static void register_##name(void) {            \
    test_register(#name, test_##name, secs);                                   \
  }                                                                            \
  static void test_##name(void)
#define TEST(name) TEST_TIMEOUT(name, 60)

#define TEST_FAIL_(...)                                                        \
  do {                                                                         \
    fprintf(stderr, "%s:%d: ", __FILE__, __LINE__);                            \
    fprintf(stderr, __VA_ARGS__);                                              \
    fputc('\n', stderr);                                                       \
    fflush(stderr);                                                            \
    abort();                                                                   \
  } while (0)

#define ASSERT(cond)                                                           \
  do {                                                                         \
    if (!(cond)) TEST_FAIL_("assertion failed: %s", #cond);                    \
  } while (0)

#define ASSERT_EQ(a, b)                                                        \
  do {                                                                         \
    long long a_ = (long long)(a), b_ = (long long)(b);                        \
    if (a_ != b_)                                                              \
      TEST_FAIL_("%s == %s: expected %lld, got %lld", #a, #b, b_, a_);         \
  } while (0)

#define ASSERT_U64_EQ(a, b)                                                    \
  do {                                                                         \
    uint64_t a_ = (uint64_t)(a), b_ = (uint64_t)(b);                           \
    if (a_ != b_)                                                              \
      TEST_FAIL_("%s == %s: expected %" PRIu64 ", got %" PRIu64, #a, #b, b_, a_); \
  } while (0)

#define ASSERT_STR_EQ(a, b)                                                    \
  do {                                                                         \
    const char *a_ = (a), *b_ = (b);                                           \
    if (strcmp(a_, b_) != 0)                                                   \
      TEST_FAIL_("%s == %s: expected \"%s\", got \"%s\"", #a, #b, b_, a_);     \
  } while (0)

#define ASSERT_MEM_EQ(a, b, n)                                                 \
  do {                                                                         \
    const unsigned char *a_ = (const void *)(a), *b_ = (const void *)(b);      \
    size_t n_ = (n);                                                           \
    for (size_t i_ = 0; i_ < n_; i_++)                                         \
      if (a_[i_] != b_[i_])                                                    \
        TEST_FAIL_("%s vs %s differ at byte %zu of %zu: %02x != %02x", #a, #b,  \
                   i_, n_, a_[i_], b_[i_]);                                    \
  } while (0)

/* expr must return 0; prints the code's name otherwise. */
#define ASSERT_OK(expr)                                                        \
  do {                                                                         \
    long long r_ = (long long)(expr);                                          \
    if (r_ != 0)                                                               \
      TEST_FAIL_("%s: expected 0, got %lld (%s)", #expr, r_,                   \
                 kvc_err_name((int)r_));                                       \
  } while (0)

/* expr must fail with KVC_E_<code>. */
#define ASSERT_ERR(expr, code)                                                 \
  do {                                                                         \
    long long r_ = (long long)(expr);                                          \
    if (r_ != (code))                                                          \
      TEST_FAIL_("%s: expected %s, got %lld (%s)", #expr, kvc_err_name(code),  \
                 r_, kvc_err_name((int)r_));                                   \
  } while (0)

#endif
