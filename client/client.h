/* client.h: libkvcache's internals shared by its files (not installed).
 *
 * A client is a blocking Unix socket plus the mapped shared buffer (and,
 * when the daemon grants them, the rings in it: ring.h). Every call builds
 * one Request, client_call sends it as one frame, through the submission
 * ring or the socket, and waits for the one Response (the daemon answers in
 * order, one reply per request, the way the request came).
 */
#ifndef KVC_CLIENT_INTERNAL_H
#define KVC_CLIENT_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "kvcache.pb-c.h"
#include "kvcache/kvcache.h"
#include "layout.h"
#include "prefault.h"
#include "ring.h"

#define CLIENT_MAX_REPLY_BYTES (256u << 20) /* a larger reply is a protocol error */
#define CLIENT_POOL_SEGMENTS 64               /* the daemon's POOLMAP_SEGMENTS_MAX */

struct kvc_client {
  int fd;                    /* the connected socket; -1 when closed */
  uint8_t *shm;              /* the shared buffer, MAP_SHARED read-write */
  uint64_t shm_bytes;
  uint64_t shm_use;          /* the library's own part: [0, shm_use) (kvc_client_shm_limit) */
  kvc_client_info_t info;    /* from HelloReply */
  uint32_t max_io_entries;   /* entries per Io request: max_entries, frame-bounded */
  uint64_t next_id;          /* request id */
  uint64_t spin_ns;          /* poll this long for a reply before blocking */
  uint32_t timeout_ms;       /* per request; 0: wait forever */
  uint32_t flags;            /* KVC_CLIENT_* */
  client_ring_t ring;        /* the shared-memory rings, if granted (ring.h) */
  bool broken;               /* an I/O or protocol error ended the connection */
  int broken_code;           /* what later calls return: KVC_E_IO or KVC_E_SHUTDOWN */
  char err[256];             /* last error, one line */
  uint64_t full_needed, full_freeable;
  uint8_t *wbuf, *rbuf;      /* frame buffers */
  size_t wcap, rcap;
  size_t rnext_off, rnext_len; /* bytes received past the last reply, in rbuf */
  kvc_cache_t *caches;       /* open handles, freed by kvc_client_close */
  const uint8_t *pool;       /* the daemon's pool: an address range reserved for its
                                segments, each mapped read-only at its offset; NULL if
                                not passed */
  uint64_t pool_bytes;       /* mapped from pool: the segments known, contiguous from 0 */
  uint64_t pool_reserve;     /* bytes of the range (0: one mapping, an older daemon) */
  uint64_t pool_gen;         /* the daemon's segment generation this client mapped */
  struct pool_seg { uint64_t off, bytes, id; } pool_seg[CLIENT_POOL_SEGMENTS];
  uint32_t pool_nseg;
  uint64_t seg_bytes;        /* arenas: every segment this size, mapped only if this
                                client may read it (HelloReply.segment_bytes); 0: no */
  uint64_t *seg_ids;         /* arenas: per segment of the range, the memfd id mapped
                                there (0: zeros, or nothing) */
  uint32_t nseg_ids;
  uint32_t *seg_view;        /* arenas: per segment, its arena's view (views[]) */
  struct arena_view {        /* an arena as one array of pages (kvc_lease_info_t) */
    uint64_t uid;            /* the daemon's arena */
    uint64_t stride;         /* bytes between two of its pages */
    uint32_t per_seg;        /* pages a segment of it holds */
    uint8_t *base;           /* page i at base + i * stride: segment s at s * per_seg */
    uint64_t *ids;           /* per segment: the memfd id mapped there (0: none) */
  } *views;
  uint32_t nviews;
  void (*view_keeper)(void *base, size_t bytes, void *arg); /* kvc_client_keep_views */
  void *view_keeper_arg;
  prefault_t *prefault;      /* populating the pool mapping in the background */
  bool prefault_tried;       /* started it once (or could not) */
  kvc_lease_t *leases;       /* leases held, freed by kvc_client_close */
  kvc_lease_t *lease_spare;  /* a released small lease's handle, for the next one */
  void *io_wire, *io_ptrs, *io_parts; /* transfer scratch, max_io_entries each,
                                         allocated at the first transfer */
  int64_t *hist_pos;         /* the last history view's positions (kvc_hist_t.positions) */
  size_t hist_pos_cap;
  uint64_t release_q[64];    /* deferred lease releases, sent with the next request */
  size_t nrelease;
  /* The event stream (events.c): set once kvc_events_subscribe succeeded. */
  uint64_t ev_req_id;        /* the Subscribe's id, which every push carries; 0: none */
  uint64_t ev_seq;           /* the last batch's sequence number */
  Kvcache__V1__Response *ev_batch; /* the batch being read, or NULL */
  size_t ev_next;            /* its next event */
};

