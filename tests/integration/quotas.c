/* quotas.c: one client, and one tenant over several connections, tries each
 * exhaustion of the issue "fair-shares" (pins that grow, sequences, caches,
 * interned keys, connections, shared-buffer bytes, the pool) as a real other
 * uid while a victim of another uid works on with every byte verified: the
 * hog gets each limit's own error, counted for its tenant; the victim gets
 * none. Also: a quota reloaded, a cache slot reused, an idle connection
 * closed (doc/security.md, quotas). */
#include <grp.h>
#include <poll.h>

#include "hard.h"

#define UID_V 64001u /* the victim */
#define UID_H 64002u /* the hog */
enum { TOK = 48, NV = 20 };

static void drop_to(uid_t uid) {
  if (setgroups(0, NULL) != 0 || setresgid(uid, uid, uid) != 0 || setresuid(uid, uid, uid) != 0)
    _exit(90);
}

static pid_t spawn_as(uid_t uid, void (*fn)(void *), void *arg) {
  fflush(NULL);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    drop_to(uid);
    fn(arg);
    _exit(0);
  }
  return pid;
}

static int reap(pid_t pid) {
  int st;
  ASSERT(waitpid(pid, &st, 0) == pid);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

/* Sequence seq's bytes: a pattern of (seq, salt) in every float. */
static void fill(float *buf, size_t n, uint64_t seq, uint32_t salt) {
  for (size_t i = 0; i < n; i++)
    buf[i] = (float)((seq * 7919u + i * 31u + salt) % 1000003u) + 0.5f;
}

static void put_seq(kvc_cache_t *h, uint64_t seq, uint32_t salt) {
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  size_t nk = it_tok_floats(&l, false) * TOK, nv = it_tok_floats(&l, true) * TOK;
  float *k = malloc(nk * 4), *v = malloc(nv * 4);
  ASSERT(k && v);
  fill(k, nk, seq, salt);
  fill(v, nv, seq, salt + 1);
  ASSERT_OK(kvc_put(h, seq, 0, TOK, k, v));
  free(k), free(v);
}

static void check_seq(kvc_cache_t *h, uint64_t seq, uint32_t salt) {
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  size_t nk = it_tok_floats(&l, false) * TOK, nv = it_tok_floats(&l, true) * TOK;
  float *k = malloc(nk * 4), *v = malloc(nv * 4), *wk = malloc(nk * 4), *wv = malloc(nv * 4);
  ASSERT(k && v && wk && wv);
  fill(wk, nk, seq, salt);
  fill(wv, nv, seq, salt + 1);
  ASSERT_OK(kvc_get(h, seq, 0, TOK, k, v));
  if (memcmp(k, wk, nk * 4) != 0 || memcmp(v, wv, nv * 4) != 0)
    TEST_FAIL_("sequence %llu: bytes differ", (unsigned long long)seq);
  free(k), free(v), free(wk), free(wv);
}

typedef struct side {
  const daemon_t *d;
  int to_parent, from_parent;
} side_t;

static void say(const side_t *s, char ch) { ASSERT(write(s->to_parent, &ch, 1) == 1); }
static void hear(const side_t *s) {
  char ch;
  ASSERT(read(s->from_parent, &ch, 1) == 1);
}

static kvc_client_t *open_shm(const daemon_t *d, uint64_t shm_bytes, int *rc) {
  kvc_client_opts_t o = {.socket_path = d->sock, .shm_bytes = shm_bytes, .timeout_ms = 20000,
                         .client_name = "quota"};
  kvc_client_t *c = NULL;
  *rc = kvc_client_open(&o, &c);
  return c;
}

/* Writes NV sequences, lets the hog run, checks every byte, writes NV more
 * under the pressure the hog left (the hog, over its share, gives the room)
 * and checks all of them again. */
static void victim_main(void *p) {
  side_t *s = p;
  int rc;
  kvc_client_t *c = open_shm(s->d, 1 << 20, &rc);
  ASSERT_OK(rc);
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_open(c, "work", &l, &h));
  for (uint64_t q = 1; q <= NV; q++) put_seq(h, q, 11);
  say(s, 'r');
  hear(s); /* the hog has had its turn */
  for (uint64_t q = 1; q <= NV; q++) check_seq(h, q, 11);
  for (uint64_t q = NV + 1; q <= 2 * NV; q++) put_seq(h, q, 11);
  for (uint64_t q = 1; q <= 2 * NV; q++) check_seq(h, q, 11);
  kvc_cache_close(h);
  kvc_client_close(c);
  say(s, 'd');
}

