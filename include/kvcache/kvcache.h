/* kvcache/kvcache.h: libkvcache, the client library of kvcached.
 *
 * A client is one connection to the daemon. At open it receives a shared
 * buffer (a memfd the daemon creates and passes once); every tensor byte of a
 * put or get moves through it, never through the socket:
 *
 *   caller's k/v  --copy-->  shared buffer  --daemon copies-->  pool page
 *   (kvc_put: two copies)    (kvc_put_shm: the caller fills the buffer
 *                             itself, one copy)
 *
 * A zero-copy read maps no byte at all: the client maps the daemon's pool
 * read-only (a read-only descriptor passed once at open) and, under a lease
 * (kvc_lease), reads the pages of a sequence in place.
 *
 * The pool itself is never mapped writable by a client. Calls are
 * synchronous: each sends one request (or several, see "splitting") and waits
 * for its answer.
 *
 * Threading: a kvc_client_t and its kvc_cache_t handles belong to one thread
 * at a time. Use one client per thread (each has its own connection, buffer
 * and pins); the library keeps no global state.
 *
 * Errors: every fallible call returns 0 or a negative KVC_E_* code
 * (kvcache/errors.h). kvc_client_last_error() then says why in one line (the
 * daemon's message for errors it reports). A call that fails validation
 * changes nothing. KVC_E_IO, KVC_E_PROTO and KVC_E_TIMEOUT on an established
 * client mean the connection is broken: every later call fails with KVC_E_IO;
 * close the client and open a new one.
 *
 * Tensor layout: see kvcache/types.h ([layer][token][head][dim] of the
 * transfer's ranges).
 *
 * Splitting: a transfer larger than the shared buffer (or than one request
 * may carry) is split transparently, first by entries, then by tokens. Each
 * request is atomic (all or nothing) on the daemon, but a split transfer is
 * not atomic as a whole: if a later part fails, earlier parts stay applied.
 *
 * Ownership words: "borrows" (used during the call only), "keeps" (kept
 * until the object is closed), "takes" (now owned by the callee), "returns
 * new" (the caller frees it with the named function).
 */
#ifndef KVCACHE_KVCACHE_H
#define KVCACHE_KVCACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvcache/errors.h"
#include "kvcache/types.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define KVC_API __attribute__((visibility("default")))
#else
#define KVC_API
#endif

#define KVC_VERSION_STRING "0.1.0"
#define KVC_PROTOCOL_VERSION 1 /* the wire protocol this library speaks */

/* Environment variable naming the daemon's socket when opts do not (kvcached
 * binds it too when its socket option is left at auto). */
#define KVC_SOCKET_ENV "KVCACHED_SOCKET"

typedef struct kvc_client kvc_client_t; /* one connection; opaque */
typedef struct kvc_cache kvc_cache_t;   /* an opened cache of a client; opaque */
typedef struct kvc_lease kvc_lease_t;   /* a zero-copy read lease; opaque */

/* Options of kvc_client_open. Zero fields mean the default. */
typedef struct kvc_client_opts {
  const char *socket_path; /* NULL: $KVCACHED_SOCKET, else where kvcached
                              listens by default: /run/kvcached/kvcached.sock
                              as root; else the first of
                              $XDG_RUNTIME_DIR/kvcached.sock,
                              /tmp/kvcached-UID/kvcached.sock and
                              /run/kvcached/kvcached.sock holding a socket.
                              Borrowed. */
  uint64_t shm_bytes;      /* shared buffer wanted; 0: the daemon's default.
                              The daemon clamps it to its bounds. */
  uint32_t timeout_ms;     /* per send/receive; 0: wait forever */
  const char *client_name; /* shown in the daemon's logs; borrowed; may be NULL */
  uint32_t spin_us;        /* poll for a reply up to this long before sleeping: a
                              reply within it costs no wakeup of this thread (on a
                              VM most of a round trip), but the thread spins while
                              it waits. 0: the default, KVC_SPIN_US_DEFAULT through
                              the rings (none on the socket); KVC_CLIENT_NO_SPIN
                              in flags: never. */
  uint32_t server_uid;     /* the uid the daemon must run as, besides root, this
                              process's uid, the user kvcached and
                              $KVCACHE_SERVER_UID (a number or a user name);
                              0: none besides those. Any other server is
                              refused with KVC_E_PEER before a byte is sent. */
  uint32_t flags;          /* KVC_CLIENT_* bits; 0: the defaults */
} kvc_client_opts_t;

/* kvc_client_opts_t.flags. By default a client asks the daemon for
 * shared-memory rings and sends its requests through them (the socket stays
 * for the handshake and as the fallback; doc/protocol.md, "Rings"). */
#define KVC_CLIENT_NO_RINGS 0x1u  /* requests and replies on the socket only */
#define KVC_CLIENT_NO_SPIN 0x2u   /* never poll for a reply: sleep at once */
#define KVC_CLIENT_NO_PREFAULT 0x4u /* leave the pool's read-only mapping (zero-copy
                                     reads) to fault page by page on first read,
                                     instead of populating it in the background
                                     from the first lease on */
#define KVC_CLIENT_NO_FAST 0x8u   /* no fast slots: puts, gets and leases of one
                                     small run go through the ring as Requests
                                     too (doc/protocol.md, "The fast slots") */
#define KVC_SPIN_US_DEFAULT 50u   /* the poll for a reply through the rings, spin_us 0 */
/* A client given the pool's read-only mapping populates at most this much
 * of it in the background from its first lease on, on an idle-priority
 * thread (each GiB costs 2 MiB of page tables with 4 KiB pages); reads past
 * it fault as they come. */
#define KVC_PREFAULT_MAX_BYTES (16ull << 30)

/* What the handshake told the client. */
typedef struct kvc_client_info {
  uint64_t conn_id;         /* owner id of this connection's pins (never 0) */
  uint64_t shm_bytes;       /* size of the shared buffer */
  uint64_t max_frame_bytes; /* largest request frame the daemon accepts */
  uint32_t max_entries;     /* entries one request may carry */
  uint32_t protocol_version;
  uint64_t pool_bytes;      /* the daemon's pool */
  uint64_t page_bytes;      /* one pool page */
  char server_version[32];
} kvc_client_info_t;

/* ---- client ------------------------------------------------------------ */

/* Every call that talks to the daemon may also return KVC_E_SHUTDOWN: the
 * daemon is draining (SIGTERM) and did not run this request; every later call
 * on the client returns it too (reopen once the daemon is back). KVC_E_IO
 * means the connection broke without that notice (the daemon crashed or was
 * killed). */

/* Connects, performs the handshake and maps the shared buffer. opts is
 * borrowed (NULL: defaults). Returns new *out (close with kvc_client_close).
 * KVC_E_NOTRUNNING (no socket or nobody listening), KVC_E_PERM (refused by
 * the daemon or the socket's mode), KVC_E_CONNLIMIT, KVC_E_VERSION,
 * KVC_E_SHUTDOWN, KVC_E_IO, KVC_E_PROTO, KVC_E_TIMEOUT, KVC_E_NOMEM,
 * KVC_E_INVAL (out NULL, path too long). On failure *out is NULL; the reason
 * is available from kvc_client_open_error(). */
