/* diskfmt.c: encoding and checking the disk tier's page files (diskfmt.h). */
#include "diskfmt.h"

#include <string.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>
#include <xxh_x86dispatch.h> /* the same XXH3, with AVX2/AVX-512 where the CPU has them */

static const uint8_t MAGIC[8] = {'K', 'V', 'C', 'T', 'I', 'E', 'R', 0};

#define OFF_VERSION 8
#define OFF_HEADER_BYTES 12
#define OFF_DATA_BYTES 16
#define OFF_DATA_SUM 24
#define OFF_HEADER_SUM 32
#define OFF_TENANT 40
#define OFF_HASH_KIND 44
#define OFF_PAGE_TOKENS 48
#define OFF_FLAGS 52
#define OFF_LAYOUT_BYTES 56
#define OFF_HASH 64
#define OFF_PARENT 96
#define OFF_TENANT_NAME 128
#define OFF_CACHE 176
#define OFF_KEY_LENS 248
#define OFF_SALT 256
#define OFF_EXTRA 320
#define OFF_LAYOUT 384
#define LAYOUT_MAX 128u
#define FLAG_HEAD 1u

_Static_assert(sizeof(kvc_layout_t) <= LAYOUT_MAX, "the layout fits its header field");
_Static_assert(KVC_MAX_NAME + 1 <= 72, "a cache name fits its header field");

static void put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static uint32_t get32(const uint8_t *p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}
static uint64_t get64(const uint8_t *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}

uint32_t diskfmt_header_bytes(uint32_t page_tokens) {
  uint64_t n = DISKFMT_FIXED + 4ull * page_tokens;
  return (uint32_t)((n + 4095) / 4096 * 4096);
}

void diskfmt_encode(const engine_page_t *m, const char *tenant, const void *data,
                    uint8_t *hdr) {
  uint32_t hb = diskfmt_header_bytes(m->page_tokens);
  memset(hdr, 0, hb);
  memcpy(hdr, MAGIC, 8);
  put32(hdr + OFF_VERSION, DISKFMT_VERSION);
  put32(hdr + OFF_HEADER_BYTES, hb);
  put64(hdr + OFF_DATA_BYTES, m->data_bytes);
  put64(hdr + OFF_DATA_SUM, XXH3_64bits_dispatch(data, m->data_bytes));
  put32(hdr + OFF_TENANT, m->tenant);
  put32(hdr + OFF_HASH_KIND, m->hash_kind);
  put32(hdr + OFF_PAGE_TOKENS, m->page_tokens);
  put32(hdr + OFF_FLAGS, m->head ? FLAG_HEAD : 0);
  put32(hdr + OFF_LAYOUT_BYTES, (uint32_t)sizeof m->layout);
  memcpy(hdr + OFF_HASH, m->hash, 32);
  if (!m->head) memcpy(hdr + OFF_PARENT, m->parent, 32);
  size_t tl = strnlen(tenant, DISKFMT_TENANT_MAX - 1);
  memcpy(hdr + OFF_TENANT_NAME, tenant, tl);
  memcpy(hdr + OFF_CACHE, m->cache, strnlen(m->cache, KVC_MAX_NAME));
  hdr[OFF_KEY_LENS] = m->salt.len;
  hdr[OFF_KEY_LENS + 1] = m->extra.len;
  memcpy(hdr + OFF_SALT, m->salt.bytes, m->salt.len);
  memcpy(hdr + OFF_EXTRA, m->extra.bytes, m->extra.len);
  memcpy(hdr + OFF_LAYOUT, &m->layout, sizeof m->layout);
  memcpy(hdr + DISKFMT_FIXED, m->tokens, 4ull * m->page_tokens);
  put64(hdr + OFF_HEADER_SUM, XXH3_64bits_dispatch(hdr, hb));
}

uint32_t diskfmt_need(const uint8_t *hdr) {
  if (memcmp(hdr, MAGIC, 8) != 0 || get32(hdr + OFF_VERSION) != DISKFMT_VERSION) return 0;
  uint32_t T = get32(hdr + OFF_PAGE_TOKENS), hb = get32(hdr + OFF_HEADER_BYTES);
  if (T == 0 || T > KVC_MAX_PAGE_TOKENS || hb != diskfmt_header_bytes(T)) return 0;
  return hb;
}

