/* evlog.c: the bounded log of prefix-index changes that the daemon drains
 * once per loop turn (evlog.h; doc/events.md).
 *
 *   buf: [rec|hash|parent|ids....][rec|hash][rec|hash|name]...      free
 *        ^0                                                   ^used      ^cap
 *
 * Records are appended in the order of the changes, each 8-byte aligned,
 * and read back in that order; a reset empties the buffer. A record that
 * does not fit sets `full`: it and every later one are dropped and counted
 * until the reset, so what is read is a prefix of what happened (a reader
 * never sees a page's removal without its storage, or a child without its
 * parent, because something in between was lost).
 */
#include "evlog.h"

#include <string.h>

#define LOG_MIN_BYTES 4096u

/* One record's fixed part; the variable part follows it. */
typedef struct rec {
  uint8_t kind;        /* engine_ev_kind_t */
  uint8_t has_parent;
  uint8_t medium;
  uint8_t named;       /* a lower tier's: the cache's name ends the body */
  uint32_t cache_id;
  uint32_t tenant;
  uint32_t page_tokens;
  uint32_t nbytes;     /* bytes of the variable part after hash (and parent) */
  uint32_t pad2;
  uint8_t hash[32];
} rec_t;

struct engine_events {
  uint8_t *buf;
  size_t cap, used;    /* bytes */
  bool full;           /* a record was dropped since the last reset */
  uint64_t dropped;    /* records dropped since the last reset */
};

static size_t align8(size_t n) { return (n + 7) & ~(size_t)7; }

/* Room for a record of `body` bytes after its fixed part, or NULL (counted). */
static rec_t *append_raw(engine_t *eng, engine_ev_kind_t kind, size_t body) {
  struct engine_events *ev = eng->ev;
  size_t need = align8(sizeof(rec_t) + body);
  if (ev->full || need > ev->cap - ev->used) {
    ev->full = true;
    ev->dropped++;
    return NULL;
  }
  rec_t *r = (rec_t *)(void *)(ev->buf + ev->used);
  ev->used += need;
  memset(r, 0, sizeof *r);
  r->kind = (uint8_t)kind;
  r->medium = ENGINE_MEDIUM_POOL;
  r->nbytes = (uint32_t)body;
  return r;
}

static rec_t *append(engine_t *eng, const cache_t *c, engine_ev_kind_t kind, size_t body) {
  rec_t *r = append_raw(eng, kind, body);
  if (!r) return NULL;
  r->cache_id = c->id;
  r->tenant = c->tenant;
  r->page_tokens = c->g.T;
  return r;
}

void engine_events_tier(engine_t *eng, engine_ev_kind_t kind, uint32_t medium, uint32_t tenant,
                        const char *cache, uint32_t page_tokens, const uint8_t hash[32],
                        const uint8_t *parent, const uint32_t *tokens) {
  if (!eng || !eng->ev || !cache || !hash || (kind != ENGINE_EV_STORED && kind != ENGINE_EV_REMOVED))
    return;
  bool stored = kind == ENGINE_EV_STORED;
  if (stored && !tokens) return;
  size_t name = strnlen(cache, KVC_MAX_NAME) + 1;
  size_t ids = stored ? (size_t)page_tokens * sizeof *tokens : 0;
  rec_t *r = append_raw(eng, kind, (stored ? 32 + ids : 0) + name);
  if (!r) return;
  uint8_t *body = (uint8_t *)(r + 1);
  r->medium = (uint8_t)medium;
  r->named = 1;
  r->cache_id = UINT32_MAX;
  r->tenant = tenant;
  r->page_tokens = page_tokens;
  memcpy(r->hash, hash, 32);
  if (stored) {
    r->has_parent = parent != NULL;
    if (parent) memcpy(body, parent, 32);
    else memset(body, 0, 32);
    memcpy(body + 32, tokens, ids);
    body += 32 + ids;
  }
  memcpy(body, cache, name - 1);
  body[name - 1] = '\0';
}

