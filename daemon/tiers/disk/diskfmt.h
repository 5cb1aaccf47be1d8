/* diskfmt.h: the disk tier's file format, version 1 (doc/tiers.md). Pure
 * functions over bytes: no I/O, so the format is tested and fuzzed alone.
 *
 * One file a page, named by its chain hash (64 hex digits + ".kvp"):
 *
 *   0    magic "KVCTIER\0"          8
 *   8    version (1)                u32
 *   12   header_bytes               u32   512 + 4 * page_tokens, rounded up to 4096
 *   16   data_bytes                 u64   the layout's page bytes that follow the header
 *   24   data_sum                   u64   XXH3-64 of the data
 *   32   header_sum                 u64   XXH3-64 of the header with this field zero
 *   40   tenant                     u32   the daemon's tenant number
 *   44   hash_kind                  u32   0 sha256, 1 xxh3
 *   48   page_tokens                u32
 *   52   flags                      u32   bit 0: head of its chain
 *   56   layout_bytes               u32   sizeof(kvc_layout_t) of the writer
 *   60   (zero)                     u32
 *   64   chain hash                 32
 *   96   parent's chain hash        32    zero for a head
 *   128  tenant name                48    NUL-padded
 *   176  cache name                 72    NUL-padded
 *   248  salt length, extra length  u8, u8, then 6 zero bytes
 *   256  salt                       64
 *   320  extra                      64
 *   384  layout                     layout_bytes (at most 128): the engine's struct
 *   512  token ids                  u32 x page_tokens
 *        (zero up to header_bytes), then the data
 *
 * Little-endian, as the daemon itself requires. A file whose magic,
 * version, sizes or checksums disagree is not a page of this tier.
 */
#ifndef KVCD_DISKFMT_H
#define KVCD_DISKFMT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine_tier.h"

#define DISKFMT_VERSION 1u
#define DISKFMT_FIXED 512u        /* bytes before the token ids */
#define DISKFMT_TENANT_MAX 48u    /* bytes of a tenant name with its NUL */
#define DISKFMT_NAME_MAX 72u      /* a file name with its NUL */

/* What a header says. m.tokens points into the header it was read from. */
typedef struct diskfmt_info {
  engine_page_t m;
  char tenant[DISKFMT_TENANT_MAX]; /* the tenant's name */
  uint32_t header_bytes;
  uint64_t data_sum;
} diskfmt_info_t;

/* Bytes of the header of a page of page_tokens tokens. */
uint32_t diskfmt_header_bytes(uint32_t page_tokens);

/* Writes the header of m, of tenant `tenant` (a name, truncated to 47
 * bytes), over data (m->data_bytes of it) into hdr (header_bytes of
 * m->page_tokens). Borrows everything. */
void diskfmt_encode(const engine_page_t *m, const char *tenant, const void *data,
                    uint8_t *hdr);

/* Reads the header at hdr (len bytes of the file's start): 0 and *out, or
 * -1 and *why (a static phrase). With len < the header's own size it fails
 * too: header_bytes first needs DISKFMT_FIXED bytes (diskfmt_need). */
int diskfmt_decode(const uint8_t *hdr, size_t len, diskfmt_info_t *out, const char **why);

/* The header size the fixed part at hdr (DISKFMT_FIXED bytes) announces, or
 * 0 when it is not one of this version. */
uint32_t diskfmt_need(const uint8_t *hdr);

/* Whether data (the header's data_bytes) has the header's checksum. */
bool diskfmt_data_ok(const diskfmt_info_t *info, const void *data);

/* The same checksum over data given in pieces (read a piece, sum it while
 * it is in the CPU's cache). */
typedef struct diskfmt_sum {
  _Alignas(64) unsigned char state[640]; /* an XXH3 state */
} diskfmt_sum_t;
void diskfmt_sum_init(diskfmt_sum_t *s);
void diskfmt_sum_update(diskfmt_sum_t *s, const void *p, size_t n);
bool diskfmt_sum_ok(diskfmt_sum_t *s, const diskfmt_info_t *info);

/* "<64 hex>.kvp" of a chain hash, and back (false: not such a name). */
void diskfmt_name(const uint8_t hash[32], char out[DISKFMT_NAME_MAX]);
bool diskfmt_parse_name(const char *name, uint8_t hash[32]);

#endif
