/* core.c: what every operation starts with: recording why it fails, and the
 * one lookup of its cache and sequence. */
#include <stdarg.h>
#include <stdio.h>

#include "core.h"

int engine_fail(engine_t *eng, int code, const char *fmt, ...) {
  va_list ap;
  eng->err.code = code;
  eng->err.needed = eng->err.freeable = 0;
  va_start(ap, fmt);
  vsnprintf(eng->err.msg, sizeof eng->err.msg, fmt, ap);
  va_end(ap);
  eng->st.errors++;
  return code;
}

cache_t *engine_cache(engine_t *eng, uint32_t cache_id) {
  uint32_t slot = cache_id & CACHE_SLOT_MASK;
  if (slot >= eng->ncaches || eng->cache_gen[slot] != cache_id >> CACHE_GEN_SHIFT) return NULL;
  return eng->caches[slot];
}

int engine_find_cache(engine_t *eng, uint32_t cache_id, cache_t **out) {
  *out = engine_cache(eng, cache_id);
  return *out ? 0 : engine_fail(eng, KVC_E_NOCACHE, "no cache with id %u", cache_id);
}

int engine_find_seq(engine_t *eng, uint32_t cache_id, uint64_t seq_id, seq_t **out) {
  cache_t *c;
  int rc = engine_find_cache(eng, cache_id, &c);
  if (rc) return rc;
  *out = hmap_get(&c->seqs, seq_id);
  if (!*out)
    return engine_fail(eng, KVC_E_NOSEQ, "no sequence %llu in cache '%s'",
                       (unsigned long long)seq_id, c->name);
  return 0;
}

int engine_use_seq(engine_t *eng, uint32_t cache_id, uint64_t seq_id, seq_t **out) {
  int rc = engine_find_seq(eng, cache_id, seq_id, out);
  if (rc == 0 && (*out)->busy)
    return engine_fail(eng, KVC_E_BUSY, "sequence %llu is busy: a put to it is still copying",
                       (unsigned long long)seq_id);
  return rc;
}

/* ---- a sequence's rarely used parts (seq_t.x) ---------------------------- */

/* Read-only (a write faults): the parts of every sequence that has none. */
const seq_ext_t seq_ext_none = {0};

int seq_ext_own(engine_t *eng, seq_t *s) {
  if (s->x != &seq_ext_none) return 0;
  seq_ext_t *x = mem_calloc(&eng->mem, 1, sizeof *x);
  if (!x) return KVC_E_NOMEM;
  s->x = x;
  return 0;
}

void seq_ext_release(engine_t *eng, seq_t *s) {
  seq_ext_t *x = s->x;
  if (x == &seq_ext_none || x->layer_len || x->layer_chain || x->holes || x->pos) return;
  mem_free(&eng->mem, x);
  s->x = (seq_ext_t *)&seq_ext_none;
}
