/* gen_corpus.c: writes the fuzzers' seed corpus from valid requests.
 *
 *   gen_corpus DIR    writes the files of DIR/frame, DIR/msg, DIR/fast and DIR/handler
 *
 * msg seeds are single payloads for fuzz_msg's fixed state (cache 0, seqs 1
 * and 2, seq 3 written with token ids); fast seeds are fast request slot
 * bodies (proto/ringfast.h) for the same state; handler seeds are scenarios
 * of several connections in fuzz_handler's record format; frame seeds are
 * framed streams.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz_daemon.h"
#include "fuzz_seed.h"

static const char *root;
static uint8_t buf[FZ_MAX_FRAME];

static void write_file(const char *target, const char *name, const uint8_t *p, size_t n) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", root, target);
  if (mkdir(path, 0755) != 0 && errno != EEXIST) {
    perror(path);
    exit(1);
  }
  snprintf(path, sizeof path, "%s/%s/%s", root, target, name);
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(p, 1, n, f) != n || fclose(f) != 0) {
    perror(path);
    exit(1);
  }
}

/* ---- handler scenarios: records [ctl][len lo][len hi][bytes] ---------------- */

static uint8_t scen[1 << 16];
static size_t scen_len;

static void rec(unsigned conn, unsigned op, const uint8_t *p, size_t n) {
  scen[scen_len++] = (uint8_t)(op << 2 | conn);
  scen[scen_len++] = (uint8_t)n;
  scen[scen_len++] = (uint8_t)(n >> 8);
  memcpy(scen + scen_len, p, n);
  scen_len += n;
}
static void frame(unsigned conn, size_t n) { rec(conn, 0, buf, n); }
/* A fast request's slot body (op 2). */
static void fast(unsigned conn, const ringfast_req_t *q) {
  uint8_t body[RING_FAST_BODY];
  ringfast_req_encode(q, body);
  rec(conn, 2, body, sizeof body);
}
static void hello(unsigned conn) { rec(conn, 6, NULL, 0); }
static void disconnect(unsigned conn) { rec(conn, 4, NULL, 0); }
static void fail_alloc(unsigned k) {
  uint8_t b = (uint8_t)k;
  rec(0, 5, &b, 1);
}
/* Writes n bytes at off of the connection's shared buffer (op 7). */
static void shm_write(unsigned conn, uint32_t off, const void *p, size_t n) {
  uint8_t b[3 + 1024];
  b[0] = (uint8_t)off, b[1] = (uint8_t)(off >> 8), b[2] = (uint8_t)(off >> 16);
  memcpy(b + 3, p, n);
  rec(conn, 7, b, 3 + n);
}
/* ntokens token ids first, first + 1, ... at off (u32 little-endian). */
static void shm_tokens(unsigned conn, uint32_t off, uint32_t first, size_t ntokens) {
  uint32_t ids[256];
  for (size_t i = 0; i < ntokens; i++) ids[i] = first + (uint32_t)i;
  shm_write(conn, off, ids, ntokens * 4);
}
static void scenario(const char *name) {
  write_file("handler", name, scen, scen_len);
  scen_len = 0;
}

