/* rnode.c: one Redis node's connection, its commands in flight, their
 * timeout and the node's circuit breaker (rnode.h draws the states). */
#include "rnode.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "log.h"

#define BREAKER_MAX_SHIFT 6 /* an open breaker waits at most 64x breaker_ms */

static uint64_t now_ms(const rnode_t *n) { return uv_now(n->env->loop); }

/* ---- reading the replies ----------------------------------------------------------
 * hiredis parses replies and runs their callbacks in order, but does not
 * read the socket: its reader (redisBufferRead) takes 16 KiB a call into
 * its buffer and then copies a value again into its reply, and its own
 * libuv adapter reads once a loop turn. Here the socket is read while it
 * has bytes (up to READS_PER_WAKE reads, then the loop's other handles
 * run), and the replies are framed as they come (RESP: the lines, the
 * bulk lengths, the counts of arrays):
 *
 *   socket --read--> stash --a whole reply, or the part of one that came-->
 *                                             hiredis's reader -> callback
 *          --readv--> a sink's buffer: the value of a command with a sink
 *                     (a lookup's GET), then the stand-in "+\r\n" to hiredis
 *
 * A value for a sink is read straight into the buffer the sink gives once
 * its header "$<len>\r\n" is read (peeked, when nothing is stashed), in as
 * few reads as the socket allows: the kernel's copy is its only one. Its
 * stand-in makes hiredis run the command's callback in its turn (on_reply
 * knows it by c->landed). Bytes that are not RESP end the connection (its
 * commands fail, as for a lost one); hiredis judges again what it is fed. */
#define READS_PER_WAKE 64
#define PEEK_BYTES 32          /* "$<len>\r\n" fits */
#define DROP_BYTES (64u << 10) /* a refused value is read through this */
#define BULK_MAX (512ull << 20) /* Redis's proto-max-bulk-len: a longer one is not RESP */
#define COUNT_MAX (1ull << 24)  /* elements of an array */

typedef struct rpoll {
  redisAsyncContext *ac; /* NULL once hiredis let go of it */
  uv_poll_t h;
  int events;
} rpoll_t;

enum sread { SR_AGAIN, SR_MORE, SR_HIREDIS };

static void on_reply(redisAsyncContext *ac, void *r, void *privdata);
static void drop(rnode_t *n, bool silent);
/* What redisAsyncHandleRead runs once it has fed the reader: libhiredis
 * exports it (0.14 to 1.x, unchanged) but async.h does not declare it. */
void redisProcessCallbacks(redisAsyncContext *ac);

static void protocol_error(rnode_t *n, const char *what) {
  LOG_WARN("cluster_node", "node=%s event=protocol_error error=\"%s\"", n->addr, what);
  drop(n, false);
}

/* Hands hiredis bytes of replies and runs the callbacks they complete (the
 * connection may be gone after). */
static void feed(redisAsyncContext *ac, const char *b, size_t len) {
  if (redisReaderFeed(ac->c.reader, b, len) == REDIS_OK) redisProcessCallbacks(ac);
}

/* "<digits>" or "-<digits>" of len bytes: 0, or -1 when not a number. */
static int parse_ll(const char *s, size_t len, long long *out) {
  bool neg = len && s[0] == '-';
  size_t i = neg;
  if (len == i || len - i > 18) return -1;
  long long v = 0;
  for (; i < len; i++) {
    if (s[i] < '0' || s[i] > '9') return -1;
    v = v * 10 + (s[i] - '0');
  }
  *out = neg ? -v : v;
  return 0;
}

/* Walks the framing of the replies over b[0, len): *used gets the bytes of
 * the reply under way there (to its end when it ends in them; a line cut
 * short stays out). 1: a reply ended; 0: more is to come; -1: not RESP. */
static int frame(rnode_t *n, const char *b, size_t len, size_t *used) {
  size_t i = 0;
  *used = 0;
  for (;;) {
    if (n->in.bulk) {
      size_t k = len - i < n->in.bulk ? len - i : (size_t)n->in.bulk;
      i += k;
      *used = i;
      if ((n->in.bulk -= k)) return 0;
      if (--n->in.items == 0) return 1;
      continue;
    }
    const char *eol = i < len ? memchr(b + i, '\n', len - i) : NULL;
    if (!eol) return 0;
    size_t line = (size_t)(eol - (b + i)) + 1;
    long long v = 0;
    char t = b[i];
    if (line < 3 || eol[-1] != '\r') return -1;
    if ((t == '$' || t == '*') && parse_ll(b + i + 1, line - 3, &v)) return -1;
    if (!n->in.items) n->in.items = 1;
    i += line;
    *used = i;
    if (t == '+' || t == '-' || t == ':' || ((t == '$' || t == '*') && v == -1)) {
      n->in.items--;
    } else if (t == '$' && v >= 0 && (uint64_t)v <= BULK_MAX) {
      n->in.bulk = (uint64_t)v + 2;
      continue;
    } else if (t == '*' && v >= 0 && (uint64_t)v <= COUNT_MAX) {
      n->in.items += (uint64_t)v;
      n->in.items--;
    } else {
      return -1;
    }
    if (!n->in.items) return 1;
  }
}

