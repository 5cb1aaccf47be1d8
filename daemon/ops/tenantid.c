/* tenantid.c: a tenant's engine number and its identity. Numbers are given
 * in the order tenants are first seen, so they differ between daemons (and
 * between runs); the identity is the name's (rvalue_tenant_identity), so a
 * tenant's prompts hash alike on every node that names it alike: what the
 * cluster tier keys and verifies pages by (doc/cluster.md). */
#include "log.h"
#include "rvalue.h"
#include "server.h"

uint32_t server_tenant(server_t *srv, const char *name) {
  uint32_t seen = srv->tenants.n, id = tenants_id(&srv->tenants, name);
  if (!id || id <= seen) return id;
  uint8_t ident[32];
  rvalue_tenant_identity(name, ident);
  int rc = engine_tenant_identity(srv->eng, id, ident);
  if (rc) /* it keeps its number: its pages stay this node's own */
    LOG_WARN("tenant_identity", "tenant=%s error=%s", name, kvc_err_name(rc));
  return id;
}

int server_tenant_shared(server_t *srv) {
  uint8_t ident[32];
  rvalue_tenant_identity(NULL, ident);
  return engine_tenant_identity(srv->eng, TENANT_SHARED, ident);
}
