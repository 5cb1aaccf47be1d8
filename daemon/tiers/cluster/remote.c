/* remote.c: the cluster tier's life (its files and options), its figures,
 * and its table as a tier (tier_cluster, tier.h) (remote.h draws the tier;
 * rlookup.c and rwrite.c are its two paths, rshared.c what they share). */
#include "remote.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "rsend.h"
#include "rtier.h"
#include "tier.h"

#define SECRET_MAX 4096

/* Reads a small file that only the daemon may read: owned by its user,
 * no permission for group or others. Returns its length, or -1 with err. */
static ssize_t read_private(const char *option, const char *path, char *buf, size_t cap,
                            char *err, size_t errlen) {
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0) {
    snprintf(err, errlen, "%s: %s: %s", option, path, strerror(errno));
    if (fd >= 0) close(fd);
    return -1;
  }
  if (!S_ISREG(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 077)) {
    snprintf(err, errlen, "%s: %s must be a file owned by uid %u and readable by it alone "
             "(chmod 600): it holds a secret", option, path, (unsigned)geteuid());
    close(fd);
    return -1;
  }
  ssize_t n = read(fd, buf, cap);
  close(fd);
  if (n < 0 || (size_t)n == cap) {
    snprintf(err, errlen, "%s: %s: %s", option, path, n < 0 ? strerror(errno) : "too long");
    return -1;
  }
  return n;
}

/* The ACL user and password: "USER PASSWORD" or "PASSWORD" on the first
 * line. */
static int read_auth(const config_t *cfg, char *user, char *pass, size_t cap, char *err,
                     size_t errlen) {
  char buf[1024];
  user[0] = pass[0] = '\0';
  if (!cfg->cluster_auth_file[0]) return 0;
  ssize_t n = read_private("cluster_auth_file", cfg->cluster_auth_file, buf, sizeof buf - 1,
                           err, errlen);
  if (n < 0) return -1;
  buf[n] = '\0';
  buf[strcspn(buf, "\r\n")] = '\0';
  char *a = strtok(buf, " \t"), *b = a ? strtok(NULL, " \t") : NULL;
  if (!a || strlen(a) >= cap || (b && strlen(b) >= cap) || (b && strtok(NULL, " \t"))) {
    snprintf(err, errlen, "cluster_auth_file: expected \"USER PASSWORD\" or \"PASSWORD\"");
    explicit_bzero(buf, sizeof buf);
    return -1;
  }
  snprintf(b ? user : pass, cap, "%s", a);
  if (b) snprintf(pass, cap, "%s", b);
  explicit_bzero(buf, sizeof buf);
  return 0;
}

/* The fleet secret into buf (its length; 0: none configured), or -1. */
static ssize_t read_secret(const config_t *cfg, char *buf, char *err, size_t errlen) {
  ssize_t n = 0;
  if (cfg->cluster_secret_file[0]) {
    n = read_private("cluster_secret_file", cfg->cluster_secret_file, buf, SECRET_MAX, err,
                     errlen);
    if (n < 0) return -1;
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r')) n--;
    if (n < 16) {
      snprintf(err, errlen, "cluster_secret_file: the secret has %zd bytes, at least 16", n);
      return -1;
    }
  } else {
    LOG_WARN("cluster_secret", "reason=\"no cluster_secret_file: values are checksummed, not "
             "authenticated; anyone who can write to the cluster can plant one\"");
  }
  return n;
}

static void on_timer_closed(uv_handle_t *h) {
  remote_t *r = h->data;
  if (--r->open_handles == 0) free(r);
}

