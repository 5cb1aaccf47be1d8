/* admin.h: the operator's requests (kvcachectl clients, config, drop,
 * remove, unpin, disconnect), each refused with KVC_E_PERM unless the peer
 * is an admin (conn_is_admin). dispatch.c's table calls them. */
#ifndef KVCD_ADMIN_H
#define KVCD_ADMIN_H

#include <stddef.h>

#include "arena.h"
#include "conn.h"
#include "kvcache.pb-c.h"

/* Each fills resp's body from a (the reply's arena) and returns 0, or a
 * KVC_E_* code with a one-line reason in err. */
int admin_clients(conn_t *c, const Kvcache__V1__Request *req, arena_t *a,
                  Kvcache__V1__Response *resp, char *err, size_t errlen);
int admin_config(conn_t *c, const Kvcache__V1__Request *req, arena_t *a,
                 Kvcache__V1__Response *resp, char *err, size_t errlen);
int admin_admin(conn_t *c, const Kvcache__V1__Request *req, arena_t *a,
                Kvcache__V1__Response *resp, char *err, size_t errlen);

#endif
