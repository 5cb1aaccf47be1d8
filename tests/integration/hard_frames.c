/* hard_frames.c: framing under attack. Every length prefix class is answered
 * or closed within a second without memory growing by what it declared;
 * a thousand frame hoarders and 512 slowloris clients are closed by the
 * frame deadline while a well-behaved client is served; passed descriptors
 * and credentials leave the daemon's fd table as it was; a pipelined stream
 * gets the same replies however it is cut. */
#include "hard.h"

#define MAX_FRAME 65536u

static void put_varint(uint8_t **p, uint64_t v) {
  while (v >= 0x80) {
    *(*p)++ = (uint8_t)(v | 0x80);
    v >>= 7;
  }
  *(*p)++ = (uint8_t)v;
}

static size_t varint_len(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) v >>= 7, n++;
  return n;
}

/* A framed Ping of exactly `payload` bytes: id 7, the ping, then an unknown
 * field 100 padding it out. Returns new memory of 4 + payload bytes. */
static uint8_t *padded_ping(size_t payload) {
  uint8_t *f = malloc(4 + payload), *p = f + 4;
  size_t pad = payload - 6;
  while (6 + varint_len(pad) + pad > payload) pad--;
  ASSERT_EQ(6 + varint_len(pad) + pad, payload);
  hard_hdr(f, (uint32_t)payload);
  *p++ = 0x08, *p++ = 7;       /* id = 7 */
  *p++ = 0x1a, *p++ = 0;       /* ping {} */
  *p++ = 0xa2, *p++ = 0x06;    /* field 100, length-delimited */
  put_varint(&p, pad);
  memset(p, 'x', pad);
  ASSERT_EQ(p + pad - f, 4 + (long long)payload);
  return f;
}

static void ping_ok(int fd, uint64_t id) {
  Kvcache__V1__Request req = KVCACHE__V1__REQUEST__INIT;
  Kvcache__V1__Ping ping = KVCACHE__V1__PING__INIT;
  req.body_case = KVCACHE__V1__REQUEST__BODY_PING;
  req.ping = &ping;
  req.id = id;
  raw_send_request(fd, &req);
  Kvcache__V1__Response *r = raw_reply(fd);
  ASSERT(r != NULL);
  ASSERT_EQ(r->status, KVCACHE__V1__STATUS__OK);
  ASSERT_U64_EQ(r->id, id);
  kvcache__v1__response__free_unpacked(r, NULL);
}

