/* log.h: leveled event lines on stderr, one `key=value` record per event.
 *
 *   LOG_INFO("listen", "socket=%s mode=%04o", path, mode);
 *   -> 2024-05-01T12:00:00.123Z level=info event=listen socket=/run/... mode=0660
 *
 * The level is checked before the arguments are evaluated (the calls are
 * macros), so a debug line costs one comparison when debug is off. Values that
 * may hold spaces are quoted by the caller ("msg=\"%s\"").
 *
 * An event a peer can trigger at will (a refused connection, a bad frame)
 * goes through LOG_LIMITED: at most LOG_LIMIT_BURST lines per
 * LOG_LIMIT_WINDOW_MS, the rest counted and reported as suppressed=N on the
 * next line that goes out, so a misbehaving client cannot flood the journal.
 */
#ifndef KVCD_LOG_H
#define KVCD_LOG_H

#include <stdbool.h>
#include <stdint.h>

enum log_level { LOG_LEVEL_ERROR = 0, LOG_LEVEL_WARN, LOG_LEVEL_INFO, LOG_LEVEL_DEBUG };

/* The current threshold; lines above it are skipped. Set by config. */
extern int log_level;

/* Emits one line. Use the macros below instead. */
void log_emit(int level, const char *event, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Parses "error", "warn", "info" or "debug"; -1 for anything else. */
int log_level_parse(const char *s);
/* Name of a level ("info"). */
const char *log_level_name(int level);

#define LOG_AT_(lvl, event, ...)                                               \
  do {                                                                         \
    if ((lvl) <= log_level) log_emit((lvl), (event), __VA_ARGS__);             \
  } while (0)
#define LOG_ERROR(event, ...) LOG_AT_(LOG_LEVEL_ERROR, event, __VA_ARGS__)
#define LOG_WARN(event, ...) LOG_AT_(LOG_LEVEL_WARN, event, __VA_ARGS__)
#define LOG_INFO(event, ...) LOG_AT_(LOG_LEVEL_INFO, event, __VA_ARGS__)
#define LOG_DEBUG(event, ...) LOG_AT_(LOG_LEVEL_DEBUG, event, __VA_ARGS__)

#define LOG_LIMIT_BURST 10u
#define LOG_LIMIT_WINDOW_MS 10000u

typedef struct log_limit {
  uint64_t window_start_ms; /* start of the current window */
  uint32_t lines;           /* lines emitted in this window */
  uint64_t suppressed;      /* lines dropped since the last one emitted */
} log_limit_t;

/* Whether one more line may go out at now_ms. If so, *suppressed gets the
 * number dropped since the previous line (and the count restarts); if not,
 * the line is counted as dropped. */
bool log_limit_allow(log_limit_t *l, uint64_t now_ms, uint64_t *suppressed);

/* LOG_AT_ under a budget; appends suppressed=N. now_ms is only evaluated
 * when the level lets the line through. fmt must be a literal. */
#define LOG_LIMITED(limit, now_ms, lvl, event, fmt, ...)                       \
  do {                                                                         \
    uint64_t sup_;                                                             \
    if ((lvl) <= log_level && log_limit_allow((limit), (now_ms), &sup_))       \
      log_emit((lvl), (event), fmt " suppressed=%llu", __VA_ARGS__,            \
               (unsigned long long)sup_);                                      \
  } while (0)

#endif
