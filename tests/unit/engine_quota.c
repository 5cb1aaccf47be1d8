/* engine_quota.c: per-tenant quotas: pool pages (a tenant at its quota
 * gives up its own LRU victims first), pinned plus leased pages (counted as
 * pinned sequences grow), sequences (empty ones too), caches; each refusal
 * its own code, counted per tenant, the other tenant's bytes intact. Every
 * test ends with the audit, which recounts each tenant's usage. */
#include "engine_fixture.h"

/* Opens cache `name` of tenant with the small layout; makes it f->cid. */
static uint32_t open_in(fx_t *f, uint32_t tenant, const char *name) {
  uint32_t id;
  ASSERT_OK(engine_cache_open_in(f->eng, tenant, name, &f->lay, &id));
  f->cid = id;
  return id;
}

static engine_tenant_usage_t usage(fx_t *f, uint32_t tenant) {
  engine_tenant_usage_t u;
  ASSERT_OK(engine_tenant_usage(f->eng, tenant, NULL, &u));
  return u;
}

static void limits(fx_t *f, uint32_t tenant, uint64_t pages, uint64_t pinned, uint64_t seqs,
                   uint32_t caches) {
  engine_tenant_limits_t l = {.max_bytes = pages * f->page_bytes,
                              .max_pinned_bytes = pinned * f->page_bytes, .max_seqs = seqs,
                              .max_caches = caches};
  ASSERT_OK(engine_tenant_limits_set(f->eng, tenant, &l));
}

TEST(quota_bad_arguments) {
  fx_t f;
  kvc_layout_t l = fx_small_layout();
  fx_open(&f, &l, 8);
  engine_tenant_limits_t lim = {0};
  engine_tenant_usage_t u;
  ASSERT_ERR(engine_tenant_limits_set(NULL, 1, &lim), KVC_E_INVAL);
  ASSERT_ERR(engine_tenant_limits_set(f.eng, ENGINE_TENANT_DEFAULT, NULL), KVC_E_INVAL);
  ASSERT_ERR(engine_tenant_usage(NULL, 1, &lim, &u), KVC_E_INVAL);
  ASSERT_OK(engine_tenant_usage(f.eng, 77, &lim, &u)); /* never seen: zeros */
  ASSERT_U64_EQ(u.pages, 0);
  ASSERT_U64_EQ(lim.max_bytes, 0);
  /* The default applies to a tenant without limits of its own, and lim NULL
   * returns one to it. */
  lim.max_seqs = 5;
  ASSERT_OK(engine_tenant_limits_set(f.eng, ENGINE_TENANT_DEFAULT, &lim));
  ASSERT_OK(engine_tenant_usage(f.eng, 77, &lim, NULL));
  ASSERT_U64_EQ(lim.max_seqs, 5);
  limits(&f, 77, 0, 0, 9, 0);
  ASSERT_OK(engine_tenant_usage(f.eng, 77, &lim, NULL));
  ASSERT_U64_EQ(lim.max_seqs, 9);
  ASSERT_OK(engine_tenant_limits_set(f.eng, 77, NULL));
  ASSERT_OK(engine_tenant_usage(f.eng, 77, &lim, NULL));
  ASSERT_U64_EQ(lim.max_seqs, 5);
  fx_close(&f);
}

