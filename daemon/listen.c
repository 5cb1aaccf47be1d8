/* listen.c: the daemon's listening socket: systemd's when socket-activated,
 * else bound here (its directory, stale-file check, mode through the umask at
 * bind); and the accept callback. */
#include <errno.h>
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

static void on_connection(uv_stream_t *listener, int status) {
  server_t *srv = listener->data;
  if (status < 0) {
    LOG_WARN("accept", "error=\"%s\"", uv_strerror(status));
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
  LOG_INFO("socket_activation", "fd=%d socket=%s configured_socket=%s "
           "note=\"the configured socket path is ignored\"", fd, srv->listen_path,
           srv->cfg.socket_path);
  return 0;
}

int server_listen(server_t *srv, char *err, size_t errlen) {
  int fd = activate_listen_fd(err, errlen);
  if (fd == -2) return -1;
  if (fd >= 0) return listen_inherited(srv, fd, err, errlen);
  const char *path = srv->cfg.socket_path;
  snprintf(srv->listen_path, sizeof srv->listen_path, "%s", path);
  if (make_parent(path, err, errlen) != 0 || remove_stale(path, err, errlen) != 0)
    return -1;
  int rc = uv_pipe_init(srv->loop, &srv->listener, 0);
  if (rc != 0) {
    snprintf(err, errlen, "uv_pipe_init: %s", uv_strerror(rc));
    return -1;
  }
  srv->listener.data = srv;
  /* The file is created with the mode the umask allows: never wider than
   * socket_mode, not even for the instant a chmod after bind would leave. */
  mode_t old = umask((mode_t)(~srv->cfg.socket_mode & 0777u));
  rc = uv_pipe_bind(&srv->listener, path);
  umask(old);
  if (rc == 0) rc = uv_listen((uv_stream_t *)&srv->listener, SOMAXCONN, on_connection);
  if (rc != 0) {
    snprintf(err, errlen, "cannot listen on %s: %s", path, uv_strerror(rc));
    uv_close((uv_handle_t *)&srv->listener, NULL);
    return -1;
  }
  srv->listening = true;
  return 0;
}

void server_unlisten(server_t *srv) {
  if (!srv->listening) return;
  srv->listening = false;
  uv_close((uv_handle_t *)&srv->listener, NULL);
  if (!srv->activated) unlink(srv->listen_path); /* systemd's stays for the next start */
}