TEST(hard_length_prefixes_answered_or_closed_within_a_second) {
  static const char *const args[] = {"--frame-timeout-ms", "300", NULL};
  daemon_t d;
  daemon_start_args(&d, args);
  kvc_client_t *c = client_open(&d);
  uint64_t rss0 = hard_rss_kb(d.pid);
  int hanging = 0;

  /* 0: an empty payload is an empty Request: PROTO, the connection stays. */
  int fd = hard_greeted(&d);
  uint8_t h[4];
  hard_hdr(h, 0);
  double t0 = hard_now_ms();
  raw_send(fd, h, 4);
  Kvcache__V1__Response *r = raw_reply(fd);
  ASSERT(r != NULL);
  ASSERT_EQ(r->status, KVCACHE__V1__STATUS__PROTO);
  kvcache__v1__response__free_unpacked(r, NULL);
  ASSERT(hard_now_ms() - t0 < 1000);
  ping_ok(fd, 2);
  close(fd);

  /* 1: one byte that is half a field: does not decode, closed. */
  fd = hard_greeted(&d);
  uint8_t one[5] = {1, 0, 0, 0, 0x08};
  raw_send(fd, one, sizeof one);
  double ms = hard_ms_until_closed(fd, 1000);
  fprintf(stderr, "length 1: closed after %.1f ms\n", ms);
  ASSERT(ms >= 0);
  close(fd);

  /* max-1 and max: whole valid frames are answered. */
  for (uint32_t n = MAX_FRAME - 1; n <= MAX_FRAME; n++) {
    fd = hard_greeted(&d);
    uint8_t *f = padded_ping(n);
    t0 = hard_now_ms();
    raw_send(fd, f, 4 + n);
    free(f);
    r = raw_reply(fd);
    ASSERT(r != NULL);
    ASSERT_EQ(r->status, KVCACHE__V1__STATUS__OK);
    ASSERT_U64_EQ(r->id, 7);
    kvcache__v1__response__free_unpacked(r, NULL);
    ASSERT(hard_now_ms() - t0 < 1000);
    ping_ok(fd, 8);
    close(fd);
  }

  /* max+1, 2^31, 2^32-1: closed on the header alone, greeted or not. */
  const uint32_t big[] = {MAX_FRAME + 1, 1u << 31, UINT32_MAX};
  for (int greet = 0; greet < 2; greet++)
    for (size_t i = 0; i < 3; i++) {
      fd = greet ? hard_greeted(&d) : it_connect_raw(d.sock);
      hard_hdr(h, big[i]);
      raw_send(fd, h, 4);
      ms = hard_ms_until_closed(fd, 1000);
      fprintf(stderr, "length %u (greeted %d): closed after %.1f ms\n", big[i], greet, ms);
      ASSERT(ms >= 0);
      close(fd);
    }

  /* Truncated headers (1, 2, 3 bytes) and a max frame cut short: closed at
   * EOF, and by the frame deadline when the client just stops. */
  hard_hdr(h, MAX_FRAME);
  for (size_t cut = 1; cut <= 5; cut++) {
    for (int eof = 0; eof < 2; eof++) {
      fd = hard_greeted(&d);
      uint8_t part[5] = {h[0], h[1], h[2], h[3], 'x'};
      raw_send(fd, part, cut);
      if (eof) ASSERT_EQ(shutdown(fd, SHUT_WR), 0);
      else hanging++;
      ms = hard_ms_until_closed(fd, 1000);
      fprintf(stderr, "header cut at %zu bytes, eof %d: closed after %.1f ms\n", cut, eof, ms);
      ASSERT(ms >= 0);
      close(fd);
    }
  }
  /* A connection that never says Hello is closed by the same deadline. */
  fd = it_connect_raw(d.sock);
  hanging++;
  ASSERT(hard_ms_until_closed(fd, 1000) >= 0);
  close(fd);

  uint64_t rss1 = hard_rss_kb(d.pid);
  fprintf(stderr, "daemon RSS %llu kB -> %llu kB\n", (unsigned long long)rss0,
          (unsigned long long)rss1);
  ASSERT(rss1 < rss0 + 4096); /* far below any declared size past the max */
  ASSERT_OK(kvc_ping(c));
  ASSERT_U64_EQ(stat_get(c, "connections_timed_out_total", NULL), hanging);
  ASSERT_U64_EQ(stat_get(c, "connections_dropped_total", NULL), 1 + 6);
  kvc_client_close(c);
  daemon_stop(&d);
}

/* Latency of n pings and n 1-token put+get pairs of a well-behaved client. */
static void good_client_ops(kvc_cache_t *h, int n, double *lat, size_t *nlat, size_t cap,
                            uint64_t seq) {
  const kvc_layout_t *l = kvc_cache_layout(h);
  size_t kn = it_tok_floats(l, false), vn = it_tok_floats(l, true);
  float *k = malloc(kn * 4), *v = malloc(vn * 4), *gk = malloc(kn * 4), *gv = malloc(vn * 4);
  for (int i = 0; i < n; i++) {
    it_fill_f32(k, v, l, seq, (uint64_t)i % 64, 1, 0);
    double t0 = hard_now_ms();
    ASSERT_OK(kvc_put(h, seq, (uint64_t)i % 64, 1, k, v));
    ASSERT_OK(kvc_get(h, seq, (uint64_t)i % 64, (uint64_t)i % 64 + 1, gk, gv));
    if (*nlat < cap) lat[(*nlat)++] = hard_now_ms() - t0;
    ASSERT_MEM_EQ(gk, k, kn * 4);
    ASSERT_MEM_EQ(gv, v, vn * 4);
  }
  free(k), free(v), free(gk), free(gv);
}

