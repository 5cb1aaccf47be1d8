/* rlookup.c: a match or attach continued in the cluster (remote.h draws the
 * path). One lookup per request: the pages past the local match, one GET
 * each, pipelined on the nodes' connections in page order, at most
 * LOOKUP_WINDOW_BYTES of values asked for and not yet read (for small
 * pages, the whole prompt at once); the connection is parked meanwhile.
 *
 *   pages   first  first+1  first+2  first+3 ...
 *   state   GOOD   GOOD     MISS     GOOD        good = 2: decided, the lookup
 *                                                ends without waiting for more
 *
 * Pages are a chain: only the run of verified pages from the first counts,
 * so the lookup ends as soon as that run is decided (every page answered,
 * or one in it missed or failed verification), or at
 * cluster_lookup_timeout_ms with whatever run it has. A value is read
 * straight into place (on_sink: its page bytes into the pool page it will
 * be imported as); what it claims is checked as it arrives, against the
 * hash this node computed for the page from the request's own tokens, and
 * its MAC over the page where it landed (value_check).
 */
#include <stdlib.h>
#include <string.h>

#include "engine_tier.h"
#include "log.h"
#include "rslot.h"
#include "rtier.h"
#include "tier.h"

enum pstate { P_PENDING, P_GOOD, P_MISS, P_BAD };

#define LOOKUP_WINDOW_BYTES (8ull << 20) /* of values a lookup has asked for and not read */

typedef struct rpage {
  rlookup_t *l;
  rcmd_t *cmd;          /* in flight */
  char *val;            /* the value (owned: a spare, len bytes); with job, its head and tag */
  size_t len;
  engine_tier_job_t *job; /* the pool page its page bytes are read into (owned), or NULL */
  bool spare;           /* val is a spare buffer (rlookup's), else malloc's own */
  uint8_t *page;        /* that page's bytes */
  const uint8_t *bytes; /* its page bytes, inside val (no job) */
  uint32_t i;
  uint8_t state;        /* enum pstate */
} rpage_t;

/* A page's key and its slot. */
typedef struct pkey {
  char s[RVALUE_KEY_MAX];
  size_t len;
  uint16_t slot;
} pkey_t;

struct rlookup {
  remote_t *r;
  tier_wait_t *w;       /* the request that waits (its connection's walk) */
  unsigned idx;         /* the cluster's place in the chain */
  rlookup_t *prev, *next; /* r->lookups, oldest first */
  uint32_t cache_id;
  rvalue_cache_t rc;    /* a copy: the memo may move on */
  uint64_t first;       /* pages the pool held */
  bool has_before;      /* first > 0: before is page first - 1's hash */
  uint8_t before[32];
  size_t n;             /* pages looked up */
  uint64_t held;        /* of r->lookup_bytes: n values */
  size_t good;          /* the verified run from page first */
  uint8_t (*hash)[32];  /* of each page looked up */
  uint32_t *query;      /* the request's ids, pages [0, first + n) */
  uint32_t *tokens;     /* in query: those of the pages looked up */
  engine_pkey_t key;    /* the request's key, copied: salt and extra below */
  uint8_t salt[KVC_MAX_KEY_BYTES], extra[KVC_MAX_KEY_BYTES];
  bool early;           /* verified pages are imported as they come (no span keys) */
  size_t imported;      /* of the run, pages imported (or given up on) */
  bool import_over;     /* an import fell short: the rest is not imported */
  rpage_t *pg;
  pkey_t *keys;         /* of each page looked up */
  size_t sent;          /* pages whose GET went (in order) */
  size_t inflight;      /* of those, not answered */
  size_t window;        /* GETs in flight at most */
  uint64_t t0_ns, deadline_ms;
  bool ended;
};

/* ---- the deadline: one timer for all, at the earliest ----------------------------- */

static void end(rlookup_t *l, bool timed_out);

