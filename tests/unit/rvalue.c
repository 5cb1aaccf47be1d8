/* rvalue.c: the cluster tier's pure parts: Redis Cluster key slots (CRC16
 * and hash tags, as the specification gives them), and a page's key and
 * value: every reason a value is refused, and a value that verifies
 * serving exactly the page it was written from. */
#include "../../daemon/tiers/cluster/rslot.h"
#include "../../daemon/tiers/cluster/rvalue.h"
#include "test.h"

TEST(rslot_follows_the_redis_cluster_specification) {
  ASSERT_EQ(rslot_crc16("123456789", 9), 0x31c3); /* the specification's check value */
  ASSERT_EQ(rslot_of("foo", 3), 12182);
  ASSERT_EQ(rslot_of("bar", 3), 5061);
  /* a hash tag: only what is between the first { and the next } */
  ASSERT_EQ(rslot_of("{user1000}.following", 20), rslot_of("user1000", 8));
  ASSERT_EQ(rslot_of("{user1000}.followers", 20), rslot_of("user1000", 8));
  ASSERT_EQ(rslot_of("foo{}{bar}", 10), rslot_crc16("foo{}{bar}", 10) & 16383); /* {} is no tag */
  ASSERT_EQ(rslot_of("foo{{bar}}zap", 13), rslot_of("{bar", 4));
  ASSERT_EQ(rslot_of("foo{bar}{zap}", 13), rslot_of("bar", 3));
  ASSERT_EQ(rslot_of("{", 1), rslot_crc16("{", 1) & 16383);
  ASSERT_EQ(rslot_of("", 0), 0);
}

#define PT 4u
#define PB 256u

typedef struct page {
  uint32_t ids[PT];
  uint8_t bytes[PB];
  engine_page_t pg;
} page_t;

static void page_make(page_t *p, uint8_t fill, bool parent) {
  for (uint32_t i = 0; i < PT; i++) p->ids[i] = 1000 + i + fill;
  memset(p->bytes, fill, PB);
  memset(&p->pg, 0, sizeof p->pg);
  p->pg.page_tokens = PT;
  p->pg.tokens = p->ids;
  p->pg.bytes = p->bytes;
  p->pg.data_bytes = PB;
  memset(p->pg.hash, 0x11 + fill, 32);
  p->pg.head = !parent;
  if (parent) memset(p->pg.parent, 0x22, 32);
}

static kvc_layout_t layout(void) {
  kvc_layout_t l = {.num_layers = 1, .num_kv_heads = 1, .head_dim_k = 8, .head_dim_v = 8,
                    .dtype = KVC_DTYPE_F32, .page_tokens = PT};
  return l;
}

TEST(rvalue_keys_name_version_tenant_and_layout_never_the_salt) {
  rvalue_secret_t *s = rvalue_secret_new("fleet-secret-0123456789", 23);
  rvalue_secret_t *s2 = rvalue_secret_new("another-secret-01234567", 23);
  uint8_t a[32], b[32];
  rvalue_tenant_identity("fleet-a", a);
  rvalue_tenant_identity("fleet-b", b);
  kvc_layout_t l = layout(), l2 = layout();
  l2.num_kv_heads = 2;
  rvalue_cache_t ca, cb, cl, cs;
  rvalue_cache_init(&ca, s, a, &l, PB);
  rvalue_cache_init(&cb, s, b, &l, PB);
  rvalue_cache_init(&cl, s, a, &l2, 2 * PB);
  rvalue_cache_init(&cs, s2, a, &l, PB);
  uint8_t h[32] = {1, 2, 3};
  char ka[RVALUE_KEY_MAX], kb[RVALUE_KEY_MAX], kl[RVALUE_KEY_MAX], ks[RVALUE_KEY_MAX];
  size_t n = rvalue_key(&ca, s, h, ka);
  ASSERT_EQ(n, strlen(ka));
  ASSERT_EQ(strncmp(ka, "kvc1:", 5), 0);
  ASSERT_EQ(n, 5 + 16 + 1 + 8 + 1 + 40);
  rvalue_key(&cb, s, h, kb);
  rvalue_key(&cl, s, h, kl);
  rvalue_key(&cs, s2, h, ks);
  ASSERT(strncmp(ka, kb, 22) != 0);                              /* the tenant tag */
  ASSERT(strncmp(ka, kl, 22) == 0 && strncmp(ka, kl, 31) != 0); /* the layout tag */
  ASSERT(strcmp(ka, ks) != 0);                                   /* the secret's names */
  uint8_t h2[32] = {1, 2, 4};
  rvalue_key(&ca, s, h2, kb);
  ASSERT(strncmp(ka, kb, 31) == 0 && strcmp(ka, kb) != 0); /* the page */
  uint8_t shared[32];
  rvalue_tenant_identity(NULL, shared);
  rvalue_tenant_identity("shared", b); /* a tenant named "shared" is not the shared caches */
  ASSERT(memcmp(shared, b, 32) != 0);
  rvalue_secret_free(s);
  rvalue_secret_free(s2);
}

