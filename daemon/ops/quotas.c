/* quotas.c: the daemon's half of the quotas. The engine counts and limits
 * what tenants hold in the pool (src/quota.c); here are the limits that are
 * about peers: connections and shared-buffer bytes per uid, the total of
 * shared buffers, and idle connections. Each refusal is counted for the
 * tenant of the peer it refused (kvcachectl tenants). */
#include "quotas.h"

#include <stdio.h>

#include "log.h"
#include "units.h"

int quotas_apply(server_t *srv) {
  const config_t *cfg = &srv->cfg;
  engine_stats_t st;
  engine_stats(srv->eng, &st);
  engine_tenant_limits_t lim = {
      .max_bytes = st.pool_bytes * cfg->tenant_max_pages_pct / 100,
      /* 0: fair by default, a share of the pin limit (engine_set_pin_share) */
      .max_pinned_bytes = st.pool_bytes * cfg->tenant_max_pinned_pct / 100,
      .max_seqs = cfg->tenant_max_seqs,
      .max_caches = cfg->tenant_max_caches,
      .max_keys = cfg->tenant_max_keys,
  };
  /* A percent of a small pool rounds to nothing: at least one byte. */
  if (!lim.max_bytes) lim.max_bytes = 1;
  if (cfg->tenant_max_pinned_pct && !lim.max_pinned_bytes) lim.max_pinned_bytes = 1;
  engine_set_pin_share(srv->eng, cfg->tenant_max_pinned_pct == 0);
  int rc = engine_set_pin_limit(srv->eng, cfg->pin_limit_pct);
  if (rc == 0) rc = engine_tenant_limits_set(srv->eng, ENGINE_TENANT_DEFAULT, &lim);
  /* Floors: the named tenants get the default limits and their floor; a
   * tenant whose floor a reload removed goes back to the default. */
  for (uint32_t i = 0; rc == 0 && i < srv->nfloored; i++)
    rc = engine_tenant_limits_set(srv->eng, srv->floored[i], NULL);
  srv->nfloored = 0;
  for (uint32_t i = 0; rc == 0 && i < cfg->n_floors; i++) {
    uint32_t id = server_tenant(srv, cfg->floors[i].tenant);
    if (!id) return KVC_E_NOMEM;
    engine_tenant_limits_t own = lim;
    own.min_bytes = st.pool_bytes * cfg->floors[i].pct / 100;
    if ((rc = engine_tenant_limits_set(srv->eng, id, &own)) == 0) srv->floored[srv->nfloored++] = id;
  }
  return rc;
}

static void count_refusal(server_t *srv, uint32_t tenant, uint64_t *per_tenant) {
  if (tenant <= TENANTS_MAX) per_tenant[tenant]++;
  (void)srv;
}

bool quotas_conn_over(server_t *srv, const conn_t *c, char *msg, size_t len) {
  uint32_t max = srv->cfg.max_connections_per_uid;
  if (!max || c->admin) return false;
  uint32_t n = 0;
  for (const conn_t *o = srv->conns; o; o = o->next) n += o != c && o->counted && o->uid == c->uid;
  if (n < max) return false;
  snprintf(msg, len, "max_connections_per_uid: uid %u has %u connections, the quota is %u",
           (unsigned)c->uid, n, max);
  count_refusal(srv, c->tenant, srv->refused_conns);
  return true;
}

bool quotas_shm_over(server_t *srv, const conn_t *c, uint64_t bytes, char *msg, size_t len) {
  uint64_t mine = 0, all = 0;
  for (const conn_t *o = srv->conns; o; o = o->next) {
    if (!o->shm.base) continue;
    all += o->shm.bytes;
    if (o->uid == c->uid) mine += o->shm.bytes + o->revoked_bytes;
  }
  char a[UNITS_LEN], b[UNITS_LEN], q[UNITS_LEN];
  units_bytes(bytes, b, sizeof b);
  if (mine + bytes > srv->cfg.shm_bytes_per_uid)
    snprintf(msg, len, "shm_bytes_per_uid: uid %u holds %s of shared buffers (and pool "
             "segments revoked but still mapped), %s more would pass the quota of %s",
             (unsigned)c->uid, units_bytes(mine, a, sizeof a), b,
             units_bytes(srv->cfg.shm_bytes_per_uid, q, sizeof q));
  else if (all + bytes > srv->cfg.shm_bytes_total)
    snprintf(msg, len, "shm_bytes_total: connections hold %s of shared buffers, %s more would "
             "pass the quota of %s", units_bytes(all, a, sizeof a), b,
             units_bytes(srv->cfg.shm_bytes_total, q, sizeof q));
  else
    return false;
  count_refusal(srv, c->tenant, srv->refused_shm);
  return true;
}

void quotas_touch(conn_t *c) { c->last_ms = uv_now(c->srv->loop); }

void quotas_row(server_t *srv, uint32_t tenant, Kvcache__V1__TenantInfo *row) {
  engine_tenant_limits_t lim;
  engine_tenant_usage_t u;
  (void)engine_tenant_usage(srv->eng, tenant, &lim, &u);
  row->pool_pages = u.pages;
  row->pool_bytes = u.bytes;
  row->max_bytes = lim.max_bytes;
  row->min_bytes = lim.min_bytes;
  row->pinned_bytes = u.pinned_bytes;
  row->leased_bytes = u.leased_bytes;
  row->max_pinned_bytes = lim.max_pinned_bytes;
  row->max_sequences = lim.max_seqs;
  row->max_caches = lim.max_caches;
  row->keys = u.keys;
  row->max_keys = lim.max_keys;
  row->max_connections_per_uid = srv->cfg.max_connections_per_uid;
  row->shm_bytes_per_uid = srv->cfg.shm_bytes_per_uid;
  row->refused_pages = u.refused_pages;
  row->refused_pins = u.refused_pins;
  row->refused_sequences = u.refused_seqs;
  row->refused_caches = u.refused_caches;
  row->refused_keys = u.refused_keys;
  if (tenant <= TENANTS_MAX) {
    row->refused_connections = srv->refused_conns[tenant];
    row->refused_shm = srv->refused_shm[tenant];
  }
}

size_t quotas_refusals(server_t *srv, uint32_t viewer_tenant, bool all, arena_t *a,
                       metrics_refusals_t **out) {
  uint32_t nt = srv->tenants.n + 1; /* ids 0 (shared) .. n */
  metrics_refusals_t *rows = arena_alloc(a, nt * sizeof *rows);
  if (!rows) return 0;
  size_t n = 0;
  for (uint32_t t = 0; t < nt; t++) {
    if (t != viewer_tenant && !all) continue;
    Kvcache__V1__TenantInfo ti = KVCACHE__V1__TENANT_INFO__INIT;
    quotas_row(srv, t, &ti);
    metrics_refusals_t r = {tenants_name(&srv->tenants, t),
                            {ti.refused_pages, ti.refused_pins, ti.refused_sequences,
                             ti.refused_caches, ti.refused_keys, ti.refused_connections,
                             ti.refused_shm}};
    uint64_t any = 0;
    for (int k = 0; k < METRICS_LIMITS; k++) any |= r.n[k];
    if (t == viewer_tenant || any) rows[n++] = r;
  }
  *out = rows;
  return n;
}