/* 1000 connections that announce a maximal frame and send one byte of it,
 * and 512 that trickle a frame one byte a second: the daemon holds them with
 * bounded memory, closes every one at the frame deadline, and a client beside
 * them keeps being served (its latency is measured and printed). */
TEST_TIMEOUT(hard_slowloris_and_frame_hoarders_are_bounded, 120) {
  enum { HOARDERS = 1000, SLOW = 512 };
  hard_raise_nofile(4096);
  /* Under valgrind opening them all takes seconds: a longer deadline. */
  int tmo = hard_valgrind() ? 30000 : 2500;
  char tmo_s[16];
  snprintf(tmo_s, sizeof tmo_s, "%d", tmo);
  /* 1512 buffers of the default 64 MiB: past the shared-buffer quotas. */
  const char *const args[] = {"--frame-timeout-ms", tmo_s, "--max-connections",
                              "2000", "--log-level", "info", "--shm-bytes-per-uid", "256GiB",
                              "--shm-bytes-total", "256GiB", NULL};
  daemon_t d;
  daemon_start_args(&d, args);
  kvc_client_t *c = client_open(&d);
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_open(c, "good", &l, &h));
  static double base[512], during[16384];
  size_t nbase = 0, nduring = 0;
  good_client_ops(h, 200, base, &nbase, 512, 1);
  uint64_t rss0 = hard_rss_kb(d.pid);
  int fds0 = hard_stable_fds(d.pid);

  static int fds[HOARDERS + SLOW];
  uint8_t hdr[5];
  hard_hdr(hdr, MAX_FRAME);
  hdr[4] = 'x';
  double t_start = hard_now_ms();
  for (int i = 0; i < HOARDERS + SLOW; i++) {
    fds[i] = hard_greeted(&d);
    if (i < HOARDERS) raw_send(fds[i], hdr, 5);
    else raw_send(fds[i], hdr, 1);
  }
  double t_open = hard_now_ms() - t_start;
  for (int i = 0; i < HOARDERS + SLOW; i++) hard_wait_read(fds[i]); /* it has the headers */
  uint64_t rss1 = hard_rss_kb(d.pid);
  ASSERT_U64_EQ(stat_get(c, "connections_current", NULL), 1 + HOARDERS + SLOW);

  /* Trickle one byte a second into the slow ones while the good client works. */
  int sent = 1;
  double t_last = hard_now_ms();
  while (hard_now_ms() - t_start < tmo + 1500) {
    good_client_ops(h, 10, during, &nduring, sizeof during / sizeof during[0], 2);
    it_sleep_ms(2);
    if (hard_now_ms() - t_last >= 1000 && sent < 4) {
      for (int i = HOARDERS; i < HOARDERS + SLOW; i++)
        (void)send(fds[i], hdr + sent, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
      sent++;
      t_last = hard_now_ms();
    }
  }
  /* Every attacker is closed: EOF on each of our ends. */
  int closed = 0;
  for (int i = 0; i < HOARDERS + SLOW; i++) {
    closed += hard_ms_until_closed(fds[i], 2000) >= 0;
    close(fds[i]);
  }
  ASSERT_EQ(closed, HOARDERS + SLOW);
  ASSERT_U64_EQ(stat_get(c, "connections_timed_out_total", NULL), HOARDERS + SLOW);
  ASSERT_U64_EQ(stat_get(c, "connections_current", NULL), 1);
  int fds1 = hard_wait_fds(d.pid, fds0, 2000);
  uint64_t rss2 = hard_rss_kb(d.pid);
  double p50b = hard_quantile(base, nbase, 0.5), p99b = hard_quantile(base, nbase, 0.99);
  double p50d = hard_quantile(during, nduring, 0.5), p99d = hard_quantile(during, nduring, 0.99);
  fprintf(stderr,
          "opened %d attackers in %.0f ms; daemon RSS %llu kB idle, %llu kB under attack "
          "(%.1f kB per connection), %llu kB after; fds %d -> %d\n"
          "good client put+get latency: before p50 %.3f ms p99 %.3f ms (%zu ops); "
          "during p50 %.3f ms p99 %.3f ms (%zu ops)\n",
          HOARDERS + SLOW, t_open, (unsigned long long)rss0, (unsigned long long)rss1,
          (double)(rss1 - rss0) / (HOARDERS + SLOW), (unsigned long long)rss2, fds0, fds1, p50b,
          p99b, nbase, p50d, p99d, nduring);
  ASSERT(nduring >= 20);
  ASSERT_EQ(fds1, fds0);
  /* Bounded: far less than the 64 KiB each one announced. */
  if (!hard_sanitized()) ASSERT((rss1 - rss0) / (HOARDERS + SLOW) < 32);
  kvc_client_close(c);
  daemon_stop(&d);
}

