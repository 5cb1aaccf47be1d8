/* conn.c: a client connection's I/O: accept, peer check, reading frames,
 * queueing replies, backpressure and closing. */
#include "conn.h"
#include "poolown.h"

#include <errno.h>
#include <linux/sockios.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "frame.h"
#include "log.h"
#include "quotas.h"
#include "ring.h"
#include "tier.h"

typedef struct wreq {
  uv_write_t req;
  conn_t *c;
  size_t len;
  size_t cap;                 /* a tail: bytes data holds */
  _Alignas(8) uint8_t data[]; /* the frame, or a tail's frames */
} wreq_t;

/* While writes are queued (the socket is full: the client is slow, or does
 * not read), small replies gather in one tail buffer of this size, written
 * when the queue drains or the tail fills: a client that never reads makes
 * the daemon hold a write request per 64 KiB, not one per reply, and its
 * close cancels a few of them, not tens of thousands. */
#define TAIL_CAP (64 * 1024)

static void schedule(conn_t *c);
static void set_backlog(conn_t *c, bool on);
static void on_idle(uv_idle_t *h);
static void bg_leave(conn_t *c);

static void free_conn(conn_t *c) {
  server_t *srv = c->srv;
  poolown_conn_free(c);
  free(c->tail); /* never written: the connection closed first */
  free(c->owned);
  shm_close(&c->shm);
  free(c->rbuf);
  if (c->prev) c->prev->next = c->next;
  else srv->conns = c->next;
  if (c->next) c->next->prev = c->prev;
  if (c->counted) srv->stats.connections_current--;
  if (c->parked) srv->nparked--;
  srv->nconns--;
  free(c);
  if (srv->up.gone) srv->up.gone(srv);
}

static void on_handle_closed(uv_handle_t *h) {
  conn_t *c = h->data;
  if (--c->open_handles > 0) return;
  if (!c->offloaded) free_conn(c); /* else a pool thread still uses its buffer:
                                      conn_offload_end frees it */
}

static void on_shutdown(uv_shutdown_t *req, int status);
static int write_tail(conn_t *c);
static size_t drop_owned(conn_t *c);

/* The one place c->state changes: each case is what entering it does. */
static void conn_enter(conn_t *c, enum conn_state to, const char *reason) {
  server_t *srv = c->srv;
  c->state = to;
  switch (to) {
  case CONN_NEW:
    break;
  case CONN_READY:
    c->greeted = true;
    break;
  case CONN_FLUSHING:
    LOG_DEBUG("closing", "conn=%llu reason=\"%s\"", (unsigned long long)c->id, reason);
    if (c->reading) uv_read_stop((uv_stream_t *)&c->pipe);
    c->reading = false;
    set_backlog(c, false);
    bg_leave(c);
    uv_timer_stop(&c->deadline);
    if (c->tail && write_tail(c) != 0) break; /* the gathered replies go before the FIN */
    c->shutdown_req.data = c;
    if (uv_shutdown(&c->shutdown_req, (uv_stream_t *)&c->pipe, on_shutdown) != 0)
      conn_enter(c, CONN_CLOSED, reason);
    break;
  case CONN_CLOSED:
    tiers_end(srv, &c->tw); /* its lookups in flight are let go */
    if (c->greeted) {
      size_t n = engine_unpin_all(srv->eng, c->id);
      size_t nl = engine_lease_release_all(srv->eng, c->id);
      size_t no = drop_owned(c);
      uint64_t lived = uv_now(srv->loop) - c->accepted_ms;
      bool brief = lived < CONN_BRIEF_MS && n == 0 && nl == 0 && no == 0;
      if (brief) srv->stats.connections_brief++;
      LOG_AT_(brief ? LOG_LEVEL_DEBUG : LOG_LEVEL_INFO, "disconnect",
             "conn=%llu pid=%d uid=%u client=\"%s\" reason=\"%s\" pins_released=%zu "
             "leases_released=%zu owned_dropped=%zu requests=%llu lived_ms=%llu",
             (unsigned long long)c->id, (int)c->pid, (unsigned)c->uid, c->name, reason, n, nl, no,
             (unsigned long long)c->requests, (unsigned long long)lived);
    } else {
      LOG_DEBUG("disconnect", "conn=%llu pid=%d reason=\"%s\"", (unsigned long long)c->id,
                (int)c->pid, reason);
    }
    if (c->sub && srv->up.closing) srv->up.closing(c);
    ring_close(c->ring); /* the client hears it at once, not at its next call */
    c->ring = NULL;
    if (c->shm.base) srv->stats.shm_bytes -= c->shm.bytes;
    /* Unmap now: the pins are gone and nothing may use the buffer again,
     * unless a pool thread still copies into it (then when it is done). */
    if (!c->offloaded) shm_close(&c->shm);
    set_backlog(c, false);
    bg_leave(c);
    uv_close((uv_handle_t *)&c->pipe, on_handle_closed);
    uv_close((uv_handle_t *)&c->idle, on_handle_closed);
    uv_close((uv_handle_t *)&c->deadline, on_handle_closed);
    break;
  }
}

/* Whether requests may no longer run: flushing, closed, or a flush waits
 * for the offloaded get. */
static bool stopping(const conn_t *c) {
  return c->state >= CONN_FLUSHING || c->after_offload == AFTER_OFFLOAD_FLUSH;
}

void conn_greeted(conn_t *c) { conn_enter(c, CONN_READY, NULL); }

void conn_offload_begin(conn_t *c) { c->offloaded = true; }

int conn_own_reserve(conn_t *c, uint32_t n) {
  if (c->nowned + n <= c->owned_cap) return 0;
  uint32_t cap = c->owned_cap ? c->owned_cap : 16;
  while (cap < c->nowned + n) cap *= 2;
  struct owned *o = realloc(c->owned, cap * sizeof *o);
  if (!o) return -1;
  c->owned = o;
  c->owned_cap = cap;
  return 0;
}

void conn_own(conn_t *c, uint32_t cache_id, uint64_t seq_id) {
  c->owned[c->nowned++] = (struct owned){cache_id, seq_id};
}

/* Drops what c owns: a sequence already gone (removed, evicted, its cache
 * dropped) is skipped; one still busy with another connection's put stays,
 * persistent, and is logged. */
