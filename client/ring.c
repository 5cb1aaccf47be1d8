/* ring.c: requests and replies through the connection's shared-memory rings. */
#include "ring.h"

#include <errno.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "client.h"
#include "frame.h"

/* How often a sleeper looks at the socket: a daemon that died never wakes
 * the futex, but its socket says EOF. */
#define SOCKET_LOOK_MS 20
/* How often a spinning waiter offers its CPU to whoever else wants it. */
#define YIELD_NS 4000u
/* A gap between two looks this long: the CPU was someone else's meanwhile. */
#define CROWDED_NS 20000u

int ring_attach(kvc_client_t *c, int memfd, int bell, const Kvcache__V1__HelloReply *h) {
  client_ring_t *r = &c->ring;
  uint32_t sq = h->ring_sq_bytes, cq = h->ring_cq_bytes;
  uint64_t pg = (uint64_t)sysconf(_SC_PAGESIZE), area = ringbuf_area_bytes(sq, cq);
  struct stat st;
  int rc = 0;
  if (!ringbuf_sizes_ok(sq, cq) || h->ring_off % pg || h->ring_off < h->shm_bytes ||
      fstat(memfd, &st) != 0 || (uint64_t)st.st_size < h->ring_off + area) {
    rc = client_fail(c, KVC_E_PROTO, "the daemon's rings do not fit its buffer");
    goto fail;
  }
  void *m = mmap(NULL, area, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, (off_t)h->ring_off);
  if (m == MAP_FAILED) {
    rc = client_fail(c, KVC_E_NOMEM, "mmap rings: %s", strerror(errno));
    goto fail;
  }
  ring_hdr_t *hdr = m;
  if (hdr->magic != RING_MAGIC || hdr->version != RING_VERSION || hdr->sq_bytes != sq ||
      hdr->cq_bytes != cq || !(r->buf = malloc(cq))) {
    munmap(m, area);
    rc = client_fail(c, KVC_E_PROTO, "the daemon's ring header does not match its Hello");
    goto fail;
  }
  r->map = m;
  r->map_bytes = area;
  r->hdr = hdr;
  r->sq = (ring_view_t){r->map + RING_HDR_BYTES, sq, atomic_load(&hdr->sq_tail)};
  r->cq = (ring_view_t){r->map + RING_HDR_BYTES + sq, cq, atomic_load(&hdr->cq_head)};
  r->bell = bell;
  r->fast = hdr->fast == RING_FAST_VERSION;
  r->fast_seq = atomic_load(&hdr->fast_req.seq);
  return 0;
fail:
  close(bell);
  return rc;
}

void ring_detach(client_ring_t *r) {
  if (r->map) munmap(r->map, r->map_bytes);
  if (r->bell >= 0) close(r->bell);
  free(r->buf);
  r->map = NULL;
  r->hdr = NULL;
  r->buf = NULL;
  r->bell = -1;
}

bool ring_usable(const client_ring_t *r) { return r->hdr && !atomic_load(&r->hdr->closed); }

static void ring_bell(const client_ring_t *r) {
  uint64_t one = 1;
  while (write(r->bell, &one, sizeof one) < 0 && errno == EINTR) {}
}

int ring_submit(kvc_client_t *c, const uint8_t *frame, size_t len) {
  client_ring_t *r = &c->ring;
  uint32_t n = (uint32_t)(len - FRAME_HEADER_BYTES);
  int64_t room = ringbuf_room(&r->sq, atomic_load_explicit(&r->hdr->sq_head, memory_order_acquire));
  /* The daemon consumes a request just after it replies: the last one may
   * still be there for a moment. */
  for (int i = 0; room >= 0 && room < (int64_t)len && i < 100000; i++) {
    sched_yield();
    room = ringbuf_room(&r->sq, atomic_load_explicit(&r->hdr->sq_head, memory_order_acquire));
  }
  if (room < 0) return client_fail(c, KVC_E_PROTO, "kvcached's submission ring head is impossible");
  if (room < (int64_t)len) return 1;
  ringbuf_put(&r->sq, frame + FRAME_HEADER_BYTES, n);
  /* The tail, then (seq_cst) the look at sq_wakeup: proto/ringbuf.h. */
  atomic_store(&r->hdr->sq_tail, r->sq.pos);
  if (atomic_load(&r->hdr->sq_wakeup)) ring_bell(r);
  return 0;
}

