/* rawring.h: a client of the shared-memory rings written by hand (Hello
 * asking for rings, the ring area and the shared buffer mapped), for tests
 * of what libkvcache never sends: records and fast slots of every kind. */
#ifndef KVC_IT_RAWRING_H
#define KVC_IT_RAWRING_H

#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>

#include "frame.h"
#include "raw.h"
#include "ringbuf.h"
#include "ringfast.h"

typedef struct rawring {
  int fd;                 /* the socket */
  uint8_t *shm;           /* the shared buffer */
  uint64_t shm_bytes;
  uint8_t *map;           /* the ring area */
  uint64_t map_bytes;
  ring_hdr_t *hdr;
  ring_view_t sq, cq;
  int bell;
  uint64_t next_id;
} rawring_t;

/* Hello asking for rings; maps them. */
IT_UNUSED static void rr_open(rawring_t *r, const daemon_t *d) {
  memset(r, 0, sizeof *r);
  r->fd = it_connect_raw(d->sock);
  ASSERT(r->fd >= 0);
  Kvcache__V1__Request req = KVCACHE__V1__REQUEST__INIT;
  Kvcache__V1__Hello hello = KVCACHE__V1__HELLO__INIT;
  hello.protocol_version = KVC_PROTOCOL_VERSION;
  hello.shm_bytes = 1 << 20;
  hello.rings = true;
  req.body_case = KVCACHE__V1__REQUEST__BODY_HELLO;
  req.hello = &hello;
  req.id = 1;
  raw_send_request(r->fd, &req);
  uint8_t buf[4096];
  char ctl[CMSG_SPACE(3 * sizeof(int))];
  struct iovec iov = {.iov_base = buf, .iov_len = sizeof buf};
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl,
                       .msg_controllen = sizeof ctl};
  ssize_t n = recvmsg(r->fd, &msg, MSG_CMSG_CLOEXEC);
  ASSERT(n > 4);
  int fds[3] = {-1, -1, -1};
  struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
  ASSERT(cm != NULL && cm->cmsg_type == SCM_RIGHTS);
  size_t nfds = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
  ASSERT(nfds >= 2 && nfds <= 3);
  memcpy(fds, CMSG_DATA(cm), nfds * sizeof(int));
  uint32_t len = 0;
  ASSERT_EQ(frame_parse(buf, (size_t)n, sizeof buf, &len), FRAME_OK);
  Kvcache__V1__Response *resp = kvcache__v1__response__unpack(NULL, len, buf + 4);
  ASSERT(resp && resp->status == KVCACHE__V1__STATUS__OK && resp->hello);
  const Kvcache__V1__HelloReply *h = resp->hello;
  ASSERT(h->ring_sq_bytes > 0 && h->ring_off >= h->shm_bytes);
  r->bell = fds[nfds - 1]; /* the doorbell comes last */
  ASSERT_EQ(nfds, h->pool_fd ? 3 : 2);
  r->map_bytes = ringbuf_area_bytes(h->ring_sq_bytes, h->ring_cq_bytes);
  r->map = mmap(NULL, r->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], (off_t)h->ring_off);
  ASSERT(r->map != MAP_FAILED);
  r->hdr = (ring_hdr_t *)r->map;
  ASSERT_EQ(r->hdr->magic, RING_MAGIC);
  r->sq = (ring_view_t){r->map + RING_HDR_BYTES, h->ring_sq_bytes, 0};
  r->cq = (ring_view_t){r->map + RING_HDR_BYTES + h->ring_sq_bytes, h->ring_cq_bytes, 0};
  r->shm_bytes = h->shm_bytes;
  r->shm = mmap(NULL, r->shm_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
  ASSERT(r->shm != MAP_FAILED);
  for (size_t i = 0; i + 1 < nfds; i++) close(fds[i]);
  kvcache__v1__response__free_unpacked(resp, NULL);
  r->next_id = 100;
}

IT_UNUSED static void rr_close(rawring_t *r) {
  munmap(r->map, r->map_bytes);
  munmap(r->shm, r->shm_bytes);
  close(r->bell);
  close(r->fd);
}

/* Puts req into the SQ, as libkvcache does (the bell if the daemon sleeps). */
IT_UNUSED static void rr_submit(rawring_t *r, Kvcache__V1__Request *req) {
  size_t n = kvcache__v1__request__get_packed_size(req);
  uint8_t *p = malloc(n ? n : 1);
  kvcache__v1__request__pack(req, p);
  ASSERT(ringbuf_room(&r->sq, atomic_load(&r->hdr->sq_head)) >= (int64_t)(4 + n));
  ringbuf_put(&r->sq, p, (uint32_t)n);
  atomic_store(&r->hdr->sq_tail, r->sq.pos);
  if (atomic_load(&r->hdr->sq_wakeup)) {
    uint64_t one = 1;
    ASSERT_EQ(write(r->bell, &one, 8), 8);
  }
  free(p);
}

