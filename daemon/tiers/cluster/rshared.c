/* rshared.c: what the cluster tier's two paths (rlookup.c, rwrite.c) and
 * its life (remote.c) share, below all three: the names of a cache's pages
 * in the cluster (memoized), and the count of failed commands. */
#include <string.h>

#include "rtier.h"

const rvalue_cache_t *remote_cache(remote_t *r, uint32_t cache_id) {
  server_t *srv = r->srv;
  __typeof__(r->memo[0]) *m = &r->memo[cache_id % RTIER_MEMO];
  if (m->valid && m->cache_id == cache_id) return &m->rc;
  kvc_cache_info_t ci;
  uint32_t tenant;
  if (engine_cache_info(srv->eng, cache_id, &ci) != 0 ||
      engine_cache_tenant(srv->eng, cache_id, &tenant) != 0)
    return NULL;
  int64_t pb = engine_layout_page_bytes(&ci.layout);
  if (pb <= 0) return NULL;
  if (!ci.layout.page_tokens) ci.layout.page_tokens = KVC_DEFAULT_PAGE_TOKENS;
  uint8_t ident[32];
  rvalue_tenant_identity(tenant == TENANT_SHARED ? NULL : tenants_name(&srv->tenants, tenant),
                         ident);
  rvalue_cache_init(&m->rc, r->sec, ident, &ci.layout, (uint64_t)pb);
  m->cache_id = cache_id;
  m->valid = true;
  return &m->rc;
}

void remote_error(remote_t *r, enum rc_status st, const redisReply *reply) {
  static const enum tier_err by_status[RC_STATUSES_] = {
      [RC_OK] = TIER_ERR_server,        [RC_TIMEOUT] = TIER_ERR_timeout,
      [RC_CONN] = TIER_ERR_connection,  [RC_BREAKER] = TIER_ERR_breaker,
      [RC_NOROUTE] = TIER_ERR_noroute,  [RC_REDIRECTS] = TIER_ERR_redirects};
  enum tier_err k = (unsigned)st < RC_STATUSES_ ? by_status[st] : TIER_ERR_server;
  if (st == RC_OK && reply && reply->type == REDIS_REPLY_ERROR && reply->len >= 3 &&
      strncmp(reply->str, "OOM", 3) == 0)
    k = TIER_ERR_oom;
  r->st.errors[k]++;
}
