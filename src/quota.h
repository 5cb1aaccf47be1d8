/* quota.h: per-tenant limits, usage and refusals (quota.c): what a tenant's
 * caches hold, counted where it changes, and the checks that refuse a call
 * before anything changes. */
#ifndef KVC_QUOTA_H
#define KVC_QUOTA_H

#include "core.h"

/* The record of tenant, or NULL if the engine never saw it. */
quota_t *quota_find(const engine_t *eng, uint32_t tenant);
/* The record of tenant, created if new: 0 or KVC_E_NOMEM (nothing kept). */
int quota_open(engine_t *eng, uint32_t tenant, quota_t **out);
/* The limits in force for q: its own, or the default. */
const engine_tenant_limits_t *quota_lim(const engine_t *eng, const quota_t *q);
/* Frees every record (the engine is going away). */
void quota_free_all(engine_t *eng);

/* A page allocated for a sequence of q's tenant, and one freed. */
void quota_page_alloc(engine_t *eng, uint32_t page, quota_t *q);
void quota_page_free(engine_t *eng, uint32_t page);
/* The tenant page counts against (only for a page in use). */
static inline quota_t *quota_of_page(const engine_t *eng, uint32_t page) {
  return eng->quotas[eng->page_quota[page]];
}

/* Checks a call that adds `more` of something to q's tenant: 0, or the
 * quota's code recorded with a message naming the limit and the refusal
 * counted. */
int quota_check_seqs(engine_t *eng, quota_t *q, uint64_t more);
int quota_check_caches(engine_t *eng, quota_t *q);
/* Pinned plus leased bytes: more pages of stride bytes; also the pool's pin
 * limit (KVC_E_PINLIMIT) when pool is set (pages that become pinned, not
 * leased ones). */
int quota_check_pins(engine_t *eng, quota_t *q, uint64_t more, uint64_t stride, bool pool);
/* How far a call that allocates need bytes would put q's tenant past its
 * share (0: within). */
uint64_t quota_bytes_over(const engine_t *eng, const quota_t *q, uint64_t need);
/* The refusal of a share that the tenant's own victims cannot meet: need
 * and freeable in pages of stride bytes. */
int quota_fail_pages(engine_t *eng, quota_t *q, uint64_t need, uint64_t freeable,
                     uint64_t stride);

#endif