TEST(quota_pages_evict_the_tenants_own_first) {
  fx_t f;
  kvc_layout_t l = fx_small_layout();
  fx_open(&f, &l, 8);
  uint32_t victim = open_in(&f, 2, "v");
  for (uint64_t s = 1; s <= 4; s++) ASSERT_OK(fx_put(&f, s, 0, 4, 2)); /* oldest: 4 pages */
  uint32_t hog = open_in(&f, 1, "h");
  limits(&f, 1, 3, 0, 0, 0);
  /* While pages are free a tenant may pass its share: the pool fills. */
  for (uint64_t s = 1; s <= 4; s++) ASSERT_OK(fx_put(&f, s, 0, 4, 1));
  ASSERT_U64_EQ(usage(&f, 1).pages, 4);
  ASSERT_U64_EQ(fx_stats(&f).pages_free, 0);
  /* Under pressure, past its share: its own least recent sequence goes, not
   * the victim's older ones. */
  ASSERT_OK(fx_put(&f, 5, 0, 4, 1));
  ASSERT_U64_EQ(usage(&f, 1).pages, 4);
  ASSERT_ERR(fx_get_rc(&f, 1, 0, 4, fx_all(&f.lay)), KVC_E_NOSEQ);
  for (uint64_t s = 2; s <= 5; s++) FX_EXPECT(&f, s, 0, 4, 1);
  /* Its own pinned: nothing of its own to give, and nothing changes. */
  for (uint64_t s = 2; s <= 5; s++) ASSERT_OK(engine_pin(f.eng, hog, s, 9));
  engine_stats_t before = fx_stats(&f);
  ASSERT_ERR(fx_put(&f, 7, 0, 4, 1), KVC_E_QUOTA_PAGES);
  ASSERT(strstr(engine_last_error(f.eng)->msg, "tenant_max_pages") != NULL);
  ASSERT_ERR(fx_put(&f, 5, 4, 4, 1), KVC_E_QUOTA_PAGES); /* growth too */
  engine_stats_t after = fx_stats(&f);
  FX_STATS_SAME(&before, &after);
  ASSERT_U64_EQ(usage(&f, 1).refused_pages, 2);
  ASSERT_U64_EQ(usage(&f, 2).refused_pages, 0);
  f.cid = victim;
  for (uint64_t s = 1; s <= 4; s++) FX_EXPECT(&f, s, 0, 4, 2);
  ASSERT_U64_EQ(usage(&f, 2).pages, 4);
  /* The share raised (a reload): the victim's least recent go, as LRU says. */
  limits(&f, 1, 8, 0, 0, 0);
  f.cid = hog;
  ASSERT_OK(fx_put(&f, 7, 0, 4, 1));
  ASSERT_U64_EQ(usage(&f, 1).pages, 5);
  ASSERT_U64_EQ(usage(&f, 2).pages, 3);
  fx_close(&f);
}

TEST(quota_pages_over_share_tenants_are_evicted_first) {
  fx_t f;
  kvc_layout_t l = fx_small_layout();
  fx_open(&f, &l, 8);
  uint32_t victim = open_in(&f, 2, "v");
  for (uint64_t s = 1; s <= 2; s++) ASSERT_OK(fx_put(&f, s, 0, 4, 2)); /* oldest */
  uint32_t hog = open_in(&f, 1, "h");
  limits(&f, 1, 2, 0, 0, 0);
  for (uint64_t s = 1; s <= 4; s++) ASSERT_OK(fx_put(&f, s, 0, 4, 1)); /* 4 of its 2 */
  /* The victim needs 3 pages, 2 are free: the hog, over its share, gives
   * the one more, though the victim's own are older. */
  f.cid = victim;
  ASSERT_OK(fx_put(&f, 3, 0, 12, 2));
  ASSERT_U64_EQ(usage(&f, 1).pages, 3);
  for (uint64_t s = 1; s <= 2; s++) FX_EXPECT(&f, s, 0, 4, 2);
  FX_EXPECT(&f, 3, 0, 12, 2);
  (void)hog;
  fx_close(&f);
}