TEST(rvalue_serves_only_what_verifies) {
  rvalue_secret_t *s = rvalue_secret_new("fleet-secret-0123456789", 23);
  rvalue_secret_t *bad = rvalue_secret_new("not-the-fleet-secret-99", 23);
  rvalue_secret_t *none = rvalue_secret_new(NULL, 0);
  uint8_t a[32], b[32];
  rvalue_tenant_identity("fleet-a", a);
  rvalue_tenant_identity("fleet-b", b);
  kvc_layout_t l = layout(), l2 = layout();
  l2.dtype = KVC_DTYPE_F16;
  rvalue_cache_t rc, rcb, rcl, rcn;
  rvalue_cache_init(&rc, s, a, &l, PB);
  rvalue_cache_init(&rcb, s, b, &l, PB);
  rvalue_cache_init(&rcl, s, a, &l2, PB);
  rvalue_cache_init(&rcn, none, a, &l, PB);
  page_t p;
  page_make(&p, 7, true);
  size_t len = rvalue_size(&rc);
  ASSERT_EQ(len, 168 + 4 * PT + PB + 16);
  uint8_t *v = malloc(len), *w = malloc(len);
  ASSERT_EQ(rvalue_encode(&rc, s, &p.pg, v), 0);
  const uint8_t *bytes = NULL;
  ASSERT_EQ(rvalue_verify(&rc, s, v, len, p.pg.hash, p.pg.parent, p.ids, &bytes), RV_OK);
  ASSERT(bytes == v + 168 + 4 * PT);
  ASSERT_MEM_EQ(bytes, p.bytes, PB);
  /* two writes of a page differ (a nonce each) and both verify */
  ASSERT_EQ(rvalue_encode(&rc, s, &p.pg, w), 0);
  ASSERT(memcmp(v, w, len) != 0);
  ASSERT_EQ(rvalue_verify(&rc, s, w, len, p.pg.hash, p.pg.parent, p.ids, &bytes), RV_OK);
  /* every byte flipped is refused: header, ids, page, tag */
  for (size_t i = 0; i < len; i++) {
    memcpy(w, v, len);
    w[i] ^= 0x40;
    enum rvalue_verdict why = rvalue_verify(&rc, s, w, len, p.pg.hash, p.pg.parent, p.ids, &bytes);
    if (why == RV_OK) TEST_FAIL_("byte %zu flipped and the value still verifies", i);
  }
  uint32_t other_ids[PT] = {1, 2, 3, 4};
  uint8_t other_hash[32] = {9}, no_parent[32] = {0};
  ASSERT_EQ(rvalue_verify(&rc, s, v, len - 1, p.pg.hash, p.pg.parent, p.ids, &bytes), RV_TRUNCATED);
  ASSERT_EQ(rvalue_verify(&rc, s, v, 100, p.pg.hash, p.pg.parent, p.ids, &bytes), RV_TRUNCATED);
  ASSERT_EQ(rvalue_verify(&rc, s, (const uint8_t *)"OK", 2, p.pg.hash, NULL, p.ids, &bytes), RV_FORMAT);
  memcpy(w, v, len);
  w[4] = 2; /* a format of another release */
  ASSERT_EQ(rvalue_verify(&rc, s, w, len, p.pg.hash, p.pg.parent, p.ids, &bytes), RV_STALE);
  ASSERT_EQ(rvalue_verify(&rc, bad, v, len, p.pg.hash, p.pg.parent, p.ids, &bytes), RV_MAC);
  ASSERT_EQ(rvalue_verify(&rcb, s, v, len, p.pg.hash, p.pg.parent, p.ids, &bytes), RV_TENANT);
  ASSERT_EQ(rvalue_verify(&rcl, s, v, len, p.pg.hash, p.pg.parent, p.ids, &bytes), RV_LAYOUT);
  ASSERT_EQ(rvalue_verify(&rc, s, v, len, other_hash, p.pg.parent, p.ids, &bytes), RV_CHAIN);
  ASSERT_EQ(rvalue_verify(&rc, s, v, len, p.pg.hash, NULL, p.ids, &bytes), RV_CHAIN);
  ASSERT_EQ(rvalue_verify(&rc, s, v, len, p.pg.hash, no_parent, p.ids, &bytes), RV_CHAIN);
  ASSERT_EQ(rvalue_verify(&rc, s, v, len, p.pg.hash, p.pg.parent, other_ids, &bytes), RV_TOKENS);
  /* a value written without the secret verifies only without it */
  ASSERT_EQ(rvalue_encode(&rcn, none, &p.pg, w), 0);
  ASSERT_EQ(rvalue_verify(&rc, s, w, len, p.pg.hash, p.pg.parent, p.ids, &bytes), RV_MAC);
  ASSERT_EQ(rvalue_verify(&rcn, none, w, len, p.pg.hash, p.pg.parent, p.ids, &bytes), RV_OK);
  /* a chain head has no parent */
  page_t head;
  page_make(&head, 3, false);
  ASSERT_EQ(rvalue_encode(&rc, s, &head.pg, w), 0);
  ASSERT_EQ(rvalue_verify(&rc, s, w, len, head.pg.hash, NULL, head.ids, &bytes), RV_OK);
  ASSERT_EQ(rvalue_verify(&rc, s, w, len, head.pg.hash, p.pg.parent, head.ids, &bytes), RV_CHAIN);
  /* the copy that verifies on the way: the page's bytes, or false */
  uint8_t dst[PB];
  ASSERT(rvalue_copy_verified(s, v, len, dst));
  ASSERT_MEM_EQ(dst, p.bytes, PB);
  memcpy(w, v, len);
  w[168 + 4 * PT + 77] ^= 1;
  ASSERT(!rvalue_copy_verified(s, w, len, dst));
  ASSERT(!rvalue_copy_verified(bad, v, len, dst));
  /* a page of another shape is not encoded */
  head.pg.data_bytes = PB / 2;
  ASSERT_EQ(rvalue_encode(&rc, s, &head.pg, w), -1);
  for (int k = RV_OK; k < RV_VERDICTS_; k++) ASSERT(strcmp(rvalue_verdict_name((enum rvalue_verdict)k), "?") != 0);
  free(v), free(w);
  rvalue_secret_free(s), rvalue_secret_free(bad), rvalue_secret_free(none);
}
