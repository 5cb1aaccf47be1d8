/* evlog.h: the log of prefix-index changes (evlog.c; doc/events.md).
 *
 * prefix.c and engine.c record here every page that enters the index, every
 * page that leaves it, and every cache cleared or dropped; the daemon reads
 * the log once per loop turn (engine_events_next) and empties it
 * (engine_events_reset). The log is one bounded buffer: when a record does
 * not fit, it and every later record until the reset are dropped and
 * counted, so what the reader sees is always a prefix of what happened.
 * Off (eng->ev NULL, the default) every hook costs one NULL check.
 */
#ifndef KVC_EVLOG_H
#define KVC_EVLOG_H

#include "core.h"

/* A page entered c's index: its hash, its parent's hash (NULL for a chain
 * head) and its page_tokens token ids. */
void evlog_stored(engine_t *eng, const cache_t *c, const ipage_t *ip, const uint8_t *parent);
/* A page of c left the index (reclaimed, or its cache cleared or dropped). */
void evlog_removed(engine_t *eng, const cache_t *c, const uint8_t hash[32]);
/* c was cleared (kind ENGINE_EV_CLEARED) or dropped (ENGINE_EV_DROPPED);
 * the removal of each of its pages was recorded before. */
void evlog_cache(engine_t *eng, const cache_t *c, engine_ev_kind_t kind);
/* Frees the log (engine_free). */
void evlog_free(engine_t *eng);

#endif