TEST(quota_pins_count_growth_and_leases) {
  fx_t f;
  kvc_layout_t l = fx_small_layout();
  fx_open(&f, &l, 32);
  uint32_t hog = open_in(&f, 1, "h");
  limits(&f, 1, 0, 3, 0, 0);
  ASSERT_OK(fx_put(&f, 1, 0, 1, 1));
  ASSERT_OK(engine_pin(f.eng, hog, 1, 9)); /* pinned at 1 page, then grows */
  ASSERT_OK(fx_put(&f, 1, 1, 11, 1));
  ASSERT_U64_EQ(usage(&f, 1).pinned, 3);
  ASSERT_ERR(fx_put(&f, 1, 12, 1, 1), KVC_E_QUOTA_PINS);
  ASSERT(strstr(engine_last_error(f.eng)->msg, "tenant_max_pinned") != NULL);
  engine_tok_t t = {1, 12};
  ASSERT_ERR(engine_reserve(f.eng, hog, &t, 1), KVC_E_QUOTA_PINS);
  ASSERT_OK(fx_put(&f, 2, 0, 4, 1));
  ASSERT_ERR(engine_pin(f.eng, hog, 2, 9), KVC_E_QUOTA_PINS);
  FX_EXPECT(&f, 1, 0, 12, 1);
  /* Leases take from the same budget. */
  ASSERT_OK(engine_unpin(f.eng, hog, 1, 9));
  engine_lease_t le;
  ASSERT_OK(engine_lease(f.eng, hog, 1, 0, 12, 7, &le));
  ASSERT_U64_EQ(usage(&f, 1).leased, 3);
  ASSERT_ERR(engine_lease(f.eng, hog, 2, 0, 4, 7, &le), KVC_E_QUOTA_PINS);
  ASSERT_ERR(engine_pin(f.eng, hog, 2, 9), KVC_E_QUOTA_PINS);
  ASSERT_U64_EQ(usage(&f, 1).refused_pins, 5);
  /* A pinned empty sequence does not take a copy past the quota either. */
  ASSERT_OK(fx_put(&f, 3, 0, 0, 1));
  ASSERT_OK(engine_pin(f.eng, hog, 3, 9));
  ASSERT_ERR(engine_copy_prefix(f.eng, hog, 1, 3, 12), KVC_E_QUOTA_PINS);
  ASSERT_U64_EQ(FX_INFO(&f, 3).pages, 0);
  ASSERT_OK(engine_unpin(f.eng, hog, 3, 9));
  ASSERT_U64_EQ(usage(&f, 1).refused_pins, 6);
  ASSERT_U64_EQ(engine_lease_release_all(f.eng, 7), 1);
  ASSERT_OK(engine_pin(f.eng, hog, 2, 9));
  /* Another tenant is not limited by it. */
  uint32_t other = open_in(&f, 2, "o");
  ASSERT_OK(fx_put(&f, 1, 0, 16, 2));
  ASSERT_OK(engine_pin(f.eng, other, 1, 9));
  ASSERT_U64_EQ(usage(&f, 2).pinned, 4);
  fx_close(&f);
}