void evlog_stored(engine_t *eng, const cache_t *c, const ipage_t *ip, const uint8_t *parent) {
  size_t ids = (size_t)c->g.T * sizeof *ip->tokens;
  rec_t *r = append(eng, c, ENGINE_EV_STORED, 32 + ids);
  if (!r) return;
  uint8_t *body = (uint8_t *)(r + 1);
  memcpy(r->hash, ip->hash, 32);
  r->has_parent = parent != NULL;
  if (parent) memcpy(body, parent, 32);
  else memset(body, 0, 32);
  memcpy(body + 32, ip->tokens, ids);
}

void evlog_removed(engine_t *eng, const cache_t *c, const uint8_t hash[32]) {
  rec_t *r = append(eng, c, ENGINE_EV_REMOVED, 0);
  if (r) memcpy(r->hash, hash, 32);
}

void evlog_cache(engine_t *eng, const cache_t *c, engine_ev_kind_t kind) {
  size_t n = strlen(c->name) + 1;
  rec_t *r = append(eng, c, kind, n);
  if (r) memcpy(r + 1, c->name, n);
}

void evlog_free(engine_t *eng) {
  if (!eng->ev) return;
  mem_free(&eng->mem, eng->ev->buf);
  mem_free(&eng->mem, eng->ev);
  eng->ev = NULL;
}

int engine_events_enable(engine_t *eng, size_t log_bytes) {
  if (!eng) return KVC_E_INVAL;
  if (log_bytes == 0) {
    evlog_free(eng);
    return 0;
  }
  if (log_bytes < LOG_MIN_BYTES)
    return engine_fail(eng, KVC_E_INVAL, "an event log of %zu bytes: at least %u",
                       log_bytes, LOG_MIN_BYTES);
  if (eng->ev && eng->ev->cap == log_bytes) return 0;
  struct engine_events *ev = mem_calloc(&eng->mem, 1, sizeof *ev);
  uint8_t *buf = ev ? mem_alloc(&eng->mem, log_bytes) : NULL;
  if (!buf) {
    mem_free(&eng->mem, ev);
    return engine_fail(eng, KVC_E_NOMEM, "out of memory for a %zu-byte event log", log_bytes);
  }
  evlog_free(eng); /* a new size: what the old log held is dropped */
  ev->buf = buf;
  ev->cap = log_bytes;
  eng->ev = ev;
  return 0;
}

bool engine_events_on(const engine_t *eng) { return eng && eng->ev; }

bool engine_events_next(const engine_t *eng, size_t *cursor, engine_event_t *out) {
  const struct engine_events *ev = eng ? eng->ev : NULL;
  if (!ev || !cursor || !out || *cursor >= ev->used) return false;
  const rec_t *r = (const rec_t *)(const void *)(ev->buf + *cursor);
  const uint8_t *body = (const uint8_t *)(r + 1);
  memset(out, 0, sizeof *out);
  out->kind = (engine_ev_kind_t)r->kind;
  out->cache_id = r->cache_id;
  out->tenant = r->tenant;
  out->page_tokens = r->page_tokens;
  out->medium = r->medium;
  memcpy(out->hash, r->hash, 32);
  if (r->kind == ENGINE_EV_STORED) {
    out->has_parent = r->has_parent;
    memcpy(out->parent, body, 32);
    out->ntokens = r->page_tokens;
    out->tokens = (const uint32_t *)(const void *)(body + 32);
    if (r->named) out->cache_name = (const char *)(body + 32 + 4ull * r->page_tokens);
  } else if (r->kind == ENGINE_EV_CLEARED || r->kind == ENGINE_EV_DROPPED || r->named) {
    out->cache_name = (const char *)body;
  }
  *cursor += align8(sizeof *r + r->nbytes);
  return true;
}

uint64_t engine_events_dropped(const engine_t *eng) {
  return eng && eng->ev ? eng->ev->dropped : 0;
}

uint64_t engine_events_reset(engine_t *eng) {
  if (!eng || !eng->ev) return 0;
  uint64_t dropped = eng->ev->dropped;
  eng->ev->used = 0;
  eng->ev->full = false;
  eng->ev->dropped = 0;
  return dropped;
}
