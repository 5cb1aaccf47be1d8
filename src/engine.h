/* engine.h: the kvcached engine, the in-process cache of key/value pages.
 *
 * The engine owns nothing but heap metadata: the page bytes live in a region
 * the caller hands in (the daemon's memfd, a test's malloc) and that outlives
 * the engine. It does no I/O, keeps no global state and never logs; every call
 * takes the engine object. Not thread-safe: one thread calls it at a time.
 *
 * Every fallible call returns 0 or a negative KVC_E_* code. A call that fails
 * leaves the engine exactly as it was (no partial write, no eviction, no
 * allocation kept) and records a one-line reason in engine_last_error().
 *
 *   pool (caller's bytes, npages x page_bytes)
 *   +--------+--------+--------+--------+--------+-----
 *   | page 0 | page 1 | page 2 | page 3 | page 4 | ...
 *   +--------+--------+--------+--------+--------+-----
 *        ^        ^ ^               ^
 *   seq A table: [0, 1]   (tokens 0..31, page_tokens 16)
 *   seq B table: [0, 3]   copy_prefix(A, B, 20): page 0 shared, page 1 was
 *                         shared then copied to 3 when B wrote token 20.
 *
 * See doc/design.md for the pool, the block table, sharing and eviction.
 */
#ifndef KVC_ENGINE_H
#define KVC_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvcache/errors.h"
#include "kvcache/types.h"
#include "stats.h"

typedef struct engine engine_t;

/* The content hash of the prefix index. SHA-256 resists deliberate
 * collisions between tenants; xxHash3-128 is faster and only for a node that
 * declares a single trusted tenant. Either way a hit is verified token by
 * token, so a collision can never serve another prompt's pages. */
typedef enum { KVC_HASH_SHA256 = 0, KVC_HASH_XXH3 = 1 } kvc_hash_t;

typedef struct engine_config {
  void *base;           /* pool bytes; borrowed, must outlive the engine */
  uint64_t pool_bytes;  /* bytes at base: segment_bytes x segments (the rest unused) */
  uint64_t page_bytes;  /* the grain: the smallest page stride (a cache's smaller
                           pages are rounded up to it), a multiple of 64; page
                           ids are counted in grains (pool.h) */
  uint64_t segment_bytes; /* the unit of ownership: each segment holds the pages of
                           one arena (tenant, page size); a multiple of the grain,
                           and the largest cache page accepted. 0: page_bytes
                           (one page a segment: a pool of one page size) */
  uint64_t page_align;  /* a page stride is a multiple of this: 64 (0) or more,
                           dividing page_bytes (4096: a client maps an arena's
                           pages as one array, page-aligned) */
  uint32_t max_caches;  /* 0 means 64 */
  uint64_t max_seqs;    /* 0 means unlimited */
  kvc_hash_t hash;      /* prefix index hash */
  uint32_t pin_limit_pct; /* pinned pages at most this % of the pool; 0: 100 */
  uint32_t hash_bits;   /* test hook: truncate hashes to this many bits; 0: all */
} engine_config_t;

/* Who may share prefix pages: the tenant's salt (given at cache open by the
 * client) and an extra key (an adapter id, ...). Both at most 64 bytes;
 * borrowed for the call. Pages written under one key never match another. */
typedef struct engine_pkey {
  const void *salt;
  size_t salt_len;
  const void *extra;
  size_t extra_len;
  /* match and attach: the query's span keys (kvc_span_key_t: positions of
   * the query); a put's are per entry (engine_io_t). Borrowed. */
  const kvc_span_key_t *spans;
  size_t nspans;
} engine_pkey_t;

/* What a match or attach found. */
typedef struct engine_match {
  uint64_t tokens;      /* leading tokens cached (whole pages) */
  uint64_t pages;       /* pages matched */
  uint64_t ineligible;  /* trailing tokens shorter than a page */
} engine_match_t;

/* Why the last failing call failed. needed/freeable are set for KVC_E_FULL:
 * pages the write needed, and pages free plus reclaimable by eviction. */
typedef struct engine_err {
  int code;
  uint64_t needed;
  uint64_t freeable;
  char msg[192];
} engine_err_t;

/* One entry of a put or get: tokens [pos, pos + ntokens) of seq_id.
 * For a put the buffers are read, for a get they are written; they hold
 * [layer][token][head][dim] of the call's ranges in the call's dtype.
 * k_scale/v_scale are only used by a raw int8 get ([layer][token][head] f32).
 * Buffers are borrowed for the duration of the call. */
typedef struct engine_io {
  uint64_t seq_id;
  uint64_t pos;
  uint64_t ntokens;
  void *k;
  void *v;
  uint64_t k_bytes;
  uint64_t v_bytes;
  void *k_scale;
  void *v_scale;
  uint64_t k_scale_bytes;
  uint64_t v_scale_bytes;
  const uint32_t *tokens; /* put: the token ids written (ntokens), or NULL */
  /* put with tokens: the span keys of the sequence's positions (those
   * outside [pos, pos + ntokens) are ignored); see kvc_span_key_t */
  const kvc_span_key_t *spans;
  size_t nspans;
} engine_io_t;

