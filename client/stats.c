/* stats.c: fetching the daemon's figures into one caller-owned block. */
#include "client.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"

KVC_API int kvc_stats(kvc_client_t *c, kvc_stat_t **out, size_t *n) {
  if (!c) return KVC_E_INVAL;
  if (!out || !n) return client_fail(c, KVC_E_INVAL, "kvc_stats: out and n are required");
  *out = NULL;
  *n = 0;
  Kvcache__V1__StatsRequest sr = KVCACHE__V1__STATS_REQUEST__INIT;
  Kvcache__V1__Request req = KVCACHE__V1__REQUEST__INIT;
  req.body_case = KVCACHE__V1__REQUEST__BODY_STATS;
  req.stats = &sr;
  Kvcache__V1__Response *r;
  int rc = client_call(c, &req, &r);
  if (rc) return rc;
  const Kvcache__V1__StatsReply *s =
      r->body_case == KVCACHE__V1__RESPONSE__BODY_STATS ? r->stats : NULL;
  size_t count = s ? s->n_stats : 0, bytes = (count + 1) * sizeof(kvc_stat_t);
  for (size_t i = 0; i < count; i++) {
    const Kvcache__V1__Stat *st = s->stats[i];
    bytes += strlen(st->name) + strlen(st->help) + strlen(st->cache) + strlen(st->tenant) + 4;
  }
  /* One block: the array, then every string. */
  kvc_stat_t *arr = malloc(bytes);
  if (!arr) {
    kvcache__v1__response__free_unpacked(r, NULL);
    return client_fail(c, KVC_E_NOMEM, "out of memory");
  }
  char *p = (char *)(arr + count + 1);
  for (size_t i = 0; i < count; i++) {
    kvc_stat_t st;
    codec_stat_from_wire(s->stats[i], &st);
    const char *src[4] = {st.name, st.help, st.cache, st.tenant};
    const char *dst[4];
    for (int j = 0; j < 4; j++) {
      size_t len = strlen(src[j]) + 1;
      memcpy(p, src[j], len);
      dst[j] = p;
      p += len;
    }
    arr[i] = (kvc_stat_t){.name = dst[0], .value = st.value, .gauge = st.gauge,
                          .help = dst[1], .cache = dst[2], .tenant = dst[3]};
  }
  arr[count] = (kvc_stat_t){0};
  kvcache__v1__response__free_unpacked(r, NULL);
  *out = arr;
  *n = count;
  return 0;
}

KVC_API void kvc_stats_free(kvc_stat_t *stats) { free(stats); }

KVC_API int kvc_tenants(kvc_client_t *c, kvc_tenant_info_t **out, size_t *n) {
  if (!c) return KVC_E_INVAL;
  if (!out || !n) return client_fail(c, KVC_E_INVAL, "kvc_tenants: out and n are required");
  *out = NULL;
  *n = 0;
  Kvcache__V1__Empty e = KVCACHE__V1__EMPTY__INIT;
  Kvcache__V1__Request req = KVCACHE__V1__REQUEST__INIT;
  req.body_case = KVCACHE__V1__REQUEST__BODY_TENANTS;
  req.tenants = &e;
  Kvcache__V1__Response *r;
  int rc = client_call(c, &req, &r);
  if (rc) return rc;
  const Kvcache__V1__TenantsReply *t =
      r->body_case == KVCACHE__V1__RESPONSE__BODY_TENANTS ? r->tenants : NULL;
  size_t count = t ? t->n_tenants : 0;
  kvc_tenant_info_t *arr = calloc(count + 1, sizeof *arr);
  if (!arr) {
    kvcache__v1__response__free_unpacked(r, NULL);
    return client_fail(c, KVC_E_NOMEM, "out of memory");
  }
  for (size_t i = 0; i < count; i++) {
    const Kvcache__V1__TenantInfo *w = t->tenants[i];
    snprintf(arr[i].name, sizeof arr[i].name, "%s", w->name ? w->name : "");
    arr[i].connections = w->connections;
    arr[i].caches = w->caches;
    arr[i].sequences = w->sequences;
    arr[i].tokens = w->tokens;
    arr[i].pages = w->pages;
    arr[i].pool_pages = w->pool_pages;
    arr[i].max_pages = w->max_pages;
    arr[i].pinned_pages = w->pinned_pages;
    arr[i].leased_pages = w->leased_pages;
    arr[i].max_pinned = w->max_pinned;
    arr[i].max_sequences = w->max_sequences;
    arr[i].max_caches = w->max_caches;
    arr[i].keys = w->keys;
    arr[i].max_keys = w->max_keys;
    arr[i].max_connections_per_uid = w->max_connections_per_uid;
    arr[i].shm_bytes = w->shm_bytes;
    arr[i].shm_bytes_per_uid = w->shm_bytes_per_uid;
    arr[i].refused_pages = w->refused_pages;
    arr[i].refused_pins = w->refused_pins;
    arr[i].refused_sequences = w->refused_sequences;
    arr[i].refused_caches = w->refused_caches;
    arr[i].refused_keys = w->refused_keys;
    arr[i].refused_connections = w->refused_connections;
    arr[i].refused_shm = w->refused_shm;
  }
  kvcache__v1__response__free_unpacked(r, NULL);
  *out = arr;
  *n = count;
  return 0;
}

KVC_API void kvc_tenants_free(kvc_tenant_info_t *tenants) { free(tenants); }