static void on_deadline(uv_timer_t *t) {
  remote_t *r = t->data;
  uint64_t now = uv_now(r->srv->loop), next = UINT64_MAX;
  for (rlookup_t *l = r->lookups, *nx; l; l = nx) {
    nx = l->next;
    if (l->ended) continue;
    if (l->deadline_ms <= now) end(l, true);
    else if (l->deadline_ms < next) next = l->deadline_ms;
  }
  if (next != UINT64_MAX) uv_timer_start(t, on_deadline, next - now, 0);
}

static void arm(remote_t *r, uint64_t deadline_ms) {
  uv_timer_t *t = &r->deadline;
  uint64_t now = uv_now(r->srv->loop), in = deadline_ms > now ? deadline_ms - now : 0;
  if (!uv_is_active((uv_handle_t *)t) || uv_timer_get_due_in(t) > in)
    uv_timer_start(t, on_deadline, in, 0);
}

/* ---- value buffers ------------------------------------------------------------------
 * A value is read into a buffer of its size (its sink, rnode.c) and copied
 * into the pool at import; buffers are kept for the next values (up to a
 * quarter of cluster_lookup_bytes), so that a lookup writes into memory
 * already mapped instead of faulting fresh pages in at every value. */

static void *spare_get(remote_t *r, size_t len) {
  if (r->spare.n && r->spare.bytes == len) return r->spare.v[--r->spare.n];
  return malloc(len);
}

/* Takes v, a value buffer of len bytes (a value's size). */
static void spare_put(remote_t *r, void *v, size_t len) {
  if (!v) return;
  if (len != r->spare.bytes) { /* another layout's: the old ones go */
    rlookup_spare_free(r);
    r->spare.bytes = len;
  }
  size_t cap = len ? (size_t)(r->srv->cfg.cluster_lookup_bytes / 4 / len) : 0;
  if (r->spare.n < cap && r->spare.n == r->spare.cap) {
    size_t nc = r->spare.cap ? 2 * r->spare.cap : 16;
    void **nv = realloc(r->spare.v, (nc < cap ? nc : cap) * sizeof *nv);
    if (nv) {
      r->spare.v = nv;
      r->spare.cap = nc < cap ? nc : cap;
    }
  }
  if (r->spare.n < r->spare.cap) r->spare.v[r->spare.n++] = v;
  else free(v);
}

void rlookup_spare_free(remote_t *r) {
  while (r->spare.n) free(r->spare.v[--r->spare.n]);
  free(r->spare.v);
  r->spare.v = NULL;
  r->spare.cap = 0;
}

/* Lets go of what page p holds: its value, its pool page if not imported. */
static void page_drop(remote_t *r, rpage_t *p) {
  engine_tier_import_abort(r->srv->eng, p->job);
  if (p->spare) spare_put(r, p->val, p->len);
  else free(p->val);
  p->job = NULL;
  p->val = NULL;
  p->spare = false;
}

/* ---- one lookup -------------------------------------------------------------------- */

static void lookup_free(rlookup_t *l) {
  remote_t *r = l->r;
  if (l->prev) l->prev->next = l->next;
  else r->lookups = l->next;
  if (l->next) l->next->prev = l->prev;
  r->lookup_bytes -= l->held;
  for (size_t i = 0; i < l->n; i++) {
    rcmd_cancel(l->pg[i].cmd); /* its sink's buffers are written no more */
    page_drop(r, &l->pg[i]);
  }
  free(l->hash);
  free(l->keys);
  free(l->query);
  free(l->pg);
  free(l);
}

/* The engine's fill of an imported page: the value's page bytes copied
 * into the pool page with its MAC computed on the way; a value that fails
 * it is refused there (counted), and the import stops. */
static bool mac_fill(void *arg, void *dst, uint64_t n) {
  rpage_t *p = arg;
  (void)n; /* rvalue_check held the value to the cache's page bytes */
  if (rvalue_copy_verified(p->l->r->sec, (const uint8_t *)p->val, p->len, dst)) return true;
  p->l->r->st.discarded[RV_MAC - 1]++;
  LOG_DEBUG("cluster_discarded", "cache=%u page=%llu reason=mac", p->l->cache_id,
            (unsigned long long)(p->l->first + p->i));
  return false;
}