static void handler_seeds(void) {
  const uint32_t F32 = KVCACHE__V1__DTYPE__F32;
  /* put, get, copy_prefix, COW on both sides, remove. */
  hello(0);
  frame(0, seed_cache_open(buf, 1, "f", F32));
  frame(0, seed_io(buf, 2, 1, 0, 1, 0, 6, 1, SEED_TOKEN_BYTES, NULL));
  frame(0, seed_seqop(buf, 3, SEED_COPY, 0, 1, 2, 5));
  frame(0, seed_io(buf, 4, 1, 0, 2, 5, 2, 1, SEED_TOKEN_BYTES, NULL));
  frame(0, seed_io(buf, 5, 1, 0, 1, 6, 3, 1, SEED_TOKEN_BYTES, NULL));
  frame(0, seed_io(buf, 6, 0, 0, 1, 0, 9, 1, SEED_TOKEN_BYTES, NULL));
  frame(0, seed_io(buf, 7, 0, 0, 2, 0, 7, 1, SEED_TOKEN_BYTES, NULL));
  frame(0, seed_seqop(buf, 8, SEED_REMOVE, 0, 1, 4, 100));
  frame(0, seed_seqop(buf, 9, SEED_INFO, 0, 2, 0, 0));
  scenario("cow_both_sides");

  /* Two connections share a cache; one pins and disconnects. */
  hello(0);
  hello(1);
  frame(0, seed_cache_open(buf, 1, "f", F32));
  frame(1, seed_cache_open(buf, 1, "f", F32));
  frame(0, seed_io(buf, 2, 1, 0, 10, 0, 8, 4, SEED_TOKEN_BYTES, NULL));
  frame(0, seed_seqop(buf, 3, SEED_PIN, 0, 10, 0, 0));
  frame(1, seed_seqop(buf, 2, SEED_PIN, 0, 11, 0, 0));
  frame(1, seed_seqop(buf, 3, SEED_COPY, 0, 10, 20, 8));
  disconnect(0);
  frame(1, seed_io(buf, 4, 0, 0, 20, 0, 8, 1, SEED_TOKEN_BYTES, NULL));
  frame(1, seed_seqop(buf, 5, SEED_UNPIN, 0, 11, 0, 0));
  frame(1, seed_seqop(buf, 6, SEED_LIST, 0, 0, 0, 3));
  frame(1, seed_seqop(buf, 7, SEED_STATS, 0, 0, 0, 0));
  scenario("two_conns_pin_disconnect");

  /* Fill the 24-page pool: eviction, then FULL with everything pinned. */
  hello(0);
  hello(2);
  frame(0, seed_cache_open(buf, 1, "f", F32));
  for (unsigned i = 0; i < 6; i++) /* 24 sequences of one page: the pool */
    frame(0, seed_io(buf, 2 + i, 1, 0, 100 + i * 4, 0, 4, 4, SEED_TOKEN_BYTES, NULL));
  for (unsigned i = 0; i < 4; i++) frame(2, seed_seqop(buf, 20 + i, SEED_PIN, 0, 100 + i, 0, 0));
  /* 24 pages needed, 20 reclaimable: FULL; after the pins go, it fits. */
  frame(0, seed_io(buf, 30, 1, 0, 500, 0, 12, 8, SEED_TOKEN_BYTES, NULL));
  disconnect(2);
  frame(0, seed_io(buf, 31, 1, 0, 500, 0, 12, 8, SEED_TOKEN_BYTES, NULL));
  frame(0, seed_io(buf, 32, 0, 0, 500, 0, 12, 8, SEED_TOKEN_BYTES, NULL));
  scenario("evict_and_full");

  /* int8 and f16 caches, layer and head ranges, raw reads. */
  hello(1);
  frame(1, seed_cache_open(buf, 1, "q", KVCACHE__V1__DTYPE__INT8));
  frame(1, seed_cache_open(buf, 2, "h", KVCACHE__V1__DTYPE__F16));
  frame(1, seed_io(buf, 3, 1, 0, 1, 0, 4, 2, SEED_TOKEN_BYTES, NULL));
  Kvcache__V1__Xfer raw = KVCACHE__V1__XFER__INIT;
  raw.dtype = KVCACHE__V1__DTYPE__INT8;
  raw.layer_begin = 1, raw.layer_end = 2, raw.head_begin = 0, raw.head_end = 1;
  frame(1, seed_io(buf, 4, 0, 0, 1, 0, 4, 1, 4, &raw));
  frame(1, seed_io(buf, 5, 1, 1, 1, 0, 4, 1, SEED_TOKEN_BYTES / 2, NULL));
  Kvcache__V1__Xfer l1 = KVCACHE__V1__XFER__INIT;
  l1.layer_begin = 1, l1.layer_end = 2;
  frame(1, seed_io(buf, 6, 1, 1, 1, 4, 2, 1, SEED_TOKEN_BYTES / 4, &l1));
  frame(1, seed_seqop(buf, 7, SEED_TRIM, 1, 1, 4, 0));
  frame(1, seed_seqop(buf, 8, SEED_RESUME, 1, 1, 4, 0));
  frame(1, seed_seqop(buf, 9, SEED_CLIST, 0, 0, 0, 0));
  frame(1, seed_seqop(buf, 10, SEED_CLEAR, 0, 0, 0, 0));
  frame(1, seed_seqop(buf, 11, SEED_DROP, 1, 0, 0, 0));
  scenario("dtypes_ranges_drop");

  /* fp8 and ggml block caches: bytes as given, converted both ways, a
   * head range, a head dim that is no multiple of 32, a shift without RoPE. */
  hello(1);
  frame(1, seed_cache_open(buf, 1, "e", KVCACHE__V1__DTYPE__FP8_E4M3)); /* cache 1 */
  frame(1, seed_cache_open_hd(buf, 2, "q", KVCACHE__V1__DTYPE__Q8_0, 32)); /* 2 */
  frame(1, seed_cache_open_hd(buf, 3, "f", KVCACHE__V1__DTYPE__Q4_0, 64)); /* 3 */
  frame(1, seed_cache_open_hd(buf, 4, "bad", KVCACHE__V1__DTYPE__Q4_0, 48)); /* HEADDIM */
  frame(1, seed_cache_open(buf, 5, "g", KVCACHE__V1__DTYPE__FP8_E5M2));
  Kvcache__V1__Xfer xf = KVCACHE__V1__XFER__INIT, xb = KVCACHE__V1__XFER__INIT,
                    xh = KVCACHE__V1__XFER__INIT;
  xf.dtype = KVCACHE__V1__DTYPE__F32;
  xb.dtype = KVCACHE__V1__DTYPE__BF16;
  xh.dtype = KVCACHE__V1__DTYPE__Q8_0, xh.head_begin = 1, xh.head_end = 2;
  frame(1, seed_io(buf, 6, 1, 1, 1, 0, 5, 2, 16, NULL));          /* fp8 codes as given */
  frame(1, seed_io(buf, 7, 0, 1, 1, 0, 5, 2, SEED_TOKEN_BYTES, &xf)); /* decoded */
  frame(1, seed_io(buf, 8, 1, 1, 3, 0, 3, 1, SEED_TOKEN_BYTES, &xf)); /* encoded */
  frame(1, seed_io(buf, 9, 1, 2, 1, 0, 6, 2, 2 * 2 * 34, NULL));  /* q8_0 blocks */
  frame(1, seed_io(buf, 10, 0, 2, 1, 0, 6, 1, 2 * 34, &xh));      /* head 1, as given */
  frame(1, seed_io(buf, 11, 1, 2, 5, 0, 4, 1, 2 * 2 * 32 * 2, &xb)); /* bf16 quantized */
  frame(1, seed_io(buf, 12, 0, 2, 5, 0, 4, 1, 2 * 2 * 32 * 4, &xf)); /* dequantized */
  frame(1, seed_io(buf, 13, 1, 3, 1, 0, 2, 1, 2 * 2 * 18 * 2, NULL)); /* q4_0 blocks */
  frame(1, seed_io(buf, 14, 0, 3, 1, 0, 2, 1, 2 * 2 * 64 * 2, &xb));
  frame(1, seed_seqop(buf, 15, SEED_REMOVE, 2, 1, 1, 3)); /* no RoPE description: NOROPE */
  frame(1, seed_seqop(buf, 16, SEED_CLIST, 0, 0, 0, 0));
  scenario("compact_formats");

  /* Allocation failures in the middle of a put, a copy and an open. */
  hello(3);
  for (unsigned k = 0; k < 4; k++) {
    fail_alloc(k);
    rec(3, 0, buf, seed_cache_open(buf, 1, "f", F32));
    fail_alloc(k);
    rec(3, 0, buf, seed_io(buf, 2, 1, 0, 1 + k, 0, 5, 3, SEED_TOKEN_BYTES, NULL));
    fail_alloc(k);
    rec(3, 0, buf, seed_seqop(buf, 3, SEED_COPY, 0, 1, 40 + k, 5));
  }
  scenario("alloc_failures");

  /* The prefix cache: worker 0 writes a 12-token prompt with its ids (three
   * full pages), worker 1 matches and attaches it (pinned), priorities, a
   * soft pin, the top heads; a different token, a salt and an extra key miss;
   * worker 1 leaves; the pool fills and cached pages are reclaimed. */
  hello(0);
  hello(1);
  frame(0, seed_cache_open(buf, 1, "f", F32));
  frame(1, seed_cache_open(buf, 1, "f", F32));
  shm_tokens(0, SEED_TOK_OFF, 100, 16);
  shm_tokens(1, SEED_TOK_OFF, 100, 16);
  frame(0, seed_put_tokens(buf, 2, 0, 1, 0, 12, 1, "", ""));
  frame(1, seed_match(buf, 2, 0, UINT64_MAX, SEED_TOK_OFF, 14, "", "", 0));
  frame(1, seed_match(buf, 3, 0, 50, SEED_TOK_OFF, 14, "", "", 1));
  frame(1, seed_io(buf, 4, 1, 0, 50, 12, 2, 1, SEED_TOKEN_BYTES, NULL));
  frame(0, seed_seqop(buf, 3, SEED_PRIORITY, 0, 1, 90, 0));
  frame(1, seed_seqop(buf, 5, SEED_PIN_TTL, 0, 50, 1000, 0));
  frame(0, seed_seqop(buf, 4, SEED_PREFIX_TOP, 0, 0, 0, 5));
  shm_tokens(1, SEED_TOK_OFF + 20, 7, 1); /* token 5 differs: one page matches */
  frame(1, seed_match(buf, 6, 0, UINT64_MAX, SEED_TOK_OFF, 12, "", "", 0));
  frame(1, seed_match(buf, 7, 0, UINT64_MAX, SEED_TOK_OFF, 12, "tenant", "", 0));
  frame(0, seed_put_tokens(buf, 5, 0, 2, 0, 8, 2, "tenant", "lora-7"));
  frame(1, seed_match(buf, 8, 0, 51, SEED_TOK_OFF, 8, "tenant", "lora-7", 0));
  disconnect(1);
  for (unsigned i = 0; i < 6; i++) /* 24 more pages: cached chains are reclaimed */
    frame(0, seed_io(buf, 10 + i, 1, 0, 200 + i * 4, 0, 4, 4, SEED_TOKEN_BYTES, NULL));
  frame(0, seed_match(buf, 20, 0, UINT64_MAX, SEED_TOK_OFF, 12, "", "", 0));
  frame(0, seed_seqop(buf, 21, SEED_STATS, 0, 0, 0, 0));
  scenario("prefix_match_attach");

  /* Issue 11: a worker attaches a prompt, rewrites its first page with other
   * ids and appends; the old chain must not grow past what was written in
   * order (the audit after each frame recomputes every chain). Then its own
   * indexed page rewritten without ids, a truncation, and appends again. */
  hello(0);
  hello(1);
  frame(0, seed_cache_open(buf, 1, "f", F32));
  frame(1, seed_cache_open(buf, 1, "f", F32));
  shm_tokens(0, SEED_TOK_OFF, 100, 16);
  frame(0, seed_put_tokens(buf, 2, 0, 1, 0, 12, 1, "", ""));
  shm_tokens(1, SEED_TOK_OFF, 100, 16);
  frame(1, seed_match(buf, 2, 0, 50, SEED_TOK_OFF, 12, "", "", 0));
  shm_tokens(1, SEED_TOK_OFF, 500, 4); /* B0 */
  frame(1, seed_put_tokens(buf, 3, 0, 50, 0, 4, 1, "", ""));
  shm_tokens(1, SEED_TOK_OFF, 112, 4); /* t3 */
  frame(1, seed_put_tokens(buf, 4, 0, 50, 12, 4, 1, "", ""));
  frame(0, seed_match(buf, 3, 0, UINT64_MAX, SEED_TOK_OFF, 16, "", "", 0));
  frame(0, seed_match(buf, 4, 0, 60, SEED_TOK_OFF, 16, "", "", 0));
  frame(0, seed_io(buf, 5, 1, 0, 1, 2, 2, 1, SEED_TOKEN_BYTES, NULL)); /* no ids */
  frame(0, seed_seqop(buf, 6, SEED_REMOVE, 0, 1, 6, UINT64_MAX));
  shm_tokens(0, SEED_TOK_OFF, 106, 10);
  frame(0, seed_put_tokens(buf, 7, 0, 1, 6, 10, 1, "", ""));
  shm_tokens(0, SEED_TOK_OFF, 100, 16);
  frame(0, seed_match(buf, 8, 0, UINT64_MAX, SEED_TOK_OFF, 16, "", "", 0));
  frame(1, seed_seqop(buf, 5, SEED_TRIM, 0, 50, 4, 0));
  shm_tokens(1, SEED_TOK_OFF, 116, 4);
  frame(1, seed_put_tokens(buf, 6, 0, 50, 16, 4, 1, "", ""));
  scenario("prefix_rewrite_chain");

  /* Layer-by-layer saves with ids and span keys (an image over [2, 7)),
   * matched and attached with and without them; refused lists and a get
   * with span keys. */
  hello(0);
  frame(0, seed_cache_open(buf, 1, "f", F32));
  shm_tokens(0, SEED_TOK_OFF, 300, 12);
  static const seed_span_t img[1] = {{2, 7, "image-a"}}, img_b[1] = {{2, 7, "image-b"}};
  static const seed_span_t overlap[2] = {{2, 6, "x"}, {4, 9, "y"}};
  frame(0, seed_put_spans(buf, 2, 0, 1, 0, 12, 0, 1, img, 1));
  frame(0, seed_match_spans(buf, 3, 0, UINT64_MAX, 12, img, 1)); /* nothing: layer 1 missing */
  frame(0, seed_put_spans(buf, 4, 0, 1, 0, 12, 1, 2, img, 1));
  frame(0, seed_match_spans(buf, 5, 0, UINT64_MAX, 12, img, 1));
  frame(0, seed_match_spans(buf, 6, 0, 9, 12, img, 1));
  frame(0, seed_match_spans(buf, 7, 0, 10, 12, img_b, 1));
  frame(0, seed_match_spans(buf, 8, 0, UINT64_MAX, 12, NULL, 0));
  frame(0, seed_put_spans(buf, 9, 0, 2, 0, 8, 0, 1, img_b, 1));
  frame(0, seed_put_spans(buf, 10, 0, 2, 0, 8, 1, 2, img, 1)); /* other image: no index */
  frame(0, seed_put_spans(buf, 11, 0, 3, 0, 8, 0, 2, overlap, 2));
  frame(0, seed_match_spans(buf, 12, 0, UINT64_MAX, 12, overlap, 2));
  frame(0, seed_io(buf, 13, 0, 0, 1, 0, 4, 1, SEED_TOKEN_BYTES, NULL));
  scenario("layer_saves_span_keys");

  /* The prefix requests refused: unaligned and outside token offsets, too
   * many tokens, a key too long, a bad priority, a missing sequence, an
   * attach onto a pinned sequence, token ids of the wrong length. */
  hello(2);
  frame(2, seed_cache_open(buf, 1, "f", F32));
  shm_tokens(2, SEED_TOK_OFF, 1, 8);
  frame(2, seed_put_tokens(buf, 2, 0, 1, 0, 8, 1, "", ""));
  frame(2, seed_match(buf, 3, 0, UINT64_MAX, SEED_TOK_OFF + 2, 8, "", "", 0));
  frame(2, seed_match(buf, 4, 0, UINT64_MAX, (1u << 20) - 8, 8, "", "", 0));
  frame(2, seed_match(buf, 5, 0, UINT64_MAX, SEED_TOK_OFF, UINT64_MAX / 2, "", "", 0));
  frame(2, seed_match(buf, 6, 0, UINT64_MAX, SEED_TOK_OFF, 8,
                      "0123456789012345678901234567890123456789012345678901234567890123456789",
                      "", 0));
  frame(2, seed_seqop(buf, 7, SEED_PRIORITY, 0, 1, 101, 0));
  frame(2, seed_seqop(buf, 8, SEED_PIN_TTL, 0, 999, 10, 0));
  frame(2, seed_seqop(buf, 9, SEED_PIN, 0, 1, 0, 0));
  frame(2, seed_match(buf, 10, 0, 1, SEED_TOK_OFF, 8, "", "", 1));
  frame(2, seed_seqop(buf, 11, SEED_PREFIX_TOP, 0, 0, 0, 5000));
  frame(2, seed_seqop(buf, 12, SEED_PREFIX_TOP, 7, 0, 0, 1));
  frame(2, seed_seqop(buf, 13, SEED_PIN_TTL, 0, 1, 0, 0));
  scenario("prefix_refused");

  /* Allocation failures inside token-aware puts, matches and attaches. */
  hello(3);
  frame(3, seed_cache_open(buf, 1, "f", F32));
  shm_tokens(3, SEED_TOK_OFF, 40, 16);
  frame(3, seed_put_tokens(buf, 1, 0, 90, 0, 8, 1, "", "")); /* what the attaches find */
  for (unsigned k = 0; k < 12; k++) {
    fail_alloc(k);
    rec(3, 0, buf, seed_put_tokens(buf, 2, 0, 10 + k, 0, 8, 2, "", ""));
    fail_alloc(k);
    rec(3, 0, buf, seed_match(buf, 3, 0, UINT64_MAX, SEED_TOK_OFF, 8, "", "", 0));
    fail_alloc(k);
    rec(3, 0, buf, seed_match(buf, 4, 0, 30 + k, SEED_TOK_OFF, 8, "", "", 1));
    fail_alloc(k);
    rec(3, 0, buf, seed_seqop(buf, 5, SEED_PREFIX_TOP, 0, 0, 0, 3));
  }
  scenario("prefix_alloc_failures");

  /* A frame split into single bytes, then a bad header. */
  hello(0);
  size_t n = seed_ping(buf + 4, 9);
  frame_put_header(buf, (uint32_t)n);
  for (size_t i = 0; i < n + 4; i++) rec(0, 3, buf + i, 1);
  uint8_t bad[4] = {0xff, 0xff, 0xff, 0xff};
  rec(0, 3, bad, 4);
  scenario("split_bytes_bad_header");

  /* Fast requests (proto/ringfast.h) beside frames, on two connections: a
   * lease held across a disconnect, a lease released by the next request,
   * a busy pool, allocation failures, a malformed slot. */
  hello(0);
  hello(1);
  frame(0, seed_cache_open(buf, 1, "f", F32));
  frame(1, seed_cache_open(buf, 1, "f", F32));
  fast(0, &(ringfast_req_t){.kind = RINGFAST_PUT, .seq_id = 1, .ntokens = 8, .v_off = SEED_V_OFF});
  fast(0, &(ringfast_req_t){.kind = RINGFAST_GET, .seq_id = 1, .pos = 2, .ntokens = 4,
                            .v_off = SEED_V_OFF});
  fast(1, &(ringfast_req_t){.kind = RINGFAST_LEASE, .seq_id = 1, .ntokens = 8});
  fast(0, &(ringfast_req_t){.kind = RINGFAST_PUT, .seq_id = 1, .pos = 4, .ntokens = 2,
                            .v_off = SEED_V_OFF}); /* copy on write: leased */
  fast(0, &(ringfast_req_t){.kind = RINGFAST_LEASE, .seq_id = 1, .pos = 1, .ntokens = 2});
  fast(0, &(ringfast_req_t){.kind = RINGFAST_LEASE, .seq_id = 1, .pos = 3, .ntokens = 1,
                            .release = 2});
  disconnect(1);
  for (unsigned k = 0; k < 6; k++) {
    fail_alloc(k);
    fast(0, &(ringfast_req_t){.kind = RINGFAST_PUT, .seq_id = 30 + k, .ntokens = 6,
                              .v_off = SEED_V_OFF});
    fail_alloc(k);
    fast(0, &(ringfast_req_t){.kind = RINGFAST_LEASE, .seq_id = 30 + k, .ntokens = 5});
  }
  fast(0, &(ringfast_req_t){.kind = RINGFAST_PUT, .seq_id = 50, .layer_begin = 1, .layer_end = 2,
                            .ntokens = 3, .v_off = SEED_V_OFF});
  fast(0, &(ringfast_req_t){.kind = 7, .seq_id = 1, .ntokens = 1}); /* closes 0 */
  fast(1, &(ringfast_req_t){.kind = RINGFAST_GET, .seq_id = 1, .ntokens = 1}); /* no Hello yet */
  scenario("fast_slots");
}

