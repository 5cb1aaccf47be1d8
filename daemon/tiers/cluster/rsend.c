/* rsend.c: the write-behind's sender thread (rsend.h draws it): the
 * WORK_NET class of the daemon's one work queue (work.h), one thread, so
 * that the connections below are its own. */
#include "rsend.h"

#include <errno.h>
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "work.h"

#define MAX_CONNS 64
#define MAX_REDIRECTS 5

typedef struct sconn {
  char host[64];
  int port;
  redisContext *ctx;      /* NULL: not connected */
  uint64_t down_until_ms; /* failed lately: not tried before */
} sconn_t;

struct rsend {
  work_t *work;
  void (*done_fn)(void *ctx, rsend_job_t *j);
  void *done_ctx;
  /* the thread's own */
  rvalue_secret_t *sec;
  char *user, *password;
  uint32_t connect_ms, command_ms, down_ms;
  sconn_t conns[MAX_CONNS];
  uint32_t nconns;
  char *buf;                  /* the command being sent */
  size_t cap;
};

static uint64_t mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static struct timeval tv_of(uint32_t ms) {
  return (struct timeval){(time_t)(ms / 1000u), (suseconds_t)(ms % 1000u) * 1000};
}

/* ---- the thread's connections ----------------------------------------------------- */

static void conn_drop(rsend_t *s, sconn_t *c) {
  redisFree(c->ctx);
  c->ctx = NULL;
  c->down_until_ms = mono_ms() + s->down_ms;
}

/* The connection to host:port, made (and authenticated) if need be; NULL
 * when it cannot be, or failed within down_ms. */
static sconn_t *conn_get(rsend_t *s, const char *host, int port) {
  sconn_t *c = NULL;
  for (uint32_t i = 0; i < s->nconns && !c; i++)
    if (s->conns[i].port == port && strcmp(s->conns[i].host, host) == 0) c = &s->conns[i];
  if (!c) {
    if (s->nconns == MAX_CONNS) { /* reuse one not connected */
      for (uint32_t i = 0; i < s->nconns && !c; i++)
        if (!s->conns[i].ctx) c = &s->conns[i];
      if (!c) return NULL;
    } else {
      c = &s->conns[s->nconns++];
    }
    memset(c, 0, sizeof *c);
    snprintf(c->host, sizeof c->host, "%s", host);
    c->port = port;
  }
  if (c->ctx) return c;
  if (mono_ms() < c->down_until_ms) return NULL;
  c->ctx = redisConnectWithTimeout(host, port, tv_of(s->connect_ms));
  if (!c->ctx || c->ctx->err || redisSetTimeout(c->ctx, tv_of(s->command_ms)) != REDIS_OK) {
    conn_drop(s, c);
    return NULL;
  }
  if (s->password && *s->password) {
    redisReply *r = s->user && *s->user
                        ? redisCommand(c->ctx, "AUTH %s %s", s->user, s->password)
                        : redisCommand(c->ctx, "AUTH %s", s->password);
    bool ok = r && r->type == REDIS_REPLY_STATUS;
    freeReplyObject(r);
    if (!ok) {
      conn_drop(s, c);
      return NULL;
    }
  }
  return c;
}

/* ---- one SET ------------------------------------------------------------------------ */

/* SET key value [EX ttl] as RESP into s->buf, the value encoded in place:
 * its length, or 0 (out of memory, or a page of another shape). */
static size_t format_set(rsend_t *s, rsend_job_t *j) {
  char head[160], tail[48], ttl[16];
  j->vlen = rvalue_size(&j->rc);
  int tl = snprintf(ttl, sizeof ttl, "%u", j->ttl_s);
  int hl = snprintf(head, sizeof head, "*%d\r\n$3\r\nSET\r\n$%zu\r\n%.*s\r\n$%zu\r\n",
                    j->ttl_s ? 5 : 3, j->klen, (int)j->klen, j->key, j->vlen);
  int xl = j->ttl_s ? snprintf(tail, sizeof tail, "\r\n$2\r\nEX\r\n$%d\r\n%s\r\n", tl, ttl)
                    : snprintf(tail, sizeof tail, "\r\n");
  size_t len = (size_t)hl + j->vlen + (size_t)xl;
  if (len > s->cap) {
    char *b = realloc(s->buf, len);
    if (!b) return 0;
    s->buf = b;
    s->cap = len;
  }
  memcpy(s->buf, head, (size_t)hl);
  if (rvalue_encode(&j->rc, s->sec, &j->pg, (uint8_t *)s->buf + hl) != 0) return 0;
  memcpy(s->buf + hl + j->vlen, tail, (size_t)xl);
  return len;
}

/* Writes the command (after ASKING) straight from s->buf: hiredis would
 * copy a page-sized value into its output buffer first. false: the write
 * failed or timed out (errno says which). */
