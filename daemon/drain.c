/* drain.c: the graceful shutdown that the first SIGTERM or SIGINT starts.
 *
 * The listener closes (systemd's socket stays open in systemd for the next
 * start). Each connection then answers every complete request its client has
 * sent, including bytes still in the socket, queues one last Response with
 * id 0 and status SHUTDOWN (the goodbye: libkvcache returns KVC_E_SHUTDOWN
 * for the request it was waiting on, or for its next one), flushes and
 * closes. When the last connection is gone the loop ends and kvcached exits
 * 0. A client that stops reading cannot hold the exit hostage: after
 * drain_timeout_ms the connections left are closed.
 */
#include "conn.h"
#include "log.h"
#include "events.h"
#include "http.h"
#include "poolresize.h"
#include "tier.h"
#include "server.h"

static void on_drain_timeout(uv_timer_t *t) {
  server_t *srv = t->data;
  unsigned n = 0;
  for (conn_t *c = srv->conns; c; c = c->next) n += c->state != CONN_CLOSED;
  LOG_WARN("drain_timeout", "drain_timeout_ms=%u connections_closed=%u",
           srv->cfg.drain_timeout_ms, n);
  for (conn_t *c = srv->conns; c; c = c->next) conn_close(c, "drain timeout");
}

void server_drain(server_t *srv) {
  if (srv->draining) return;
  srv->draining = true;
  unsigned long long n = (unsigned long long)srv->stats.connections_current;
  if (notify_send(&srv->notify, "STOPPING=1\nSTATUS=draining %llu connections", n) != 0)
    LOG_WARN("notify", "state=STOPPING error=\"send failed\"");
  server_unlisten(srv);
  uv_timer_stop(&srv->status_timer);
  tiers_drain(srv); /* requests waiting on a tier run with what came */
  /* A connection closes in a later callback, so the list stays walkable. */
  for (conn_t *c = srv->conns; c; c = c->next) conn_drain(c);
  if (!srv->conns) {
    server_stop(srv);
    return;
  }
  uv_timer_start(&srv->drain_timer, on_drain_timeout, srv->cfg.drain_timeout_ms, 0);
}

void server_conn_gone(server_t *srv) {
  if (!srv->draining || srv->conns) return;
  LOG_INFO("drained", "connections_total=%llu",
           (unsigned long long)srv->stats.connections_total);
  server_stop(srv);
}

void server_stop(server_t *srv) {
  if (srv->stopped) return;
  srv->stopped = true;
  uv_close((uv_handle_t *)&srv->sig_term, NULL);
  uv_close((uv_handle_t *)&srv->sig_int, NULL);
  uv_close((uv_handle_t *)&srv->sig_hup, NULL);
  uv_close((uv_handle_t *)&srv->status_timer, NULL);
  uv_close((uv_handle_t *)&srv->drain_timer, NULL);
  uv_close((uv_handle_t *)&srv->expire_timer, NULL);
  uv_close((uv_handle_t *)&srv->bg_timer, NULL);
  uv_close((uv_handle_t *)&srv->accept_timer, NULL);
  http_stop(srv);
  tiers_stop(srv);
  pool_resize_stop(srv);
  events_stop(srv);
}