/* Sends a framed ping with ancillary data: nfds copies of /dev/null, or
 * (nfds == 0) the sender's credentials. */
static void send_with_ancillary(int fd, int nfds, uint64_t id) {
  Kvcache__V1__Request req = KVCACHE__V1__REQUEST__INIT;
  Kvcache__V1__Ping ping = KVCACHE__V1__PING__INIT;
  req.body_case = KVCACHE__V1__REQUEST__BODY_PING;
  req.ping = &ping;
  req.id = id;
  uint8_t frame[64];
  size_t n = kvcache__v1__request__pack(&req, frame + 4);
  hard_hdr(frame, (uint32_t)n);
  static union {
    struct cmsghdr h;
    char buf[CMSG_SPACE(253 * sizeof(int))];
  } ctl;
  memset(&ctl, 0, sizeof ctl);
  struct iovec iov = {.iov_base = frame, .iov_len = 4 + n};
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf,
                       .msg_controllen = sizeof ctl.buf};
  struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
  int devnull[253];
  cm->cmsg_level = SOL_SOCKET;
  if (nfds > 0) {
    for (int i = 0; i < nfds; i++) ASSERT((devnull[i] = open("/dev/null", O_RDONLY)) >= 0);
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN((size_t)nfds * sizeof(int));
    memcpy(CMSG_DATA(cm), devnull, (size_t)nfds * sizeof(int));
    msg.msg_controllen = CMSG_SPACE((size_t)nfds * sizeof(int));
  } else {
    struct ucred cred = {.pid = getpid(), .uid = getuid(), .gid = getgid()};
    cm->cmsg_type = SCM_CREDENTIALS;
    cm->cmsg_len = CMSG_LEN(sizeof cred);
    memcpy(CMSG_DATA(cm), &cred, sizeof cred);
    msg.msg_controllen = CMSG_SPACE(sizeof cred);
  }
  ASSERT_EQ(sendmsg(fd, &msg, MSG_NOSIGNAL), (long long)(4 + n));
  for (int i = 0; i < nfds; i++) close(devnull[i]);
}

