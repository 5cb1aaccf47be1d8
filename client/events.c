/* events.c: the event stream on the daemon's socket: one Subscribe, then
 * batches the daemon pushes (Responses carrying the Subscribe's id), read
 * one event at a time (doc/protocol.md, "Subscribe"). */
#include "client.h"

#include <stdio.h>
#include <string.h>

KVC_API int kvc_events_subscribe(kvc_client_t *c, const char *cache, bool token_ids) {
  if (!c) return KVC_E_INVAL;
  if (c->ev_req_id) return client_fail(c, KVC_E_INVAL, "this client is subscribed already");
  if (cache && strlen(cache) > KVC_MAX_NAME)
    return client_fail(c, KVC_E_NAME, "a cache name is at most %u bytes", KVC_MAX_NAME);
  Kvcache__V1__Subscribe s = KVCACHE__V1__SUBSCRIBE__INIT;
  s.cache = (char *)(cache ? cache : "");
  s.token_ids = token_ids;
  Kvcache__V1__Request req = KVCACHE__V1__REQUEST__INIT;
  req.body_case = KVCACHE__V1__REQUEST__BODY_SUBSCRIBE;
  req.subscribe = &s;
  Kvcache__V1__Response *r;
  int rc = client_call(c, &req, &r);
  if (rc) return rc;
  bool ok = r->body_case == KVCACHE__V1__RESPONSE__BODY_EVENTS;
  kvcache__v1__response__free_unpacked(r, NULL);
  if (!ok) return client_fail(c, KVC_E_PROTO, "the daemon answered Subscribe without events");
  c->ev_req_id = req.id;
  c->ev_seq = 0;
  return 0;
}

static kvc_event_kind_t kind_of(Kvcache__V1__PrefixEventKind k) {
  switch (k) {
  case KVCACHE__V1__PREFIX_EVENT_KIND__EVENT_REMOVED: return KVC_EVENT_REMOVED;
  case KVCACHE__V1__PREFIX_EVENT_KIND__EVENT_CLEARED: return KVC_EVENT_CLEARED;
  case KVCACHE__V1__PREFIX_EVENT_KIND__EVENT_DROPPED: return KVC_EVENT_DROPPED;
  case KVCACHE__V1__PREFIX_EVENT_KIND__EVENT_RESET: return KVC_EVENT_RESET;
  default: return KVC_EVENT_STORED;
  }
}

static void copy_bytes(uint8_t out[32], uint32_t *len, ProtobufCBinaryData b) {
  *len = b.len <= 32 ? (uint32_t)b.len : 32;
  if (*len) memcpy(out, b.data, *len);
}

/* Event i of the batch held into *ev. */
static void fill(const kvc_client_t *c, size_t i, uint64_t missed, kvc_event_t *ev) {
  const Kvcache__V1__EventsReply *b = c->ev_batch->events;
  const Kvcache__V1__PrefixEvent *w = b->events[i];
  memset(ev, 0, sizeof *ev);
  ev->kind = kind_of(w->kind);
  ev->cache_id = w->cache_id;
  snprintf(ev->cache, sizeof ev->cache, "%s", w->cache ? w->cache : "");
  snprintf(ev->tenant, sizeof ev->tenant, "%s", w->tenant ? w->tenant : "");
  copy_bytes(ev->hash, &ev->hash_len, w->hash);
  copy_bytes(ev->parent, &ev->parent_len, w->parent);
  ev->block_size = w->block_size;
  snprintf(ev->medium, sizeof ev->medium, "%s", w->medium ? w->medium : "");
  ev->token_ids = w->n_token_ids ? w->token_ids : NULL;
  ev->ntokens = (uint32_t)w->n_token_ids;
  ev->seq = b->seq;
  ev->missed = missed;
  ev->ts = b->ts;
}

KVC_API int kvc_events_next(kvc_client_t *c, int timeout_ms, kvc_event_t *ev) {
  if (!c) return KVC_E_INVAL;
  if (!ev) return client_fail(c, KVC_E_INVAL, "kvc_events_next: ev is required");
  if (!c->ev_req_id) return client_fail(c, KVC_E_INVAL, "not subscribed: kvc_events_subscribe first");
  while (!c->ev_batch || c->ev_next == c->ev_batch->events->n_events) {
    if (c->ev_batch) kvcache__v1__response__free_unpacked(c->ev_batch, NULL);
    c->ev_batch = NULL;
    Kvcache__V1__Response *r;
    int rc = client_recv(c, timeout_ms, &r);
    if (rc) return rc;
    if (r->id != c->ev_req_id || r->body_case != KVCACHE__V1__RESPONSE__BODY_EVENTS) {
      kvcache__v1__response__free_unpacked(r, NULL);
      return client_fail(c, KVC_E_PROTO, "kvcached sent something else than events");
    }
    c->ev_batch = r;
    c->ev_next = 0;
  }
  const Kvcache__V1__EventsReply *b = c->ev_batch->events;
  uint64_t missed = 0;
  if (c->ev_next == 0) { /* a batch's first event says what was missed before it */
    missed = b->seq > c->ev_seq + 1 ? b->seq - c->ev_seq - 1 : 0;
    c->ev_seq = b->seq;
  }
  fill(c, c->ev_next++, missed, ev);
  return 0;
}
