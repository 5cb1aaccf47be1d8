/* rcluster.c: the slot map of a Redis Cluster, routing commands by slot,
 * following MOVED and ASK, and reading the map again when the topology
 * changes (rcluster.h draws the flow; rnode.c is one node's connection).
 *
 *   slots[s] = {master, replicas[0..nrep)}   indexes into nodes[]
 *   nodes[]  = every node seen: the seeds, the map's, redirections' targets
 */
#include "rcluster.h"

#include <hiredis/hiredis.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>

#include "log.h"
#include "rnode.h"
#include "rslot.h"

#define NONE 0xffffu
#define MAX_NODES 1024u
#define MAX_REPLICAS 3u
#define MAX_REDIRECTS 5u
#define REFRESH_MIN_MS 100u /* between two reads of the map after failures */
#define REFRESH_DEGRADED_MS 500u /* while a master of the map is failing: a
                                    failover is under way, its replica's
                                    promotion must be seen soon */

typedef struct slot {
  uint16_t master;
  uint16_t rep[MAX_REPLICAS];
  uint8_t nrep;
} slot_t;

struct rcluster {
  uv_loop_t *loop;
  rcluster_opts_t o;
  char *seeds, *user, *password;  /* the option strings, owned */
  rnode_t **nodes;
  uint32_t nnodes;
  slot_t *slots;                  /* RSLOT_COUNT */
  uint32_t covered;               /* slots with a master */
  uint32_t rr;                    /* round robin: replicas, refresh targets */
  uv_timer_t refresh;             /* the next read of the map */
  bool refreshing;                /* a CLUSTER SLOTS is in flight */
  rnode_t *asked;                 /* the node it was sent to */
  uint64_t last_refresh;          /* uv_now when the last one was sent, or found
                                     nobody to ask */
  uint32_t refresh_fails;         /* in a row: backs the retries off */
  uint32_t open_handles;          /* closing: handles not yet closed */
  bool closing;
  rcluster_counts_t counts;
  rnode_env_t env;                /* what its nodes see of it (rnode.h) */
};

const rcluster_counts_t *rcluster_counts(const rcluster_t *cl) { return &cl->counts; }
bool rcluster_ready(const rcluster_t *cl) { return cl->covered == RSLOT_COUNT; }
uint32_t rcluster_slots_covered(const rcluster_t *cl) { return cl->covered; }

/* ---- nodes ------------------------------------------------------------------- */

static rnode_t *node_find(rcluster_t *cl, const char *host, int port) {
  for (uint32_t i = 0; i < cl->nnodes; i++)
    if (cl->nodes[i]->port == port && strcmp(cl->nodes[i]->host, host) == 0) return cl->nodes[i];
  return NULL;
}

static rnode_t *node_get(rcluster_t *cl, const char *host, int port) {
  rnode_t *n = node_find(cl, host, port);
  if (n || cl->nnodes == MAX_NODES || strlen(host) >= sizeof n->host) return n;
  if (!(n = malloc(sizeof *n))) return NULL;
  rnode_init(n, &cl->env, host, port, (uint16_t)cl->nnodes);
  cl->nodes[cl->nnodes++] = n;
  return n;
}

/* "host:port" (the host may be [v6]) of len bytes into host and port: 0 or -1. */
static int split_addr(const char *s, size_t len, char *host, size_t hostlen, int *port) {
  const char *colon = NULL;
  for (size_t i = 0; i < len; i++)
    if (s[i] == ':') colon = s + i;
  if (!colon || colon == s) return -1;
  size_t hl = (size_t)(colon - s), pl = len - hl - 1;
  const char *h = s;
  if (hl >= 2 && s[0] == '[' && s[hl - 1] == ']') {
    h++;
    hl -= 2;
  }
  if (hl == 0 || hl >= hostlen || pl == 0 || pl > 5) return -1;
  long p = 0;
  for (size_t i = 0; i < pl; i++) {
    if (colon[1 + i] < '0' || colon[1 + i] > '9') return -1;
    p = p * 10 + (colon[1 + i] - '0');
  }
  if (p <= 0 || p > 65535) return -1;
  memcpy(host, h, hl);
  host[hl] = '\0';
  *port = (int)p;
  return 0;
}

/* ---- the map ---------------------------------------------------------------- */

static void refresh_soon(rcluster_t *cl);