KVC_API int kvc_client_open(const kvc_client_opts_t *opts, kvc_client_t **out);

/* The reason the last kvc_client_open of this thread failed (one line; a
 * thread-local static string, valid until the next open on this thread). */
KVC_API const char *kvc_client_open_error(void);

/* Closes the connection (the daemon releases its pins), unmaps the buffer and
 * frees every kvc_cache_t still open on it. Accepts NULL. */
KVC_API void kvc_client_close(kvc_client_t *client);

/* The last error of this client in one line ("" if none). The string is
 * owned by the client and valid until its next call. */
KVC_API const char *kvc_client_last_error(const kvc_client_t *client);

/* For the last KVC_E_FULL: pages the write needed, pages free plus
 * reclaimable by eviction at that time. Either pointer may be NULL. */
KVC_API void kvc_client_last_full(const kvc_client_t *client, uint64_t *needed,
                                  uint64_t *freeable);

/* Copies the handshake figures into *out (borrowed). */
KVC_API void kvc_client_info(const kvc_client_t *client, kvc_client_info_t *out);

/* The shared buffer: *base (writable, mapped for the client's lifetime, owned
 * by the client) and *bytes. Fill it and call kvc_put_shm, or call
 * kvc_get_shm and read it. The library also uses it for the pointer forms
 * (kvc_put and friends), which overwrite it. */
KVC_API void kvc_client_shm(const kvc_client_t *client, void **base, uint64_t *bytes);

/* Keeps the library's own use of the shared buffer within its first bytes
 * bytes (clamped to its size): the pointer forms' staging (kvc_put and
 * friends), kvc_history's view, the token ids of kvc_match and kvc_attach.
 * The rest is the caller's, e.g. tensors allocated there and put with
 * kvc_put_shm (one copy, into the pool) or read into with kvc_get_shm. A
 * transfer that cannot fit one token in the library's part fails with
 * KVC_E_SIZE. The default: the whole buffer. */
KVC_API void kvc_client_shm_limit(kvc_client_t *client, uint64_t bytes);

/* For a binding whose arrays over an arena's view (kvc_lease_info_t's
 * arena_base, arena_pages * page_stride bytes) may outlive the client:
 * kvc_client_close then overlays each view with zero pages, leaves it mapped
 * and calls keep(base, bytes, arg), and the callee unmaps it (munmap) when
 * nothing reads it any more. keep runs inside kvc_client_close and must not
 * call the library. NULL: close unmaps them (the default). */
KVC_API void kvc_client_keep_views(kvc_client_t *client,
                                   void (*keep)(void *base, size_t bytes, void *arg), void *arg);

/* The daemon's pool as this client maps it: read-only (PROT_READ of a
 * read-only descriptor: it cannot be made writable), for the client's
 * lifetime. *base is NULL if the daemon passed no pool. */
KVC_API void kvc_client_pool(const kvc_client_t *client, const void **base, uint64_t *bytes);
/* Bytes of the pool mapping the background prefault has populated so far,
 * and (*total, if not NULL) of how many it will: 0 and 0 without the mapping
 * or with KVC_CLIENT_NO_PREFAULT. */
KVC_API uint64_t kvc_client_pool_prefaulted(const kvc_client_t *client, uint64_t *total);

/* One round trip with no effect. KVC_E_IO if the connection is broken,
 * KVC_E_SHUTDOWN if the daemon is draining. */
KVC_API int kvc_ping(kvc_client_t *client);

/* ---- caches -------------------------------------------------------------- */

/* Opens the cache `name` (borrowed), creating it with `layout` (borrowed) if
 * it does not exist. Returns new *out, owned by the client (close it with
 * kvc_cache_close, or it is freed by kvc_client_close). KVC_E_LAYOUT if the
 * cache exists with another layout; KVC_E_NAME, KVC_E_NLAYERS, KVC_E_NHEADS,
 * KVC_E_HEADDIM, KVC_E_PAGETOKENS, KVC_E_DTYPE, KVC_E_PAGESIZE (a page of the
 * layout exceeds a pool page), KVC_E_TOOMANY. */
KVC_API int kvc_cache_open(kvc_client_t *client, const char *name,
                           const kvc_layout_t *layout, kvc_cache_t **out);

/* kvc_cache_open with a tenant salt for the prefix cache (see "prefix
 * cache" below): the handle's token-aware puts, matches and attaches use it,
 * so pages written under one salt never match a query under another.
 * salt (salt_len bytes, at most KVC_MAX_KEY_BYTES) is borrowed; the handle
 * keeps a copy. salt_len 0 is the empty salt, the one kvc_cache_open uses.
 * KVC_E_INVAL for a longer salt or a NULL salt with salt_len > 0; otherwise
 * the codes of kvc_cache_open. */
KVC_API int kvc_cache_open_salted(kvc_client_t *client, const char *name,
                                  const kvc_layout_t *layout, const void *salt,
                                  size_t salt_len, kvc_cache_t **out);

/* Opens an existing cache by name with whatever layout it has. Returns new
 * *out as kvc_cache_open does. KVC_E_NOCACHE if there is none. */
KVC_API int kvc_cache_find(kvc_client_t *client, const char *name, kvc_cache_t **out);

/* Frees the handle (the cache stays in the daemon). Accepts NULL. */
KVC_API void kvc_cache_close(kvc_cache_t *cache);

/* The cache's layout (page_tokens filled in), name and id; owned by the
 * handle. */
KVC_API const kvc_layout_t *kvc_cache_layout(const kvc_cache_t *cache);
KVC_API const char *kvc_cache_name(const kvc_cache_t *cache);
KVC_API uint32_t kvc_cache_id(const kvc_cache_t *cache);

/* Fills up to cap infos (out borrowed) and sets *n to the number of caches,
 * which may exceed cap (call again with a larger array). */
KVC_API int kvc_cache_list(kvc_client_t *client, kvc_cache_info_t *out, size_t cap,
                           size_t *n);

/* Drops every sequence of the cache, pinned ones too; the cache stays. */
KVC_API int kvc_cache_clear(kvc_cache_t *cache);
/* Drops the cache and its sequences in the daemon. The handle stays valid
 * only for kvc_cache_close; other calls on it answer KVC_E_NOCACHE. */
KVC_API int kvc_cache_drop(kvc_cache_t *cache);

/* ---- transfers ---------------------------------------------------------- */

/* kvc_xfer_t (which part of each token a transfer moves) is in types.h. */

/* One entry of a batched transfer: tokens [pos, pos + ntokens) of seq_id.
 * k/v are read by a put and written by a get ([layer][token][head][dim] of the
 * xfer's ranges; a get may pass NULL to skip one); k_scale/v_scale only for a
 * raw int8 get ([layer][token][head] f32), else NULL. tokens, for a put,
 * are the ntokens token ids written (NULL: unknown); full pages whose ids
 * are all known enter the prefix cache once every layer of them is written
 * with those ids (a layer-range put saves layer by layer, as vLLM's
 * save_kv_layer). All buffers are borrowed for the call. */