static size_t drop_owned(conn_t *c) {
  size_t n = 0;
  for (uint32_t i = 0; i < c->nowned; i++) {
    int rc = engine_remove(c->srv->eng, c->owned[i].cache_id, c->owned[i].seq_id, 0, UINT64_MAX);
    if (rc == 0) n++;
    else if (rc == KVC_E_BUSY)
      LOG_WARN("owned_kept", "conn=%llu seq=%llu reason=\"busy with a put of another "
               "connection\"", (unsigned long long)c->id,
               (unsigned long long)c->owned[i].seq_id);
  }
  free(c->owned);
  c->owned = NULL;
  c->nowned = c->owned_cap = 0;
  return n;
}

void conn_park(conn_t *c) {
  c->parked = true;
  c->srv->nparked++;
  if (!c->tw.pending) c->srv->stats.parked_requests++; /* a busy sequence, not a tier */
}

static void unpark(conn_t *c) {
  if (!c->parked) return;
  c->parked = false;
  c->srv->nparked--;
  schedule(c);
}

void conn_unpark_all(server_t *srv) {
  for (conn_t *c = srv->conns; c && srv->nparked; c = c->next)
    if (c->parked && !c->tw.pending) unpark(c);
}

void conn_tier_done(server_t *srv, uint64_t conn_id, unsigned idx) {
  conn_t *c = srv->conns;
  while (c && c->id != conn_id) c = c->next;
  if (!c || !(c->tw.pending & (1u << idx))) return; /* gone, or not waiting on it */
  c->tw.pending &= ~(1u << idx);
  if (!c->tw.pending) unpark(c);
}

bool conn_offload_end(conn_t *c) {
  c->offloaded = false;
  if (c->state != CONN_CLOSED) return true;
  if (c->open_handles == 0) free_conn(c); /* closed meanwhile, handles gone */
  else shm_close(&c->shm);                /* kept mapped for the copy */
  return false;
}

void conn_resume(conn_t *c) {
  enum conn_after_offload after = c->after_offload;
  c->after_offload = AFTER_OFFLOAD_RESUME;
  switch (after) {
  case AFTER_OFFLOAD_DRAIN:
    conn_drain(c);
    return;
  case AFTER_OFFLOAD_FLUSH: {
    char why[sizeof c->flush_reason];
    snprintf(why, sizeof why, "%s", c->flush_reason);
    c->flush_reason[0] = '\0';
    conn_run_all(c); /* what the client sent before closing is answered */
    if (c->state != CONN_CLOSED) conn_close_after_flush(c, why);
    return;
  }
  case AFTER_OFFLOAD_RESUME:
    schedule(c);
    return;
  }
}

void conn_copied(conn_t *c, uint64_t request_id) {
  if (!conn_offload_end(c)) return; /* closed meanwhile: freed */
  Kvcache__V1__Response resp = KVCACHE__V1__RESPONSE__INIT;
  resp.id = request_id;
  resp.status = KVCACHE__V1__STATUS__OK;
  resp.error = (char *)"";
  if (conn_send(c, &resp) != 0) return; /* conn_send closed it */
  conn_resume(c);
}

size_t conn_idle_sweep(server_t *srv) {
  uint32_t timeout = srv->cfg.idle_timeout_ms;
  if (!timeout) return 0;
  uint64_t now = uv_now(srv->loop);
  size_t n = 0;
  for (conn_t *c = srv->conns, *next; c; c = next) {
    next = c->next; /* a closed connection stays listed until its handles close */
    /* A subscriber is silent by design: it reads the stream. */
    if (!c->counted || c->offloaded || c->sub || (c->state != CONN_NEW && c->state != CONN_READY) ||
        now - c->last_ms < timeout)
      continue;
    srv->stats.connections_idle_closed++;
    conn_close_after_flush(c, "idle timeout (idle_timeout_ms)");
    n++;
  }
  return n;
}

void conn_close(conn_t *c, const char *reason) {
  if (c->state != CONN_CLOSED) conn_enter(c, CONN_CLOSED, reason);
}

static void on_shutdown(uv_shutdown_t *req, int status) {
  (void)status;
  conn_close(req->data, "flushed");
}

void conn_close_after_flush(conn_t *c, const char *reason) {
  if (stopping(c)) return;
  if (c->offloaded) { /* answer the offloaded request first: conn_resume */
    if (c->after_offload == AFTER_OFFLOAD_RESUME) {
      snprintf(c->flush_reason, sizeof c->flush_reason, "%s",
               reason && *reason ? reason : "closing");
      c->after_offload = AFTER_OFFLOAD_FLUSH;
    } /* a drain waiting closes it anyway */
    return;
  }
  conn_enter(c, CONN_FLUSHING, reason);
}

static int write_frame(conn_t *c, wreq_t *w);

/* Writes the tail (counted in wq_bytes since its frames were added). */
static int write_tail(conn_t *c) {
  wreq_t *w = c->tail;
  c->tail = NULL;
  c->wq_bytes -= sizeof *w + w->len; /* write_frame counts it again */
  return write_frame(c, w);
}

static void on_write(uv_write_t *req, int status) {
  wreq_t *w = (wreq_t *)req;
  conn_t *c = w->c;
  c->wq_bytes -= sizeof *w + w->len;
  c->nwrites--;
  free(w);
  if (status < 0) {
    if (status != UV_ECANCELED) conn_close(c, uv_strerror(status));
    return;
  }
  if (c->nwrites == 0 && c->tail && write_tail(c) != 0) return;
  schedule(c);
}

static int write_frame(conn_t *c, wreq_t *w) {
  uv_buf_t buf = uv_buf_init((char *)w->data, (unsigned)w->len);
  w->c = c;
  c->wq_bytes += sizeof *w + w->len; /* what it holds: a tiny reply's request
                                        is ten times its frame */
  c->srv->stats.socket_bytes_out += w->len;
  int rc = uv_write(&w->req, (uv_stream_t *)&c->pipe, &buf, 1, on_write);
  if (rc != 0) {
    c->wq_bytes -= sizeof *w + w->len;
    free(w);
    conn_close(c, uv_strerror(rc));
    return KVC_E_IO;
  }
  c->nwrites++;
  return 0;
}

