/* arena.c: chunks of memory handed out by bumping an offset. */
#include "arena.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHUNK_BYTES 16384u

struct arena_chunk {
  arena_chunk_t *next;
  size_t cap, used; /* bytes of data[] and bytes handed out */
  _Alignas(16) unsigned char data[];
};

void arena_init(arena_t *a) { a->head = NULL; }

void arena_deinit(arena_t *a) {
  arena_chunk_t *c = a->head;
  while (c) {
    arena_chunk_t *next = c->next;
    free(c);
    c = next;
  }
  a->head = NULL;
}

void arena_reset(arena_t *a) {
  if (!a->head) return;
  /* Keep the newest chunk only if it is the standard size, so one huge
   * response does not pin its memory forever. */
  arena_chunk_t *keep = a->head->cap == CHUNK_BYTES ? a->head : NULL;
  arena_chunk_t *c = keep ? keep->next : a->head;
  while (c) {
    arena_chunk_t *next = c->next;
    free(c);
    c = next;
  }
  if (keep) {
    keep->next = NULL;
    keep->used = 0;
  }
  a->head = keep;
}

void *arena_alloc(arena_t *a, size_t n) {
  n = (n + 15u) & ~(size_t)15u;
  if (n == 0) n = 16;
  arena_chunk_t *c = a->head;
  if (!c || c->cap - c->used < n) {
    size_t cap = n > CHUNK_BYTES ? n : CHUNK_BYTES;
    c = malloc(sizeof *c + cap);
    if (!c) return NULL;
    c->cap = cap;
    c->used = 0;
    c->next = a->head;
    a->head = c;
  }
  void *p = c->data + c->used;
  c->used += n;
  memset(p, 0, n);
  return p;
}

char *arena_printf(arena_t *a, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (n < 0) return NULL;
  char *s = arena_alloc(a, (size_t)n + 1);
  if (!s) return NULL;
  va_start(ap, fmt);
  vsnprintf(s, (size_t)n + 1, fmt, ap);
  va_end(ap);
  return s;
}