/* Imports pages [imported, upto) of the run, frees their values. The
 * engine recomputes every hash from the request's own ids (copied at the
 * lookup); what does not fit, or fails its MAC, ends the importing. A page
 * read into the pool (a job, its MAC checked as it came) is indexed where
 * it is; one read into a spare buffer is copied in, its MAC computed on
 * the way (mac_fill). One engine call takes pages of one kind. */
static void import_run(rlookup_t *l, const uint32_t *query, uint64_t n, const engine_pkey_t *key,
                       size_t upto) {
  remote_t *r = l->r;
  size_t k = upto > l->imported ? upto - l->imported : 0;
  engine_page_in_t in[64];
  while (k && !l->import_over) {
    size_t b = 0, got = 0;
    bool jobs = l->pg[l->imported].job != NULL;
    for (; b < k && b < 64 && (l->pg[l->imported + b].job != NULL) == jobs; b++) {
      rpage_t *p = &l->pg[l->imported + b];
      in[b] = jobs ? (engine_page_in_t){.hash = l->hash[l->imported + b], .job = p->job}
                   : (engine_page_in_t){l->hash[l->imported + b], NULL, mac_fill, p, NULL};
    }
    int rc = engine_tier_import(r->srv->eng, l->cache_id, query, n, key, l->first + l->imported,
                                in, b, &got);
    r->st.hit_pages += got;
    r->st.hit_tokens += got * l->rc.page_tokens;
    for (size_t i = 0; i < b; i++) {
      rpage_t *p = &l->pg[l->imported + i];
      if (i < got) p->job = NULL; /* its page is the engine's now */
      page_drop(r, p);
    }
    if (rc || got < b) { /* the pool is full, or the request's ids moved: the rest waits no more */
      r->st.errors[TIER_ERR_import] += rc != 0;
      LOG_DEBUG("cluster_import", "cache=%u verified=%zu imported=%zu error=%s", l->cache_id,
                l->good, l->imported + got, rc ? kvc_err_name(rc) : "-");
      l->imported += b;
      l->import_over = true; /* nothing more of this run will do */
      return;
    }
    l->imported += b;
    k -= b;
  }
}

/* Early import: once the run has grown by a batch (a quarter of what is
 * in, at least 8 pages: a few engine calls a lookup), or is decided. */
static void import_early(rlookup_t *l, bool all) {
  size_t ready = l->good - l->imported, batch = l->imported / 4 > 8 ? l->imported / 4 : 8;
  if (l->early && !l->import_over && ready && (all || ready >= batch))
    import_run(l, l->query, (l->first + l->n) * l->rc.page_tokens, &l->key, l->good);
}

/* The lookup is over: what is in flight is dropped, the pages past the
 * verified run freed, the request runs again. */
static void end(rlookup_t *l, bool timed_out) {
  remote_t *r = l->r;
  l->ended = true;
  for (size_t i = 0; i < l->n; i++) {
    rcmd_cancel(l->pg[i].cmd);
    l->pg[i].cmd = NULL;
    if (i >= l->good) page_drop(r, &l->pg[i]);
  }
  if (timed_out) r->st.errors[TIER_ERR_timeout]++;
  uint64_t ns = uv_hrtime() - l->t0_ns;
  r->st.lookup_hist[metrics_bucket(ns)]++;
  r->st.lookup_ns += ns;
  tiers_done(r->srv, l->w->conn_id, l->idx); /* the request runs again */
}

/* Has the run of verified pages from the first been decided? */
static bool decided(rlookup_t *l) {
  while (l->good < l->n && l->pg[l->good].state == P_GOOD) l->good++;
  return l->good == l->n || l->pg[l->good].state != P_PENDING;
}

/* The GET of a key, as RESP bytes (new). */
static char *get_cmd(const char *key, size_t klen, size_t *len) {
  char *cmd = malloc(32 + klen);
  if (!cmd) return NULL;
  int h = snprintf(cmd, 32, "*2\r\n$3\r\nGET\r\n$%zu\r\n", klen);
  memcpy(cmd + h, key, klen);
  memcpy(cmd + h + klen, "\r\n", 2);
  *len = (size_t)h + klen + 2;
  return cmd;
}

