/* redis.h: a real Redis Cluster for a test: 3 masters and 3 replicas of
 * Debian's redis-server on free loopback ports, in a temporary directory,
 * joined with `redis-cli --cluster create --cluster-replicas 1`, and a
 * plain hiredis client to look into it.
 *
 * Every server dies with the test process (PR_SET_PDEATHSIG), and
 * rcl_stop() stops them and removes the directory: a failing test leaves
 * nothing running. Waits poll the servers (CLUSTER INFO, ROLE, INFO
 * replication) in bounded loops, never fixed sleeps.
 */
#ifndef KVC_IT_REDIS_H
#define KVC_IT_REDIS_H

#include <hiredis/hiredis.h>
#include <netinet/in.h>

#include "harness.h"

#define RCL_NODES 6
/* An ACL user beside the default one (which the test's own client uses):
 * the daemons authenticate as it (cluster_auth_file). */
#define RCL_ACL_USER "kvc", "on", ">kvc-secret-pw", "~*", "&*", "+@all"
#define RCL_ACL_AUTH "kvc kvc-secret-pw\n"

typedef struct rcl {
  char dir[64];
  int port[RCL_NODES];
  int bus[RCL_NODES];   /* its cluster bus port */
  pid_t pid[RCL_NODES]; /* 0: stopped */
  char seeds[128];      /* "127.0.0.1:P1,127.0.0.1:P2" for cluster_nodes */
} rcl_t;

/* n free loopback ports: all bound at once (so they differ), then freed. */
IT_UNUSED static void rcl_free_ports(int *out, int n) {
  int fds[2 * RCL_NODES];
  ASSERT(n <= 2 * RCL_NODES);
  for (int i = 0; i < n; i++) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    fds[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT(fds[i] >= 0);
    ASSERT_EQ(bind(fds[i], (struct sockaddr *)&a, sizeof a), 0);
    ASSERT_EQ(getsockname(fds[i], (struct sockaddr *)&a, &len), 0);
    out[i] = ntohs(a.sin_port);
  }
  for (int i = 0; i < n; i++) close(fds[i]);
}

/* A plain connection to node i (the test fails if it cannot connect). */
IT_UNUSED static redisContext *rcl_conn(const rcl_t *c, int i) {
  struct timeval tv = {5, 0};
  redisContext *r = redisConnectWithTimeout("127.0.0.1", c->port[i], tv);
  if (!r || r->err) TEST_FAIL_("connect to redis :%d: %s", c->port[i], r ? r->errstr : "?");
  redisSetTimeout(r, tv);
  return r;
}

/* A command's reply on node i, or NULL when the node does not answer. */
IT_UNUSED static redisReply *rcl_cmd(const rcl_t *c, int i, const char *fmt, ...) {
  struct timeval tv = {2, 0};
  redisContext *r = redisConnectWithTimeout("127.0.0.1", c->port[i], tv);
  if (!r || r->err) {
    redisFree(r);
    return NULL;
  }
  redisSetTimeout(r, tv);
  va_list ap;
  va_start(ap, fmt);
  redisReply *rep = redisvCommand(r, fmt, ap);
  va_end(ap);
  redisFree(r);
  return rep;
}

/* Whether node i's reply to the command holds needle. */
IT_UNUSED static bool rcl_says(const rcl_t *c, int i, const char *needle, const char *fmt, ...) {
  struct timeval tv = {2, 0};
  redisContext *r = redisConnectWithTimeout("127.0.0.1", c->port[i], tv);
  bool yes = false;
  if (r && !r->err) {
    redisSetTimeout(r, tv);
    va_list ap;
    va_start(ap, fmt);
    redisReply *rep = redisvCommand(r, fmt, ap);
    va_end(ap);
    yes = rep && (rep->type == REDIS_REPLY_STRING || rep->type == REDIS_REPLY_STATUS) &&
          strstr(rep->str, needle);
    freeReplyObject(rep);
  }
  redisFree(r);
  return yes;
}

