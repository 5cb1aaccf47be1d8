/* diskfmt.c: the disk tier's page file format: a header reads back as
 * written, and every byte of a header or of the data that changes is seen
 * (a header checksum, a data checksum), as are a cut file and another
 * version. */
#include "../../daemon/tiers/disk/diskfmt.h"
#include "test.h"

#define T 16u
#define DATA 1000u

static void meta(engine_page_t *m, uint32_t *ids) {
  memset(m, 0, sizeof *m);
  m->tenant = 3;
  snprintf(m->cache, sizeof m->cache, "chat");
  m->layout = (kvc_layout_t){.num_layers = 2, .num_kv_heads = 2, .head_dim_k = 8,
                             .head_dim_v = 8, .dtype = KVC_DTYPE_BF16, .page_tokens = T};
  m->page_tokens = T;
  m->data_bytes = DATA;
  for (int i = 0; i < 32; i++) m->hash[i] = (uint8_t)(i * 7 + 1), m->parent[i] = (uint8_t)i;
  m->salt.len = 3;
  memcpy(m->salt.bytes, "abc", 3);
  for (uint32_t i = 0; i < T; i++) ids[i] = 1000 + i;
  m->tokens = ids;
}

TEST(diskfmt_round_trip_and_every_change_seen) {
  engine_page_t m;
  uint32_t ids[T];
  uint8_t data[DATA];
  meta(&m, ids);
  for (uint32_t i = 0; i < DATA; i++) data[i] = (uint8_t)(i * 13);
  uint32_t hb = diskfmt_header_bytes(T);
  ASSERT_EQ(hb, 4096);
  ASSERT_EQ(diskfmt_header_bytes(4096), 20480); /* 512 + 16 KiB of ids, rounded up */
  uint8_t *hdr = calloc(1, hb);
  ASSERT(hdr != NULL);
  diskfmt_encode(&m, "uid:1000", data, hdr);
  ASSERT_EQ(diskfmt_need(hdr), hb);
  diskfmt_info_t in;
  const char *why = NULL;
  ASSERT_EQ(diskfmt_decode(hdr, hb, &in, &why), 0);
  ASSERT_STR_EQ(in.tenant, "uid:1000");
  ASSERT_STR_EQ(in.m.cache, "chat");
  ASSERT_EQ(in.m.tenant, 3);
  ASSERT_EQ(in.m.page_tokens, T);
  ASSERT_U64_EQ(in.m.data_bytes, DATA);
  ASSERT(!in.m.head);
  ASSERT_MEM_EQ(in.m.hash, m.hash, 32);
  ASSERT_MEM_EQ(in.m.parent, m.parent, 32);
  ASSERT_MEM_EQ(&in.m.layout, &m.layout, sizeof m.layout);
  ASSERT_MEM_EQ(in.m.tokens, ids, sizeof ids);
  ASSERT_EQ(in.m.salt.len, 3);
  ASSERT_EQ(in.m.extra.len, 0);
  ASSERT(diskfmt_data_ok(&in, data));
  /* Every byte of the header matters. */
  for (uint32_t i = 0; i < hb; i++) {
    hdr[i] ^= 0x10;
    if (diskfmt_decode(hdr, hb, &in, &why) == 0) TEST_FAIL_("header byte %u changed unseen", i);
    hdr[i] ^= 0x10;
  }
  ASSERT_EQ(diskfmt_decode(hdr, hb - 1, &in, &why), -1); /* cut short */
  ASSERT_EQ(diskfmt_decode(hdr, 100, &in, &why), -1);
  ASSERT_EQ(diskfmt_decode(hdr, hb, &in, &why), 0);
  /* And every byte of the data. */
  for (uint32_t i = 0; i < DATA; i += 37) {
    data[i] ^= 1;
    ASSERT(!diskfmt_data_ok(&in, data));
    data[i] ^= 1;
  }
  hdr[8] = 2; /* another version, whatever its checksum */
  ASSERT_EQ(diskfmt_need(hdr), 0);
  ASSERT_EQ(diskfmt_decode(hdr, hb, &in, &why), -1);
  ASSERT_STR_EQ(why, "another format version");
  free(hdr);
}

TEST(diskfmt_names) {
  uint8_t h[32], back[32];
  char name[DISKFMT_NAME_MAX];
  for (int i = 0; i < 32; i++) h[i] = (uint8_t)(0xf0 - i * 5);
  diskfmt_name(h, name);
  ASSERT_EQ(strlen(name), 68);
  ASSERT(diskfmt_parse_name(name, back));
  ASSERT_MEM_EQ(back, h, 32);
  ASSERT(!diskfmt_parse_name("tenants", back));
  ASSERT(!diskfmt_parse_name("tmp", back));
  name[3] = 'G';
  ASSERT(!diskfmt_parse_name(name, back));
  name[3] = 'A'; /* upper case is not what diskfmt_name writes */
  ASSERT(!diskfmt_parse_name(name, back));
}
