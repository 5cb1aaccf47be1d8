/* wait.c: the one call back of a tier (tier.h), below every tier and the
 * list that names them: a lookup ended, its request runs again. The
 * connection layer is reached through srv->up.resume (conn_tier_done),
 * which main.c sets: no tier names a file above it. */
#include "server.h"
#include "tier.h"

void tiers_done(server_t *srv, uint64_t conn_id, unsigned idx) {
  if (srv->up.resume) srv->up.resume(srv, conn_id, idx);
}