/* Routes a request's command: the node of slot, or NULL. */
static rnode_t *route(rcluster_t *cl, uint16_t slot, bool read) {
  const slot_t *s = &cl->slots[slot];
  if (s->master == NONE) return NULL;
  rnode_t *m = cl->nodes[s->master];
  if (!read || !cl->o.read_replicas || !s->nrep) return m;
  for (uint32_t i = 0; i < s->nrep; i++) { /* a sound replica; the others are probed */
    rnode_t *r = cl->nodes[s->rep[(cl->rr + i) % s->nrep]];
    if (rnode_sound(r)) return r;
    rnode_probe(r);
  }
  return m;
}

/* Whether a request's command may go to n; if not, n is probed meanwhile
 * (a request never waits on a node that failed or fell silent). */
static bool sound(rnode_t *n) {
  if (rnode_sound(n)) return true;
  rnode_probe(n);
  return false;
}

bool rcluster_routable(rcluster_t *cl, uint16_t slot, bool read) {
  rnode_t *n = cl->closing ? NULL : route(cl, slot, read);
  return n && sound(n);
}

/* A node of a CLUSTER SLOTS entry: [ip, port, id, ...]; an empty ip is the
 * asked node's own host. */
static rnode_t *map_node(rcluster_t *cl, const redisReply *e, const rnode_t *asked) {
  if (e->type != REDIS_REPLY_ARRAY || e->elements < 2 ||
      e->element[0]->type != REDIS_REPLY_STRING || e->element[1]->type != REDIS_REPLY_INTEGER)
    return NULL;
  const char *host = e->element[0]->len ? e->element[0]->str : asked->host;
  long long port = e->element[1]->integer;
  if (strcmp(host, "?") == 0 || port <= 0 || port > 65535) return NULL;
  return node_get(cl, host, (int)port);
}

/* Applies a CLUSTER SLOTS reply; false if it is not one (nothing changed). */
static bool map_apply(rcluster_t *cl, const redisReply *r, const rnode_t *asked) {
  if (r->type != REDIS_REPLY_ARRAY) return false;
  slot_t *next = malloc(RSLOT_COUNT * sizeof *next);
  if (!next) return false;
  for (uint32_t s = 0; s < RSLOT_COUNT; s++) next[s] = (slot_t){NONE, {NONE, NONE, NONE}, 0};
  uint32_t covered = 0;
  for (uint32_t i = 0; i < cl->nnodes; i++) cl->nodes[i]->in_map = false;
  for (size_t i = 0; i < r->elements; i++) {
    const redisReply *e = r->element[i];
    if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 ||
        e->element[0]->type != REDIS_REPLY_INTEGER || e->element[1]->type != REDIS_REPLY_INTEGER)
      continue;
    long long lo = e->element[0]->integer, hi = e->element[1]->integer;
    rnode_t *m = map_node(cl, e->element[2], asked);
    if (!m || lo < 0 || hi >= RSLOT_COUNT || lo > hi) continue;
    m->in_map = true;
    m->replica = false;
    slot_t s = {m->idx, {NONE, NONE, NONE}, 0};
    for (size_t k = 3; k < e->elements && s.nrep < MAX_REPLICAS; k++) {
      rnode_t *rep = map_node(cl, e->element[k], asked);
      if (!rep || rep == m) continue;
      rep->in_map = true;
      rep->replica = true;
      s.rep[s.nrep++] = rep->idx;
    }
    for (long long k = lo; k <= hi; k++) {
      covered += next[k].master == NONE;
      next[k] = s;
    }
  }
  free(cl->slots);
  cl->slots = next;
  if (covered != cl->covered)
    LOG_INFO("cluster_map", "slots_covered=%u nodes=%u", covered, cl->nnodes);
  cl->covered = covered;
  return true;
}

/* ---- reading the map -------------------------------------------------------- */

static void on_refresh_timer(uv_timer_t *t);

static void on_slots(void *arg, enum rc_status st, struct redisReply *r) {
  rcluster_t *cl = arg;
  cl->refreshing = false;
  if (cl->closing) return;
  if (st == RC_OK && map_apply(cl, r, cl->asked)) {
    cl->counts.refreshes++;
    cl->refresh_fails = 0;
    uint64_t next = cl->o.refresh_ms;
    for (uint32_t i = 0; i < cl->nnodes; i++)
      if (cl->nodes[i]->in_map && !cl->nodes[i]->replica && cl->nodes[i]->fails &&
          next > REFRESH_DEGRADED_MS)
        next = REFRESH_DEGRADED_MS;
    uv_timer_start(&cl->refresh, on_refresh_timer, next, 0);
    return;
  }
  cl->counts.refresh_errors++;
  cl->refresh_fails++;
  refresh_soon(cl);
}

