/* admin.c: the operator's requests: clients, config, and the admin writes
 * (the daemon answers PERM unless the caller is an admin). */
#include "client.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int call_body(kvc_client_t *c, Kvcache__V1__Request *req, Kvcache__V1__Response **r,
                     Kvcache__V1__Response__BodyCase want) {
  int rc = client_call(c, req, r);
  if (rc) return rc;
  if ((*r)->body_case != want) {
    kvcache__v1__response__free_unpacked(*r, NULL);
    return client_fail(c, KVC_E_PROTO, "the daemon answered without the expected reply");
  }
  return 0;
}

KVC_API int kvc_clients(kvc_client_t *c, kvc_client_entry_t **out, size_t *n) {
  if (!c) return KVC_E_INVAL;
  if (!out || !n) return client_fail(c, KVC_E_INVAL, "kvc_clients: out and n are required");
  *out = NULL;
  *n = 0;
  Kvcache__V1__Empty e = KVCACHE__V1__EMPTY__INIT;
  Kvcache__V1__Request req = KVCACHE__V1__REQUEST__INIT;
  req.body_case = KVCACHE__V1__REQUEST__BODY_CLIENTS;
  req.clients = &e;
  Kvcache__V1__Response *r;
  int rc = call_body(c, &req, &r, KVCACHE__V1__RESPONSE__BODY_CLIENTS);
  if (rc) return rc;
  size_t count = r->clients->n_clients;
  kvc_client_entry_t *v = calloc(count ? count : 1, sizeof *v);
  if (!v) {
    kvcache__v1__response__free_unpacked(r, NULL);
    return client_fail(c, KVC_E_NOMEM, "out of memory");
  }
  for (size_t i = 0; i < count; i++) {
    const Kvcache__V1__ClientInfo *w = r->clients->clients[i];
    kvc_client_entry_t *e2 = &v[i];
    e2->conn_id = w->conn_id;
    e2->pid = w->pid;
    e2->uid = w->uid;
    e2->gid = w->gid;
    snprintf(e2->tenant, sizeof e2->tenant, "%s", w->tenant ? w->tenant : "");
    snprintf(e2->name, sizeof e2->name, "%s", w->name ? w->name : "");
    e2->pins = w->pins;
    e2->leases = w->leases;
    e2->shm_bytes = w->shm_bytes;
    e2->requests = w->requests;
    e2->age_ms = w->age_ms;
    e2->idle_ms = w->idle_ms;
    e2->wq_bytes = w->wq_bytes;
    e2->self = w->self;
  }
  kvcache__v1__response__free_unpacked(r, NULL);
  *out = v;
  *n = count;
  return 0;
}

KVC_API int kvc_config(kvc_client_t *c, kvc_label_t **out, size_t *n) {
  if (!c) return KVC_E_INVAL;
  if (!out || !n) return client_fail(c, KVC_E_INVAL, "kvc_config: out and n are required");
  *out = NULL;
  *n = 0;
  Kvcache__V1__Empty e = KVCACHE__V1__EMPTY__INIT;
  Kvcache__V1__Request req = KVCACHE__V1__REQUEST__INIT;
  req.body_case = KVCACHE__V1__REQUEST__BODY_CONFIG;
  req.config = &e;
  Kvcache__V1__Response *r;
  int rc = call_body(c, &req, &r, KVCACHE__V1__RESPONSE__BODY_CONFIG);
  if (rc) return rc;
  size_t count = r->config->n_options, bytes = (count + 1) * sizeof(kvc_label_t);
  for (size_t i = 0; i < count; i++)
    bytes += strlen(r->config->options[i]->key) + strlen(r->config->options[i]->value) + 2;
  kvc_label_t *v = malloc(bytes);
  if (!v) {
    kvcache__v1__response__free_unpacked(r, NULL);
    return client_fail(c, KVC_E_NOMEM, "out of memory");
  }
  char *p = (char *)(v + count + 1);
  for (size_t i = 0; i < count; i++) {
    const char *src[2] = {r->config->options[i]->key, r->config->options[i]->value};
    const char *dst[2];
    for (int j = 0; j < 2; j++) {
      size_t len = strlen(src[j]) + 1;
      memcpy(p, src[j], len);
      dst[j] = p;
      p += len;
    }
    v[i] = (kvc_label_t){dst[0], dst[1]};
  }
  v[count] = (kvc_label_t){0};
  kvcache__v1__response__free_unpacked(r, NULL);
  *out = v;
  *n = count;
  return 0;
}

KVC_API int kvc_pool_resize(kvc_client_t *c, uint64_t bytes, kvc_pool_resize_t *out) {
  if (!c) return KVC_E_INVAL;
  Kvcache__V1__PoolResize b = KVCACHE__V1__POOL_RESIZE__INIT;
  b.bytes = bytes;
  Kvcache__V1__Request req = KVCACHE__V1__REQUEST__INIT;
  req.body_case = KVCACHE__V1__REQUEST__BODY_POOL_RESIZE;
  req.pool_resize = &b;
  Kvcache__V1__Response *r;
  int rc = call_body(c, &req, &r, KVCACHE__V1__RESPONSE__BODY_POOL_RESIZE);
  if (rc) return rc;
  const Kvcache__V1__PoolResizeReply *p = r->pool_resize;
  if (out)
    *out = (kvc_pool_resize_t){p->bytes, p->segments, p->evicted_pages, p->moved_pages,
                               p->elapsed_us, p->loop_us};
  kvcache__v1__response__free_unpacked(r, NULL);
  return 0;
}

KVC_API int kvc_admin(kvc_client_t *c, kvc_admin_action_t action, const char *cache,
                      uint64_t seq_id, uint64_t conn_id, uint64_t *count) {
  if (!c) return KVC_E_INVAL;
  Kvcache__V1__Admin a = KVCACHE__V1__ADMIN__INIT;
  a.action = (Kvcache__V1__AdminAction)action;
  a.cache = (char *)(cache ? cache : "");
  a.seq_id = seq_id;
  a.conn_id = conn_id;
  Kvcache__V1__Request req = KVCACHE__V1__REQUEST__INIT;
  req.body_case = KVCACHE__V1__REQUEST__BODY_ADMIN;
  req.admin = &a;
  Kvcache__V1__Response *r;
  int rc = call_body(c, &req, &r, KVCACHE__V1__RESPONSE__BODY_ADMIN);
  if (rc) return rc;
  if (count) *count = r->admin->count;
  kvcache__v1__response__free_unpacked(r, NULL);
  return 0;
}