static uint64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

/* A complete record in the CQ: 1 (taken: *len, payload in r->buf or a
 * marker), 0 none, -1 impossible. */
static int take(client_ring_t *r, void *arg) {
  uint32_t *len = arg;
  uint64_t tail = atomic_load_explicit(&r->hdr->cq_tail, memory_order_acquire);
  if (tail == r->cq.pos) return 0;
  int st = ringbuf_peek(&r->cq, tail, r->cq.size, true, len);
  if (st != RING_OK) return st == RING_EMPTY ? 0 : -1;
  if (*len == RING_ON_SOCKET) ringbuf_skip(&r->cq, *len);
  else ringbuf_take(&r->cq, *len, r->buf);
  /* The head, then (seq_cst) the look at cq_full: a daemon that stopped for
   * room is told there is some. */
  atomic_store(&r->hdr->cq_head, r->cq.pos);
  if (atomic_load(&r->hdr->cq_full)) ring_bell(r);
  return 1;
}

/* Whether the socket has something (a goodbye, EOF) while no marker said so. */
static bool socket_speaks(int fd) {
  struct pollfd pf = {.fd = fd, .events = POLLIN};
  return poll(&pf, 1, 0) > 0;
}

/* How long to spin next time, after a reply that took w: unchanged if the
 * spin caught it; longer if a longer one (within cap) would have; halved
 * if replies take longer than any spin allowed (the daemon is busy, or
 * shares this client's CPUs: spinning then only takes the CPU it needs). */
static void adapt(client_ring_t *r, uint64_t cap, uint64_t w) {
  if (w <= r->spin_ns) return;
  if (w <= cap) {
    uint64_t more = w + w / 4, twice = 2 * r->spin_ns;
    r->spin_ns = more > twice ? more : twice;
    if (r->spin_ns > cap) r->spin_ns = cap;
  } else {
    r->spin_ns /= 2;
  }
}

static int64_t taken(client_ring_t *r, uint32_t len, const uint8_t **payload) {
  if (len == RING_ON_SOCKET) return RING_WAIT_SOCKET;
  *payload = r->buf;
  return len;
}

static int64_t corrupt(kvc_client_t *c) {
  return client_fail(c, KVC_E_PROTO, "kvcached's completion ring is corrupt");
}

/* Polls look (take, or the fast reply's seq) up to the ring's spin, then
 * sleeps on cq_seq until it answers: 1 when it did, RING_WAIT_SOCKET when
 * the daemon closed the rings (its word is on the socket), or a negative
 * KVC_E_* code (KVC_E_TIMEOUT after timeout_ms; KVC_E_PROTO for an
 * impossible ring). */