int remote_start(server_t *srv, char *err, size_t errlen) {
  const config_t *cfg = &srv->cfg;
  if (!cfg->cluster_nodes[0]) return 0;
  char user[256], pass[512];
  if (read_auth(cfg, user, pass, sizeof user, err, errlen) != 0) return -1;
  remote_t *r = calloc(1, sizeof *r);
  if (!r) {
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  r->srv = srv;
  uv_timer_init(srv->loop, &r->kick);
  uv_timer_init(srv->loop, &r->deadline);
  r->kick.data = r->deadline.data = r;
  r->open_handles = 2;
  rcluster_opts_t o = {cfg->cluster_nodes, user, pass, cfg->cluster_connect_timeout_ms,
                       cfg->cluster_command_timeout_ms, cfg->cluster_refresh_ms,
                       cfg->cluster_breaker_failures, cfg->cluster_breaker_ms,
                       cfg->cluster_read_replicas, cfg->cluster_lookup_timeout_ms};
  static char secret[SECRET_MAX];
  ssize_t slen = read_secret(cfg, secret, err, errlen);
  rsend_opts_t so = {secret, slen > 0 ? (size_t)slen : 0, user, pass,
                     cfg->cluster_connect_timeout_ms, cfg->cluster_command_timeout_ms,
                     cfg->cluster_breaker_ms};
  int rc = slen < 0 ? -1 : 0;
  if (rc == 0 && !(r->sec = rvalue_secret_new(secret, so.secret_len))) {
    snprintf(err, errlen, "cluster: OpenSSL has no HMAC-SHA256 or Poly1305");
    rc = -1;
  }
  if (rc == 0) rc = rcluster_new(srv->loop, &o, &r->cl, err, errlen);
  if (rc == 0) rc = rwrite_start(r);
  if (rc == 0 && !(r->send = rsend_new(srv->work, &so, rwrite_done, r))) rc = -1;
  explicit_bzero(secret, sizeof secret);
  explicit_bzero(pass, sizeof pass);
  if (rc != 0) {
    if (!err[0]) snprintf(err, errlen, "out of memory");
    r->stopping = true;
    rwrite_stop(r);
    rcluster_close(r->cl);
    r->cl = NULL;
    rvalue_secret_free(r->sec);
    uv_close((uv_handle_t *)&r->kick, on_timer_closed);
    uv_close((uv_handle_t *)&r->deadline, on_timer_closed);
    return -1;
  }
  srv->remote = r; /* tiers.c hooks the engine: cluster_indexed, cluster_reclaimed */
  LOG_INFO("cluster", "nodes=\"%s\" write=%s read_replicas=%d auth=%s secret=%s",
           cfg->cluster_nodes,
           cfg->cluster_write == CLUSTER_WRITE_INDEXED   ? "indexed"
           : cfg->cluster_write == CLUSTER_WRITE_EVICTED ? "evicted" : "off",
           cfg->cluster_read_replicas, user[0] ? "user" : cfg->cluster_auth_file[0] ? "password" : "none",
           cfg->cluster_secret_file[0] ? "yes" : "no");
  return 0;
}

void remote_drain(server_t *srv) {
  if (srv->remote) rlookup_end_all(srv->remote);
}

void remote_stop(server_t *srv) {
  remote_t *r = srv->remote;
  if (!r || r->stopping) return;
  r->stopping = true; /* tiers.c unhooks the engine after */
  rlookup_end_all(r);
  rlookup_spare_free(r);
  rwrite_stop(r);        /* the sender's jobs come back, their pages released */
  rcluster_close(r->cl); /* no command calls back after this */
  r->cl = NULL;
  rvalue_secret_free(r->sec);
  r->sec = NULL;
  srv->remote = NULL;
  uv_close((uv_handle_t *)&r->kick, on_timer_closed); /* the last frees r */
  uv_close((uv_handle_t *)&r->deadline, on_timer_closed);
}

/* ---- figures ---------------------------------------------------------------------- */

_Static_assert(RV_VERDICTS_ - 1 <= TIER_DISCARDS_MAX, "room for every reason");

const tier_view_t *remote_view(server_t *srv, arena_t *a) {
  remote_t *r = srv->remote;
  if (!r || !r->cl) return NULL;
  tier_view_t *v = arena_alloc(a, sizeof *v);
  rcluster_node_view_t nv[64];
  size_t nn = rcluster_nodes(r->cl, nv, 64);
  if (nn > 64) nn = 64;
  tier_node_t *nodes = arena_alloc(a, (nn ? nn : 1) * sizeof *nodes);
  const char **reasons = arena_alloc(a, (RV_VERDICTS_ - 1) * sizeof *reasons);
  if (!v || !nodes || !reasons) return NULL;
  for (int i = 1; i < RV_VERDICTS_; i++) reasons[i - 1] = rvalue_verdict_name((enum rvalue_verdict)i);
  const rcluster_counts_t *cc = rcluster_counts(r->cl);
  r->st.moved = cc->moved;
  r->st.ask = cc->ask;
  r->st.map_refreshes = cc->refreshes;
  r->st.slots_covered = rcluster_slots_covered(r->cl);
  r->st.up = rcluster_ready(r->cl);
  r->st.queue_pages = r->qlen;
  r->st.nodes_connected = r->st.breakers_open = 0;
  for (size_t i = 0; i < nn; i++) {
    r->st.nodes_connected += nv[i].connected;
    r->st.breakers_open += nv[i].breaker_open;
    if (nv[i].master && nv[i].failing) r->st.up = 0; /* a part of the map is not served */
    nodes[i].addr = arena_printf(a, "%s", nv[i].addr);
    nodes[i].role = nv[i].master ? "master" : nv[i].replica ? "replica" : "other";
    nodes[i].state = nv[i].breaker_open ? "breaker_open"
                     : nv[i].failing    ? "failing"
                     : nv[i].connected  ? "connected" : "idle";
    nodes[i].slots = nv[i].slots;
    if (!nodes[i].addr) return NULL;
  }
  *v = (tier_view_t){"cluster", &r->st, reasons, RV_VERDICTS_ - 1, nodes, nn};
  return v;
}

/* ---- the tier (tier.h) ------------------------------------------------------------ */

static bool cluster_on(const server_t *srv) { return srv->remote != NULL; }

/* The engine's store hooks: cluster_write says which one writes. */
static void cluster_indexed(server_t *srv, uint32_t cache_id, const uint8_t hash[32]) {
  if (srv->cfg.cluster_write == CLUSTER_WRITE_INDEXED) rwrite_indexed(srv->remote, cache_id, hash);
}

static void cluster_reclaimed(server_t *srv, const engine_page_t *page) {
  if (srv->cfg.cluster_write == CLUSTER_WRITE_EVICTED) rwrite_reclaimed(srv->remote, page);
}

const tier_ops_t tier_cluster = {
    .name = "cluster",
    .open = remote_start,
    .on = cluster_on,
    .drain = remote_drain,
    .stop = remote_stop,
    .indexed = cluster_indexed,
    .reclaimed = cluster_reclaimed,
    .lookup = rlookup_start,
    .import = rlookup_import,
    .forget = rlookup_forget,
    .view = remote_view,
};