int diskfmt_decode(const uint8_t *hdr, size_t len, diskfmt_info_t *out, const char **why) {
  *why = "shorter than a header";
  if (len < DISKFMT_FIXED) return -1;
  *why = memcmp(hdr, MAGIC, 8) != 0 ? "not a page file (magic)" : "another format version";
  uint32_t hb = diskfmt_need(hdr);
  if (!hb) {
    if (memcmp(hdr, MAGIC, 8) == 0 && get32(hdr + OFF_VERSION) == DISKFMT_VERSION)
      *why = "bad header sizes";
    return -1;
  }
  *why = "header cut short";
  if (len < hb) return -1;
  /* The checksum over the whole header, its own field as zero. */
  uint64_t want = get64(hdr + OFF_HEADER_SUM);
  XXH3_state_t st;
  static const uint8_t zero[8];
  XXH3_64bits_reset(&st);
  XXH3_64bits_update_dispatch(&st, hdr, OFF_HEADER_SUM);
  XXH3_64bits_update_dispatch(&st, zero, 8);
  XXH3_64bits_update_dispatch(&st, hdr + OFF_HEADER_SUM + 8, hb - OFF_HEADER_SUM - 8);
  *why = "header checksum";
  if (XXH3_64bits_digest(&st) != want) return -1;
  *why = "bad header fields";
  if (get32(hdr + OFF_LAYOUT_BYTES) != sizeof out->m.layout || hdr[OFF_KEY_LENS] > 64 ||
      hdr[OFF_KEY_LENS + 1] > 64 || hdr[OFF_TENANT_NAME + DISKFMT_TENANT_MAX - 1] ||
      hdr[OFF_CACHE + KVC_MAX_NAME] || get64(hdr + OFF_DATA_BYTES) == 0)
    return -1;
  memset(out, 0, sizeof *out);
  engine_page_t *m = &out->m;
  m->tenant = get32(hdr + OFF_TENANT);
  m->hash_kind = get32(hdr + OFF_HASH_KIND);
  m->page_tokens = get32(hdr + OFF_PAGE_TOKENS);
  m->data_bytes = get64(hdr + OFF_DATA_BYTES);
  m->head = get32(hdr + OFF_FLAGS) & FLAG_HEAD;
  m->portable = true; /* only such pages are written */
  memcpy(m->hash, hdr + OFF_HASH, 32);
  memcpy(m->parent, hdr + OFF_PARENT, 32);
  memcpy(out->tenant, hdr + OFF_TENANT_NAME, DISKFMT_TENANT_MAX);
  memcpy(m->cache, hdr + OFF_CACHE, KVC_MAX_NAME + 1);
  m->salt.len = hdr[OFF_KEY_LENS];
  m->extra.len = hdr[OFF_KEY_LENS + 1];
  memcpy(m->salt.bytes, hdr + OFF_SALT, 64);
  memcpy(m->extra.bytes, hdr + OFF_EXTRA, 64);
  memcpy(&m->layout, hdr + OFF_LAYOUT, sizeof m->layout);
  m->tokens = (const uint32_t *)(const void *)(hdr + DISKFMT_FIXED); /* 4-aligned */
  out->header_bytes = hb;
  out->data_sum = get64(hdr + OFF_DATA_SUM);
  return 0;
}

bool diskfmt_data_ok(const diskfmt_info_t *info, const void *data) {
  return XXH3_64bits_dispatch(data, info->m.data_bytes) == info->data_sum;
}

_Static_assert(sizeof(XXH3_state_t) <= sizeof(((diskfmt_sum_t *)0)->state), "XXH3 state fits");

void diskfmt_sum_init(diskfmt_sum_t *s) { XXH3_64bits_reset((XXH3_state_t *)(void *)s->state); }

void diskfmt_sum_update(diskfmt_sum_t *s, const void *p, size_t n) {
  XXH3_64bits_update_dispatch((XXH3_state_t *)(void *)s->state, p, n);
}

bool diskfmt_sum_ok(diskfmt_sum_t *s, const diskfmt_info_t *info) {
  return XXH3_64bits_digest((XXH3_state_t *)(void *)s->state) == info->data_sum;
}

void diskfmt_name(const uint8_t hash[32], char out[DISKFMT_NAME_MAX]) {
  static const char hex[] = "0123456789abcdef";
  for (int i = 0; i < 32; i++) {
    out[2 * i] = hex[hash[i] >> 4];
    out[2 * i + 1] = hex[hash[i] & 15];
  }
  memcpy(out + 64, ".kvp", 5);
}

bool diskfmt_parse_name(const char *name, uint8_t hash[32]) {
  if (strlen(name) != 68 || strcmp(name + 64, ".kvp") != 0) return false;
  for (int i = 0; i < 64; i++) {
    char c = name[i];
    int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (v < 0) return false;
    if (i % 2 == 0) hash[i / 2] = (uint8_t)(v << 4);
    else hash[i / 2] |= (uint8_t)v;
  }
  return true;
}