static void on_value(void *arg, enum rc_status st, struct redisReply *reply);
static int on_sink(void *arg, size_t len, struct iovec iov[RCMD_SINK_IOV]);

/* Sends the next GETs, in page order, while fewer than the window are in
 * flight: a node's replies then stay a few values ahead of what is read
 * (Redis builds every reply of a pipeline in memory before it writes it:
 * the whole prompt at once would cost it fresh memory and cold copies,
 * and the window keeps them warm). A page that cannot be sent ends the
 * lookup there (nothing after it could be used). Returns how many went. */
static size_t lookup_send(rlookup_t *l) {
  remote_t *r = l->r;
  while (l->sent < l->n && l->inflight < l->window) {
    size_t i = l->sent, len;
    const pkey_t *k = &l->keys[i];
    char *cmd = get_cmd(k->s, k->len, &len);
    enum rc_status st = RC_CONN;
    rcmd_t *c = cmd ? rcluster_send(r->cl, k->slot, true, cmd, len, on_value, &l->pg[i], &st)
                    : NULL;
    if (!c) {
      remote_error(r, st, NULL);
      l->n = i;
      break;
    }
    rcmd_sink(c, on_sink);
    l->pg[i].cmd = c;
    l->sent++;
    l->inflight++;
    r->st.lookup_pages++;
  }
  return l->sent;
}

/* A GET's sink (rcmd_sink): a value of the cache's value size is read
 * straight into place, its head and tag into a buffer of the page's, its
 * page bytes into a pool page taken for it now (engine_tier_import_begin:
 * held by the page until imported or let go); when no pool page can be
 * had, or the value is shorter (so that its check says what it is), into
 * a spare buffer whole. A longer one cannot verify: refused (read and
 * dropped, counted as truncated). */
static int on_sink(void *arg, size_t len, struct iovec iov[RCMD_SINK_IOV]) {
  rpage_t *p = arg;
  rlookup_t *l = p->l;
  remote_t *r = l->r;
  size_t vsize = rvalue_size(&l->rc), head = rvalue_head_size(&l->rc);
  if (l->ended || len > vsize || p->val) return 0;
  void *page;
  if (len == vsize && (p->val = malloc(head + RVALUE_TAG_BYTES)) &&
      engine_tier_import_begin(r->srv->eng, l->cache_id, &p->job, &page, NULL) == 0) {
    p->len = head + RVALUE_TAG_BYTES;
    p->page = page;
    iov[0] = (struct iovec){p->val, head};
    iov[1] = (struct iovec){page, l->rc.page_bytes};
    iov[2] = (struct iovec){p->val + head, RVALUE_TAG_BYTES};
    return 3;
  }
  free(p->val);
  p->job = NULL;
  p->val = spare_get(r, vsize);
  p->len = p->val ? vsize : 0;
  p->spare = p->val != NULL;
  iov[0] = (struct iovec){p->val, len};
  return p->val ? 1 : 0;
}

/* The claims of a value read into its sink or handed over by hiredis, and,
 * read into the pool, its MAC (while its bytes are warm). */
static enum rvalue_verdict value_check(rlookup_t *l, rpage_t *p, const char *v, size_t len) {
  uint32_t T = l->rc.page_tokens;
  const uint8_t *parent = p->i ? l->hash[p->i - 1] : l->has_before ? l->before : NULL;
  const uint32_t *tokens = l->tokens + (size_t)p->i * T;
  if (!v) return RV_TRUNCATED; /* refused unread: longer than a value */
  if (!p->job) /* its MAC as it is copied into the pool (mac_fill) */
    return rvalue_check(&l->rc, (const uint8_t *)v, len, l->hash[p->i], parent, tokens, &p->bytes);
  size_t head = rvalue_head_size(&l->rc);
  enum rvalue_verdict why = rvalue_check_head(&l->rc, (const uint8_t *)v, len, l->hash[p->i],
                                              parent, tokens);
  if (why == RV_OK && !rvalue_mac_parts(l->r->sec, (const uint8_t *)v, head, p->page,
                                        l->rc.page_bytes, (const uint8_t *)v + head))
    why = RV_MAC;
  return why;
}

