/* sockpath.c: the default socket of kvcached and of its clients, one rule
 * for both (sockpath.h). */
#include "sockpath.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvcache/kvcache.h" /* KVC_SOCKET_ENV */

static const char system_path[] = "/run/kvcached/kvcached.sock";

static const char *env(const char *name) {
  const char *v = getenv(name);
  return v && *v ? v : NULL;
}

static int put(char *out, size_t len, const char *fmt, const char *arg) {
  int n = snprintf(out, len, fmt, arg);
  return n < 0 || (size_t)n >= len ? -1 : 0;
}

/* A user's own default: under $XDG_RUNTIME_DIR, or (xdg false, or unset)
 * the /tmp directory of the uid. */
static int user_path(char *out, size_t len, bool xdg) {
  const char *dir = xdg ? env("XDG_RUNTIME_DIR") : NULL;
  if (dir) return put(out, len, "%s/kvcached.sock", dir);
  char uid[16];
  snprintf(uid, sizeof uid, "%u", (unsigned)geteuid());
  return put(out, len, "/tmp/kvcached-%s/kvcached.sock", uid);
}

int sockpath_daemon(char *out, size_t len) {
  const char *v = env(KVC_SOCKET_ENV), *rt = env("RUNTIME_DIRECTORY");
  if (v) return put(out, len, "%s", v);
  /* systemd's RuntimeDirectory= (several directories: a list, not ours) */
  if (rt && !strchr(rt, ':')) return put(out, len, "%s/kvcached.sock", rt);
  if (geteuid() == 0) return put(out, len, "%s", system_path);
  return user_path(out, len, true);
}

int sockpath_client(char paths[][SOCKPATH_MAX], int max) {
  const char *v = env(KVC_SOCKET_ENV);
  int n = 0;
  if (max < 3) return -1;
  if (v) return put(paths[n], SOCKPATH_MAX, "%s", v) ? -1 : 1;
  if (geteuid() == 0) return put(paths[n], SOCKPATH_MAX, "%s", system_path) ? -1 : 1;
  if (user_path(paths[n++], SOCKPATH_MAX, true)) return -1;
  if (env("XDG_RUNTIME_DIR") && user_path(paths[n++], SOCKPATH_MAX, false)) return -1;
  return put(paths[n++], SOCKPATH_MAX, "%s", system_path) ? -1 : n;
}
