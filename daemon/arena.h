/* arena.h: a bump allocator for building one response, freed all at once.
 *
 * Handlers allocate the submessages, arrays and strings of a Response from
 * the arena; after the Response is packed, arena_reset drops them together.
 * Chunks stay allocated for the next response (up to a retained bound).
 */
#ifndef KVCD_ARENA_H
#define KVCD_ARENA_H

#include <stddef.h>

typedef struct arena_chunk arena_chunk_t;

typedef struct arena {
  arena_chunk_t *head; /* current chunk; older ones follow */
} arena_t;

void arena_init(arena_t *a);
/* Frees every chunk. */
void arena_deinit(arena_t *a);
/* Drops every allocation, keeping one chunk for reuse. */
void arena_reset(arena_t *a);
/* Zeroed memory aligned for any type, valid until reset. NULL on failure. */
void *arena_alloc(arena_t *a, size_t n);
/* A copy of printf output, NULL on failure. */
char *arena_printf(arena_t *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