typedef struct kvc_io {
  uint64_t seq_id;
  uint64_t pos;
  uint64_t ntokens;
  void *k;
  void *v;
  float *k_scale;
  float *v_scale;
  const uint32_t *tokens;
  /* put with tokens: extra keys of the sequence's positions (an image's
   * hash over its placeholder tokens, ...; kvc_span_key_t in types.h), those
   * outside [pos, pos + ntokens) ignored; NULL: none */
  const kvc_span_key_t *span_keys;
  size_t nspan_keys;
} kvc_io_t;

/* The same with byte offsets into the shared buffer (kvc_client_shm). The
 * lengths follow from the layout and ntokens (see kvc_xfer_bytes); k_len and
 * v_len, when not 0, state the caller's region sizes and must equal them
 * (else KVC_E_SIZE from the daemon). */
typedef struct kvc_shm_io {
  uint64_t seq_id;
  uint64_t pos;
  uint64_t ntokens;
  uint64_t k_off;
  uint64_t v_off;
  uint64_t k_len;       /* 0: as the layout requires */
  uint64_t v_len;       /* 0: as the layout requires */
  uint64_t k_scale_off; /* raw int8 get only */
  uint64_t v_scale_off;
  uint64_t tok_off;     /* put: token ids, u32 little-endian, */
  uint64_t tok_len;     /* 4-byte aligned; tok_len 4 * ntokens, or 0: none */
  const kvc_span_key_t *span_keys; /* as kvc_io_t's (sent in the request) */
  size_t nspan_keys;
} kvc_shm_io_t;

/* Bytes one entry of ntokens needs in each buffer for this cache and xfer
 * (NULL: natural), computed locally from the layout. Any out pointer may be
 * NULL. KVC_E_LAYER, KVC_E_HEAD (bad ranges), KVC_E_DTYPE, KVC_E_OVERFLOW. */
KVC_API int kvc_xfer_bytes(const kvc_cache_t *cache, const kvc_xfer_t *x, bool is_put,
                           uint64_t ntokens, uint64_t *k_bytes, uint64_t *v_bytes,
                           uint64_t *scale_bytes);

/* Writes tokens [pos, pos + ntokens) of seq_id, every layer, natural dtype.
 * k and v are borrowed. pos may be at most the sequence's length (append or
 * overwrite); a new seq_id is created. KVC_E_FULL (see kvc_client_last_full),
 * KVC_E_RANGE, KVC_E_NONFINITE (int8), KVC_E_NOCACHE, KVC_E_SIZE (one token
 * does not fit the shared buffer). */
KVC_API int kvc_put(kvc_cache_t *cache, uint64_t seq_id, uint64_t pos, uint64_t ntokens,
                    const void *k, const void *v);

/* kvc_put with the token ids of the tokens written (tokens[0..ntokens),
 * borrowed): full pages whose ids are all known are hashed into the prefix
 * cache under the handle's salt and extra key. A split put keeps each part's
 * ids with its tokens. */
KVC_API int kvc_put_tokens(kvc_cache_t *cache, uint64_t seq_id, uint64_t pos,
                           uint64_t ntokens, const void *k, const void *v,
                           const uint32_t *tokens);

/* Reads tokens [begin, end) of seq_id, every layer, natural dtype, into k and
 * v (borrowed). KVC_E_NOSEQ, KVC_E_RANGE. */
KVC_API int kvc_get(kvc_cache_t *cache, uint64_t seq_id, uint64_t begin, uint64_t end,
                    void *k, void *v);

/* Reads the single token pos of seq_id for the xfer's ranges (NULL: all). */
KVC_API int kvc_get_token(kvc_cache_t *cache, uint64_t seq_id, uint64_t pos,
                          const kvc_xfer_t *x, void *k, void *v);

/* Reads one head of one layer for tokens [begin, end) ([token][dim]), in the
 * natural dtype. k or v may be NULL to skip it. KVC_E_LAYER, KVC_E_HEAD. */
KVC_API int kvc_get_head(kvc_cache_t *cache, uint64_t seq_id, uint32_t layer,
                         uint32_t head, uint64_t begin, uint64_t end, void *k, void *v);

/* Raw int8 read of an int8 cache: the stored bytes and their f32 scales
 * ([layer][token][head]) for tokens [begin, end) and the xfer's layer and
 * head ranges (x NULL: all; its dtype is ignored). KVC_E_DTYPE for another
 * cache dtype. */
KVC_API int kvc_get_raw(kvc_cache_t *cache, uint64_t seq_id, uint64_t begin,
                        uint64_t end, const kvc_xfer_t *x, int8_t *k, int8_t *v,
                        float *k_scale, float *v_scale);

/* Batched put: n entries (borrowed) in as few requests as fit (one, when they
 * fit the shared buffer and the entry limit), each with its own buffers: the
 * ragged append of a decode step. Each request is all or nothing; a split
 * batch is not (see "splitting"). KVC_E_DUPSEQ if a sequence appears twice.
 * Entries with tokens go as in kvc_put_tokens, for every layer or the
 * layer range of x (a layer-by-layer save: a page enters the prefix cache
 * once every layer of it is saved with the same ids). */
KVC_API int kvc_put_batch(kvc_cache_t *cache, const kvc_xfer_t *x, const kvc_io_t *entries,
                          size_t n);
/* Batched get, the same way. */
KVC_API int kvc_get_batch(kvc_cache_t *cache, const kvc_xfer_t *x, const kvc_io_t *entries,
                          size_t n);

/* Direct-buffer forms: the data is already in (put) or lands in (get) the
 * shared buffer at the entries' offsets; no copy in the library. Entries are
 * sent as they are, unchecked by the library and split only by the
 * per-request entry limit; the daemon validates each: KVC_E_OFFSET (a region
 * outside the buffer, or offset + length overflowing), KVC_E_SIZE, KVC_E_LAYER,
 * KVC_E_HEAD, KVC_E_DTYPE, KVC_E_OVERFLOW, then the codes of kvc_put/kvc_get. */
KVC_API int kvc_put_shm(kvc_cache_t *cache, const kvc_xfer_t *x,
                        const kvc_shm_io_t *entries, size_t n);
KVC_API int kvc_get_shm(kvc_cache_t *cache, const kvc_xfer_t *x,
                        const kvc_shm_io_t *entries, size_t n);

/* ---- zero-copy reads ------------------------------------------------------ */

/* Where a lease's tokens are. Token p (first_pos <= p) is in page
 * pages[(p - first_pos) / page_tokens], at row r = (p - first_pos) %
 * page_tokens. In a page, layer l starts at l * layer_bytes; its K rows come
 * first (row r at r * k_row_bytes: every head in order, head_dim_k elements
 * each, the cache's dtype), then its V rows (row r at v_offset +
 * r * v_row_bytes). For int8 caches the f32 scales of row r are at
 * k_scale_offset + r * num_kv_heads * 4 (V: v_scale_offset + ...), in the
 * same layer. kvc_lease_k / kvc_lease_v compute this. */
