/* tier.c: the engine's one tier API as a tier below memory uses it (the
 * disk, a test's): cached pages handed to the reclaimed hook as eviction
 * takes them, the probe past the local pages, and pages read back into pool
 * pages (begin) then imported only under the hash the engine recomputes
 * from the query (tenant, name, layout, ids, key, under the page before). */
#include "engine_fixture.h"
#include "engine_tier.h"

#define T 4u
#define MAXP 16

static const engine_pkey_t KEY_A = {"tenant-a", 8, NULL, 0, NULL, 0};

/* What the reclaimed hook kept: copies of identities, ids and bytes. */
typedef struct kept {
  engine_page_t m[MAXP];
  uint32_t ids[MAXP][T];
  unsigned char *bytes[MAXP];
  size_t n;
} kept_t;

static void keep(void *ctx, const engine_page_t *m) {
  kept_t *k = ctx;
  ASSERT(k->n < MAXP);
  ASSERT_U64_EQ(m->page_tokens, T);
  k->m[k->n] = *m;
  memcpy(k->ids[k->n], m->tokens, sizeof k->ids[0]);
  k->m[k->n].tokens = k->ids[k->n];
  k->bytes[k->n] = malloc(m->data_bytes);
  ASSERT(k->bytes[k->n] != NULL);
  memcpy(k->bytes[k->n], m->bytes, m->data_bytes);
  k->m[k->n].bytes = k->bytes[k->n];
  k->n++;
}

static void kept_free(kept_t *k) {
  for (size_t i = 0; i < k->n; i++) free(k->bytes[i]);
}