/* What part of each token a put or get moves, and in which dtype.
 * layer_end/head_end of 0 mean "to the last". dtype 0 means the cache's.
 * Puts accept the cache dtype or f32 (converted, round to nearest even);
 * int8 caches accept f32, f16 and bf16 (quantized). Gets return the cache
 * dtype or f32; int8 caches return f32 (dequantized) or int8 raw + scales.
 * Puts always cover every head (head range must be 0..0 or whole). */
typedef struct engine_xfer {
  uint32_t layer_begin, layer_end;
  uint32_t head_begin, head_end;
  kvc_dtype_t dtype;
  const engine_pkey_t *pkey; /* put with tokens: the chain's key; NULL: empty */
  float k_scale, v_scale;    /* fp8 conversions (kvc_xfer_t); 0 means 1 */
} engine_xfer_t;

/* Creates an engine over cfg->base. Returns new *out (free with
 * engine_free). KVC_E_INVAL for a NULL/misaligned base, a page_bytes that is
 * zero, not a multiple of 64 or larger than the pool, a segment_bytes not a
 * multiple of page_bytes or larger than the pool; KVC_E_NOMEM. */
int engine_new(const engine_config_t *cfg, engine_t **out);
void engine_free(engine_t *eng);

/* Sets the clock used for last_use (milliseconds, any epoch). */
void engine_set_now(engine_t *eng, uint64_t now_ms);

const engine_err_t *engine_last_error(const engine_t *eng);

/* Bytes of one page of a layout, or a negative code if the layout is invalid
 * (NLAYERS, NHEADS, HEADDIM, PAGETOKENS, DTYPE, OVERFLOW). page_tokens 0 is
 * read as the default. */
int64_t engine_layout_page_bytes(const kvc_layout_t *layout);

/* Bytes a transfer of ntokens needs in each buffer, for validation before
 * the call (the daemon checks offsets with it). Any pointer may be NULL. */
int engine_xfer_bytes(engine_t *eng, uint32_t cache_id, const engine_xfer_t *x,
                      bool is_put, uint64_t ntokens, uint64_t *k_bytes,
                      uint64_t *v_bytes, uint64_t *scale_bytes);

/* Opens (creates, or finds with the same layout) the cache `name` of
 * tenant (an opaque number the daemon gives each tenant: names resolve
 * inside it, and it is mixed into the cache's prefix-chain seed, so two
 * tenants' caches of one name share nothing). Sets *cache_id. KVC_E_NAME,
 * layout codes, KVC_E_PAGESIZE, KVC_E_LAYOUT (exists with another layout),
 * KVC_E_TOOMANY, KVC_E_NOMEM. */
int engine_cache_open_in(engine_t *eng, uint32_t tenant, const char *name,
                         const kvc_layout_t *layout, uint32_t *cache_id);
/* engine_cache_open_in with a group: caches of a tenant share an arena only
 * within a group (the daemon gives each shared cache its own, as its
 * readers differ: doc/security.md). engine_cache_open_in is group 0. */
int engine_cache_open_group(engine_t *eng, uint32_t tenant, uint32_t group, const char *name,
                            const kvc_layout_t *layout, uint32_t *cache_id);
/* engine_cache_open_in tenant 0. */
int engine_cache_open(engine_t *eng, const char *name, const kvc_layout_t *layout,
                      uint32_t *cache_id);
/* Bytes from the pool's base of page (a lease's page). */
uint64_t engine_page_pool_offset(const engine_t *eng, uint32_t page);
/* The bytes between two pages of a cache in the pool (its arena's
 * stride), or 0 for no cache. */
uint64_t engine_cache_stride(engine_t *eng, uint32_t cache_id);
/* The tenant a cache belongs to: 0 or KVC_E_NOCACHE. */
int engine_cache_tenant(engine_t *eng, uint32_t cache_id, uint32_t *tenant);
/* A cache's layout (page_tokens filled in), borrowed until the cache is
 * dropped: 0 or KVC_E_NOCACHE. engine_cache_info without the copy, for the
 * checks every put, get and lease makes. */
int engine_cache_layout(engine_t *eng, uint32_t cache_id, const kvc_layout_t **layout);
/* Drops every sequence of a cache (pins included); the cache stays. */
int engine_cache_clear(engine_t *eng, uint32_t cache_id);
/* Drops a cache and all its sequences. Its slot is reused by a later open,
 * under a new id: the dropped id answers KVC_E_NOCACHE. */
int engine_cache_drop(engine_t *eng, uint32_t cache_id);
/* Fills up to cap infos; *n is the number of caches (may exceed cap). */
int engine_cache_list(engine_t *eng, kvc_cache_info_t *out, size_t cap, size_t *n);
int engine_cache_info(engine_t *eng, uint32_t cache_id, kvc_cache_info_t *out);
int engine_cache_stats(engine_t *eng, uint32_t cache_id, cache_stats_t *out);
/* The cache of tenant holding the pos-th most pages (0: the most; ties in
 * no set order), and how many it holds: 0, or KVC_E_RANGE past the
 * tenant's last cache (or for a tenant with none). O(1): the engine keeps
 * each tenant's caches in that order as pages come and go (rank.h). */
