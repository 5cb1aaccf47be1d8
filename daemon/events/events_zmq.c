/* events_zmq.c: publishing batches on ZeroMQ without blocking the loop, and
 * replaying the kept ones (events_zmq.h has the frames). */
#include "events_zmq.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zmq.h>

#include "log.h"

#define REPLAY_BYTES_MAX (64u << 20) /* payload bytes kept for replay, at most */
#define REQUEST_FRAMES_MAX 4         /* frames of a replay request read; more is invalid */

/* A batch kept for replay. */
typedef struct kept {
  uint64_t seq;
  size_t len;
  uint8_t *buf;
} kept_t;

struct zpub {
  server_t *srv;
  void *ctx, *pub, *router;
  uv_poll_t pub_poll, router_poll;
  int open_polls;        /* uv_poll handles not yet through their close callback */
  uint64_t next_seq;
  uint32_t joins;        /* subscriptions to the topic seen since zpub_take_joins */
  kept_t *ring;          /* cfg.events_buffer slots, the oldest at head */
  uint32_t cap, head, n;
  size_t ring_bytes;
  log_limit_t limit;     /* budget of warning lines */
};

/* One frame of a message. */
typedef struct frame {
  const void *p;
  size_t len;
} frame_t;

static void seq_bytes(uint64_t seq, uint8_t out[8]) {
  for (int i = 7; i >= 0; i--, seq >>= 8) out[i] = (uint8_t)seq;
}

/* Sends the n frames as one message, never waiting. A refusal (EAGAIN) can
 * only come at the first frame: ZeroMQ checks the queues once a message. */
static int send_frames(void *s, const frame_t *f, int n) {
  for (int i = 0; i < n; i++)
    if (zmq_send(s, f[i].p, f[i].len, ZMQ_DONTWAIT | (i + 1 < n ? ZMQ_SNDMORE : 0)) < 0)
      return -1;
  return 0;
}

/* ---- the publishing socket ---------------------------------------------------- */

/* Subscriptions arrive on the XPUB as messages: 1 + topic subscribes, 0 +
 * topic unsubscribes (XPUB_VERBOSER passes every one, a subscriber's
 * departure included), so their balance is the subscriptions now. A
 * subscription to a prefix of events_topic (the messages it will get) is a
 * join, counted for zpub_take_joins. */
static void pub_drain(zpub_t *z) {
  for (;;) {
    int ev = 0;
    size_t len = sizeof ev;
    if (zmq_getsockopt(z->pub, ZMQ_EVENTS, &ev, &len) != 0 || !(ev & ZMQ_POLLIN)) return;
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, z->pub, ZMQ_DONTWAIT) >= 0 && zmq_msg_size(&m) >= 1) {
      const uint8_t *d = zmq_msg_data(&m);
      uint64_t *subs = &z->srv->stats.events_subscriptions;
      const char *topic = z->srv->cfg.events_topic;
      size_t tlen = zmq_msg_size(&m) - 1;
      if (d[0] == 1) {
        (*subs)++;
        if (tlen <= strlen(topic) && memcmp(d + 1, topic, tlen) == 0) z->joins++;
      } else if (d[0] == 0 && *subs) {
        (*subs)--;
      }
    }
    zmq_msg_close(&m);
  }
}

static void keep(zpub_t *z, uint64_t seq, const void *payload, size_t len) {
  if (!z->router || !z->cap || len > REPLAY_BYTES_MAX) return; /* nobody could ask for it */
  while (z->n && (z->n == z->cap || z->ring_bytes + len > REPLAY_BYTES_MAX)) {
    kept_t *old = &z->ring[z->head];
    z->ring_bytes -= old->len;
    free(old->buf);
    z->head = (z->head + 1) % z->cap;
    z->n--;
  }
  uint8_t *copy = malloc(len ? len : 1);
  if (!copy) return; /* not kept: a replay from here returns less, and says where it ends */
  memcpy(copy, payload, len);
  z->ring[(z->head + z->n) % z->cap] = (kept_t){seq, len, copy};
  z->n++;
  z->ring_bytes += len;
}