typedef struct kvc_lease_info {
  uint64_t lease_id;
  uint64_t seq_id;
  uint64_t begin, end;      /* the leased tokens */
  uint64_t first_pos;       /* position of the first token of pages[0] */
  uint32_t npages;
  uint32_t page_tokens;
  const void *const *pages; /* npages read-only pointers into the pool */
  uint64_t layer_bytes;
  uint64_t v_offset;
  uint64_t k_row_bytes;
  uint64_t v_row_bytes;
  uint64_t k_scale_offset;  /* int8 caches only */
  uint64_t v_scale_offset;
  /* The cache's arena as one array of pages (a daemon of arenas; else
   * arena_base NULL): page i of the array at arena_base + i * page_stride,
   * and block_table[p] the index of pages[p] in it, the form paged-attention
   * kernels read (pages of other arenas are holes: they read as zeros).
   * Valid as pages[] are. */
  const void *arena_base;
  uint64_t page_stride;
  uint64_t arena_pages;     /* entries of the array (holes included) */
  const int32_t *block_table;
} kvc_lease_info_t;

/* Leases tokens [begin, end) of seq_id (every layer must hold them): until
 * kvc_lease_release, or until the connection closes, the daemon neither
 * frees nor overwrites those pages. A later write to the sequence copies a
 * leased page first (so keep leases short while the sequence is being
 * appended: each append into a leased page costs a page copy), and eviction
 * may drop the sequence but not the leased pages. Returns new *out, owned by
 * the client (release it, or kvc_client_close frees it). KVC_E_NOSEQ,
 * KVC_E_RANGE (empty, or past the length), KVC_E_TOOMANY (4096 leases per
 * connection), KVC_E_PERM (the daemon maps the pool only for admins and the
 * tenant of a single-tenant node: read with kvc_get). */
KVC_API int kvc_lease(kvc_cache_t *cache, uint64_t seq_id, uint64_t begin, uint64_t end,
                      kvc_lease_t **out);
/* The lease's placement; owned by the lease. */
KVC_API const kvc_lease_info_t *kvc_lease_info(const kvc_lease_t *lease);
/* Read-only pointer to K (or V) of one token of one layer, all heads in
 * order (the head h starts h * head_dim elements further); NULL if pos is
 * outside the lease or layer outside the layout. */
KVC_API const void *kvc_lease_k(const kvc_lease_t *lease, uint32_t layer, uint64_t pos);
KVC_API const void *kvc_lease_v(const kvc_lease_t *lease, uint32_t layer, uint64_t pos);
/* One range of a batched lease. */
typedef struct kvc_lease_range {
  uint64_t seq_id;
  uint64_t begin, end;
} kvc_lease_range_t;
/* Leases n ranges in one round trip, all or nothing (a refusal leaves none
 * held; the error names the range): out[i] for ranges[i], each released on
 * its own. The codes of kvc_lease; KVC_E_TOOMANY past 4096 leases held. */
KVC_API int kvc_lease_batch(kvc_cache_t *cache, const kvc_lease_range_t *ranges, size_t n,
                            kvc_lease_t **out);
/* Releases the lease in the daemon (one round trip) and frees the handle
 * (in every case: on KVC_E_IO the connection's close releases it). Accepts
 * NULL. */
KVC_API int kvc_lease_release(kvc_lease_t *lease);
/* Frees the handle now and releases the lease in the daemon with this
 * client's next request, whatever it is (no round trip of its own): the
 * pages stay held until then. Use it in a loop that leases again (a decode
 * step reading in place): each read then costs one round trip, not two.
 * After 64 deferred releases the next one sends them at once. Accepts NULL;
 * KVC_E_IO only if that flush fails. */
KVC_API int kvc_lease_release_later(kvc_lease_t *lease);

/* ---- sequences ---------------------------------------------------------- */

/* Removes [begin, end). The length decides (kvc_seq_info_t.length, not the
 * extent):
 * - end >= length: truncates every layer at begin, including tokens a
 *   layer-range put wrote past the length; begin at or before the start then
 *   drops the sequence (never fails for an existing one); begin at or past
 *   the extent changes nothing;
 * - end < length (a middle range): moves the later tokens down by end - begin
 *   with their keys re-rotated (the cache needs a RoPE description, else
 *   KVC_E_NOROPE; KVC_E_RANGE while layers have different lengths; KVC_E_FULL
 *   when shared pages must be copied and cannot).
 * KVC_E_RANGE if begin > end; begin == end changes nothing. */
KVC_API int kvc_seq_remove(kvc_cache_t *cache, uint64_t seq_id, uint64_t begin,
                           uint64_t end);
/* Makes dst the first ntokens of src, sharing pages (copy on write).
 * KVC_E_SAMESEQ, KVC_E_NOSEQ, KVC_E_RANGE. */
KVC_API int kvc_seq_copy_prefix(kvc_cache_t *cache, uint64_t src, uint64_t dst,
                                uint64_t ntokens);
/* llama.cpp's seq_cp(src, dst, p0, p1): dst (created or replaced) holds
 * positions [p0, p1) of src at the same positions, sharing pages (copy on
 * write); its start is p0 (or src's start if later). p0 0 is
 * kvc_seq_copy_prefix. KVC_E_RANGE for an empty range or p1 outside src's
 * [start, length]; KVC_E_SAMESEQ, KVC_E_NOSEQ. */
KVC_API int kvc_seq_copy_range(kvc_cache_t *cache, uint64_t src, uint64_t dst, uint64_t p0,
                               uint64_t p1);
/* The same, but KVC_E_EXISTS (nothing changes) if dst exists. */
KVC_API int kvc_seq_copy_prefix_new(kvc_cache_t *cache, uint64_t src, uint64_t dst,
                                    uint64_t ntokens);
/* Creates n (1..4096) empty sequences with ids the daemon picks into
 * ids[0..n): unique in the cache across every client, never reused while
 * the sequence lives, all at or above 2^63 (ids a caller picks itself should
 * stay below, where the daemon never goes). All or nothing. Owned
 * sequences are dropped when this client's connection closes (however it
 * closes); others live as any sequence. Then write them with puts from
 * position 0. KVC_E_QUOTA_SEQS, KVC_E_TOOMANY. */
KVC_API int kvc_seq_create(kvc_cache_t *cache, size_t n, bool owned, uint64_t *ids);
/* *out = the cache holds what is needed to continue seq_id at pos. */
KVC_API int kvc_seq_can_resume(kvc_cache_t *cache, uint64_t seq_id, uint64_t pos,
                               bool *out);