/* Expects the code of a call, with the limit named in the message. */
#define EXPECT_QUOTA(call, code, client, option)                                          \
  do {                                                                                    \
    int rc_ = (call);                                                                     \
    if (rc_ != (code))                                                                    \
      TEST_FAIL_("%s: expected %s, got %s", #call, kvc_err_name(code), kvc_err_name(rc_)); \
    if ((client) && !strstr(kvc_client_last_error(client), option))                       \
      TEST_FAIL_("%s: message '%s' does not name %s", #call, kvc_client_last_error(client), \
                 option);                                                                 \
  } while (0)

static void hog_main(void *p) {
  side_t *s = p;
  hear(s);
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  int rc;
  /* Connections: 4 per uid, the fifth refused. */
  kvc_client_t *c[4];
  for (int i = 0; i < 4; i++) {
    c[i] = open_shm(s->d, 1 << 20, &rc);
    ASSERT_OK(rc);
  }
  kvc_client_t *x = open_shm(s->d, 1 << 20, &rc);
  ASSERT(x == NULL);
  ASSERT_ERR(rc, KVC_E_QUOTA_CONNS);
  ASSERT(strstr(kvc_client_open_error(), "max_connections_per_uid") != NULL);
  /* Shared-buffer bytes: 3 MiB held, 4 more pass the uid's 6 MiB. */
  kvc_client_close(c[3]);
  x = open_shm(s->d, 4 << 20, &rc);
  ASSERT(x == NULL);
  ASSERT_ERR(rc, KVC_E_QUOTA_SHM);
  ASSERT(strstr(kvc_client_open_error(), "shm_bytes_per_uid") != NULL);
  c[3] = open_shm(s->d, 1 << 20, &rc);
  ASSERT_OK(rc);
  /* Caches: 3 for the tenant, across its connections; a drop frees a slot. */
  kvc_cache_t *h[4];
  char name[16];
  for (int i = 0; i < 3; i++) {
    snprintf(name, sizeof name, "h%d", i);
    ASSERT_OK(kvc_cache_open(c[i], name, &l, &h[i]));
  }
  EXPECT_QUOTA(kvc_cache_open(c[3], "h3", &l, &h[3]), KVC_E_QUOTA_CACHES, c[3],
               "tenant_max_caches");
  ASSERT_OK(kvc_cache_drop(h[2]));
  kvc_cache_close(h[2]);
  ASSERT_OK(kvc_cache_open(c[3], "h3", &l, &h[3])); /* h0, h1, h3 now */
  /* Sequences, empty ones too: 200 for the tenant. */
  put_seq(h[0], 1, 5);
  uint64_t made = 1;
  for (uint64_t q = 2; q < 400; q++) {
    rc = kvc_seq_copy_prefix(h[0], 1, q, 0);
    if (rc) break;
    made++;
  }
  ASSERT_ERR(rc, KVC_E_QUOTA_SEQS);
  ASSERT(strstr(kvc_client_last_error(c[0]), "tenant_max_seqs") != NULL);
  ASSERT_U64_EQ(made, 200);
  EXPECT_QUOTA(kvc_seq_copy_prefix(h[0], 1, 999, 0), KVC_E_QUOTA_SEQS, c[0],
               "tenant_max_seqs");
  for (uint64_t q = 2; q <= made; q++) ASSERT_OK(kvc_seq_remove(h[0], q, 0, UINT64_MAX));
  /* Pins: a sequence pinned at one token that keeps growing. */
  size_t nk = it_tok_floats(&l, false) * 16, nv = it_tok_floats(&l, true) * 16;
  float *k = calloc(nk, 4), *v = calloc(nv, 4);
  ASSERT(k && v);
  ASSERT_OK(kvc_put(h[1], 1, 0, 1, k, v));
  ASSERT_OK(kvc_seq_pin(h[1], 1));
  uint64_t pos = 1;
  for (; pos < 200 * 16; pos += 16)
    if ((rc = kvc_put(h[1], 1, pos, 16, k, v)) != 0) break;
  ASSERT_ERR(rc, KVC_E_QUOTA_PINS);
  ASSERT(strstr(kvc_client_last_error(c[1]), "tenant_max_pinned") != NULL);
  ASSERT(pos < 60 * 16); /* 10% of 512 pages */
  ASSERT_OK(kvc_seq_unpin(h[1], 1));
  ASSERT_OK(kvc_seq_remove(h[1], 1, 0, UINT64_MAX));
  /* Interned keys: 8 for the tenant. */
  uint32_t ids[16];
  for (uint32_t i = 0; i < 16; i++) ids[i] = 100 + i;
  uint32_t extra;
  for (extra = 0; extra < 20; extra++) {
    ASSERT_OK(kvc_cache_set_extra(h[0], &extra, sizeof extra));
    if ((rc = kvc_put_tokens(h[0], 1000 + extra, 0, 16, k, v, ids)) != 0) break;
  }
  ASSERT_ERR(rc, KVC_E_QUOTA_KEYS);
  ASSERT(strstr(kvc_client_last_error(c[0]), "tenant_max_keys") != NULL);
  ASSERT_EQ(extra, 8);
  free(k), free(v);
  /* The pool: twice its pages, unpinned: past its share the hog makes room
   * from its own sequences, never the victim's. */
  for (uint64_t q = 1; q <= 2 * 512 / 3; q++) put_seq(h[3], q, 7);
  check_seq(h[3], 2 * 512 / 3, 7);
  for (int i = 0; i < 4; i++)
    if (i != 2) kvc_cache_close(h[i]);
  for (int i = 0; i < 4; i++) kvc_client_close(c[i]);
  say(s, 'h');
}

static const kvc_tenant_info_t *row(const kvc_tenant_info_t *t, size_t n, const char *name) {
  for (size_t i = 0; i < n; i++)
    if (strcmp(t[i].name, name) == 0) return &t[i];
  TEST_FAIL_("no tenant %s in the listing", name);
  return NULL;
}

TEST_TIMEOUT(quotas_hog_gets_each_limit_victim_unharmed, 120) {
  static const char *const args[] = {
      "--allow-uids", "self,root,64001,64002", "--socket-mode", "0666",
      "--tenant-max-pages-pct", "50", "--tenant-max-pinned-pct", "10",
      "--tenant-max-seqs", "200", "--tenant-max-caches", "3", "--tenant-max-keys", "8",
      "--max-connections-per-uid", "4", "--shm-default-bytes", "1MiB",
      "--shm-max-bytes", "4MiB", "--shm-bytes-per-uid", "6MiB", "--shm-bytes-total", "64MiB",
      NULL};
  daemon_t d;
  daemon_start_args(&d, args);
  ASSERT_EQ(chmod(d.dir, 0755), 0);
  int vp[2], vc[2], hp[2], hc[2];
  ASSERT(pipe(vp) == 0 && pipe(vc) == 0 && pipe(hp) == 0 && pipe(hc) == 0);
  side_t vs = {&d, vp[1], vc[0]}, hs = {&d, hp[1], hc[0]};
  pid_t victim = spawn_as(UID_V, victim_main, &vs);
  pid_t hog = spawn_as(UID_H, hog_main, &hs);
  close(vp[1]), close(vc[0]), close(hp[1]), close(hc[0]); /* a child's death is EOF */
  char ch;
  ASSERT(read(vp[0], &ch, 1) == 1 && ch == 'r');
  ASSERT(write(hc[1], "g", 1) == 1);
  if (read(hp[0], &ch, 1) != 1 || ch != 'h') TEST_FAIL_("the hog failed: exit %d", reap(hog));
  ASSERT(write(vc[1], "g", 1) == 1);
  if (read(vp[0], &ch, 1) != 1 || ch != 'd') TEST_FAIL_("the victim failed: exit %d", reap(victim));
  ASSERT_EQ(reap(hog), 0);
  ASSERT_EQ(reap(victim), 0);
  /* Root, an admin, sees both tenants' usage and refusals. */
  kvc_client_t *c = client_open(&d);
  kvc_tenant_info_t *t;
  size_t n;
  ASSERT_OK(kvc_tenants(c, &t, &n));
  const kvc_tenant_info_t *h = row(t, n, "uid:64002"), *v = row(t, n, "uid:64001");
  ASSERT_U64_EQ(h->refused_connections, 1);
  ASSERT_U64_EQ(h->refused_shm, 1);
  ASSERT_U64_EQ(h->refused_caches, 1);
  ASSERT_U64_EQ(h->refused_sequences, 2);
  ASSERT_U64_EQ(h->refused_pins, 1);
  ASSERT_U64_EQ(h->refused_keys, 1);
  ASSERT_U64_EQ(h->refused_pages, 0); /* its own victims always sufficed */
  ASSERT_U64_EQ(h->max_bytes, 256 * 16384); /* 50% of 8 MiB */
  ASSERT_U64_EQ(h->max_pinned_bytes, (8u << 20) / 10);
  ASSERT_EQ(h->max_caches, 3);
  ASSERT(h->pool_pages <= 512 - 2 * NV * 3);
  ASSERT_U64_EQ(v->pool_pages, 2 * NV * 3);
  ASSERT_U64_EQ(v->refused_connections + v->refused_shm + v->refused_caches +
                    v->refused_sequences + v->refused_pins + v->refused_keys + v->refused_pages,
                0);
  kvc_tenants_free(t);
  char out[4096];
  ASSERT_EQ(it_sh(out, sizeof out, "KVCACHED_SOCKET=%s %s/kvcachectl tenants", d.sock,
                  it_build()), 0);
  ASSERT(strstr(out, "uid:64002") && strstr(out, "refuse") && strstr(out, "POOL_MIB"));
  kvc_client_close(c);
  daemon_stop(&d);
}

/* A quota lowered or raised by SIGHUP applies to the next call. */
TEST(quotas_reload_changes_a_limit) {
  daemon_t d;
  char path[160], flag[160];
  snprintf(path, sizeof path, "/tmp/kvcit-quota-%d.conf", (int)getpid());
  it_write_file(path, "tenant_max_caches = 1\n");
  snprintf(flag, sizeof flag, "%s", path);
  const char *const args[] = {"--config", flag, NULL};
  daemon_start_args(&d, args);
  kvc_client_t *c = client_open(&d);
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *a, *b;
  ASSERT_OK(kvc_cache_open(c, "a", &l, &a));
  EXPECT_QUOTA(kvc_cache_open(c, "b", &l, &b), KVC_E_QUOTA_CACHES, c, "tenant_max_caches");
  it_write_file(path, "tenant_max_caches = 2\n");
  ASSERT_EQ(kill(d.pid, SIGHUP), 0);
  ASSERT(it_log_wait(&d, "event=reloaded", 5000));
  ASSERT_OK(kvc_cache_open(c, "b", &l, &b));
  kvc_cache_t *x;
  EXPECT_QUOTA(kvc_cache_open(c, "c", &l, &x), KVC_E_QUOTA_CACHES, c, "tenant_max_caches");
  kvc_cache_close(a);
  kvc_cache_close(b);
  kvc_client_close(c);
  daemon_stop(&d);
  unlink(path);
}

/* Regression: 64 caches opened and dropped left TOOMANY for the daemon's
 * life; a dropped cache's slot is reused and its old id names nothing. */
TEST(quotas_cache_slots_are_reused) {
  static const char *const args[] = {"--max-caches", "2", "--tenant-max-caches", "0", NULL};
  daemon_t d;
  daemon_start_args(&d, args);
  kvc_client_t *c = client_open(&d);
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *a, *b;
  for (int round = 0; round < 5; round++) {
    ASSERT_OK(kvc_cache_open(c, "a", &l, &a));
    ASSERT_OK(kvc_cache_open(c, "b", &l, &b));
    put_seq(b, 1, (uint32_t)round);
    check_seq(b, 1, (uint32_t)round);
    kvc_cache_t *x;
    ASSERT_ERR(kvc_cache_open(c, "x", &l, &x), KVC_E_TOOMANY);
    ASSERT_OK(kvc_cache_drop(a));
    ASSERT_OK(kvc_cache_drop(b));
    kvc_cache_close(a);
    kvc_cache_close(b);
  }
  ASSERT_U64_EQ(stat_get(c, "caches", NULL), 0);
  kvc_client_close(c);
  daemon_stop(&d);
}

/* A connection that sends nothing for idle_timeout_ms is closed; one that
 * keeps working is not. */
TEST(quotas_idle_connection_is_closed) {
  static const char *const args[] = {"--idle-timeout-ms", "300", NULL};
  daemon_t d;
  daemon_start_args(&d, args);
  kvc_client_t *c = client_open(&d);
  int fd = hard_greeted(&d);
  struct pollfd pfd = {fd, POLLIN, 0};
  int waited = 0;
  for (; waited < 10000; waited += 20) {
    ASSERT_OK(kvc_ping(c)); /* the working client stays */
    if (poll(&pfd, 1, 20) == 1) break;
  }
  ASSERT(waited < 10000);
  char buf[64];
  ASSERT_EQ(read(fd, buf, sizeof buf), 0); /* closed by the daemon */
  close(fd);
  ASSERT_OK(kvc_ping(c));
  ASSERT_U64_EQ(stat_get(c, "connections_idle_closed_total", NULL), 1);
  ASSERT(it_log_has(&d, "idle timeout"));
  kvc_client_close(c);
  daemon_stop(&d);
}

/* The floored victim's sequences, written and checked around the flood. */
static void floored_main(void *p) {
  side_t *s = p;
  int rc;
  kvc_client_t *c = open_shm(s->d, 1 << 20, &rc);
  ASSERT_OK(rc);
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_open(c, "work", &l, &h));
  for (uint64_t q = 1; q <= 40; q++) put_seq(h, q, 5); /* 120 pages, under its floor */
  say(s, 'r');
  hear(s);
  for (uint64_t q = 1; q <= 40; q++) check_seq(h, q, 5);
  /* Its own view of the refusal counters: its tenant alone, nothing refused. */
  ASSERT_U64_EQ(stat_get(c, "quota_refusals_total{tenant=uid:64001}", NULL), 0);
  kvc_stat_t *st;
  size_t n;
  ASSERT_OK(kvc_stats(c, &st, &n));
  for (size_t i = 0; i < n; i++) {
    const char *t = kvc_stat_label(&st[i], "tenant");
    if (strcmp(st[i].name, "quota_refusals_total") == 0 && strcmp(t, "uid:64001") != 0)
      TEST_FAIL_("a client sees tenant %s's refusals", t);
  }
  kvc_stats_free(st);
  kvc_cache_close(h);
  kvc_client_close(c);
  say(s, 'd');
}