static bool write_all(rsend_t *s, sconn_t *c, size_t len, bool asking) {
  static const char ask[] = "*1\r\n$6\r\nASKING\r\n";
  struct iovec iov[2] = {{(void *)ask, asking ? sizeof ask - 1 : 0}, {s->buf, len}};
  struct iovec *v = iov;
  int n = 2;
  while (n > 0) {
    if (v->iov_len == 0) {
      v++, n--;
      continue;
    }
    ssize_t w = writev(c->ctx->fd, v, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return false;
    size_t left = (size_t)w;
    while (n > 0 && left >= v->iov_len) left -= v->iov_len, v++, n--;
    if (n > 0) {
      v->iov_base = (char *)v->iov_base + left;
      v->iov_len -= left;
    }
  }
  return true;
}

/* "MOVED 3999 127.0.0.1:6381" into slot, host and port. */
static bool redirect(const redisReply *r, size_t skip, uint16_t *slot, char *host, size_t hl,
                     int *port) {
  char addr[96];
  long sl;
  if (sscanf(r->str + skip, "%ld %95s", &sl, addr) != 2 || sl < 0 || sl >= 16384) return false;
  char *colon = strrchr(addr, ':');
  if (!colon || colon == addr || (size_t)(colon - addr) >= hl) return false;
  *colon = '\0';
  memcpy(host, addr, (size_t)(colon - addr) + 1); /* fits: checked above */
  *port = atoi(colon + 1);
  *slot = (uint16_t)sl;
  return *port > 0 && *port < 65536;
}

static enum rsend_result send_set(rsend_t *s, rsend_job_t *j, size_t len) {
  char host[64];
  int port = j->port;
  bool asking = false;
  snprintf(host, sizeof host, "%s", j->host);
  for (int tries = 0; tries <= MAX_REDIRECTS; tries++) {
    sconn_t *c = conn_get(s, host, port);
    if (!c) return RS_CONN;
    redisReply *r = NULL;
    bool ok = write_all(s, c, len, asking);
    if (ok && asking) { /* ASKING's own reply first */
      ok = redisGetReply(c->ctx, (void **)&r) == REDIS_OK && r;
      freeReplyObject(r);
      r = NULL;
    }
    if (!ok || redisGetReply(c->ctx, (void **)&r) != REDIS_OK || !r) {
      bool timeout = errno == EAGAIN || errno == EWOULDBLOCK; /* SO_RCVTIMEO, SO_SNDTIMEO */
      conn_drop(s, c);
      return timeout ? RS_TIMEOUT : RS_CONN;
    }
    enum rsend_result res = RS_ERROR;
    bool again = false;
    if (r->type == REDIS_REPLY_STATUS) {
      res = RS_OK;
    } else if (r->type == REDIS_REPLY_ERROR && strncmp(r->str, "MOVED ", 6) == 0) {
      again = redirect(r, 6, &j->moved_slot, host, sizeof host, &port);
      if (again) {
        j->moved = true;
        snprintf(j->moved_host, sizeof j->moved_host, "%s", host);
        j->moved_port = port;
        asking = false;
      }
    } else if (r->type == REDIS_REPLY_ERROR && strncmp(r->str, "ASK ", 4) == 0) {
      uint16_t slot;
      again = asking = redirect(r, 4, &slot, host, sizeof host, &port);
      j->asks += again;
    } else if (r->type == REDIS_REPLY_ERROR && strncmp(r->str, "OOM", 3) == 0) {
      res = RS_OOM;
    }
    freeReplyObject(r);
    if (!again) return res;
  }
  return RS_REDIRECTS;
}

/* ---- the thread and the hand-offs: the work queue's WORK_NET class ---------------- */

static void send_run(work_job_t *w, unsigned part, unsigned nparts) {
  (void)part, (void)nparts;
  rsend_job_t *j = (rsend_job_t *)(void *)w;
  rsend_t *s = j->sender;
  size_t len = format_set(s, j);
  j->res = len ? send_set(s, j, len) : RS_ERROR;
}

static void send_done(work_job_t *w) {
  rsend_job_t *j = (rsend_job_t *)(void *)w;
  j->sender->done_fn(j->sender->done_ctx, j);
}

static void send_cancel(work_job_t *w) {
  rsend_job_t *j = (rsend_job_t *)(void *)w;
  j->res = RS_CANCELLED;
  j->sender->done_fn(j->sender->done_ctx, j);
}

rsend_t *rsend_new(work_t *work, const rsend_opts_t *o,
                   void (*done)(void *ctx, rsend_job_t *j), void *ctx) {
  rsend_t *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  s->work = work;
  s->done_fn = done;
  s->done_ctx = ctx;
  s->connect_ms = o->connect_timeout_ms;
  s->command_ms = o->command_timeout_ms;
  s->down_ms = o->down_ms;
  s->sec = rvalue_secret_new(o->secret, o->secret_len);
  s->user = o->user ? strdup(o->user) : NULL;
  s->password = o->password ? strdup(o->password) : NULL;
  char why[256];
  if (!s->sec || (o->user && !s->user) || (o->password && !s->password) ||
      work_threads(work, WORK_NET, 1, why, sizeof why) != 0) {
    rsend_stop(s);
    return NULL;
  }
  return s;
}

void rsend_submit(rsend_t *s, rsend_job_t *j) {
  j->sender = s;
  j->wj = (work_job_t){.run = send_run, .done = send_done, .cls = WORK_NET};
  work_submit(s->work, &j->wj);
}

void rsend_stop(rsend_t *s) {
  if (!s) return;
  /* Waits for the SET in progress (at most the command timeout); the jobs
   * not begun come back cancelled, then those it finished. */
  work_stop(s->work, WORK_NET, false, send_cancel);
  work_reap(s->work);
  for (uint32_t i = 0; i < s->nconns; i++) /* its thread's, and it is gone */
    if (s->conns[i].ctx) redisFree(s->conns[i].ctx);
  rvalue_secret_free(s->sec);
  if (s->password) explicit_bzero(s->password, strlen(s->password));
  free(s->user);
  free(s->password);
  free(s->buf);
  free(s);
}