/* Drops tokens before n (positions kept), freeing whole pages. KVC_E_RANGE. */
KVC_API int kvc_seq_trim_front(kvc_cache_t *cache, uint64_t seq_id, uint64_t n);
/* Pins seq_id for this connection (idempotent): never evicted until unpinned
 * or the connection closes; a pinned sequence's later growth counts as
 * pinned too. KVC_E_NOSEQ, KVC_E_NOCACHE; KVC_E_PINLIMIT past the pool's
 * pin limit (pin_limit_pct, default 50% of the pool: a Llama-3-8B sequence
 * of 2,000 bf16 tokens is 250 MiB); KVC_E_QUOTA_PINS past the tenant's
 * pinned plus leased quota (tenant_max_pinned_pct). Nothing changes on an
 * error. A sequence another connection is writing with a large put waits
 * for it (never KVC_E_BUSY). */
KVC_API int kvc_seq_pin(kvc_cache_t *cache, uint64_t seq_id);
/* KVC_E_NOTPINNED if this connection does not pin it. */
KVC_API int kvc_seq_unpin(kvc_cache_t *cache, uint64_t seq_id);
/* Fills *out (borrowed). KVC_E_NOSEQ. */
KVC_API int kvc_seq_info(kvc_cache_t *cache, uint64_t seq_id, kvc_seq_info_t *out);
/* Lists sequences from *cursor (0 to begin) into out[0..cap) (borrowed); sets
 * *n and advances *cursor, 0 when the scan is complete. A sequence present
 * for the whole scan is returned at least once. */
KVC_API int kvc_seq_list(kvc_cache_t *cache, uint64_t *cursor, kvc_seq_info_t *out,
                         size_t cap, size_t *n);

/* ---- attention-aware sequences (doc/attention.md) -------------------------- */

/* One token of a forward pass's batch. */
typedef struct kvc_tok {
  uint64_t seq_id;
  uint64_t pos;
} kvc_tok_t;

/* Reserves the slots of a batch before it is computed (ollama's
 * StartForward), all or nothing: KVC_E_FULL (kvc_client_last_full) changes
 * nothing. Each sequence's tokens, in batch order, are consecutive positions
 * (KVC_E_POSORDER); a first position past the length leaves holes. Then put
 * the batch's K/V in one kvc_put_batch. Pin the sequences to keep another
 * client's eviction or sharing from undoing the reservation. */
KVC_API int kvc_reserve(kvc_cache_t *cache, const kvc_tok_t *toks, size_t n);

/* One sequence's entries of a history: entries [first, first + n) are its
 * slots pos, pos + 1, ... (a lease view's range), and their positions too
 * unless kvc_hist_t.positions says otherwise (after kvc_seq_div). */
typedef struct kvc_hist_span {
  uint64_t seq_id;
  uint64_t pos;
  uint64_t first;
  uint64_t n;
} kvc_hist_span_t;

/* Where a history view landed in the shared buffer (kvc_client_shm). */
typedef struct kvc_hist {
  uint64_t entries;        /* history entries (all sequences) */
  uint64_t k_off, k_bytes; /* K [layer][entry][head][dim] */
  uint64_t v_off, v_bytes; /* V likewise */
  uint64_t mask_off, mask_bytes; /* f32 [token][entry]: 0 attend, -inf masked */
  size_t nspans;           /* sequences of the batch (spans filled: min(cap, nspans)) */
  const int64_t *positions; /* NULL while every sequence's positions are its
                               slots; else each entry's position (entries of
                               them), owned by the client, valid until its
                               next kvc_history or kvc_step */
} kvc_hist_t;

/* The history the batch toks[0..n) attends to, per layer of x (NULL: all,
 * f32 or the cache's float dtype), gathered in position order per sequence,
 * and its mask (the cache's attention kind; sequences never see each
 * other's entries), written to the shared buffer: K at 0, then V, then the
 * mask, each 64-byte aligned. Call after the batch's put. KVC_E_SIZE if it
 * does not fit the buffer; KVC_E_NOSEQ, KVC_E_RANGE, KVC_E_DTYPE. */
KVC_API int kvc_history(kvc_cache_t *cache, const kvc_xfer_t *x, const kvc_tok_t *toks,
                        size_t n, kvc_hist_t *out, kvc_hist_span_t *spans, size_t spans_cap);

/* ---- the decode step (doc/worker-guide.md) --------------------------------- */

/* What a step returns besides the write: nothing, a zero-copy view (a lease
 * per sequence, read in place in the pool mapping, and the mask in the
 * shared buffer), or the view gathered into the shared buffer. */
typedef enum kvc_view {
  KVC_VIEW_NONE = 0,
  KVC_VIEW_LEASE = 1,
  KVC_VIEW_GATHER = 2,
} kvc_view_t;

typedef struct kvc_step {
  kvc_view_t view;
  uint64_t out_off, out_len; /* the view's region of the shared buffer: K, V
                                (gather only) and the mask land in it, each
                                64-byte aligned */
  bool no_mask;              /* a lease view without the mask: a batch of one
                                token a sequence attends to its span whole
                                (holes aside); saves tokens x entries x 4
                                bytes */
  kvc_hist_span_t *spans;    /* filled: one per sequence, as kvc_history's */
  size_t spans_cap;
  kvc_lease_t **leases;      /* a lease view: leases[i] covers spans[i] (its
                                sequence's [start, its highest new position
                                + 1)), owned by the caller: release them,
                                e.g. with kvc_lease_release_later */
  size_t leases_cap;         /* at least n for a lease view */
  kvc_hist_t hist;           /* filled: entries, where K, V (gather) and the
                                mask landed, their sizes, nspans */
} kvc_step_t;

/* One decode (or prefill) step in one round trip, all or nothing: writes
 * the n entries as kvc_put_shm does (the K/V already in the shared buffer;
 * token ids optional; layers of x), then returns the history view the
 * batch's attention needs (the batch: every entry's tokens, in order; the
 * mask and the spans as kvc_history's). Everything the view needs is checked
 * before the write (the region holds the largest view the write can leave;
 * a lease view the connection's lease count and the tenant's pinned plus
 * leased quota, counting every page of the views), so a refusal (KVC_E_FULL,
 * KVC_E_SIZE, KVC_E_QUOTA_PINS, ...) changes nothing. Only a lease view of a
 * sequence with holes (use the gathered view) fails after the write: then
 * the write stays and nothing is leased. The codes of kvc_put_shm and kvc_history; KVC_E_PERM for a lease
 * view without the pool mapping; KVC_E_TOOMANY past the daemon's entries per
 * request (a step is never split). */
KVC_API int kvc_step(kvc_cache_t *cache, const kvc_xfer_t *x, const kvc_shm_io_t *entries,
                     size_t n, kvc_step_t *step);

/* llama.cpp's seq_add: moves positions [p0, p1) by delta, re-rotating their
 * keys; a negative p0 or p1 is open. Vacated slots become holes; it never
 * overwrites a token or moves below the start (KVC_E_RANGE). After a
 * kvc_seq_div it changes the positions in [p0, p1) and moves no slot
 * (KVC_E_RANGE for a position below 0). KVC_E_NOROPE,
 * KVC_E_KIND (encoder caches), KVC_E_FULL. */