/* The hog floods the pool three times over and asks for a second cache. */
static void flooder_main(void *p) {
  side_t *s = p;
  hear(s);
  int rc;
  kvc_client_t *c = open_shm(s->d, 1 << 20, &rc);
  ASSERT_OK(rc);
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *h, *x;
  ASSERT_OK(kvc_cache_open(c, "flood", &l, &h));
  for (uint64_t q = 1; q <= 512; q++) put_seq(h, q, 9);
  EXPECT_QUOTA(kvc_cache_open(c, "more", &l, &x), KVC_E_QUOTA_CACHES, c, "tenant_max_caches");
  ASSERT_U64_EQ(stat_get(c, "quota_refusals_total{tenant=uid:64002,limit=caches}", NULL), 1);
  ASSERT_U64_EQ(stat_get(c, "quota_refusals_total{tenant=uid:64002,limit=pages}", NULL), 0);
  check_seq(h, 512, 9);
  kvc_cache_close(h);
  kvc_client_close(c);
  say(s, 'h');
}

/* A tenant floor (tenant_floors) keeps a victim's pages through another
 * tenant's flood of three pools' worth, every byte verified; the refusals
 * are counted per tenant and limit in the metrics, each client seeing its
 * own tenant's and an admin every tenant's that refused anything. */
