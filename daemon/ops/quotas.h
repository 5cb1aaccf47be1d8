/* quotas.h: the daemon's half of the quotas (doc/security.md, quotas): the
 * engine's per-tenant limits from the configuration, connections and
 * shared-buffer bytes per uid, idle connections. */
#ifndef KVCD_QUOTAS_H
#define KVCD_QUOTAS_H

#include <stddef.h>
#include <stdint.h>

#include "conn.h"
#include "server.h"

/* Gives the engine the per-tenant limits of srv->cfg (at start and after a
 * reload); 0, or a negative code (out of memory: the old limits stay). */
int quotas_apply(server_t *srv);
/* Whether accepting c (credentials and tenant known, not yet counted) would
 * pass max_connections_per_uid: then the reason is in msg and the refusal is
 * counted for c's tenant. Admins are exempt. */
bool quotas_conn_over(server_t *srv, const conn_t *c, char *msg, size_t len);
/* Whether a shared buffer of bytes more for c would pass shm_bytes_per_uid
 * or shm_bytes_total: then the reason is in msg, the refusal counted. */
bool quotas_shm_over(server_t *srv, const conn_t *c, uint64_t bytes, char *msg, size_t len);
/* Fills the quota fields of tenant's row of the Tenants reply (usage,
 * limits, refusals); shm_bytes is the caller's sum. */
void quotas_row(server_t *srv, uint32_t tenant, Kvcache__V1__TenantInfo *row);
/* The quota refusals a viewer may see, by tenant: its own tenant's always
 * (viewer_tenant), and with all every other tenant refused anything.
 * Arrays from a. Returns how many rows (0 out of memory). */
size_t quotas_refusals(server_t *srv, uint32_t viewer_tenant, bool all, arena_t *a,
                       metrics_refusals_t **out);
/* Notes that c sent a request (for the idle timeout). */
void quotas_touch(conn_t *c);

#endif