/* Adds a packed small frame to the tail (while writes are queued). */
static int tail_add(conn_t *c, const uint8_t *frame, size_t len) {
  if (c->tail && c->tail->len + len > c->tail->cap && write_tail(c) != 0) return KVC_E_IO;
  if (!c->tail) {
    wreq_t *w = malloc(sizeof *w + TAIL_CAP);
    if (!w) {
      conn_close(c, "out of memory queueing a reply");
      return KVC_E_NOMEM;
    }
    w->len = 0;
    w->cap = TAIL_CAP;
    c->tail = w;
    c->wq_bytes += sizeof *w;
  }
  memcpy(c->tail->data + c->tail->len, frame, len);
  c->tail->len += len;
  c->wq_bytes += len;
  return 0;
}

/* resp packed into a new frame; n is its packed size (the caller's: a walk
 * of a large reply's every field costs as much as packing it). */
static wreq_t *pack(const Kvcache__V1__Response *resp, size_t n) {
  if (n > UINT32_MAX) return NULL;
  wreq_t *w = malloc(sizeof *w + FRAME_HEADER_BYTES + n);
  if (!w) return NULL;
  frame_put_header(w->data, (uint32_t)n);
  kvcache__v1__response__pack(resp, w->data + FRAME_HEADER_BYTES);
  w->len = FRAME_HEADER_BYTES + n;
  return w;
}

/* Queues the unwritten tail [sent, len) of a packed frame. */
static int write_rest(conn_t *c, const uint8_t *frame, size_t len, size_t sent) {
  size_t rest = len - sent;
  wreq_t *w = malloc(sizeof *w + rest);
  if (!w) {
    conn_close(c, "out of memory queueing a reply");
    return KVC_E_NOMEM;
  }
  memcpy(w->data, frame + sent, rest);
  w->len = rest;
  c->srv->stats.socket_bytes_out -= rest; /* counted again by write_frame */
  return write_frame(c, w);
}

/* Small replies (nearly all) are packed on the stack and written at once
 * with uv_try_write when nothing is queued: no allocation, no write request,
 * and none of the epoll_ctl that libuv 1.44 issues after every uv_write.
 * What the socket does not take goes through the write queue. */
#define SMALL_REPLY 1024

int conn_send_fast(conn_t *c, const ringfast_rep_t *p) {
  if (c->state == CONN_CLOSED) return KVC_E_IO;
  if (c->via != VIA_FAST || !c->ring) {
    conn_close(c, "a fast reply to a request that was not one");
    return KVC_E_INTERNAL;
  }
  c->via = VIA_SOCKET;
  return ring_fast_reply(c->ring, p);
}

/* The fast reply of resp (a put's, get's or lease's: no other body; a
 * copy's that ended on a copy thread, conn_copied). */
static int send_fast(conn_t *c, const Kvcache__V1__Response *resp) {
  ringfast_rep_t p;
  memset(&p, 0, offsetof(ringfast_rep_t, err));
  p.status = (uint32_t)resp->status;
  if (resp->status != KVCACHE__V1__STATUS__OK) {
    ringfast_rep_error(&p, resp->error, resp->full_needed, resp->full_freeable);
  } else if (resp->body_case == KVCACHE__V1__RESPONSE__BODY_LEASE && resp->lease) {
    const Kvcache__V1__LeaseReply *lr = resp->lease;
    if (lr->n_page_offsets > RINGFAST_LEASE_PAGES) goto broken; /* h_lease bounds it */
    p.npages = (uint32_t)lr->n_page_offsets;
    p.lease_id = lr->lease_id;
    p.first_pos = lr->first_pos;
    p.pool_gen = lr->pool_gen;
    memcpy(p.page_off, lr->page_offsets, p.npages * sizeof p.page_off[0]);
  } else if (resp->body_case != KVCACHE__V1__RESPONSE__BODY__NOT_SET) {
    goto broken;
  }
  return ring_fast_reply(c->ring, &p);
broken:
  conn_close(c, "a reply the fast slot cannot hold");
  return KVC_E_INTERNAL;
}

int conn_send(conn_t *c, const Kvcache__V1__Response *resp) {
  if (c->state == CONN_CLOSED) return KVC_E_IO;
  if (c->via == VIA_FAST && c->ring) {
    c->via = VIA_SOCKET;
    return send_fast(c, resp);
  }
  if (c->via == VIA_RING && c->ring) {
    c->via = VIA_SOCKET;
    int rc = ring_reply(c->ring, resp);
    if (rc == 0) return 0;
    if (rc < 0) {
      c->srv->stats.connections_dropped++;
      conn_close(c, "the client broke its completion ring");
      return KVC_E_IO;
    }
    /* Too large for the ring: its marker holds the place, the frame follows
     * on the socket. */
  }
  c->sent = true; /* behind() asks the socket whether its client read it */
  size_t n = kvcache__v1__response__get_packed_size(resp);
  if (n + FRAME_HEADER_BYTES <= SMALL_REPLY && c->nwrites) { /* the socket is full */
    _Alignas(8) uint8_t frame[SMALL_REPLY];
    frame_put_header(frame, (uint32_t)n);
    kvcache__v1__response__pack(resp, frame + FRAME_HEADER_BYTES);
    return tail_add(c, frame, FRAME_HEADER_BYTES + n);
  }
  if (c->tail && write_tail(c) != 0) return KVC_E_IO; /* a large reply keeps the order */
  if (n + FRAME_HEADER_BYTES <= SMALL_REPLY && c->wq_bytes == 0) {
    _Alignas(8) uint8_t frame[SMALL_REPLY];
    frame_put_header(frame, (uint32_t)n);
    kvcache__v1__response__pack(resp, frame + FRAME_HEADER_BYTES);
    size_t len = FRAME_HEADER_BYTES + n;
    uv_buf_t buf = uv_buf_init((char *)frame, (unsigned)len);
    int sent = uv_try_write((uv_stream_t *)&c->pipe, &buf, 1);
    if (sent == UV_EAGAIN) sent = 0;
    if (sent < 0) {
      conn_close(c, uv_strerror(sent));
      return KVC_E_IO;
    }
    c->srv->stats.socket_bytes_out += len;
    if ((size_t)sent == len) return 0;
    return write_rest(c, frame, len, (size_t)sent);
  }
  wreq_t *w = pack(resp, n);
  if (!w) {
    conn_close(c, "out of memory packing a reply");
    return KVC_E_NOMEM;
  }
  return write_frame(c, w);
}