int zpub_publish(zpub_t *z, const void *payload, size_t len) {
  server_t *srv = z->srv;
  uint64_t seq = z->next_seq++;
  uint8_t sb[8];
  seq_bytes(seq, sb);
  const frame_t msg[3] = {{srv->cfg.events_topic, strlen(srv->cfg.events_topic)},
                          {sb, 8}, {payload, len}};
  int rc = send_frames(z->pub, msg, 3);
  if (rc != 0 && zmq_errno() == EAGAIN) {
    /* A subscriber's queue is full (events_hwm). This one message goes to
     * the others, lossy for that one: it sees the gap and may replay. */
    int lossy = 0, nodrop = 1;
    zmq_setsockopt(z->pub, ZMQ_XPUB_NODROP, &lossy, sizeof lossy);
    rc = send_frames(z->pub, msg, 3);
    zmq_setsockopt(z->pub, ZMQ_XPUB_NODROP, &nodrop, sizeof nodrop);
    srv->stats.events_slow_drops++;
  }
  if (rc != 0)
    LOG_LIMITED(&z->limit, uv_now(srv->loop), LOG_LEVEL_WARN, "events_send",
                "seq=%llu error=\"%s\"", (unsigned long long)seq, zmq_strerror(zmq_errno()));
  keep(z, seq, payload, len);
  pub_drain(z); /* a send may have taken the edge of ZMQ_FD */
  return rc;
}

uint32_t zpub_take_joins(zpub_t *z) {
  pub_drain(z);
  uint32_t n = z->joins;
  z->joins = 0;
  return n;
}

/* ---- the replay socket --------------------------------------------------------- */

/* One request, [identity, "", start_seq] (anything else is ignored, as vLLM
 * does): the kept batches from start_seq on, then the end marker. */
