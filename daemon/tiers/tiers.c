/* tiers.c: the list of tiers, in the chain's order, and what the daemon
 * calls of them (tier.h). Adding a tier is its own file and one line here.
 * It keeps the one deadline of every lookup: the walks that wait on a tier,
 * and one timer at the earliest of their deadlines. */
#include "tier.h"

#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "server.h"

struct tiers {
  uv_timer_t timer;
  tier_wait_t *waiting;         /* walks waiting on a tier (listed), in no order */
  uint64_t timeouts[TIERS_MAX]; /* lookups let go at their deadline, by tier */
};

static const tier_ops_t *const tiers[] = {
    &tier_disk,    /* disk_dir: doc/tiers.md */
    &tier_cluster, /* cluster_nodes: doc/cluster.md */
    &tier_testmem, /* KVCACHED_TEST_TIER=mem: the tests' (testmem.c) */
};
#define NTIERS (sizeof tiers / sizeof tiers[0])
_Static_assert(NTIERS <= TIERS_MAX, "tier_wait_t has a bit and a slot a tier");

static bool on(const server_t *srv, unsigned i) { return tiers[i]->on && tiers[i]->on(srv); }

/* ---- store: the engine's hooks, shared out ------------------------------------- */

static void on_indexed(void *ctx, uint32_t cache_id, const uint8_t hash[32]) {
  server_t *srv = ctx;
  for (unsigned i = 0; i < NTIERS; i++)
    if (tiers[i]->indexed && on(srv, i)) tiers[i]->indexed(srv, cache_id, hash);
}

static void on_reclaimed(void *ctx, const engine_page_t *page) {
  server_t *srv = ctx;
  for (unsigned i = 0; i < NTIERS; i++)
    if (tiers[i]->reclaimed && on(srv, i)) tiers[i]->reclaimed(srv, page);
}

/* The engine calls a hook only when a tier that is on has that member: a
 * daemon without tiers pays nothing per put or eviction. */
static void hook(server_t *srv) {
  bool indexed = false, reclaimed = false;
  for (unsigned i = 0; i < NTIERS; i++) {
    if (!on(srv, i)) continue;
    indexed |= tiers[i]->indexed != NULL;
    reclaimed |= tiers[i]->reclaimed != NULL;
  }
  engine_tier_hooks_t h = {srv, indexed ? on_indexed : NULL, reclaimed ? on_reclaimed : NULL};
  engine_set_tier_hooks(srv->eng, indexed || reclaimed ? &h : NULL);
}

/* ---- deadlines ------------------------------------------------------------------- */

static void unlist(server_t *srv, tier_wait_t *w) {
  if (!w->listed) return;
  if (w->prev) w->prev->next = w->next;
  else srv->tiers->waiting = w->next;
  if (w->next) w->next->prev = w->prev;
  w->prev = w->next = NULL;
  w->listed = false;
}

static void on_deadline(uv_timer_t *t);

/* The timer at the earliest deadline of the walks waiting, or stopped. */
static void arm(server_t *srv) {
  tiers_t *ts = srv->tiers;
  uint64_t next = UINT64_MAX, now = uv_now(srv->loop);
  for (tier_wait_t *w = ts->waiting; w; w = w->next)
    if (w->pending && w->deadline_ms < next) next = w->deadline_ms;
  if (next == UINT64_MAX) uv_timer_stop(&ts->timer);
  else uv_timer_start(&ts->timer, on_deadline, next > now ? next - now : 0, 0);
}

/* A lookup past its deadline is let go (the tier's forget: it calls no
 * tiers_done after it), counted as its tier's timeout, and its request runs
 * again without it (tiers_done: the connection is scheduled, not run here). */
static void on_deadline(uv_timer_t *t) {
  server_t *srv = t->data;
  tiers_t *ts = srv->tiers;
  uint64_t now = uv_now(srv->loop);
  for (tier_wait_t *w = ts->waiting, *next; w; w = next) {
    next = w->next;
    if (w->pending && w->deadline_ms > now) continue;
    unlist(srv, w);
    for (unsigned i = 0; i < NTIERS; i++) {
      if (!(w->pending & (1u << i))) continue;
      if (tiers[i]->forget) tiers[i]->forget(srv, w, i);
      ts->timeouts[i]++;
      LOG_DEBUG("tier_timeout", "tier=%s conn=%llu", tiers[i]->name,
                (unsigned long long)w->conn_id);
      tiers_done(srv, w->conn_id, i);
    }
  }
  arm(srv);
}

static void on_timer_closed(uv_handle_t *h) { free((tiers_t *)(void *)h); /* timer is first */ }

/* ---- life ------------------------------------------------------------------------ */