/* ---- msg seeds: one payload each, for fuzz_msg's fixed state ------------------ */

static void msg_seeds(void) {
#define M(nm, expr) write_file("msg", nm, buf, (expr))
  M("ping", seed_ping(buf, 7));
  M("hello_again", seed_hello(buf, 7));
  M("cache_open", seed_cache_open(buf, 7, "g", KVCACHE__V1__DTYPE__BF16));
  M("put_append", seed_io(buf, 7, 1, 0, 1, 8, 2, 1, SEED_TOKEN_BYTES, NULL));
  M("put_batch", seed_io(buf, 7, 1, 0, 3, 0, 5, 4, SEED_TOKEN_BYTES, NULL));
  M("get", seed_io(buf, 7, 0, 0, 1, 2, 6, 1, SEED_TOKEN_BYTES, NULL));
  M("get_batch", seed_io(buf, 7, 0, 0, 1, 0, 3, 2, SEED_TOKEN_BYTES, NULL));
  M("remove_tail", seed_seqop(buf, 7, SEED_REMOVE, 0, 1, 5, 8));
  M("remove_all", seed_seqop(buf, 7, SEED_REMOVE, 0, 1, 0, 8));
  M("copy_prefix", seed_seqop(buf, 7, SEED_COPY, 0, 1, 9, 6));
  M("can_resume", seed_seqop(buf, 7, SEED_RESUME, 0, 1, 8, 0));
  M("trim_front", seed_seqop(buf, 7, SEED_TRIM, 0, 1, 4, 0));
  M("pin", seed_seqop(buf, 7, SEED_PIN, 0, 1, 0, 0));
  M("unpin", seed_seqop(buf, 7, SEED_UNPIN, 0, 2, 0, 0));
  M("seq_info", seed_seqop(buf, 7, SEED_INFO, 0, 1, 0, 0));
  M("seq_list", seed_seqop(buf, 7, SEED_LIST, 0, 0, 0, 1));
  M("cache_list", seed_seqop(buf, 7, SEED_CLIST, 0, 0, 0, 0));
  M("cache_clear", seed_seqop(buf, 7, SEED_CLEAR, 0, 0, 0, 0));
  M("cache_drop", seed_seqop(buf, 7, SEED_DROP, 0, 0, 0, 0));
  M("stats", seed_seqop(buf, 7, SEED_STATS, 0, 0, 0, 0));
  M("stats_top", seed_seqop(buf, 7, SEED_STATS, 0, 0, 3, 0));
  M("stats_node_only", seed_seqop(buf, 7, SEED_STATS, 0, 0, 0, 1));
  M("stats_cache", seed_seqop(buf, 7, SEED_STATS, 0, 0, 0, 2));
  M("put_near_max", seed_io(buf, 7, 1, 0, 1, UINT64_MAX - 1, 2, 1, SEED_TOKEN_BYTES, NULL));
  M("get_huge", seed_io(buf, 7, 0, 0, 1, 0, UINT64_MAX / 64, 1, SEED_TOKEN_BYTES, NULL));
  M("put_tokens", seed_put_tokens(buf, 7, 0, 4, 0, 8, 1, "", ""));
  M("put_tokens_salted", seed_put_tokens(buf, 7, 0, 4, 0, 4, 2, "tenant", "lora"));
  M("match", seed_match(buf, 7, 0, UINT64_MAX, SEED_TOK_OFF, 10, "", "", 0));
  M("match_salted", seed_match(buf, 7, 0, UINT64_MAX, SEED_TOK_OFF, 8, "tenant", "x", 0));
  M("attach", seed_match(buf, 7, 0, 9, SEED_TOK_OFF, 8, "", "", 0));
  M("attach_pin", seed_match(buf, 7, 0, 9, SEED_TOK_OFF, 10, "", "", 1));
  M("attach_onto_pinned", seed_match(buf, 7, 0, 2, SEED_TOK_OFF, 8, "", "", 1));
  M("set_priority", seed_seqop(buf, 7, SEED_PRIORITY, 0, 3, 80, 0));
  M("pin_ttl", seed_seqop(buf, 7, SEED_PIN_TTL, 0, 3, 500, 0));
  M("pin_ttl_hard", seed_seqop(buf, 7, SEED_PIN_TTL, 0, 1, 0, 0));
  M("prefix_top", seed_seqop(buf, 7, SEED_PREFIX_TOP, 0, 0, 0, 4));
  M("tenants", seed_tenants(buf, 7));
  /* a cache id that names no cache of this tenant (the gate answers first) */
  M("seq_info_other_cache", seed_seqop(buf, 7, SEED_INFO, 5000, 1, 0, 0));
  M("drop_other_cache", seed_seqop(buf, 7, SEED_DROP, 4999, 0, 0, 0));
  M("empty", 0);
#undef M
}