static void replay_one(zpub_t *z, zmq_msg_t *f, int nf) {
  server_t *srv = z->srv;
  if (nf != 3 || zmq_msg_size(&f[1]) != 0 || zmq_msg_size(&f[2]) > 8) {
    LOG_LIMITED(&z->limit, uv_now(srv->loop), LOG_LEVEL_WARN, "events_replay",
                "error=\"a request is [identity, empty, 8-byte sequence number]\" frames=%d", nf);
    return;
  }
  uint64_t start = 0;
  const uint8_t *d = zmq_msg_data(&f[2]);
  for (size_t i = 0; i < zmq_msg_size(&f[2]); i++) start = start << 8 | d[i];
  frame_t out[4] = {{zmq_msg_data(&f[0]), zmq_msg_size(&f[0])}, {"", 0}};
  srv->stats.events_replays++;
  for (uint32_t i = 0; i < z->n; i++) {
    const kept_t *k = &z->ring[(z->head + i) % z->cap];
    if (k->seq < start) continue;
    uint8_t sb[8];
    seq_bytes(k->seq, sb);
    out[2] = (frame_t){sb, 8};
    out[3] = (frame_t){k->buf, k->len};
    /* The replay socket's queue holds a whole replay (events_zmq_open sets
     * its high-water mark): a refusal means the peer asks faster than it
     * reads; it gets no end marker and asks again. */
    if (send_frames(z->router, out, 4) != 0) return;
    srv->stats.events_replayed_batches++;
  }
  static const uint8_t end[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
  out[2] = (frame_t){end, 8};
  out[3] = (frame_t){"", 0};
  (void)send_frames(z->router, out, 4);
}

static void router_drain(zpub_t *z) {
  for (;;) {
    int ev = 0;
    size_t len = sizeof ev;
    if (zmq_getsockopt(z->router, ZMQ_EVENTS, &ev, &len) != 0 || !(ev & ZMQ_POLLIN)) return;
    zmq_msg_t f[REQUEST_FRAMES_MAX];
    int nf = 0, more = 1;
    while (more) { /* a message is whole once its first frame is readable */
      zmq_msg_t m;
      zmq_msg_init(&m);
      if (zmq_msg_recv(&m, z->router, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&m);
        break;
      }
      more = zmq_msg_more(&m);
      if (nf < REQUEST_FRAMES_MAX) f[nf] = m;
      else zmq_msg_close(&m);
      nf++;
    }
    replay_one(z, f, nf);
    for (int i = 0; i < nf && i < REQUEST_FRAMES_MAX; i++) zmq_msg_close(&f[i]);
  }
}

/* ---- the loop's side: ZMQ_FD is edge-triggered ------------------------------------- */

static void on_pub(uv_poll_t *h, int status, int events) {
  (void)status, (void)events;
  pub_drain(h->data);
}

static void on_router(uv_poll_t *h, int status, int events) {
  (void)status, (void)events;
  router_drain(h->data);
}

static int poll_socket(zpub_t *z, void *sock, uv_poll_t *h, uv_poll_cb cb, char *err,
                       size_t errlen) {
  int fd;
  size_t len = sizeof fd;
  if (zmq_getsockopt(sock, ZMQ_FD, &fd, &len) != 0) {
    snprintf(err, errlen, "events: ZMQ_FD: %s", zmq_strerror(zmq_errno()));
    return -1;
  }
  int rc = uv_poll_init(z->srv->loop, h, fd);
  if (rc == 0) {
    z->open_polls++;
    h->data = z;
    rc = uv_poll_start(h, UV_READABLE, cb);
  }
  if (rc != 0) {
    snprintf(err, errlen, "events: polling the ZeroMQ socket: %s", uv_strerror(rc));
    return -1;
  }
  return 0;
}

/* Binds with the socket file (ipc://) no wider than the daemon's own
 * socket: the stream carries prompts. */
static int bind_endpoint(void *sock, const char *endpoint, uint32_t mode, char *err,
                         size_t errlen) {
  mode_t old = umask((mode_t)(~mode & 0777));
  int rc = zmq_bind(sock, endpoint);
  int e = zmq_errno();
  umask(old);
  if (rc != 0) snprintf(err, errlen, "events: cannot bind %s: %s", endpoint, zmq_strerror(e));
  return rc;
}

static void free_zpub(zpub_t *z) {
  for (uint32_t i = 0; i < z->n; i++) free(z->ring[(z->head + i) % z->cap].buf);
  free(z->ring);
  free(z);
}

static void on_poll_closed(uv_handle_t *h) {
  zpub_t *z = h->data;
  if (--z->open_polls == 0) free_zpub(z);
}

void zpub_close(zpub_t *z) {
  if (!z) return;
  /* uv_close stops watching the descriptors at once; ZeroMQ's sockets
   * (which own them) may close right after. */
  if (z->pub_poll.data) uv_close((uv_handle_t *)&z->pub_poll, on_poll_closed);
  if (z->router_poll.data) uv_close((uv_handle_t *)&z->router_poll, on_poll_closed);
  if (z->pub) zmq_close(z->pub);
  if (z->router) zmq_close(z->router);
  if (z->ctx) zmq_ctx_term(z->ctx); /* lingers 0: returns at once */
  if (z->open_polls == 0) free_zpub(z);
}

static int setopt(void *s, int opt, int v, char *err, size_t errlen) {
  if (zmq_setsockopt(s, opt, &v, sizeof v) == 0) return 0;
  snprintf(err, errlen, "events: socket option %d: %s", opt, zmq_strerror(zmq_errno()));
  return -1;
}

int zpub_open(server_t *srv, zpub_t **out, char *err, size_t errlen) {
  const config_t *cfg = &srv->cfg;
  zpub_t *z = calloc(1, sizeof *z);
  if (!z) {
    snprintf(err, errlen, "events: out of memory");
    return -1;
  }
  z->srv = srv;
  z->cap = cfg->events_buffer;
  if (z->cap && !(z->ring = calloc(z->cap, sizeof *z->ring))) {
    snprintf(err, errlen, "events: out of memory for %u replay slots", z->cap);
    goto fail;
  }
  if (!(z->ctx = zmq_ctx_new()) || !(z->pub = zmq_socket(z->ctx, ZMQ_XPUB))) {
    snprintf(err, errlen, "events: ZeroMQ: %s", zmq_strerror(zmq_errno()));
    goto fail;
  }
  /* XPUB: a PUB that reports subscriptions (counted) and, with NODROP,
   * refuses a message a full subscriber queue would lose (then sent lossy
   * and counted): the slow subscriber is known, the others go on. */
  if (setopt(z->pub, ZMQ_LINGER, 0, err, errlen) ||
      setopt(z->pub, ZMQ_SNDHWM, (int)cfg->events_hwm, err, errlen) ||
      setopt(z->pub, ZMQ_XPUB_VERBOSER, 1, err, errlen) ||
      setopt(z->pub, ZMQ_XPUB_NODROP, 1, err, errlen) ||
      bind_endpoint(z->pub, cfg->events_endpoint, cfg->socket_mode, err, errlen) ||
      poll_socket(z, z->pub, &z->pub_poll, on_pub, err, errlen))
    goto fail;
  if (cfg->events_replay_endpoint[0]) {
    if (!(z->router = zmq_socket(z->ctx, ZMQ_ROUTER))) {
      snprintf(err, errlen, "events: ZeroMQ: %s", zmq_strerror(zmq_errno()));
      goto fail;
    }
    /* Room for a whole replay of the kept batches and its end marker. */
    int hwm = z->cap < 1000000 ? (int)z->cap + 2 : 1000002;
    if (setopt(z->router, ZMQ_LINGER, 0, err, errlen) ||
        setopt(z->router, ZMQ_SNDHWM, hwm, err, errlen) ||
        bind_endpoint(z->router, cfg->events_replay_endpoint, cfg->socket_mode, err, errlen) ||
        poll_socket(z, z->router, &z->router_poll, on_router, err, errlen))
      goto fail;
  }
  pub_drain(z);
  if (z->router) router_drain(z);
  *out = z;
  return 0;
fail:
  zpub_close(z);
  return -1;
}
