/* lease.c: zero-copy reads: leasing a token range and reading it in place in
 * the read-only pool mapping. */
#include "client.h"

#include <stdlib.h>
#include <string.h>

struct kvc_lease {
  kvc_client_t *client;
  kvc_lease_t *prev, *next; /* the client's list */
  uint32_t cap;             /* pages the handle has room for */
  uint32_t num_layers;
  kvc_lease_info_t info;
  int32_t *block_table;     /* info.block_table: after pages[] */
  const void *pages[];      /* info.pages points here */
};

static void unlink_lease(kvc_lease_t *l) {
  kvc_client_t *c = l->client;
  if (l->prev) l->prev->next = l->next;
  else c->leases = l->next;
  if (l->next) l->next->prev = l->prev;
}

void client_leases_free(kvc_client_t *c) {
  while (c->leases) {
    kvc_lease_t *l = c->leases;
    unlink_lease(l);
    free(l);
  }
  free(c->lease_spare);
  c->lease_spare = NULL;
}

/* Handles of small leases (a read loop's: one a read) are kept for the next
 * one, one spare: a lease costs no allocation in a loop. */
#define SPARE_PAGES RINGFAST_LEASE_PAGES

static kvc_lease_t *lease_alloc(kvc_client_t *c, size_t npages) {
  size_t cap = npages <= SPARE_PAGES ? SPARE_PAGES : npages;
  size_t bytes = sizeof(kvc_lease_t) + cap * (sizeof(((kvc_lease_t *)0)->pages[0]) + 4);
  kvc_lease_t *l = c->lease_spare;
  if (l && cap == SPARE_PAGES) {
    c->lease_spare = NULL;
    memset(l, 0, bytes);
  } else if (!(l = calloc(1, bytes))) {
    return NULL;
  }
  l->cap = (uint32_t)cap;
  return l;
}

static void lease_free(kvc_client_t *c, kvc_lease_t *l) {
  if (l->cap == SPARE_PAGES && !c->lease_spare) c->lease_spare = l;
  else free(l);
}

/* Builds the handle from the reply, checking every page lies in the pool. */
/* Said to C and Python callers alike: instead names the call in both. */
int client_need_pool(kvc_client_t *c, const char *instead) {
  return client_fail(c, KVC_E_PERM, "zero-copy reads need the pool mapping, which a daemon "
                     "still run with page_bytes (deprecated) gives only to admins and to "
                     "zero_copy_tenant (doc/security.md): %s", instead);
}

int client_lease_take(kvc_cache_t *h, const Kvcache__V1__LeaseReply *lr, uint64_t seq_id,
                      uint64_t begin, uint64_t end, kvc_lease_t **out) {
  kvc_client_t *c = h->client;
  uint64_t pb = h->page_bytes, need = 0;
  /* The pool grew or changed since it was mapped: its segments first. */
  for (size_t i = 0; i < lr->n_page_offsets; i++)
    if (lr->page_offsets[i] <= UINT64_MAX - pb && lr->page_offsets[i] + pb > need)
      need = lr->page_offsets[i] + pb;
  int rc = client_pool_sync(c, lr->pool_gen, need);
  if (rc) return rc;
  client_pool_read(c);
  kvc_lease_t *l = lease_alloc(c, lr->n_page_offsets);
  if (!l) return client_fail(c, KVC_E_NOMEM, "out of memory");
  l->block_table = (int32_t *)(void *)&l->pages[l->cap];
  for (size_t i = 0; i < lr->n_page_offsets; i++) {
    uint64_t off = lr->page_offsets[i];
    if (!client_pool_holds(c, off, pb)) {
      lease_free(c, l);
      return client_fail(c, KVC_E_PROTO, "lease page at %llu lies outside the pool",
                         (unsigned long long)off);
    }
    l->pages[i] = c->pool + off;
  }
  l->client = c;
  l->num_layers = h->layout.num_layers;
  l->info = (kvc_lease_info_t){
      .lease_id = lr->lease_id, .seq_id = seq_id, .begin = begin, .end = end,
      .first_pos = lr->first_pos, .npages = (uint32_t)lr->n_page_offsets,
      .page_tokens = lr->page_tokens, .pages = l->pages, .layer_bytes = lr->layer_bytes,
      .v_offset = lr->v_offset, .k_row_bytes = lr->k_row_bytes,
      .v_row_bytes = lr->v_row_bytes, .k_scale_offset = lr->k_scale_offset,
      .v_scale_offset = lr->v_scale_offset};
  /* Arenas: the same pages as indices into the arena's array. */
  uint32_t vi = c->seg_bytes && lr->n_page_offsets && c->seg_view
                    ? c->seg_view[lr->page_offsets[0] / c->seg_bytes] : UINT32_MAX;
  const struct arena_view *v = vi < c->nviews ? &c->views[vi] : NULL;
  for (size_t i = 0; v && i < lr->n_page_offsets; i++) {
    uint64_t off = lr->page_offsets[i], k = off / c->seg_bytes;
    uint64_t slot = (off % c->seg_bytes) / v->stride;
    if (c->seg_view[k] != vi || (off % c->seg_bytes) % v->stride || slot >= v->per_seg) {
      v = NULL; /* not one arena's pages: no array (never from this daemon) */
      break;
    }
    l->block_table[i] = (int32_t)(k * v->per_seg + slot);
  }
  if (v) {
    l->info.arena_base = v->base;
    l->info.page_stride = v->stride;
    l->info.arena_pages = (uint64_t)c->nseg_ids * v->per_seg;
    l->info.block_table = l->block_table;
  }
  l->next = c->leases;
  if (l->next) l->next->prev = l;
  c->leases = l;
  *out = l;
  return 0;
}

