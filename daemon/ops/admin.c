/* admin.c: the operator's requests. Reads (clients, config) and writes (drop
 * a cache, remove or unpin a sequence, disconnect a client) alike are for
 * admins only: a listing of clients shows other tenants' pids and names, the
 * configuration their limits. Each write is logged at info with who asked. */
#include "admin.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "kvcache/kvcache.h"
#include "log.h"
#include "optable.h"

static int refuse(char *err, size_t errlen, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int refuse(char *err, size_t errlen, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
  return code;
}

#define ADMIN_ONLY(c, what)                                                    \
  do {                                                                         \
    if (!conn_is_admin(c))                                                     \
      return refuse(err, errlen, KVC_E_PERM, "%s: for admins only (uid %u is not one)", \
                    (what), (unsigned)(c)->uid);                               \
  } while (0)

int admin_clients(conn_t *c, const Kvcache__V1__Request *req, arena_t *a,
                  Kvcache__V1__Response *resp, char *err, size_t errlen) {
  (void)req;
  ADMIN_ONLY(c, "clients");
  server_t *srv = c->srv;
  size_t n = 0;
  for (conn_t *o = srv->conns; o; o = o->next) n += o->greeted && o->state != CONN_CLOSED;
  Kvcache__V1__ClientsReply *cr = arena_alloc(a, sizeof *cr);
  Kvcache__V1__ClientInfo **items = arena_alloc(a, (n ? n : 1) * sizeof *items);
  if (!cr || !items) return refuse(err, errlen, KVC_E_NOMEM, "out of memory");
  kvcache__v1__clients_reply__init(cr);
  uint64_t now = uv_now(srv->loop);
  size_t i = 0;
  for (conn_t *o = srv->conns; o && i < n; o = o->next) {
    if (!o->greeted || o->state == CONN_CLOSED) continue;
    Kvcache__V1__ClientInfo *ci = arena_alloc(a, sizeof *ci);
    if (!ci) return refuse(err, errlen, KVC_E_NOMEM, "out of memory");
    kvcache__v1__client_info__init(ci);
    ci->conn_id = o->id;
    ci->pid = (int32_t)o->pid;
    ci->uid = (uint32_t)o->uid;
    ci->gid = (uint32_t)o->gid;
    ci->tenant = (char *)conn_tenant(o);
    ci->name = o->name;
    ci->pins = (uint32_t)engine_owner_pins(srv->eng, o->id);
    ci->leases = o->nleases;
    ci->shm_bytes = o->shm.bytes;
    ci->requests = o->requests;
    ci->age_ms = now - o->accepted_ms;
    ci->idle_ms = now - o->last_ms;
    ci->wq_bytes = o->wq_bytes;
    ci->self = o == c;
    items[i++] = ci;
  }
  cr->n_clients = i;
  cr->clients = items;
  resp->body_case = KVCACHE__V1__RESPONSE__BODY_CLIENTS;
  resp->clients = cr;
  return 0;
}

int admin_config(conn_t *c, const Kvcache__V1__Request *req, arena_t *a,
                 Kvcache__V1__Response *resp, char *err, size_t errlen) {
  (void)req;
  ADMIN_ONLY(c, "config");
  size_t n = config_option_count();
  Kvcache__V1__ConfigReply *cr = arena_alloc(a, sizeof *cr);
  Kvcache__V1__Label **items = arena_alloc(a, n * sizeof *items);
  if (!cr || !items) return refuse(err, errlen, KVC_E_NOMEM, "out of memory");
  kvcache__v1__config_reply__init(cr);
  for (size_t i = 0; i < n; i++) {
    Kvcache__V1__Label *l = arena_alloc(a, sizeof *l);
    char *v = arena_alloc(a, 1024);
    if (!l || !v) return refuse(err, errlen, KVC_E_NOMEM, "out of memory");
    kvcache__v1__label__init(l);
    config_value(&c->srv->cfg, i, v, 1024);
    l->key = (char *)config_option_name(i);
    l->value = v;
    items[i] = l;
  }
  cr->n_options = n;
  cr->options = items;
  resp->body_case = KVCACHE__V1__RESPONSE__BODY_CONFIG;
  resp->config = cr;
  return 0;
}

/* The id of the cache an operator names (the first of that name). */
static int find_cache(engine_t *eng, arena_t *a, const char *name, uint32_t *id) {
  size_t n = 0, got = 0;
  engine_cache_list(eng, NULL, 0, &n);
  kvc_cache_info_t *infos = n ? arena_alloc(a, n * sizeof *infos) : NULL;
  if (n && !infos) return KVC_E_NOMEM;
  if (n) engine_cache_list(eng, infos, n, &got);
  for (size_t i = 0; i < got && i < n; i++)
    if (strcmp(infos[i].name, name) == 0) {
      *id = infos[i].cache_id;
      return 0;
    }
  return KVC_E_NOCACHE;
}

int admin_admin(conn_t *c, const Kvcache__V1__Request *req, arena_t *a,
                Kvcache__V1__Response *resp, char *err, size_t errlen) {
  const Kvcache__V1__Admin *b = req->admin;
  if (!b) return refuse(err, errlen, KVC_E_INVAL, "admin request without a body");
  ADMIN_ONLY(c, "admin");
  server_t *srv = c->srv;
  engine_t *eng = srv->eng;
  uint64_t count = 0;
  uint32_t id = 0;
  int rc;
  const char *cache = b->cache ? b->cache : "";
  bool by_cache = b->action == KVCACHE__V1__ADMIN_ACTION__ADMIN_DROP_CACHE ||
                  b->action == KVCACHE__V1__ADMIN_ACTION__ADMIN_REMOVE_SEQ ||
                  b->action == KVCACHE__V1__ADMIN_ACTION__ADMIN_UNPIN_SEQ;
  if (by_cache && (rc = find_cache(eng, a, cache, &id)) != 0)
    return refuse(err, errlen, rc, "no cache named '%s'", cache);
  switch (b->action) {
  case KVCACHE__V1__ADMIN_ACTION__ADMIN_DROP_CACHE:
    if ((rc = engine_cache_drop(eng, id)) != 0)
      return refuse(err, errlen, rc, "drop %s: %s", cache, kvc_strerror(rc));
    count = 1;
    LOG_INFO("admin_drop", "by_conn=%llu by_uid=%u cache=\"%s\"", (unsigned long long)c->id,
             (unsigned)c->uid, cache);
    break;
  case KVCACHE__V1__ADMIN_ACTION__ADMIN_REMOVE_SEQ: {
    kvc_seq_info_t si;
    if ((rc = engine_seq_info(eng, id, b->seq_id, &si)) != 0)
      return refuse(err, errlen, rc, "no sequence %" PRIu64 " in cache '%s'", b->seq_id, cache);
    if ((rc = engine_remove(eng, id, b->seq_id, 0, UINT64_MAX)) != 0)
      return refuse(err, errlen, rc, "remove: %s", kvc_strerror(rc));
    count = 1;
    LOG_INFO("admin_remove", "by_conn=%llu by_uid=%u cache=\"%s\" seq=%llu",
             (unsigned long long)c->id, (unsigned)c->uid, cache, (unsigned long long)b->seq_id);
    break;
  }
  case KVCACHE__V1__ADMIN_ACTION__ADMIN_UNPIN_SEQ: {
    kvc_seq_info_t si;
    if ((rc = engine_seq_info(eng, id, b->seq_id, &si)) != 0)
      return refuse(err, errlen, rc, "no sequence %" PRIu64 " in cache '%s'", b->seq_id, cache);
    /* Every pin has a connection for owner: release each one's. */
    for (conn_t *o = srv->conns; o; o = o->next)
      if (o->greeted && engine_unpin(eng, id, b->seq_id, o->id) == 0) count++;
    LOG_INFO("admin_unpin", "by_conn=%llu by_uid=%u cache=\"%s\" seq=%llu pins_released=%llu",
             (unsigned long long)c->id, (unsigned)c->uid, cache, (unsigned long long)b->seq_id,
             (unsigned long long)count);
    break;
  }
  case KVCACHE__V1__ADMIN_ACTION__ADMIN_DISCONNECT: {
    if (b->conn_id == c->id)
      return refuse(err, errlen, KVC_E_INVAL, "conn %" PRIu64 " is the one asking", b->conn_id);
    conn_t *o = srv->conns;
    while (o && !(o->id == b->conn_id && o->greeted && o->state != CONN_CLOSED)) o = o->next;
    if (!o)
      return refuse(err, errlen, KVC_E_INVAL, "no client with conn_id %" PRIu64, b->conn_id);
    LOG_INFO("admin_disconnect", "by_conn=%llu by_uid=%u conn=%llu pid=%d",
             (unsigned long long)c->id, (unsigned)c->uid, (unsigned long long)o->id,
             (int)o->pid);
    conn_close(o, "disconnected by an admin");
    count = 1;
    break;
  }
  default:
    return refuse(err, errlen, KVC_E_INVAL, "unknown admin action %d", (int)b->action);
  }
  Kvcache__V1__AdminReply *ar = arena_alloc(a, sizeof *ar);
  if (!ar) return refuse(err, errlen, KVC_E_NOMEM, "out of memory");
  kvcache__v1__admin_reply__init(ar);
  ar->count = count;
  resp->body_case = KVCACHE__V1__RESPONSE__BODY_ADMIN;
  resp->admin = ar;
  return 0;
}
