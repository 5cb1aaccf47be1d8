/* ring.c: a connection's shared-memory rings on the daemon's side, and the
 * poller that watches the recently active ones before the loop sleeps.
 *
 * How the spinning is bounded, after io_uring's SQPOLL (sq_thread_idle: the
 * kernel thread polls for a fixed idle time after its last work, then sets
 * IORING_SQ_NEED_WAKEUP and sleeps until io_uring_enter wakes it) and SPDK
 * (reactors poll forever on dedicated cores): a dedicated core is what this
 * daemon cannot assume on a 2-vCPU node where its clients run too, and a
 * fixed idle time either wastes a CPU on a client that thinks long or
 * misses one that thinks a little longer. So the idle time is per
 * connection and learned from what its client does (ring.h), capped by
 * ring_poll_us, and the poller gives up the CPU as soon as it sees that it
 * was preempted. */
#include "ring.h"

#include <errno.h>
#include <linux/futex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "frame.h"
#include "offload.h"
#include "work.h"
#include "ringbuf.h"

#define SLICE_NS 30000u    /* longest the poll loop keeps the event loop waiting */
#define PREEMPT_NS 50000u  /* a gap between two looks this long: it was preempted */
#define CQ_BYTES (64u << 10)
#define LONG_GAPS 3        /* requests in a row after the cap that shrink the budget:
                              one such gap is a client's pause between bursts */

typedef struct ring_poller {
  server_t *srv;
  ring_run_fn run;
  uv_idle_t idle;          /* active while some ring is polled */
  ring_t *active;          /* the rings polled (sq_wakeup clear), doubly linked */
  uint8_t *req;            /* a request's payload, copied out of its SQ */
  uint32_t req_cap;
  uint8_t *rep;            /* a reply packed before it goes into a CQ */
  bool one_cpu;            /* the machine has one CPU: spinning on it only delays
                              the client it waits for, so it never polls */
  unsigned ncpus;          /* CPUs the daemon may use (work_cpus) */
  bool in_pass;            /* running rings (on_idle, ring_preempt): no second pass inside */
} ring_poller_t;

struct ring {
  conn_t *c;
  ring_poller_t *p;
  uint8_t *map;            /* the ring area, MAP_SHARED */
  uint64_t map_bytes;
  ring_hdr_t *hdr;
  ring_view_t sq, cq;      /* sq.pos: consumed; cq.pos: published (ours alone) */
  int efd;                 /* the doorbell */
  uv_poll_t bell;          /* watches efd */
  ring_t *prev, *next;     /* the poller's active list */
  bool active;             /* on it: its requests run from the poll loop */
  bool polled;             /* and it is polled: sq_wakeup is clear */
  bool closed;             /* ring_close ran */
  uint64_t idle_ns;        /* when its last reply was published (uv_hrtime) */
  uint64_t budget_ns;      /* how long to poll after a reply (adapted) */
  unsigned long_gaps;      /* requests in a row that came later than the cap */
  uint64_t turn_tail;      /* sq_tail when this loop turn began to run the ring */
  uint32_t fast_seen;      /* seq of the last fast request run (0: none yet) */
  uint32_t fast_cur;       /* seq of the fast request running (ring_fast_next) */
  bool stamp;              /* replied within a pass: idle_ns is the pass's next
                              clock read (stamp) */
};

static void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

static uint64_t cap_ns(const ring_poller_t *p) {
  return p->one_cpu ? 0 : (uint64_t)p->srv->cfg.ring_poll_us * 1000u;
}

void ring_sizes(const server_t *srv, uint32_t *sq_bytes, uint32_t *cq_bytes) {
  uint64_t frame = srv->cfg.max_frame_bytes + FRAME_HEADER_BYTES;
  *sq_bytes = ringbuf_pow2((uint32_t)(2 * frame));
  *cq_bytes = CQ_BYTES;
}

/* ---- the active list ------------------------------------------------------ */

static void on_idle(uv_idle_t *h);

static void link_active(ring_t *r) {
  ring_poller_t *p = r->p;
  r->prev = NULL;
  r->next = p->active;
  if (p->active) p->active->prev = r;
  p->active = r;
  r->active = true;
  if (!uv_is_active((uv_handle_t *)&p->idle)) uv_idle_start(&p->idle, on_idle);
}