KVC_API int kvc_seq_shift(kvc_cache_t *cache, uint64_t seq_id, int64_t p0, int64_t p1,
                          int64_t delta);
/* llama.cpp's seq_div (self-extend / group attention): every token of
 * seq_id whose position is in [p0, p1) (negative = open) gets position
 * pos / d, its key re-rotated by pos / d - pos; no token moves, so several
 * may share a position and the next token is decoded below the length:
 * puts, gets, reservations and leases still address slots (the next token
 * goes in slot length, at the last token's position + 1), kvc_seq_shift
 * and kvc_seq_div address positions, kvc_history reports and masks by them
 * (doc/attention.md, "Positions are labels"). d 1 changes nothing.
 * KVC_E_INVAL for d < 1, KVC_E_RANGE for p0 > p1 (or a shift that would
 * leave [0, 2^31)), KVC_E_KIND for any cache but a causal one (window and
 * chunked caches free and mask by slot ranges; encoder entries have no
 * positions), KVC_E_NOROPE without a RoPE description (rope_style NONE:
 * positions change, bytes do not), KVC_E_NOSEQ, KVC_E_FULL
 * (kvc_client_last_full) when shared pages must be copied first and cannot:
 * nothing changed. */
KVC_API int kvc_seq_div(kvc_cache_t *cache, uint64_t seq_id, int64_t p0, int64_t p1, int64_t d);
/* Punches [p0, p1) out of seq_id (llama.cpp's seq_rm; the wire's Punch, the
 * engine's engine_punch): those positions stop holding tokens and later ones
 * stay where they are, as holes (a range reaching the length truncates).
 * Negative = open. Unlike kvc_seq_remove, it never moves a token. */
KVC_API int kvc_seq_punch(kvc_cache_t *cache, uint64_t seq_id, int64_t p0, int64_t p1);
/* The old name of kvc_seq_punch, kept for one release (0.2 removes it). */
KVC_API int kvc_seq_rm(kvc_cache_t *cache, uint64_t seq_id, int64_t p0, int64_t p1)
    __attribute__((deprecated("kvc_seq_rm is kvc_seq_punch")));
/* llama.cpp's seq_keep: drops every other sequence of the cache. */
KVC_API int kvc_seq_keep(kvc_cache_t *cache, uint64_t seq_id);
/* llama.cpp's seq_pos_min / seq_pos_max: -1 for both if it holds no token. */
KVC_API int kvc_seq_pos_range(kvc_cache_t *cache, uint64_t seq_id, int64_t *pos_min,
                              int64_t *pos_max);

/* ---- retention ------------------------------------------------------------ */

/* Retention priority of seq_id, 0..KVC_MAX_PRIORITY (KVC_DEFAULT_PRIORITY
 * until set): under pressure lower priorities are evicted first, least
 * recently used first within one. The pages a sequence leaves cached keep
 * its priority. KVC_E_INVAL above 100, KVC_E_NOSEQ. */
KVC_API int kvc_seq_set_priority(kvc_cache_t *cache, uint64_t seq_id, uint32_t priority);

/* A soft pin of seq_id for this connection: like kvc_seq_pin, but it lapses
 * ttl_ms after the sequence's last use (a read, a write or a prefix hit
 * refreshes it; the daemon checks once a second). Pinning again changes the
 * duration; ttl_ms 0 makes it a hard pin. Released on kvc_seq_unpin or when
 * the connection closes. Hard and soft pins together may hold at most the
 * daemon's pin_limit_pct of the pool: KVC_E_PINLIMIT beyond it. KVC_E_RANGE
 * above KVC_MAX_TTL_MS, KVC_E_NOSEQ. */
KVC_API int kvc_seq_pin_ttl(kvc_cache_t *cache, uint64_t seq_id, uint64_t ttl_ms);

/* ---- prefix cache --------------------------------------------------------- *
 * Workers share prompts through content hashes of full pages. A put that
 * carries token ids (kvc_put_tokens, or kvc_io_t.tokens) lets the daemon hash
 * every full page as a chain,
 *   H(page i) = SHA-256(H(page i-1) || its token ids || extra key),
 *   H(page -1) = SHA-256(cache seed || tenant salt),
 * and index it. A match recomputes the chain of a query and verifies every
 * hit against the stored token ids, so a collision never serves another
 * prompt's pages. Indexed pages stay matchable ("cached") after their last
 * sequence goes, until pressure reclaims them (least recently used first,
 * chain tails before heads: a prefix never loses a middle page).
 *
 * The key of a page is the handle's salt (kvc_cache_open_salted) and its
 * extra key (kvc_cache_set_extra), both fixed when it was written: a query
 * only matches pages of the same key.
 */

/* What a match or attach found. */
typedef struct kvc_match {
  uint64_t tokens;      /* leading tokens cached: whole pages only */
  uint64_t pages;       /* pages matched (tokens / page_tokens) */
  uint64_t ineligible;  /* trailing tokens of the query shorter than a page */
} kvc_match_t;

/* The extra key of this handle's later token-aware puts, matches and
 * attaches (an adapter or LoRA id, ...): extra_len bytes, at most
 * KVC_MAX_KEY_BYTES; borrowed, the handle keeps a copy. extra_len 0 clears
 * it. KVC_E_INVAL for a longer key or a NULL extra with extra_len > 0. */
KVC_API int kvc_cache_set_extra(kvc_cache_t *cache, const void *extra, size_t extra_len);

/* How many leading tokens of tokens[0..ntokens) (borrowed) the cache holds
 * under this handle's key, in whole pages; every hit is verified and
 * touches its pages. One round trip: the ids go through the start of the
 * shared buffer, which the call overwrites. *out (borrowed) is filled.
 * KVC_E_SIZE if the ids do not fit the shared buffer; KVC_E_NOCACHE. */
KVC_API int kvc_match(kvc_cache_t *cache, const uint32_t *tokens, uint64_t ntokens,
                      kvc_match_t *out);

/* Matches, then makes dst_seq (created, or replaced) exactly the matched
 * pages: they are shared, no byte is copied, and dst_seq's length is
 * out->tokens (it may be 0). With pin, dst_seq is pinned for this connection
 * in the same step, so nothing can be evicted between the match and the
 * pin; the pin goes like any other (kvc_seq_unpin, or the connection
 * closing). Continue dst_seq with puts from out->tokens. KVC_E_PINLIMIT (and
 * nothing changes) if the pin would exceed the pool's pin limit;
 * KVC_E_TOOMANY, the codes of kvc_match. */
KVC_API int kvc_attach(kvc_cache_t *cache, uint64_t dst_seq, const uint32_t *tokens,
                       uint64_t ntokens, bool pin, kvc_match_t *out);
/* kvc_attach with flags: KVC_ATTACH_PIN (pin, as above), KVC_ATTACH_NO_REPLACE
 * (KVC_E_EXISTS, and nothing changes, if dst_seq exists: two workers that
 * picked the same id do not overwrite each other). */
