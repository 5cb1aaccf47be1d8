/* rsend.h: the write-behind's sender thread (rsend.c): encodes each page's
 * value and SETs it over connections of its own, off the event loop, at a
 * lower priority than the loop (nice 10, as the copy threads: where the two
 * share a CPU the loop's requests come first, and pages wait).
 *
 *   loop (rwrite.c)                       sender thread
 *   page held (engine_page_hold),  --->   value encoded from the held pool
 *   key, slot, the slot's master          page (MAC and all); SET written
 *   from the map                          straight from that buffer; MOVED
 *                                         and ASK followed (at most 5)
 *   hold released, figures, retries <---  the result, and the MOVED seen
 *
 * The thread reads only the held page and the job; its connections are its
 * own (blocking, with cluster_connect_timeout_ms and
 * cluster_command_timeout_ms); a node that failed is not tried again for
 * cluster_breaker_ms.
 */
#ifndef KVCD_RSEND_H
#define KVCD_RSEND_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "rvalue.h"
#include "work.h"

typedef struct rsend rsend_t;

enum rsend_result {
  RS_OK = 0,
  RS_TIMEOUT,   /* a node did not answer in time */
  RS_CONN,      /* no connection (refused, lost, or the node failed lately) */
  RS_OOM,       /* the cluster is full and evicts nothing */
  RS_ERROR,     /* another error reply (CLUSTERDOWN, TRYAGAIN, ...) */
  RS_REDIRECTS, /* too many MOVED/ASK */
  RS_CANCELLED  /* not sent: the sender stopped */
};

typedef struct rsend_job {
  work_job_t wj;                /* first: the work queue's (WORK_NET) */
  struct rsend *sender;         /* set by rsend_submit */
  void *owner;                  /* the loop's */
  /* in: set on the loop */
  char key[RVALUE_KEY_MAX];
  size_t klen;
  char host[64];                /* the slot's master, from the map */
  int port;
  uint32_t ttl_s;
  rvalue_cache_t rc;
  engine_page_t pg;             /* bytes: the held page (or a copy); tokens: ids below */
  /* out: set by the thread */
  enum rsend_result res;
  size_t vlen;                  /* value bytes */
  bool moved;                   /* a MOVED was followed: the slot is there */
  uint16_t moved_slot;
  char moved_host[64];
  int moved_port;
  uint32_t asks;                /* ASK redirections followed */
  uint32_t ids[];               /* the page's token ids (pg.page_tokens) */
} rsend_job_t;

typedef struct rsend_opts {
  const void *secret;           /* the fleet secret (the thread keeps its own keys) */
  size_t secret_len;
  const char *user, *password;  /* AUTH; NULL or "": none */
  uint32_t connect_timeout_ms, command_timeout_ms, down_ms;
} rsend_opts_t;

/* Starts the thread (the work queue's WORK_NET class); done runs on the
 * loop for every job submitted, in some order. NULL out of memory (or no
 * thread). */
rsend_t *rsend_new(work_t *work, const rsend_opts_t *o,
                   void (*done)(void *ctx, rsend_job_t *j), void *ctx);
/* Queues j (taken until done gives it back). */
void rsend_submit(rsend_t *s, rsend_job_t *j);
/* Stops the thread (waiting for the SET in progress, at most the command
 * timeout), gives back every job not done with RS_CANCELLED through done,
 * and frees s. */
void rsend_stop(rsend_t *s);

#endif