/* Sends CLUSTER SLOTS to the next node that may be tried: one of the map
 * first, else any (the seeds). */
static void refresh_now(rcluster_t *cl) {
  if (cl->refreshing || cl->closing || !cl->nnodes) return;
  static const char cmd[] = "*2\r\n$7\r\nCLUSTER\r\n$5\r\nSLOTS\r\n";
  for (uint32_t pass = 0; pass < 2; pass++)
    for (uint32_t i = 0; i < cl->nnodes; i++) {
      rnode_t *n = cl->nodes[(cl->rr + i) % cl->nnodes];
      if (!rnode_usable(n) || rnode_stuck(n) || (pass == 0 && !n->in_map)) continue;
      rcmd_t *c = calloc(1, sizeof *c);
      char *buf = malloc(sizeof cmd - 1);
      if (!c || !buf) {
        free(c);
        free(buf);
        pass = 2;
        break;
      }
      memcpy(buf, cmd, sizeof cmd - 1);
      *c = (rcmd_t){.cmd = buf, .len = sizeof cmd - 1, .internal = true, .fn = on_slots,
                    .arg = cl};
      if (rnode_send(n, c) == RC_OK) {
        cl->rr += i + 1;
        cl->refreshing = true;
        cl->asked = n;
        cl->last_refresh = uv_now(cl->loop);
        return;
      }
      rcmd_free(c);
    }
  cl->refresh_fails++;
  cl->last_refresh = uv_now(cl->loop); /* an attempt: the next one waits its gap */
  refresh_soon(cl); /* nobody to ask now: later */
}

static void on_refresh_timer(uv_timer_t *t) { refresh_now(t->data); }

/* Reads the map again soon: at once (1 ms) unless one was tried within the
 * last REFRESH_MIN_MS (doubling while reads fail, up to refresh_ms). Never
 * at 0 ms: libuv 1.44 runs a timer started at 0 ms from its own callback
 * again in the same pass (uv__run_timers), with the loop's time standing
 * still, so a timer that re-arms itself so would keep the loop forever. */
static void refresh_soon(rcluster_t *cl) {
  if (cl->refreshing || cl->closing) return;
  uint64_t gap = (uint64_t)REFRESH_MIN_MS << (cl->refresh_fails < 6 ? cl->refresh_fails : 6);
  if (gap > cl->o.refresh_ms) gap = cl->o.refresh_ms;
  uint64_t now = uv_now(cl->loop), due = cl->last_refresh + gap;
  uint64_t wait = due > now ? due - now : 1;
  if (uv_is_active((uv_handle_t *)&cl->refresh) && uv_timer_get_due_in(&cl->refresh) <= wait)
    return;
  uv_timer_start(&cl->refresh, on_refresh_timer, wait, 0);
}

static void rcluster_node_failed(rcluster_t *cl, rnode_t *n) {
  (void)n;
  refresh_soon(cl); /* a failover may have moved its slots */
}

/* ---- commands ----------------------------------------------------------------- */

static void complete(rcmd_t *c, enum rc_status st, struct redisReply *r) {
  if (!c->cancelled && c->fn) c->fn(c->arg, st, r);
  rcmd_free(c);
}

/* Sends c to n (a request's command: only to a sound node); when it
 * cannot go, c is completed with the reason. */
static void send_to(rcluster_t *cl, rcmd_t *c, rnode_t *n) {
  enum rc_status st = !n                           ? RC_NOROUTE
                      : !c->internal && !sound(n) ? RC_BREAKER
                                                   : rnode_send(n, c);
  if (st != RC_OK) complete(c, st, NULL);
  (void)cl;
}

/* "MOVED 3999 127.0.0.1:6381": the slot and the node. */
static rnode_t *redirect_target(rcluster_t *cl, const redisReply *r, size_t skip, long *slot) {
  const char *p = r->str + skip, *end = r->str + r->len;
  char *after;
  *slot = strtol(p, &after, 10);
  if (after == p || *after != ' ' || *slot < 0 || *slot >= (long)RSLOT_COUNT) return NULL;
  char host[64];
  int port;
  const char *a = after + 1;
  if (split_addr(a, (size_t)(end - a), host, sizeof host, &port) != 0) return NULL;
  return node_get(cl, host, port);
}