/* The command whose reply comes next, when it has a sink (a cancelled one
 * too: its value is read and dropped, never handed to hiredis whole). */
static rcmd_t *sink_next(const redisAsyncContext *ac) {
  const redisCallback *cb = ac->replies.head;
  rcmd_t *c = cb && cb->fn == on_reply ? cb->privdata : NULL;
  return c && c->sink ? c : NULL; /* cancelled: its value is read and dropped */
}

/* The header b[0, len) ("$<len>\r\n" at the front), if whole: its bytes
 * and the value's length; 0 when not (yet) one. */
static size_t sink_header(const char *b, size_t len, size_t *vlen) {
  const char *eol = len > 3 && b[0] == '$' && b[1] != '-' ? memchr(b, '\n', len) : NULL;
  long long v;
  if (!eol || eol[-1] != '\r' || parse_ll(b + 1, (size_t)(eol - b) - 2, &v) || v < 0 ||
      (uint64_t)v > BULK_MAX)
    return 0;
  *vlen = (size_t)v;
  return (size_t)(eol - b) + 1;
}

static void sink_start(rnode_t *n, rcmd_t *c, size_t len) {
  n->in.c = c;
  n->in.len = len;
  n->in.got = 0;
  int k = c->cancelled ? 0 : c->sink(c->arg, len, n->in.iov); /* (arg may be gone) */
  size_t sum = 0;
  for (int i = 0; i < k && i < RCMD_SINK_IOV; i++) sum += n->in.iov[i].iov_len;
  n->in.niov = k > 0 && k <= RCMD_SINK_IOV && sum == len ? k : 0; /* else dropped */
}

/* Where the value's bytes from offset off go (the sink's parts past it)
 * into out: how many parts. */
static int sink_parts(const rnode_t *n, size_t off, struct iovec *out) {
  int k = 0;
  for (int i = 0; i < n->in.niov; i++) {
    size_t l = n->in.iov[i].iov_len;
    if (off >= l) {
      off -= l;
      continue;
    }
    out[k].iov_base = (uint8_t *)n->in.iov[i].iov_base + off;
    out[k++].iov_len = l - off;
    off = 0;
  }
  return k;
}

/* Bytes b[0, k) of the value being read (and its CRLF): how many it took. */
static size_t sink_take(rnode_t *n, const char *b, size_t k) {
  size_t want = n->in.len + 2 - n->in.got, body = 0;
  if (k > want) k = want;
  if (n->in.got < n->in.len) body = k < n->in.len - n->in.got ? k : n->in.len - n->in.got;
  if (body && !n->in.c->cancelled) {
    struct iovec part[RCMD_SINK_IOV];
    int np = sink_parts(n, n->in.got, part);
    size_t off = 0;
    for (int i = 0; i < np && off < body; i++) {
      size_t l = part[i].iov_len < body - off ? part[i].iov_len : body - off;
      memcpy(part[i].iov_base, b + off, l);
      off += l;
    }
  }
  for (size_t i = body; i < k; i++) n->in.crlf[n->in.got + i - n->in.len] = b[i];
  n->in.got += k;
  return k;
}

/* The value is in: its stand-in to hiredis, which runs its callback. */
static void sink_done(rpoll_t *p, rnode_t *n) {
  rcmd_t *c = n->in.c;
  n->in.c = NULL;
  if (memcmp(n->in.crlf, "\r\n", 2) != 0) {
    protocol_error(n, "a value not ended by CRLF");
    return;
  }
  c->landed = true;
  c->landed_len = n->in.len;
  c->landed_buf = n->in.niov ? n->in.iov[0].iov_base : NULL;
  feed(p->ac, "+\r\n", 3);
}

/* Reads on into the value being read: SR_MORE while the socket may have
 * more, SR_AGAIN when it has none. */
