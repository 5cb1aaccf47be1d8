/* tier.c: the engine's side of the disk tier: cached pages handed to the
 * spill callback when eviction reclaims them, the probe past the resident
 * pages, and pages imported back only when they verify against the cache
 * (tenant, name, layout, chain hash under a resident parent). */
#include "engine_fixture.h"
#include "engine_tier.h"

#define T 4u
#define MAXP 16

static const engine_pkey_t KEY_A = {"tenant-a", 8, NULL, 0, NULL, 0};

/* What the spill callback kept: copies of metadata, ids and bytes. */
typedef struct kept {
  engine_tier_meta_t m[MAXP];
  uint32_t ids[MAXP][T];
  unsigned char *bytes[MAXP];
  size_t n;
} kept_t;

static void keep(void *ctx, const engine_tier_meta_t *m, const void *bytes) {
  kept_t *k = ctx;
  ASSERT(k->n < MAXP);
  ASSERT_U64_EQ(m->page_tokens, T);
  k->m[k->n] = *m;
  memcpy(k->ids[k->n], m->tokens, sizeof k->ids[0]);
  k->m[k->n].tokens = k->ids[k->n];
  k->bytes[k->n] = malloc(m->data_bytes);
  ASSERT(k->bytes[k->n] != NULL);
  memcpy(k->bytes[k->n], bytes, m->data_bytes);
  k->n++;
}

static void kept_free(kept_t *k) {
  for (size_t i = 0; i < k->n; i++) free(k->bytes[i]);
}

static void ids_of(uint32_t p, uint64_t n, uint32_t *out) {
  for (uint64_t i = 0; i < n; i++) out[i] = p * 100000u + (uint32_t)i;
}

/* Puts n tokens of prompt p (seq's payload) into seq under KEY_A. */
static void put_prompt(fx_t *f, uint64_t seq, uint64_t n, uint32_t p) {
  fx_rng_t r = fx_all(&f->lay);
  fx_buf_t b = fx_buf_new(&f->lay, r, n);
  uint32_t ids[64];
  ASSERT(n <= 64);
  fx_fill(&f->lay, r, seq, 0, n, 0, b.k, b.v);
  ids_of(p, n, ids);
  engine_io_t io = fx_io(seq, 0, n, &b);
  io.tokens = ids;
  engine_xfer_t x = fx_xfer(r, KVC_DTYPE_F32);
  x.pkey = &KEY_A;
  ASSERT_OK(engine_put(f->eng, f->cid, &x, &io, 1));
  fx_buf_free(&b);
}

static uint64_t matched(fx_t *f, uint32_t p, uint64_t n) {
  uint32_t ids[64];
  ids_of(p, n, ids);
  engine_match_t m;
  ASSERT_OK(engine_match(f->eng, f->cid, ids, n, &KEY_A, &m));
  return m.pages;
}

/* An 8-page pool; prompt 7 (4 pages) written by seq 1, left cached, then
 * pushed out by seq 2's 8 pages without ids: the spill callback keeps the
 * 4 pages, tails first. */
static void spill_prompt(fx_t *f, kept_t *k) {
  kvc_layout_t lay = fx_small_layout();
  fx_open(f, &lay, 8);
  memset(k, 0, sizeof *k);
  engine_set_spill(f->eng, keep, k);
  put_prompt(f, 1, 4 * T, 7);
  ASSERT_OK(engine_remove(f->eng, f->cid, 1, 0, UINT64_MAX));
  ASSERT_U64_EQ(fx_stats(f).pages_cached, 4);
  ASSERT_OK(fx_put(f, 2, 0, 8 * T, 0));
  ASSERT_U64_EQ(k->n, 4);
  ASSERT_U64_EQ(fx_stats(f).pages_indexed, 0);
  ASSERT_U64_EQ(matched(f, 7, 4 * T), 0);
  ASSERT_OK(engine_remove(f->eng, f->cid, 2, 0, UINT64_MAX)); /* room again */
}

/* The kept page of chain position i (they were spilled tails first). */
static size_t at(const kept_t *k, size_t i) { return k->n - 1 - i; }

static int import(fx_t *f, const engine_tier_meta_t *m, const void *bytes, bool ok) {
  engine_tier_job_t *j;
  void *dst;
  int rc = engine_tier_import_begin(f->eng, f->cid, &j, &dst);
  if (rc) return rc;
  memcpy(dst, bytes, m->data_bytes);
  return engine_tier_import_end(f->eng, j, m, ok);
}