int tiers_open(server_t *srv, char *err, size_t errlen) {
  if (!srv->tiers) {
    if (!(srv->tiers = calloc(1, sizeof *srv->tiers))) {
      snprintf(err, errlen, "tiers: out of memory");
      return -1;
    }
    uv_timer_init(srv->loop, &srv->tiers->timer);
    srv->tiers->timer.data = srv;
  }
  for (unsigned i = 0; i < NTIERS; i++)
    if (tiers[i]->open && tiers[i]->open(srv, err, errlen) != 0) return -1;
  hook(srv);
  return 0;
}

void tiers_drain(server_t *srv) {
  for (unsigned i = 0; i < NTIERS; i++)
    if (tiers[i]->drain && on(srv, i)) tiers[i]->drain(srv);
}

void tiers_stop(server_t *srv) {
  for (unsigned i = 0; i < NTIERS; i++)
    if (tiers[i]->stop && on(srv, i)) tiers[i]->stop(srv);
  hook(srv); /* a stopped tier hears of no more pages */
  tiers_t *ts = srv->tiers;
  if (!ts) return;
  while (ts->waiting) unlist(srv, ts->waiting); /* their requests run without deadlines */
  srv->tiers = NULL;
  uv_close((uv_handle_t *)&ts->timer, on_timer_closed);
}

void tiers_close(server_t *srv, bool clean) {
  if (srv->tiers) { /* never stopped: the loop's last run finishes the close */
    uv_close((uv_handle_t *)&srv->tiers->timer, on_timer_closed);
    srv->tiers = NULL;
  }
  engine_set_tier_hooks(srv->eng, NULL);
  for (unsigned i = 0; i < NTIERS; i++)
    if (tiers[i]->close) tiers[i]->close(srv, clean);
}

void tiers_reload(server_t *srv) {
  for (unsigned i = 0; i < NTIERS; i++)
    if (tiers[i]->reload && on(srv, i)) tiers[i]->reload(srv);
}

void tiers_tick(server_t *srv) {
  for (unsigned i = 0; i < NTIERS; i++)
    if (tiers[i]->tick && on(srv, i)) tiers[i]->tick(srv);
}

/* ---- lookup: the chain, and the one wait --------------------------------------------- */

int tiers_lookup(server_t *srv, tier_wait_t *w, const tier_query_t *q0) {
  tier_query_t q = *q0;
  q.deadline_ms = uv_now(srv->loop) + srv->cfg.tier_lookup_timeout_ms;
  if (srv->tiers) unlist(srv, w); /* it runs: it waits no more */
  for (unsigned i = 0; i < NTIERS; i++) {
    uint32_t bit = 1u << i;
    if (w->tried & bit) { /* asked: what it holds goes in now, before the next is asked */
      if (w->held[i] && tiers[i]->import) tiers[i]->import(srv, w, i, &q);
      continue;
    }
    if (!tiers[i]->lookup || !on(srv, i)) continue;
    w->tried |= bit;
    if (tiers[i]->lookup(srv, w, i, &q) == TIER_WAIT) {
      w->pending |= bit;
      w->deadline_ms = q.deadline_ms;
      if (srv->tiers) {
        w->prev = NULL;
        w->next = srv->tiers->waiting;
        if (w->next) w->next->prev = w;
        srv->tiers->waiting = w;
        w->listed = true;
        arm(srv);
      }
      return TIER_WAIT;
    }
  }
  return TIER_RUN;
}

void tiers_end(server_t *srv, tier_wait_t *w) {
  if (srv->tiers) unlist(srv, w);
  for (unsigned i = 0; i < NTIERS; i++)
    if ((w->held[i] || (w->pending & (1u << i))) && tiers[i]->forget) tiers[i]->forget(srv, w, i);
  uint64_t id = w->conn_id;
  memset(w, 0, sizeof *w);
  w->conn_id = id;
}

/* ---- stats ------------------------------------------------------------------------- */

size_t tiers_views(server_t *srv, arena_t *a, const tier_view_t **out, size_t cap) {
  size_t n = 0;
  for (unsigned i = 0; i < NTIERS && n < cap; i++) {
    const tier_view_t *v = tiers[i]->view && on(srv, i) ? tiers[i]->view(srv, a) : NULL;
    uint64_t late = srv->tiers ? srv->tiers->timeouts[i] : 0;
    tier_view_t *cv = v && late ? arena_alloc(a, sizeof *cv) : NULL;
    tier_stats_t *st = cv ? arena_alloc(a, sizeof *st) : NULL;
    if (st) { /* the tier's figures, and the lookups let go here at their deadline */
      *st = *v->st;
      st->errors[TIER_ERR_timeout] += late;
      *cv = *v;
      cv->st = st;
      v = cv;
    }
    if (v) out[n++] = v;
  }
  return n;
}
