/* listen.c: the daemon's listening socket: systemd's when socket-activated,
 * else bound here (its directory, stale-file check, mode through the umask at
 * bind); the accept callback, and the pause when out of descriptors. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "activate.h"
#include "conn.h"
#include "log.h"
#include "server.h"

/* mkdir -p of the socket's parent directory. */
static int make_parent(const char *path, char *err, size_t errlen) {
  char dir[sizeof ((config_t *)0)->socket_path];
  snprintf(dir, sizeof dir, "%s", path);
  char *slash = strrchr(dir, '/');
  if (!slash || slash == dir) return 0;
  *slash = '\0';
  for (char *p = dir + 1; *p; p++) {
    if (*p != '/') continue;
    *p = '\0';
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) goto fail;
    *p = '/';
  }
  if (mkdir(dir, 0755) != 0 && errno != EEXIST) goto fail;
  return 0;
fail:
  snprintf(err, errlen, "cannot create directory %s: %s", dir, strerror(errno));
  return -1;
}

/* The socket's directory must be ours (or root's) and writable by nobody
 * else: another user who could write it could put their own socket in our
 * place, or pre-create the directory of the /tmp fallback for us. */
static int check_parent(const char *path, char *err, size_t errlen) {
  char dir[sizeof ((config_t *)0)->socket_path];
  snprintf(dir, sizeof dir, "%s", path);
  char *slash = strrchr(dir, '/');
  if (!slash) snprintf(dir, sizeof dir, ".");
  else if (slash == dir) dir[1] = '\0';
  else *slash = '\0';
  struct stat st;
  if (stat(dir, &st) != 0) {
    snprintf(err, errlen, "socket directory %s: %s", dir, strerror(errno));
    return -1;
  }
  bool owner_ok = st.st_uid == geteuid() || st.st_uid == 0;
  if (!S_ISDIR(st.st_mode) || !owner_ok || (st.st_mode & (S_IWGRP | S_IWOTH))) {
    snprintf(err, errlen, "socket directory %s is %s (owned by uid %u, mode %04o): it must be "
             "owned by this user (uid %u) or root and writable by nobody else; choose another "
             "--socket or fix the directory", dir,
             !S_ISDIR(st.st_mode) ? "not a directory"
             : !owner_ok          ? "another user's"
                                  : "writable by others",
             (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777), (unsigned)geteuid());
    return -1;
  }
  return 0;
}

/* Removes path if it is a socket nobody listens on; fails if someone does. */
static int remove_stale(const char *path, char *err, size_t errlen) {
  struct stat st;
  if (lstat(path, &st) != 0) return errno == ENOENT ? 0 : -1;
  if (!S_ISSOCK(st.st_mode)) {
    snprintf(err, errlen, "%s exists and is not a socket", path);
    return -1;
  }
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    snprintf(err, errlen, "socket: %s", strerror(errno));
    return -1;
  }
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
  int rc = connect(fd, (struct sockaddr *)&sa, sizeof sa);
  int e = errno;
  close(fd);
  if (rc == 0) {
    snprintf(err, errlen, "another kvcached is listening on %s", path);
    return -1;
  }
  if (e != ECONNREFUSED) {
    snprintf(err, errlen, "cannot probe %s: %s", path, strerror(e));
    return -1;
  }
  LOG_INFO("stale_socket", "path=%s action=removed", path);
  if (unlink(path) != 0 && errno != ENOENT) {
    snprintf(err, errlen, "cannot remove stale %s: %s", path, strerror(errno));
    return -1;
  }
  return 0;
}

#define ACCEPT_PAUSE_MS 100u

static void on_connection(uv_stream_t *listener, int status);

static void on_listener_closed(uv_handle_t *h) {
  server_t *srv = h->data;
  srv->listener_closing = false;
}

/* Keeps a second descriptor of the listening socket, so that the handle can
 * be closed and opened again while the socket stays (pause_accepting). */
static void keep_spare(server_t *srv) {
  uv_os_fd_t fd;
  if (uv_fileno((uv_handle_t *)&srv->listener, &fd) == 0)
    srv->listen_spare = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (srv->listen_spare < 0)
    LOG_WARN("listen", "error=\"no spare descriptor of the socket: %s\" "
             "note=\"accepting cannot pause when out of descriptors\"", strerror(errno));
}

static void on_resume(uv_timer_t *t) {
  server_t *srv = t->data;
  if (!srv->accept_paused) return;
  int fd = srv->listener_closing ? -1 : fcntl(srv->listen_spare, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) { /* still out of descriptors */
    uv_timer_start(t, on_resume, ACCEPT_PAUSE_MS, 0);
    return;
  }
  uv_pipe_init(srv->loop, &srv->listener, 0); /* reopens libuv's reserve descriptor */
  srv->listener.data = srv;
  int rc = uv_pipe_open(&srv->listener, fd);
  if (rc != 0) close(fd);
  if (rc == 0) rc = uv_listen((uv_stream_t *)&srv->listener, SOMAXCONN, on_connection);
  if (rc != 0) {
    LOG_LIMITED(&srv->limit_accept, uv_now(srv->loop), LOG_LEVEL_WARN, "accept",
                "error=\"listening again: %s\"", uv_strerror(rc));
    srv->listener_closing = true;
    uv_close((uv_handle_t *)&srv->listener, on_listener_closed);
    uv_timer_start(t, on_resume, ACCEPT_PAUSE_MS, 0);
    return;
  }
  srv->accept_paused = false;
  LOG_INFO("accept_resumed", "socket=%s", srv->listen_path);
}