static void rcluster_reply(rcluster_t *cl, rcmd_t *c, struct redisReply *r, enum rc_status why) {
  if (cl->closing || c->cancelled) {
    rcmd_free(c);
    return;
  }
  if (!r) {
    complete(c, why, NULL);
    return;
  }
  bool moved = r->type == REDIS_REPLY_ERROR && r->len > 6 && strncmp(r->str, "MOVED ", 6) == 0;
  bool ask = r->type == REDIS_REPLY_ERROR && r->len > 4 && strncmp(r->str, "ASK ", 4) == 0;
  if (!moved && !ask) {
    if (r->type == REDIS_REPLY_ERROR && strncmp(r->str, "READONLY", 8) == 0)
      refresh_soon(cl); /* a write reached a demoted master: the map is stale */
    complete(c, RC_OK, r);
    return;
  }
  long slot;
  rnode_t *to = redirect_target(cl, r, moved ? 6 : 4, &slot);
  if (!to || c->internal || ++c->redirects > MAX_REDIRECTS) {
    complete(c, to ? RC_REDIRECTS : RC_OK, to ? NULL : r);
    return;
  }
  if (moved) {
    cl->counts.moved++;
    slot_t *s = &cl->slots[slot];
    if (s->master == NONE) cl->covered++;
    *s = (slot_t){to->idx, {NONE, NONE, NONE}, 0}; /* its replicas: at the next read */
    to->in_map = true;
    c->asking = false;
    refresh_soon(cl);
  } else {
    cl->counts.ask++;
    c->asking = true;
  }
  send_to(cl, c, to);
}

rcmd_t *rcluster_send(rcluster_t *cl, uint16_t slot, bool read, char *cmd, size_t cmdlen,
                      rcmd_fn fn, void *arg, enum rc_status *st) {
  rnode_t *n = route(cl, slot % RSLOT_COUNT, read);
  *st = !n ? RC_NOROUTE : sound(n) ? RC_OK : RC_BREAKER;
  if (*st != RC_OK) {
    free(cmd);
    if (!n) refresh_soon(cl);
    return NULL;
  }
  rcmd_t *c = calloc(1, sizeof *c);
  if (!c) {
    free(cmd);
    *st = RC_CONN;
    return NULL;
  }
  *c = (rcmd_t){.cmd = cmd, .len = cmdlen, .slot = slot, .read = read, .fn = fn, .arg = arg};
  if ((*st = rnode_send(n, c)) != RC_OK) {
    rcmd_free(c);
    return NULL;
  }
  cl->rr++;
  return c;
}

enum rc_status rcluster_master(const rcluster_t *cl, uint16_t slot, char *host, size_t hostlen,
                               int *port) {
  const slot_t *s = &cl->slots[slot % RSLOT_COUNT];
  if (s->master == NONE) return RC_NOROUTE;
  const rnode_t *n = cl->nodes[s->master];
  if (!rnode_usable(n)) return RC_BREAKER;
  snprintf(host, hostlen, "%s", n->host);
  *port = n->port;
  return RC_OK;
}

void rcluster_moved(rcluster_t *cl, uint16_t slot, const char *host, int port) {
  rnode_t *to = cl->closing ? NULL : node_get(cl, host, port);
  if (!to) return;
  cl->counts.moved++;
  slot_t *s = &cl->slots[slot % RSLOT_COUNT];
  if (s->master == NONE) cl->covered++;
  *s = (slot_t){to->idx, {NONE, NONE, NONE}, 0};
  to->in_map = true;
  refresh_soon(cl);
}

void rcluster_asked(rcluster_t *cl, uint32_t n) { cl->counts.ask += n; }

void rcmd_cancel(rcmd_t *c) {
  if (c) c->cancelled = true;
}

void rcmd_sink(rcmd_t *c, rcmd_sink_fn sink) {
  if (c) c->sink = sink;
}

char *rcluster_take_str(struct redisReply *reply, size_t *len) {
  char *s = reply->str;
  *len = reply->len;
  reply->str = NULL; /* hiredis 0.14 frees it with free(), which free(NULL) allows */
  reply->len = 0;
  return s;
}

/* ---- life ------------------------------------------------------------------------ */

/* Resolves each seed (a name once, at start: later addresses come from the
 * map, which holds IPs) into a node. */
