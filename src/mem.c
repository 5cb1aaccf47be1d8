/* mem.c: counting heap wrapper with allocation-failure injection. */
#include "mem.h"

#include <malloc.h>
#include <stdlib.h>
#include <string.h>

void mem_init(mem_t *m) {
  m->live_bytes = 0;
  m->nallocs = 0;
  m->fail_after = -1;
}

/* Consumes one allocation of the failure countdown; true if this one fails. */
static int should_fail(mem_t *m) {
  if (m->fail_after < 0) return 0;
  if (m->fail_after == 0) return 1;
  m->fail_after--;
  return 0;
}

void *mem_alloc(mem_t *m, size_t n) {
  if (n == 0 || should_fail(m)) return NULL;
  void *p = malloc(n);
  if (p) {
    m->live_bytes += malloc_usable_size(p);
    m->nallocs++;
  }
  return p;
}

void *mem_calloc(mem_t *m, size_t count, size_t size) {
  if (size && count > SIZE_MAX / size) return NULL;
  void *p = mem_alloc(m, count * size);
  if (p) memset(p, 0, count * size);
  return p;
}

void *mem_realloc(mem_t *m, void *p, size_t n) {
  if (!p) return mem_alloc(m, n);
  size_t old = malloc_usable_size(p);
  /* a shrink is no allocation to fail: the undo of a failed call's growth
   * (put's rollback, seq_pos_shrink) runs after the injected failure */
  if (n == 0 || (n > old && should_fail(m))) return NULL;
  void *q = realloc(p, n);
  if (!q) return NULL;
  m->live_bytes = m->live_bytes - old + malloc_usable_size(q);
  m->nallocs++;
  return q;
}

void mem_free(mem_t *m, void *p) {
  if (!p) return;
  m->live_bytes -= malloc_usable_size(p);
  free(p);
}
