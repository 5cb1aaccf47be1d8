/* log.c (unit): the daemon's log lines: the level is checked before the
 * arguments are evaluated, the line format, and the budget of LOG_LIMITED. */
#include <unistd.h>

#include "test.h"

#include "../../daemon/log.c"

/* Runs with stderr in a temporary file; returns what was written. */
static const char *captured(FILE *f, char *buf, size_t cap) {
  fflush(stderr);
  rewind(f);
  size_t n = fread(buf, 1, cap - 1, f);
  buf[n] = '\0';
  return buf;
}

static FILE *capture(void) {
  FILE *f = tmpfile();
  ASSERT(f != NULL);
  fflush(stderr);
  ASSERT(dup2(fileno(f), 2) == 2);
  return f;
}

TEST(log_level_is_checked_before_the_arguments) {
  static char buf[4096];
  FILE *f = capture();
  int evaluated = 0;
  log_level = LOG_LEVEL_INFO;
  LOG_DEBUG("never", "n=%d", ++evaluated);
  ASSERT_EQ(evaluated, 0);
  LOG_INFO("once", "n=%d", ++evaluated);
  ASSERT_EQ(evaluated, 1);
  log_level = LOG_LEVEL_ERROR;
  LOG_WARN("never", "n=%d", ++evaluated);
  LOG_ERROR("twice", "n=%d msg=\"%s\"", ++evaluated, "a b");
  ASSERT_EQ(evaluated, 2);
  captured(f, buf, sizeof buf);
  ASSERT(strstr(buf, " level=info event=once n=1\n") != NULL);
  ASSERT(strstr(buf, " level=error event=twice n=2 msg=\"a b\"\n") != NULL);
  ASSERT(strstr(buf, "never") == NULL);
  ASSERT(buf[4] == '-' && buf[10] == 'T' && buf[23] == 'Z'); /* 2024-05-01T12:00:00.123Z */
  ASSERT_EQ(log_level_parse("debug"), LOG_LEVEL_DEBUG);
  ASSERT_EQ(log_level_parse("loud"), -1);
  ASSERT_STR_EQ(log_level_name(LOG_LEVEL_WARN), "warn");
}

TEST(log_limited_keeps_a_budget_and_counts_the_rest) {
  static char buf[8192];
  FILE *f = capture();
  log_limit_t lim = {0};
  uint64_t now = 1000000, sup = 99;
  log_level = LOG_LEVEL_INFO;
  for (unsigned i = 0; i < LOG_LIMIT_BURST; i++) {
    ASSERT(log_limit_allow(&lim, now + i, &sup));
    ASSERT_EQ(sup, 0);
  }
  for (unsigned i = 0; i < 25; i++) ASSERT(!log_limit_allow(&lim, now + 100, &sup));
  ASSERT(!log_limit_allow(&lim, now + LOG_LIMIT_WINDOW_MS - 1, &sup));
  /* The next window lets a line through and reports what was dropped. */
  ASSERT(log_limit_allow(&lim, now + LOG_LIMIT_WINDOW_MS, &sup));
  ASSERT_EQ(sup, 26);
  ASSERT(log_limit_allow(&lim, now + LOG_LIMIT_WINDOW_MS + 1, &sup));
  ASSERT_EQ(sup, 0);
  /* Through the macro: 10 lines of 1000 reach the log, then one with the count. */
  log_limit_t l2 = {0};
  for (int i = 0; i < 1000; i++) LOG_LIMITED(&l2, now, LOG_LEVEL_WARN, "refused", "i=%d", i);
  LOG_LIMITED(&l2, now + LOG_LIMIT_WINDOW_MS, LOG_LEVEL_WARN, "refused", "i=%d", 1000);
  captured(f, buf, sizeof buf);
  int lines = 0;
  for (const char *p = buf; (p = strstr(p, "event=refused")); p++) lines++;
  ASSERT_EQ(lines, (int)LOG_LIMIT_BURST + 1);
  ASSERT(strstr(buf, "event=refused i=0 suppressed=0\n") != NULL);
  ASSERT(strstr(buf, "event=refused i=1000 suppressed=990\n") != NULL);
  /* Below the level, nothing is counted or evaluated. */
  log_level = LOG_LEVEL_ERROR;
  int evaluated = 0;
  LOG_LIMITED(&l2, (uint64_t)++evaluated, LOG_LEVEL_WARN, "refused", "i=%d", 0);
  ASSERT_EQ(evaluated, 0);
}