TEST(hard_passed_fds_and_credentials_leave_the_fd_table_alone) {
  daemon_t d;
  daemon_start(&d);
  kvc_client_t *c = client_open(&d);
  ASSERT_OK(kvc_ping(c)); /* by its reply the daemon has closed its copy of c's memfd */
  int fds0 = hard_stable_fds(d.pid); /* and the harness's probe is gone */
  const int counts[] = {1, 253, 0};
  for (int greet = 0; greet < 2; greet++)
    for (size_t i = 0; i < 3; i++) {
      int fd = greet ? hard_greeted(&d) : it_connect_raw(d.sock);
      /* Greeted: the connection's socket only, once the daemon has closed its
       * copy of the buffer's memfd (it may still hold it when Hello returns). */
      int during = greet ? hard_wait_fds(d.pid, fds0 + 1, 1000) : hard_fd_count(d.pid);
      if (greet) {
        for (uint64_t k = 0; k < 3; k++) send_with_ancillary(fd, counts[i], 10 + k);
        for (uint64_t k = 0; k < 3; k++) {
          Kvcache__V1__Response *r = raw_reply(fd);
          ASSERT(r && r->status == KVCACHE__V1__STATUS__OK && r->id == 10 + k);
          kvcache__v1__response__free_unpacked(r, NULL);
        }
      } else {
        /* Before the Hello: a Ping with fds is refused (PROTO) and closed. */
        send_with_ancillary(fd, counts[i], 10);
        Kvcache__V1__Response *r = raw_reply(fd);
        ASSERT(r && r->status == KVCACHE__V1__STATUS__PROTO);
        kvcache__v1__response__free_unpacked(r, NULL);
        ASSERT(raw_closed(fd));
      }
      int now = greet ? hard_fd_count(d.pid) : hard_wait_fds(d.pid, fds0, 1000);
      fprintf(stderr, "greeted %d, %s: daemon fds %d before, %d with the connection, %d after\n",
              greet, counts[i] ? (counts[i] == 1 ? "1 fd" : "253 fds") : "credentials", fds0,
              during, now);
      ASSERT_EQ(now, greet ? during : fds0); /* nothing arrived with the data */
      close(fd);
      ASSERT_EQ(hard_wait_fds(d.pid, fds0, 1000), fds0);
    }
  ASSERT_OK(kvc_ping(c));
  kvc_client_close(c);
  daemon_stop(&d);
}

/* ---- one stream, cut anywhere ------------------------------------------------ */

typedef struct stream {
  uint8_t *buf;
  size_t len, cap;
  size_t nreq;
} stream_t;

static void stream_add(stream_t *s, Kvcache__V1__Request *req) {
  size_t n = kvcache__v1__request__get_packed_size(req);
  if (s->len + 4 + n > s->cap) {
    s->cap = (s->cap + 4 + n) * 2;
    s->buf = realloc(s->buf, s->cap);
  }
  hard_hdr(s->buf + s->len, (uint32_t)n);
  kvcache__v1__request__pack(req, s->buf + s->len + 4);
  s->len += 4 + n;
  s->nreq++;
}

/* Complete reply frames at the start of buf[0..len). */
static size_t count_frames(const uint8_t *buf, size_t len) {
  size_t n = 0, off = 0;
  while (len - off >= 4) {
    size_t f = 4 + (buf[off] | (size_t)buf[off + 1] << 8 | (size_t)buf[off + 2] << 16);
    if (len - off < f) break;
    off += f;
    n++;
  }
  return n;
}

/* nreq requests of cache 0 (opened and cleared first): puts, gets,
 * copy_prefix, remove, trim, can_resume, pin and ping over 40
 * sequences, many of them failing; the replies depend only on the stream. */