struct kvc_cache {
  kvc_client_t *client;      /* the owner; the handle lives in its list */
  kvc_cache_t *prev, *next;
  uint32_t id;
  uint64_t page_bytes;
  kvc_layout_t layout;       /* page_tokens filled in */
  geom_t geom;               /* its page geometry (src/layout.c), a lease's */
  bool geom_ok;              /* geom was computed (a layout the daemon took) */
  struct xfer_memo {         /* the last transfer resolved (xfer.c): a loop of puts
                                or gets resolves its transfer once */
    kvc_xfer_t x;            /* as asked (NULL: zeros) */
    bool is_put, ok;
    layout_xfer_t r;
  } memo;
  char name[KVC_MAX_NAME + 1];
  uint8_t salt[KVC_MAX_KEY_BYTES];  /* tenant salt of the prefix cache */
  uint8_t extra[KVC_MAX_KEY_BYTES]; /* extra key of token-aware calls */
  uint32_t salt_len, extra_len;     /* bytes of each in use */
};

/* Records a local error; returns code. */
int client_fail(kvc_client_t *c, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Sends req (its id is set here) and waits for the reply. On 0, *resp is
 * new (free with kvcache__v1__response__free_unpacked) unless resp is NULL.
 * A non-OK status returns its code, with the daemon's message in c->err. */
int client_call(kvc_client_t *c, Kvcache__V1__Request *req, Kvcache__V1__Response **resp);
/* client_call for a reply that passes descriptors: up to maxfds of them into
 * fds (*nfds; returns new descriptors, closed here unless the call is 0). */
int client_call_fds(kvc_client_t *c, Kvcache__V1__Request *req, Kvcache__V1__Response **resp,
                    int *fds, int maxfds, int *nfds);
/* Whether a request may go through the fast slots now (ring.h): they are
 * served, the connection is sound and not subscribed, and at most one
 * deferred lease release waits (a fast request carries one). */
bool client_fast_ok(const kvc_client_t *c);
/* Sends q through the fast slots (with the deferred release, if any) and
 * waits for its reply: 0 and *rep; a non-OK status returns its code, with
 * the daemon's message in c->err (and FULL's figures); the codes of a broken
 * connection as client_call. */
int client_call_fast(kvc_client_t *c, ringfast_req_t *q, ringfast_rep_t *rep);
/* Maps the pool's segments again (PoolMap) when gen is not the generation
 * mapped (an older daemon's 0 never is) or `need` bytes from the pool's
 * start are not mapped: segments new at an offset are mapped over what was
 * there, released ones become zeros (a stale pointer reads zeros, never
 * faults). 0, or KVC_E_PROTO and the like, recorded. */
int client_pool_sync(kvc_client_t *c, uint64_t gen, uint64_t need);
/* Unmaps every arena view. */
void client_views_free(kvc_client_t *c);
/* Whether [off, off + n) of the pool lies in what this client maps. */
bool client_pool_holds(const kvc_client_t *c, uint64_t off, uint64_t n);
/* Whether this client may read in place: the pool was passed (an admin, or
 * page_bytes set and the node's one tenant), or the pool is arenas' segments
 * (every client maps those it may read). */
static inline bool client_may_lease(const kvc_client_t *c) { return c->pool || c->seg_bytes; }

/* Waits up to timeout_ms (-1: no bound) for one frame the daemon sends on
 * its own and decodes it: 0 and new *resp, KVC_E_TIMEOUT, or the codes of
 * a broken connection (KVC_E_SHUTDOWN for the daemon's goodbye). */
int client_recv(kvc_client_t *c, int timeout_ms, Kvcache__V1__Response **resp);

/* Frees every lease handle (the daemon releases them when the connection
 * closes). */
void client_leases_free(kvc_client_t *c);
/* The client reads the pool in place (a lease): from the first time, its
 * mapping is populated in the background (prefault.c), unless
 * KVC_CLIENT_NO_PREFAULT. */
void client_pool_read(kvc_client_t *c);
/* KVC_E_PERM for a zero-copy read without the pool mapping; instead says
 * what to use. */
int client_need_pool(kvc_client_t *c, const char *instead);
/* A lease handle from the daemon's reply for [begin, end) of seq_id
 * (KVC_E_PROTO if a page lies outside the pool); linked into the client. */
int client_lease_take(kvc_cache_t *h, const Kvcache__V1__LeaseReply *lr, uint64_t seq_id,
                      uint64_t begin, uint64_t end, kvc_lease_t **out);

/* The KVC_E_* code of a wire status. */
int client_code(Kvcache__V1__Status s);

/* The handle's prefix key as wire bytes (borrowing the handle's arrays). */
ProtobufCBinaryData client_salt(const kvc_cache_t *h);
ProtobufCBinaryData client_extra(const kvc_cache_t *h);

/* Copies a history reply's per-entry positions into c->hist_pos and points
 * *out at them (NULL when the reply has none): 0 or KVC_E_NOMEM/PROTO. */
int client_hist_positions(kvc_client_t *c, const Kvcache__V1__HistoryReply *hr,
                          const int64_t **out);

#endif
