/* lease.h: page references held for a reader (lease.c): zero-copy reads,
 * and the pages a get copied off the engine's thread reads. */
#ifndef KVC_LEASE_H
#define KVC_LEASE_H

#include "core.h"

struct lease {
  uint64_t id;
  uint64_t owner;
  uint64_t layout_bytes;     /* the cache's page bytes, for bytes_used */
  quota_t *q;                /* set: a connection's lease, counted in lease_ref and
                                as leased pages of their tenant; NULL: internal */
  lease_t *prev, *next;      /* eng->lease_list */
  uint32_t cap;              /* pages it has room for */
  uint32_t npages;
  uint32_t pages[];          /* referenced pool pages, in token order */
};

/* An internal lease (owner 0) on n pages (listed in any order, repeats
 * allowed), for a copy that runs outside the engine's thread. NULL: out of
 * memory (nothing changed). */
lease_t *lease_pages(engine_t *eng, const uint32_t *pages, uint32_t n, uint64_t layout_bytes);
/* Releases a lease (pages no one else holds are freed). */
void lease_drop(engine_t *eng, lease_t *l);
/* Frees every lease without touching page counts (the engine is going away),
 * and the spare. */
void lease_free_all(engine_t *eng);

#endif
