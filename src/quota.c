/* quota.c: per-tenant limits, usage and refusals.
 *
 *   eng->quota_map: tenant -> quota_t      eng->quotas[idx]: the same records
 *   page_quota[page] = idx                 the tenant a page counts against
 *
 * A record is made when a tenant opens its first cache (or gets limits of
 * its own) and lives as long as the engine: it holds the refusal counters,
 * and a daemon has a bounded number of tenants. Usage is counted where it
 * changes (page.c for pages and pins, seq.c for sequences, lease.c, engine.c
 * for caches, prefix.c for keys); the audit recomputes it.
 */
#include "quota.h"
#include "rank.h"
#include "units.h"

#include <string.h>

quota_t *quota_find(const engine_t *eng, uint32_t tenant) {
  return hmap_get(&eng->quota_map, tenant);
}

int quota_open(engine_t *eng, uint32_t tenant, quota_t **out) {
  quota_t *q = quota_find(eng, tenant);
  if (q) {
    *out = q;
    return 0;
  }
  size_t map_cap = eng->quota_map.cap;
  q = mem_calloc(&eng->mem, 1, sizeof *q);
  /* page_quota holds an idx in 16 bits: 2 B a page (the metadata budget) */
  if (eng->nquotas > UINT16_MAX || !q || hmap_reserve(&eng->quota_map, &eng->mem, 1) ||
      rank_init(eng, q))
    goto fail;
  if (eng->nquotas == eng->quotas_cap) {
    uint32_t cap = eng->quotas_cap ? eng->quotas_cap * 2 : 8;
    quota_t **v = mem_realloc(&eng->mem, eng->quotas, cap * sizeof *v);
    if (!v) goto fail;
    eng->quotas = v;
    eng->quotas_cap = cap;
  }
  q->tenant = tenant;
  memcpy(q->ident, &tenant, sizeof tenant); /* until engine_tenant_identity */
  q->idx = eng->nquotas;
  eng->quotas[eng->nquotas++] = q;
  hmap_insert(&eng->quota_map, tenant, q);
  *out = q;
  return 0;
fail: /* nothing kept */
  if (q) rank_deinit(eng, q);
  mem_free(&eng->mem, q);
  (void)hmap_resize(&eng->quota_map, &eng->mem, map_cap);
  return KVC_E_NOMEM;
}

const engine_tenant_limits_t *quota_lim(const engine_t *eng, const quota_t *q) {
  return q->own ? &q->lim : &eng->quota_default;
}

void quota_free_all(engine_t *eng) {
  for (uint32_t i = 0; i < eng->nquotas; i++) {
    rank_deinit(eng, eng->quotas[i]);
    mem_free(&eng->mem, eng->quotas[i]);
  }
  mem_free(&eng->mem, eng->quotas);
  eng->quotas = NULL;
  eng->nquotas = eng->quotas_cap = 0;
  hmap_deinit(&eng->quota_map, &eng->mem);
}

void quota_page_alloc(engine_t *eng, uint32_t page, quota_t *q) {
  eng->page_quota[page] = (uint16_t)q->idx;
  q->use.pages++;
  q->use.bytes += pool_page_stride(&eng->pool, page);
}

void quota_page_free(engine_t *eng, uint32_t page) {
  quota_t *q = quota_of_page(eng, page);
  q->use.pages--;
  q->use.bytes -= pool_page_stride(&eng->pool, page);
}

int quota_check_seqs(engine_t *eng, quota_t *q, uint64_t more) {
  uint64_t max = quota_lim(eng, q)->max_seqs;
  if (!max || q->use.seqs + more <= max) return 0;
  q->use.refused_seqs++;
  return engine_fail(eng, KVC_E_QUOTA_SEQS,
                     "tenant_max_seqs: the tenant holds %llu sequences, the quota is %llu",
                     (unsigned long long)q->use.seqs, (unsigned long long)max);
}

int quota_check_caches(engine_t *eng, quota_t *q) {
  uint32_t max = quota_lim(eng, q)->max_caches;
  if (!max || q->use.caches < max) return 0;
  q->use.refused_caches++;
  return engine_fail(eng, KVC_E_QUOTA_CACHES,
                     "tenant_max_caches: the tenant holds %u caches, the quota is %u",
                     q->use.caches, max);
}