static void on_value(void *arg, enum rc_status st, struct redisReply *reply) {
  rpage_t *p = arg;
  rlookup_t *l = p->l;
  remote_t *r = l->r;
  p->cmd = NULL;
  p->state = P_MISS;
  l->inflight--;
  if (st != RC_OK || reply->type == REDIS_REPLY_ERROR) {
    remote_error(r, st, reply);
  } else if (reply->type == REDIS_REPLY_STRING) {
    /* Read into its sink (p->val; reply->str NULL when refused), or a
     * reply of hiredis's own (taken). */
    size_t len = reply->len;
    if (!p->val && reply->str) {
      p->val = rcluster_take_str(reply, &len);
      p->len = len; /* (allocated len + 1) */
    }
    enum rvalue_verdict why = value_check(l, p, p->val, len);
    r->st.read_bytes += len;
    if (why == RV_OK) {
      p->state = P_GOOD;
    } else {
      r->st.discarded[why - 1]++;
      p->state = P_BAD;
      LOG_DEBUG("cluster_discarded", "cache=%u page=%llu reason=%s", l->cache_id,
                (unsigned long long)(l->first + p->i), rvalue_verdict_name(why));
      page_drop(r, p);
    }
  } /* nil: not in the cluster */
  if (l->ended) return;
  lookup_send(l);
  bool done = decided(l);
  import_early(l, done);
  if (done) end(l, false);
}

/* A lookup of pages [first, first + n) of the request, their hashes taken
 * (new; nothing sent yet). */
static rlookup_t *lookup_new(remote_t *r, tier_wait_t *w, unsigned idx, uint32_t cache_id,
                             const rvalue_cache_t *rc, const uint32_t *tokens,
                             const engine_pkey_t *key, uint64_t first, const uint8_t *before,
                             uint8_t (*hash)[32], size_t n) {
  rlookup_t *l = calloc(1, sizeof *l);
  size_t T = rc->page_tokens;
  if (!l || !(l->pg = calloc(n, sizeof *l->pg)) || !(l->query = malloc((first + n) * T * 4))) {
    if (l) free(l->pg);
    free(l);
    return NULL;
  }
  memcpy(l->query, tokens, (first + n) * T * 4);
  l->tokens = l->query + first * T;
  if (key) {
    l->key = (engine_pkey_t){l->salt, key->salt_len, l->extra, key->extra_len, NULL, 0};
    if (key->salt_len) memcpy(l->salt, key->salt, key->salt_len);
    if (key->extra_len) memcpy(l->extra, key->extra, key->extra_len);
  }
  l->early = !key || !key->nspans; /* span keys: at the request's own run, with its spans */
  l->r = r;
  l->w = w;
  l->idx = idx;
  l->cache_id = cache_id;
  l->rc = *rc;
  l->first = first;
  l->has_before = before != NULL;
  if (before) memcpy(l->before, before, 32);
  l->hash = hash;
  l->n = n;
  for (size_t i = 0; i < n; i++)
    l->pg[i] = (rpage_t){.l = l, .i = (uint32_t)i, .state = P_PENDING};
  return l;
}