IT_UNUSED static void rcl_spawn(rcl_t *c, int i, int bus) {
  char port[16], busp[16], dir[96], log[128];
  snprintf(port, sizeof port, "%d", c->port[i]);
  snprintf(busp, sizeof busp, "%d", bus);
  snprintf(dir, sizeof dir, "%s/%d", c->dir, i);
  snprintf(log, sizeof log, "%s/%d/redis.log", c->dir, i);
  ASSERT(mkdir(dir, 0700) == 0 || errno == EEXIST);
  fflush(NULL);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    int null = open("/dev/null", O_RDWR);
    dup2(null, 0);
    dup2(null, 1);
    dup2(null, 2);
    execlp("redis-server", "redis-server", "--port", port, "--bind", "127.0.0.1",
           "--cluster-enabled", "yes", "--cluster-port", busp, "--cluster-config-file",
           "nodes.conf", "--cluster-node-timeout", "1000", "--dir", dir, "--logfile", log,
           "--save", "", "--appendonly", "no", "--daemonize", "no", "--user", RCL_ACL_USER,
           (char *)NULL); /* (redis-server quotes one argument with spaces as one word) */
    _exit(127);
  }
  c->pid[i] = pid;
}

/* Waits until node i answers PING (10 s at most). */
IT_UNUSED static void rcl_wait_accepting(const rcl_t *c, int i) {
  for (int tries = 0; !rcl_says(c, i, "PONG", "PING"); tries++) {
    int st;
    if (waitpid(c->pid[i], &st, WNOHANG) == c->pid[i])
      TEST_FAIL_("redis-server :%d exited at start (status %d)", c->port[i], st);
    ASSERT(tries < 1000);
    it_sleep_ms(10);
  }
}

/* Waits until every live node says cluster_state:ok (30 s at most). */
IT_UNUSED static void rcl_wait_ok(const rcl_t *c) {
  for (int tries = 0; tries < 3000; tries++) {
    bool ok = true;
    for (int i = 0; i < RCL_NODES && ok; i++)
      if (c->pid[i]) ok = rcl_says(c, i, "cluster_state:ok", "CLUSTER INFO");
    if (ok) return;
    it_sleep_ms(10);
  }
  TEST_FAIL_("the cluster did not reach cluster_state:ok within 30 s");
}

/* The index of the node of a port, or -1. */
IT_UNUSED static int rcl_node_of_port(const rcl_t *c, long long port) {
  for (int i = 0; i < RCL_NODES; i++)
    if (c->port[i] == port) return i;
  return -1;
}

/* Node i's replication: its master_repl_offset (a master) and its first
 * replica's acknowledged offset (-1: none online). false if it is no master. */
IT_UNUSED static bool rcl_offsets(const rcl_t *c, int i, long long *mine, long long *replica) {
  redisReply *r = rcl_cmd(c, i, "INFO replication");
  bool master = r && r->type == REDIS_REPLY_STRING && strstr(r->str, "role:master");
  if (master) {
    const char *off = strstr(r->str, "master_repl_offset:");
    const char *s = strstr(r->str, "slave0:");
    const char *so = s ? strstr(s, "offset=") : NULL;
    *mine = off ? atoll(off + 19) : -1;
    *replica = s && strstr(s, "state=online") && so ? atoll(so + 7) : -1;
  }
  freeReplyObject(r);
  return master;
}

/* Waits until every live master's replica has what the master had when
 * called (writes may go on meanwhile). */
IT_UNUSED static void rcl_wait_synced(const rcl_t *c) {
  long long want[RCL_NODES], rep;
  for (int i = 0; i < RCL_NODES; i++)
    if (!c->pid[i] || !rcl_offsets(c, i, &want[i], &rep)) want[i] = -1;
  for (int i = 0; i < RCL_NODES; i++) {
    long long mine;
    for (int tries = 0; want[i] >= 0; tries++) {
      if (!rcl_offsets(c, i, &mine, &rep) || rep >= want[i]) break;
      if (tries > 3000) TEST_FAIL_("the replica of :%d did not catch up within 30 s", c->port[i]);
      it_sleep_ms(10);
    }
  }
}