int engine_cache_ranked(const engine_t *eng, uint32_t tenant, size_t pos, uint32_t *cache_id,
                        uint64_t *pages);
/* The tenants that ever opened a cache (or got limits of their own): fills
 * up to cap of out; returns how many there are. */
size_t engine_tenants(const engine_t *eng, uint32_t *out, size_t cap);
/* The ids of the caches named name, in any tenant: fills up to cap of ids;
 * returns how many there are. Walks the caches (as opening one does). */
size_t engine_caches_named(const engine_t *eng, const char *name, uint32_t *ids, size_t cap);

/* Writes n entries, all or nothing. Each entry's pos must not exceed the
 * written length of any layer in the range (append or overwrite; no holes)
 * and must not precede the sequence's start. New sequences are created.
 * Pages come from the free list, then from evicting unpinned sequences in LRU
 * order (never a sequence of this call). KVC_E_FULL if they cannot; NOCACHE,
 * RANGE, LAYER, HEAD, DTYPE, SIZE, OVERFLOW, DUPSEQ, NONFINITE, TOOMANY. */
int engine_put(engine_t *eng, uint32_t cache_id, const engine_xfer_t *x,
               const engine_io_t *entries, size_t n);

/* A put whose copy runs outside the engine's thread (a worker of the
 * daemon), as engine_put in three steps. engine_put_begin does everything
 * engine_put does but the copy and the metadata that follows it: it
 * validates, makes room (a failure changes nothing, as engine_put), makes
 * each page a run writes the sequence's own, and marks the sequences busy:
 * until the end every operation that would read their bytes or change them
 * fails with KVC_E_BUSY (metadata reads go on: they see the sequence as it
 * was), eviction passes them over, and their cache cannot be cleared or
 * dropped. engine_put_run copies the entries' buffers into those pages; it
 * touches no engine state, so any thread may run it while the engine's
 * thread goes on. engine_put_end, on the engine's thread, commits what
 * engine_put would after the copy (lengths, token ids and the prefix chain,
 * holes, trims, LRU, counters), clears busy and frees the job. The entries'
 * buffers (and token ids) must stay valid until the end. Returns new *job;
 * the codes of engine_put, KVC_E_BUSY, KVC_E_NOMEM. */
typedef struct engine_put_job engine_put_job_t;
int engine_put_begin(engine_t *eng, uint32_t cache_id, const engine_xfer_t *x,
                     const engine_io_t *entries, size_t n, engine_put_job_t **job);
void engine_put_run(const engine_put_job_t *job);
/* The part-th of nparts shares of engine_put_run (its layers split in
 * nparts ranges; no two shares write the same bytes): nparts copy threads
 * may run them at once, and the job is copied once all have run. */
void engine_put_run_part(const engine_put_job_t *job, unsigned part, unsigned nparts);
/* Layers the job moves: more shares than this would leave some empty. */
unsigned engine_put_job_layers(const engine_put_job_t *job);
void engine_put_end(engine_t *eng, engine_put_job_t *job);

/* Reads n entries; each range must lie in [start, written length of every
 * layer in the range). Nothing is written to any buffer if one entry fails
 * validation. NOSEQ for a missing or evicted sequence. */
int engine_get(engine_t *eng, uint32_t cache_id, const engine_xfer_t *x,
               const engine_io_t *entries, size_t n);

/* remove(seq, begin, end), decided by the length (not the extent): end >=
 * length truncates every layer to begin (tokens a layer-range put wrote past
 * the length included), and with begin <= start drops the sequence; a middle
 * range (end < length) moves the later tokens down by end - begin and
 * re-rotates their keys (a cache with a RoPE description; an encoder cache
 * moves without rotating), all or nothing (KVC_E_FULL when shared pages must
 * be copied first); without RoPE it is KVC_E_NOROPE, with layers of
 * different lengths KVC_E_RANGE. begin > end is KVC_E_RANGE; an empty range
 * or one starting at or past the extent does nothing. */
int engine_remove(engine_t *eng, uint32_t cache_id, uint64_t seq_id,
                  uint64_t begin, uint64_t end);

/* Creates n empty sequences with ids the engine picks, unique in the cache
 * and never below ENGINE_AUTO_SEQ_ID (callers who pick their own ids keep
 * them below it), all or nothing: ids[0..n). KVC_E_TOOMANY (max_seqs),
 * KVC_E_QUOTA_SEQS, KVC_E_NOMEM, KVC_E_NOCACHE; n is at most 4096. */
#define ENGINE_AUTO_SEQ_ID (1ull << 63)
int engine_seq_create(engine_t *eng, uint32_t cache_id, size_t n, uint64_t *ids);

/* Makes dst exactly the first n tokens of src, sharing pages (no bytes
 * copied). dst is created or replaced (its pins stay). KVC_E_SAMESEQ,
 * KVC_E_NOSEQ (src), KVC_E_RANGE (n > length of src or n < its start). */
