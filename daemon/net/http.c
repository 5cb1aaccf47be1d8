/* http.c: the opt-in scrape endpoint (metrics_listen): GET /metrics over
 * HTTP/1.x in the daemon's own loop, as HAProxy's and knot-resolver's
 * built-in exporters serve it.
 *
 * Just enough HTTP: one request per connection; the request line and headers
 * must arrive whole (up to the blank line) within HTTP_MAX_REQUEST bytes and
 * HTTP_TIMEOUT_MS of accept, else 400/431 or a silent close; the body of a
 * request is never read. GET (or HEAD) /metrics answers 200 with the same
 * text kvcachectl stats --prometheus prints (proto/promtext.c); another path
 * 404, another method 405. Every reply says Connection: close and the
 * connection closes once it is written (after the client's EOF, or
 * HTTP_LINGER_MS). At most HTTP_MAX_CONNS at once: the next ones are closed
 * at accept. Stopping (the drain's end) closes the listener and every scrape
 * still open. */
#include "http.h"
#include "poolown.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"
#include "log.h"
#include "tier.h"
#include "promtext.h"
#include "quotas.h"

#define HTTP_MAX_REQUEST 4096u
#define HTTP_TIMEOUT_MS 5000u
#define HTTP_MAX_CONNS 16u
#define HTTP_LINGER_MS 1000u /* after the reply: the client's EOF, at most */

typedef struct hconn {
  server_t *srv;
  struct hconn *prev, *next; /* open scrapes (http_open), closed at stop */
  uv_tcp_t tcp;
  uv_timer_t timer;
  uv_write_t wreq;
  uv_shutdown_t sreq;
  char *out;        /* the reply being written (malloc) */
  size_t len;       /* request bytes held */
  int handles;      /* not yet through their close callback */
  bool closing, answered;
  char buf[HTTP_MAX_REQUEST + 1];
} hconn_t;

static void on_timeout(uv_timer_t *t);

/* The scrapes open now, so that http_stop can end them. */
static struct hconn *http_open;

static void on_closed(uv_handle_t *h) {
  hconn_t *hc = h->data;
  if (--hc->handles > 0) return;
  hc->srv->http_conns--;
  if (hc->prev) hc->prev->next = hc->next;
  else http_open = hc->next;
  if (hc->next) hc->next->prev = hc->prev;
  free(hc->out);
  free(hc);
}

static void hclose(hconn_t *hc) {
  if (hc->closing) return;
  hc->closing = true;
  uv_close((uv_handle_t *)&hc->tcp, on_closed);
  uv_close((uv_handle_t *)&hc->timer, on_closed);
}

static void on_shutdown(uv_shutdown_t *r, int status) {
  if (status != 0) hclose(r->data);
  /* else: wait for the client's EOF (what it still sends is discarded),
   * so that closing never resets the reply away; the timer bounds it. */
}

static void on_written(uv_write_t *w, int status) {
  hconn_t *hc = w->data;
  hc->sreq.data = hc;
  if (status != 0 || uv_shutdown(&hc->sreq, (uv_stream_t *)&hc->tcp, on_shutdown) != 0)
    hclose(hc);
}

static void reply(hconn_t *hc, const char *status, const char *type, const char *extra,
                  const char *body, size_t blen, bool head) {
  hc->answered = true;
  uv_timer_start(&hc->timer, on_timeout, HTTP_LINGER_MS, 0);
  char hdr[512];
  int n = snprintf(hdr, sizeof hdr,
                   "HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%s"
                   "Connection: close\r\n\r\n", status, type, blen, extra);
  size_t hlen = n > 0 && (size_t)n < sizeof hdr ? (size_t)n : 0;
  size_t total = hlen + (head ? 0 : blen);
  hc->out = malloc(total ? total : 1);
  if (!hc->out) {
    hclose(hc);
    return;
  }
  memcpy(hc->out, hdr, hlen);
  if (!head && blen) memcpy(hc->out + hlen, body, blen);
  uv_buf_t b = uv_buf_init(hc->out, (unsigned)total);
  hc->wreq.data = hc;
  if (uv_write(&hc->wreq, (uv_stream_t *)&hc->tcp, &b, 1, on_written) != 0) hclose(hc);
}