/* A lease through the fast slots: its reply holds the pages; the rest of a
 * LeaseReply is the cache's page geometry (src/layout.c, as the engine's). */
static int lease_fast(kvc_cache_t *h, uint64_t seq_id, uint64_t begin, uint64_t end,
                      kvc_lease_t **out) {
  kvc_client_t *c = h->client;
  ringfast_req_t q = {.kind = RINGFAST_LEASE, .cache_id = h->id, .seq_id = seq_id,
                      .pos = begin, .ntokens = (uint32_t)(end - begin)};
  ringfast_rep_t rep;
  int rc = client_call_fast(c, &q, &rep);
  if (rc) return rc;
  const geom_t *g = &h->geom;
  if (!h->geom_ok || rep.npages == 0)
    return client_fail(c, KVC_E_PROTO, "lease reply without a lease");
  Kvcache__V1__LeaseReply lr = KVCACHE__V1__LEASE_REPLY__INIT;
  lr.lease_id = rep.lease_id;
  lr.first_pos = rep.first_pos;
  lr.n_page_offsets = rep.npages;
  lr.page_offsets = rep.page_off;
  lr.page_tokens = g->T;
  lr.layer_bytes = g->layer_bytes;
  lr.v_offset = g->k_off_v;
  lr.k_row_bytes = g->k_row;
  lr.v_row_bytes = g->v_row;
  lr.k_scale_offset = g->int8 ? g->ks_off : 0;
  lr.v_scale_offset = g->int8 ? g->vs_off : 0;
  lr.pool_gen = rep.pool_gen;
  return client_lease_take(h, &lr, seq_id, begin, end, out);
}

KVC_API int kvc_lease(kvc_cache_t *h, uint64_t seq_id, uint64_t begin, uint64_t end,
                      kvc_lease_t **out) {
  if (!h || !out) return KVC_E_INVAL;
  *out = NULL;
  kvc_client_t *c = h->client;
  if (!client_may_lease(c))
    return client_need_pool(c, "read with a get (C: kvc_get, Python: cache.get)");
  if (end > begin && end - begin <= UINT32_MAX && h->geom_ok && client_fast_ok(c)) {
    uint32_t sh = h->geom.tshift; /* pages the daemon's lease will hold */
    if (((end - 1) >> sh) - (begin >> sh) + 1 <= RINGFAST_LEASE_PAGES)
      return lease_fast(h, seq_id, begin, end, out);
  }
  Kvcache__V1__Request req = KVCACHE__V1__REQUEST__INIT;
  Kvcache__V1__Lease b = KVCACHE__V1__LEASE__INIT;
  b.cache_id = h->id;
  b.seq_id = seq_id;
  b.begin = begin;
  b.end = end;
  req.body_case = KVCACHE__V1__REQUEST__BODY_LEASE;
  req.lease = &b;
  Kvcache__V1__Response *r;
  int rc = client_call(c, &req, &r);
  if (rc) return rc;
  if (r->body_case != KVCACHE__V1__RESPONSE__BODY_LEASE || !r->lease ||
      r->lease->page_tokens == 0)
    rc = client_fail(c, KVC_E_PROTO, "lease reply without a lease");
  else
    rc = client_lease_take(h, r->lease, seq_id, begin, end, out);
  kvcache__v1__response__free_unpacked(r, NULL);
  return rc;
}