static enum sread sink_body(rpoll_t *p, rnode_t *n) {
  static uint8_t dropped[DROP_BYTES]; /* the loop's thread alone */
  struct iovec iov[RCMD_SINK_IOV + 1];
  int k = 0;
  size_t body = n->in.len > n->in.got ? n->in.len - n->in.got : 0, want = 0;
  if (body && n->in.niov && !n->in.c->cancelled) {
    k = sink_parts(n, n->in.got, iov);
    want = body;
  } else if (body) {
    iov[k].iov_base = dropped;
    iov[k++].iov_len = want = body < DROP_BYTES ? body : DROP_BYTES;
  }
  if (want == body) { /* the closing CRLF */
    size_t had = n->in.got > n->in.len ? n->in.got - n->in.len : 0;
    iov[k].iov_base = n->in.crlf + had;
    iov[k++].iov_len = 2 - had;
    want += 2 - had;
  }
  ssize_t got = readv(p->ac->c.fd, iov, k);
  if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return SR_AGAIN;
  if (got <= 0) return SR_HIREDIS; /* lost: hiredis meets it, the commands fail */
  n->in.got += (size_t)got;
  if (n->in.got == n->in.len + 2) sink_done(p, n);
  return (size_t)got < want ? SR_AGAIN : SR_MORE;
}

/* Hands on what is stashed: into a sink, or to hiredis. false when it
 * needs more bytes first (a line or a header cut short). */
static bool from_stash(rpoll_t *p, rnode_t *n) {
  const char *b = n->in.buf + n->in.head;
  size_t len = n->in.tail - n->in.head, used, vlen, h;
  rcmd_t *c = !n->in.items ? sink_next(p->ac) : NULL;
  if (c && b[0] == '$' && (len < 2 || b[1] != '-')) {
    if (!(h = sink_header(b, len, &vlen))) {
      if (!memchr(b, '\n', len) && len < PEEK_BYTES) return false; /* more to come */
      protocol_error(n, "a bad bulk length");
      return true; /* the connection is gone */
    }
    sink_start(n, c, vlen);
    n->in.head += h + sink_take(n, b + h, len - h);
    if (n->in.got == n->in.len + 2) sink_done(p, n);
    return true;
  }
  int st = frame(n, b, len, &used);
  if (st < 0) {
    protocol_error(n, "not RESP");
    return true;
  }
  if (!used) return false;
  n->in.head += used;
  feed(p->ac, b, used);
  return true;
}

/* One step of reading: SR_MORE (more may be there), SR_AGAIN (the socket
 * is empty), SR_HIREDIS (the connection is lost or not up yet: hiredis's
 * read meets it). */
static enum sread pump(rpoll_t *p) {
  redisAsyncContext *ac = p->ac;
  rnode_t *n = ac->data;
  if (!(ac->c.flags & REDIS_CONNECTED)) return SR_HIREDIS;
  if (n->in.c) return sink_body(p, n);
  if (n->in.head < n->in.tail && from_stash(p, n)) return SR_MORE;
  rcmd_t *c = n->in.head == n->in.tail && !n->in.items ? sink_next(ac) : NULL;
  if (c) { /* a value, likely: its header alone, so that the rest goes straight */
    char hdr[PEEK_BYTES];
    size_t vlen, h;
    ssize_t got = recv(ac->c.fd, hdr, sizeof hdr, MSG_PEEK);
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return SR_AGAIN;
    if (got <= 0) return SR_HIREDIS;
    if ((h = sink_header(hdr, (size_t)got, &vlen))) {
      if (read(ac->c.fd, hdr, h) != (ssize_t)h) return SR_HIREDIS; /* peeked: they are there */
      sink_start(n, c, vlen);
      return sink_body(p, n);
    }
  }
  if (n->in.head) { /* what is left goes to the front */
    memmove(n->in.buf, n->in.buf + n->in.head, n->in.tail - n->in.head);
    n->in.tail -= n->in.head;
    n->in.head = 0;
  }
  if (n->in.tail == sizeof n->in.buf) {
    protocol_error(n, "a line longer than the stash");
    return SR_AGAIN;
  }
  ssize_t got = read(ac->c.fd, n->in.buf + n->in.tail, sizeof n->in.buf - n->in.tail);
  if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return SR_AGAIN;
  if (got <= 0) return SR_HIREDIS;
  n->in.tail += (size_t)got;
  return SR_MORE;
}

