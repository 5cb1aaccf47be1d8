/* rnode.h: one Redis node of the cluster client: its hiredis connection on
 * the loop, the commands in flight on it, their timeout and the node's
 * circuit breaker (rnode.c). rcluster.c routes; nothing else uses this.
 *
 *   DOWN --send--> CONNECTING --connected--> READY --lost, silent--> DOWN
 *                      \--refused, connect_timeout_ms--/
 *
 *   breaker: `fails` consecutive failures (a connection refused, lost or
 *   timed out) >= breaker_failures open it for breaker_ms << trips; while
 *   open nothing is sent to the node; after it, the next command tries
 *   again (one more failure reopens it, for twice as long); any reply
 *   closes it.
 *
 *   sound: a request's command (a lookup's GET) goes only to a node whose
 *   last try was answered (fails == 0) and that is not stuck (commands in
 *   flight, nothing read for stuck_ms: the lookup timeout). A node that is
 *   not sound is tried again with a PING of its own (rnode_probe) when a
 *   request would have used it, once its breaker lets it: a request never
 *   waits on a node that failed or fell silent.
 *
 * Replies come back in the order commands were sent, so the commands in
 * flight are a FIFO and the oldest is its head: the node is silent when
 * the head has waited command_timeout_ms.
 */
#ifndef KVCD_RNODE_H
#define KVCD_RNODE_H

#include <hiredis/async.h>

#include "rcluster.h"

typedef struct rnode rnode_t;

#define RNODE_STASH (16u << 10) /* bytes of replies read ahead of hiredis */

/* A command: its bytes, where it goes, what to call with the reply. */
struct rcmd {
  char *cmd;            /* RESP bytes (owned) */
  size_t len;
  uint16_t slot;
  bool read;
  bool asking;          /* sent after ASKING (an ASK redirection) */
  bool cancelled;       /* fn never runs; freed when its reply comes */
  bool internal;        /* AUTH, READONLY, CLUSTER SLOTS: the client's own */
  uint8_t redirects;
  bool landed;          /* its value was read into its sink (rnode.c), or dropped */
  size_t landed_len;    /* that value's length */
  void *landed_buf;     /* where it went (NULL: refused, dropped) */
  rcmd_sink_fn sink;    /* NULL: the reply is hiredis's to read */
  rcmd_fn fn;
  void *arg;
  uint64_t sent_ms;     /* uv_now when sent to its node */
  rnode_t *node;        /* where it is in flight */
  rcmd_t *next;         /* the node's FIFO */
};

enum rnode_state { RN_DOWN, RN_CONNECTING, RN_READY };

/* What a node needs of its cluster (rcluster.c fills it once): the loop,
 * the options and counts, and the two calls back up, as pointers, so that
 * rnode.c calls nothing of rcluster.c. */
typedef struct rnode_env {
  rcluster_t *cl;
  uv_loop_t *loop;
  const rcluster_opts_t *opts;
  rcluster_counts_t *counts;
  /* A reply (NULL: none, with why) to c, which is no longer in flight. */
  void (*reply)(rcluster_t *cl, rcmd_t *c, struct redisReply *r, enum rc_status why);
  /* The node failed: the map may be stale. */
  void (*failed)(rcluster_t *cl, rnode_t *n);
} rnode_env_t;

struct rnode {
  const rnode_env_t *env;
  char host[64];
  int port;
  char addr[72];        /* host:port */
  uint16_t idx;         /* in cl->nodes */
  bool replica;         /* READONLY on connect: serves reads of its master's slots */
  bool in_map;          /* named by the last slot map */
  bool dropping;        /* its connection is being freed for silence */
  enum rnode_state st;
  redisAsyncContext *ac;
  rcmd_t *head, *tail;  /* in flight, oldest first */
  uint32_t pending;
  uint32_t fails;       /* consecutive failures */
  uint32_t trips;       /* times the breaker opened since the last reply */
  uint64_t open_until;  /* uv_now before which nothing is sent */
  uint64_t heard_ms;    /* uv_now when a byte last came, or a command went to an idle node */
  uv_timer_t timer;     /* connect_timeout_ms, or the head's command_timeout_ms */
  struct {              /* the replies as they are read (rnode.c) */
    char buf[RNODE_STASH]; /* read, not yet handed on: buf[head, tail) */
    size_t head, tail;
    uint64_t items;     /* items of the reply under way still to come (0: between replies) */
    uint64_t bulk;      /* bytes of a bulk string under way, its CRLF counted */
    rcmd_t *c;          /* a value being read into its sink (NULL: none) */
    struct iovec iov[RCMD_SINK_IOV]; /* where its sink puts it */
    int niov;           /* 0: refused, its bytes dropped */
    size_t len, got;    /* the value's bytes; read so far, its closing CRLF counted */
    char crlf[2];
  } in;
};

/* Initializes n (its timer on the loop), in the cluster of env. */
void rnode_init(rnode_t *n, const rnode_env_t *env, const char *host, int port, uint16_t idx);
/* Whether a command would be tried now (breaker closed). */
bool rnode_usable(const rnode_t *n);
/* Whether n has commands in flight and has sent nothing for stuck_ms. */
bool rnode_stuck(const rnode_t *n);
/* Whether a request's command may go to n now: breaker closed, no failure
 * since its last reply, not stuck. */
bool rnode_sound(const rnode_t *n);
/* Tries a node that is not sound again without a request: a PING when its
 * breaker lets one through and nothing is in flight on it (its reply makes
 * it sound; its failure counts as any other). */
void rnode_probe(rnode_t *n);
/* Sends c (after ASKING when c->asking), connecting first if need be: 0,
 * or a status when it cannot (c untouched). */
enum rc_status rnode_send(rnode_t *n, rcmd_t *c);
/* Closes the connection (commands in flight end with RC_CONN) and the
 * timer; close_cb runs once the timer is closed. */
void rnode_close(rnode_t *n, uv_close_cb close_cb);
/* Frees a command. */
void rcmd_free(rcmd_t *c);

#endif