TEST(quota_seqs_count_empty_ones_and_caches) {
  fx_t f;
  kvc_layout_t l = fx_small_layout();
  fx_open(&f, &l, 16);
  uint32_t hog = open_in(&f, 1, "h");
  limits(&f, 1, 0, 0, 3, 2);
  for (uint64_t s = 1; s <= 3; s++) ASSERT_OK(fx_put(&f, s, 0, 0, 1)); /* empty */
  ASSERT_U64_EQ(usage(&f, 1).seqs, 3);
  ASSERT_ERR(fx_put(&f, 4, 0, 0, 1), KVC_E_QUOTA_SEQS);
  ASSERT(strstr(engine_last_error(f.eng)->msg, "tenant_max_seqs") != NULL);
  ASSERT_ERR(engine_copy_prefix(f.eng, hog, 1, 5, 0), KVC_E_QUOTA_SEQS);
  engine_tok_t t = {6, 0};
  ASSERT_ERR(engine_reserve(f.eng, hog, &t, 1), KVC_E_QUOTA_SEQS);
  ASSERT_U64_EQ(usage(&f, 1).refused_seqs, 3);
  ASSERT_OK(engine_remove(f.eng, hog, 1, 0, 1)); /* dropping one makes room */
  ASSERT_OK(fx_put(&f, 4, 0, 4, 1));
  /* Caches: the second opens, the third is refused, a drop frees one. */
  uint32_t id;
  ASSERT_OK(engine_cache_open_in(f.eng, 1, "h2", &f.lay, &id));
  ASSERT_ERR(engine_cache_open_in(f.eng, 1, "h3", &f.lay, &id), KVC_E_QUOTA_CACHES);
  ASSERT(strstr(engine_last_error(f.eng)->msg, "tenant_max_caches") != NULL);
  ASSERT_OK(engine_cache_open_in(f.eng, 1, "h", &f.lay, &id)); /* an open one opens */
  ASSERT_OK(engine_cache_open_in(f.eng, 2, "h3", &f.lay, &id)); /* another tenant */
  ASSERT_U64_EQ(usage(&f, 1).refused_caches, 1);
  ASSERT_OK(engine_cache_drop(f.eng, hog));
  ASSERT_U64_EQ(usage(&f, 1).seqs, 0);
  ASSERT_OK(engine_cache_open_in(f.eng, 1, "h3", &f.lay, &id));
  ASSERT_EQ(usage(&f, 1).caches, 2);
  fx_close(&f);
}

/* Regression: cache ids were never reused, so 64 opens and drops left
 * TOOMANY for the engine's life. A slot is reused under a new id; the old
 * id names nothing. */
TEST(cache_slots_are_reused_after_a_drop) {
  fx_t f;
  kvc_layout_t l = fx_small_layout();
  fx_open(&f, &l, 16); /* "main" and 63 more fill the 64 slots */
  uint32_t ids[64], id;
  char name[16];
  ids[0] = f.cid;
  for (int i = 1; i < 64; i++) {
    snprintf(name, sizeof name, "c%d", i);
    ASSERT_OK(engine_cache_open_in(f.eng, 1, name, &f.lay, &ids[i]));
  }
  ASSERT_ERR(engine_cache_open_in(f.eng, 1, "more", &f.lay, &id), KVC_E_TOOMANY);
  for (int round = 0; round < 3; round++) {
    f.cid = ids[7];
    ASSERT_OK(fx_put(&f, 1, 0, 5, 7));
    ASSERT_OK(engine_cache_drop(f.eng, ids[7]));
    ASSERT_OK(engine_cache_open_in(f.eng, 2, "more", &f.lay, &id));
    ASSERT(id != ids[7]);
    ASSERT_EQ(id & 0xffff, ids[7] & 0xffff); /* the slot, reused */
    ASSERT_ERR(fx_get_rc(&f, 1, 0, 5, fx_all(&f.lay)), KVC_E_NOCACHE); /* stale id */
    ASSERT_ERR(engine_cache_drop(f.eng, ids[7]), KVC_E_NOCACHE);
    f.cid = id;
    ASSERT_ERR(fx_get_rc(&f, 1, 0, 5, fx_all(&f.lay)), KVC_E_NOSEQ); /* a new, empty cache */
    ASSERT_OK(engine_cache_drop(f.eng, id));
    ASSERT_OK(engine_cache_open_in(f.eng, 1, "c7", &f.lay, &ids[7]));
    FX_AUDIT(f.eng);
  }
  ASSERT_ERR(engine_cache_open_in(f.eng, 1, "more", &f.lay, &id), KVC_E_TOOMANY);
  ASSERT_U64_EQ(fx_stats(&f).caches, 64);
  fx_close(&f);
}

