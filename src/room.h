/* room.h: making the pages a write needs available, all or nothing
 * (room.c): plan, evict, then make each page writable. */
#ifndef KVC_ROOM_H
#define KVC_ROOM_H

#include "core.h"

/* Slots [pos, end) of s that a call writes. */
typedef struct span {
  seq_t *s;
  uint64_t pos, end;
  bool held_only; /* a rewrite in place of the tokens held: entries with no
                     page (all holes) need none, and get none */
} span_t;

/* Calls fn for every page of the span's table; returns the new pages the
 * span needs (past the table, or entries with no page: POOL_NOPAGE). */
uint64_t room_pages(engine_t *eng, const span_t *sp, void (*fn)(engine_t *, uint32_t, void *),
                    void *arg);
/* Plans the new pages and copies on write the spans (of one cache) need and
 * evicts for them: 0, or KVC_E_FULL (with figures) / NOMEM and nothing
 * changed. Then room_writable (or room_page_for_write) on each span, then
 * room_done. */
int room_make(engine_t *eng, const span_t *sp, size_t n);
void room_writable(engine_t *eng, seq_t *s, uint64_t pos, uint64_t end);
/* Extends s's table to cover slot end - 1 with entries of no page (a gap:
 * holes only), within the capacity seq_reserve made. */
void room_table_to(seq_t *s, uint64_t end);
/* room_writable for a held_only span: copies on write the pages held, and
 * leaves entries with no page as they are. */
void room_writable_held(engine_t *eng, seq_t *s, uint64_t pos, uint64_t end);
/* The page for logical page idx of s, allocated or copied so s owns it;
 * entries between the table's end and idx become POOL_NOPAGE (a gap). */
uint32_t room_page_for_write(engine_t *eng, seq_t *s, uint64_t idx);
void room_done(engine_t *eng);

#endif