TEST(tier_spill_probe_import_attach_byte_exact) {
  fx_t f;
  kept_t k;
  spill_prompt(&f, &k);
  ASSERT(k.m[at(&k, 0)].head);
  for (size_t i = 1; i < 4; i++) {
    ASSERT(!k.m[at(&k, i)].head);
    ASSERT_MEM_EQ(k.m[at(&k, i)].parent, k.m[at(&k, i - 1)].hash, 32);
  }
  ASSERT_STR_EQ(k.m[0].cache, "main");
  ASSERT_U64_EQ(k.m[0].salt.len, 8);
  /* The probe finds no page resident and the chain hashes of all four. */
  uint32_t ids[4 * T];
  ids_of(7, 4 * T, ids);
  uint8_t h[8][32];
  uint64_t resident;
  size_t n;
  ASSERT_OK(engine_tier_probe(f.eng, f.cid, ids, 4 * T + 3, &KEY_A, h, 8, &resident, &n));
  ASSERT_U64_EQ(resident, 0);
  ASSERT_U64_EQ(n, 4);
  for (size_t i = 0; i < 4; i++) ASSERT_MEM_EQ(h[i], k.m[at(&k, i)].hash, 32);
  /* Back in chain order: each verifies under the one before. */
  for (size_t i = 0; i < 4; i++) {
    ASSERT_OK(import(&f, &k.m[at(&k, i)], k.bytes[at(&k, i)], true));
    FX_AUDIT(f.eng);
  }
  ASSERT_U64_EQ(fx_stats(&f).pages_cached, 4);
  ASSERT_OK(engine_tier_probe(f.eng, f.cid, ids, 4 * T, &KEY_A, h, 8, &resident, &n));
  ASSERT_U64_EQ(resident, 4);
  ASSERT_U64_EQ(n, 0);
  engine_match_t m;
  ASSERT_OK(engine_attach(f.eng, f.cid, 9, ids, 4 * T, &KEY_A, 0, &m));
  ASSERT_U64_EQ(m.pages, 4);
  FX_EXPECT_RNG(&f, 9, 0, 4 * T, fx_all(&f.lay), 1, 0); /* seq 1's bytes, exactly */
  kept_free(&k);
  fx_close(&f);
}

/* A spill says how many cached pages its eviction reclaims after it: the
 * disk tier drops, uncopied, a page the rest would push out of its queue. */
TEST(tier_spill_says_what_its_eviction_reclaims_after_it) {
  fx_t f;
  kept_t k;
  spill_prompt(&f, &k); /* one put's eviction reclaimed the 4 pages */
  for (size_t i = 0; i < 4; i++) ASSERT_U64_EQ(k.m[i].more, 3 - i);
  /* Outside an eviction (a clean stop's walk) it is 0. */
  kept_t all;
  memset(&all, 0, sizeof all);
  put_prompt(&f, 3, 2 * T, 8);
  ASSERT_U64_EQ(engine_tier_each(f.eng, keep, &all), 2);
  ASSERT_U64_EQ(all.m[0].more, 0);
  ASSERT_U64_EQ(all.m[1].more, 0);
  kept_free(&all);
  kept_free(&k);
  fx_close(&f);
}

TEST(tier_import_refuses_what_does_not_verify) {
  fx_t f;
  kept_t k;
  spill_prompt(&f, &k);
  engine_stats_t before = fx_stats(&f);
  engine_tier_meta_t m = k.m[at(&k, 0)];
  const void *b0 = k.bytes[at(&k, 0)];
  uint32_t ids[T];
  /* Each altered field, and a read that failed, frees the page again. */
  for (int c = 0; c < 9; c++) {
    engine_tier_meta_t x = m;
    memcpy(ids, m.tokens, sizeof ids);
    x.tokens = ids;
    switch (c) {
    case 0: x.tenant++; break;
    case 1: x.cache[0] = 'x'; break;
    case 2: x.layout.head_dim_v++; break;
    case 3: x.data_bytes--; break;
    case 4: x.hash[31] ^= 1; break;
    case 5: ids[2]++; break;                    /* other ids: the hash differs */
    case 6: x.salt.bytes[0] ^= 1; break;        /* another key */
    case 7: x.hash_kind = KVC_HASH_XXH3; break;
    case 8: break;                              /* ok false below */
    }
    int rc = import(&f, &x, b0, c != 8);
    ASSERT_EQ(rc, KVC_E_INVAL);
    FX_AUDIT(f.eng);
    engine_stats_t now = fx_stats(&f);
    FX_STATS_SAME_BUT_HEAP(&before, &now);
  }
  engine_stats_t after = fx_stats(&f);
  ASSERT_U64_EQ(after.pages_free, before.pages_free);
  ASSERT_U64_EQ(after.pages_indexed, 0);
  /* A child before its parent: its parent is not in the index. */
  ASSERT_EQ(import(&f, &k.m[at(&k, 1)], k.bytes[at(&k, 1)], true), KVC_E_INVAL);
  ASSERT_OK(import(&f, &m, b0, true));
  ASSERT_EQ(import(&f, &m, b0, true), KVC_E_EXISTS); /* once is enough */
  ASSERT_U64_EQ(fx_stats(&f).pages_indexed, 1);
  ASSERT_U64_EQ(matched(&f, 7, 4 * T), 1);
  kept_free(&k);
  fx_close(&f);
}

