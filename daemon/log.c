/* log.c: formats one event line (time, level, event, the caller's pairs),
 * and the budget that keeps peer-triggered lines from flooding. */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int log_level = LOG_LEVEL_INFO;

static const char *const level_names[] = {"error", "warn", "info", "debug"};

const char *log_level_name(int level) {
  if (level < LOG_LEVEL_ERROR || level > LOG_LEVEL_DEBUG) return "unknown";
  return level_names[level];
}

int log_level_parse(const char *s) {
  for (int i = LOG_LEVEL_ERROR; i <= LOG_LEVEL_DEBUG; i++)
    if (strcmp(s, level_names[i]) == 0) return i;
  return -1;
}

void log_emit(int level, const char *event, const char *fmt, ...) {
  char line[1024];
  struct timespec ts;
  struct tm tm;
  clock_gettime(CLOCK_REALTIME, &ts);
  gmtime_r(&ts.tv_sec, &tm);
  int n = snprintf(line, sizeof line,
                   "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ level=%s event=%s ",
                   tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
                   tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000,
                   log_level_name(level), event);
  if (n < 0) return;
  size_t used = (size_t)n < sizeof line ? (size_t)n : sizeof line - 1;
  va_list ap, again;
  va_start(ap, fmt);
  va_copy(again, ap);
  int m = vsnprintf(line + used, sizeof line - used, fmt, ap);
  va_end(ap);
  char *out = line;
  if (m > 0 && (size_t)m + 1 >= sizeof line - used) {
    /* A line longer than the buffer (the config line names every option):
     * made whole on the heap, never cut. */
    char *big = malloc(used + (size_t)m + 2);
    if (big) {
      memcpy(big, line, used);
      vsnprintf(big + used, (size_t)m + 1, fmt, again);
      out = big;
      used += (size_t)m;
    } else { /* out of memory: cut, and said so */
      static const char cut[] = " truncated=yes";
      used = sizeof line - sizeof cut - 1;
      memcpy(line + used, cut, sizeof cut - 1);
      used += sizeof cut - 1;
    }
  } else if (m > 0) {
    used += (size_t)m;
  }
  va_end(again);
  /* One write per line keeps lines whole when stderr is shared. */
  out[used] = '\n';
  fwrite(out, 1, used + 1, stderr);
  if (out != line) free(out);
}

bool log_limit_allow(log_limit_t *l, uint64_t now_ms, uint64_t *suppressed) {
  if (now_ms - l->window_start_ms >= LOG_LIMIT_WINDOW_MS || now_ms < l->window_start_ms) {
    l->window_start_ms = now_ms;
    l->lines = 0;
  }
  if (l->lines >= LOG_LIMIT_BURST) {
    l->suppressed++;
    return false;
  }
  l->lines++;
  *suppressed = l->suppressed;
  l->suppressed = 0;
  return true;
}
