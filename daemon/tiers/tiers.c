/* tiers.c: the list of tiers, in the chain's order, and what the daemon
 * calls of them (tier.h). Adding a tier is its own file and one line here. */
#include "tier.h"

#include <string.h>

#include "server.h"

static const tier_ops_t *const tiers[] = {
    &tier_disk,    /* tier_dir: doc/tiers.md */
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

/* ---- life ------------------------------------------------------------------------ */

int tiers_open(server_t *srv, char *err, size_t errlen) {
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
}

void tiers_close(server_t *srv, bool clean) {
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

int tiers_lookup(server_t *srv, tier_wait_t *w, const tier_query_t *q) {
  for (unsigned i = 0; i < NTIERS; i++) {
    uint32_t bit = 1u << i;
    if (w->tried & bit) { /* asked: what it holds goes in now, before the next is asked */
      if (w->held[i] && tiers[i]->import) tiers[i]->import(srv, w, i, q);
      continue;
    }
    if (!tiers[i]->lookup || !on(srv, i)) continue;
    w->tried |= bit;
    if (tiers[i]->lookup(srv, w, i, q) == TIER_WAIT) {
      w->pending |= bit;
      return TIER_WAIT;
    }
  }
  return TIER_RUN;
}

void tiers_end(server_t *srv, tier_wait_t *w) {
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
    if (v) out[n++] = v;
  }
  return n;
}