int engine_copy_prefix(engine_t *eng, uint32_t cache_id, uint64_t src, uint64_t dst,
                       uint64_t n);
/* llama.cpp's seq_cp with p0 > 0: makes dst hold positions [p0, n) of src
 * at the same positions (its start p0, or src's start if later), sharing
 * pages as copy_prefix does; p0 0 is copy_prefix. A range from p0 > 0
 * carries no prefix chain. KVC_E_RANGE for an empty range or n outside
 * [start, length] of src. */
int engine_copy_range(engine_t *eng, uint32_t cache_id, uint64_t src, uint64_t dst,
                      uint64_t p0, uint64_t n);

/* *out = the cache holds what is needed to continue seq at pos: pos <= length
 * and the first position the token at pos attends to is held (causal: 0;
 * window: pos - W; chunked: pos - pos % C). Encoder caches always answer
 * true, causal ones true for pos 0; otherwise a missing sequence is false. */
int engine_can_resume(engine_t *eng, uint32_t cache_id, uint64_t seq_id, uint64_t pos,
                      bool *out);

/* Drops tokens before n (positions kept) and frees whole pages left behind.
 * KVC_E_RANGE if n > length. n <= start does nothing. */
int engine_trim_front(engine_t *eng, uint32_t cache_id, uint64_t seq_id, uint64_t n);

/* Pins seq for owner (idempotent per owner): never evicted while pinned.
 * Pin and unpin count as uses: an unpinned sequence rejoins the LRU as the
 * most recently used. */
int engine_pin(engine_t *eng, uint32_t cache_id, uint64_t seq_id, uint64_t owner);
/* KVC_E_NOTPINNED if owner does not pin it. */
int engine_unpin(engine_t *eng, uint32_t cache_id, uint64_t seq_id, uint64_t owner);
/* Releases every pin of owner; returns how many were released. */
size_t engine_unpin_all(engine_t *eng, uint64_t owner);
/* How many sequences owner pins (hard and TTL pins). */
size_t engine_owner_pins(const engine_t *eng, uint64_t owner);

int engine_seq_info(engine_t *eng, uint32_t cache_id, uint64_t seq_id,
                    kvc_seq_info_t *out);
/* Lists sequences in table order from *cursor (0 to begin), up to cap; sets
 * *n and advances *cursor (0 when done). Like Redis SCAN: a sequence present
 * for the whole scan is returned at least once. */
int engine_seq_list(engine_t *eng, uint32_t cache_id, uint64_t *cursor,
                    kvc_seq_info_t *out, size_t cap, size_t *n);

void engine_stats(const engine_t *eng, engine_stats_t *out);

/* ---- prefix cache (prefix.c) ----------------------------------------------
 * A put that carries token ids (all layers) records them per page. A page that
 * is full, and whose previous pages are hashed, gets the chained hash
 *   H(page) = hash(H(previous page) || token ids || extra),  H(-1) = hash(seed || salt)
 * and enters the cache's index, which keeps it (as a "cached" page) after the
 * last sequence holding it goes away, until eviction reclaims it: cached pages
 * and idle sequences go in LRU order, lower retention priority first, and a
 * cached page only once no indexed page continues its chain. */

/* How many leading tokens of tokens[0..n) the cache holds, whole pages only;
 * each hit is verified against the stored token ids, chain and key, and
 * touches the pages. Counts queried, hit and ineligible tokens. Borrows
 * tokens, which may change during the call (a client's shared buffer): each
 * page's ids are copied once before use, and the walk stops at the first
 * page that misses, so it costs O(pages matched), whatever n is. */
int engine_match(engine_t *eng, uint32_t cache_id, const uint32_t *tokens, uint64_t n,
                 const engine_pkey_t *key, engine_match_t *out);

/* match, then makes dst (created or replaced) exactly the matched pages
 * (shared, no copy) and, if owner != 0, pins dst for owner, in one step: no
 * eviction can come between the match and the attach. dst may be empty. */
int engine_attach(engine_t *eng, uint32_t cache_id, uint64_t dst, const uint32_t *tokens,
                  uint64_t n, const engine_pkey_t *key, uint64_t owner,
                  engine_match_t *out);

/* Retention priority of a sequence, 0..100 (default 35): under pressure lower
 * priorities are evicted first, least recently used first within one. */
int engine_set_priority(engine_t *eng, uint32_t cache_id, uint64_t seq_id, uint32_t prio);

/* A soft pin: like engine_pin, but it lapses at now + ttl_ms unless a read,
 * write or prefix hit refreshes it. ttl_ms 0 turns a soft pin into a hard one.
 * Hard and soft pins both count against the pin limit (KVC_E_PINLIMIT). */
int engine_pin_ttl(engine_t *eng, uint32_t cache_id, uint64_t seq_id, uint64_t owner,
                   uint64_t ttl_ms);

/* Lapses the soft pins whose time has come (the daemon calls it once a
 * second); returns how many lapsed. */
size_t engine_expire(engine_t *eng);