static void rpoll_cb(uv_poll_t *h, int status, int events) {
  rpoll_t *p = h->data;
  if (status < 0) events = UV_READABLE; /* let hiredis meet the error */
  rnode_t *node = p->ac ? p->ac->data : NULL;
  if (node && (events & UV_READABLE)) node->heard_ms = now_ms(node); /* it speaks: not stuck */
  for (int n = 0; p->ac && (events & UV_READABLE) && n < READS_PER_WAKE; n++) {
    enum sread s = status < 0 ? SR_HIREDIS : pump(p);
    if (s == SR_AGAIN) break;
    if (s == SR_HIREDIS) {
      redisAsyncHandleRead(p->ac);
      break;
    }
  }
  if (p->ac && (events & UV_WRITABLE)) redisAsyncHandleWrite(p->ac);
}

static void rpoll_set(void *arg, int on, int off) {
  rpoll_t *p = arg;
  p->events = (p->events | on) & ~off;
  if (p->events) uv_poll_start(&p->h, p->events, rpoll_cb);
  else uv_poll_stop(&p->h);
}
static void rpoll_add_read(void *arg) { rpoll_set(arg, UV_READABLE, 0); }
static void rpoll_del_read(void *arg) { rpoll_set(arg, 0, UV_READABLE); }
static void rpoll_add_write(void *arg) { rpoll_set(arg, UV_WRITABLE, 0); }
static void rpoll_del_write(void *arg) { rpoll_set(arg, 0, UV_WRITABLE); }
static void rpoll_closed(uv_handle_t *h) { free(h->data); }
static void rpoll_cleanup(void *arg) {
  rpoll_t *p = arg;
  p->ac = NULL;
  uv_close((uv_handle_t *)&p->h, rpoll_closed);
}

static int rpoll_attach(redisAsyncContext *ac, uv_loop_t *loop) {
  rpoll_t *p = calloc(1, sizeof *p);
  if (!p) return REDIS_ERR;
  if (uv_poll_init(loop, &p->h, ac->c.fd) != 0) {
    free(p);
    return REDIS_ERR;
  }
  p->ac = ac;
  p->h.data = p;
  ac->ev.data = p;
  ac->ev.addRead = rpoll_add_read;
  ac->ev.delRead = rpoll_del_read;
  ac->ev.addWrite = rpoll_add_write;
  ac->ev.delWrite = rpoll_del_write;
  ac->ev.cleanup = rpoll_cleanup;
  return REDIS_OK;
}

void rcmd_free(rcmd_t *c) {
  if (!c) return;
  free(c->cmd);
  free(c);
}

void rnode_init(rnode_t *n, const rnode_env_t *env, const char *host, int port, uint16_t idx) {
  memset(n, 0, sizeof *n);
  n->env = env;
  snprintf(n->host, sizeof n->host, "%s", host);
  n->port = port;
  snprintf(n->addr, sizeof n->addr, "%s:%d", host, port);
  n->idx = idx;
  uv_timer_init(env->loop, &n->timer);
  n->timer.data = n;
}

bool rnode_usable(const rnode_t *n) { return now_ms(n) >= n->open_until; }

bool rnode_stuck(const rnode_t *n) {
  uint32_t ms = n->env->opts->stuck_ms;
  return ms && n->pending && now_ms(n) - n->heard_ms >= ms;
}

bool rnode_sound(const rnode_t *n) { return !n->fails && rnode_usable(n) && !rnode_stuck(n); }

/* One failure more; the breaker opens at breaker_failures in a row. */
static void breaker_fail(rnode_t *n) {
  const rcluster_opts_t *o = n->env->opts;
  if (++n->fails < o->breaker_failures) return;
  uint32_t shift = n->trips < BREAKER_MAX_SHIFT ? n->trips : BREAKER_MAX_SHIFT;
  n->open_until = now_ms(n) + ((uint64_t)o->breaker_ms << shift);
  n->trips++;
  n->env->counts->breaker_opens++;
  LOG_WARN("cluster_breaker", "node=%s state=open failures=%u open_ms=%llu", n->addr, n->fails,
           (unsigned long long)((uint64_t)o->breaker_ms << shift));
}

static void breaker_ok(rnode_t *n) {
  if (n->trips) LOG_INFO("cluster_breaker", "node=%s state=closed", n->addr);
  n->fails = 0;
  n->trips = 0;
  n->open_until = 0;
}

/* The timer watches the head of the FIFO (or the connect). */
static void on_timer(uv_timer_t *t);

