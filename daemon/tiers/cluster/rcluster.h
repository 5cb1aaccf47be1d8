/* rcluster.h: a Redis Cluster client on the daemon's event loop
 * (rcluster.c: the slot map, routing and redirections; rnode.c: one
 * connection per node, its timeouts and its circuit breaker).
 *
 *   command(key slot) --slot map--> master of the slot (a read: a replica,
 *                                   with cluster_read_replicas)
 *        node answers -MOVED s h:p  the slot is h:p's now: the map learns it,
 *                                   the command goes there, the map is read again
 *        node answers -ASK s h:p    the key is migrating: ASKING + the command
 *                                   to h:p, the map unchanged
 *        no answer in time, a lost  the command fails (RC_TIMEOUT, RC_CONN),
 *        connection                 the node's breaker counts it; a node that
 *                                   is not sound (rnode.h: failed, stuck, its
 *                                   breaker open) gets no request's command
 *                                   (RC_BREAKER), a PING tries it instead
 *
 * The map comes from CLUSTER SLOTS, asked of any node that answers: at
 * start, on a redirection, after a node failed, and every refresh_ms.
 * Hiredis 0.14 (Debian 12) has no cluster support of its own, no timeouts
 * and no TLS: all of that is here, and TLS is not available (doc/cluster.md).
 */
#ifndef KVCD_RCLUSTER_H
#define KVCD_RCLUSTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>
#include <uv.h>

struct redisReply;
typedef struct rcluster rcluster_t;
typedef struct rcmd rcmd_t;

/* How a command ended. */
enum rc_status {
  RC_OK = 0,     /* a reply (which may be nil, or an error the caller reads) */
  RC_TIMEOUT,    /* its node did not answer within command_timeout_ms */
  RC_CONN,       /* no connection to its node, or it was lost */
  RC_BREAKER,    /* its node's circuit breaker is open: not sent */
  RC_NOROUTE,    /* no node serves its slot (no slot map yet) */
  RC_REDIRECTS,  /* too many MOVED/ASK in a row */
  RC_STATUSES_
};

/* Called once per command: reply is the final reply with RC_OK (valid
 * during the call; the callee may take reply->str, see rcluster_take_str),
 * NULL otherwise. */
typedef void (*rcmd_fn)(void *arg, enum rc_status st, struct redisReply *reply);

typedef struct rcluster_opts {
  const char *seeds;           /* "host:port,host:port" (IP addresses or names) */
  const char *user;            /* ACL user (NULL or "": AUTH with the password alone) */
  const char *password;        /* NULL or "": no AUTH */
  uint32_t connect_timeout_ms;
  uint32_t command_timeout_ms; /* a node silent this long with a command pending is dropped */
  uint32_t refresh_ms;         /* the slot map is read again this often */
  uint32_t breaker_failures;   /* consecutive failures that open a node's breaker */
  uint32_t breaker_ms;         /* first open period, doubling while it fails (to 64x) */
  bool read_replicas;          /* reads go to a replica of the slot when one is up */
  uint32_t stuck_ms;           /* a node with commands in flight that has sent nothing
                                  this long gets no more requests' commands (0: never) */
} rcluster_opts_t;

/* What happened, for the stats (counters since start). */
typedef struct rcluster_counts {
  uint64_t moved, ask;         /* redirections followed */
  uint64_t refreshes;          /* slot maps read */
  uint64_t refresh_errors;     /* CLUSTER SLOTS asked and not answered well */
  uint64_t connects;           /* connections made */
  uint64_t connect_errors;     /* connections refused, timed out or lost */
  uint64_t timeouts;           /* nodes dropped for silence */
  uint64_t breaker_opens;      /* times a breaker opened */
} rcluster_counts_t;

/* One node, for kvcachectl. */
typedef struct rcluster_node_view {
  char addr[72];               /* host:port */
  bool master;                 /* serves slots as a master in the map */
  bool replica;                /* named as a replica in the map */
  bool connected;
  bool failing;                /* its last connection or command failed */
  bool breaker_open;
  uint32_t slots;              /* slots it is the master of */
  uint32_t pending;            /* commands in flight */
} rcluster_node_view_t;

/* Starts the client: resolves the seeds (blocking, once, at start), then
 * reads the slot map in the background. 0, or -1 with a reason in err. */
int rcluster_new(uv_loop_t *loop, const rcluster_opts_t *o, rcluster_t **out, char *err,
                 size_t errlen);
/* Closes every connection and timer; the commands in flight end without
 * their callbacks. The handles close in later loop turns. */
void rcluster_close(rcluster_t *cl);

/* Sends cmd (cmdlen bytes of RESP, taken: freed by the client) about a
 * key of slot `slot`, to the slot's master (read: a replica when so
 * configured and one is up). Returns the command, whose fn runs exactly
 * once later, or NULL with *st (RC_NOROUTE, RC_BREAKER: the node is not
 * sound, RC_CONN) when it could not be sent (fn never runs). */
rcmd_t *rcluster_send(rcluster_t *cl, uint16_t slot, bool read, char *cmd, size_t cmdlen,
                      rcmd_fn fn, void *arg, enum rc_status *st);
/* The command's fn will not run (its reply is dropped when it comes). */
void rcmd_cancel(rcmd_t *c);

/* Where a command's bulk string reply may go straight from the socket:
 * called once its length is known, fills iov with where its len bytes go
 * (at most RCMD_SINK_IOV parts, borrowed: the callee keeps them; nothing is
 * written there once the command is cancelled) and returns how many parts,
 * or 0 to refuse it (its bytes are read and dropped). fn then gets RC_OK
 * with a string reply of that len whose str is iov[0]'s base (NULL when
 * refused); not for rcluster_take_str. Any other reply (nil, an error, a
 * redirection) comes as it would without a sink. */
#define RCMD_SINK_IOV 3
typedef int (*rcmd_sink_fn)(void *arg, size_t len, struct iovec iov[RCMD_SINK_IOV]);
/* Gives c (just sent, its reply not yet read) a sink; arg is fn's. */
void rcmd_sink(rcmd_t *c, rcmd_sink_fn sink);

/* Takes reply->str of a string reply: the caller frees it with free(). */
char *rcluster_take_str(struct redisReply *reply, size_t *len);

/* The master of slot into host and port, for a client of its own (the
 * sender thread): RC_OK, or RC_NOROUTE / RC_BREAKER. */
enum rc_status rcluster_master(const rcluster_t *cl, uint16_t slot, char *host, size_t hostlen,
                               int *port);
/* Such a client followed MOVED: the slot is host:port's now (the map
 * learns it and is read again). */
void rcluster_moved(rcluster_t *cl, uint16_t slot, const char *host, int port);
/* Such a client followed n ASK redirections (counted). */
void rcluster_asked(rcluster_t *cl, uint32_t n);

/* Whether the slot map covers every slot. */
bool rcluster_ready(const rcluster_t *cl);
/* Whether the node that would serve a command of slot would be tried now
 * (mapped, sound: rnode.h); a node that is not is probed meanwhile. */
bool rcluster_routable(rcluster_t *cl, uint16_t slot, bool read);
const rcluster_counts_t *rcluster_counts(const rcluster_t *cl);
/* Fills up to cap node views; returns the number of nodes known. */
size_t rcluster_nodes(const rcluster_t *cl, rcluster_node_view_t *out, size_t cap);
/* Slots the map covers (16384 when whole). */
uint32_t rcluster_slots_covered(const rcluster_t *cl);

#endif
