/* notify.c: one datagram per state change to $NOTIFY_SOCKET (sd_notify). */
#include "notify.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

int notify_open(notify_t *n, char *err, size_t errlen) {
  memset(n, 0, sizeof *n);
  n->fd = -1;
  const char *path = getenv("NOTIFY_SOCKET");
  if (!path || !*path) return 0;
  size_t len = strlen(path);
  if ((path[0] != '/' && path[0] != '@') || len >= sizeof n->addr.sun_path) {
    snprintf(err, errlen, "NOTIFY_SOCKET=%s: not an absolute path or @abstract name", path);
    return -1;
  }
  n->addr.sun_family = AF_UNIX;
  memcpy(n->addr.sun_path, path, len);
  if (path[0] == '@') n->addr.sun_path[0] = '\0'; /* abstract: no trailing NUL */
  n->addr_len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len +
                            (path[0] == '@' ? 0 : 1));
  n->fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (n->fd < 0) {
    snprintf(err, errlen, "NOTIFY_SOCKET: socket: %s", strerror(errno));
    return -1;
  }
  /* systemd reads at once; never let a stuck reader stall the loop long. */
  struct timeval tv = {.tv_sec = 1};
  setsockopt(n->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  return 0;
}

bool notify_enabled(const notify_t *n) { return n->fd >= 0; }

int notify_send(notify_t *n, const char *fmt, ...) {
  if (n->fd < 0) return 0;
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  int len = vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (len < 0) return -1;
  if ((size_t)len >= sizeof msg) len = (int)sizeof msg - 1;
  ssize_t sent;
  while ((sent = sendto(n->fd, msg, (size_t)len, MSG_NOSIGNAL, (struct sockaddr *)&n->addr,
                        n->addr_len)) < 0 && errno == EINTR) {
  }
  return sent == len ? 0 : -1;
}

void notify_close(notify_t *n) {
  if (n->fd >= 0) close(n->fd);
  n->fd = -1;
}