/* Frees the interned prefix keys (salt, extra) no page or sequence uses,
 * once they have doubled since the last collection (the daemon calls it
 * once a second; a tenant at its key quota collects at once). Returns how
 * many it freed. */
size_t engine_keys_collect(engine_t *eng);

/* Per-cache prefix index figures for kvcachectl prefix. */
typedef struct engine_prefix_top {
  uint8_t hash[32];     /* chain head's hash */
  uint64_t hits;        /* times the head was matched */
  uint32_t depth;       /* pages in its longest indexed chain known */
} engine_prefix_top_t;
int engine_prefix_top(engine_t *eng, uint32_t cache_id, engine_prefix_top_t *out, size_t cap,
                      size_t *n);

/* Names tenant with 32 bytes that stand for it in chain seeds and key
 * digests instead of its number, so that two engines that name a tenant
 * alike hash its prompts alike. Only before the tenant holds a cache or a
 * key (KVC_E_BUSY after: its hashes would change under it); KVC_E_EXISTS
 * if another tenant has that identity; KVC_E_NOMEM. Borrows id. */
int engine_tenant_identity(engine_t *eng, uint32_t tenant, const uint8_t id[32]);


/* ---- attention (attn.c, batch.c, shift.c; doc/attention.md) ---------------
 * Token p of a sequence lives in slot p, and its position is p until a
 * seq_div gives the sequence positions of its own (labels: several tokens
 * may share one). Puts, gets, reservations, leases, remove, punch, trim and
 * copies address slots; shift and seq_div address positions, the history
 * view reports them and masks by them. Slots a reservation skips or a shift
 * vacates are holes: gets return zeros for them, history masks them. */

/* One token of a batch. */
typedef struct engine_tok {
  uint64_t seq_id;
  uint64_t pos;
} engine_tok_t;

/* Reserves the slots of a batch (ollama's StartForward): each sequence's
 * tokens, in batch order, are consecutive positions p0, p0 + 1, ...
 * (KVC_E_POSORDER), p0 >= start; p0 past the length leaves holes. Makes
 * every page the batch writes allocated and unshared, all or nothing
 * (KVC_E_FULL with figures), so the put that follows needs no page (unless
 * another call shares or evicts the sequence in between: pin it). Creates
 * sequences. In a window or chunked cache it first frees what no token of
 * the batch or after it can attend to (that stays freed even when the
 * reservation then fails with FULL: the batch's positions made it
 * unreachable). RANGE, TOOMANY, NOCACHE, NOMEM. */
int engine_reserve(engine_t *eng, uint32_t cache_id, const engine_tok_t *toks, size_t n);

/* One sequence's part of a history view: entries [first, first + n) are its
 * positions pos .. pos + n - 1. */
typedef struct engine_span {
  uint64_t seq_id;
  uint64_t pos;
  uint64_t first;
  uint64_t n;
} engine_span_t;

/* A history view. In: k, v ([layer][entry][head][dim], f32 or the cache's
 * float dtype), mask (f32 [token][entry]: 0 attend, -inf masked), spans
 * (spans_cap of them, or NULL). All of k, v, mask NULL asks only the sizes.
 * Out: nentries, nspans. */
typedef struct engine_hist {
  void *k;
  void *v;
  uint64_t k_bytes, v_bytes;
  float *mask;
  uint64_t mask_bytes;
  engine_span_t *spans;
  size_t spans_cap;
  int64_t *positions;     /* NULL, or each entry's position (positions_cap of
                             them, at least nentries: else SIZE) */
  uint64_t positions_cap;
  uint64_t nentries;
  size_t nspans;
  bool own_positions;     /* out: a sequence of the view has positions of its
                             own (else entry first + i of a span is at pos + i) */
} engine_hist_t;

/* With k and v NULL and the mask or the spans set, only those are written
 * (a zero-copy view: the caller reads the entries in place under leases).
 * The history a batch of n tokens attends to: per sequence of the batch (in
 * order of first appearance), its held positions [start, highest batch
 * position + 1) (an encoder cache: [start, length)), gathered in position order, and the mask following the
 * cache's kind; a token never attends to another sequence's entries. The
 * positions must be written (put after reserve). NOSEQ, RANGE, DTYPE (raw
 * int8), SIZE, LAYER, HEAD. */
int engine_history(engine_t *eng, uint32_t cache_id, const engine_xfer_t *x,
                   const engine_tok_t *toks, size_t n, engine_hist_t *h);

/* llama.cpp's seq_add: moves positions [p0, p1) by delta, re-rotating their
 * keys. Negative p0 or p1 means open (from start, to the end). Slots it
 * vacates become holes; it never overwrites another token (RANGE) nor moves
 * below start (RANGE). On a sequence with positions of its own it changes
 * the positions in [p0, p1) and moves no slot (RANGE for one below 0). NOROPE without a RoPE description, KIND for an
 * encoder cache; FULL like a put when pages must be copied or added. */
int engine_shift(engine_t *eng, uint32_t cache_id, uint64_t seq_id, int64_t p0, int64_t p1,
                 int64_t delta);