static void unlink_active(ring_t *r) {
  ring_poller_t *p = r->p;
  if (r->prev) r->prev->next = r->next;
  else p->active = r->next;
  if (r->next) r->next->prev = r->prev;
  r->prev = r->next = NULL;
  r->active = false;
}

/* A request waits: a record in the SQ, or a fast request not yet run
 * (seq_cst loads: deactivate's look after its flag). */
static bool sq_pending(const ring_t *r) {
  return atomic_load(&r->hdr->sq_tail) != r->sq.pos ||
         atomic_load(&r->hdr->fast_req.seq) != r->fast_seen;
}

/* Puts r on the poller's list: its requests run from the poll loop. With
 * poll, the client is told that it need not ring the doorbell; without (a
 * ring kicked to run what waits in it), the doorbell stays on, so a daemon
 * that does not poll is never mistaken for one that does. */
static void activate(ring_t *r, bool poll) {
  if (r->closed) return;
  if (poll && !r->polled) atomic_store(&r->hdr->sq_wakeup, 0);
  r->polled |= poll;
  if (!r->active) link_active(r);
}

/* Stops polling r unless a request arrived meanwhile (then returns false).
 * The flag first, then the look (both seq_cst): a client that published
 * after the look sees the flag and rings (proto/ringbuf.h). */
static bool deactivate(ring_t *r) {
  atomic_store(&r->hdr->sq_wakeup, 1);
  if (!r->closed && sq_pending(r)) {
    if (r->polled) atomic_store(&r->hdr->sq_wakeup, 0);
    return false;
  }
  r->polled = false;
  unlink_active(r);
  return true;
}

/* Whether c can run a request now (else its ring waits for ring_kick). */
static bool runnable(const conn_t *c) {
  return c->state == CONN_READY && !c->offloaded && !c->parked && !c->paused &&
         c->after_offload == AFTER_OFFLOAD_RESUME;
}

/* ---- the poll loop ------------------------------------------------------- */

/* Every polled ring's budget halves and the loop sleeps: it was preempted,
 * so the CPU it spins on is wanted by someone else, likely a client. */
static void back_off(ring_poller_t *p) {
  for (ring_t *r = p->active, *next; r; r = next) {
    next = r->next;
    r->budget_ns /= 2;
    deactivate(r);
  }
}

/* After a ring ran: its reply's time, if it replied (ring_reply and
 * ring_fast_reply leave it to the pass, which reads the clock anyway). */
static void stamp(ring_t *r, uint64_t now) {
  if (!r->stamp) return;
  r->stamp = false;
  r->idle_ns = now;
}

/* Changes of the prefix index wait in the engine's event log. */
static bool events_waiting(const server_t *srv) {
  size_t cursor = 0;
  engine_event_t ev;
  return engine_events_on(srv->eng) && engine_events_next(srv->eng, &cursor, &ev);
}

static void on_idle(uv_idle_t *h) {
  ring_poller_t *p = h->data;
  daemon_stats_t *st = &p->srv->stats;
  /* The clock every fourth look, and after each request the one its
   * figures read: a request's path read it eight times, as much as a
   * request's bookkeeping. */
  uint64_t t0 = uv_hrtime(), now = t0, last = t0, worked_ns = 0;
  unsigned looks = 0;
  p->in_pass = true;
  for (;;) {
    bool ran = false;
    for (ring_t *r = p->active, *next; r; r = next) {
      next = r->next;
      if (!runnable(r->c)) {
        unlink_active(r); /* ring_kick brings it back */
        r->polled = false;
        atomic_store(&r->hdr->sq_wakeup, 1);
        continue;
      }
      if (sq_pending(r)) {
        r->long_gaps = 0; /* caught while polling */
        p->srv->answered_ns = 0;
        ran |= p->run(r->c, now); /* may close the connection: r stays valid till the next turn */
        /* The clock as the request's figures read it, a few instructions ago. */
        uint64_t after = p->srv->answered_ns > now ? p->srv->answered_ns : uv_hrtime();
        stamp(r, after);
        worked_ns += after - now;
        now = after;
        continue;
      }
      if (!r->polled || now - r->idle_ns > r->budget_ns) deactivate(r);
    }
    /* A copy thread's finished job: its reply goes now, not at the loop's
     * next look at the threads' eventfd (up to a slice later). */
    if (offload_reap(p->srv)) {
      ran = true;
      now = uv_hrtime();
      for (ring_t *r = p->active; r; r = r->next) stamp(r, now);
    }
    if (!p->active) break; /* back to the loop: sockets, timers, completions */
    /* A request that changed the prefix index with the event stream on
     * ends the pass: the loop's check publishes its changes as their own
     * batch (doc/events.md), not merged with the next requests'. */
    if (ran && events_waiting(p->srv)) break;
    /* Copies that could keep every CPU the daemon may use busy: a CPU this
     * loop spins on is one the copy threads (at nice 10) do not get. Sleep;
     * the doorbells and the threads' eventfd wake the loop. Not on one CPU:
     * there the loop and the copies share it anyway, and the small requests
     * of the loop come first (why the copy threads run at nice 10). */
    if (p->ncpus > 1 && offload_shares(p->srv) >= p->ncpus) {
      for (ring_t *r = p->active, *next; r; r = next) {
        next = r->next;
        deactivate(r);
      }
      break;
    }
    /* Otherwise, after work the pass goes on: a client's next request,
     * written as soon as it read the reply, is caught without a turn of the
     * event loop in between (its epoll_wait is about a fifth of a 4 KiB
     * put). The slice still bounds how long sockets and timers wait. */
    /* The clock every few looks (a look is a few loads and a pause). */
    if (!ran && ++looks % 4 == 0) {
      now = uv_hrtime();
      if (now - last > PREEMPT_NS) {
        back_off(p);
        break;
      }
    }
    last = now;
    if (now - t0 >= SLICE_NS) break;
    cpu_relax();
  }
  p->in_pass = false;
  uint64_t spent = now - t0;
  if (spent > worked_ns) metrics_observe(&st->ring_poll, spent - worked_ns);
  if (!p->active) uv_idle_stop(&p->idle);
}