int quota_check_pins(engine_t *eng, quota_t *q, uint64_t more, uint64_t stride, bool pool) {
  uint64_t bytes = more * stride, total = (uint64_t)eng->pool.nseg * eng->pool.seg_bytes;
  char a[UNITS_LEN], b[UNITS_LEN], c[UNITS_LEN], d[UNITS_LEN];
  if (pool && eng->pool.pinned_bytes + bytes > eng->pin_limit) {
    eng->st.pin_limit_errors++;
    return engine_fail(eng, KVC_E_PINLIMIT,
                       "pinning %llu more pages (%s) would pin %s of the pool's %s; the limit "
                       "is %s", (unsigned long long)more, units_bytes(bytes, a, sizeof a),
                       units_bytes(eng->pool.pinned_bytes + bytes, b, sizeof b),
                       units_bytes(total, c, sizeof c), units_bytes(eng->pin_limit, d, sizeof d));
  }
  uint64_t max = quota_lim(eng, q)->max_pinned_bytes;
  /* Fair by default: a tenant without a limit of its own pins at most its
   * share of the pin limit, split between the tenants with caches and one
   * more (room for the next tenant's first pins). */
  uint64_t share = 0;
  if (!max && eng->pin_share && pool) {
    uint64_t n = 1;
    for (uint32_t i = 0; i < eng->nquotas; i++)
      n += eng->quotas[i] != q && eng->quotas[i]->use.caches > 0;
    max = share = eng->pin_limit / (n + 1);
    if (!max) max = 1;
  } else if (!max && eng->pin_share) {
    max = eng->pin_limit; /* a lease: pinned plus leased within the pool's pin limit */
  }
  /* A quota of the whole pool limits nothing: a write that cannot fit is FULL. */
  if (!max || max >= total || q->use.pinned_bytes + q->use.leased_bytes + bytes <= max) return 0;
  q->use.refused_pins++;
  return engine_fail(eng, KVC_E_QUOTA_PINS,
                     "%s: the tenant pins %s and leases %s, %s more would pass %s %s",
                     share ? "its share of the pin limit" : "tenant_max_pinned",
                     units_bytes(q->use.pinned_bytes, a, sizeof a),
                     units_bytes(q->use.leased_bytes, b, sizeof b),
                     units_bytes(bytes, c, sizeof c),
                     share ? "the share (pin limit / (tenants with caches + 1)) of"
                           : "the quota of",
                     units_bytes(max, d, sizeof d));
}

uint64_t quota_bytes_over(const engine_t *eng, const quota_t *q, uint64_t need) {
  uint64_t max = quota_lim(eng, q)->max_bytes;
  if (!max || q->use.bytes + need <= max) return 0;
  return q->use.bytes + need - max;
}

int quota_fail_pages(engine_t *eng, quota_t *q, uint64_t need, uint64_t freeable,
                     uint64_t stride) {
  q->use.refused_pages++;
  char a[UNITS_LEN], b[UNITS_LEN], c[UNITS_LEN], d[UNITS_LEN];
  int rc = engine_fail(eng, KVC_E_QUOTA_PAGES,
                       "tenant_max_pages: the tenant holds %s and needs %s more, past its "
                       "share of %s under pressure; %s free or reclaimable of its own",
                       units_bytes(q->use.bytes, a, sizeof a),
                       units_bytes(need * stride, b, sizeof b),
                       units_bytes(quota_lim(eng, q)->max_bytes, c, sizeof c),
                       units_bytes(freeable * stride, d, sizeof d));
  eng->err.needed = need;
  eng->err.freeable = freeable;
  return rc;
}

int engine_tenant_limits_set(engine_t *eng, uint32_t tenant,
                             const engine_tenant_limits_t *lim) {
  if (!eng) return KVC_E_INVAL;
  if (tenant == ENGINE_TENANT_DEFAULT) {
    if (!lim) return engine_fail(eng, KVC_E_INVAL, "NULL default limits");
    eng->quota_default = *lim;
    return 0;
  }
  quota_t *q;
  if (quota_open(eng, tenant, &q)) return engine_fail(eng, KVC_E_NOMEM, "out of memory");
  q->own = lim != NULL;
  if (lim) q->lim = *lim;
  return 0;
}

int engine_tenant_usage(engine_t *eng, uint32_t tenant, engine_tenant_limits_t *lim,
                        engine_tenant_usage_t *use) {
  if (!eng) return KVC_E_INVAL;
  const quota_t *q = quota_find(eng, tenant);
  if (lim) *lim = q ? *quota_lim(eng, q) : eng->quota_default;
  if (use) *use = q ? q->use : (engine_tenant_usage_t){0};
  return 0;
}
