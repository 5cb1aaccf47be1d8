/* signals.c: what kvcached does on a signal. The first SIGTERM or SIGINT
 * drains (drain.c), a second exits at once with status 1; SIGHUP reloads
 * (reload.c). libuv turns each signal into a loop callback, so the handlers
 * run with the daemon's state consistent. */
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "server.h"

static void on_stop_signal(uv_signal_t *h, int signum) {
  server_t *srv = h->data;
  if (srv->draining) {
    LOG_WARN("shutdown", "signal=%s mode=immediate status=1", strsignal(signum));
    _exit(1);
  }
  LOG_INFO("shutdown", "signal=%s mode=drain connections=%llu drain_timeout_ms=%u",
           strsignal(signum), (unsigned long long)srv->stats.connections_current,
           srv->cfg.drain_timeout_ms);
  server_drain(srv);
}

static void on_hup(uv_signal_t *h, int signum) {
  (void)signum;
  server_t *srv = h->data;
  if (srv->draining) {
    LOG_INFO("reload", "skipped=draining");
    return;
  }
  server_reload(srv);
}

void signals_start(server_t *srv) {
  uv_signal_init(srv->loop, &srv->sig_term);
  uv_signal_init(srv->loop, &srv->sig_int);
  uv_signal_init(srv->loop, &srv->sig_hup);
  srv->sig_term.data = srv->sig_int.data = srv->sig_hup.data = srv;
  uv_signal_start(&srv->sig_term, on_stop_signal, SIGTERM);
  uv_signal_start(&srv->sig_int, on_stop_signal, SIGINT);
  uv_signal_start(&srv->sig_hup, on_hup, SIGHUP);
}

void signals_stop(server_t *srv) {
  if (!srv->sig_term.loop) return; /* never started */
  uv_close((uv_handle_t *)&srv->sig_term, NULL);
  uv_close((uv_handle_t *)&srv->sig_int, NULL);
  uv_close((uv_handle_t *)&srv->sig_hup, NULL);
}
