/* ringfast.c: the fast frame's little-endian fields, written and read. */
#include "ringfast.h"

#include <endian.h>
#include <stddef.h>
#include <string.h>

/* Offsets in a slot's body (the slot's offset minus 4: seq comes first). */
#define B(off) ((off) - 4u)

/* Little-endian fields at any alignment: one load or store each on a
 * little-endian host. */
static void put16(uint8_t *p, uint16_t v) {
  v = htole16(v);
  memcpy(p, &v, sizeof v);
}

static void put32(uint8_t *p, uint32_t v) {
  v = htole32(v);
  memcpy(p, &v, sizeof v);
}

static void put64(uint8_t *p, uint64_t v) {
  v = htole64(v);
  memcpy(p, &v, sizeof v);
}

static uint16_t get16(const uint8_t *p) {
  uint16_t v;
  memcpy(&v, p, sizeof v);
  return le16toh(v);
}

static uint32_t get32(const uint8_t *p) {
  uint32_t v;
  memcpy(&v, p, sizeof v);
  return le32toh(v);
}

static uint64_t get64(const uint8_t *p) {
  uint64_t v;
  memcpy(&v, p, sizeof v);
  return le64toh(v);
}

void ringfast_req_encode(const ringfast_req_t *q, uint8_t body[RING_FAST_BODY]) {
  body[B(4)] = q->kind;
  body[B(5)] = q->dtype;
  put16(body + B(6), 0);
  put32(body + B(8), q->cache_id);
  put16(body + B(12), q->layer_begin);
  put16(body + B(14), q->layer_end);
  put16(body + B(16), q->head_begin);
  put16(body + B(18), q->head_end);
  put32(body + B(20), q->ntokens);
  put64(body + B(24), q->seq_id);
  put64(body + B(32), q->pos);
  put64(body + B(40), q->k_off);
  put64(body + B(48), q->v_off);
  put64(body + B(56), q->release);
}

int ringfast_req_decode(const uint8_t body[RING_FAST_BODY], ringfast_req_t *q,
                        const char **why) {
  *q = (ringfast_req_t){.kind = body[B(4)],
                        .dtype = body[B(5)],
                        .cache_id = get32(body + B(8)),
                        .layer_begin = get16(body + B(12)),
                        .layer_end = get16(body + B(14)),
                        .head_begin = get16(body + B(16)),
                        .head_end = get16(body + B(18)),
                        .ntokens = get32(body + B(20)),
                        .seq_id = get64(body + B(24)),
                        .pos = get64(body + B(32)),
                        .k_off = get64(body + B(40)),
                        .v_off = get64(body + B(48)),
                        .release = get64(body + B(56))};
  if (get16(body + B(6)) != 0) {
    *why = "fast request with flags set";
    return -1;
  }
  switch (q->kind) {
  case RINGFAST_PUT:
  case RINGFAST_GET:
    return 0;
  case RINGFAST_LEASE:
    if (q->dtype || q->layer_begin || q->layer_end || q->head_begin || q->head_end || q->k_off ||
        q->v_off) {
      *why = "fast lease with a transfer field set";
      return -1;
    }
    return 0;
  default:
    *why = "fast request of an unknown kind";
    return -1;
  }
}

/* Whether a reply needs the slot's more area. */
static bool needs_more(uint32_t status, uint32_t npages) {
  return status != 0 || npages > RINGFAST_LINE_PAGES;
}

void ringfast_rep_error(ringfast_rep_t *p, const char *msg, uint64_t full_needed,
                        uint64_t full_freeable) {
  size_t n = msg ? strlen(msg) : 0;
  p->err_len = (uint32_t)(n < RINGFAST_ERR_MAX ? n : RINGFAST_ERR_MAX);
  memcpy(p->err, msg ? msg : "", p->err_len);
  p->err[p->err_len] = '\0';
  p->full_needed = full_needed;
  p->full_freeable = full_freeable;
}

void ringfast_rep_encode(const ringfast_rep_t *p, uint8_t body[RING_FAST_BODY],
                         uint8_t more[RING_FAST_MORE]) {
  put32(body + B(4), p->status);
  put32(body + B(8), p->npages);
  put32(body + B(12), p->status ? p->err_len : 0);
  put64(body + B(16), p->lease_id);
  put64(body + B(24), p->first_pos);
  put64(body + B(32), p->pool_gen);
  for (uint32_t i = 0; i < RINGFAST_LINE_PAGES; i++)
    put64(body + B(40) + 8 * i, i < p->npages ? p->page_off[i] : 0);
  if (!needs_more(p->status, p->npages)) return;
  put64(more + 0, p->full_needed);
  put64(more + 8, p->full_freeable);
  for (uint32_t i = RINGFAST_LINE_PAGES; i < p->npages; i++)
    put64(more + 16 + 8 * (i - RINGFAST_LINE_PAGES), p->page_off[i]);
  if (p->status) memcpy(more + 64, p->err, p->err_len);
}

int ringfast_rep_decode(const uint8_t body[RING_FAST_BODY], const uint8_t more[RING_FAST_MORE],
                        ringfast_rep_t *p) {
  memset(p, 0, offsetof(ringfast_rep_t, err)); /* the message only as long as it is */
  p->err[0] = '\0';
  p->status = get32(body + B(4));
  p->npages = get32(body + B(8));
  p->err_len = get32(body + B(12));
  if (p->npages > RINGFAST_LEASE_PAGES || p->err_len > RINGFAST_ERR_MAX) return -1;
  p->lease_id = get64(body + B(16));
  p->first_pos = get64(body + B(24));
  p->pool_gen = get64(body + B(32));
  for (uint32_t i = 0; i < RINGFAST_LINE_PAGES && i < p->npages; i++)
    p->page_off[i] = get64(body + B(40) + 8 * i);
  if (!needs_more(p->status, p->npages)) return 0;
  p->full_needed = get64(more + 0);
  p->full_freeable = get64(more + 8);
  for (uint32_t i = RINGFAST_LINE_PAGES; i < p->npages; i++)
    p->page_off[i] = get64(more + 16 + 8 * (i - RINGFAST_LINE_PAGES));
  if (p->status) memcpy(p->err, more + 64, p->err_len);
  p->err[p->err_len] = '\0';
  return 0;
}
