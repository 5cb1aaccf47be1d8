/* rwrite.c: the write-behind queue of the cluster tier (remote.h draws the
 * path). The engine's hooks only queue (they run inside engine calls); a
 * timer on a later loop turn hands the pages to the sender thread
 * (rsend.c), which encodes each value and SETs it off the loop.
 *
 *   q: ring of cluster_queue_pages entries   head -> [e0 e1 e2 ...] <- push
 *      full: the new page is dropped (tier_queue_drops_total)
 *   handed over while the value bytes in flight stay under
 *   cluster_inflight_bytes and a sixteenth of the pool, at most
 *   SEND_TURN_JOBS a loop turn; each page
 *   held meanwhile (engine_page_hold: its bytes stay as they are while the
 *   sender reads them), or, with cluster_write = evicted, the copy the
 *   reclaim hook took; a page reclaimed before its turn is dropped as gone
 *   a failed write (timeout, connection, breaker, an error reply) goes
 *   back to the tail, due after cluster_backoff_ms << tries, until
 *   cluster_retries; an OOM reply (a full cluster that evicts nothing)
 *   drops it at once
 */
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "rsend.h"
#include "rslot.h"
#include "rtier.h"

#define SEND_TURN_JOBS 256u /* handed to the sender per loop turn */

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

/* A write on its way: the loop's half (the page held, the entry to retry),
 * the sender's job right after it. */
typedef struct wjob {
  remote_t *r;
  wentry_t e;
  engine_hold_t *hold;  /* the pool page the sender reads (indexed) */
  size_t vlen;          /* value bytes, counted in flight */
  struct wjob *prev, *next; /* r->jobs */
} wjob_t;

static rsend_job_t *job_of(wjob_t *w) { return (rsend_job_t *)(void *)(w + 1); }

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
  uint64_t now = uv_now(r->srv->loop);
  kick(r, e->not_before > now ? e->not_before - now : 0);
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
  if (!(e.copy = malloc(sizeof *e.copy + ids + pg->data_bytes))) {
    drop(r, &e);
    return;
  }
  memcpy(e.hash, pg->hash, 32);
  memcpy(e.copy->parent, pg->parent, 32);
  e.copy->has_parent = !pg->head;
  e.copy->page_tokens = pg->page_tokens;
  e.copy->nbytes = pg->data_bytes;
  memcpy(e.copy->data, pg->tokens, ids);
  memcpy(e.copy->data + ids, pg->bytes, pg->data_bytes);
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

/* The event stream: the page is in the cluster now (doc/events.md). The
 * cluster drops values on its own (TTL, allkeys-lru), so no removal
 * follows: a router takes a "REMOTE" page as a hint for cluster_ttl_s. */
static void stored_event(remote_t *r, const wjob_t *w, const rsend_job_t *j) {
  engine_t *eng = r->srv->eng;
  kvc_cache_info_t ci;
  uint32_t tenant;
  if (!engine_events_on(eng) || engine_cache_info(eng, w->e.cache_id, &ci) ||
      engine_cache_tenant(eng, w->e.cache_id, &tenant))
    return; /* off, or its cache is gone */
  engine_events_tier(eng, ENGINE_EV_STORED, ENGINE_MEDIUM_REMOTE, tenant, ci.name,
                     j->pg.page_tokens, w->e.hash, !j->pg.head ? j->pg.parent : NULL,
                     j->ids);
}

static void job_unlink(remote_t *r, wjob_t *w) {
  if (w->prev) w->prev->next = w->next;
  else r->jobs = w->next;
  if (w->next) w->next->prev = w->prev;
  r->inflight--;
  r->inflight_bytes -= w->vlen;
}

void rwrite_done(void *ctx, rsend_job_t *j) {
  remote_t *r = ctx;
  wjob_t *w = j->owner;
  job_unlink(r, w);
  engine_page_release(r->srv->eng, w->hold);
  if (r->cl && j->moved) rcluster_moved(r->cl, j->moved_slot, j->moved_host, j->moved_port);
  if (r->cl && j->asks) rcluster_asked(r->cl, j->asks);
  static const enum tier_err kinds[] = {
      [RS_TIMEOUT] = TIER_ERR_timeout, [RS_CONN] = TIER_ERR_connection, [RS_OOM] = TIER_ERR_oom,
      [RS_ERROR] = TIER_ERR_server,    [RS_REDIRECTS] = TIER_ERR_redirects};
  switch (j->res) {
  case RS_OK:
    r->st.writes++;
    r->st.written_bytes += j->vlen;
    stored_event(r, w, j);
    free(w->e.copy);
    break;
  case RS_CANCELLED: /* stopping */
    free(w->e.copy);
    break;
  case RS_OOM: /* a full cluster that evicts nothing: trying again would not help */
    r->st.errors[TIER_ERR_oom]++;
    drop(r, &w->e);
    break;
  default:
    r->st.errors[kinds[j->res]]++;
    retry(r, &w->e);
    break;
  }
  free(w);
  pump(r);
}