static void error_reply(hconn_t *hc, const char *status, const char *extra) {
  char body[96];
  int n = snprintf(body, sizeof body, "%s\n", status);
  hc->srv->stats.metrics_http_errors++;
  reply(hc, status, "text/plain; charset=utf-8", extra, body, (size_t)(n > 0 ? n : 0), false);
}

/* The scrape is the operator's view: every cache, its tenant named. */
static const char *operator_view(void *ctx, const kvc_cache_info_t *ci) {
  server_t *srv = ctx;
  uint32_t owner;
  if (engine_cache_tenant(srv->eng, ci->cache_id, &owner) != 0) return NULL;
  return tenants_name(&srv->tenants, owner);
}

/* The figures as Prometheus text: the Stats reply, as kvc_stats has it. */
static int render(server_t *srv, char **out, size_t *len) {
  Kvcache__V1__StatsReply sr = KVCACHE__V1__STATS_REPLY__INIT;
  metrics_refusals_t *ref = NULL; /* the operator's view: every tenant refused */
  size_t nref = quotas_refusals(srv, UINT32_MAX, true, &srv->arena, &ref);
  metrics_arena_t *ar = NULL;
  size_t nar = poolown_arena_rows(srv, NULL, &srv->arena, &ar);
  const tier_view_t *tv[TIERS_MAX];
  size_t ntv = tiers_views(srv, &srv->arena, tv, TIERS_MAX);
  int rc = metrics_render(&srv->stats, srv->eng, uv_hrtime(), &srv->arena, NULL, 0,
                          operator_view, srv, ref, nref, tv, ntv, ar, nar, &sr);
  if (rc == 0) {
    size_t nlab = 0;
    for (size_t i = 0; i < sr.n_stats; i++) nlab += sr.stats[i]->n_labels;
    kvc_stat_t *st = malloc((sr.n_stats + 1) * sizeof *st);
    kvc_label_t *labs = malloc((nlab + 1) * sizeof *labs), *l = labs;
    if (!st || !labs) {
      rc = KVC_E_NOMEM;
    } else {
      for (size_t i = 0; i < sr.n_stats; i++) {
        codec_stat_from_wire(sr.stats[i], &st[i], l);
        l += st[i].nlabels;
      }
      rc = promtext_render(st, sr.n_stats, out, len);
    }
    free(st);
    free(labs);
  }
  arena_reset(&srv->arena);
  return rc;
}

/* The request is whole (up to its blank line): answer it. */
static void serve(hconn_t *hc) {
  char *sp1 = strchr(hc->buf, ' ');
  char *eol = strpbrk(hc->buf, "\r\n");
  char *sp2 = sp1 ? strchr(sp1 + 1, ' ') : NULL;
  if (!sp1 || !sp2 || sp2 > eol || strncmp(sp2 + 1, "HTTP/1.", 7) != 0) {
    error_reply(hc, "400 Bad Request", "");
    return;
  }
  *sp1 = *sp2 = '\0';
  const char *method = hc->buf, *target = sp1 + 1;
  size_t plen = strcspn(target, "?");
  bool is_metrics = plen == 8 && strncmp(target, "/metrics", 8) == 0;
  bool head = strcmp(method, "HEAD") == 0;
  if (!is_metrics) {
    error_reply(hc, "404 Not Found", "");
  } else if (strcmp(method, "GET") != 0 && !head) {
    error_reply(hc, "405 Method Not Allowed", "Allow: GET, HEAD\r\n");
  } else {
    char *text = NULL;
    size_t len = 0;
    if (render(hc->srv, &text, &len) != 0) {
      error_reply(hc, "500 Internal Server Error", "");
      return;
    }
    hc->srv->stats.metrics_scrapes++;
    reply(hc, "200 OK", PROMTEXT_CONTENT_TYPE, "", text, len, head);
    free(text);
  }
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *b) {
  (void)suggested;
  hconn_t *hc = h->data;
  if (hc->answered) { /* discarding */
    *b = uv_buf_init(hc->buf, HTTP_MAX_REQUEST);
    return;
  }
  size_t room = HTTP_MAX_REQUEST - hc->len;
  *b = uv_buf_init(hc->buf + hc->len, (unsigned)(room ? room : 1));
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *b) {
  (void)b;
  hconn_t *hc = s->data;
  if (nread == 0) return;
  if (nread < 0) { /* EOF or error: done (before a whole request, nothing to say) */
    hclose(hc);
    return;
  }
  if (hc->answered) return; /* the rest of a refused request */
  hc->len += (size_t)nread;
  hc->buf[hc->len] = '\0';
  if (strstr(hc->buf, "\r\n\r\n") || strstr(hc->buf, "\n\n")) {
    serve(hc);
  } else if (hc->len >= HTTP_MAX_REQUEST) {
    error_reply(hc, "431 Request Header Fields Too Large", "");
  }
}