int conn_send_fds(conn_t *c, const Kvcache__V1__Response *resp, const int *fds, int nfds) {
  /* Descriptors travel on the socket only: a request that came through the
   * ring gets its marker there. */
  if (c->via == VIA_FAST) { /* never: put, get and lease pass none */
    conn_close(c, "descriptors for a fast request");
    return KVC_E_INTERNAL;
  }
  if (c->via == VIA_RING && c->ring) {
    c->via = VIA_SOCKET;
    if (ring_reply(c->ring, NULL) < 0) {
      conn_close(c, "the client broke its completion ring");
      return KVC_E_IO;
    }
  }
  c->sent = true;
  uv_os_fd_t sock;
  if (c->state == CONN_CLOSED || uv_stream_get_write_queue_size((uv_stream_t *)&c->pipe) != 0 ||
      uv_fileno((uv_handle_t *)&c->pipe, &sock) != 0)
    return KVC_E_INTERNAL;
  wreq_t *w = pack(resp, kvcache__v1__response__get_packed_size(resp));
  if (!w) return KVC_E_NOMEM;
  union {
    struct cmsghdr h;
    char buf[CMSG_SPACE(POOLMAP_FDS_MAX * sizeof(int))];
  } ctl;
  if (nfds < 1 || nfds > (int)POOLMAP_FDS_MAX) {
    free(w);
    return KVC_E_INTERNAL;
  }
  memset(&ctl, 0, sizeof ctl);
  struct iovec iov = {.iov_base = w->data, .iov_len = w->len};
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf,
                       .msg_controllen = CMSG_SPACE((size_t)nfds * sizeof(int))};
  struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
  cm->cmsg_level = SOL_SOCKET;
  cm->cmsg_type = SCM_RIGHTS;
  cm->cmsg_len = CMSG_LEN((size_t)nfds * sizeof(int));
  memcpy(CMSG_DATA(cm), fds, (size_t)nfds * sizeof(int));
  ssize_t sent;
  while ((sent = sendmsg(sock, &msg, MSG_NOSIGNAL)) < 0 && errno == EINTR) {
  }
  if (sent <= 0) {
    /* The send buffer of a fresh connection is empty, so EAGAIN cannot
     * happen here; anything else means the peer is gone. */
    free(w);
    return KVC_E_IO;
  }
  c->srv->stats.socket_bytes_out += (uint64_t)sent;
  if ((size_t)sent == w->len) {
    free(w);
    return 0;
  }
  /* The fd went with the first byte; the rest follows through libuv. */
  size_t rest = w->len - (size_t)sent;
  memmove(w->data, w->data + sent, rest);
  w->len = rest;
  c->srv->stats.socket_bytes_out -= rest; /* counted again by write_frame */
  return write_frame(c, w);
}

/* Moves what is left of the read buffer down once no whole frame is left
 * in it (what follows is read after it): a client that pipelines a buffer
 * of small requests costs one move per read, not one per turn. */
static void rbuf_settle(conn_t *c) {
  uint32_t plen;
  if (c->roff == c->rlen) {
    c->roff = c->rlen = 0;
  } else if (c->roff &&
             frame_parse(c->rbuf + c->roff, c->rlen - c->roff, c->max_frame, &plen) ==
                 FRAME_NEED_MORE) {
    memmove(c->rbuf, c->rbuf + c->roff, c->rlen - c->roff);
    c->rlen -= c->roff;
    c->roff = 0;
  }
}

/* c's share of a turn: one frame while its replies wait in the write queue
 * (its client is not reading them); and with k connections waiting for a
 * turn (pipelining clients), 1/k of frames_per_turn and of turn_us (at
 * least one frame), so a client that sends a request at a time waits about
 * one turn's budget behind them, not k of them. Alone, one runs them whole. */
static void turn_share(const conn_t *c, unsigned *limit, uint64_t *us) {
  if (c->nwrites) *limit = 1;
  uint32_t share = c->srv->backlogged + !c->backlog;
  if (share > 1) {
    *limit = *limit / share ? *limit / share : 1;
    *us = *us / share ? *us / share : 1;
  }
}

/* Whether c has spent its turn's bytes or time (t0_ns: when it began; us:
 * its share of turn_us). */
static bool turn_spent(const conn_t *c, uint64_t t0_ns, uint64_t us) {
  if (c->turn_bytes >= c->srv->cfg.turn_bytes) return true;
  return us && uv_hrtime() - t0_ns >= us * 1000u;
}

/* Replies a connection may leave unsent before its requests wait: a
 * sixteenth of write_queue_bytes (256 KiB of the default 4 MiB). Past it
 * the connection's client is not reading, and each request run for it is
 * work no one uses, done in the other clients' time: 16 connections
 * pipelining Stats (18 KB replies) never read took another client's p99
 * 6.5x (issue 34). It still reads, into its read buffer (two frames), so a
 * client that writes a pipeline before it reads its replies goes on
 * writing; at write_queue_bytes it stops reading too. */
static bool held(const conn_t *c) {
  return c->wq_bytes > c->srv->cfg.write_queue_bytes / 16;
}

/* ---- clients behind on their replies: the background ------------------------ */

/* A client that has not read what the daemon sent it (replies in its
 * socket, or queued for it) gets nothing from more replies now; each of its
 * requests run meanwhile is time the clients that do read theirs wait for
 * (one request runs whole: a 40 us Stats is a 40 us wait for a 4 us get).
 * So while a client that reads its replies made a request within
 * background_quiet_us (10 ms: a scheduler's slice or two; 0: never), the
 * requests of one behind wait in the background: it runs
 * one of their frames every BG_SHARE_NS (round robin, so none starves),
 * and all of them again, as any, once the readers are quiet. A libkvcache
 * client reads each reply before it sends its next request: never behind.
 * A background connection reads on into its read buffer (two frames), as
 * a held one does; one whose client is gone (POLLHUP) is closed at the next
 * tick, not when a reply to it would fail. */
