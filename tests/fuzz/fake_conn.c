/* fake_conn.c: daemon/net/conn.c's interface for dispatch.c, without sockets:
 * replies are checked and dropped, closes release pins and buffers. */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz_daemon.h"
#include "fuzz_seed.h"
#include "kvcache/errors.h"
#include "log.h"

#define FZ_FAIL(...)                                                           \
  do {                                                                         \
    fprintf(stderr, "fuzz invariant: " __VA_ARGS__);                           \
    fputc('\n', stderr);                                                       \
    abort();                                                                   \
  } while (0)

typedef struct fz_conn {
  conn_t c;      /* first: a conn_t * is a fz_conn_t * */
  fz_seen_t seen;
} fz_conn_t;

static uint8_t *pool_mem;
static uv_loop_t fake_loop; /* uv_now reads its time field only */

void fz_server_init(server_t *srv, uint64_t npages, uint64_t page_bytes) {
  memset(srv, 0, sizeof *srv);
  config_defaults(&srv->cfg);
  srv->cfg.max_frame_bytes = FZ_MAX_FRAME;
  srv->cfg.shm_default_bytes = srv->cfg.shm_max_bytes = 1u << 20;
  srv->cfg.max_decode_bytes = 256u << 10;
  srv->cfg.max_caches = 4;
  srv->cfg.max_seqs = 64;
  srv->cfg.page_bytes = page_bytes; /* one page size: segment and grain */
  srv->cfg.pool_bytes = npages * page_bytes;
  log_level = -1; /* quiet */
  srv->loop = &fake_loop;
  srv->next_conn_id = 1;
  /* srv->pool stays empty: no pool to pass, the fuzzers never map it */
  srv->cfg.offload_bytes = 0; /* no thread pool here: every get copies inline */
  arena_init(&srv->arena);
  metrics_init(&srv->stats, 0);
  pool_mem = aligned_alloc(64, srv->cfg.pool_bytes);
  if (!pool_mem) FZ_FAIL("pool");
  memset(pool_mem, 0xa5, srv->cfg.pool_bytes);
  engine_config_t ec = {.base = pool_mem,
                        .pool_bytes = srv->cfg.pool_bytes,
                        .page_bytes = page_bytes,
                        .segment_bytes = page_bytes,
                        .max_caches = srv->cfg.max_caches,
                        .max_seqs = srv->cfg.max_seqs};
  if (engine_new(&ec, &srv->eng) != 0) FZ_FAIL("engine_new");
}

void fz_server_deinit(server_t *srv) {
  if (srv->stats.shm_bytes != 0 || srv->stats.connections_current != 0)
    FZ_FAIL("shm_bytes %llu connections %llu left after every close",
            (unsigned long long)srv->stats.shm_bytes,
            (unsigned long long)srv->stats.connections_current);
  engine_free(srv->eng);
  srv->eng = NULL;
  free(pool_mem);
  pool_mem = NULL;
  arena_deinit(&srv->arena);
}

void fz_audit(server_t *srv, const char *where) {
  char why[256];
  if (engine_audit(srv->eng, why, sizeof why) != 0) FZ_FAIL("audit after %s: %s", where, why);
}

int fz_count_memfds(void) {
  DIR *d = opendir("/proc/self/fd");
  int n = 0;
  if (!d) return -1;
  struct dirent *e;
  while ((e = readdir(d))) {
    char path[300], target[256];
    snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
    ssize_t len = readlink(path, target, sizeof target - 1);
    if (len <= 0) continue;
    target[len] = '\0';
    n += strncmp(target, "/memfd:kvcached", 15) == 0;
  }
  closedir(d);
  return n;
}

