/* activate.c: taking the listening socket systemd passed (sd_listen_fds). */
#include "activate.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static int parse_int(const char *s, long *out) {
  char *end;
  errno = 0;
  long v = s ? strtol(s, &end, 10) : 0;
  if (!s || !*s || errno || *end || v < 0) return -1;
  *out = v;
  return 0;
}

static int sockopt(int fd, int opt) {
  int v = -1;
  socklen_t len = sizeof v;
  return getsockopt(fd, SOL_SOCKET, opt, &v, &len) == 0 ? v : -1;
}

int activate_listen_fd(char *err, size_t errlen) {
  long pid, nfds;
  int got_pid = parse_int(getenv("LISTEN_PID"), &pid);
  int got_fds = parse_int(getenv("LISTEN_FDS"), &nfds);
  unsetenv("LISTEN_PID");
  unsetenv("LISTEN_FDS");
  unsetenv("LISTEN_FDNAMES");
  if (got_pid != 0 || got_fds != 0 || pid != (long)getpid() || nfds == 0) return -1;
  if (nfds != 1) {
    snprintf(err, errlen, "systemd passed %ld sockets (LISTEN_FDS); kvcached takes one", nfds);
    return -2;
  }
  int fd = ACTIVATE_FIRST_FD;
  int domain = sockopt(fd, SO_DOMAIN), type = sockopt(fd, SO_TYPE);
  int listening = sockopt(fd, SO_ACCEPTCONN);
  if (domain != AF_UNIX || type != SOCK_STREAM || listening != 1) {
    snprintf(err, errlen,
             "the socket systemd passed (fd %d) is not a listening Unix stream socket "
             "(domain %d, type %d, listening %d): use ListenStream=/path",
             fd, domain, type, listening);
    return -2;
  }
  if (fcntl(fd, F_SETFD, FD_CLOEXEC) != 0) {
    snprintf(err, errlen, "fd %d: %s", fd, strerror(errno));
    return -2;
  }
  return fd;
}