#define BG_SHARE_NS 10000000u /* 10 ms */
#define BG_TICK_MS 1
#define BG_SWEEP_TICKS 10     /* a gone client is looked for every 10 ms */

/* Whether c's client has not read all that was sent to it: replies queued
 * in the daemon, or bytes still in its socket (SIOCOUTQ, asked only after
 * a write: a client that reads its replies empties it before it asks
 * again). */
static bool behind(conn_t *c) {
  if (c->nwrites || c->tail) return true;
  if (!c->sent) return false;
  uv_os_fd_t fd;
  int unread = 0;
  if (uv_fileno((uv_handle_t *)&c->pipe, &fd) != 0 || ioctl(fd, SIOCOUTQ, &unread) != 0)
    return false;
  if (unread > 0) return true;
  c->sent = false;
  return false;
}

/* A request of connection id, whose client reads its replies, runs now. */
static void fg_seen(server_t *srv, uint64_t id, uint64_t now) {
  if (id != srv->fg_id) {
    srv->fg2_ns = srv->fg_ns;
    srv->fg_id = id;
  }
  srv->fg_ns = now;
}

/* Whether c's next socket frame waits in the background (else it runs):
 * behind, beside a reader that is not c itself (a client that pipelines
 * alone is nobody's wait). */
static bool to_background(conn_t *c) {
  server_t *srv = c->srv;
  uint64_t quiet_ns = (uint64_t)srv->cfg.background_quiet_us * 1000u;
  if (!quiet_ns) return false;
  uint64_t now = uv_hrtime();
  if (!behind(c)) {
    fg_seen(srv, c->id, now);
    return false;
  }
  if (c->bg_pass) {
    c->bg_pass = false;
    return false;
  }
  uint64_t other = c->id == srv->fg_id ? srv->fg2_ns : srv->fg_ns;
  return other && now - other < quiet_ns;
}

static void on_bg_tick(uv_timer_t *t);

static void bg_enter(conn_t *c) {
  if (c->bg) return;
  c->bg = true;
  c->srv->stats.background_waits++;
  if (c->srv->nbg++ == 0)
    uv_timer_start(&c->srv->bg_timer, on_bg_tick, BG_TICK_MS, BG_TICK_MS);
}

static void bg_leave(conn_t *c) {
  if (!c->bg) return;
  c->bg = false;
  if (--c->srv->nbg == 0) uv_timer_stop(&c->srv->bg_timer);
}

/* The background connection after the one that ran last, by id (wrapping). */
static conn_t *bg_next(server_t *srv) {
  conn_t *first = NULL, *after = NULL;
  for (conn_t *c = srv->conns; c; c = c->next) {
    if (!c->bg) continue;
    if (!first || c->id < first->id) first = c;
    if (c->id > srv->bg_last && (!after || c->id < after->id)) after = c;
  }
  return after ? after : first;
}

/* Closes the background connections whose client is gone: nothing is read
 * into a full read buffer, so no EOF would tell (one poll(2) of 64 of them).
 * A client that only shut its writing side (POLLRDHUP) still reads its
 * replies: not closed. One that has read them all since leaves the
 * background. */
static void bg_sweep(server_t *srv) {
  struct pollfd pf[64];
  conn_t *who[64];
  for (conn_t *c = srv->conns; c;) {
    nfds_t n = 0;
    for (; c && n < 64; c = c->next) {
      uv_os_fd_t fd;
      if (!c->bg || uv_fileno((uv_handle_t *)&c->pipe, &fd) != 0) continue;
      pf[n] = (struct pollfd){.fd = fd, .events = 0};
      who[n++] = c;
    }
    if (n == 0 || poll(pf, n, 0) < 0) continue;
    for (nfds_t i = 0; i < n; i++) {
      if (pf[i].revents & (POLLHUP | POLLERR)) {
        conn_close(who[i], "the client closed");
      } else if (!behind(who[i])) { /* it read its replies meanwhile */
        bg_leave(who[i]);
        schedule(who[i]);
      }
    }
  }
}

static void on_bg_tick(uv_timer_t *t) {
  server_t *srv = t->data;
  if (++srv->bg_ticks % BG_SWEEP_TICKS == 0) bg_sweep(srv);
  uint64_t now = uv_hrtime();
  if (now - srv->fg_ns >= (uint64_t)srv->cfg.background_quiet_us * 1000u) { /* readers quiet */
    for (conn_t *c = srv->conns; c && srv->nbg; c = c->next) {
      if (!c->bg) continue;
      bg_leave(c);
      schedule(c);
    }
    return;
  }
  if (now - srv->bg_ns < BG_SHARE_NS) return;
  conn_t *c = bg_next(srv);
  if (!c) return;
  srv->bg_ns = now;
  srv->bg_last = c->id;
  c->bg_pass = true;
  bg_leave(c);
  schedule(c);
}

/* Runs complete frames from the read buffer: up to limit of them and, if
 * budgeted, until the turn's bytes or time are spent (at least one runs).
 * A budgeted turn of a connection whose replies already wait in the write
 * queue (the socket is full: its client is not reading them) runs one frame:
 * a client that never reads costs the others one request a turn, not a
 * turn's budget, until write_queue_bytes stops reading from it. */