conn_t *fz_conn_open(server_t *srv) {
  fz_conn_t *f = calloc(1, sizeof *f);
  if (!f) FZ_FAIL("calloc");
  conn_t *c = &f->c;
  c->srv = srv;
  c->shm.fd = -1;
  c->id = srv->next_conn_id++;
  c->max_frame = (uint32_t)srv->cfg.max_frame_bytes;
  c->rcap = 2u * (FRAME_HEADER_BYTES + c->max_frame);
  c->rbuf = malloc(c->rcap);
  if (!c->rbuf) FZ_FAIL("malloc");
  c->counted = true;
  c->pool_mapped = true; /* as conn.c gives an admin (conn_is_admin below): leases */
  srv->stats.connections_current++;
  return c;
}

void fz_seed_state(conn_t *c) {
  static uint8_t buf[FZ_MAX_FRAME];
  fz_conn_frame(c, buf, seed_hello(buf, 1));
  fz_conn_frame(c, buf, seed_cache_open(buf, 2, "f", KVCACHE__V1__DTYPE__F32));
  memset(c->shm.base, 0x3c, SEED_V_OFF + 8 * 8 * SEED_TOKEN_BYTES); /* the seeds' regions */
  for (uint32_t i = 0; i < 64; i++) {
    uint32_t id = i + 1;
    memcpy(c->shm.base + SEED_TOK_OFF + 4 * i, &id, 4);
  }
  fz_conn_frame(c, buf, seed_io(buf, 3, 1, 0, 1, 0, 8, 1, SEED_TOKEN_BYTES, NULL));
  fz_conn_frame(c, buf, seed_io(buf, 4, 1, 0, 2, 0, 3, 1, SEED_TOKEN_BYTES, NULL));
  fz_conn_frame(c, buf, seed_seqop(buf, 5, SEED_PIN, 0, 2, 0, 0));
  fz_conn_frame(c, buf, seed_put_tokens(buf, 6, 0, 3, 0, 8, 1, "", ""));
  fz_seen_t *s = fz_seen(c);
  engine_stats_t st;
  engine_stats(c->srv->eng, &st);
  if (s->replies != 6 || s->last_status != 0 || st.sequences != 3)
    FZ_FAIL("the fixed state did not build (%u replies, last status %d)", (unsigned)s->replies,
            (int)s->last_status);
}

void fz_conn_fast(conn_t *c, const uint8_t *p, size_t n) {
  /* A client has rings, so a fast slot, only once its Hello is answered. */
  if (!c->greeted || c->state >= CONN_FLUSHING) return;
  uint8_t body[RING_FAST_BODY] = {0};
  memcpy(body, p, n < sizeof body ? n : sizeof body);
  c->via = VIA_FAST; /* as conn.c's run_ring */
  dispatch_fast(c, body, ++fz_seen(c)->fast_seq, 0);
  fz_audit(c->srv, "a fast request");
}

fz_seen_t *fz_seen(conn_t *c) { return &((fz_conn_t *)c)->seen; }

uint8_t *fz_pool(void) { return pool_mem; }

void fz_conn_free(conn_t *c) {
  if (!c) return;
  conn_close(c, "fuzz: freed");
  free(c->rbuf);
  free(c);
}

void fz_conn_feed(conn_t *c, const uint8_t *p, size_t n) {
  if (c->state >= CONN_FLUSHING) return;
  if (n > c->rcap - c->rlen) n = c->rcap - c->rlen;
  memcpy(c->rbuf + c->rlen, p, n);
  c->rlen += n;
  size_t off = 0;
  while (c->state < CONN_FLUSHING) {
    uint32_t plen = 0;
    int st = frame_parse(c->rbuf + off, c->rlen - off, c->max_frame, &plen);
    if (st == FRAME_TOO_BIG) {
      conn_close(c, "frame larger than max_frame_bytes");
      return;
    }
    if (st == FRAME_NEED_MORE) break;
    if (plen > c->max_frame || off + FRAME_HEADER_BYTES + plen > c->rlen)
      FZ_FAIL("frame_parse: %u-byte frame at %zu of %zu", plen, off, c->rlen);
    dispatch_frame(c, c->rbuf + off + FRAME_HEADER_BYTES, plen);
    fz_audit(c->srv, "a frame");
    off += FRAME_HEADER_BYTES + plen;
  }
  if (c->state >= CONN_FLUSHING) return;
  memmove(c->rbuf, c->rbuf + off, c->rlen - off);
  c->rlen -= off;
}

