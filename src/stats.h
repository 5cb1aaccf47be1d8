/* stats.h: the engine's counters and gauges, each defined once.
 *
 * ENGINE_STATS(X) expands X(name, kind, unit, help) for every figure. The engine
 * fills a struct generated from the list; the daemon renders the same list
 * to the wire, and kvcachectl to text, JSON and Prometheus, so a figure added
 * here appears everywhere. kind is STAT_COUNTER (monotonic) or STAT_GAUGE;
 * unit is what one counts (a base unit: bytes, not KiB). Exported, a
 * counter's name gains "_total" (puts -> kvcached_puts_total) and the
 * per-cache figures are the kvcached_cache_* families (doc/stats.md).
 */
#ifndef KVC_STATS_H
#define KVC_STATS_H

#include <stdint.h>

enum stat_kind { STAT_COUNTER = 0, STAT_GAUGE = 1 };

#define ENGINE_STATS(X)                                                        \
  X(pool_bytes,         STAT_GAUGE, "bytes",   "bytes of the page pool")                 \
  X(page_bytes,         STAT_GAUGE, "bytes",   "the grain: the smallest page stride")    \
  X(segment_bytes,      STAT_GAUGE, "bytes",   "bytes of one pool segment (the largest page)") \
  X(segments,           STAT_GAUGE, "segments", "pool segments")                         \
  X(segments_free,      STAT_GAUGE, "segments", "pool segments no arena owns")          \
  X(arenas,             STAT_GAUGE, "arenas",  "arenas: (tenant, page size) with caches or pages") \
  X(pool_pages,        STAT_GAUGE, "pages",   "pages in use plus pages_free")          \
  X(pages_free,         STAT_GAUGE, "pages",   "free pages of arenas, and free segments in pages of the grain") \
  X(pages_used,         STAT_GAUGE, "pages",   "pages referenced by a sequence or the prefix index") \
  X(pages_shared,       STAT_GAUGE, "pages",   "pages referenced by more than one sequence") \
  X(pages_pinned,       STAT_GAUGE, "pages",   "pages referenced by a pinned sequence")  \
  X(bytes_used,         STAT_GAUGE, "bytes",   "layout bytes in used pages")             \
  X(bytes_padding,      STAT_GAUGE, "bytes",   "bytes of arenas' segments no page can use (stride rounding, segment tails)") \
  X(bytes_free,         STAT_GAUGE, "bytes",   "pool bytes in no page in use")          \
  X(metadata_bytes,     STAT_GAUGE, "bytes",   "engine heap bytes (page metadata, block tables)") \
  X(caches,             STAT_GAUGE, "caches",   "open caches")                            \
  X(sequences,          STAT_GAUGE, "sequences",   "sequences held")                         \
  X(sequences_pinned,   STAT_GAUGE, "sequences",   "sequences pinned by at least one owner") \
  X(tokens,             STAT_GAUGE, "tokens",   "tokens held (sum of lengths)")           \
  X(puts,               STAT_COUNTER, "entries", "put entries applied")                    \
  X(put_tokens,         STAT_COUNTER, "tokens", "tokens written by puts")                 \
  X(gets,               STAT_COUNTER, "entries", "get entries served")                     \
  X(get_tokens,         STAT_COUNTER, "tokens", "tokens read by gets")                    \
  X(removes,            STAT_COUNTER, "calls", "remove calls applied")                   \
  X(copies,             STAT_COUNTER, "calls", "copy_prefix calls applied")              \
  X(trims,              STAT_COUNTER, "calls", "trim_front calls applied")               \
  X(pins,               STAT_COUNTER, "calls", "pin calls applied")                      \
  X(unpins,             STAT_COUNTER, "pins", "pins released (unpin or owner gone)")    \
  X(bytes_in,           STAT_COUNTER, "bytes", "bytes written into pages by puts")       \
  X(bytes_out,          STAT_COUNTER, "bytes", "bytes produced by gets")                 \
  X(cow_copies,         STAT_COUNTER, "pages", "pages copied on write")                  \
  X(evicted_sequences,  STAT_COUNTER, "sequences", "sequences evicted to make room")         \
  X(evicted_pages,      STAT_COUNTER, "pages", "pages freed by eviction")                \
  X(segment_moves,      STAT_COUNTER, "segments", "segments taken from one arena for another") \
  X(segment_moved_pages, STAT_COUNTER, "pages", "pages moved to empty a segment for another arena") \
  X(full_errors,        STAT_COUNTER, "errors", "writes refused with KVC_E_FULL")         \
  X(errors,             STAT_COUNTER, "errors", "engine calls that failed")              \
  PREFIX_STATS(X)                                                              \
  X(pins_lapsed,        STAT_COUNTER, "pins", "soft pins that lapsed (TTL)")            \
  X(pin_limit_errors,   STAT_COUNTER, "errors", "pins refused by the pin limit")        \
  X(leases,             STAT_GAUGE, "leases",   "zero-copy read leases held")             \
  X(leased_pages,       STAT_GAUGE, "pages",   "page references held by leases")         \
  X(leases_taken,       STAT_COUNTER, "leases", "zero-copy read leases granted")

/* The prefix index, globally and per cache. Evictions by reason: capacity is
 * evicted_sequences + cached_reclaimed, TTL lapse is pins_lapsed (the
 * sequence then goes by capacity), explicit is removes. */
#define PREFIX_STATS(X)                                                        \
  X(prefix_matches,     STAT_COUNTER, "requests", "match and attach requests")              \
  X(prefix_tokens_queried,  STAT_COUNTER, "tokens", "tokens offered to match/attach")     \
  X(prefix_tokens_hit,  STAT_COUNTER, "tokens", "tokens found cached (whole pages)")      \
  X(prefix_tokens_ineligible,  STAT_COUNTER, "tokens", "queried tokens after the last whole page") \
  X(pages_indexed,      STAT_GAUGE, "pages",   "pages in the prefix index")              \
  X(pages_cached,       STAT_GAUGE, "pages",   "indexed pages no sequence holds")        \
  X(cached_reclaimed,   STAT_COUNTER, "pages", "cached pages reclaimed under pressure")  \
  X(hash_verify_failed,  STAT_COUNTER, "pages", "index hits whose tokens, chain or key differ") \
  X(hash_collisions,    STAT_COUNTER, "pages", "full pages left unindexed: hash slot taken")

/* Per-cache subset: the same names, scoped to one cache. */
#define CACHE_STATS(X)                                                         \
  X(sequences,          STAT_GAUGE, "sequences",   "sequences held")                         \
  X(tokens,             STAT_GAUGE, "tokens",   "tokens held")                            \
  X(pages,              STAT_GAUGE, "pages",   "pages referenced (shared counted once per sequence)") \
  X(puts,               STAT_COUNTER, "entries", "put entries applied")                    \
  X(gets,               STAT_COUNTER, "entries", "get entries served")                     \
  X(cow_copies,         STAT_COUNTER, "pages", "pages copied on write")                  \
  X(evicted_sequences,  STAT_COUNTER, "sequences", "sequences evicted")                      \
  X(full_errors,        STAT_COUNTER, "errors", "writes refused with KVC_E_FULL")         \
  PREFIX_STATS(X)

#define STAT_FIELD_(name, kind, unit, help) uint64_t name;
typedef struct engine_stats { ENGINE_STATS(STAT_FIELD_) } engine_stats_t;
typedef struct cache_stats { CACHE_STATS(STAT_FIELD_) } cache_stats_t;
#undef STAT_FIELD_

#endif