TEST_TIMEOUT(quotas_floor_keeps_a_tenant_through_a_flood, 120) {
  static const char *const args[] = {
      "--allow-uids", "self,root,64001,64002", "--socket-mode", "0666",
      "--tenant-floors", "uid:64001=30", "--tenant-max-pages-pct", "100",
      "--tenant-max-caches", "1", "--shm-default-bytes", "1MiB", NULL};
  daemon_t d;
  daemon_start_args(&d, args);
  ASSERT_EQ(chmod(d.dir, 0755), 0);
  int vp[2], vc[2], hp[2], hc[2];
  ASSERT(pipe(vp) == 0 && pipe(vc) == 0 && pipe(hp) == 0 && pipe(hc) == 0);
  side_t vs = {&d, vp[1], vc[0]}, hs = {&d, hp[1], hc[0]};
  pid_t victim = spawn_as(UID_V, floored_main, &vs);
  pid_t hog = spawn_as(UID_H, flooder_main, &hs);
  close(vp[1]), close(vc[0]), close(hp[1]), close(hc[0]);
  char ch;
  ASSERT(read(vp[0], &ch, 1) == 1 && ch == 'r');
  ASSERT(write(hc[1], "g", 1) == 1);
  if (read(hp[0], &ch, 1) != 1 || ch != 'h') TEST_FAIL_("the flooder failed: exit %d", reap(hog));
  ASSERT(write(vc[1], "g", 1) == 1);
  if (read(vp[0], &ch, 1) != 1 || ch != 'd') TEST_FAIL_("the victim failed: exit %d", reap(victim));
  ASSERT_EQ(reap(hog), 0);
  ASSERT_EQ(reap(victim), 0);
  kvc_client_t *c = client_open(&d);
  kvc_tenant_info_t *t;
  size_t n;
  ASSERT_OK(kvc_tenants(c, &t, &n));
  const kvc_tenant_info_t *v = row(t, n, "uid:64001");
  ASSERT_U64_EQ(v->min_bytes, (8ull << 20) * 30 / 100);
  ASSERT_U64_EQ(v->pool_pages, 120);
  kvc_tenants_free(t);
  /* Root, an admin, sees the flooder's refusal too. */
  ASSERT_U64_EQ(stat_get(c, "quota_refusals_total{tenant=uid:64002,limit=caches}", NULL), 1);
  char out[4096];
  ASSERT_EQ(ctl_run(&d, out, sizeof out, false, "tenants"), 0);
  ASSERT(strstr(out, "1.9/8.0>=2.4") != NULL); /* MiB used/share>=floor: 120, 512, 153 pages */
  kvc_client_close(c);
  daemon_stop(&d);
}