void fz_conn_frame(conn_t *c, const uint8_t *payload, size_t n) {
  uint8_t hdr[FRAME_HEADER_BYTES];
  frame_put_header(hdr, (uint32_t)n);
  if (c->state >= CONN_FLUSHING || c->rcap - c->rlen < FRAME_HEADER_BYTES + n) return;
  memcpy(c->rbuf + c->rlen, hdr, sizeof hdr);
  c->rlen += sizeof hdr;
  fz_conn_feed(c, payload, n);
}

/* ---- the interface of daemon/net/conn.h ----------------------------------------- */

int conn_send(conn_t *c, const Kvcache__V1__Response *resp) {
  if (c->state == CONN_CLOSED) return KVC_E_IO;
  size_t n = kvcache__v1__response__get_packed_size(resp);
  uint8_t *buf = malloc(n ? n : 1);
  if (!buf) FZ_FAIL("malloc");
  if (kvcache__v1__response__pack(resp, buf) != n) FZ_FAIL("pack size");
  Kvcache__V1__Response *back = kvcache__v1__response__unpack(NULL, n, buf);
  if (!back) FZ_FAIL("a reply of %zu bytes does not decode", n);
  if (back->id != resp->id || back->status != resp->status) FZ_FAIL("reply round trip");
  /* Any status of the protocol's enum (it grows with the protocol). */
  if (!protobuf_c_enum_descriptor_get_value(&kvcache__v1__status__descriptor, (int)resp->status))
    FZ_FAIL("status %d is not in the protocol", (int)resp->status);
  if (resp->status != KVCACHE__V1__STATUS__OK && (!resp->error || !resp->error[0]))
    FZ_FAIL("status %d without a message", (int)resp->status);
  if (resp->status == KVCACHE__V1__STATUS__INTERNAL)
    FZ_FAIL("INTERNAL: %s", resp->error);
  kvcache__v1__response__free_unpacked(back, NULL);
  free(buf);
  static int trace = -1;
  if (trace < 0) trace = getenv("KVC_FUZZ_TRACE") != NULL;
  if (trace)
    fprintf(stderr, "conn %llu reply id=%llu status=%s %s\n", (unsigned long long)c->id,
            (unsigned long long)resp->id, kvc_err_name(-(int)resp->status),
            resp->error ? resp->error : "");
  fz_seen_t *s = fz_seen(c);
  c->via = VIA_SOCKET;
  s->replies++;
  s->last_id = resp->id;
  s->last_status = (int)resp->status;
  snprintf(s->last_error, sizeof s->last_error, "%s", resp->error ? resp->error : "");
  s->last_lease_id = 0;
  s->last_npages = 0;
  if (resp->body_case == KVCACHE__V1__RESPONSE__BODY_LEASE && resp->lease) {
    s->last_lease_id = resp->lease->lease_id;
    for (size_t i = 0; i < resp->lease->n_page_offsets && i < 8; i++)
      s->last_pages[i] = resp->lease->page_offsets[i];
    s->last_npages = (uint32_t)resp->lease->n_page_offsets;
  }
  c->srv->stats.socket_bytes_out += n + FRAME_HEADER_BYTES;
  return 0;
}

/* A fast request's reply: written into a slot as the daemon writes it and
 * read back as the client reads it; the same checks as a Response's. */