bool ring_preempt(server_t *srv) {
  ring_poller_t *p = srv->rings;
  if (!p || p->in_pass || !p->active) return false;
  bool ran = false;
  p->in_pass = true;
  uint64_t now = 0;
  for (ring_t *r = p->active, *next; r; r = next) {
    next = r->next;
    if (!runnable(r->c) || !sq_pending(r)) continue; /* on_idle sorts those out */
    r->long_gaps = 0;
    ran |= p->run(r->c, now ? now : uv_hrtime());
    now = uv_hrtime();
    stamp(r, now);
  }
  p->in_pass = false;
  if (ran) srv->stats.ring_preempts++;
  return ran;
}

int ring_poller_start(server_t *srv, ring_run_fn run) {
  ring_poller_t *p = calloc(1, sizeof *p);
  if (!p) return -1;
  p->srv = srv;
  p->run = run;
  /* Not the daemon's affinity: pinned to one CPU of several, it polls
   * there while its clients run on the others. Sharing that CPU with a
   * client, it sees itself preempted and backs off. */
  p->one_cpu = sysconf(_SC_NPROCESSORS_ONLN) < 2;
  p->ncpus = work_cpus();
  p->req_cap = (uint32_t)srv->cfg.max_frame_bytes;
  p->req = malloc(p->req_cap ? p->req_cap : 1);
  p->rep = malloc(CQ_BYTES);
  if (!p->req || !p->rep) {
    free(p->req);
    free(p->rep);
    free(p);
    return -1;
  }
  uv_idle_init(srv->loop, &p->idle);
  p->idle.data = p;
  srv->rings = p;
  return 0;
}

static void on_idle_closed(uv_handle_t *h) {
  ring_poller_t *p = h->data;
  free(p->req);
  free(p->rep);
  free(p);
}

void ring_poller_stop(server_t *srv) {
  ring_poller_t *p = srv->rings;
  if (!p) return;
  srv->rings = NULL;
  uv_close((uv_handle_t *)&p->idle, on_idle_closed);
}

/* ---- one ring ------------------------------------------------------------ */