static void arm(rnode_t *n) {
  const rcluster_opts_t *o = n->env->opts;
  if (n->st == RN_CONNECTING) {
    uv_timer_start(&n->timer, on_timer, o->connect_timeout_ms, 0);
  } else if (n->head) {
    uint64_t due = n->head->sent_ms + o->command_timeout_ms, now = now_ms(n);
    uv_timer_start(&n->timer, on_timer, due > now ? due - now : 0, 0);
  } else {
    uv_timer_stop(&n->timer);
  }
}

/* Lets go of the connection: every command in flight gets no reply (RC_CONN,
 * or RC_TIMEOUT when dropped for silence), the breaker counts one failure. */
static void drop(rnode_t *n, bool silent) {
  redisAsyncContext *ac = n->ac;
  n->ac = NULL;
  n->st = RN_DOWN;
  uv_timer_stop(&n->timer);
  n->env->counts->connect_errors += !silent;
  n->env->counts->timeouts += silent;
  breaker_fail(n);
  if (ac) {
    n->dropping = silent;
    redisAsyncFree(ac); /* runs the callbacks in flight with no reply, here */
    n->dropping = false;
  }
  n->env->failed(n->env->cl, n);
}

static void on_timer(uv_timer_t *t) {
  rnode_t *n = t->data;
  LOG_WARN("cluster_node", "node=%s event=%s pending=%u", n->addr,
           n->st == RN_CONNECTING ? "connect_timeout" : "command_timeout", n->pending);
  drop(n, n->st != RN_CONNECTING);
}

static void on_reply(redisAsyncContext *ac, void *r, void *privdata) {
  rnode_t *n = ac->data;
  rcmd_t *c = privdata;
  if (n->in.c == c) n->in.c = NULL; /* lost with its value half read */
  /* Replies come in order: c is the head. */
  n->head = c->next;
  if (!n->head) n->tail = NULL;
  n->pending--;
  c->next = NULL;
  c->node = NULL;
  enum rc_status why = n->dropping ? RC_TIMEOUT : RC_CONN;
  if (r) {
    breaker_ok(n);
  } else if (n->ac == ac) { /* the connection is going: the first to know says so */
    n->ac = NULL;
    n->st = RN_DOWN;
    uv_timer_stop(&n->timer);
    n->env->counts->connect_errors++;
    breaker_fail(n);
    n->env->failed(n->env->cl, n);
  }
  if (n->ac == ac) arm(n);
  if (r && c->landed) { /* the stand-in for a value read into its sink */
    redisReply v = {.type = REDIS_REPLY_STRING, .len = c->landed_len, .str = c->landed_buf};
    c->landed = false; /* a redirection sends it again */
    n->env->reply(n->env->cl, c, &v, why);
    return;
  }
  n->env->reply(n->env->cl, c, r, why);
}

static void on_connect(const redisAsyncContext *ac, int status) {
  rnode_t *n = ac->data;
  if (n->ac != ac) return;
  if (status != REDIS_OK) { /* hiredis frees ac after this */
    LOG_WARN("cluster_node", "node=%s event=connect_failed error=\"%s\"", n->addr, ac->errstr);
    n->ac = NULL;
    n->st = RN_DOWN;
    uv_timer_stop(&n->timer);
    n->env->counts->connect_errors++;
    breaker_fail(n);
    n->env->failed(n->env->cl, n);
    return;
  }
  n->st = RN_READY;
  n->env->counts->connects++;
  LOG_DEBUG("cluster_node", "node=%s event=connected", n->addr);
  arm(n);
}

static void on_disconnect(const redisAsyncContext *ac, int status) {
  rnode_t *n = ac->data;
  if (n->ac != ac) return; /* dropped by us, or already known lost */
  n->ac = NULL;
  n->st = RN_DOWN;
  uv_timer_stop(&n->timer);
  if (status != REDIS_OK) {
    n->env->counts->connect_errors++;
    breaker_fail(n);
    n->env->failed(n->env->cl, n);
  }
}

/* Queues c on the connection (hiredis buffers it until connected). */
static int queue(rnode_t *n, rcmd_t *c) {
  if (c->asking &&
      redisAsyncFormattedCommand(n->ac, NULL, NULL, "*1\r\n$6\r\nASKING\r\n", 16) != REDIS_OK)
    return -1;
  if (redisAsyncFormattedCommand(n->ac, on_reply, c, c->cmd, c->len) != REDIS_OK) return -1;
  c->node = n;
  c->sent_ms = now_ms(n);
  c->next = NULL;
  if (n->tail) n->tail->next = c;
  else n->head = c;
  n->tail = c;
  if (n->pending == 0) n->heard_ms = c->sent_ms; /* its silence counts from now */
  if (n->pending++ == 0 && n->st == RN_READY) arm(n);
  return 0;
}