/* The next CQ record (waiting up to 10 s, polling): the reply, or NULL for
 * a marker (the reply is on the socket). */
IT_UNUSED static Kvcache__V1__Response *rr_reply(rawring_t *r, bool *on_socket) {
  uint32_t len = 0;
  for (int i = 0; i < 10000000; i++) {
    uint64_t tail = atomic_load(&r->hdr->cq_tail);
    int st = ringbuf_peek(&r->cq, tail, r->cq.size, true, &len);
    ASSERT(st != RING_BAD);
    if (st == RING_OK) break;
    if (i % 1000 == 999) it_sleep_ms(1);
  }
  *on_socket = len == RING_ON_SOCKET;
  Kvcache__V1__Response *resp = NULL;
  if (*on_socket) {
    ringbuf_skip(&r->cq, len);
  } else {
    uint8_t *p = malloc(len ? len : 1);
    ringbuf_take(&r->cq, len, p);
    resp = kvcache__v1__response__unpack(NULL, len, p);
    ASSERT(resp != NULL);
    free(p);
  }
  atomic_store(&r->hdr->cq_head, r->cq.pos);
  return resp;
}

IT_UNUSED static void req_ping(Kvcache__V1__Request *req, Kvcache__V1__Ping *ping, uint64_t id) {
  kvcache__v1__request__init(req);
  kvcache__v1__ping__init(ping);
  req->id = id;
  req->body_case = KVCACHE__V1__REQUEST__BODY_PING;
  req->ping = ping;
}

/* A ping through the ring, its reply from the CQ. */
IT_UNUSED static void rr_ping(rawring_t *r) {
  Kvcache__V1__Request req;
  Kvcache__V1__Ping ping;
  uint64_t id = r->next_id++;
  req_ping(&req, &ping, id);
  rr_submit(r, &req);
  bool sock;
  Kvcache__V1__Response *resp = rr_reply(r, &sock);
  ASSERT(!sock && resp);
  ASSERT_U64_EQ(resp->id, id);
  ASSERT_EQ(resp->status, KVCACHE__V1__STATUS__OK);
  kvcache__v1__response__free_unpacked(resp, NULL);
}

/* ---- the fast slots (proto/ringfast.h) ---------------------------------------- */

/* Writes q into the fast request slot under seq and rings if the daemon
 * sleeps, as libkvcache does; body_edit, if not NULL, changes the body
 * before seq is published (a malformed slot). */
IT_UNUSED static void rr_fast_submit(rawring_t *r, const ringfast_req_t *q, uint32_t seq,
                                     void (*body_edit)(uint8_t *body)) {
  ringfast_req_encode(q, r->hdr->fast_req.body);
  if (body_edit) body_edit(r->hdr->fast_req.body);
  atomic_store(&r->hdr->fast_req.seq, seq);
  if (atomic_load(&r->hdr->sq_wakeup)) {
    uint64_t one = 1;
    ASSERT_EQ(write(r->bell, &one, 8), 8);
  }
}

/* Waits (polling, up to 10 s) for the fast reply to seq and reads it: true;
 * false if the daemon closed the rings first. */
IT_UNUSED static bool rr_fast_reply(rawring_t *r, uint32_t seq, ringfast_rep_t *rep) {
  for (int i = 0; i < 10000000; i++) {
    if (atomic_load(&r->hdr->fast_rep.seq) == seq) {
      ASSERT_EQ(ringfast_rep_decode(r->hdr->fast_rep.body, r->hdr->fast_rep.more, rep), 0);
      return true;
    }
    if (atomic_load(&r->hdr->closed)) return false;
    if (i % 1000 == 999) it_sleep_ms(1);
  }
  TEST_FAIL_("no fast reply to %u within 10 s", seq);
  return false;
}

/* A fast request and its reply. */
IT_UNUSED static void rr_fast(rawring_t *r, const ringfast_req_t *q, ringfast_rep_t *rep) {
  uint32_t seq = (uint32_t)r->next_id++;
  rr_fast_submit(r, q, seq, NULL);
  ASSERT(rr_fast_reply(r, seq, rep));
}

#endif