static stream_t make_stream(size_t nreq, uint64_t seed) {
  stream_t s = {0};
  Kvcache__V1__Request req = KVCACHE__V1__REQUEST__INIT;
  Kvcache__V1__CacheOpen co = KVCACHE__V1__CACHE_OPEN__INIT;
  Kvcache__V1__Layout lw = KVCACHE__V1__LAYOUT__INIT;
  lw.num_layers = 2, lw.num_kv_heads = 2, lw.head_dim_k = 32, lw.head_dim_v = 32;
  lw.dtype = KVCACHE__V1__DTYPE__F32, lw.page_tokens = 16;
  co.name = (char *)"pipe";
  co.layout = &lw;
  req.body_case = KVCACHE__V1__REQUEST__BODY_CACHE_OPEN, req.cache_open = &co, req.id = 1;
  stream_add(&s, &req);
  Kvcache__V1__CacheRef cr = KVCACHE__V1__CACHE_REF__INIT;
  req = (Kvcache__V1__Request)KVCACHE__V1__REQUEST__INIT;
  req.body_case = KVCACHE__V1__REQUEST__BODY_CACHE_CLEAR, req.cache_clear = &cr, req.id = 2;
  stream_add(&s, &req);
  uint64_t x = seed;
  while (s.nreq < nreq) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    uint64_t r = x >> 33;
    uint64_t seq = r % 40, pos = (r >> 6) % 48, n = 1 + (r >> 12) % 4;
    Kvcache__V1__IoEntry e = KVCACHE__V1__IO_ENTRY__INIT, *pe = &e;
    Kvcache__V1__Io io = KVCACHE__V1__IO__INIT;
    Kvcache__V1__CopyPrefix cp = KVCACHE__V1__COPY_PREFIX__INIT;
    Kvcache__V1__Remove rm = KVCACHE__V1__REMOVE__INIT;
    Kvcache__V1__SeqPos sp = KVCACHE__V1__SEQ_POS__INIT;
    Kvcache__V1__SeqRef sr = KVCACHE__V1__SEQ_REF__INIT;
    Kvcache__V1__Ping ping = KVCACHE__V1__PING__INIT;
    e.seq_id = seq, e.pos = pos, e.ntokens = n;
    e.k_off = 0, e.k_len = n * 512, e.v_off = 1u << 19, e.v_len = n * 512;
    io.n_entries = 1, io.entries = &pe;
    cp.src = seq, cp.dst = (seq + 1 + (r >> 20) % 39) % 40, cp.ntokens = pos;
    rm.seq_id = sp.seq_id = sr.seq_id = seq;
    rm.begin = pos, rm.end = (r >> 20) % 2 ? UINT64_MAX : pos + n;
    sp.pos = pos;
    req = (Kvcache__V1__Request)KVCACHE__V1__REQUEST__INIT;
    req.id = 1000 + s.nreq;
    switch ((r >> 24) % 10) {
    case 0: case 1: case 2: req.body_case = KVCACHE__V1__REQUEST__BODY_PUT, req.put = &io; break;
    case 3: case 4: req.body_case = KVCACHE__V1__REQUEST__BODY_GET, req.get = &io; break;
    case 5: req.body_case = KVCACHE__V1__REQUEST__BODY_COPY_PREFIX, req.copy_prefix = &cp; break;
    case 6: req.body_case = KVCACHE__V1__REQUEST__BODY_REMOVE, req.remove = &rm; break;
    case 7:
      if (r & 1) req.body_case = KVCACHE__V1__REQUEST__BODY_TRIM_FRONT, req.trim_front = &sp;
      else req.body_case = KVCACHE__V1__REQUEST__BODY_CAN_RESUME, req.can_resume = &sp;
      break;
    case 8: /* (an unpin's error names the connection: not the same twice) */
      req.body_case = KVCACHE__V1__REQUEST__BODY_PIN, req.pin = &sr;
      break;
    default: req.body_case = KVCACHE__V1__REQUEST__BODY_PING, req.ping = &ping; break;
    }
    stream_add(&s, &req);
  }
  ASSERT_EQ(count_frames(s.buf, s.len), s.nreq);
  return s;
}

typedef struct replies {
  uint8_t *buf;
  size_t len, cap;
} replies_t;

static void drain(int fd, replies_t *r, bool block) {
  for (;;) {
    if (r->cap - r->len < 65536) r->buf = realloc(r->buf, r->cap = r->cap * 2 + 65536);
    ssize_t n = recv(fd, r->buf + r->len, r->cap - r->len, block ? 0 : MSG_DONTWAIT);
    if (n <= 0) {
      ASSERT(!block || n > 0);
      return;
    }
    r->len += (size_t)n;
    if (block) return;
  }
}

/* Sends the stream on a fresh greeted connection in pieces: cuts[] are the
 * offsets where one write ends (the daemon has read it before the next
 * begins when sync). Returns the bytes of every reply. */
