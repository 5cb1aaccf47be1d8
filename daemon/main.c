/* main.c: kvcached's entry point: options, startup, signals and shutdown. */
#include <libgen.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "conn.h"
#include "kvcache/kvcache.h"
#include "log.h"
#include "server.h"

static void close_signals(server_t *srv) {
  if (!uv_is_closing((uv_handle_t *)&srv->sig_term)) {
    uv_close((uv_handle_t *)&srv->sig_term, NULL);
    uv_close((uv_handle_t *)&srv->sig_int, NULL);
  }
}

void server_conn_gone(server_t *srv) {
  if (srv->draining && !srv->conns) close_signals(srv);
}

void server_drain(server_t *srv) {
  srv->draining = true;
  server_unlisten(srv);
  for (conn_t *c = srv->conns; c; c = c->next) {
    if (c->closing) continue;
    conn_run_all(c); /* answer what the client already sent */
    conn_close_after_flush(c, "shutdown");
  }
  if (!srv->conns) close_signals(srv);
}

static void on_signal(uv_signal_t *h, int signum) {
  server_t *srv = h->data;
  if (srv->draining) {
    LOG_WARN("shutdown", "signal=%d mode=immediate", signum);
    _exit(1);
  }
  LOG_INFO("shutdown", "signal=%d mode=drain connections=%llu", signum,
           (unsigned long long)srv->stats.connections_current);
  server_drain(srv);
}

static int start(server_t *srv, char *err, size_t errlen) {
  if (shm_pool_open(srv->cfg.pool_bytes, &srv->pool, err, errlen) != 0) return -1;
  engine_config_t ec = {.base = srv->pool.base,
                        .pool_bytes = srv->pool.bytes,
                        .page_bytes = srv->cfg.page_bytes,
                        .max_caches = srv->cfg.max_caches,
                        .max_seqs = srv->cfg.max_seqs};
  int rc = engine_new(&ec, &srv->eng);
  if (rc != 0) {
    snprintf(err, errlen, "engine: %s", kvc_strerror(rc));
    return -1;
  }
  if (server_listen(srv, err, errlen) != 0) return -1;
  uv_signal_init(srv->loop, &srv->sig_term);
  uv_signal_init(srv->loop, &srv->sig_int);
  srv->sig_term.data = srv->sig_int.data = srv;
  uv_signal_start(&srv->sig_term, on_signal, SIGTERM);
  uv_signal_start(&srv->sig_int, on_signal, SIGINT);
  return 0;
}

static void announce(const server_t *srv, const char *argv0) {
  char opts[2048], self[4096];
  config_format(&srv->cfg, opts, sizeof opts);
  LOG_INFO("start", "version=%s pid=%d %s", KVC_VERSION_STRING, (int)getpid(), opts);
  LOG_INFO("pool", "bytes=%llu page_bytes=%llu pages=%llu prefaulted=yes sealed=yes",
           (unsigned long long)srv->pool.bytes, (unsigned long long)srv->cfg.page_bytes,
           (unsigned long long)(srv->pool.bytes / srv->cfg.page_bytes));
  LOG_INFO("listen", "socket=%s mode=%04o", srv->cfg.socket_path, srv->cfg.socket_mode);
  snprintf(self, sizeof self, "%s", argv0);
  printf("kvcached %s listening on %s\n", KVC_VERSION_STRING, srv->cfg.socket_path);
  printf("try: %s/kvcachectl stats --socket %s\n", dirname(self), srv->cfg.socket_path);
  fflush(stdout);
}

int main(int argc, char **argv) {
  static server_t srv;
  static uv_loop_t loop;
  char err[512];
  int rc = config_load_args(argc, argv, &srv.cfg, err, sizeof err);
  if (rc == CONFIG_ARGS_EXIT) return 0;
  if (rc != CONFIG_ARGS_OK) {
    fprintf(stderr, "kvcached: %s\n", err);
    return 2;
  }
  log_level = srv.cfg.log_level;
  signal(SIGPIPE, SIG_IGN);
  uv_loop_init(&loop);
  srv.loop = &loop;
  srv.next_conn_id = 1;
  srv.pool.fd = -1;
  arena_init(&srv.arena);
  stats_init(&srv.stats, uv_hrtime());
  int status = 0;
  if (start(&srv, err, sizeof err) != 0) {
    LOG_ERROR("start_failed", "reason=\"%s\"", err);
    fprintf(stderr, "kvcached: %s\n", err);
    status = 1;
    server_unlisten(&srv);
  } else {
    announce(&srv, argv[0]);
    uv_run(&loop, UV_RUN_DEFAULT);
    LOG_INFO("exit", "status=0 connections_total=%llu",
             (unsigned long long)srv.stats.connections_total);
  }
  uv_run(&loop, UV_RUN_NOWAIT); /* let closed handles finish */
  uv_loop_close(&loop);
  engine_free(srv.eng);
  shm_close(&srv.pool);
  arena_deinit(&srv.arena);
  return status;
}
