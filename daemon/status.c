/* status.c: the daemon's periodic look at itself, every status_interval_ms:
 * a STATUS= line for `systemctl status`, and one log line summing up the
 * evictions and FULL refusals since the last tick (so pressure is visible
 * without a line per eviction). */
#include <stdio.h>

#include "log.h"
#include "server.h"

void status_line(server_t *srv, char *buf, size_t len) {
  engine_stats_t st;
  engine_stats(srv->eng, &st);
  uint64_t requests = 0;
  for (int i = 0; i < OP_COUNT_; i++) requests += srv->stats.ops[i].requests;
  snprintf(buf, len,
           "%llu clients, pages %llu/%llu used (%llu pinned), %llu sequences, "
           "%llu requests, %llu sequences evicted",
           (unsigned long long)srv->stats.connections_current,
           (unsigned long long)st.pages_used, (unsigned long long)st.pool_pages,
           (unsigned long long)st.pages_pinned, (unsigned long long)st.sequences,
           (unsigned long long)requests, (unsigned long long)st.evicted_sequences);
}

static void on_tick(uv_timer_t *t) {
  server_t *srv = t->data;
  engine_stats_t st;
  engine_stats(srv->eng, &st);
  unsigned long long seqs = st.evicted_sequences - srv->seen_evicted_seqs;
  unsigned long long pages = st.evicted_pages - srv->seen_evicted_pages;
  unsigned long long full = st.full_errors - srv->seen_full_errors;
  if (full)
    LOG_WARN("pool_full", "full_errors=%llu evicted_sequences=%llu evicted_pages=%llu "
             "interval_ms=%u pages_free=%llu pages_pinned=%llu", full, seqs, pages,
             srv->cfg.status_interval_ms, (unsigned long long)st.pages_free,
             (unsigned long long)st.pages_pinned);
  else if (seqs)
    LOG_INFO("evictions", "evicted_sequences=%llu evicted_pages=%llu interval_ms=%u "
             "pages_free=%llu", seqs, pages, srv->cfg.status_interval_ms,
             (unsigned long long)st.pages_free);
  srv->seen_evicted_seqs = st.evicted_sequences;
  srv->seen_evicted_pages = st.evicted_pages;
  srv->seen_full_errors = st.full_errors;
  if (notify_enabled(&srv->notify)) {
    char line[256];
    status_line(srv, line, sizeof line);
    notify_send(&srv->notify, "STATUS=%s", line);
  }
}

void status_start(server_t *srv) {
  srv->status_timer.data = srv;
  uv_timer_start(&srv->status_timer, on_tick, srv->cfg.status_interval_ms,
                 srv->cfg.status_interval_ms);
}

void status_reschedule(server_t *srv) {
  if (srv->draining || uv_timer_get_repeat(&srv->status_timer) == srv->cfg.status_interval_ms)
    return;
  uv_timer_stop(&srv->status_timer);
  status_start(srv);
}