/* Waits for the daemon to say (its reload counter) it applied n reloads. */
static void wait_reloads(kvc_client_t *c, uint64_t n) {
  (void)it_wait_stat(c, "config_reloads_total", n, true);
  ASSERT_U64_EQ(stat_get(c, "config_reloads_total", NULL), n);
}

/* The pool's pin limit is reloadable: a pin past it is refused, the same pin
 * passes once SIGHUP raised it, and the pins held stay when it is lowered. */
TEST(quotas_pin_limit_reloaded) {
  daemon_t d;
  char path[160];
  snprintf(path, sizeof path, "/tmp/kvcit-pinlimit-%d.conf", (int)getpid());
  it_write_file(path, "pin_limit_pct = 1\n"); /* 5 of 512 pages */
  const char *const args[] = {"--config", path, NULL};
  daemon_start_args(&d, args);
  kvc_client_t *c = client_open(&d);
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_open(c, "pins", &l, &h));
  size_t nk = it_tok_floats(&l, false) * 96, nv = it_tok_floats(&l, true) * 96;
  float *k = calloc(nk, 4), *v = calloc(nv, 4);
  ASSERT_OK(kvc_put(h, 1, 0, 96, k, v)); /* 6 pages */
  EXPECT_QUOTA(kvc_seq_pin(h, 1), KVC_E_PINLIMIT, c, "pin");
  it_write_file(path, "pin_limit_pct = 50\n");
  ASSERT_EQ(kill(d.pid, SIGHUP), 0);
  wait_reloads(c, 1);
  ASSERT_OK(kvc_seq_pin(h, 1));
  it_write_file(path, "pin_limit_pct = 1\n");
  ASSERT_EQ(kill(d.pid, SIGHUP), 0);
  wait_reloads(c, 2);
  kvc_seq_info_t si;
  ASSERT_OK(kvc_seq_info(h, 1, &si));
  ASSERT_EQ(si.pins, 1); /* held */
  ASSERT_OK(kvc_put(h, 2, 0, 96, k, v));
  EXPECT_QUOTA(kvc_seq_pin(h, 2), KVC_E_PINLIMIT, c, "pin");
  free(k), free(v);
  kvc_client_close(c);
  daemon_stop(&d);
  unlink(path);
}