/* llama.cpp's seq_div: every token of seq_id whose position is in [p0, p1)
 * (open ends as for shift) gets position pos / d, its key turned by
 * pos / d - pos; no slot moves (the sequence gets positions of its own).
 * d 1 changes nothing. INVAL for d < 1, RANGE for p0 > p1, KIND for any
 * cache but a causal one, NOROPE without a RoPE description (rope_style
 * NONE: positions change, bytes do not), BUSY, FULL like a put when shared
 * pages must be copied (all or nothing). */
int engine_seq_div(engine_t *eng, uint32_t cache_id, uint64_t seq_id, int64_t p0, int64_t p1,
                   int64_t d);

/* llama.cpp's seq_rm without a shift: positions [p0, p1) stop holding
 * tokens (holes); a range reaching the length truncates as engine_remove.
 * Open ends as for shift. */
int engine_punch(engine_t *eng, uint32_t cache_id, uint64_t seq_id, int64_t p0, int64_t p1);

/* llama.cpp's seq_keep: drops every sequence of the cache but seq_id (which
 * need not exist). */
int engine_keep(engine_t *eng, uint32_t cache_id, uint64_t seq_id);

/* llama.cpp's seq_pos_min / seq_pos_max: the lowest and highest positions
 * holding a token, -1 for both if none (or no such sequence). */
int engine_pos_range(engine_t *eng, uint32_t cache_id, uint64_t seq_id, int64_t *pmin,
                     int64_t *pmax);

/* Checks every invariant (refcounts against block tables, free list, LRU,
 * pins, counters). Returns 0, or KVC_E_INTERNAL with the first violation in
 * why. Cost O(pages + sequences): for tests and the fuzzers. */
int engine_audit(engine_t *eng, char *why, size_t why_len);

/* A zero-copy read lease: references on the pool pages holding a token range
 * of a sequence, so they are neither freed (eviction, remove, drop) nor
 * written (copy on write) until the lease is released. Token p of the range
 * lies in pages[(p - first_pos) / page_tokens], row r = (p - first_pos) %
 * page_tokens; in that page, layer l's K row of r is at
 * l * layer_bytes + r * k_row_bytes, its V row at
 * l * layer_bytes + v_offset + r * v_row_bytes (heads in order inside a row);
 * int8 scales at k_scale_offset / v_scale_offset + r * heads * 4. */
typedef struct engine_lease {
  uint64_t id;            /* never 0 */
  uint64_t first_pos;     /* position of the first token of pages[0] */
  uint32_t npages;
  const uint32_t *pages;  /* pool page indices; owned by the engine, valid
                             until the lease is released */
  uint32_t page_tokens;
  uint64_t layer_bytes;   /* bytes of one layer in a page */
  uint64_t v_offset;      /* offset of V in a layer */
  uint64_t k_row_bytes;   /* one token's K of one layer, every head */
  uint64_t v_row_bytes;
  uint64_t k_scale_offset;/* int8 only, else 0 */
  uint64_t v_scale_offset;
} engine_lease_t;

/* Leases tokens [begin, end) of seq for owner: every layer must have them
 * (end <= length) and none may be a hole. Fills *out. Counts as a use of the
 * sequence. KVC_E_NOCACHE, KVC_E_NOSEQ, KVC_E_RANGE (empty, before start,
 * past the length, or covering a hole), KVC_E_NOMEM. */
int engine_lease(engine_t *eng, uint32_t cache_id, uint64_t seq_id, uint64_t begin,
                 uint64_t end, uint64_t owner, engine_lease_t *out);
/* Releases one lease of owner; pages no one else holds are freed.
 * KVC_E_NOLEASE if owner holds no lease of that id. */
int engine_lease_release(engine_t *eng, uint64_t owner, uint64_t lease_id);
/* Releases every lease of owner; returns how many. */
size_t engine_lease_release_all(engine_t *eng, uint64_t owner);

/* A get whose copy runs outside the engine's thread (a worker of the
 * daemon): engine_get_begin does everything engine_get does but the copy
 * (validation, counters, LRU) and holds a reference on every page it reads,
 * as a lease does, so nothing frees or writes them meanwhile (a write copies
 * them first). engine_get_run copies into the entries' buffers; it touches
 * no engine state, so any thread may run it while the engine's thread goes
 * on. engine_get_end, on the engine's thread, drops the references and frees
 * the job. Returns new *job; the codes of engine_get, KVC_E_NOMEM. */
typedef struct engine_get_job engine_get_job_t;
int engine_get_begin(engine_t *eng, uint32_t cache_id, const engine_xfer_t *x,
                     const engine_io_t *entries, size_t n, engine_get_job_t **job);
void engine_get_run(const engine_get_job_t *job);
/* The part-th of nparts shares of engine_get_run, as for puts. */
void engine_get_run_part(const engine_get_job_t *job, unsigned part, unsigned nparts);
unsigned engine_get_job_layers(const engine_get_job_t *job);
void engine_get_end(engine_t *eng, engine_get_job_t *job);

