/* poolown.c: who may read each segment of the pool, and fresh memory for a
 * segment that passes to another owner (poolown.h). */
#include "poolown.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conn.h"
#include "log.h"
#include "tenant.h"

#define NONE ENGINE_OWNER_NONE

bool poolown_arenas(const server_t *srv) { return srv->pool.seg_bytes != 0; }

/* The owner whose bytes segment s's memory may hold. */
static uint64_t *mem_owner(server_t *srv, uint32_t s) { return &srv->seg_mem_owner[s]; }

/* Charges every client still mapping segment s as memfd `id` its bytes:
 * the memory stays theirs until they map the pool again. */
static void revoke_mapped(server_t *srv, uint32_t s, uint64_t id, uint64_t bytes) {
  for (conn_t *c = srv->conns; c; c = c->next) {
    if (s >= c->nmapped || c->mapped[s] != id) continue;
    c->mapped[s] = 0;
    c->revoked_bytes += bytes;
    srv->stats.pool_revoked_bytes += bytes;
  }
}

static void on_segment(void *ctx, uint32_t s, uint64_t from, uint64_t to) {
  server_t *srv = ctx;
  (void)from; /* the memory's owner is what counts: a free segment keeps bytes */
  uint64_t *mo = mem_owner(srv, s);
  if (*mo != NONE && *mo != to) {
    uint64_t old = srv->pool.seg[s].id, bytes = srv->pool.seg[s].bytes;
    char err[256];
    if (poolmap_refresh(&srv->pool, s, err, sizeof err) != 0) {
      /* The memory of another owner cannot be given: stopping is the only
       * way to keep tenants apart (its old readers would see the new
       * owner's writes). */
      LOG_ERROR("pool_segment", "segment=%u error=\"%s\" action=\"exit: a segment passing to "
                "another tenant must get fresh memory\"", s, err);
      exit(70);
    }
    srv->stats.pool_segment_refreshes++;
    revoke_mapped(srv, s, old, bytes);
  }
  *mo = to;
  srv->pool.gen++; /* who may map what changed: clients map again */
}

void poolown_init(server_t *srv) {
  for (uint32_t s = 0; s < POOLMAP_SEGMENTS_MAX; s++) srv->seg_mem_owner[s] = NONE;
  if (poolown_arenas(srv)) engine_set_segment_hook(srv->eng, on_segment, srv);
}

uint32_t poolown_group(server_t *srv, const char *name) {
  for (uint32_t i = 0; i < srv->ngroups; i++)
    if (strcmp(srv->groups[i], name) == 0) return i + 1;
  if (srv->ngroups == srv->groups_cap) {
    uint32_t cap = srv->groups_cap ? srv->groups_cap * 2 : 8;
    void *p = realloc(srv->groups, (size_t)cap * sizeof *srv->groups);
    if (!p) return 0;
    srv->groups = p;
    srv->groups_cap = cap;
  }
  snprintf(srv->groups[srv->ngroups], sizeof srv->groups[0], "%s", name);
  return ++srv->ngroups;
}

bool poolown_may_read(const conn_t *c, uint32_t s) {
  uint16_t a = engine_segment_arena(c->srv->eng, s);
  if (a == ENGINE_NOARENA) return false; /* free: what it holds is nobody's to read */
  if (c->admin) return true;
  engine_arena_info_t ai;
  if (engine_arena_by_id(c->srv->eng, a, &ai) != 0) return false;
  if (ai.group == 0) return ai.tenant == c->tenant;
  if (ai.tenant != TENANT_SHARED || ai.group > c->srv->ngroups) return false;
  const config_t *cfg = &c->srv->cfg;
  return tenant_shared_right(cfg->shared_rules, cfg->n_shared_rules, c->srv->groups[ai.group - 1],
                             tenants_name(&c->srv->tenants, c->tenant)) != RIGHT_NONE;
}

size_t poolown_arena_rows(server_t *srv, const conn_t *c, arena_t *a, metrics_arena_t **out) {
  size_t n = 0;
  engine_arenas(srv->eng, NULL, 0, &n);
  engine_arena_info_t *ai = n ? malloc(n * sizeof *ai) : NULL;
  metrics_arena_t *rows = n ? arena_alloc(a, n * sizeof *rows) : NULL;
  size_t k = 0;
  *out = rows;
  if (!ai || !rows) {
    free(ai);
    return 0;
  }
  engine_arenas(srv->eng, ai, n, &n);
  const config_t *cfg = &srv->cfg;
  for (size_t i = 0; i < n; i++) {
    bool see = !c || c->admin || (ai[i].group == 0 && ai[i].tenant == c->tenant) ||
               (ai[i].group && ai[i].group <= srv->ngroups &&
                tenant_shared_right(cfg->shared_rules, cfg->n_shared_rules,
                                    srv->groups[ai[i].group - 1],
                                    tenants_name(&srv->tenants, c->tenant)) != RIGHT_NONE);
    if (!see) continue;
    char *pb = arena_alloc(a, 24);
    if (!pb) break;
    snprintf(pb, 24, "%llu", (unsigned long long)ai[i].page_bytes);
    rows[k++] = (metrics_arena_t){tenants_name(&srv->tenants, ai[i].tenant), pb, ai[i].segments,
                                  ai[i].pages_used, ai[i].pages_free, ai[i].padding_bytes,
                                  ai[i].segs_taken, ai[i].segs_given};
  }
  free(ai);
  return k;
}

int poolown_mapped(conn_t *c, uint32_t s, uint64_t id) {
  if (s >= c->nmapped) {
    uint32_t n = c->srv->pool.nseg > s ? c->srv->pool.nseg : s + 1;
    uint64_t *m = realloc(c->mapped, (size_t)n * sizeof *m);
    if (!m) return -1;
    memset(m + c->nmapped, 0, (size_t)(n - c->nmapped) * sizeof *m);
    c->mapped = m;
    c->nmapped = n;
  }
  c->mapped[s] = id;
  return 0;
}

void poolown_remapped(conn_t *c) {
  c->srv->stats.pool_revoked_bytes -= c->revoked_bytes;
  c->revoked_bytes = 0;
  if (c->mapped) memset(c->mapped, 0, (size_t)c->nmapped * sizeof *c->mapped);
}

void poolown_conn_free(conn_t *c) {
  poolown_remapped(c);
  free(c->mapped);
  c->mapped = NULL;
  c->nmapped = 0;
}
