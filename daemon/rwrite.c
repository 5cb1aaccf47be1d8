/* rwrite.c: the write-behind queue of the cluster tier (remote.h draws the
 * path). The engine's hooks only queue (they run inside engine calls); a
 * timer on a later loop turn sends, each page exported from the pool
 * (cluster_write = indexed: a page indexed then reclaimed before its turn
 * is dropped as gone) or from the copy the reclaim hook took (evicted).
 *
 *   q: ring of cluster_queue_pages entries   head -> [e0 e1 e2 ...] <- push
 *      full: the new page is dropped (tier_queue_drops_total)
 *   sent while the bytes in flight stay under cluster_inflight_bytes, at
 *   most SEND_TURN_BYTES of values encoded per loop turn (the loop serves
 *   requests between two batches)
 *   a failed write (timeout, connection, breaker, an error reply) goes
 *   back to the tail, due after cluster_backoff_ms << tries, until
 *   cluster_retries; an OOM reply (a full cluster that evicts nothing)
 *   drops it at once
 */
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "rslot.h"
#include "rtier.h"

#define SEND_TURN_BYTES (8u << 20)

/* The page as the reclaim hook saw it (cluster_write = evicted). */
typedef struct wcopy {
  uint8_t parent[32];
  bool has_parent;
  uint32_t page_tokens;
  uint64_t nbytes;
  uint8_t data[];       /* page_tokens ids, then nbytes of page */
} wcopy_t;

struct wentry {
  uint32_t cache_id;
  uint8_t hash[32];
  uint8_t tries;
  uint64_t not_before;  /* uv_now before which it is not sent (a retry) */
  wcopy_t *copy;        /* evicted: the page (owned); indexed: NULL */
};

typedef struct wjob {
  remote_t *r;
  wentry_t e;
  size_t vlen;          /* value bytes */
  struct wjob *prev, *next; /* r->jobs */
} wjob_t;

static void pump(remote_t *r);

static void on_kick(uv_timer_t *t) { pump(t->data); }

static void kick(remote_t *r, uint64_t in_ms) {
  if (r->stopping) return;
  if (uv_is_active((uv_handle_t *)&r->kick) && uv_timer_get_due_in(&r->kick) <= in_ms) return;
  uv_timer_start(&r->kick, on_kick, in_ms, 0);
}

static void drop(remote_t *r, wentry_t *e) {
  r->st.queue_drops++;
  free(e->copy);
  e->copy = NULL;
}

static void push(remote_t *r, wentry_t *e) {
  if (r->qlen == r->qcap || r->stopping) {
    drop(r, e);
    return;
  }
  r->q[(r->qhead + r->qlen) % r->qcap] = *e;
  r->qlen++;
  kick(r, e->not_before > uv_now(r->srv->loop) ? e->not_before - uv_now(r->srv->loop) : 0);
}

void rwrite_indexed(void *ctx, uint32_t cache_id, const uint8_t hash[32]) {
  remote_t *r = ctx;
  wentry_t e = {cache_id, {0}, 0, 0, NULL};
  memcpy(e.hash, hash, 32);
  push(r, &e);
}

void rwrite_reclaimed(void *ctx, const engine_page_t *pg) {
  remote_t *r = ctx;
  wentry_t e = {pg->cache_id, {0}, 0, 0, NULL};
  if (r->qlen == r->qcap) {
    drop(r, &e);
    return;
  }
  size_t ids = (size_t)pg->page_tokens * 4;
  if (!(e.copy = malloc(sizeof *e.copy + ids + pg->nbytes))) {
    drop(r, &e);
    return;
  }
  memcpy(e.hash, pg->hash, 32);
  memcpy(e.copy->parent, pg->parent, 32);
  e.copy->has_parent = pg->has_parent;
  e.copy->page_tokens = pg->page_tokens;
  e.copy->nbytes = pg->nbytes;
  memcpy(e.copy->data, pg->tokens, ids);
  memcpy(e.copy->data + ids, pg->bytes, pg->nbytes);
  push(r, &e);
}

/* A failed write: back to the queue after its backoff, or dropped. */
static void retry(remote_t *r, wentry_t *e) {
  uint32_t max = r->srv->cfg.cluster_retries;
  if (e->tries >= max) {
    drop(r, e);
    return;
  }
  uint32_t shift = e->tries < 16 ? e->tries : 16;
  e->not_before = uv_now(r->srv->loop) + ((uint64_t)r->srv->cfg.cluster_backoff_ms << shift);
  e->tries++;
  r->st.write_retries++;
  push(r, e);
}

static void job_unlink(remote_t *r, wjob_t *j) {
  if (j->prev) j->prev->next = j->next;
  else r->jobs = j->next;
  if (j->next) j->next->prev = j->prev;
  r->inflight--;
  r->inflight_bytes -= j->vlen;
}