/* An internal command of the connection (AUTH, READONLY): its reply is
 * only logged when it is an error. */
static void on_setup(void *arg, enum rc_status st, struct redisReply *r) {
  rnode_t *n = arg;
  if (st == RC_OK && r->type == REDIS_REPLY_ERROR)
    LOG_WARN("cluster_node", "node=%s event=setup_refused error=\"%.*s\"", n->addr,
             (int)(r->len < 200 ? r->len : 200), r->str);
}

static int setup(rnode_t *n, const char **argv, int argc) {
  char *cmd = NULL;
  int len = redisFormatCommandArgv(&cmd, argc, argv, NULL);
  rcmd_t *c = len > 0 ? calloc(1, sizeof *c) : NULL;
  if (!c) {
    free(cmd);
    return -1;
  }
  *c = (rcmd_t){.cmd = cmd, .len = (size_t)len, .internal = true, .fn = on_setup, .arg = n};
  if (queue(n, c) == 0) return 0;
  rcmd_free(c);
  return -1;
}

static int connect_node(rnode_t *n) {
  const rcluster_opts_t *o = n->env->opts;
  redisAsyncContext *ac = redisAsyncConnect(n->host, n->port);
  if (!ac) return -1;
  if (ac->err) {
    LOG_WARN("cluster_node", "node=%s event=connect_failed error=\"%s\"", n->addr, ac->errstr);
    redisAsyncFree(ac);
    return -1;
  }
  ac->data = n;
  n->in.head = n->in.tail = 0; /* nothing of an old connection's replies */
  n->in.items = n->in.bulk = 0;
  n->in.c = NULL;
  if (rpoll_attach(ac, n->env->loop) != REDIS_OK) {
    redisAsyncFree(ac);
    return -1;
  }
  redisAsyncSetConnectCallback(ac, on_connect);
  redisAsyncSetDisconnectCallback(ac, on_disconnect);
  n->ac = ac;
  n->st = RN_CONNECTING;
  arm(n);
  int rc = 0;
  if (o->password && *o->password) {
    const char *auth[3] = {"AUTH", o->user && *o->user ? o->user : o->password, o->password};
    rc = setup(n, auth, o->user && *o->user ? 3 : 2);
  }
  const char *ro[1] = {"READONLY"};
  if (rc == 0 && n->replica) rc = setup(n, ro, 1);
  if (rc) {
    n->ac = NULL;
    n->st = RN_DOWN;
    uv_timer_stop(&n->timer);
    redisAsyncFree(ac);
  }
  return rc;
}

enum rc_status rnode_send(rnode_t *n, rcmd_t *c) {
  if (!rnode_usable(n)) return RC_BREAKER;
  /* Half open: a node that failed gets one command until it answers. */
  if (n->fails && n->st != RN_READY && n->pending) return RC_BREAKER;
  if (!n->ac && connect_node(n) != 0) {
    n->env->counts->connect_errors++;
    breaker_fail(n);
    return RC_CONN;
  }
  return queue(n, c) == 0 ? RC_OK : RC_CONN;
}

void rnode_probe(rnode_t *n) {
  static const char ping[] = "*1\r\n$4\r\nPING\r\n";
  if (!n->fails || n->pending || !rnode_usable(n)) return; /* sound, on trial, or open */
  rcmd_t *c = calloc(1, sizeof *c);
  char *cmd = malloc(sizeof ping - 1);
  if (!c || !cmd) {
    free(c);
    free(cmd);
    return;
  }
  memcpy(cmd, ping, sizeof ping - 1);
  *c = (rcmd_t){.cmd = cmd, .len = sizeof ping - 1, .internal = true}; /* no fn: any reply does */
  if (rnode_send(n, c) != RC_OK) rcmd_free(c);
  else LOG_DEBUG("cluster_node", "node=%s event=probe failures=%u", n->addr, n->fails);
}

void rnode_close(rnode_t *n, uv_close_cb close_cb) {
  redisAsyncContext *ac = n->ac;
  n->ac = NULL;
  n->st = RN_DOWN;
  if (ac) redisAsyncFree(ac);
  uv_close((uv_handle_t *)&n->timer, close_cb);
}
