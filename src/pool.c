/* pool.c: O(1) page allocation from a free list, with refcounts and pins. */
#include "pool.h"

#include "kvcache/errors.h"

int pool_init(pool_t *p, mem_t *m, void *base, uint64_t pool_bytes, uint64_t page_bytes) {
  if (!base || page_bytes == 0) return KVC_E_INVAL;
  uint64_t n = pool_bytes / page_bytes;
  if (n == 0 || n >= POOL_NOPAGE) return KVC_E_INVAL;
  p->base = base;
  p->page_bytes = page_bytes;
  p->npages = (uint32_t)n;
  p->nshared = p->npinned = 0;
  p->refcnt = mem_calloc(m, n, sizeof(uint32_t));
  p->pinref = mem_calloc(m, n, sizeof(uint32_t));
  p->plan = mem_calloc(m, n, sizeof(uint32_t));
  if (!p->refcnt || !p->pinref || !p->plan) {
    pool_deinit(p, m);
    return KVC_E_NOMEM;
  }
  pool_free_rebuild(p); /* a fresh pool hands out pages in address order */
  return 0;
}

void pool_deinit(pool_t *p, mem_t *m) {
  mem_free(m, p->refcnt);
  mem_free(m, p->pinref);
  mem_free(m, p->plan);
  p->refcnt = p->pinref = p->plan = NULL;
  p->npages = p->nfree = 0;
  p->free_head = POOL_NOPAGE;
}

uint32_t pool_alloc(pool_t *p) {
  uint32_t page = p->free_head;
  p->free_head = p->pinref[page];
  p->nfree--;
  p->pinref[page] = 0; /* a link no more: no pins yet */
  p->refcnt[page] = 1;
  return page;
}

void pool_ref(pool_t *p, uint32_t page) {
  if (++p->refcnt[page] == 2) p->nshared++;
}

bool pool_unref(pool_t *p, uint32_t page) {
  uint32_t r = --p->refcnt[page];
  if (r == 1) p->nshared--;
  if (r) return false;
  p->pinref[page] = p->free_head; /* unpinned: the field is the link now */
  p->free_head = page;
  p->nfree++;
  return true;
}

void pool_pin(pool_t *p, uint32_t page) {
  if (p->pinref[page]++ == 0) p->npinned++;
}

void pool_unpin(pool_t *p, uint32_t page) {
  if (--p->pinref[page] == 0) p->npinned--;
}

void pool_free_rebuild(pool_t *p) {
  p->free_head = POOL_NOPAGE;
  p->nfree = 0;
  for (uint32_t q = p->npages; q-- > 0;) {
    if (p->refcnt[q]) continue;
    p->pinref[q] = p->free_head;
    p->free_head = q;
    p->nfree++;
  }
}