static void run_frames(conn_t *c, unsigned limit, bool budgeted) {
  server_t *srv = c->srv;
  size_t off = c->roff, start = c->roff;
  unsigned n = 0;
  uint64_t t0 = budgeted ? uv_hrtime() : 0, us = srv->cfg.turn_us;
  if (budgeted) turn_share(c, &limit, &us);
  c->turn_bytes = 0;
  while (c->state < CONN_FLUSHING && !c->offloaded && !c->parked && !(budgeted && held(c))) {
    uint32_t plen = 0;
    int st = frame_parse(c->rbuf + off, c->rlen - off, c->max_frame, &plen);
    if (st == FRAME_TOO_BIG) {
      LOG_LIMITED(&srv->limit_bad_frame, uv_now(srv->loop), LOG_LEVEL_WARN, "bad_frame",
                  "conn=%llu pid=%d frame_bytes=%u max_frame_bytes=%u",
                  (unsigned long long)c->id, (int)c->pid, plen, c->max_frame);
      srv->stats.connections_dropped++;
      conn_close(c, "frame larger than max_frame_bytes");
      return;
    }
    if (st == FRAME_NEED_MORE) break;
    if (n == limit || (budgeted && n > 0 && turn_spent(c, t0, us))) {
      srv->stats.deferred_turns++;
      break;
    }
    if (budgeted && to_background(c)) { /* behind on its replies, beside readers */
      bg_enter(c);
      break;
    }
    if (budgeted) { /* requests through rings go before each of this turn's frames */
      c->roff = off;
      ring_preempt(srv);
      if (c->state >= CONN_FLUSHING || c->offloaded || c->parked) break;
    }
    c->via = VIA_SOCKET;
    if (!srv->up.frame(c, c->rbuf + off + FRAME_HEADER_BYTES, plen)) break; /* parked */
    srv->stats.frames_in++;
    c->turn_bytes += FRAME_HEADER_BYTES + plen;
    off += FRAME_HEADER_BYTES + plen;
    n++;
    if (c->wq_bytes > srv->cfg.write_queue_bytes) break;
  }
  if (c->state == CONN_CLOSED) return;
  if (off > start) {
    c->roff = off;
    /* The next frame's deadline counts from now, not from its predecessor. */
    uv_timer_stop(&c->deadline);
  }
  rbuf_settle(c);
  schedule(c);
}

/* run_frames for the submission ring: the same budgets, the same dispatch;
 * a frame leaves the ring once it ran (a parked one stays for its rerun). */
static bool run_ring(conn_t *c, unsigned limit, bool budgeted, uint64_t t0) {
  server_t *srv = c->srv;
  ring_t *r = c->ring;
  unsigned n = 0;
  uint64_t us = srv->cfg.turn_us;
  if (budgeted) turn_share(c, &limit, &us);
  c->turn_bytes = 0;
  if (budgeted) ring_turn_begin(r);
  bool fast_done = false; /* a turn runs one fast request: the client's next
                             waits for the next turn, as a ring record does */
  while (r && c->state == CONN_READY && !c->offloaded && !c->parked &&
         c->after_offload == AFTER_OFFLOAD_RESUME) {
    uint8_t body[RING_FAST_BODY];
    uint32_t seq;
    if (!fast_done && ring_fast_next(r, body, &seq)) {
      if (n == limit || (budgeted && n > 0 && turn_spent(c, t0, us))) {
        srv->stats.deferred_turns++;
        break;
      }
      c->via = VIA_FAST;
      if (!srv->up.fast(c, body, seq, n == 0 && t0 ? t0 : uv_hrtime()))
        break; /* parked: it stays in the slot */
      ring_fast_consume(r, seq);
      if (c->state == CONN_CLOSED) return true;
      srv->stats.frames_in++;
      c->turn_bytes += FRAME_HEADER_BYTES + RING_FAST_BODY;
      n++;
      fast_done = budgeted;
      if (c->wq_bytes > srv->cfg.write_queue_bytes) break;
      continue;
    }
    const uint8_t *payload;
    uint32_t len;
    int st = ring_next(r, &payload, &len, budgeted);
    if (st < 0) {
      LOG_LIMITED(&srv->limit_bad_frame, uv_now(srv->loop), LOG_LEVEL_WARN, "bad_frame",
                  "conn=%llu pid=%d reason=\"submission ring counters or frame length out of "
                  "bounds\"", (unsigned long long)c->id, (int)c->pid);
      srv->stats.connections_dropped++;
      conn_close(c, "the client broke its submission ring");
      return true;
    }
    if (st == 0) break;
    if (n == limit || (budgeted && n > 0 && turn_spent(c, t0, us))) {
      srv->stats.deferred_turns++;
      break;
    }
    c->via = VIA_RING;
    if (!c->srv->up.frame(c, payload, len)) break; /* parked: it stays in the ring */
    ring_consume(r, len);
    if (c->state == CONN_CLOSED) return true;
    srv->stats.frames_in++;
    c->turn_bytes += FRAME_HEADER_BYTES + len;
    n++;
    if (c->wq_bytes > srv->cfg.write_queue_bytes) break;
  }
  /* A ring's client reads its replies (a full CQ stops it): a reader. */
  if (n) fg_seen(srv, c->id, uv_hrtime());
  return n > 0;
}

bool conn_run_ring(conn_t *c, uint64_t now_ns) {
  bool ran = run_ring(c, c->srv->cfg.frames_per_turn, true, now_ns);
  if (c->state != CONN_CLOSED) schedule(c);
  return ran;
}

void conn_run_all(conn_t *c) {
  run_frames(c, UINT32_MAX, false);
  if (c->state != CONN_CLOSED) run_ring(c, UINT32_MAX, false, 0);
}

void conn_drain(conn_t *c) {
  if (stopping(c)) return;
  if (c->offloaded) { /* after its reply: conn_resume */
    c->after_offload = AFTER_OFFLOAD_DRAIN;
    return;
  }
  server_t *srv = c->srv;
  uv_os_fd_t fd = -1;
  bg_leave(c);
  if (c->reading) uv_read_stop((uv_stream_t *)&c->pipe);
  c->reading = false;
  (void)uv_fileno((uv_handle_t *)&c->pipe, &fd);
  /* Requests the client sent before the signal may still sit in the socket:
   * read them here (the pipe is non-blocking) so they are answered too. */
  for (;;) {
    conn_run_all(c);
    if (c->state >= CONN_FLUSHING) return; /* a bad frame, or a refused Hello */
    if (c->eof || fd < 0 || c->wq_bytes > srv->cfg.write_queue_bytes || c->rlen == c->rcap)
      break;
    ssize_t n = read(fd, c->rbuf + c->rlen, c->rcap - c->rlen);
    if (n > 0) {
      c->rlen += (size_t)n;
      srv->stats.socket_bytes_in += (uint64_t)n;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) c->eof = true;
    break; /* EAGAIN: nothing more was sent; an error: the goodbye will fail */
  }
  Kvcache__V1__Response bye = KVCACHE__V1__RESPONSE__INIT;
  c->via = VIA_SOCKET; /* the goodbye goes on the socket; the ring says closed */
  bye.id = 0;
  bye.status = KVCACHE__V1__STATUS__SHUTDOWN;
  bye.error = (char *)"kvcached is shutting down";
  if (conn_send(c, &bye) == 0) conn_close_after_flush(c, "shutdown");
}

