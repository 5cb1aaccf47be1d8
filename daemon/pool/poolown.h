/* poolown.h: who may read each segment of the pool, and fresh memory for a
 * segment that passes to another owner (poolown.c; doc/security.md, "The
 * pool's memory").
 *
 *   segment s:  engine arena (tenant, group, page size)   -> owner (tenant, group)
 *               memfd id, and the owner whose bytes its memory may hold
 *
 *   carved for owner B, its memory last held owner A's bytes (A != B):
 *     a fresh memfd is mapped in its place (zeros); the old one is closed,
 *     and each client still mapping it is charged its bytes (revoked) until
 *     it maps the pool again (PoolMap), reconnects or closes.
 *
 * A client maps only the segments whose owner it may read: its tenant's
 * (group 0), a shared cache's it has a right on (the group of that cache),
 * every one for an admin. With page_bytes set (one memfd) none of this
 * applies: the pool goes to admins alone, as it did.
 */
#ifndef KVCD_POOLOWN_H
#define KVCD_POOLOWN_H

#include <stdbool.h>
#include <stdint.h>

#include "metrics.h"
#include "server.h"

/* Sets the engine's segment hook when the pool is made of arenas' memfds. */
void poolown_init(server_t *srv);
/* Whether the pool is made of arenas' memfds (page_bytes unset). */
bool poolown_arenas(const server_t *srv);
/* The group of shared cache `name` (stable for the daemon's life, from 1),
 * or 0 out of memory. */
uint32_t poolown_group(server_t *srv, const char *name);
/* Whether c may map segment s now (it holds pages of an owner c may read). */
bool poolown_may_read(const conn_t *c, uint32_t s);
/* c mapped segment s as memfd id (0: it maps it no more). */
int poolown_mapped(conn_t *c, uint32_t s, uint64_t id);
/* c mapped the pool anew: what it held of revoked segments is gone. */
void poolown_remapped(conn_t *c);
/* The arenas viewer c may see (NULL: the operator, every one), as metrics
 * rows from a (their number; 0 out of memory too). */
size_t poolown_arena_rows(server_t *srv, const conn_t *c, arena_t *a, metrics_arena_t **out);
/* c goes: its revoked bytes with it. */
void poolown_conn_free(conn_t *c);

#endif
