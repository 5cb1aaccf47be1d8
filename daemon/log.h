/* log.h: leveled event lines on stderr, one `key=value` record per event.
 *
 *   LOG_INFO("listen", "socket=%s mode=%04o", path, mode);
 *   -> 2024-05-01T12:00:00.123Z level=info event=listen socket=/run/... mode=0660
 *
 * The level is checked before the arguments are evaluated (the calls are
 * macros), so a debug line costs one comparison when debug is off. Values that
 * may hold spaces are quoted by the caller ("msg=\"%s\"").
 */
#ifndef KVCD_LOG_H
#define KVCD_LOG_H

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

#endif
