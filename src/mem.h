/* mem.h: the engine's one heap wrapper; counts live bytes and can fail on cue.
 *
 * Every engine allocation goes through a mem_t owned by the engine (no global
 * state). In release builds malloc is jemalloc (linked by the Makefile); under
 * sanitizers it is libc's. Live bytes are counted with malloc_usable_size, so
 * the count is exact for both. fail_after lets tests fail the k-th allocation.
 */
#ifndef KVC_MEM_H
#define KVC_MEM_H

#include <stddef.h>
#include <stdint.h>

typedef struct mem {
  uint64_t live_bytes; /* bytes currently allocated through this wrapper */
  uint64_t nallocs;    /* successful allocations, ever */
  int64_t fail_after;  /* allocations left before one fails; -1: never */
} mem_t;

void mem_init(mem_t *m);
/* Returns new memory or NULL. n == 0 returns NULL. */
void *mem_alloc(mem_t *m, size_t n);
/* Zeroed; NULL on overflow of count * size. */
void *mem_calloc(mem_t *m, size_t count, size_t size);
/* Like realloc; on failure the old block is untouched and NULL returned. */
void *mem_realloc(mem_t *m, void *p, size_t n);
/* Accepts NULL. */
void mem_free(mem_t *m, void *p);

#endif