int conn_send_fast(conn_t *c, const ringfast_rep_t *p) {
  if (c->state == CONN_CLOSED) return KVC_E_IO;
  static ring_fast_rep_t slot;
  ringfast_rep_t back;
  ringfast_rep_encode(p, slot.body, slot.more);
  if (ringfast_rep_decode(slot.body, slot.more, &back) != 0) FZ_FAIL("a fast reply does not decode");
  if (back.status != p->status || back.npages != p->npages || back.lease_id != p->lease_id ||
      memcmp(back.page_off, p->page_off, back.npages * sizeof back.page_off[0]) != 0)
    FZ_FAIL("fast reply round trip");
  if (!protobuf_c_enum_descriptor_get_value(&kvcache__v1__status__descriptor, (int)p->status))
    FZ_FAIL("status %u is not in the protocol", p->status);
  if (p->status != KVCACHE__V1__STATUS__OK && (back.err_len == 0 || strcmp(back.err, p->err) != 0))
    FZ_FAIL("fast status %u without its message", p->status);
  if (p->status == KVCACHE__V1__STATUS__INTERNAL) FZ_FAIL("INTERNAL: %s", p->err);
  if (p->status == KVCACHE__V1__STATUS__OK && p->npages == 0 && p->lease_id)
    FZ_FAIL("a lease without pages");
  c->via = VIA_SOCKET;
  fz_seen_t *s = fz_seen(c);
  s->replies++;
  s->fast_replies++;
  s->last_status = (int)p->status;
  snprintf(s->last_error, sizeof s->last_error, "%s", back.err);
  s->last_lease_id = back.lease_id;
  s->last_npages = back.npages;
  memcpy(s->last_pages, back.page_off, sizeof s->last_pages);
  return 0;
}

int conn_send_fds(conn_t *c, const Kvcache__V1__Response *resp, const int *fds, int nfds) {
  int want = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
  for (int i = 0; i < nfds; i++) {
    int seals = fcntl(fds[i], F_GET_SEALS);
    if (seals < 0 || (seals & want) != want) FZ_FAIL("fd %d seals %d", fds[i], seals);
  }
  fz_seen(c)->fds++;
  return conn_send(c, resp);
}

/* offload_bytes is 0 in the fuzzers: nothing is ever offloaded. */
void conn_offload_begin(conn_t *c) { FZ_FAIL("conn %llu offloaded", (unsigned long long)c->id); }
/* Owned sequences are tracked by the real connection only: here a create
 * with owned is refused (NOMEM), every other path of SeqCreate is fuzzed. */
int conn_own_reserve(conn_t *c, uint32_t n) { (void)c; (void)n; return -1; }
void conn_own(conn_t *c, uint32_t cache_id, uint64_t seq_id) { (void)c; (void)cache_id; (void)seq_id; }
bool conn_offload_end(conn_t *c) {
  FZ_FAIL("conn %llu offload ended", (unsigned long long)c->id);
}
void conn_resume(conn_t *c) { FZ_FAIL("conn %llu resumed", (unsigned long long)c->id); }
void conn_park(conn_t *c) { FZ_FAIL("conn %llu parked", (unsigned long long)c->id); }
void conn_unpark_all(server_t *srv) { (void)srv; }
/* No tier is on here (tiers_open never runs): nothing waits for one. */
void conn_tier_done(server_t *srv, uint64_t conn_id, unsigned idx) {
  (void)srv;
  FZ_FAIL("conn %llu resumed by tier %u", (unsigned long long)conn_id, idx);
}

void conn_close(conn_t *c, const char *reason) {
  (void)reason;
  if (c->state == CONN_CLOSED) return;
  server_t *srv = c->srv;
  c->state = CONN_CLOSED;
  if (c->greeted) {
    engine_unpin_all(srv->eng, c->id);
    engine_lease_release_all(srv->eng, c->id);
  }
  if (c->shm.base) srv->stats.shm_bytes -= c->shm.bytes;
  shm_close(&c->shm);
  if (c->counted) srv->stats.connections_current--;
  c->counted = false;
}

void conn_close_after_flush(conn_t *c, const char *reason) { conn_close(c, reason); }

void conn_greeted(conn_t *c) {
  c->state = CONN_READY;
  c->greeted = true;
}

/* As conn.c: the fuzzer's peers are this process's uid, admins. */
bool conn_is_admin(const conn_t *c) { return c->uid == 0 || c->uid == geteuid(); }
const char *conn_tenant(const conn_t *c) {
  (void)c;
  return "";
}