KVC_API int kvc_lease_batch(kvc_cache_t *h, const kvc_lease_range_t *ranges, size_t n,
                            kvc_lease_t **out) {
  if (!h || (!ranges && n) || (!out && n)) return KVC_E_INVAL;
  kvc_client_t *c = h->client;
  for (size_t i = 0; i < n; i++) out[i] = NULL;
  if (n == 0) return 0;
  if (!client_may_lease(c))
    return client_need_pool(c, "read with a get (C: kvc_get, Python: cache.get)");
  Kvcache__V1__LeaseRange *w = calloc(n, sizeof *w);
  Kvcache__V1__LeaseRange **wp = calloc(n, sizeof *wp);
  if (!w || !wp) {
    free(w), free(wp);
    return client_fail(c, KVC_E_NOMEM, "out of memory");
  }
  for (size_t i = 0; i < n; i++) {
    kvcache__v1__lease_range__init(&w[i]);
    w[i].seq_id = ranges[i].seq_id;
    w[i].begin = ranges[i].begin;
    w[i].end = ranges[i].end;
    wp[i] = &w[i];
  }
  Kvcache__V1__Request req = KVCACHE__V1__REQUEST__INIT;
  Kvcache__V1__LeaseBatch b = KVCACHE__V1__LEASE_BATCH__INIT;
  b.cache_id = h->id;
  b.n_ranges = n;
  b.ranges = wp;
  req.body_case = KVCACHE__V1__REQUEST__BODY_LEASE_BATCH;
  req.lease_batch = &b;
  Kvcache__V1__Response *r;
  int rc = client_call(c, &req, &r);
  free(w), free(wp);
  if (rc) return rc;
  if (r->body_case != KVCACHE__V1__RESPONSE__BODY_LEASE_BATCH || !r->lease_batch ||
      r->lease_batch->n_leases != n)
    rc = client_fail(c, KVC_E_PROTO, "lease batch reply without its leases");
  for (size_t i = 0; rc == 0 && i < n; i++)
    rc = client_lease_take(h, r->lease_batch->leases[i], ranges[i].seq_id, ranges[i].begin,
                           ranges[i].end, &out[i]);
  if (rc) /* the handles taken go; the daemon's leases go with the next request */
    for (size_t i = 0; i < n; i++) {
      if (out[i]) (void)kvc_lease_release_later(out[i]);
      else if (r && r->body_case == KVCACHE__V1__RESPONSE__BODY_LEASE_BATCH && r->lease_batch &&
               i < r->lease_batch->n_leases && c->nrelease < sizeof c->release_q / sizeof c->release_q[0])
        c->release_q[c->nrelease++] = r->lease_batch->leases[i]->lease_id;
      out[i] = NULL;
    }
  kvcache__v1__response__free_unpacked(r, NULL);
  return rc;
}

KVC_API const kvc_lease_info_t *kvc_lease_info(const kvc_lease_t *l) {
  return l ? &l->info : NULL;
}

static const uint8_t *row(const kvc_lease_t *l, uint32_t layer, uint64_t pos, bool v) {
  const kvc_lease_info_t *i = &l->info;
  if (layer >= l->num_layers || pos < i->begin || pos >= i->end) return NULL;
  uint64_t rel = pos - i->first_pos, r = rel % i->page_tokens;
  const uint8_t *page = i->pages[rel / i->page_tokens];
  return page + layer * i->layer_bytes + (v ? i->v_offset + r * i->v_row_bytes
                                            : r * i->k_row_bytes);
}

KVC_API const void *kvc_lease_k(const kvc_lease_t *l, uint32_t layer, uint64_t pos) {
  return l ? row(l, layer, pos, false) : NULL;
}

KVC_API const void *kvc_lease_v(const kvc_lease_t *l, uint32_t layer, uint64_t pos) {
  return l ? row(l, layer, pos, true) : NULL;
}

KVC_API int kvc_lease_release_later(kvc_lease_t *l) {
  if (!l) return 0;
  kvc_client_t *c = l->client;
  uint64_t id = l->info.lease_id;
  unlink_lease(l);
  lease_free(c, l);
  if (c->nrelease == sizeof c->release_q / sizeof c->release_q[0]) {
    /* The queue is full: send it with an explicit release. */
    Kvcache__V1__Request req = KVCACHE__V1__REQUEST__INIT;
    Kvcache__V1__LeaseRelease b = KVCACHE__V1__LEASE_RELEASE__INIT;
    req.body_case = KVCACHE__V1__REQUEST__BODY_LEASE_RELEASE;
    req.lease_release = &b;
    int rc = client_call(c, &req, NULL);
    if (rc) return rc;
  }
  c->release_q[c->nrelease++] = id;
  return 0;
}

KVC_API int kvc_lease_release(kvc_lease_t *l) {
  if (!l) return 0;
  kvc_client_t *c = l->client;
  Kvcache__V1__Request req = KVCACHE__V1__REQUEST__INIT;
  Kvcache__V1__LeaseRelease b = KVCACHE__V1__LEASE_RELEASE__INIT;
  uint64_t id = l->info.lease_id;
  b.n_lease_ids = 1;
  b.lease_ids = &id;
  req.body_case = KVCACHE__V1__REQUEST__BODY_LEASE_RELEASE;
  req.lease_release = &b;
  unlink_lease(l);
  lease_free(c, l);
  return client_call(c, &req, NULL);
}
