/* stats.c: fetching the daemon's figures into one caller-owned block, and
 * rendering them as Prometheus text (proto/promtext.c, the daemon's too). */
#include "client.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"
#include "promtext.h"

KVC_API int kvc_stats(kvc_client_t *c, kvc_stat_t **out, size_t *n) {
  return kvc_stats_query(c, NULL, out, n);
}

KVC_API int kvc_stats_query(kvc_client_t *c, const kvc_stats_opts_t *opts, kvc_stat_t **out,
                            size_t *n) {
  if (!c) return KVC_E_INVAL;
  if (!out || !n) return client_fail(c, KVC_E_INVAL, "kvc_stats: out and n are required");
  *out = NULL;
  *n = 0;
  Kvcache__V1__StatsRequest sr = KVCACHE__V1__STATS_REQUEST__INIT;
  if (opts) {
    const char *name = opts->cache ? opts->cache : "";
    if (name[0] && opts->top)
      return client_fail(c, KVC_E_INVAL, "kvc_stats_query: name a cache or ask for the top "
                         "caches, not both");
    if (opts->node_only && (name[0] || opts->top))
      return client_fail(c, KVC_E_INVAL, "kvc_stats_query: node_only asks for no cache's "
                         "figures, neither a cache by name nor the top caches");
    if (strlen(name) > KVC_MAX_NAME)
      return client_fail(c, KVC_E_NAME, "a cache name is at most %u bytes", KVC_MAX_NAME);
    sr.cache = (char *)name;
    sr.top = opts->top;
    sr.node_only = opts->node_only;
  }
  Kvcache__V1__Request req = KVCACHE__V1__REQUEST__INIT;
  req.body_case = KVCACHE__V1__REQUEST__BODY_STATS;
  req.stats = &sr;
  Kvcache__V1__Response *r;
  int rc = client_call(c, &req, &r);
  if (rc) return rc;
  const Kvcache__V1__StatsReply *s =
      r->body_case == KVCACHE__V1__RESPONSE__BODY_STATS ? r->stats : NULL;
  size_t count = s ? s->n_stats : 0, nlabels = 0, nbuckets = 0, strbytes = 0;
  for (size_t i = 0; i < count; i++) {
    const Kvcache__V1__Stat *st = s->stats[i];
    strbytes += strlen(st->name) + strlen(st->help) + strlen(st->cache) + strlen(st->unit) + 4;
    for (size_t j = 0; j < st->n_labels; j++)
      strbytes += strlen(st->labels[j]->key) + strlen(st->labels[j]->value) + 2;
    nlabels += st->n_labels;
    nbuckets += st->n_bucket_le < st->n_bucket_count ? st->n_bucket_le : st->n_bucket_count;
  }
  /* One block: the array, the bucket bounds and counts, the labels, then
   * every string (in that order, each part aligned for its type). */
  size_t bytes = (count + 1) * sizeof(kvc_stat_t) + nbuckets * (sizeof(double) + sizeof(uint64_t)) +
                 nlabels * sizeof(kvc_label_t) + strbytes;
  kvc_stat_t *arr = malloc(bytes);
  if (!arr) {
    kvcache__v1__response__free_unpacked(r, NULL);
    return client_fail(c, KVC_E_NOMEM, "out of memory");
  }
  double *les = (double *)(void *)(arr + count + 1);
  uint64_t *cnts = (uint64_t *)(void *)(les + nbuckets);
  kvc_label_t *labs = (kvc_label_t *)(void *)(cnts + nbuckets);
  char *p = (char *)(labs + nlabels);
#define COPY_STR_(dst, src)                                                    \
  do {                                                                         \
    size_t len_ = strlen(src) + 1;                                             \
    memcpy(p, (src), len_);                                                    \
    (dst) = p;                                                                 \
    p += len_;                                                                 \
  } while (0)
  for (size_t i = 0; i < count; i++) {
    kvc_stat_t st;
    codec_stat_from_wire(s->stats[i], &st, labs);
    for (size_t j = 0; j < st.nlabels; j++) {
      COPY_STR_(labs[j].key, st.labels[j].key);
      COPY_STR_(labs[j].value, st.labels[j].value);
    }
    labs += st.nlabels;
    if (st.nbuckets) {
      memcpy(les, st.bucket_le, st.nbuckets * sizeof *les);
      memcpy(cnts, st.bucket_count, st.nbuckets * sizeof *cnts);
      st.bucket_le = les;
      st.bucket_count = cnts;
      les += st.nbuckets;
      cnts += st.nbuckets;
    } else {
      st.bucket_le = NULL;
      st.bucket_count = NULL;
    }
    COPY_STR_(st.name, st.name);
    COPY_STR_(st.help, st.help);
    COPY_STR_(st.cache, st.cache);
    COPY_STR_(st.unit, st.unit);
    arr[i] = st;
  }
#undef COPY_STR_
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
    arr[i].pool_bytes = w->pool_bytes;
    arr[i].max_bytes = w->max_bytes;
    arr[i].min_bytes = w->min_bytes;
    arr[i].pinned_bytes = w->pinned_bytes;
    arr[i].leased_bytes = w->leased_bytes;
    arr[i].max_pinned_bytes = w->max_pinned_bytes;
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

KVC_API const char *kvc_stat_label(const kvc_stat_t *st, const char *key) {
  if (!st || !key) return NULL;
  if (strcmp(key, "cache") == 0) return st->cache && st->cache[0] ? st->cache : NULL;
  for (size_t i = 0; i < st->nlabels; i++)
    if (strcmp(st->labels[i].key, key) == 0) return st->labels[i].value;
  return NULL;
}

KVC_API int kvc_stats_prometheus(const kvc_stat_t *stats, size_t n, char **out, size_t *len) {
  if (!out || (n && !stats)) return KVC_E_INVAL;
  return promtext_render(stats, n, out, len);
}