/* Whether c waits for a turn with frames buffered: its idle handle runs
 * them, and srv->backlogged counts it (run_frames shares a turn). */
static void set_backlog(conn_t *c, bool on) {
  if (c->backlog == on) return;
  c->backlog = on;
  if (on) {
    c->srv->backlogged++;
    uv_idle_start(&c->idle, on_idle);
  } else {
    c->srv->backlogged--;
    uv_idle_stop(&c->idle);
  }
}

static void on_idle(uv_idle_t *h) {
  conn_t *c = h->data;
  run_frames(c, c->srv->cfg.frames_per_turn, true);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  (void)suggested;
  conn_t *c = h->data;
  *buf = uv_buf_init((char *)c->rbuf + c->rlen, (unsigned)(c->rcap - c->rlen));
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
  (void)buf;
  conn_t *c = s->data;
  if (nread == 0) return; /* EAGAIN: nothing this time */
  if (nread == UV_ENOBUFS) {
    conn_close(c, "read buffer full"); /* cannot happen: we stop reading first */
    return;
  }
  if (nread == UV_EOF) {
    /* A client may half-close after its last request: answer what it sent
     * (libuv has stopped reading), then close (schedule). Turn by turn, as
     * any frames: a client that pipelines a buffer of requests and closes
     * (gone: its replies fail, which closes us) must not hold the loop
     * for all of them at once. */
    c->eof = true;
    c->reading = false;
    schedule(c);
    return;
  }
  if (nread < 0) {
    conn_close(c, uv_strerror((int)nread));
    return;
  }
  c->rlen += (size_t)nread;
  c->srv->stats.socket_bytes_in += (uint64_t)nread;
  run_frames(c, c->srv->cfg.frames_per_turn, true);
}

static void on_deadline(uv_timer_t *t) {
  conn_t *c = t->data;
  LOG_WARN("frame_timeout", "conn=%llu pid=%d greeted=%d bytes_buffered=%zu frame_timeout_ms=%u",
           (unsigned long long)c->id, (int)c->pid, c->greeted, c->rlen - c->roff,
           c->srv->cfg.frame_timeout_ms);
  c->srv->stats.connections_timed_out++;
  conn_close(c, c->greeted ? "frame not complete within frame_timeout_ms"
                           : "no Hello within frame_timeout_ms");
}

/* Decides between reading, running buffered frames and waiting for writes. */
static void schedule(conn_t *c) {
  if (stopping(c)) return;
  server_t *srv = c->srv;
  uint32_t plen;
  bool pressure = c->wq_bytes > srv->cfg.write_queue_bytes, hold = held(c);
  bool have_frame =
      frame_parse(c->rbuf + c->roff, c->rlen - c->roff, c->max_frame, &plen) != FRAME_NEED_MORE;
  if (c->eof && !have_frame && !c->offloaded && !c->parked) { /* all answered */
    conn_close_after_flush(c, c->rlen > c->roff ? "EOF inside a frame" : "EOF");
    return;
  }
  bool want_read = !pressure && (!have_frame || hold || c->bg) && c->rlen < c->rcap && !c->eof;
  bool want_idle = !pressure && !hold && !c->bg && have_frame && !c->offloaded && !c->parked;
  if (hold && !c->paused) srv->stats.write_pauses++;
  c->paused = hold;
  if (want_read != c->reading) {
    if (want_read) {
      int rc = uv_read_start((uv_stream_t *)&c->pipe, on_alloc, on_read);
      if (rc != 0) {
        conn_close(c, uv_strerror(rc));
        return;
      }
    } else {
      uv_read_stop((uv_stream_t *)&c->pipe);
    }
    c->reading = want_read;
  }
  set_backlog(c, want_idle);
  if (c->ring && !hold && !c->offloaded && !c->parked) ring_kick(c->ring);
  /* Waiting for the rest of a frame the client started (or for its Hello):
   * that wait is bounded. Not while we are the ones not reading. */
  bool want_deadline = srv->cfg.frame_timeout_ms && want_read &&
                       (!c->greeted || (c->rlen > c->roff && !have_frame));
  if (want_deadline != (uv_is_active((uv_handle_t *)&c->deadline) != 0)) {
    if (want_deadline) uv_timer_start(&c->deadline, on_deadline, srv->cfg.frame_timeout_ms, 0);
    else uv_timer_stop(&c->deadline);
  }
}

#ifndef SO_PEERGROUPS
#define SO_PEERGROUPS 59 /* Linux 4.13; older glibc headers lack it */
#endif

static bool in_list(const id_list_t *l, uint32_t id) {
  for (uint32_t i = 0; i < l->n; i++)
    if (l->ids[i] == id) return true;
  return false;
}

/* The peer's supplementary groups (SO_PEERGROUPS); 0 if unknown. */
static size_t peer_groups(int fd, gid_t *groups, size_t cap) {
  socklen_t len = (socklen_t)(cap * sizeof *groups);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &len) != 0) return 0;
  return len / sizeof *groups;
}

/* Whether uid, gid or one of the groups is in the lists. */
static bool peer_in(const id_list_t *uids, const id_list_t *gids, uid_t uid, gid_t gid,
                    const gid_t *groups, size_t ngroups) {
  if (in_list(uids, (uint32_t)uid) || in_list(gids, (uint32_t)gid)) return true;
  for (size_t i = 0; i < ngroups; i++)
    if (in_list(gids, (uint32_t)groups[i])) return true;
  return false;
}