#define KVC_ATTACH_PIN 1u
#define KVC_ATTACH_NO_REPLACE 2u
KVC_API int kvc_attach_ex(kvc_cache_t *cache, uint64_t dst_seq, const uint32_t *tokens,
                          uint64_t ntokens, unsigned flags, kvc_match_t *out);
/* kvc_match and kvc_attach_ex of a query whose positions carry span keys
 * (kvc_span_key_t: a multimodal input's hash over its placeholder tokens,
 * ...): a page matches only if it was written with the same span keys at
 * the same positions of it (and none where the query has none), so two
 * prompts with the same token ids and different images never match. The
 * list (borrowed) is in increasing order of begin, without overlaps, at
 * most KVC_MAX_SPAN_KEYS long, each key 1 to KVC_MAX_KEY_BYTES bytes
 * (else KVC_E_INVAL); NULL and 0: none. */
KVC_API int kvc_match_spans(kvc_cache_t *cache, const uint32_t *tokens, uint64_t ntokens,
                            const kvc_span_key_t *span_keys, size_t nspan_keys,
                            kvc_match_t *out);
KVC_API int kvc_attach_spans(kvc_cache_t *cache, uint64_t dst_seq, const uint32_t *tokens,
                             uint64_t ntokens, const kvc_span_key_t *span_keys,
                             size_t nspan_keys, unsigned flags, kvc_match_t *out);

/* One chain head of the prefix index. */
typedef struct kvc_prefix_head {
  uint8_t hash[32];     /* the head page's hash (SHA-256; xxh3: 16 bytes, then 0) */
  uint32_t hash_len;    /* meaningful bytes of hash: 32 or 16 */
  uint32_t depth;       /* pages of its longest indexed chain */
  uint64_t hits;        /* matches that reached this head */
} kvc_prefix_head_t;

/* The cache's chain heads with the most hits, most first: fills up to cap
 * (at most 1000) heads of out (borrowed) and sets *n to how many. */
KVC_API int kvc_prefix_top(kvc_cache_t *cache, kvc_prefix_head_t *out, size_t cap,
                           size_t *n);

/* ---- stats -------------------------------------------------------------- */

/* What a figure is: Prometheus's metric types. */
typedef enum kvc_stat_kind {
  KVC_STAT_COUNTER = 0,   /* only grows since the daemon started */
  KVC_STAT_GAUGE = 1,     /* a current value */
  KVC_STAT_HISTOGRAM = 2, /* buckets, sum, count (value is the count) */
  KVC_STAT_INFO = 3,      /* value 1; the facts are in the labels */
} kvc_stat_kind_t;

typedef struct kvc_label {
  const char *key, *value;
} kvc_label_t;

/* One sample of one figure. A family is every sample of one name; its
 * Prometheus name is "kvcached_" + name (doc/stats.md lists them). */
typedef struct kvc_stat {
  const char *name;  /* e.g. "pages_free", "requests_total", "request_duration_seconds" */
  uint64_t value;
  bool gauge;        /* kind != KVC_STAT_COUNTER */
  const char *help;  /* one line */
  const char *cache; /* "" for a global figure, else the cache's name */
  kvc_stat_kind_t kind;
  const char *unit;  /* base unit ("bytes", "seconds", "pages", ...) or "" */
  size_t nlabels;    /* the other labels (op, status, tenant, version) */
  const kvc_label_t *labels;
  size_t nbuckets;   /* histograms: upper bounds in unit, ascending (+Inf */
  const double *bucket_le;       /* implied, its count is value) and the */
  const uint64_t *bucket_count;  /* cumulative counts at or below each */
  double sum;        /* histograms: sum of the observations, in unit */
} kvc_stat_t;

/* What a Stats request asks for besides the node's figures, which every
 * reply holds (constant in size: doc/protocol.md, "Stats"). Zeroed: the
 * KVC_STATS_TOP_DEFAULT caches holding the most pages. A client sees its
 * own tenant's caches and the shared ones it has a right on (an admin:
 * every tenant's). */
typedef struct kvc_stats_opts {
  const char *cache; /* the caches of this name (NULL or "": none by name);
                        an admin's name matches in every tenant */
  uint32_t top;      /* the caches holding the most pages, most first (ties
                        in no set order): 0 is KVC_STATS_TOP_DEFAULT, more
                        than KVC_STATS_TOP_MAX is KVC_STATS_TOP_MAX */
  bool node_only;    /* no cache's figures */
} kvc_stats_opts_t;
#define KVC_STATS_TOP_DEFAULT 10
#define KVC_STATS_TOP_MAX 1000

/* Fetches the node's figures and those of the caches opts asks for (NULL:
 * as zeroed). Returns new *out (one block, strings included; free with
 * kvc_stats_free) and *n. KVC_E_NOCACHE: no cache of that name the caller
 * may see; KVC_E_INVAL: a name with top, or node_only with either;
 * KVC_E_NAME: a name longer than KVC_MAX_NAME. */
KVC_API int kvc_stats_query(kvc_client_t *client, const kvc_stats_opts_t *opts,
                            kvc_stat_t **out, size_t *n);
/* kvc_stats_query with opts NULL: the node's figures and the
 * KVC_STATS_TOP_DEFAULT caches holding the most pages. */
KVC_API int kvc_stats(kvc_client_t *client, kvc_stat_t **out, size_t *n);
/* Frees what kvc_stats and kvc_stats_query returned. Accepts NULL. */
KVC_API void kvc_stats_free(kvc_stat_t *stats);
/* The label value of key in st, or NULL ("cache" answers st->cache). */
KVC_API const char *kvc_stat_label(const kvc_stat_t *st, const char *key);

/* Renders figures as Prometheus text exposition format 0.0.4 (the same text
 * kvcached's metrics_listen endpoint serves): HELP and TYPE once per family,
 * names prefixed "kvcached_". Returns new *out (NUL-terminated, free() it)
 * and its length, or KVC_E_NOMEM. */
KVC_API int kvc_stats_prometheus(const kvc_stat_t *stats, size_t n, char **out, size_t *len);

/* ---- operators (admins only: others get KVC_E_PERM) ------------------------ */

/* One connection of the daemon, like Redis's CLIENT LIST. */
typedef struct kvc_client_entry {
  uint64_t conn_id;
  int32_t pid;
  uint32_t uid, gid;
  char tenant[64];
  char name[64];      /* the client_name of its Hello */
  uint32_t pins, leases;
  uint64_t shm_bytes; /* its shared buffer */
  uint64_t requests;
  uint64_t age_ms, idle_ms;
  uint64_t wq_bytes;  /* reply bytes queued, not yet written */
  bool self;          /* this connection */
} kvc_client_entry_t;

/* Every connection. New *out (free()); *n entries. */
KVC_API int kvc_clients(kvc_client_t *client, kvc_client_entry_t **out, size_t *n);

/* The running daemon's configuration: every option's name and value as
 * kvcached --print-config writes it. New *out (one block; free()). */