/* ---- fast seeds: one slot body each, for fuzz_fast's fixed state -------------- */

static void fast_seed(const char *name, ringfast_req_t q, uint16_t flags) {
  uint8_t body[RING_FAST_BODY];
  ringfast_req_encode(&q, body);
  body[2] = (uint8_t)flags; /* the flags field, at offset 6 of the slot */
  body[3] = (uint8_t)(flags >> 8);
  write_file("fast", name, body, sizeof body);
}

static void fast_seeds(void) {
  const uint8_t PUT = RINGFAST_PUT, GET = RINGFAST_GET, LEASE = RINGFAST_LEASE;
#define F(nm, ...) fast_seed(nm, (ringfast_req_t){__VA_ARGS__}, 0)
  F("put_append", .kind = PUT, .seq_id = 1, .pos = 8, .ntokens = 2, .v_off = SEED_V_OFF);
  F("put_overwrite", .kind = PUT, .seq_id = 1, .pos = 2, .ntokens = 3, .v_off = SEED_V_OFF);
  F("put_layer", .kind = PUT, .seq_id = 1, .pos = 8, .ntokens = 1, .layer_begin = 1,
    .layer_end = 2, .v_off = SEED_V_OFF);
  F("put_new_seq", .kind = PUT, .seq_id = 9, .ntokens = 4, .v_off = SEED_V_OFF);
  F("put_pinned_seq", .kind = PUT, .seq_id = 2, .pos = 3, .ntokens = 2, .v_off = SEED_V_OFF);
  F("put_f16", .kind = PUT, .seq_id = 1, .pos = 8, .ntokens = 1, .dtype = KVC_DTYPE_F16,
    .v_off = SEED_V_OFF);
  F("put_heads", .kind = PUT, .seq_id = 1, .pos = 8, .ntokens = 1, .head_begin = 1,
    .head_end = 2, .v_off = SEED_V_OFF);
  F("get", .kind = GET, .seq_id = 1, .ntokens = 8, .v_off = SEED_V_OFF);
  F("get_layer_head", .kind = GET, .seq_id = 3, .pos = 1, .ntokens = 4, .layer_end = 1,
    .head_begin = 1, .head_end = 2, .v_off = SEED_V_OFF);
  F("get_bf16", .kind = GET, .seq_id = 1, .ntokens = 2, .dtype = KVC_DTYPE_BF16,
    .v_off = SEED_V_OFF);
  F("get_past_length", .kind = GET, .seq_id = 1, .pos = 6, .ntokens = 4, .v_off = SEED_V_OFF);
  F("get_no_seq", .kind = GET, .seq_id = 77, .ntokens = 1, .v_off = SEED_V_OFF);
  F("get_bad_layer", .kind = GET, .seq_id = 1, .ntokens = 1, .layer_end = 5);
  F("get_offset_out", .kind = GET, .seq_id = 1, .ntokens = 1, .k_off = UINT64_MAX - 8);
  F("put_near_max", .kind = PUT, .seq_id = 1, .pos = UINT64_MAX - 1, .ntokens = 2);
  F("put_other_cache", .kind = PUT, .cache_id = 5000, .seq_id = 1, .ntokens = 1);
  F("lease", .kind = LEASE, .seq_id = 1, .ntokens = 8);
  F("lease_one", .kind = LEASE, .seq_id = 3, .pos = 5, .ntokens = 1);
  F("lease_release", .kind = LEASE, .seq_id = 1, .pos = 1, .ntokens = 2, .release = 1);
  F("lease_past_length", .kind = LEASE, .seq_id = 1, .pos = 5, .ntokens = 10);
  F("lease_many_pages", .kind = LEASE, .seq_id = 1, .ntokens = 40);
  F("lease_empty", .kind = LEASE, .seq_id = 1, .pos = 3);
  F("lease_wraps", .kind = LEASE, .seq_id = 1, .pos = UINT64_MAX - 1, .ntokens = 4);
  F("lease_no_seq", .kind = LEASE, .seq_id = 42, .ntokens = 1);
  /* malformed: the connection closes */
  F("bad_kind", .kind = 9, .seq_id = 1, .ntokens = 1);
  F("lease_with_offset", .kind = LEASE, .seq_id = 1, .ntokens = 1, .k_off = 64);
  F("zeros", .kind = 0);
  fast_seed("flags_set", (ringfast_req_t){.kind = PUT, .seq_id = 1, .ntokens = 1}, 1);
#undef F
}

/* ---- frame seeds: [max_payload u32][stream] ---------------------------------- */

static void frame_seeds(void) {
  uint8_t s[256];
  uint32_t max = 64;
  memcpy(s, &max, 4);
  size_t n = 4;
  for (int i = 0; i < 3; i++) {
    size_t p = seed_ping(s + n + 4, (uint64_t)i + 1);
    frame_put_header(s + n, (uint32_t)p);
    n += 4 + p;
  }
  write_file("frame", "three_pings", s, n);
  write_file("frame", "partial_header", s, 6);
  frame_put_header(s + 4, 65);
  write_file("frame", "too_big", s, 12);
  frame_put_header(s + 4, 0);
  write_file("frame", "empty_frame", s, 8);
  frame_put_header(s + 4, 64);
  memset(s + 8, 0, 64);
  write_file("frame", "exact_max", s, 72);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  root = argv[1];
  if (mkdir(root, 0755) != 0 && errno != EEXIST) {
    perror(root);
    return 1;
  }
  handler_seeds();
  msg_seeds();
  fast_seeds();
  frame_seeds();
  return 0;
}