static int64_t wait_for(kvc_client_t *c, int (*look)(client_ring_t *r, void *arg), void *arg) {
  client_ring_t *r = &c->ring;
  ring_hdr_t *h = r->hdr;
  int st;
  /* The clock from the 64th look on: a reply within the first (a few
   * microseconds) costs no clock read, which is a tenth of a fast
   * request's own time. */
  for (unsigned i = 0; r->spin_ns && i < 63; i++) {
    if ((st = look(r, arg)) != 0) return st < 0 ? corrupt(c) : 1;
    cpu_relax();
  }
  uint64_t t0 = mono_ns(), spin_end = t0 + r->spin_ns, next_yield = t0 + YIELD_NS, last = t0;
  uint64_t deadline = c->timeout_ms ? t0 + (uint64_t)c->timeout_ms * 1000000u : UINT64_MAX;
  bool crowded = false;
  for (unsigned i = 0;; i++) {
    if ((st = look(r, arg)) != 0) break;
    if ((i & 63) == 63) {
      uint64_t now = mono_ns();
      if (now >= spin_end) break;
      /* Away this long between two looks: another thread had this CPU (the
       * yield below let it, or it preempted us). Spinning on a crowded CPU
       * takes it from whoever must run for the reply to come: sleep. */
      if (now - last > CROWDED_NS) {
        crowded = true;
        break;
      }
      /* On a small host the CPU this thread spins on may be the one the
       * daemon's copy thread, or another client, waits for: let it run. */
      if (now >= next_yield) {
        sched_yield();
        now = mono_ns();
        next_yield = now + YIELD_NS;
        if (now - last > CROWDED_NS) {
          crowded = true;
          break;
        }
      }
      last = now;
    }
    cpu_relax();
  }
  if (crowded) r->spin_ns /= 2;
  while (st == 0) {
    /* What it answered before it closed is answered; the rest is on the
     * socket. */
    if (atomic_load(&h->closed)) {
      if ((st = look(r, arg)) != 0) break;
      return RING_WAIT_SOCKET;
    }
    /* The flag, then (seq_cst) the look at the tail; the daemon publishes,
     * then looks at the flag: one of us sees the other. */
    uint32_t seq = atomic_load(&h->cq_seq);
    atomic_store(&h->client_waiting, 1);
    if ((st = look(r, arg)) != 0) {
      atomic_store(&h->client_waiting, 0);
      break;
    }
    uint64_t now = mono_ns();
    if (now >= deadline) {
      atomic_store(&h->client_waiting, 0);
      return client_fail(c, KVC_E_TIMEOUT, "no reply from kvcached within %u ms", c->timeout_ms);
    }
    uint64_t wait_ns = (uint64_t)SOCKET_LOOK_MS * 1000000u;
    if (deadline - now < wait_ns) wait_ns = deadline - now;
    struct timespec ts = {(time_t)(wait_ns / 1000000000u), (long)(wait_ns % 1000000000u)};
    long rc = syscall(SYS_futex, (uint32_t *)&h->cq_seq, FUTEX_WAIT, seq, &ts, NULL, 0);
    atomic_store(&h->client_waiting, 0);
    if ((st = look(r, arg)) != 0) break;
    if (rc != 0 && errno == ETIMEDOUT && socket_speaks(c->fd)) return RING_WAIT_SOCKET;
  }
  if (st < 0) return corrupt(c);
  adapt(r, c->spin_ns, mono_ns() - t0);
  return 1;
}

int64_t ring_wait(kvc_client_t *c, const uint8_t **payload) {
  uint32_t len = 0;
  int64_t rc = wait_for(c, take, &len);
  return rc == 1 ? taken(&c->ring, len, payload) : rc;
}

/* ---- the fast slots (proto/ringfast.h) ---------------------------------------- */

bool ring_fast_usable(const kvc_client_t *c) {
  return c->ring.fast && !(c->flags & KVC_CLIENT_NO_FAST) && ring_usable(&c->ring);
}

void ring_fast_submit(kvc_client_t *c, const ringfast_req_t *q) {
  client_ring_t *r = &c->ring;
  ring_fast_req_t *slot = &r->hdr->fast_req;
  if (++r->fast_seq == 0) r->fast_seq = 1; /* 0 is the slot's "none yet" */
  ringfast_req_encode(q, slot->body);
  /* The seq, then (seq_cst) the look at sq_wakeup: proto/ringbuf.h. */
  atomic_store(&slot->seq, r->fast_seq);
  if (atomic_load(&r->hdr->sq_wakeup)) ring_bell(r);
}

/* The fast reply to the request in flight has come. */
static int fast_answered(client_ring_t *r, void *arg) {
  (void)arg;
  return atomic_load_explicit(&r->hdr->fast_rep.seq, memory_order_acquire) == r->fast_seq;
}

int ring_fast_wait(kvc_client_t *c, ringfast_rep_t *rep) {
  int64_t rc = wait_for(c, fast_answered, NULL);
  if (rc != 1) return (int)rc;
  const ring_fast_rep_t *slot = &c->ring.hdr->fast_rep;
  if (ringfast_rep_decode(slot->body, slot->more, rep) != 0)
    return client_fail(c, KVC_E_PROTO, "kvcached's fast reply is corrupt");
  return 0;
}