static int add_seeds(rcluster_t *cl, char *err, size_t errlen) {
  char *save = NULL;
  for (char *tok = strtok_r(cl->seeds, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    while (*tok == ' ') tok++;
    char host[64], ip[INET6_ADDRSTRLEN];
    int port;
    if (split_addr(tok, strlen(tok), host, sizeof host, &port) != 0) {
      snprintf(err, errlen, "cluster_nodes: '%s' is not HOST:PORT", tok);
      return -1;
    }
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai = NULL;
    int rc = getaddrinfo(host, NULL, &hints, &ai);
    if (rc != 0 || !ai) {
      snprintf(err, errlen, "cluster_nodes: %s: %s", host, gai_strerror(rc));
      return -1;
    }
    const void *a = ai->ai_family == AF_INET6
                        ? (const void *)&((struct sockaddr_in6 *)(void *)ai->ai_addr)->sin6_addr
                        : (const void *)&((struct sockaddr_in *)(void *)ai->ai_addr)->sin_addr;
    inet_ntop(ai->ai_family, a, ip, sizeof ip);
    freeaddrinfo(ai);
    if (!node_get(cl, ip, port)) {
      snprintf(err, errlen, "cluster_nodes: too many nodes");
      return -1;
    }
  }
  if (!cl->nnodes) {
    snprintf(err, errlen, "cluster_nodes: no node given");
    return -1;
  }
  return 0;
}

static char *dup_or_null(const char *s) { return s ? strdup(s) : NULL; }

int rcluster_new(uv_loop_t *loop, const rcluster_opts_t *o, rcluster_t **out, char *err,
                 size_t errlen) {
  rcluster_t *cl = calloc(1, sizeof *cl);
  if (!cl || !(cl->nodes = calloc(MAX_NODES, sizeof *cl->nodes)) ||
      !(cl->slots = malloc(RSLOT_COUNT * sizeof *cl->slots)) || !(cl->seeds = strdup(o->seeds))) {
    snprintf(err, errlen, "out of memory");
    goto fail;
  }
  cl->loop = loop;
  cl->o = *o;
  cl->user = dup_or_null(o->user);
  cl->password = dup_or_null(o->password);
  cl->o.user = cl->user;
  cl->o.password = cl->password;
  cl->o.seeds = NULL;
  cl->env = (rnode_env_t){cl, loop, &cl->o, &cl->counts, rcluster_reply, rcluster_node_failed};
  for (uint32_t s = 0; s < RSLOT_COUNT; s++) cl->slots[s] = (slot_t){NONE, {NONE, NONE, NONE}, 0};
  uv_timer_init(loop, &cl->refresh);
  cl->refresh.data = cl;
  if (add_seeds(cl, err, errlen) != 0) {
    rcluster_close(cl);
    return -1;
  }
  refresh_now(cl);
  *out = cl;
  return 0;
fail:
  if (cl) {
    free(cl->nodes);
    free(cl->slots);
    free(cl->seeds);
  }
  free(cl);
  return -1;
}

static void free_cluster(rcluster_t *cl) {
  for (uint32_t i = 0; i < cl->nnodes; i++) free(cl->nodes[i]);
  free(cl->nodes);
  free(cl->slots);
  free(cl->seeds);
  if (cl->password) explicit_bzero(cl->password, strlen(cl->password));
  free(cl->user);
  free(cl->password);
  free(cl);
}

static void closed_one(rcluster_t *cl) {
  if (--cl->open_handles == 0) free_cluster(cl);
}

static void on_node_closed(uv_handle_t *h) { closed_one(((rnode_t *)h->data)->env->cl); }
static void on_refresh_closed(uv_handle_t *h) { closed_one(h->data); }

void rcluster_close(rcluster_t *cl) {
  if (!cl || cl->closing) return;
  cl->closing = true;
  cl->open_handles = 1 + cl->nnodes;
  for (uint32_t i = 0; i < cl->nnodes; i++) rnode_close(cl->nodes[i], on_node_closed);
  uv_close((uv_handle_t *)&cl->refresh, on_refresh_closed);
}

size_t rcluster_nodes(const rcluster_t *cl, rcluster_node_view_t *out, size_t cap) {
  for (uint32_t i = 0; i < cl->nnodes && i < cap; i++) {
    const rnode_t *n = cl->nodes[i];
    rcluster_node_view_t *v = &out[i];
    memset(v, 0, sizeof *v);
    snprintf(v->addr, sizeof v->addr, "%s", n->addr);
    v->replica = n->in_map && n->replica;
    v->connected = n->st == RN_READY;
    v->breaker_open = !rnode_usable(n);
    v->failing = n->fails > 0 || rnode_stuck(n);
    v->pending = n->pending;
  }
  for (uint32_t s = 0; s < RSLOT_COUNT; s++)
    if (cl->slots[s].master != NONE && cl->slots[s].master < cap) {
      out[cl->slots[s].master].slots++;
      out[cl->slots[s].master].master = true;
    }
  return cl->nnodes;
}