/* The client rang: read the doorbell, have its requests run. */
static void on_bell(uv_poll_t *h, int status, int events) {
  (void)status, (void)events;
  ring_t *r = h->data;
  uint64_t n = 0;
  while (read(r->efd, &n, sizeof n) < 0 && errno == EINTR) {}
  if (r->closed) return;
  /* Rings since the last read, one each (a client writing more at once
   * counts as at most 64: the figure is the daemon's, not the client's). */
  r->c->srv->stats.ring_doorbells += n < 64 ? n : 64;
  if (!sq_pending(r) || !runnable(r->c)) return; /* a late ring; or ring_kick later */
  /* Missed: the request came after polling stopped. If polling up to the
   * cap would have caught it, poll longer next time; if not, less. */
  uint64_t gap = uv_hrtime() - r->idle_ns, cap = cap_ns(r->p);
  if (gap <= cap) {
    uint64_t more = gap + gap / 4, twice = 2 * r->budget_ns;
    r->budget_ns = more > twice ? more : twice;
    if (r->budget_ns > cap) r->budget_ns = cap;
    r->long_gaps = 0;
  } else if (++r->long_gaps >= LONG_GAPS) {
    r->budget_ns /= 2; /* it thinks longer than any poll: stop paying for one */
  }
  /* Run from the poll loop, next turn: a ring runs once a turn, what its
   * client sends meanwhile waits for the turn after, as on a socket. */
  ring_kick(r);
}

int ring_open(conn_t *c, int fd, uint64_t off, uint32_t sq_bytes, uint32_t cq_bytes,
              ring_t **out, char *err, size_t errlen) {
  server_t *srv = c->srv;
  ring_t *r = calloc(1, sizeof *r);
  if (!r || !srv->rings) {
    free(r);
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  r->c = c;
  r->p = srv->rings;
  r->efd = -1;
  r->map_bytes = ringbuf_area_bytes(sq_bytes, cq_bytes);
  void *m = mmap(NULL, r->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)off);
  if (m == MAP_FAILED) {
    snprintf(err, errlen, "mmap rings: %s", strerror(errno));
    free(r);
    return -1;
  }
  r->map = m;
  r->hdr = m;
  ringbuf_hdr_init(r->hdr, sq_bytes, cq_bytes);
  r->sq = (ring_view_t){r->map + RING_HDR_BYTES, sq_bytes, 0};
  r->cq = (ring_view_t){r->map + RING_HDR_BYTES + sq_bytes, cq_bytes, 0};
  r->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (r->efd < 0 || uv_poll_init(srv->loop, &r->bell, r->efd) != 0) {
    snprintf(err, errlen, "doorbell eventfd: %s", strerror(errno));
    if (r->efd >= 0) close(r->efd);
    munmap(r->map, r->map_bytes);
    free(r);
    return -1;
  }
  r->bell.data = r;
  uv_poll_start(&r->bell, UV_READABLE, on_bell);
  r->idle_ns = uv_hrtime();
  r->budget_ns = cap_ns(r->p); /* start generous; the client's habits shape it */
  srv->stats.ring_connections++;
  srv->nrings++;
  *out = r;
  return 0;
}

int ring_doorbell(const ring_t *r) { return r->efd; }

static void on_bell_closed(uv_handle_t *h) {
  ring_t *r = h->data;
  munmap(r->map, r->map_bytes);
  free(r);
}

static void futex_wake(_Atomic uint32_t *word) {
  syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, 1, NULL, NULL, 0);
}

void ring_close(ring_t *r) {
  if (!r || r->closed) return;
  server_t *srv = r->c->srv;
  r->closed = true;
  r->polled = false;
  if (r->active) {
    unlink_active(r);
    if (!r->p->active) uv_idle_stop(&r->p->idle);
  }
  atomic_store(&r->hdr->sq_wakeup, 1);
  atomic_store(&r->hdr->closed, 1);
  atomic_fetch_add(&r->hdr->cq_seq, 1);
  futex_wake(&r->hdr->cq_seq); /* whether it sleeps or not: it is the last word */
  close(r->efd);
  r->efd = -1;
  r->c = NULL;
  srv->stats.ring_connections--;
  srv->nrings--;
  uv_close((uv_handle_t *)&r->bell, on_bell_closed);
}

void ring_turn_begin(ring_t *r) {
  if (r && !r->closed) r->turn_tail = atomic_load_explicit(&r->hdr->sq_tail, memory_order_acquire);
}