static void refuse(conn_t *c, Kvcache__V1__Status status, const char *msg) {
  server_t *srv = c->srv;
  srv->stats.connections_rejected++;
  LOG_LIMITED(&srv->limit_refused, uv_now(srv->loop), LOG_LEVEL_WARN, "refused",
              "pid=%d uid=%u gid=%u status=%s reason=\"%s\"", (int)c->pid, (unsigned)c->uid,
              (unsigned)c->gid, kvc_err_name(-(int)status), msg);
  Kvcache__V1__Response resp = KVCACHE__V1__RESPONSE__INIT;
  resp.status = status;
  resp.error = (char *)msg;
  wreq_t *w = pack(&resp, kvcache__v1__response__get_packed_size(&resp));
  if (!w) {
    conn_close(c, "out of memory packing a refusal");
    return;
  }
  /* A fresh socket takes the small reply at once: then close at once too, so
   * a burst of refusals at the descriptor limit frees each descriptor before
   * the next accept (uv_close closes the fd now, only its callback waits). */
  uv_buf_t b = uv_buf_init((char *)w->data, (unsigned)w->len);
  int n = uv_try_write((uv_stream_t *)&c->pipe, &b, 1);
  if (n == (int)w->len) {
    srv->stats.socket_bytes_out += w->len;
    free(w);
    conn_close(c, msg);
    return;
  }
  if (n > 0) {
    srv->stats.socket_bytes_out += (uint64_t)n;
    memmove(w->data, w->data + n, w->len - (size_t)n);
    w->len -= (size_t)n;
  }
  if (write_frame(c, w) == 0) conn_close_after_flush(c, msg);
}

void conn_accept(server_t *srv) {
  conn_t *c = calloc(1, sizeof *c);
  if (!c) {
    LOG_ERROR("accept", "error=\"out of memory\"");
    return;
  }
  c->srv = srv;
  c->shm.fd = -1;
  c->max_frame = (uint32_t)srv->cfg.max_frame_bytes;
  c->rcap = 2u * (FRAME_HEADER_BYTES + c->max_frame);
  c->rbuf = malloc(c->rcap);
  c->id = srv->next_conn_id++;
  c->tw.conn_id = c->id;
  c->accepted_ms = c->last_ms = uv_now(srv->loop);
  if (!c->rbuf) {
    free(c);
    LOG_ERROR("accept", "error=\"out of memory\"");
    return;
  }
  uv_pipe_init(srv->loop, &c->pipe, 0);
  uv_idle_init(srv->loop, &c->idle);
  uv_timer_init(srv->loop, &c->deadline);
  c->pipe.data = c->idle.data = c->deadline.data = c;
  c->open_handles = 3;
  c->next = srv->conns;
  if (srv->conns) srv->conns->prev = c;
  srv->conns = c;
  srv->nconns++;
  int rc = uv_accept((uv_stream_t *)&srv->listener, (uv_stream_t *)&c->pipe);
  if (rc != 0) {
    LOG_WARN("accept", "error=\"%s\"", uv_strerror(rc));
    conn_close(c, "accept failed");
    return;
  }
  uv_os_fd_t fd;
  struct ucred cred;
  socklen_t len = sizeof cred;
  if (uv_fileno((uv_handle_t *)&c->pipe, &fd) != 0 ||
      getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    conn_close(c, "no peer credentials");
    return;
  }
  c->pid = cred.pid;
  c->uid = cred.uid;
  c->gid = cred.gid;
  /* Who it is comes from the kernel alone: a worker in group kvcached may
   * connect to a socket of SocketGroup=kvcached with allow_gids naming it. */
  const config_t *cfg = &srv->cfg;
  gid_t groups[256];
  size_t ngroups = peer_groups(fd, groups, 256);
  char tname[TENANT_NAME_MAX];
  tenant_of_peer(cfg->tenant_rules, cfg->n_tenant_rules, cred.uid, cred.gid, groups, ngroups,
                 tname);
  c->tenant = server_tenant(srv, tname);
  c->admin = cred.uid == 0 || cred.uid == geteuid() || /* root, the service's own user */
             peer_in(&cfg->admin_uids, &cfg->admin_gids, cred.uid, cred.gid, groups, ngroups);
  /* Arenas: every client maps the segments it may read (poolown.c). */
  c->pool_mapped = poolown_arenas(c->srv) || c->admin ||
                   (cfg->zero_copy_tenant[0] && strcmp(tname, cfg->zero_copy_tenant) == 0);
  char msg[160];
  if (srv->draining) {
    refuse(c, KVCACHE__V1__STATUS__SHUTDOWN, "kvcached is shutting down");
  } else if (!peer_in(&cfg->allow_uids, &cfg->allow_gids, cred.uid, cred.gid, groups, ngroups)) {
    snprintf(msg, sizeof msg,
             "permission denied: uid %u gid %u is not in allow_uids/allow_gids",
             (unsigned)cred.uid, (unsigned)cred.gid);
    refuse(c, KVCACHE__V1__STATUS__PERM, msg);
  } else if (c->tenant == 0) {
    refuse(c, KVCACHE__V1__STATUS__CONNLIMIT, "too many distinct tenants");
  } else if (srv->stats.connections_current >= srv->cfg.max_connections) {
    snprintf(msg, sizeof msg, "connection limit reached (max_connections=%u)",
             srv->cfg.max_connections);
    refuse(c, KVCACHE__V1__STATUS__CONNLIMIT, msg);
  } else if (quotas_conn_over(srv, c, msg, sizeof msg)) {
    refuse(c, KVCACHE__V1__STATUS__QUOTA_CONNS, msg);
  } else if (fdbudget_full(srv)) {
    snprintf(msg, sizeof msg, "connection limit reached: out of file descriptors "
             "(%u connections open; raise RLIMIT_NOFILE)", srv->nconns - 1);
    refuse(c, KVCACHE__V1__STATUS__CONNLIMIT, msg);
  } else {
    c->counted = true;
    quotas_touch(c);
    srv->stats.connections_current++;
    srv->stats.connections_total++;
    LOG_DEBUG("accept", "conn=%llu pid=%d uid=%u gid=%u tenant=%s admin=%d",
              (unsigned long long)c->id, (int)c->pid, (unsigned)c->uid, (unsigned)c->gid,
              tname, c->admin);
    schedule(c);
  }
}

bool conn_is_admin(const conn_t *c) { return c->admin; }

const char *conn_tenant(const conn_t *c) { return tenants_name(&c->srv->tenants, c->tenant); }