static replies_t run_stream(const daemon_t *d, const stream_t *s, const size_t *cuts,
                            size_t ncuts, bool sync) {
  int fd = hard_greeted(d);
  replies_t r = {0};
  size_t off = 0;
  for (size_t i = 0; i <= ncuts; i++) {
    size_t end = i < ncuts ? cuts[i] : s->len;
    if (end <= off) continue;
    raw_send(fd, s->buf + off, end - off);
    off = end;
    if (sync && i < ncuts) hard_wait_read(fd);
    drain(fd, &r, false);
  }
  while (count_frames(r.buf, r.len) < s->nreq) drain(fd, &r, true);
  ASSERT_EQ(count_frames(r.buf, r.len), s->nreq);
  close(fd);
  return r;
}

static void same_replies(const replies_t *want, const replies_t *got, const char *how) {
  for (size_t o = 0; o < want->len && o < got->len;) {
    size_t f = want->buf[o] | (size_t)want->buf[o + 1] << 8;
    if (memcmp(want->buf + o, got->buf + o, 4 + f) != 0) {
      Kvcache__V1__Response *a = kvcache__v1__response__unpack(NULL, f, want->buf + o + 4);
      Kvcache__V1__Response *b = kvcache__v1__response__unpack(NULL, got->buf[o] | (size_t)got->buf[o + 1] << 8, got->buf + o + 4);
      TEST_FAIL_("%s: reply %llu differs: \"%s\" vs \"%s\"", how, a ? (unsigned long long)a->id : 0ull,
                 a ? a->error : "?", b ? b->error : "?");
    }
    o += 4 + f;
  }
  if (got->len != want->len) TEST_FAIL_("%s: %zu reply bytes, want %zu", how, got->len, want->len);
  ASSERT_MEM_EQ(got->buf, want->buf, want->len);
}

TEST_TIMEOUT(hard_pipelined_stream_same_replies_however_cut, 300) {
  daemon_t d;
  daemon_start(&d);
  /* 10^4 requests in one write, then in small writes of 1..97 bytes (every
   * byte, one write each, in make check). */
  stream_t big = make_stream(10000, 42);
  replies_t want = run_stream(&d, &big, NULL, 0, false);
  size_t nok = 0, off = 0;
  for (size_t f = 0; f < want.len; f += 4 + (want.buf[f] | (size_t)want.buf[f + 1] << 8)) {
    Kvcache__V1__Response *r = kvcache__v1__response__unpack(
        NULL, want.buf[f] | (size_t)want.buf[f + 1] << 8, want.buf + f + 4);
    ASSERT(r != NULL);
    nok += r->status == KVCACHE__V1__STATUS__OK;
    kvcache__v1__response__free_unpacked(r, NULL);
  }
  fprintf(stderr, "stream: %zu requests, %zu bytes; %zu replies OK, %zu errors\n", big.nreq,
          big.len, nok, big.nreq - nok);
  ASSERT(nok > big.nreq / 10 && nok < big.nreq); /* both kinds are exercised */
  size_t *cuts = malloc(big.len * sizeof *cuts), ncuts = 0;
  uint64_t x = 7;
  for (off = 0; off < big.len; ncuts++) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    off += test_long() ? 1 : 1 + (x >> 33) % 97;
    cuts[ncuts] = off < big.len ? off : big.len;
  }
  replies_t got = run_stream(&d, &big, cuts, ncuts, false);
  same_replies(&want, &got, "small writes");
  free(got.buf);

  /* A 150-request stream cut in two at every offset (a sample of 64 in make
   * test), the first part read by the daemon before the second is sent. */
  stream_t small = make_stream(150, 9);
  replies_t want_s = run_stream(&d, &small, NULL, 0, false);
  size_t step = test_long() ? 1 : small.len / 64 + 1;
  size_t runs = 0;
  for (size_t cut = 1; cut < small.len; cut += step, runs++) {
    got = run_stream(&d, &small, &cut, 1, true);
    char how[64];
    snprintf(how, sizeof how, "cut at byte %zu", cut);
    same_replies(&want_s, &got, how);
    free(got.buf);
  }
  fprintf(stderr, "small stream: %zu bytes, %zu cuts, all identical\n", small.len, runs);
  free(cuts), free(want.buf), free(want_s.buf), free(big.buf), free(small.buf);
  daemon_stop(&d);
}