static void on_timeout(uv_timer_t *t) {
  hconn_t *hc = t->data;
  if (hc->answered) { /* lingered long enough */
    hclose(hc);
    return;
  }
  hc->srv->stats.metrics_http_errors++;
  LOG_DEBUG("metrics_timeout", "bytes=%zu", hc->len);
  hclose(hc);
}

static void on_connection(uv_stream_t *l, int status) {
  server_t *srv = l->data;
  if (status != 0) return;
  hconn_t *hc = calloc(1, sizeof *hc);
  if (!hc) return;
  hc->srv = srv;
  uv_tcp_init(srv->loop, &hc->tcp);
  uv_timer_init(srv->loop, &hc->timer);
  hc->tcp.data = hc->timer.data = hc;
  hc->handles = 2;
  srv->http_conns++;
  hc->next = http_open;
  if (http_open) http_open->prev = hc;
  http_open = hc;
  if (uv_accept(l, (uv_stream_t *)&hc->tcp) != 0 || srv->http_conns > HTTP_MAX_CONNS ||
      srv->draining) {
    if (srv->http_conns > HTTP_MAX_CONNS) srv->stats.metrics_http_errors++;
    hclose(hc);
    return;
  }
  uv_timer_start(&hc->timer, on_timeout, HTTP_TIMEOUT_MS, 0);
  uv_read_start((uv_stream_t *)&hc->tcp, on_alloc, on_read);
}

int http_start(server_t *srv, char *err, size_t errlen) {
  const char *spec = srv->cfg.metrics_listen;
  if (!spec[0]) return 0;
  char host[64];
  unsigned port;
  struct sockaddr_storage ss;
  if (config_parse_listen(spec, host, sizeof host, &port) != 0) {
    snprintf(err, errlen, "metrics_listen: '%s' is not HOST:PORT", spec);
    return -1;
  }
  int rc = strchr(host, ':') ? uv_ip6_addr(host, (int)port, (struct sockaddr_in6 *)&ss)
                             : uv_ip4_addr(host, (int)port, (struct sockaddr_in *)&ss);
  if (rc == 0) rc = uv_tcp_init(srv->loop, &srv->http);
  if (rc != 0) {
    snprintf(err, errlen, "metrics_listen %s: %s", spec, uv_strerror(rc));
    return -1;
  }
  srv->http.data = srv;
  srv->http_on = true;
  if ((rc = uv_tcp_bind(&srv->http, (const struct sockaddr *)&ss, 0)) != 0 ||
      (rc = uv_listen((uv_stream_t *)&srv->http, 16, on_connection)) != 0) {
    snprintf(err, errlen, "metrics_listen %s: %s", spec, uv_strerror(rc));
    http_stop(srv);
    return -1;
  }
  struct sockaddr_storage bound;
  int blen = sizeof bound;
  char addr[64] = "?";
  unsigned bport = port;
  if (uv_tcp_getsockname(&srv->http, (struct sockaddr *)&bound, &blen) == 0) {
    if (bound.ss_family == AF_INET6) {
      uv_ip6_name((struct sockaddr_in6 *)&bound, addr, sizeof addr);
      bport = ntohs(((struct sockaddr_in6 *)&bound)->sin6_port);
    } else {
      uv_ip4_name((struct sockaddr_in *)&bound, addr, sizeof addr);
      bport = ntohs(((struct sockaddr_in *)&bound)->sin_port);
    }
  }
  srv->http_port = bport;
  LOG_INFO("metrics_listen", "address=%s port=%u path=/metrics", addr, bport);
  return 0;
}

static void on_listener_closed(uv_handle_t *h) { (void)h; }

void http_stop(server_t *srv) {
  if (!srv->http_on) return;
  srv->http_on = false;
  uv_close((uv_handle_t *)&srv->http, on_listener_closed);
  /* Scrapes in flight end now: the loop need not wait for their timers. */
  for (hconn_t *hc = http_open; hc; hc = hc->next) hclose(hc);
}
