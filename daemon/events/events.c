/* events.c: draining the engine's log of prefix-index changes once per loop
 * turn into the ZeroMQ stream and the subscribed connections, each cut to
 * what its reader may see (events.h; doc/events.md). */
#include "events.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "events_vhash.h"
#include "events_wire.h"
#include "events_zmq.h"
#include "log.h"

/* The caches one reader may see. */
typedef struct scope {
  bool all;                          /* every tenant's (an admin, or events_tenant = *) */
  uint32_t tenant;                   /* else this tenant's, and the shared caches it may read */
  char tenant_name[TENANT_NAME_MAX];
  char cache[KVC_MAX_NAME + 1];      /* only caches of this name; "": every one */
} scope_t;

/* A subscribed connection. */
struct events_sub {
  uint64_t req_id;     /* the Subscribe's id: every push carries it */
  scope_t scope;
  bool token_ids;
  uint64_t seq;        /* batches for it so far, pushed or dropped */
  uint64_t dropped;    /* batches dropped: it was over write_queue_bytes */
};

struct events {
  server_t *srv;
  uv_check_t check;    /* drains the log after each turn's I/O */
  bool checking;
  zpub_t *zpub;        /* the ZeroMQ stream; NULL: not configured */
  scope_t zscope;
  bool zfresh;         /* no change published yet (the daemon (re)started empty):
                          a subscriber that joins gets AllBlocksCleared alone, and
                          the first batch of changes starts with it */
  vhash_t *vhash;      /* events_hash = vllm: the vLLM hash of each page published */
  msgpack_sbuffer sb;
  engine_event_t *evs; /* the turn's records */
  wire_ev_t *wev;      /* the ZeroMQ batch's events */
  uint8_t (*vh)[2][32]; /* with vhash: each one's vLLM hash and its parent's */
  size_t cap;          /* of evs; wev and vh: cap + 2 */
  uint32_t nsubs;      /* subscribed connections */
  struct {             /* the last cache name looked up in a turn */
    uint32_t id;
    bool valid;
    char name[KVC_MAX_NAME + 1];
  } memo;
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ---- one turn's records ------------------------------------------------------ */

/* The name of the cache of record i: the engine's, or for a cache dropped in
 * this turn the name its DROPPED record carries. Valid until the next call. */
static const char *turn_name(events_t *e, size_t n, size_t i) {
  const engine_event_t *ev = &e->evs[i];
  if (ev->cache_name) return ev->cache_name;
  if (e->memo.valid && e->memo.id == ev->cache_id) return e->memo.name;
  kvc_cache_info_t ci;
  e->memo.valid = true;
  e->memo.id = ev->cache_id;
  if (engine_cache_info(e->srv->eng, ev->cache_id, &ci) == 0) {
    snprintf(e->memo.name, sizeof e->memo.name, "%s", ci.name);
    return e->memo.name;
  }
  e->memo.name[0] = '\0';
  for (size_t j = i + 1; j < n; j++)
    if (e->evs[j].kind == ENGINE_EV_DROPPED && e->evs[j].cache_id == ev->cache_id) {
      snprintf(e->memo.name, sizeof e->memo.name, "%s", e->evs[j].cache_name);
      break;
    }
  return e->memo.name;
}

static bool in_scope(events_t *e, const scope_t *s, size_t n, size_t i) {
  const engine_event_t *ev = &e->evs[i];
  const config_t *cfg = &e->srv->cfg;
  if (!s->all && ev->tenant != s->tenant &&
      (ev->tenant != TENANT_SHARED ||
       tenant_shared_right(cfg->shared_rules, cfg->n_shared_rules, turn_name(e, n, i),
                           s->tenant_name) == RIGHT_NONE))
    return false;
  return !s->cache[0] || strcmp(turn_name(e, n, i), s->cache) == 0;
}

/* Doubles the room for a turn's records (256 the first time); false out of
 * memory (what was there stays). */
static bool grow(events_t *e) {
  size_t cap = e->cap ? 2 * e->cap : 256;
  engine_event_t *evs = realloc(e->evs, cap * sizeof *evs);
  if (evs) e->evs = evs;
  wire_ev_t *wev = evs ? realloc(e->wev, (cap + 2) * sizeof *wev) : NULL;
  if (wev) e->wev = wev;
  uint8_t(*vh)[2][32] = wev ? realloc(e->vh, (cap + 2) * sizeof *vh) : NULL;
  if (vh) e->vh = vh;
  if (!evs || !wev || !vh) return false;
  e->cap = cap;
  return true;
}

/* Reads the log into e->evs; returns how many records, or SIZE_MAX when
 * there is no room for them (out of memory: the turn counts as lost). */
static size_t read_log(events_t *e) {
  engine_t *eng = e->srv->eng;
  size_t cur = 0, n = 0;
  engine_event_t ev;
  while (engine_events_next(eng, &cur, &ev)) {
    if (n == e->cap && !grow(e)) return SIZE_MAX;
    e->evs[n++] = ev;
  }
  return n;
}

/* ---- the ZeroMQ stream ------------------------------------------------------- */

/* The event of ev as the stream publishes it into *w: false when it is not
 * published (events_hash = vllm, and its parent was forgotten). */
static bool published(events_t *e, const engine_event_t *ev, size_t m, wire_ev_t *w) {
  *w = (wire_ev_t){ev, ev->hash, ev->has_parent ? ev->parent : NULL};
  if (!e->vhash) return true;
  uint8_t *vh = e->vh[m][0], *parent = e->vh[m][1];
  bool has_parent = false;
  bool ok = ev->kind == ENGINE_EV_STORED ? vhash_stored(e->vhash, ev, vh, parent, &has_parent)
                                         : vhash_removed(e->vhash, ev, vh);
  *w = (wire_ev_t){ev, vh, has_parent ? parent : NULL};
  return ok;
}

/* Publishes this turn's changes; with none, and no change published since
 * the start, AllBlocksCleared alone when a subscriber joined: a router that
 * held a view of this node before it restarted drops it at once (a PUB
 * sends nothing to a subscriber that has not joined yet, so not at start). */
static void zmq_turn(events_t *e, size_t n, bool lost, bool joined, double ts) {
  server_t *srv = e->srv;
  size_t m = 0;
  if (e->zfresh) e->wev[m++] = (wire_ev_t){NULL, NULL, NULL};
  size_t head = m;
  for (size_t i = 0; i < n; i++) {
    const engine_event_t *ev = &e->evs[i];
    if (ev->kind != ENGINE_EV_STORED && ev->kind != ENGINE_EV_REMOVED) continue;
    if (!in_scope(e, &e->zscope, n, i)) continue; /* cache clears: their pages' removals say it */
    m += published(e, ev, m, &e->wev[m]);
  }
  /* Changes were lost (the log was full): what subscribers know is stale. */
  if (lost) {
    e->wev[m++] = (wire_ev_t){NULL, NULL, NULL};
    if (e->vhash) vhash_clear(e->vhash);
  }
  bool changes = m > head;
  if (!changes && !(e->zfresh && joined)) return; /* nothing for this stream */
  wire_opts_t o = {.map = srv->cfg.events_format == EVENTS_FORMAT_MAP,
                   .token_ids = srv->cfg.events_token_ids,
                   .hash_int = srv->cfg.events_hash_int,
                   .hash_len = !e->vhash && srv->cfg.prefix_hash == KVC_HASH_XXH3 ? 16 : 32,
                   .dp_rank = 0};
  long k = wire_batch(&e->sb, ts, e->wev, m, &o);
  if (k < 0) {
    LOG_ERROR("events_batch", "error=\"out of memory encoding %zu events\"", m);
    return;
  }
  zpub_publish(e->zpub, e->sb.data, e->sb.size);
  if (changes) e->zfresh = false;
  srv->stats.events_batches++;
  srv->stats.events_published += (uint64_t)k;
}

/* ---- subscribed connections ---------------------------------------------------- */

static const Kvcache__V1__PrefixEventKind wire_kind[] = {
    [ENGINE_EV_STORED] = KVCACHE__V1__PREFIX_EVENT_KIND__EVENT_STORED,
    [ENGINE_EV_REMOVED] = KVCACHE__V1__PREFIX_EVENT_KIND__EVENT_REMOVED,
    [ENGINE_EV_CLEARED] = KVCACHE__V1__PREFIX_EVENT_KIND__EVENT_CLEARED,
    [ENGINE_EV_DROPPED] = KVCACHE__V1__PREFIX_EVENT_KIND__EVENT_DROPPED,
};

/* The protobuf form of record i for sub s, in the arena; NULL out of memory. */
static Kvcache__V1__PrefixEvent *to_wire(events_t *e, const struct events_sub *s, size_t n, size_t i) {
  server_t *srv = e->srv;
  const engine_event_t *ev = &e->evs[i];
  Kvcache__V1__PrefixEvent *pe = arena_alloc(&srv->arena, sizeof *pe);
  if (!pe) return NULL;
  kvcache__v1__prefix_event__init(pe);
  pe->kind = wire_kind[ev->kind];
  pe->cache_id = ev->cache_id;
  pe->cache = arena_printf(&srv->arena, "%s", turn_name(e, n, i));
  pe->tenant = (char *)tenants_name(&srv->tenants, ev->tenant);
  pe->block_size = ev->page_tokens;
  pe->medium = (char *)wire_medium(ev->medium);
  size_t hl = srv->cfg.prefix_hash == KVC_HASH_XXH3 ? 16 : 32;
  if (ev->kind == ENGINE_EV_STORED || ev->kind == ENGINE_EV_REMOVED)
    pe->hash = (ProtobufCBinaryData){hl, (uint8_t *)ev->hash};
  if (ev->kind == ENGINE_EV_STORED && ev->has_parent)
    pe->parent = (ProtobufCBinaryData){hl, (uint8_t *)ev->parent};
  if (ev->kind == ENGINE_EV_STORED && s->token_ids) {
    pe->n_token_ids = ev->ntokens;
    pe->token_ids = (uint32_t *)ev->tokens;
  }
  return pe->cache ? pe : NULL;
}

/* Pushes this turn's batch to c, or drops it when c does not read. */
static void sub_push(events_t *e, conn_t *c, size_t n, bool lost, double ts) {
  server_t *srv = e->srv;
  struct events_sub *s = c->sub;
  size_t k = lost ? 1 : 0;
  for (size_t i = 0; i < n; i++) k += in_scope(e, &s->scope, n, i);
  if (k == 0) return;
  s->seq++;
  if (c->wq_bytes > srv->cfg.write_queue_bytes) { /* it does not read: never wait for it */
    s->dropped++;
    srv->stats.events_local_drops++;
    return;
  }
  Kvcache__V1__EventsReply *er = arena_alloc(&srv->arena, sizeof *er);
  Kvcache__V1__PrefixEvent **items = arena_alloc(&srv->arena, k * sizeof *items);
  size_t m = 0;
  bool ok = er && items;
  for (size_t i = 0; ok && i < n; i++)
    if (in_scope(e, &s->scope, n, i)) ok = (items[m++] = to_wire(e, s, n, i)) != NULL;
  if (ok && lost) {
    Kvcache__V1__PrefixEvent *pe = arena_alloc(&srv->arena, sizeof *pe);
    if ((ok = pe != NULL)) {
      kvcache__v1__prefix_event__init(pe);
      pe->kind = KVCACHE__V1__PREFIX_EVENT_KIND__EVENT_RESET;
      items[m++] = pe;
    }
  }
  if (!ok) {
    arena_reset(&srv->arena);
    s->dropped++;
    srv->stats.events_local_drops++;
    return;
  }
  kvcache__v1__events_reply__init(er);
  er->seq = s->seq;
  er->ts = ts;
  er->n_events = m;
  er->events = items;
  er->dropped = s->dropped;
  Kvcache__V1__Response resp = KVCACHE__V1__RESPONSE__INIT;
  resp.id = s->req_id;
  resp.status = KVCACHE__V1__STATUS__OK;
  resp.error = (char *)"";
  resp.body_case = KVCACHE__V1__RESPONSE__BODY_EVENTS;
  resp.events = er;
  srv->stats.events_local_batches++;
  conn_send(c, &resp); /* a failure closes c (and unsubscribes it) */
  arena_reset(&srv->arena);
}

/* ---- the turn ---------------------------------------------------------------------- */

static void on_turn(uv_check_t *h) {
  events_t *e = h->data;
  server_t *srv = e->srv;
  uint64_t lost = engine_events_dropped(srv->eng);
  size_t n = read_log(e);
  if (n == SIZE_MAX) {
    lost += 1; /* cannot even read them: all of this turn's count as lost */
    n = 0;
  }
  bool joined = e->zpub && e->zfresh && zpub_take_joins(e->zpub);
  if (n == 0 && lost == 0 && !joined) return;
  if (lost) {
    srv->stats.events_log_dropped += lost;
    LOG_WARN("events_lost", "records=%llu reason=\"the event log was full (events_log_bytes=%llu)\"",
             (unsigned long long)lost, (unsigned long long)srv->cfg.events_log_bytes);
  }
  double ts = now_s();
  e->memo.valid = false;
  if (e->zpub) zmq_turn(e, n, lost != 0, joined, ts);
  /* A join seen while publishing (zpub_publish reads the subscriptions)
   * gets its AllBlocksCleared now, not at the loop's next wakeup. */
  while (e->zpub && e->zfresh && zpub_take_joins(e->zpub)) zmq_turn(e, 0, false, true, ts);
  if (e->nsubs)
    for (conn_t *c = srv->conns; c; c = c->next)
      if (c->sub && c->state < CONN_FLUSHING) sub_push(e, c, n, lost != 0, ts);
  engine_events_reset(srv->eng);
}

/* The log and the turn's drain run while anyone reads the stream. */
static int update(events_t *e, char *err, size_t errlen) {
  server_t *srv = e->srv;
  bool want = e->zpub || e->nsubs;
  if (want && !engine_events_on(srv->eng)) {
    int rc = engine_events_enable(srv->eng, srv->cfg.events_log_bytes);
    if (rc) {
      snprintf(err, errlen, "events: %s", engine_last_error(srv->eng)->msg);
      return rc;
    }
  } else if (!want && engine_events_on(srv->eng)) {
    engine_events_enable(srv->eng, 0);
  }
  if (want != e->checking) {
    if (want) uv_check_start(&e->check, on_turn);
    else uv_check_stop(&e->check);
    e->checking = want;
  }
  return 0;
}

/* ---- lifecycle ----------------------------------------------------------------------- */

int events_init(server_t *srv, char *err, size_t errlen) {
  events_t *e = calloc(1, sizeof *e);
  if (!e) {
    snprintf(err, errlen, "events: out of memory");
    return -1;
  }
  e->srv = srv;
  msgpack_sbuffer_init(&e->sb);
  uv_check_init(srv->loop, &e->check);
  e->check.data = e;
  srv->events = e;
  const config_t *cfg = &srv->cfg;
  if (!cfg->events_endpoint[0]) return 0;
  e->zscope.all = strcmp(cfg->events_tenant, "*") == 0;
  snprintf(e->zscope.tenant_name, sizeof e->zscope.tenant_name, "%s", cfg->events_tenant);
  snprintf(e->zscope.cache, sizeof e->zscope.cache, "%.*s", KVC_MAX_NAME, cfg->events_cache);
  if (!e->zscope.all && !(e->zscope.tenant = tenants_id(&srv->tenants, cfg->events_tenant))) {
    snprintf(err, errlen, "events_tenant: too many distinct tenants");
    return -1;
  }
  e->zfresh = true;
  if (!grow(e) || /* room for a turn with no records: AllBlocksCleared alone */
      (cfg->events_hash == EVENTS_HASH_VLLM && !(e->vhash = vhash_new(cfg->events_hash_seed)))) {
    snprintf(err, errlen, "events: out of memory");
    return -1;
  }
  if (zpub_open(srv, &e->zpub, err, errlen) != 0) return -1;
  if (update(e, err, errlen) != 0) return -1;
  LOG_INFO("events", "endpoint=%s replay=%s topic=\"%s\" tenant=%s cache=\"%s\" format=%s "
           "hash=%s%s", cfg->events_endpoint,
           cfg->events_replay_endpoint[0] ? cfg->events_replay_endpoint : "none",
           cfg->events_topic, cfg->events_tenant, cfg->events_cache,
           cfg->events_format == EVENTS_FORMAT_MAP ? "map" : "array",
           cfg->events_hash == EVENTS_HASH_VLLM ? "vllm" : "chain",
           cfg->events_hash_int ? "/int" : "/bytes");
  return 0;
}

void events_stop(server_t *srv) {
  events_t *e = srv->events;
  if (!e) return;
  zpub_close(e->zpub);
  e->zpub = NULL;
  uv_close((uv_handle_t *)&e->check, NULL);
}

void events_free(server_t *srv) {
  events_t *e = srv->events;
  if (!e) return;
  msgpack_sbuffer_destroy(&e->sb);
  vhash_free(e->vhash);
  free(e->evs);
  free(e->wev);
  free(e->vh);
  free(e);
  srv->events = NULL;
}

int events_subscribe(conn_t *c, uint64_t req_id, const char *cache, bool token_ids, char *err,
                     size_t errlen) {
  events_t *e = c->srv->events;
  if (!e) {
    snprintf(err, errlen, "the event stream is not running");
    return KVC_E_NOTRUNNING;
  }
  if (c->sub) {
    snprintf(err, errlen, "this connection is subscribed already");
    return KVC_E_INVAL;
  }
  struct events_sub *s = calloc(1, sizeof *s);
  if (!s) {
    snprintf(err, errlen, "out of memory");
    return KVC_E_NOMEM;
  }
  s->req_id = req_id;
  s->token_ids = token_ids;
  s->scope.all = c->admin;
  s->scope.tenant = c->tenant;
  snprintf(s->scope.tenant_name, sizeof s->scope.tenant_name, "%s", conn_tenant(c));
  snprintf(s->scope.cache, sizeof s->scope.cache, "%s", cache ? cache : "");
  c->sub = s;
  e->nsubs++;
  c->srv->stats.events_local_subscribers++;
  int rc = update(e, err, errlen);
  if (rc) events_unsubscribe(c);
  return rc;
}

void events_unsubscribe(conn_t *c) {
  events_t *e = c->srv->events;
  if (!c->sub) return;
  free(c->sub);
  c->sub = NULL;
  if (!e) return;
  e->nsubs--;
  char err[64];
  (void)update(e, err, sizeof err); /* turning off never fails */
  if (c->srv->stats.events_local_subscribers) c->srv->stats.events_local_subscribers--;
}