/* The page of w's entry as a tier stores it: held in the pool, or the copy. */
static bool page_of(remote_t *r, wjob_t *w, engine_page_t *pg) {
  const wentry_t *e = &w->e;
  if (!e->copy) return engine_page_hold(r->srv->eng, e->cache_id, e->hash, pg, &w->hold) == 0;
  const wcopy_t *c = e->copy;
  *pg = (engine_page_t){.cache_id = e->cache_id, .head = !c->has_parent,
                        .page_tokens = c->page_tokens,
                        .bytes = c->data + (size_t)c->page_tokens * 4, .data_bytes = c->nbytes};
  memcpy(pg->hash, e->hash, 32);
  memcpy(pg->parent, c->parent, 32);
  pg->tokens = (const uint32_t *)(const void *)c->data;
  return true;
}

/* Hands e (taken) to the sender, routed to its slot's master by the map. */
static void send_one(remote_t *r, wentry_t *e) {
  const rvalue_cache_t *rc = remote_cache(r, e->cache_id);
  if (!rc) { /* its cache is gone */
    drop(r, e);
    return;
  }
  size_t ids = (size_t)rc->page_tokens * 4;
  wjob_t *w = malloc(sizeof *w + sizeof(rsend_job_t) + ids);
  if (!w) {
    drop(r, e);
    return;
  }
  *w = (wjob_t){r, *e, NULL, rvalue_size(rc), NULL, r->jobs};
  rsend_job_t *j = job_of(w);
  memset(j, 0, sizeof *j);
  j->owner = w;
  j->klen = rvalue_key(rc, r->sec, e->hash, j->key);
  enum rc_status st = rcluster_master(r->cl, rslot_of(j->key, j->klen), j->host,
                                      sizeof j->host, &j->port);
  if (st != RC_OK) { /* no master to write to now: later */
    remote_error(r, st, NULL);
    retry(r, &w->e);
    free(w);
    return;
  }
  if (!page_of(r, w, &j->pg)) { /* reclaimed before its turn */
    drop(r, &w->e);
    free(w);
    return;
  }
  memcpy(j->ids, j->pg.tokens, ids);
  j->pg.tokens = j->ids;
  j->rc = *rc;
  j->ttl_s = r->srv->cfg.cluster_ttl_s;
  if (r->jobs) r->jobs->prev = w;
  r->jobs = w;
  r->inflight++;
  r->inflight_bytes += w->vlen;
  rsend_submit(r->send, j);
}

/* Value bytes in flight at most: cluster_inflight_bytes, and a sixteenth of
 * the pool, as the pages being written are held: a slow cluster must not
 * keep the pool's room from its requests. */
static uint64_t inflight_max(const remote_t *r) {
  uint64_t pool = r->srv->cfg.pool_bytes / 16, opt = r->srv->cfg.cluster_inflight_bytes;
  return pool < opt ? pool : opt;
}

static void pump(remote_t *r) {
  uint32_t budget = SEND_TURN_JOBS;
  uint64_t now = uv_now(r->srv->loop), max = inflight_max(r);
  while (r->qlen && !r->stopping && r->inflight_bytes < max) {
    wentry_t *head = &r->q[r->qhead];
    if (head->not_before > now) {
      kick(r, head->not_before - now);
      return;
    }
    if (!budget--) { /* the rest on a later turn: 1 ms, as 0 ms from on_kick would run
                        again in this same pass of the timers (libuv 1.44) */
      kick(r, 1);
      return;
    }
    wentry_t e = *head;
    r->qhead = (r->qhead + 1) % r->qcap;
    r->qlen--;
    send_one(r, &e);
  }
}

int rwrite_start(remote_t *r) {
  r->qcap = r->srv->cfg.cluster_queue_pages;
  r->q = calloc(r->qcap, sizeof *r->q);
  return r->q ? 0 : -1;
}

void rwrite_stop(remote_t *r) {
  rsend_stop(r->send); /* every job comes back (rwrite_done), holds released */
  r->send = NULL;
  for (uint32_t i = 0; i < r->qlen; i++) free(r->q[(r->qhead + i) % r->qcap].copy);
  free(r->q);
  r->q = NULL;
  r->qlen = 0;
}