/* The seed mixes the tenant: the same cache name and layout in another
 * tenant never takes the page, even with its tenant number forged. */
TEST(tier_import_other_tenant_never_verifies) {
  fx_t f;
  kept_t k;
  spill_prompt(&f, &k);
  uint32_t other;
  ASSERT_OK(engine_cache_open_in(f.eng, 5, "main", &f.lay, &other));
  engine_tier_meta_t m = k.m[at(&k, 0)];
  m.tenant = 5;
  engine_tier_job_t *j;
  void *dst;
  ASSERT_OK(engine_tier_import_begin(f.eng, other, &j, &dst));
  memcpy(dst, k.bytes[at(&k, 0)], m.data_bytes);
  ASSERT_EQ(engine_tier_import_end(f.eng, j, &m, true), KVC_E_INVAL);
  ASSERT_U64_EQ(fx_stats(&f).pages_indexed, 0);
  kept_free(&k);
  fx_close(&f);
}

TEST(tier_bad_arguments) {
  fx_t f;
  kvc_layout_t lay = fx_small_layout();
  fx_open(&f, &lay, 8);
  uint32_t ids[T] = {1, 2, 3, 4};
  uint8_t h[2][32];
  uint64_t r;
  size_t n;
  engine_tier_job_t *j;
  void *dst;
  ASSERT_EQ(engine_tier_probe(NULL, f.cid, ids, T, NULL, h, 2, &r, &n), KVC_E_INVAL);
  ASSERT_EQ(engine_tier_probe(f.eng, f.cid, NULL, T, NULL, h, 2, &r, &n), KVC_E_INVAL);
  ASSERT_EQ(engine_tier_probe(f.eng, f.cid, ids, T, NULL, NULL, 2, &r, &n), KVC_E_INVAL);
  ASSERT_EQ(engine_tier_probe(f.eng, f.cid + 1, ids, T, NULL, h, 2, &r, &n), KVC_E_NOCACHE);
  engine_pkey_t big = {"x", 65, NULL, 0, NULL, 0};
  ASSERT_EQ(engine_tier_probe(f.eng, f.cid, ids, T, &big, h, 2, &r, &n), KVC_E_INVAL);
  ASSERT_EQ(engine_tier_import_begin(f.eng, f.cid + 1, &j, &dst), KVC_E_NOCACHE);
  ASSERT_EQ(engine_tier_import_begin(f.eng, f.cid, NULL, &dst), KVC_E_INVAL);
  ASSERT_EQ(engine_tier_import_end(f.eng, NULL, NULL, true), KVC_E_INVAL);
  /* No room: every page pinned, so the import is FULL and nothing changed. */
  ASSERT_OK(fx_put(&f, 1, 0, 8 * T, 0));
  ASSERT_OK(engine_pin(f.eng, f.cid, 1, 42));
  engine_stats_t before = fx_stats(&f);
  ASSERT_EQ(engine_tier_import_begin(f.eng, f.cid, &j, &dst), KVC_E_FULL);
  engine_stats_t now = fx_stats(&f);
  FX_STATS_SAME(&before, &now);
  fx_close(&f);
}

/* A page with span keys stays memory-only: a span key's id means nothing
 * outside this engine's life. */
TEST(tier_pages_with_span_keys_are_not_spilled) {
  fx_t f;
  kept_t k;
  memset(&k, 0, sizeof k);
  kvc_layout_t lay = fx_small_layout();
  fx_open(&f, &lay, 8);
  engine_set_spill(f.eng, keep, &k);
  fx_rng_t r = fx_all(&f.lay);
  fx_buf_t b = fx_buf_new(&f.lay, r, 2 * T);
  uint32_t ids[2 * T];
  ids_of(3, 2 * T, ids);
  kvc_span_key_t sp = {.begin = T + 1, .end = T + 3, .key = "img", .key_len = 3};
  engine_io_t io = fx_io(1, 0, 2 * T, &b);
  io.tokens = ids;
  io.spans = &sp;
  io.nspans = 1;
  engine_xfer_t x = fx_xfer(r, KVC_DTYPE_F32);
  x.pkey = &KEY_A;
  ASSERT_OK(engine_put(f.eng, f.cid, &x, &io, 1));
  fx_buf_free(&b);
  ASSERT_OK(engine_remove(f.eng, f.cid, 1, 0, UINT64_MAX));
  ASSERT_U64_EQ(fx_stats(&f).pages_cached, 2);
  ASSERT_OK(fx_put(&f, 2, 0, 8 * T, 0));
  ASSERT_U64_EQ(k.n, 1); /* page 0 went; page 1 (span key) did not */
  ASSERT(k.m[0].head);
  kept_free(&k);
  fx_close(&f);
}