/* Page bytes for zero-copy readers: the pool offset of a sequence's page
 * holding position pos. For the daemon's lease path. KVC_E_RANGE outside
 * [start, extent), or for a slot of a page that is all holes (it has no
 * page: doc/attention.md). */
int engine_page_offset(engine_t *eng, uint32_t cache_id, uint64_t seq_id, uint64_t pos,
                       uint64_t *offset);

/* ---- tenant quotas (quota.c; doc/security.md, quotas) ---------------------
 * Every cache belongs to a tenant (engine_cache_open_in); what a tenant's
 * caches hold is counted against that tenant and its limits. A page counts
 * against the tenant of the cache whose sequence allocated it (pages are
 * shared only inside one cache), until it is freed. */

/* A tenant's limits; 0 means unlimited. */
typedef struct engine_tenant_limits {
  uint64_t max_bytes;   /* pool bytes held (the strides of its pages), a share
                           that applies under pressure: while room is free a
                           tenant may pass it; when a put must evict, a tenant
                           it would pass makes room from its own LRU victims
                           alone (KVC_E_QUOTA_PAGES if they are not enough),
                           one within it takes from tenants over theirs first */
  uint64_t max_pinned_bytes; /* bytes of pages pinned plus pages leased
                           (KVC_E_QUOTA_PINS; a page both pinned and leased
                           counts twice), checked at pin, at lease and at every
                           write that grows a pinned sequence */
  uint64_t max_seqs;    /* sequences, empty ones included (KVC_E_QUOTA_SEQS) */
  uint32_t max_caches;  /* caches (KVC_E_QUOTA_CACHES) */
  uint32_t max_keys;    /* interned prefix keys (KVC_E_QUOTA_KEYS) */
  uint64_t min_bytes;   /* a floor: eviction that makes room for another
                           tenant never takes this one below it (a victim
                           whose pages would cross it is passed over); its
                           own puts evict its own data as usual. 0: none */
} engine_tenant_limits_t;

/* A tenant's usage and how often each limit refused it. */
typedef struct engine_tenant_usage {
  uint64_t pages;       /* pool pages held */
  uint64_t bytes;       /* their strides */
  uint64_t pinned;      /* pages pinned (by any owner) */
  uint64_t pinned_bytes;
  uint64_t leased;      /* pages held by leases (a page once, however many) */
  uint64_t leased_bytes;
  uint64_t seqs;
  uint32_t caches;
  uint32_t keys;
  uint64_t refused_pages, refused_pins, refused_seqs, refused_caches, refused_keys;
} engine_tenant_usage_t;

#define ENGINE_TENANT_DEFAULT UINT32_MAX /* the limits of every tenant not set */

/* ---- arenas (doc/design.md, "The pool") ------------------------------------
 * An owner is who may read an arena's segments: (tenant << 32) | group. */
#define ENGINE_OWNER_NONE UINT64_MAX /* a free segment's */
#define ENGINE_NOARENA UINT16_MAX

/* Sets the hook called when a segment is carved into an arena of to_owner:
 * from a free segment (from_owner ENGINE_OWNER_NONE) or from another arena
 * (emptied: its pages moved or evicted). Called inside the engine call that
 * moves it, before any page of it is written: the daemon gives the segment
 * fresh memory when the memory may hold another owner's bytes
 * (doc/security.md). */
void engine_set_segment_hook(engine_t *eng,
                             void (*fn)(void *ctx, uint32_t seg, uint64_t from_owner,
                                        uint64_t to_owner),
                             void *ctx);

typedef struct engine_arena_info {
  uint16_t id;           /* its slot (reused once it is gone) */
  uint64_t uid;          /* never reused */
  uint32_t tenant, group;
  uint64_t page_bytes;   /* its caches' pages */
  uint64_t stride;       /* bytes between two of its pages */
  uint32_t per_seg;      /* pages a segment holds */
  uint32_t segments;     /* segments it owns */
  uint32_t caches;
  uint64_t pages_used, pages_free;
  uint64_t padding_bytes; /* of its segments: stride rounding and tails */
  uint64_t segs_taken, segs_given;
} engine_arena_info_t;

/* The arenas alive, into out (at most cap; *n: how many there are). */
void engine_arenas(const engine_t *eng, engine_arena_info_t *out, size_t cap, size_t *n);
/* The arena of id a (alive): 0, or KVC_E_INVAL. */
int engine_arena_by_id(const engine_t *eng, uint16_t a, engine_arena_info_t *out);
/* Arena id of segment seg, or ENGINE_NOARENA (free, or past the pool). */
uint16_t engine_segment_arena(const engine_t *eng, uint32_t seg);

/* Sets the limits of tenant (ENGINE_TENANT_DEFAULT: of every tenant without
 * its own); lim NULL returns a tenant to the default. Takes effect for the
 * next call: what a tenant already holds over a lowered limit stays until it
 * lets it go. Borrows lim. 0, KVC_E_INVAL, KVC_E_NOMEM. */