/* Puts [0, n) of seq with token ids under salt `salt` (a 4-byte key). */
static int put_salted(fx_t *f, uint64_t seq, uint64_t n, uint32_t salt) {
  fx_rng_t r = fx_all(&f->lay);
  fx_buf_t b = fx_buf_new(&f->lay, r, n);
  uint32_t *ids = calloc(n + 1, sizeof *ids);
  fx_fill(&f->lay, r, seq, 0, n, salt, b.k, b.v);
  for (uint64_t i = 0; i < n; i++) ids[i] = (uint32_t)i + 1;
  engine_io_t io = fx_io(seq, 0, n, &b);
  io.tokens = ids;
  engine_pkey_t key = {&salt, sizeof salt, NULL, 0};
  engine_xfer_t x = fx_xfer(r, KVC_DTYPE_F32);
  x.pkey = &key;
  int rc = engine_put(f->eng, f->cid, &x, &io, 1);
  fx_buf_free(&b);
  free(ids);
  return rc;
}

/* Regression: every salt a client sent stayed interned for the engine's
 * life. Keys are counted per tenant, capped, and collected once no page or
 * sequence uses them. */
TEST(quota_keys_are_capped_and_freed_when_unused) {
  fx_t f;
  kvc_layout_t l = fx_small_layout();
  fx_open(&f, &l, 64);
  uint32_t hog = open_in(&f, 1, "h");
  engine_tenant_limits_t lim = {.max_keys = 4};
  ASSERT_OK(engine_tenant_limits_set(f.eng, 1, &lim));
  for (uint32_t s = 1; s <= 4; s++) ASSERT_OK(put_salted(&f, s, 8, s));
  ASSERT_EQ(usage(&f, 1).keys, 4);
  ASSERT_OK(put_salted(&f, 9, 8, 3)); /* a key it has: no new one */
  ASSERT_ERR(put_salted(&f, 5, 8, 5), KVC_E_QUOTA_KEYS);
  ASSERT(strstr(engine_last_error(f.eng)->msg, "tenant_max_keys") != NULL);
  ASSERT_U64_EQ(usage(&f, 1).refused_keys, 1);
  /* Another tenant's keys are its own. */
  open_in(&f, 2, "o");
  ASSERT_OK(put_salted(&f, 1, 8, 1));
  ASSERT_EQ(usage(&f, 2).keys, 1);
  f.cid = hog;
  /* Sequence 1 and its pages go (cleared cache pages stay cached under the
   * key until reclaimed): dropping the cache frees them all. */
  ASSERT_OK(engine_cache_drop(f.eng, hog));
  hog = open_in(&f, 1, "h");
  ASSERT_OK(put_salted(&f, 5, 8, 5)); /* the cap collects the unused keys first */
  ASSERT_EQ(usage(&f, 1).keys, 1);
  FX_EXPECT(&f, 5, 0, 8, 5);
  /* The periodic collection frees unused keys once they have doubled. */
  engine_tenant_limits_set(f.eng, 1, NULL);
  for (uint32_t s = 100; s < 300; s++) {
    ASSERT_OK(put_salted(&f, 6, 8, s));
    ASSERT_OK(engine_remove(f.eng, hog, 6, 0, 8));
    ASSERT_OK(engine_cache_clear(f.eng, hog)); /* pages and index entries go */
  }
  ASSERT(usage(&f, 1).keys >= 200);
  ASSERT(engine_keys_collect(f.eng) >= 200);
  ASSERT_EQ(usage(&f, 1).keys, 0);
  ASSERT_U64_EQ(engine_keys_collect(f.eng), 0); /* not doubled since */
  ASSERT_EQ(usage(&f, 2).keys, 1); /* in use */
  fx_close(&f);
}

/* A floor: another tenant's puts evict a floored tenant's least recent data
 * only down to its floor, then their own; the floored tenant's own puts are
 * not held by it; with nothing else to take, FULL, and nothing changed. */