KVC_API int kvc_config(kvc_client_t *client, kvc_label_t **out, size_t *n);

typedef enum kvc_admin_action {
  KVC_ADMIN_DROP_CACHE = 1, /* cache: drop it with every sequence */
  KVC_ADMIN_REMOVE_SEQ = 2, /* cache, seq_id: drop the sequence */
  KVC_ADMIN_UNPIN_SEQ = 3,  /* cache, seq_id: release every pin of it */
  KVC_ADMIN_DISCONNECT = 4, /* conn_id: close that connection */
} kvc_admin_action_t;

/* An operator's write. *count (may be NULL): pins released, sequences or
 * connections affected. KVC_E_PERM unless the caller is an admin. */
KVC_API int kvc_admin(kvc_client_t *client, kvc_admin_action_t action, const char *cache,
                      uint64_t seq_id, uint64_t conn_id, uint64_t *count);

/* What an online resize of the pool did (kvc_pool_resize). */
typedef struct kvc_pool_resize {
  uint64_t bytes;         /* the pool now */
  uint32_t segments;      /* memfd segments it is made of */
  uint64_t evicted_pages; /* a shrink: pages eviction freed */
  uint64_t moved_pages;   /* a shrink: pages copied below the new end */
  uint64_t elapsed_us;    /* the daemon's time for it */
  uint64_t loop_us;       /* of it, the time its event loop was held (a shrink's
                             evictions and copies); the rest ran on a thread */
} kvc_pool_resize_t;

/* Resizes the running daemon's pool to bytes (admins only; doc/tiers.md):
 * a grow adds a segment (backed and pre-faulted before it is used; clients
 * that map the pool map it at their next lease), a shrink releases whole
 * segments from the end, evicting least recently used data and moving what
 * stays below the new end. KVC_E_FULL: what cannot be evicted (pinned
 * sequences, leases, tenant floors) would be lost, nothing changed;
 * KVC_E_BUSY: a lease or a copy holds a page there, or a resize is running;
 * KVC_E_INVAL: not a size the pool can take (the message lists the sizes it
 * can shrink to); KVC_E_PERM. out may be NULL. */
KVC_API int kvc_pool_resize(kvc_client_t *client, uint64_t bytes, kvc_pool_resize_t *out);

/* ---- tenants (doc/security.md) -------------------------------------------- */

/* A tenant's connected clients and what its caches hold now. */
typedef struct kvc_tenant_info {
  char name[48];         /* a name of the daemon's `tenants` option, or uid:N */
  uint32_t connections;  /* clients connected */
  uint32_t caches;
  uint64_t sequences;
  uint64_t tokens;
  uint64_t pages;        /* pool pages the block tables of its caches hold */
  /* Quotas: usage against each limit (0: unlimited), and the refusals of
   * each since the daemon started (doc/security.md). */
  uint64_t pool_pages;   /* pool pages it holds, each once (pages of its caches'
                            sizes: the quotas below count their bytes) */
  uint64_t pool_bytes;   /* the bytes of those pages */
  uint64_t max_bytes;    /* its share under pressure */
  uint64_t min_bytes;    /* its floor: eviction for other tenants leaves it this
                            many bytes (tenant_floors; 0: none) */
  uint64_t pinned_bytes, leased_bytes;
  uint64_t max_pinned_bytes; /* pinned plus leased */
  uint64_t max_sequences;
  uint32_t max_caches;
  uint32_t keys, max_keys; /* interned prefix keys in use */
  uint32_t max_connections_per_uid;
  uint64_t shm_bytes, shm_bytes_per_uid; /* shared buffers of its connections */
  uint64_t refused_pages, refused_pins, refused_sequences, refused_caches, refused_keys,
      refused_connections, refused_shm;
} kvc_tenant_info_t;

/* Usage per tenant: a client gets its own tenant's row; an admin every
 * tenant's with connections or caches ("shared" holds the shared caches).
 * Returns new *out (free with kvc_tenants_free) and *n. */
KVC_API int kvc_tenants(kvc_client_t *client, kvc_tenant_info_t **out, size_t *n);
/* Frees what kvc_tenants returned. Accepts NULL. */
KVC_API void kvc_tenants_free(kvc_tenant_info_t *tenants);

/* ---- the event stream (doc/events.md, doc/protocol.md "Subscribe") ---------- */

typedef enum kvc_event_kind {
  KVC_EVENT_STORED = 0,  /* a page entered a prefix index */
  KVC_EVENT_REMOVED = 1, /* a page left it (reclaimed, its cache cleared or dropped) */
  KVC_EVENT_CLEARED = 2, /* a cache was cleared (its pages' REMOVED came first) */
  KVC_EVENT_DROPPED = 3, /* a cache was dropped (likewise) */
  KVC_EVENT_RESET = 4,   /* changes were lost (the daemon's log was full): forget
                            what the stream said so far */
} kvc_event_kind_t;

/* One change of a prefix index. */
typedef struct kvc_event {
  kvc_event_kind_t kind;
  uint32_t cache_id;
  char cache[KVC_MAX_NAME + 1];
  char tenant[48];
  uint8_t hash[32];      /* STORED, REMOVED: the page's chain hash */
  uint32_t hash_len;     /* its bytes: 32 (SHA-256), 16 (xxHash3), 0 (none) */
  uint8_t parent[32];    /* STORED: the hash of the page before it */
  uint32_t parent_len;   /* 0: the page heads its chain */
  uint32_t block_size;   /* tokens a page of the cache */
  char medium[16];       /* where the page lives: "CPU" (the memory pool), "DISK", "REMOTE" */
  const uint32_t *token_ids; /* STORED, when subscribed with them; borrowed
                                until the next kvc_events_next */
  uint32_t ntokens;
  uint64_t seq;          /* the batch it came in: 1, 2, ... for this connection */
  uint64_t missed;       /* batches dropped for this connection just before this
                            one (it did not read fast enough); 0 almost always */
  double ts;             /* when the daemon published the batch (Unix seconds) */
} kvc_event_t;

/* Subscribes this client's connection to the changes of the prefix indexes
 * of the caches it may see (its tenant's, an admin's every tenant's), of
 * the cache named `cache` only unless NULL or empty; token_ids: stored
 * events carry their pages' ids. From then on the connection only
 * receives: any other call on this client fails with KVC_E_INVAL (use a
 * second client for requests). Events that happened before are not sent.
 * KVC_E_NAME for a name too long, KVC_E_INVAL when subscribed already. */
KVC_API int kvc_events_subscribe(kvc_client_t *client, const char *cache, bool token_ids);

/* The next event, waiting up to timeout_ms for it (0: only what has
 * arrived; -1: no bound): 0 and *ev, KVC_E_TIMEOUT, KVC_E_INVAL when not
 * subscribed, KVC_E_SHUTDOWN when the daemon drains, KVC_E_IO when it went
 * away. */
KVC_API int kvc_events_next(kvc_client_t *client, int timeout_ms, kvc_event_t *ev);

#ifdef __cplusplus
}
#endif
#endif