int engine_tenant_limits_set(engine_t *eng, uint32_t tenant, const engine_tenant_limits_t *lim);
/* The limits in force for tenant and its usage (zeros for a tenant never
 * seen). Either pointer may be NULL. */
int engine_tenant_usage(engine_t *eng, uint32_t tenant, engine_tenant_limits_t *lim,
                        engine_tenant_usage_t *use);

/* The pool's pin limit, percent of its pages (0: 100), as engine_new's
 * pin_limit_pct: pins already held stay when it is lowered, new ones are
 * refused past it (the daemon's reload). KVC_E_INVAL above 100. */
int engine_set_pin_limit(engine_t *eng, uint32_t pct);
/* Fair pins by default: a tenant without max_pinned_bytes of its own pins
 * at most pin_limit / (tenants with caches + 1), and pins plus leases at
 * most the pin limit (on); off (engine_new's default): no tenant limit. */
void engine_set_pin_share(engine_t *eng, bool on);
/* The pin limit at pct of the pool as it is now (engine_new, a resize). */
void engine_pin_limit_follow(engine_t *eng, uint32_t pct);

/* ---- prefix-index events (evlog.c; doc/events.md) -------------------------
 * With the log on, every change of a prefix index is recorded in order: a
 * page indexed (STORED, parents before children), a page unindexed
 * (REMOVED: reclaimed under pressure, or its cache cleared or dropped), a
 * cache cleared or dropped (after the REMOVED of each of its pages). The
 * caller reads the log with engine_events_next and empties it with
 * engine_events_reset, typically once per event-loop turn. The log is
 * bounded: once a record does not fit, it and every later one until the
 * reset are dropped (counted), so the records read are always a prefix of
 * the changes. */

typedef enum engine_ev_kind {
  ENGINE_EV_STORED = 1,  /* a page entered the index */
  ENGINE_EV_REMOVED = 2, /* a page left the index */
  ENGINE_EV_CLEARED = 3, /* a cache was cleared (engine_cache_clear) */
  ENGINE_EV_DROPPED = 4, /* a cache was dropped (engine_cache_drop) */
} engine_ev_kind_t;

/* Where a page lives: the memory pool, or a tier below it the daemon keeps
 * (engine_events_tier). */
#define ENGINE_MEDIUM_POOL 0u
#define ENGINE_MEDIUM_DISK 1u
#define ENGINE_MEDIUM_REMOTE 2u

typedef struct engine_event {
  engine_ev_kind_t kind;
  uint32_t cache_id;
  uint32_t tenant;        /* the cache's tenant (engine_cache_open_in) */
  uint32_t page_tokens;   /* the cache's tokens per page */
  uint32_t medium;        /* ENGINE_MEDIUM_* */
  bool has_parent;        /* STORED: the page continues an indexed page */
  uint8_t hash[32];       /* STORED, REMOVED: the page's chain hash (xxh3: 16
                             bytes, then zeros) */
  uint8_t parent[32];     /* STORED with has_parent: the parent page's hash */
  uint32_t ntokens;       /* STORED: page_tokens */
  const uint32_t *tokens; /* STORED: the page's token ids; borrowed from the log
                             until engine_events_reset or the next enable */
  const char *cache_name; /* CLEARED, DROPPED, and a lower tier's STORED and
                             REMOVED: the cache's name; borrowed likewise */
} engine_event_t;

/* Turns the log on with room for log_bytes of records (a stored page takes
 * 88 bytes plus 4 per token, a removed one 56), or off with 0 (the log and
 * what it holds are freed). Enabling again keeps the records held when the
 * size is unchanged. KVC_E_INVAL for a size under 4 KiB; KVC_E_NOMEM. */
int engine_events_enable(engine_t *eng, size_t log_bytes);
/* Whether the log is on. */
bool engine_events_on(const engine_t *eng);
/* The record at *cursor (0: the first) into *ev and advances *cursor:
 * true, or false past the last one. */
bool engine_events_next(const engine_t *eng, size_t *cursor, engine_event_t *ev);
/* How many records were dropped since the last reset (the log was full):
 * the records read are the changes before the first of them. */
uint64_t engine_events_dropped(const engine_t *eng);
/* Empties the log. Returns how many records were dropped since the last
 * reset because the log was full (0 when everything was kept). */
uint64_t engine_events_reset(engine_t *eng);
/* Records, in order with the engine's own, a page that entered (kind
 * STORED: parent NULL for a chain head, page_tokens ids) or left (REMOVED)
 * a tier below the pool (medium DISK or REMOTE), of the cache `cache`
 * (a name) of tenant: the cache need not be open (a warm restart's pages).
 * Its record's cache_id is UINT32_MAX. Nothing when the log is off; a
 * full log drops it as any record. */
void engine_events_tier(engine_t *eng, engine_ev_kind_t kind, uint32_t medium, uint32_t tenant,
                        const char *cache, uint32_t page_tokens, const uint8_t hash[32],
                        const uint8_t *parent, const uint32_t *tokens);

/* Test hook: make the k-th heap allocation from now fail (-1 disables). */
void engine_fail_alloc_after(engine_t *eng, int64_t k);

#endif