TEST(quota_floor_holds_against_other_tenants) {
  fx_t f;
  kvc_layout_t l = fx_small_layout();
  fx_open(&f, &l, 12);
  engine_tenant_limits_t lim = {.min_bytes = 5 * f.page_bytes};
  ASSERT_OK(engine_tenant_limits_set(f.eng, 2, &lim));
  uint32_t kept = open_in(&f, 2, "kept");
  for (uint64_t s = 1; s <= 8; s++) ASSERT_OK(fx_put(&f, s, 0, 4, 2)); /* 8 pages, oldest first */
  uint32_t other = open_in(&f, 1, "other");
  for (uint64_t s = 1; s <= 12; s++) ASSERT_OK(fx_put(&f, s, 0, 4, 1));
  FX_AUDIT(f.eng);
  ASSERT_U64_EQ(usage(&f, 2).pages, 5); /* 3 evicted, then the floor held */
  ASSERT_U64_EQ(usage(&f, 1).pages, 7);
  f.cid = kept;
  for (uint64_t s = 1; s <= 3; s++) ASSERT_ERR(fx_get_rc(&f, s, 0, 4, fx_all(&f.lay)), KVC_E_NOSEQ);
  for (uint64_t s = 4; s <= 8; s++) FX_EXPECT(&f, s, 0, 4, 2);
  /* The other tenant's own oldest went for its last puts: 6..12 remain. */
  f.cid = other;
  for (uint64_t s = 6; s <= 12; s++) FX_EXPECT(&f, s, 0, 4, 1);
  /* Pinned, the other tenant has nothing to give: FULL, nothing changes. */
  for (uint64_t s = 6; s <= 12; s++) ASSERT_OK(engine_pin(f.eng, other, s, 9));
  ASSERT_ERR(fx_put(&f, 20, 0, 4, 1), KVC_E_FULL);
  ASSERT_U64_EQ(usage(&f, 2).pages, 5);
  /* The floored tenant's own put may take it below its floor (its data,
   * its choice of what goes): it evicts its own least recent. */
  f.cid = kept;
  ASSERT_OK(fx_put(&f, 9, 0, 8, 2));
  ASSERT_ERR(fx_get_rc(&f, 4, 0, 4, fx_all(&f.lay)), KVC_E_NOSEQ);
  FX_EXPECT(&f, 9, 0, 8, 2);
  FX_AUDIT(f.eng);
  fx_close(&f);
}

/* Sequences the engine names: unique, at or above 2^63, counted against the
 * tenant's quota all or nothing, skipping an id a caller took. */
TEST(seq_create_names_unique_ids_within_the_quota) {
  fx_t f;
  kvc_layout_t l = fx_small_layout();
  fx_open(&f, &l, 8);
  uint32_t cid = open_in(&f, 3, "c");
  limits(&f, 3, 0, 0, 5, 0);
  ASSERT_OK(fx_put(&f, ENGINE_AUTO_SEQ_ID + 1, 0, 1, 0)); /* a caller took one in the range */
  uint64_t ids[4];
  ASSERT_OK(engine_seq_create(f.eng, cid, 3, ids));
  ASSERT_U64_EQ(ids[0], ENGINE_AUTO_SEQ_ID);
  ASSERT_U64_EQ(ids[1], ENGINE_AUTO_SEQ_ID + 2); /* skipped the taken one */
  ASSERT_U64_EQ(usage(&f, 3).seqs, 4);
  ASSERT_ERR(engine_seq_create(f.eng, cid, 2, ids), KVC_E_QUOTA_SEQS);
  ASSERT_U64_EQ(usage(&f, 3).seqs, 4); /* nothing kept */
  ASSERT_ERR(engine_seq_create(f.eng, cid, 0, ids), KVC_E_INVAL);
  ASSERT_ERR(engine_seq_create(f.eng, 999, 1, ids), KVC_E_NOCACHE);
  ASSERT_OK(fx_put(&f, ids[2], 0, 4, 7)); /* an empty sequence a put starts */
  FX_EXPECT(&f, ids[2], 0, 4, 7);
  FX_AUDIT(f.eng);
  fx_close(&f);
}