static void on_written(void *arg, enum rc_status st, struct redisReply *reply) {
  wjob_t *j = arg;
  remote_t *r = j->r;
  job_unlink(r, j);
  if (st == RC_OK && reply->type == REDIS_REPLY_STATUS) {
    r->st.writes++;
    r->st.written_bytes += j->vlen;
    free(j->e.copy);
  } else {
    remote_error(r, st, reply);
    bool oom = st == RC_OK && reply->type == REDIS_REPLY_ERROR && strncmp(reply->str, "OOM", 3) == 0;
    if (oom) drop(r, &j->e);
    else retry(r, &j->e);
  }
  free(j);
  pump(r);
}

/* The page of e as a tier stores it: from the pool, or e's copy. */
static bool page_of(remote_t *r, const wentry_t *e, engine_page_t *pg) {
  if (!e->copy) return engine_page_export(r->srv->eng, e->cache_id, e->hash, pg) == 0;
  const wcopy_t *c = e->copy;
  *pg = (engine_page_t){.cache_id = e->cache_id, .has_parent = c->has_parent,
                        .page_tokens = c->page_tokens, .tokens = (const uint32_t *)(const void *)c->data,
                        .bytes = c->data + (size_t)c->page_tokens * 4, .nbytes = c->nbytes};
  memcpy(pg->hash, e->hash, 32);
  memcpy(pg->parent, c->parent, 32);
  return true;
}

/* SET key value [EX ttl], the value encoded in place: RESP bytes (new). */
static char *set_cmd(remote_t *r, const rvalue_cache_t *rc, const engine_page_t *pg,
                     size_t *len, size_t *vlen, uint16_t *slot) {
  char key[RVALUE_KEY_MAX], ttl[16], head[160];
  size_t klen = rvalue_key(rc, r->sec, pg->hash, key);
  uint32_t ttl_s = r->srv->cfg.cluster_ttl_s;
  int tl = snprintf(ttl, sizeof ttl, "%u", ttl_s);
  *vlen = rvalue_size(rc);
  int hl = snprintf(head, sizeof head, "*%d\r\n$3\r\nSET\r\n$%zu\r\n%s\r\n$%zu\r\n", ttl_s ? 5 : 3,
                    klen, key, *vlen);
  char tail[48];
  int xl = ttl_s ? snprintf(tail, sizeof tail, "\r\n$2\r\nEX\r\n$%d\r\n%s\r\n", tl, ttl)
                 : snprintf(tail, sizeof tail, "\r\n");
  char *cmd = malloc((size_t)hl + *vlen + (size_t)xl);
  if (!cmd) return NULL;
  memcpy(cmd, head, (size_t)hl);
  if (rvalue_encode(rc, r->sec, pg, (uint8_t *)cmd + hl) != 0) {
    free(cmd);
    return NULL;
  }
  memcpy(cmd + hl + *vlen, tail, (size_t)xl);
  *len = (size_t)hl + *vlen + (size_t)xl;
  *slot = rslot_of(key, klen);
  return cmd;
}

/* Sends e (taken); returns the value bytes encoded. */
static size_t send_one(remote_t *r, wentry_t *e) {
  const rvalue_cache_t *rc = remote_cache(r, e->cache_id);
  engine_page_t pg;
  if (!rc || !page_of(r, e, &pg)) { /* its cache dropped, or the page reclaimed */
    drop(r, e);
    return 0;
  }
  size_t len, vlen;
  uint16_t slot;
  char *cmd = set_cmd(r, rc, &pg, &len, &vlen, &slot);
  wjob_t *j = cmd ? malloc(sizeof *j) : NULL;
  if (!j) {
    free(cmd);
    drop(r, e);
    return 0;
  }
  *j = (wjob_t){r, *e, vlen, NULL, r->jobs};
  enum rc_status st;
  if (!rcluster_send(r->cl, slot, false, cmd, len, on_written, j, &st)) {
    remote_error(r, st, NULL);
    retry(r, &j->e);
    free(j);
    return vlen;
  }
  if (r->jobs) r->jobs->prev = j;
  r->jobs = j;
  r->inflight++;
  r->inflight_bytes += vlen;
  return vlen;
}

static void pump(remote_t *r) {
  uint64_t budget = SEND_TURN_BYTES, now = uv_now(r->srv->loop);
  while (r->qlen && !r->stopping && r->inflight_bytes < r->srv->cfg.cluster_inflight_bytes) {
    wentry_t *head = &r->q[r->qhead];
    if (head->not_before > now) {
      kick(r, head->not_before - now);
      return;
    }
    if (!budget) { /* the rest on the next turn */
      kick(r, 0);
      return;
    }
    wentry_t e = *head;
    r->qhead = (r->qhead + 1) % r->qcap;
    r->qlen--;
    size_t v = send_one(r, &e);
    budget = v < budget ? budget - v : 0;
  }
}

int rwrite_start(remote_t *r) {
  r->qcap = r->srv->cfg.cluster_queue_pages;
  r->q = calloc(r->qcap, sizeof *r->q);
  return r->q ? 0 : -1;
}

void rwrite_stop(remote_t *r) {
  for (uint32_t i = 0; i < r->qlen; i++) free(r->q[(r->qhead + i) % r->qcap].copy);
  free(r->q);
  r->q = NULL;
  r->qlen = 0;
  while (r->jobs) {
    wjob_t *j = r->jobs;
    job_unlink(r, j);
    free(j->e.copy);
    free(j);
  }
}