/* Out of descriptors with libuv's reserve descriptor gone too (its
 * accept-and-close trick needs it): libuv would call accept again at once,
 * forever, since the kernel says EMFILE before it looks at the backlog. So
 * close the handle instead (the socket lives on in listen_spare) and listen
 * again ACCEPT_PAUSE_MS later, as nginx does; clients wait in the backlog. */
static void pause_accepting(server_t *srv) {
  if (srv->accept_paused || srv->listen_spare < 0 || !srv->listening) return;
  srv->accept_paused = true;
  srv->listener_closing = true;
  srv->stats.accept_pauses++;
  LOG_LIMITED(&srv->limit_accept, uv_now(srv->loop), LOG_LEVEL_WARN, "accept_paused",
              "pause_ms=%u reason=\"out of file descriptors\" connections=%u",
              ACCEPT_PAUSE_MS, srv->nconns);
  uv_close((uv_handle_t *)&srv->listener, on_listener_closed);
  uv_timer_start(&srv->accept_timer, on_resume, ACCEPT_PAUSE_MS, 0);
}

static void on_connection(uv_stream_t *listener, int status) {
  server_t *srv = listener->data;
  if (status == UV_EMFILE || status == UV_ENFILE) {
    pause_accepting(srv);
    return;
  }
  if (status < 0) {
    LOG_LIMITED(&srv->limit_accept, uv_now(srv->loop), LOG_LEVEL_WARN, "accept",
                "error=\"%s\"", uv_strerror(status));
    return;
  }
  conn_accept(srv);
}

/* The socket systemd passed: its path comes from systemd, not the config. */
static int listen_inherited(server_t *srv, int fd, char *err, size_t errlen) {
  struct sockaddr_un sa;
  socklen_t len = sizeof sa;
  memset(&sa, 0, sizeof sa);
  if (getsockname(fd, (struct sockaddr *)&sa, &len) == 0 && sa.sun_path[0])
    snprintf(srv->listen_path, sizeof srv->listen_path, "%.*s",
             (int)sizeof sa.sun_path, sa.sun_path);
  else
    snprintf(srv->listen_path, sizeof srv->listen_path, "(fd %d)", fd);
  int rc = uv_pipe_init(srv->loop, &srv->listener, 0);
  if (rc != 0) {
    snprintf(err, errlen, "uv_pipe_init: %s", uv_strerror(rc));
    return -1;
  }
  srv->listener.data = srv;
  rc = uv_pipe_open(&srv->listener, fd);
  if (rc == 0) rc = uv_listen((uv_stream_t *)&srv->listener, SOMAXCONN, on_connection);
  if (rc != 0) {
    snprintf(err, errlen, "cannot listen on the socket systemd passed (fd %d): %s", fd,
             uv_strerror(rc));
    uv_close((uv_handle_t *)&srv->listener, NULL);
    return -1;
  }
  srv->activated = true;
  srv->listening = true;
  keep_spare(srv);
  LOG_INFO("socket_activation", "fd=%d socket=%s configured_socket=%s "
           "note=\"the configured socket path is ignored\"", fd, srv->listen_path,
           srv->cfg.socket_path);
  return 0;
}

int server_listen(server_t *srv, char *err, size_t errlen) {
  uv_timer_init(srv->loop, &srv->accept_timer);
  srv->accept_timer.data = srv;
  int fd = activate_listen_fd(err, errlen);
  if (fd == -2) return -1;
  if (fd >= 0) return listen_inherited(srv, fd, err, errlen);
  const char *path = srv->cfg.socket_path;
  snprintf(srv->listen_path, sizeof srv->listen_path, "%s", path);
  if (make_parent(path, err, errlen) != 0 || check_parent(path, err, errlen) != 0 ||
      remove_stale(path, err, errlen) != 0)
    return -1;
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  if (strlen(path) >= sizeof sa.sun_path) {
    snprintf(err, errlen, "socket path %s is longer than %zu bytes", path, sizeof sa.sun_path - 1);
    return -1;
  }
  memcpy(sa.sun_path, path, strlen(path));
  /* Bound here, not by uv_pipe_bind: libuv would unlink the path whenever
   * the handle closes, a pause of accepting included; server_unlisten
   * removes it at the end. */
  fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    snprintf(err, errlen, "socket: %s", strerror(errno));
    return -1;
  }
  /* The file is created with the mode the umask allows: never wider than
   * socket_mode, not even for the instant a chmod after bind would leave. */
  mode_t old = umask((mode_t)(~srv->cfg.socket_mode & 0777u));
  int rc = bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0 ? 0 : uv_translate_sys_error(errno);
  umask(old);
  if (rc != 0) {
    snprintf(err, errlen, "cannot listen on %s: %s", path, uv_strerror(rc));
    close(fd);
    return -1;
  }
  uv_pipe_init(srv->loop, &srv->listener, 0);
  srv->listener.data = srv;
  rc = uv_pipe_open(&srv->listener, fd);
  if (rc != 0) close(fd);
  if (rc == 0) rc = uv_listen((uv_stream_t *)&srv->listener, SOMAXCONN, on_connection);
  if (rc != 0) {
    snprintf(err, errlen, "cannot listen on %s: %s", path, uv_strerror(rc));
    uv_close((uv_handle_t *)&srv->listener, NULL);
    unlink(path);
    return -1;
  }
  srv->listening = true;
  keep_spare(srv);
  return 0;
}

void server_unlisten(server_t *srv) {
  if (!srv->listening) return;
  srv->listening = false;
  uv_timer_stop(&srv->accept_timer);
  if (!srv->accept_paused) uv_close((uv_handle_t *)&srv->listener, NULL);
  srv->accept_paused = false;
  if (srv->listen_spare >= 0) close(srv->listen_spare);
  srv->listen_spare = -1;
  if (!srv->activated) unlink(srv->listen_path); /* systemd's stays for the next start */
}