static void hook(fx_t *f, kept_t *k) {
  memset(k, 0, sizeof *k);
  engine_tier_hooks_t h = {k, NULL, keep};
  engine_set_tier_hooks(f->eng, &h);
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
 * pushed out by seq 2's 8 pages without ids: the hook keeps the 4 pages,
 * tails first. */
static void spill_prompt(fx_t *f, kept_t *k) {
  kvc_layout_t lay = fx_small_layout();
  fx_open(f, &lay, 8);
  hook(f, k);
  put_prompt(f, 1, 4 * T, 7);
  ASSERT_OK(engine_remove(f->eng, f->cid, 1, 0, UINT64_MAX));
  ASSERT_U64_EQ(fx_stats(f).pages_cached, 4);
  ASSERT_OK(fx_put(f, 2, 0, 8 * T, 0));
  ASSERT_U64_EQ(k->n, 4);
  ASSERT_U64_EQ(fx_stats(f).pages_indexed, 0);
  ASSERT_U64_EQ(matched(f, 7, 4 * T), 0);
  ASSERT_OK(engine_remove(f->eng, f->cid, 2, 0, UINT64_MAX)); /* room again */
}

/* The kept page of chain position i (they were reclaimed tails first). */
static size_t at(const kept_t *k, size_t i) { return k->n - 1 - i; }

/* Reads kept pages [from, from + n) back as a tier does: a pool page each
 * (begin), filled, then imported under query (prompt p, q tokens) from page
 * `first`. The jobs not taken are given back. Returns the code; *got. */
static int read_back(fx_t *f, uint32_t cid, const kept_t *k, size_t from, size_t n, uint32_t p,
                     uint64_t q, uint64_t first, const engine_pkey_t *key, size_t *got) {
  engine_page_in_t in[MAXP];
  uint32_t ids[64];
  ids_of(p, q, ids);
  size_t idx[MAXP]; /* before a begin evicts: the hook may keep more pages */
  for (size_t i = 0; i < n; i++) idx[i] = at(k, from + i);
  *got = 0;
  for (size_t i = 0; i < n; i++) {
    void *dst;
    uint64_t nb = 0;
    int rc = engine_tier_import_begin(f->eng, cid, &in[i].job, &dst, &nb);
    if (rc) {
      while (i--) engine_tier_import_abort(f->eng, in[i].job);
      return rc;
    }
    ASSERT_U64_EQ(nb, k->m[idx[i]].data_bytes);
    memcpy(dst, k->bytes[idx[i]], nb);
    in[i].hash = k->m[idx[i]].hash;
    in[i].bytes = NULL;
    in[i].fill = NULL;
  }
  int rc = engine_tier_import(f->eng, cid, ids, q, key, first, in, n, got);
  for (size_t i = rc ? 0 : *got; i < n; i++) engine_tier_import_abort(f->eng, in[i].job);
  return rc;
}

TEST(tier_reclaim_probe_import_attach_byte_exact) {
  fx_t f;
  kept_t k;
  spill_prompt(&f, &k);
  ASSERT(k.m[at(&k, 0)].head);
  for (size_t i = 0; i < 4; i++) ASSERT(k.m[i].portable);
  for (size_t i = 1; i < 4; i++) {
    ASSERT(!k.m[at(&k, i)].head);
    ASSERT_MEM_EQ(k.m[at(&k, i)].parent, k.m[at(&k, i - 1)].hash, 32);
  }
  ASSERT_STR_EQ(k.m[0].cache, "main");
  ASSERT_U64_EQ(k.m[0].salt.len, 8);
  /* The probe finds no page local and the chain hashes of all four. */
  uint32_t ids[4 * T + 3];
  ids_of(7, 4 * T + 3, ids);
  uint8_t h[8][32];
  uint64_t local;
  size_t n;
  ASSERT_OK(engine_tier_probe(f.eng, f.cid, ids, 4 * T + 3, &KEY_A, &local, NULL, h, 8, &n));
  ASSERT_U64_EQ(local, 0);
  ASSERT_U64_EQ(n, 4);
  for (size_t i = 0; i < 4; i++) ASSERT_MEM_EQ(h[i], k.m[at(&k, i)].hash, 32);
  /* Back in two imports: the second under the first's pages. */
  size_t got;
  ASSERT_OK(read_back(&f, f.cid, &k, 0, 2, 7, 4 * T, 0, &KEY_A, &got));
  ASSERT_U64_EQ(got, 2);
  FX_AUDIT(f.eng);
  uint8_t before[32];
  ASSERT_OK(engine_tier_probe(f.eng, f.cid, ids, 4 * T, &KEY_A, &local, before, h, 8, &n));
  ASSERT_U64_EQ(local, 2);
  ASSERT_U64_EQ(n, 2);
  ASSERT_MEM_EQ(before, k.m[at(&k, 1)].hash, 32);
  ASSERT_OK(read_back(&f, f.cid, &k, 2, 2, 7, 4 * T, 2, &KEY_A, &got));
  ASSERT_U64_EQ(got, 2);
  FX_AUDIT(f.eng);
  ASSERT_U64_EQ(fx_stats(&f).pages_cached, 4);
  ASSERT_OK(engine_tier_probe(f.eng, f.cid, ids, 4 * T, &KEY_A, &local, NULL, h, 8, &n));
  ASSERT_U64_EQ(local, 4);
  ASSERT_U64_EQ(n, 0);
  engine_match_t m;
  ASSERT_OK(engine_attach(f.eng, f.cid, 9, ids, 4 * T, &KEY_A, 0, &m));
  ASSERT_U64_EQ(m.pages, 4);
  FX_EXPECT_RNG(&f, 9, 0, 4 * T, fx_all(&f.lay), 1, 0); /* seq 1's bytes, exactly */
  kept_free(&k);
  fx_close(&f);
}

/* A reclaimed page says how many cached pages its eviction reclaims after
 * it: the disk tier drops, uncopied, a page the rest would push out of its
 * queue. */
TEST(tier_reclaimed_says_what_its_eviction_reclaims_after_it) {
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

/* What a tier gives back goes in only under the hash the engine computes
 * from the query: a wrong hash, other ids, another key, a child without its
 * parent, all take nothing and leave the pool as it was. */
TEST(tier_import_refuses_what_does_not_verify) {
  fx_t f;
  kept_t k;
  spill_prompt(&f, &k);
  engine_stats_t before = fx_stats(&f);
  static const engine_pkey_t KEY_B = {"tenant-b", 8, NULL, 0, NULL, 0};
  for (int c = 0; c < 4; c++) {
    size_t got = 99;
    engine_page_t saved = k.m[at(&k, 0)];
    if (c == 0) k.m[at(&k, 0)].hash[31] ^= 1; /* stored under another hash */
    int rc = c == 3 /* a child before its parent: page 0 is not indexed */
                 ? read_back(&f, f.cid, &k, 1, 1, 7, 4 * T, 1, &KEY_A, &got)
                 : read_back(&f, f.cid, &k, 0, 1, c == 1 ? 8 : 7, 4 * T, 0, /* other ids */
                             c == 2 ? &KEY_B : &KEY_A, &got);               /* another key */
    k.m[at(&k, 0)] = saved;
    ASSERT_OK(rc);
    ASSERT_U64_EQ(got, 0);
    FX_AUDIT(f.eng);
    engine_stats_t now = fx_stats(&f);
    ASSERT_U64_EQ(now.pages_free, before.pages_free);
    ASSERT_U64_EQ(now.pages_indexed, 0);
  }
  ASSERT(fx_stats(&f).hash_verify_failed > before.hash_verify_failed);
  size_t got;
  ASSERT_OK(read_back(&f, f.cid, &k, 0, 1, 7, 4 * T, 0, &KEY_A, &got));
  ASSERT_U64_EQ(got, 1);
  /* Once is enough: the page indexed already is kept, the new one given back. */
  ASSERT_OK(read_back(&f, f.cid, &k, 0, 1, 7, 4 * T, 0, &KEY_A, &got));
  ASSERT_U64_EQ(got, 0);
  ASSERT_U64_EQ(fx_stats(&f).pages_indexed, 1);
  ASSERT_U64_EQ(matched(&f, 7, 4 * T), 1);
  FX_AUDIT(f.eng);
  kept_free(&k);
  fx_close(&f);
}

/* The seed mixes the tenant: the same cache name and layout in another
 * tenant never takes the page under the same query. */
TEST(tier_import_other_tenant_never_verifies) {
  fx_t f;
  kept_t k;
  spill_prompt(&f, &k);
  uint32_t other;
  ASSERT_OK(engine_cache_open_in(f.eng, 5, "main", &f.lay, &other));
  size_t got = 99;
  ASSERT_OK(read_back(&f, other, &k, 0, 2, 7, 4 * T, 0, &KEY_A, &got));
  ASSERT_U64_EQ(got, 0);
  ASSERT_U64_EQ(fx_stats(&f).pages_indexed, 0);
  FX_AUDIT(f.eng);
  kept_free(&k);
  fx_close(&f);
}

/* The probe makes the local pages the most recent: the pool pages taken
 * for the pages after them (begin evicts) are not their parents. */
TEST(tier_probe_keeps_the_parents_of_what_comes_back) {
  fx_t f;
  kept_t k;
  spill_prompt(&f, &k);
  put_prompt(&f, 3, 2 * T, 7); /* pages 0, 1 of prompt 7 again: cached, the oldest */
  ASSERT_OK(engine_remove(f.eng, f.cid, 3, 0, UINT64_MAX));
  put_prompt(&f, 4, 2 * T, 8); /* two newer cached pages */
  ASSERT_OK(engine_remove(f.eng, f.cid, 4, 0, UINT64_MAX));
  ASSERT_OK(fx_put(&f, 5, 0, 4 * T, 0)); /* the pool is full: 4 held, 4 cached */
  ASSERT_U64_EQ(fx_stats(&f).pages_free, 0);
  uint32_t ids[4 * T];
  ids_of(7, 4 * T, ids);
  uint8_t h[4][32];
  uint64_t local;
  size_t n;
  ASSERT_OK(engine_tier_probe(f.eng, f.cid, ids, 4 * T, &KEY_A, &local, NULL, h, 4, &n));
  ASSERT_U64_EQ(local, 2);
  ASSERT_U64_EQ(n, 2);
  size_t got;
  ASSERT_OK(read_back(&f, f.cid, &k, 2, 2, 7, 4 * T, 2, &KEY_A, &got)); /* evicts prompt 8 */
  ASSERT_U64_EQ(got, 2);
  ASSERT_U64_EQ(matched(&f, 7, 4 * T), 4);
  ASSERT_U64_EQ(matched(&f, 8, 2 * T), 0);
  FX_AUDIT(f.eng);
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
  ASSERT_EQ(engine_tier_probe(NULL, f.cid, ids, T, NULL, &r, NULL, h, 2, &n), KVC_E_INVAL);
  ASSERT_EQ(engine_tier_probe(f.eng, f.cid, NULL, T, NULL, &r, NULL, h, 2, &n), KVC_E_INVAL);
  ASSERT_EQ(engine_tier_probe(f.eng, f.cid, ids, T, NULL, &r, NULL, NULL, 2, &n), KVC_E_INVAL);
  ASSERT_EQ(engine_tier_probe(f.eng, f.cid + 1, ids, T, NULL, &r, NULL, h, 2, &n),
            KVC_E_NOCACHE);
  engine_pkey_t big = {"x", 65, NULL, 0, NULL, 0};
  ASSERT_EQ(engine_tier_probe(f.eng, f.cid, ids, T, &big, &r, NULL, h, 2, &n), KVC_E_INVAL);
  ASSERT_EQ(engine_tier_import_begin(f.eng, f.cid + 1, &j, &dst, NULL), KVC_E_NOCACHE);
  ASSERT_EQ(engine_tier_import_begin(f.eng, f.cid, NULL, &dst, NULL), KVC_E_INVAL);
  engine_tier_import_abort(f.eng, NULL); /* a no-op */
  /* No room: every page pinned, so the begin is FULL and nothing changed. */
  ASSERT_OK(fx_put(&f, 1, 0, 8 * T, 0));
  ASSERT_OK(engine_pin(f.eng, f.cid, 1, 42));
  engine_stats_t before = fx_stats(&f);
  ASSERT_EQ(engine_tier_import_begin(f.eng, f.cid, &j, &dst, NULL), KVC_E_FULL);
  engine_stats_t now = fx_stats(&f);
  FX_STATS_SAME(&before, &now);
  fx_close(&f);
}

/* A page with span keys is not portable: a span key's id means nothing
 * outside this engine's life, so the disk keeps it memory-only. */
TEST(tier_pages_with_span_keys_are_not_portable) {
  fx_t f;
  kept_t k;
  kvc_layout_t lay = fx_small_layout();
  fx_open(&f, &lay, 8);
  hook(&f, &k);
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
  ASSERT_U64_EQ(k.n, 2);       /* both reclaimed, tail first */
  ASSERT(!k.m[0].portable);    /* page 1: its positions carry the span key */
  ASSERT(k.m[1].portable && k.m[1].head);
  kept_free(&k);
  fx_close(&f);
}
