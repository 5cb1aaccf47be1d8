/* rnode.c: one Redis node's connection, its commands in flight, their
 * timeout and the node's circuit breaker (rnode.h draws the states). */
#include "rnode.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>

#include "log.h"

#define BREAKER_MAX_SHIFT 6 /* an open breaker waits at most 64x breaker_ms */

static uint64_t now_ms(const rnode_t *n) { return uv_now(rcluster_loop(n->cl)); }

/* ---- hiredis on the loop ---------------------------------------------------------
 * hiredis's own libuv adapter (adapters/libuv.h) reads 16 KiB a wakeup (its
 * redisBufferRead), so a page-sized value costs dozens of loop turns; this
 * one reads on while the socket has bytes, up to READS_PER_WAKE reads, then
 * lets the other handles of the loop run. */
#define READS_PER_WAKE 64

typedef struct rpoll {
  redisAsyncContext *ac; /* NULL once hiredis let go of it */
  uv_poll_t h;
  int events;
} rpoll_t;

static void rpoll_cb(uv_poll_t *h, int status, int events) {
  rpoll_t *p = h->data;
  if (status < 0) events = UV_READABLE; /* let hiredis meet the error */
  for (int n = 0; p->ac && (events & UV_READABLE) && n < READS_PER_WAKE; n++) {
    redisAsyncHandleRead(p->ac);
    int avail = 0;
    if (!p->ac || ioctl(p->ac->c.fd, FIONREAD, &avail) != 0 || avail <= 0) break;
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

void rnode_init(rnode_t *n, rcluster_t *cl, const char *host, int port, uint16_t idx) {
  memset(n, 0, sizeof *n);
  n->cl = cl;
  snprintf(n->host, sizeof n->host, "%s", host);
  n->port = port;
  snprintf(n->addr, sizeof n->addr, "%s:%d", host, port);
  n->idx = idx;
  uv_timer_init(rcluster_loop(cl), &n->timer);
  n->timer.data = n;
}

bool rnode_usable(const rnode_t *n) { return now_ms(n) >= n->open_until; }

/* One failure more; the breaker opens at breaker_failures in a row. */
static void breaker_fail(rnode_t *n) {
  const rcluster_opts_t *o = rcluster_opts(n->cl);
  if (++n->fails < o->breaker_failures) return;
  uint32_t shift = n->trips < BREAKER_MAX_SHIFT ? n->trips : BREAKER_MAX_SHIFT;
  n->open_until = now_ms(n) + ((uint64_t)o->breaker_ms << shift);
  n->trips++;
  rcluster_counts_rw(n->cl)->breaker_opens++;
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
  const rcluster_opts_t *o = rcluster_opts(n->cl);
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
  rcluster_counts_rw(n->cl)->connect_errors += !silent;
  rcluster_counts_rw(n->cl)->timeouts += silent;
  breaker_fail(n);
  if (ac) {
    n->dropping = silent;
    redisAsyncFree(ac); /* runs the callbacks in flight with no reply, here */
    n->dropping = false;
  }
  rcluster_node_failed(n->cl, n);
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
    rcluster_counts_rw(n->cl)->connect_errors++;
    breaker_fail(n);
    rcluster_node_failed(n->cl, n);
  }
  if (n->ac == ac) arm(n);
  rcluster_reply(n->cl, c, r, why);
}

static void on_connect(const redisAsyncContext *ac, int status) {
  rnode_t *n = ac->data;
  if (n->ac != ac) return;
  if (status != REDIS_OK) { /* hiredis frees ac after this */
    LOG_WARN("cluster_node", "node=%s event=connect_failed error=\"%s\"", n->addr, ac->errstr);
    n->ac = NULL;
    n->st = RN_DOWN;
    uv_timer_stop(&n->timer);
    rcluster_counts_rw(n->cl)->connect_errors++;
    breaker_fail(n);
    rcluster_node_failed(n->cl, n);
    return;
  }
  n->st = RN_READY;
  rcluster_counts_rw(n->cl)->connects++;
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
    rcluster_counts_rw(n->cl)->connect_errors++;
    breaker_fail(n);
    rcluster_node_failed(n->cl, n);
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
  const rcluster_opts_t *o = rcluster_opts(n->cl);
  redisAsyncContext *ac = redisAsyncConnect(n->host, n->port);
  if (!ac) return -1;
  if (ac->err) {
    LOG_WARN("cluster_node", "node=%s event=connect_failed error=\"%s\"", n->addr, ac->errstr);
    redisAsyncFree(ac);
    return -1;
  }
  ac->data = n;
  ac->c.reader->maxbuf = 0; /* keep the read buffer: values are page-sized */
  if (rpoll_attach(ac, rcluster_loop(n->cl)) != REDIS_OK) {
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
    rcluster_counts_rw(n->cl)->connect_errors++;
    breaker_fail(n);
    return RC_CONN;
  }
  return queue(n, c) == 0 ? RC_OK : RC_CONN;
}

void rnode_close(rnode_t *n, uv_close_cb close_cb) {
  redisAsyncContext *ac = n->ac;
  n->ac = NULL;
  n->st = RN_DOWN;
  if (ac) redisAsyncFree(ac);
  uv_close((uv_handle_t *)&n->timer, close_cb);
}