/* Fair by default (issue 30): with no tenant_max_pinned_pct, a tenant alone
 * grows one pinned sequence until its share of the pin limit stops it
 * (QUOTA_PINS at half of pin_limit_pct, not PINLIMIT at all of it), and a
 * second tenant's first pins then find room. */
typedef struct fair_arg {
  const daemon_t *d;
  int ready, go;
} fair_arg_t;

static void fair_a(void *p) {
  fair_arg_t *a = p;
  kvc_client_t *c = client_open(a->d);
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_open(c, "grow", &l, &h));
  size_t n = it_tok_floats(&l, false) * 16;
  float *k = calloc(n, 4), *v = calloc(n, 4);
  ASSERT_OK(kvc_put(h, 1, 0, 16, k, v));
  ASSERT_OK(kvc_seq_pin(h, 1));
  int rc;
  uint64_t pages = 1;
  while ((rc = kvc_put(h, 1, pages * 16, 16, k, v)) == 0) pages++;
  if (rc != KVC_E_QUOTA_PINS || pages != 128 ||
      !strstr(kvc_client_last_error(c), "share of the pin limit")) {
    fprintf(stderr, "tenant A: %s after %llu pages: %s\n", kvc_err_name(rc),
            (unsigned long long)pages, kvc_client_last_error(c));
    _exit(50);
  }
  free(k), free(v);
  char x = 1;
  if (write(a->ready, &x, 1) != 1 || read(a->go, &x, 1) != 1) _exit(51); /* keeps its pins */
  kvc_client_close(c);
}