int ring_next(ring_t *r, const uint8_t **payload, uint32_t *len, bool this_turn) {
  ring_hdr_t *h = r->hdr;
  /* Room for the reply's place (at least a marker) before the request runs:
   * a client that does not read its replies stops its own requests. */
  int64_t room = ringbuf_room(&r->cq, atomic_load_explicit(&h->cq_head, memory_order_acquire));
  if (room < 0) return -1;
  if (room < FRAME_HEADER_BYTES) {
    atomic_store(&h->cq_full, 1); /* the client rings once it has read */
    room = ringbuf_room(&r->cq, atomic_load(&h->cq_head));
    if (room < FRAME_HEADER_BYTES) return room < 0 ? -1 : 0;
    atomic_store(&h->cq_full, 0);
  }
  uint64_t tail = this_turn ? r->turn_tail : atomic_load_explicit(&h->sq_tail, memory_order_acquire);
  uint32_t n;
  int st = ringbuf_peek(&r->sq, tail, r->p->req_cap, false, &n);
  if (st != RING_OK) return st == RING_EMPTY ? 0 : -1;
  /* Copied out before decoding: the client could change the bytes under
   * the decoder, which reads some of them twice. */
  ring_view_t v = r->sq;
  ringbuf_take(&v, n, r->p->req);
  *payload = r->p->req;
  *len = n;
  return 1;
}

void ring_consume(ring_t *r, uint32_t len) {
  if (r->closed) return;
  ringbuf_skip(&r->sq, len);
  atomic_store_explicit(&r->hdr->sq_head, r->sq.pos, memory_order_release);
  r->c->srv->stats.ring_requests++;
}

/* A reply went out: the poll budget counts from now (from the pass's next
 * clock read when a pass runs it). */
static void reply_stamp(ring_t *r) {
  if (r->p->in_pass) r->stamp = true;
  else r->idle_ns = uv_hrtime();
}

int ring_reply(ring_t *r, const Kvcache__V1__Response *resp) {
  ring_hdr_t *h = r->hdr;
  int64_t room = ringbuf_room(&r->cq, atomic_load_explicit(&h->cq_head, memory_order_acquire));
  if (room < FRAME_HEADER_BYTES) return -1; /* ring_next saw the room: it was taken back */
  size_t n = resp ? kvcache__v1__response__get_packed_size(resp) : SIZE_MAX;
  int rc = 0;
  if (resp && n + FRAME_HEADER_BYTES <= (uint64_t)room && n <= CQ_BYTES) {
    kvcache__v1__response__pack(resp, r->p->rep);
    ringbuf_put(&r->cq, r->p->rep, (uint32_t)n);
  } else {
    ringbuf_put(&r->cq, NULL, 0); /* its place; the reply follows on the socket */
    rc = 1;
  }
  atomic_store_explicit(&h->cq_tail, r->cq.pos, memory_order_release);
  atomic_fetch_add(&h->cq_seq, 1); /* seq_cst: before the look at client_waiting */
  if (atomic_load(&h->client_waiting)) {
    futex_wake(&h->cq_seq);
    r->c->srv->stats.ring_client_wakeups++;
  }
  reply_stamp(r);
  if (r->budget_ns && cap_ns(r->p)) activate(r, true);
  return rc;
}

void ring_kick(ring_t *r) {
  if (!r || r->closed || r->active || !runnable(r->c)) return;
  if (sq_pending(r)) activate(r, false);
}

/* ---- the fast slots -------------------------------------------------------- */

int ring_fast_next(ring_t *r, uint8_t body[RING_FAST_BODY], uint32_t *seq) {
  uint32_t s = atomic_load_explicit(&r->hdr->fast_req.seq, memory_order_acquire);
  if (s == r->fast_seen) return 0;
  /* Copied once: the client could change the line under the decoder. */
  memcpy(body, r->hdr->fast_req.body, RING_FAST_BODY);
  r->fast_cur = *seq = s;
  return 1;
}

void ring_fast_consume(ring_t *r, uint32_t seq) {
  if (r->closed) return;
  r->fast_seen = seq;
  r->c->srv->stats.ring_requests++;
}

int ring_fast_reply(ring_t *r, const ringfast_rep_t *p) {
  ring_hdr_t *h = r->hdr;
  ring_fast_rep_t *slot = &h->fast_rep;
  ringfast_rep_encode(p, slot->body, slot->more);
  /* The seq, then (seq_cst) the look at client_waiting; the client sets
   * its flag, then looks at the seq (proto/ringbuf.h). cq_seq, its futex
   * word, moves only for a sleeper: a polling client never loses the line
   * it polls to a bump it does not need. */
  atomic_store(&slot->seq, r->fast_cur);
  if (atomic_load(&h->client_waiting)) {
    atomic_fetch_add(&h->cq_seq, 1);
    futex_wake(&h->cq_seq);
    r->c->srv->stats.ring_client_wakeups++;
  }
  reply_stamp(r);
  if (r->budget_ns && cap_ns(r->p)) activate(r, true);
  return 0;
}