/* Starts the cluster: 3 masters, 3 replicas, every slot served, every
 * replica in sync. */
IT_UNUSED static void rcl_start(rcl_t *c) {
  memset(c, 0, sizeof *c);
  snprintf(c->dir, sizeof c->dir, "/tmp/kvcrc-XXXXXX");
  ASSERT(mkdtemp(c->dir) != NULL);
  int ports[2 * RCL_NODES];
  rcl_free_ports(ports, 2 * RCL_NODES);
  for (int i = 0; i < RCL_NODES; i++) c->port[i] = ports[i];
  for (int i = 0; i < RCL_NODES; i++) c->bus[i] = ports[RCL_NODES + i];
  for (int i = 0; i < RCL_NODES; i++) rcl_spawn(c, i, c->bus[i]);
  for (int i = 0; i < RCL_NODES; i++) rcl_wait_accepting(c, i);
  char out[8192], nodes[512] = "";
  for (int i = 0; i < RCL_NODES; i++)
    snprintf(nodes + strlen(nodes), sizeof nodes - strlen(nodes), " 127.0.0.1:%d", c->port[i]);
  int rc = it_sh(out, sizeof out, "redis-cli --cluster create%s --cluster-replicas 1 "
                 "--cluster-yes", nodes);
  if (rc != 0) TEST_FAIL_("redis-cli --cluster create: status %d: %s", rc, out);
  snprintf(c->seeds, sizeof c->seeds, "127.0.0.1:%d,127.0.0.1:%d", c->port[0], c->port[1]);
  rcl_wait_ok(c);
  /* Every replica has joined its master. */
  for (int tries = 0;; tries++) {
    int masters = 0, replicas = 0;
    for (int i = 0; i < RCL_NODES; i++) {
      masters += rcl_says(c, i, "role:master", "INFO replication") &&
                 rcl_says(c, i, "connected_slaves:1", "INFO replication");
      replicas += rcl_says(c, i, "master_link_status:up", "INFO replication");
    }
    if (masters == 3 && replicas == 3) break;
    if (tries > 3000) TEST_FAIL_("the replicas did not join within 30 s");
    it_sleep_ms(10);
  }
}

/* Kills node i at once (SIGKILL). */
IT_UNUSED static void rcl_kill(rcl_t *c, int i) {
  if (!c->pid[i]) return;
  kill(c->pid[i], SIGKILL);
  waitpid(c->pid[i], NULL, 0);
  c->pid[i] = 0;
}

/* Sends sig (SIGSTOP, SIGCONT) to every live node. */
IT_UNUSED static void rcl_signal_all(const rcl_t *c, int sig) {
  for (int i = 0; i < RCL_NODES; i++)
    if (c->pid[i]) ASSERT_EQ(kill(c->pid[i], sig), 0);
}

/* Starts node i again after rcl_kill, from its directory (its nodes.conf:
 * the same node of the same cluster, its data gone), and waits until it
 * answers. */
IT_UNUSED static void rcl_restart(rcl_t *c, int i) {
  ASSERT(!c->pid[i]);
  rcl_spawn(c, i, c->bus[i]);
  rcl_wait_accepting(c, i);
}

/* Stops every node and removes the directory. */
IT_UNUSED static void rcl_stop(rcl_t *c) {
  for (int i = 0; i < RCL_NODES; i++) rcl_kill(c, i);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", c->dir);
  ASSERT(system(cmd) == 0);
}

/* The index of the master serving slot, or -1. */
IT_UNUSED static int rcl_master_of(const rcl_t *c, int ask, long long slot) {
  redisReply *r = rcl_cmd(c, ask, "CLUSTER SLOTS");
  int who = -1;
  for (size_t i = 0; r && r->type == REDIS_REPLY_ARRAY && i < r->elements; i++) {
    redisReply *e = r->element[i];
    if (e->element[0]->integer <= slot && slot <= e->element[1]->integer)
      who = rcl_node_of_port(c, e->element[2]->element[1]->integer);
  }
  freeReplyObject(r);
  return who;
}

#endif