static void fair_b(void *p) {
  fair_arg_t *a = p;
  kvc_client_t *c = client_open(a->d);
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_open(c, "mine", &l, &h));
  size_t n = it_tok_floats(&l, false) * 16 * 4;
  float *k = calloc(n, 4), *v = calloc(n, 4);
  ASSERT_OK(kvc_put(h, 1, 0, 64, k, v)); /* 4 pages */
  int rc = kvc_seq_pin(h, 1);
  if (rc) {
    fprintf(stderr, "tenant B's first pin: %s: %s\n", kvc_err_name(rc), kvc_client_last_error(c));
    _exit(52);
  }
  free(k), free(v);
  kvc_client_close(c);
}

TEST(quotas_pins_fair_by_default_between_two_tenants) {
  daemon_t d;
  const char *args[] = {"--allow-uids", "self,root,64001,64002", "--socket-mode", "0666",
                        "--tenant-max-pages-pct", "100", NULL};
  daemon_start_args(&d, args);
  ASSERT_EQ(chmod(d.dir, 0755), 0);
  int rp[2], gp[2];
  ASSERT_EQ(pipe(rp), 0);
  ASSERT_EQ(pipe(gp), 0);
  fair_arg_t a = {&d, rp[1], gp[0]};
  pid_t pa = spawn_as(UID_H, fair_a, &a);
  char x;
  ASSERT_EQ(read(rp[0], &x, 1), 1);
  pid_t pb = spawn_as(UID_V, fair_b, &a);
  ASSERT_EQ(reap(pb), 0);
  ASSERT_EQ(write(gp[1], &x, 1), 1);
  ASSERT_EQ(reap(pa), 0);
  daemon_stop(&d);
}
