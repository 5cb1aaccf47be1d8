/* listen.c: the daemon's listening socket: its directory, stale-file check,
 * mode (through the umask at bind) and the accept callback. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

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

int server_listen(server_t *srv, char *err, size_t errlen) {
  const char *path = srv->cfg.socket_path;
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
  unlink(srv->cfg.socket_path);
}