int rlookup_start(server_t *srv, tier_wait_t *w, unsigned idx, const tier_query_t *q) {
  uint32_t cache_id = q->cache_id;
  const uint32_t *tokens = q->tokens;
  uint64_t n = q->n;
  const engine_pkey_t *key = q->key;
  remote_t *r = srv->remote;
  if (!r || r->stopping || srv->draining || w->held[idx]) return TIER_RUN;
  const rvalue_cache_t *rc = remote_cache(r, cache_id);
  uint64_t whole = rc ? n / rc->page_tokens : 0;
  size_t cap = whole < srv->cfg.cluster_lookup_max_pages ? (size_t)whole
                                                          : srv->cfg.cluster_lookup_max_pages;
  /* What came is held until imported: the lookups share a byte budget. */
  uint64_t vsize = rc ? rvalue_size(rc) : 1, room = srv->cfg.cluster_lookup_bytes - r->lookup_bytes;
  if (cap && cap > room / vsize && !(cap = (size_t)(room / vsize))) {
    r->st.errors[TIER_ERR_budget]++;
    return TIER_RUN;
  }
  if (!cap) return TIER_RUN;
  uint8_t(*hash)[32] = malloc(cap * 32), before[32];
  pkey_t *keys = malloc(cap * sizeof *keys);
  uint64_t first;
  size_t nh = 0, k = 0;
  rlookup_t *l = NULL;
  if (!hash || !keys ||
      engine_tier_probe(srv->eng, cache_id, tokens, n, key, &first, before, hash, cap, &nh) ||
      !nh)
    goto run;
  /* Only a run from the first page can be used: stop at the first page
   * whose node would not be tried (its breaker open, no map). */
  for (; k < nh; k++) {
    keys[k].len = rvalue_key(rc, r->sec, hash[k], keys[k].s);
    keys[k].slot = rslot_of(keys[k].s, keys[k].len);
    if (!rcluster_routable(r->cl, keys[k].slot, true)) break;
  }
  if (k == 0) {
    remote_error(r, rcluster_ready(r->cl) ? RC_BREAKER : RC_NOROUTE, NULL);
    goto run;
  }
  if (!(l = lookup_new(r, w, idx, cache_id, rc, tokens, key, first, first ? before : NULL, hash, k)))
    goto run;
  hash = NULL; /* the lookup's now */
  rlookup_t **tail = &r->lookups; /* oldest first: deadlines in order */
  while (*tail) {
    l->prev = *tail;
    tail = &(*tail)->next;
  }
  *tail = l;
  l->held = (uint64_t)k * vsize;
  r->lookup_bytes += l->held;
  l->t0_ns = uv_hrtime();
  l->keys = keys;
  keys = NULL;
  l->window = LOOKUP_WINDOW_BYTES / vsize > 4 ? (size_t)(LOOKUP_WINDOW_BYTES / vsize) : 4;
  if (lookup_send(l) == 0) {
    lookup_free(l);
    goto run;
  }
  /* Its own bound, or just before the chain's (tiers.c would let it go with
   * nothing; ending first, it keeps the run it has). */
  uint64_t now = uv_now(srv->loop), chain = q->deadline_ms > now + 1 ? q->deadline_ms - 1 : now;
  l->deadline_ms = now + srv->cfg.cluster_lookup_timeout_ms;
  if (l->deadline_ms > chain) l->deadline_ms = chain;
  arm(r, l->deadline_ms);
  r->st.lookups++;
  w->held[idx] = l;
  return TIER_WAIT;
run:
  free(hash);
  free(keys);
  return TIER_RUN;
}

void rlookup_import(server_t *srv, tier_wait_t *w, unsigned idx, const tier_query_t *q) {
  (void)srv;
  uint32_t cache_id = q->cache_id;
  const uint32_t *tokens = q->tokens;
  uint64_t n = q->n;
  const engine_pkey_t *key = q->key;
  rlookup_t *l = w->held[idx];
  w->held[idx] = NULL;
  if (!l) return;
  if (!l->ended) end(l, false);
  /* What was not imported as it came (span keys), with the request's own
   * ids and key as they are now. */
  if (l->cache_id == cache_id && l->good > l->imported) {
    uint64_t before = l->r->st.hit_pages;
    import_run(l, tokens, n, key, l->good);
    *q->turn_bytes += (l->r->st.hit_pages - before) * l->rc.page_bytes; /* copied on the loop */
  }
  lookup_free(l);
}

void rlookup_forget(server_t *srv, tier_wait_t *w, unsigned idx) {
  (void)srv;
  rlookup_t *l = w->held[idx];
  w->held[idx] = NULL;
  if (l) lookup_free(l);
}

void rlookup_end_all(remote_t *r) {
  for (rlookup_t *l = r->lookups, *nx; l; l = nx) {
    nx = l->next;
    if (!l->ended) end(l, false);
    if (r->stopping) { /* the connections' requests run without them */
      l->w->held[l->idx] = NULL;
      lookup_free(l);
    }
  }
}
