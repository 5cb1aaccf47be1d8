/* tenants.c: a second tenant, a real other uid, tries every route into a
 * first tenant's data and fails, while the first tenant's work goes on with
 * every byte verified (doc/security.md). Children drop to unused uids with
 * setgroups/setresgid/setresuid; no user is created. */
#include <grp.h>
#include <sys/random.h>
#include <sys/syscall.h>

#include "hard.h"

#define UID_A 64001u /* the victim */
#define UID_B 64002u /* the attacker */
#define UID_C 64003u
#define UID_X 64005u /* an impostor server */
#define PAT 16       /* floats of the victim's pattern */

static void drop_to(uid_t uid) {
  if (setgroups(0, NULL) != 0 || setresgid(uid, uid, uid) != 0 || setresuid(uid, uid, uid) != 0)
    _exit(90);
  /* A uid change leaves the process not dumpable: make it readable again
   * for its own memory dump (it dumps only itself). */
  prctl(PR_SET_DUMPABLE, 1, 0, 0, 0);
}

/* Runs fn as uid in a child; returns its exit status (0: every check held). */
static int as_uid(uid_t uid, void (*fn)(void *), void *arg) {
  fflush(NULL);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    if (uid) drop_to(uid);
    fn(arg);
    _exit(0);
  }
  int st;
  ASSERT(waitpid(pid, &st, 0) == pid);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

/* A daemon other uids can reach: the socket world-connectable, its directory
 * traversable (but writable by nobody else). */
static void start_shared(daemon_t *d, const char *const *more) {
  const char *args[24] = {"--allow-uids", "self,root,64001,64002,64003", "--socket-mode", "0666"};
  int n = 4;
  for (int i = 0; more && more[i] && n < 22; i++) args[n++] = more[i];
  args[n] = NULL;
  daemon_start_args(d, args);
  ASSERT_EQ(chmod(d->dir, 0755), 0);
}

/* The victim's pattern: 16 floats from its secret nonce. */
static void pattern(uint64_t nonce, float out[PAT]) {
  for (int i = 0; i < PAT; i++) {
    uint64_t h = (nonce + (uint64_t)i * 0x9e3779b97f4a7c15ull) * 0xbf58476d1ce4e5b9ull;
    out[i] = (float)((h >> 40) % 1000000) + 0.25f;
  }
}

static void fill_pattern(float *buf, size_t nfloats, uint64_t nonce) {
  float p[PAT];
  pattern(nonce, p);
  for (size_t i = 0; i < nfloats; i++) buf[i] = p[i % PAT];
}

/* Writes every readable mapping of this process to fd, by the raw system
 * call (the kernel copies from our memory: an unreadable page is EFAULT,
 * never a fault here, and no sanitizer checks the bytes). Regions over
 * 256 MiB are a sanitizer's shadow reservations, not anything kvcached
 * handed out (the test daemon's pool is 8 MiB). */
static void dump_memory(int fd) {
  FILE *m = fopen("/proc/self/maps", "r");
  if (!m) _exit(91);
  char line[512];
  while (fgets(line, sizeof line, m)) {
    unsigned long lo, hi;
    char perm[8];
    if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perm) != 3 || perm[0] != 'r') continue;
    if (strstr(line, "[vvar") || strstr(line, "[vsyscall]") || hi - lo > (256ul << 20)) continue;
    for (unsigned long p = lo; p < hi;) {
      size_t n = hi - p < (1ul << 20) ? hi - p : (1ul << 20);
      long w = syscall(SYS_write, fd, (const void *)p, n);
      p += w > 0 ? (unsigned long)w : n;
    }
  }
  fclose(m);
}

/* Runs fn as uid with its memory dump collected afterwards; whether the
 * dump holds the pattern of nonce. */
typedef struct dumped {
  void (*fn)(void *);
  void *arg;
  int fd;
} dumped_t;

static void run_then_dump(void *p) {
  dumped_t *d = p;
  d->fn(d->arg);
  dump_memory(d->fd);
  close(d->fd);
}

static bool dump_has_pattern(uid_t uid, void (*fn)(void *), void *arg, uint64_t nonce) {
  int pfd[2];
  ASSERT_EQ(pipe(pfd), 0);
  dumped_t d = {fn, arg, pfd[1]};
  fflush(NULL);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    close(pfd[0]);
    if (uid) drop_to(uid);
    run_then_dump(&d);
    _exit(0);
  }
  close(pfd[1]);
  size_t cap = 64u << 20, len = 0;
  char *buf = malloc(cap);
  ASSERT(buf != NULL);
  for (;;) {
    if (len == cap) {
      cap *= 2;
      ASSERT((buf = realloc(buf, cap)) != NULL);
    }
    ssize_t r = read(pfd[0], buf + len, cap - len);
    if (r <= 0) break;
    len += (size_t)r;
  }
  close(pfd[0]);
  int st;
  ASSERT(waitpid(pid, &st, 0) == pid);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
    TEST_FAIL_("the dumping child failed: status %d (exit %d)", st,
               WIFEXITED(st) ? WEXITSTATUS(st) : -1);
  ASSERT(len > (1u << 20)); /* it did dump its mappings */
  float p[PAT];
  pattern(nonce, p); /* only now, after the child is gone */
  bool found = memmem(buf, len, p, sizeof p) != NULL;
  free(buf);
  return found;
}

/* ---- the victim --------------------------------------------------------------- */

typedef struct victim {
  const daemon_t *d;
  int to_parent, from_parent; /* pipe ends */
  uint64_t nonce;
} victim_t;

enum { V_SEQ = 1, V_TOKENS = 48 };

static void victim_put(kvc_cache_t *h, uint64_t seq, uint64_t nonce, const uint32_t *ids) {
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  size_t nk = it_tok_floats(&l, false) * V_TOKENS, nv = it_tok_floats(&l, true) * V_TOKENS;
  float *k = malloc(nk * 4), *v = malloc(nv * 4);
  ASSERT(k && v);
  fill_pattern(k, nk, nonce);
  fill_pattern(v, nv, nonce ^ 1);
  if (ids) ASSERT_OK(kvc_put_tokens(h, seq, 0, V_TOKENS, k, v, ids));
  else ASSERT_OK(kvc_put(h, seq, 0, V_TOKENS, k, v));
  free(k);
  free(v);
}

static void victim_check(kvc_cache_t *h, uint64_t seq, uint64_t nonce) {
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  size_t nk = it_tok_floats(&l, false) * V_TOKENS, nv = it_tok_floats(&l, true) * V_TOKENS;
  float *k = malloc(nk * 4), *v = malloc(nv * 4), *wk = malloc(nk * 4), *wv = malloc(nv * 4);
  ASSERT(k && v && wk && wv);
  fill_pattern(wk, nk, nonce);
  fill_pattern(wv, nv, nonce ^ 1);
  ASSERT_OK(kvc_get(h, seq, 0, V_TOKENS, k, v));
  ASSERT(memcmp(k, wk, nk * 4) == 0 && memcmp(v, wv, nv * 4) == 0);
  free(k), free(v), free(wk), free(wv);
}

static void prompt_ids(uint32_t *ids) {
  for (uint32_t i = 0; i < V_TOKENS; i++) ids[i] = 7000 + i;
}

/* Writes a secret sequence (pinned) and a prompt with token ids, reports its
 * cache ids, waits; then checks every byte, attaches its prompt, removes. */
static void victim_main(void *p) {
  victim_t *v = p;
  kvc_client_t *c = client_open(v->d);
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *sec, *llm;
  ASSERT_OK(kvc_cache_open(c, "secret", &l, &sec));
  ASSERT_OK(kvc_cache_open(c, "llm", &l, &llm));
  uint32_t ids[V_TOKENS];
  prompt_ids(ids);
  victim_put(sec, V_SEQ, v->nonce, NULL);
  ASSERT_OK(kvc_seq_pin(sec, V_SEQ));
  victim_put(llm, 5, v->nonce, ids);
  uint32_t report[2] = {kvc_cache_id(sec), kvc_cache_id(llm)};
  ASSERT(write(v->to_parent, report, sizeof report) == sizeof report);
  char go;
  ASSERT(read(v->from_parent, &go, 1) == 1); /* the attacker has had its turn */
  victim_check(sec, V_SEQ, v->nonce);
  victim_check(llm, 5, v->nonce);
  kvc_match_t m;
  ASSERT_OK(kvc_attach(llm, 6, ids, V_TOKENS, false, &m));
  ASSERT_U64_EQ(m.tokens, V_TOKENS);
  victim_check(llm, 6, v->nonce); /* its own prompt, never the attacker's poison */
  kvc_seq_info_t si;
  ASSERT_OK(kvc_seq_info(sec, V_SEQ, &si));
  ASSERT_EQ(si.pins, 1); /* its pin stood */
  ASSERT_OK(kvc_seq_remove(sec, V_SEQ, 0, UINT64_MAX));
  ASSERT_OK(kvc_seq_remove(llm, 5, 0, UINT64_MAX));
  ASSERT_OK(kvc_seq_remove(llm, 6, 0, UINT64_MAX));
  ASSERT_OK(kvc_cache_clear(llm)); /* cached prefix pages go too: freed */
  ASSERT(write(v->to_parent, "d", 1) == 1);
  ASSERT(read(v->from_parent, &go, 1) == 1);
  kvc_cache_close(sec);
  kvc_cache_close(llm);
  kvc_client_close(c);
}

/* ---- the attacker --------------------------------------------------------------- */

typedef struct attacker {
  const daemon_t *d;
  uint32_t victim_cache[2]; /* "secret", "llm" of the victim */
  bool after_remove;        /* second turn: fill the pool over freed pages */
} attacker_t;

/* One raw request naming the victim's cache: it must answer NOCACHE. */
static void raw_expect_nocache(int fd, Kvcache__V1__Request *req, const char *what) {
  raw_send_request(fd, req);
  Kvcache__V1__Response *r = raw_reply(fd);
  ASSERT(r != NULL);
  if (r->status != KVCACHE__V1__STATUS__NOCACHE)
    TEST_FAIL_("%s on another tenant's cache: status %d (%s), want NOCACHE", what,
               (int)r->status, r->error);
  kvcache__v1__response__free_unpacked(r, NULL);
}

static void attack_by_id(const daemon_t *d, uint32_t cid) {
  int fd = hard_greeted(d);
  Kvcache__V1__SeqRef sr = KVCACHE__V1__SEQ_REF__INIT;
  sr.cache_id = cid, sr.seq_id = V_SEQ;
  Kvcache__V1__Request q = KVCACHE__V1__REQUEST__INIT;
  q.id = 1, q.body_case = KVCACHE__V1__REQUEST__BODY_SEQ_INFO, q.seq_info = &sr;
  raw_expect_nocache(fd, &q, "seq_info");
  q.body_case = KVCACHE__V1__REQUEST__BODY_PIN, q.pin = &sr;
  raw_expect_nocache(fd, &q, "pin");
  q.body_case = KVCACHE__V1__REQUEST__BODY_UNPIN, q.unpin = &sr;
  raw_expect_nocache(fd, &q, "unpin");
  q.body_case = KVCACHE__V1__REQUEST__BODY_KEEP, q.keep = &sr;
  raw_expect_nocache(fd, &q, "keep");
  Kvcache__V1__Remove rm = KVCACHE__V1__REMOVE__INIT;
  rm.cache_id = cid, rm.seq_id = V_SEQ, rm.begin = 0, rm.end = UINT64_MAX;
  q.body_case = KVCACHE__V1__REQUEST__BODY_REMOVE, q.remove = &rm;
  raw_expect_nocache(fd, &q, "remove");
  Kvcache__V1__SetPriority sp = KVCACHE__V1__SET_PRIORITY__INIT;
  sp.cache_id = cid, sp.seq_id = V_SEQ, sp.priority = 0;
  q.body_case = KVCACHE__V1__REQUEST__BODY_SET_PRIORITY, q.set_priority = &sp;
  raw_expect_nocache(fd, &q, "set_priority");
  Kvcache__V1__CacheRef cr = KVCACHE__V1__CACHE_REF__INIT;
  cr.cache_id = cid;
  q.body_case = KVCACHE__V1__REQUEST__BODY_CACHE_CLEAR, q.cache_clear = &cr;
  raw_expect_nocache(fd, &q, "cache_clear");
  q.body_case = KVCACHE__V1__REQUEST__BODY_CACHE_DROP, q.cache_drop = &cr;
  raw_expect_nocache(fd, &q, "cache_drop");
  Kvcache__V1__Lease ls = KVCACHE__V1__LEASE__INIT;
  ls.cache_id = cid, ls.seq_id = V_SEQ, ls.begin = 0, ls.end = 16;
  q.body_case = KVCACHE__V1__REQUEST__BODY_LEASE, q.lease = &ls;
  raw_expect_nocache(fd, &q, "lease");
  Kvcache__V1__SeqList sl = KVCACHE__V1__SEQ_LIST__INIT;
  sl.cache_id = cid;
  q.body_case = KVCACHE__V1__REQUEST__BODY_SEQ_LIST, q.seq_list = &sl;
  raw_expect_nocache(fd, &q, "seq_list");
  Kvcache__V1__PrefixTop pt = KVCACHE__V1__PREFIX_TOP__INIT;
  pt.cache_id = cid;
  q.body_case = KVCACHE__V1__REQUEST__BODY_PREFIX_TOP, q.prefix_top = &pt;
  raw_expect_nocache(fd, &q, "prefix_top");
  Kvcache__V1__IoEntry e = KVCACHE__V1__IO_ENTRY__INIT, *pe = &e;
  e.seq_id = V_SEQ, e.pos = 0, e.ntokens = 1;
  Kvcache__V1__Io io = KVCACHE__V1__IO__INIT;
  io.cache_id = cid, io.n_entries = 1, io.entries = &pe;
  q.body_case = KVCACHE__V1__REQUEST__BODY_GET, q.get = &io;
  raw_expect_nocache(fd, &q, "get");
  q.body_case = KVCACHE__V1__REQUEST__BODY_PUT, q.put = &io;
  raw_expect_nocache(fd, &q, "put");
  close(fd);
}

static void attacker_main(void *p) {
  attacker_t *a = p;
  kvc_client_t *c = client_open(a->d);
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  if (!a->after_remove) {
    /* by name: its own, empty caches */
    kvc_cache_t *sec, *llm;
    ASSERT_OK(kvc_cache_open(c, "secret", &l, &sec));
    ASSERT(kvc_cache_id(sec) != a->victim_cache[0]);
    kvc_seq_info_t si;
    ASSERT_ERR(kvc_seq_info(sec, V_SEQ, &si), KVC_E_NOSEQ);
    ASSERT_OK(kvc_cache_open(c, "llm", &l, &llm));
    /* by id, every route */
    attack_by_id(a->d, a->victim_cache[0]);
    attack_by_id(a->d, a->victim_cache[1]);
    /* listings and stats show only its own tenant */
    kvc_cache_info_t infos[8];
    size_t n = 0;
    ASSERT_OK(kvc_cache_list(c, infos, 8, &n));
    ASSERT_EQ(n, 2);
    for (size_t i = 0; i < n; i++) {
      ASSERT_STR_EQ(infos[i].tenant, "uid:64002");
      ASSERT(infos[i].cache_id != a->victim_cache[0] && infos[i].cache_id != a->victim_cache[1]);
    }
    kvc_stat_t *st;
    ASSERT_OK(kvc_stats(c, &st, &n));
    size_t rows = 0;
    for (size_t i = 0; i < n; i++)
      if (st[i].cache[0]) {
        const char *t = kvc_stat_label(&st[i], "tenant");
        ASSERT(t != NULL);
        ASSERT_STR_EQ(t, "uid:64002");
        rows++;
      }
    ASSERT(rows > 0); /* its own caches' rows are there */
    kvc_stats_free(st);
    kvc_tenant_info_t *t;
    ASSERT_OK(kvc_tenants(c, &t, &n));
    ASSERT_EQ(n, 1);
    ASSERT_STR_EQ(t[0].name, "uid:64002");
    kvc_tenants_free(t);
    /* the victim's prompt does not match here; a poisoned one stays here */
    uint32_t ids[V_TOKENS];
    prompt_ids(ids);
    kvc_match_t m;
    ASSERT_OK(kvc_match(llm, ids, V_TOKENS, &m));
    ASSERT_U64_EQ(m.tokens, 0);
    victim_put(llm, 9, 0xbadbadull, ids); /* the poison: same ids, other bytes */
    ASSERT_OK(kvc_match(llm, ids, V_TOKENS, &m));
    ASSERT_U64_EQ(m.tokens, V_TOKENS);
    /* no zero-copy mapping: the pool holds other tenants' pages */
    kvc_lease_t *lease;
    ASSERT_ERR(kvc_lease(llm, 9, 0, 16, &lease), KVC_E_PERM);
    /* what to do instead, for C and Python callers alike (it said kvc_get) */
    ASSERT(strstr(kvc_client_last_error(c), "(C: kvc_get, Python: cache.get)") != NULL);
    kvc_cache_close(sec);
    kvc_cache_close(llm);
  } else {
    /* the victim's pages are free now: take every page of the pool with our
     * own writes, and read them all back */
    kvc_cache_t *h;
    ASSERT_OK(kvc_cache_open(c, "filler", &l, &h));
    size_t nk = it_tok_floats(&l, false) * 16, nv = it_tok_floats(&l, true) * 16;
    float *k = calloc(nk, 4), *v = calloc(nv, 4);
    ASSERT(k && v);
    for (uint64_t s = 0; s < 600; s++) { /* 512 pool pages: wraps and evicts */
      it_fill_f32(k, v, &l, s, 0, 16, 3);
      ASSERT_OK(kvc_put(h, 100 + s, 0, 16, k, v));
      ASSERT_OK(kvc_get(h, 100 + s, 0, 16, k, v));
    }
    free(k);
    free(v);
    kvc_cache_close(h);
  }
  kvc_client_close(c);
}

/* The admin control: root maps the pool, leases the victim's page and
 * reads it in place, so its memory must show the pattern (the scan works). */
static void admin_reader(void *p) {
  attacker_t *a = p;
  kvc_client_t *c = client_open(a->d);
  kvc_cache_info_t infos[16];
  size_t n;
  ASSERT_OK(kvc_cache_list(c, infos, 16, &n));
  size_t tenants_seen = 0;
  for (size_t i = 0; i < n; i++) tenants_seen += strcmp(infos[i].tenant, "uid:64001") == 0;
  ASSERT(tenants_seen == 2 && n >= 4); /* both tenants' caches, named */
  kvc_tenant_info_t *t;
  ASSERT_OK(kvc_tenants(c, &t, &n));
  ASSERT(n >= 2);
  kvc_tenants_free(t);
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_find(c, "secret", &h)); /* the first "secret": the victim's */
  ASSERT_EQ(kvc_cache_id(h), a->victim_cache[0]);
  kvc_lease_t *lease;
  ASSERT_OK(kvc_lease(h, V_SEQ, 0, 16, &lease));
  volatile float sink = 0;
  const float *kp = kvc_lease_k(lease, 0, 0);
  ASSERT(kp != NULL);
  for (int i = 0; i < 64; i++) sink += kp[i];
  (void)sink;
  /* the dump follows while the lease holds the page in the mapping */
  kvc_cache_close(h);
  /* lease and client stay open: the dump reads the mapping */
}

TEST_TIMEOUT(tenants_second_tenant_sees_and_changes_nothing_of_the_first, 120) {
  if (geteuid() != 0) TEST_SKIP("needs root to take other uids");
  daemon_t d;
  start_shared(&d, NULL);
  int up[2], down[2];
  ASSERT_EQ(pipe(up), 0);
  ASSERT_EQ(pipe(down), 0);
  uint64_t nonce;
  ASSERT(getrandom(&nonce, sizeof nonce, 0) == sizeof nonce);
  victim_t v = {&d, up[1], down[0], nonce};
  fflush(NULL);
  pid_t vp = fork();
  ASSERT(vp >= 0);
  if (vp == 0) {
    close(up[0]); /* a dead parent must read as EOF here, never hang */
    close(down[1]);
    drop_to(UID_A);
    victim_main(&v);
    _exit(0);
  }
  close(up[1]);
  close(down[0]);
  uint32_t ids[2];
  ASSERT(read(up[0], ids, sizeof ids) == sizeof ids); /* the victim's data is live */
  attacker_t a = {&d, {ids[0], ids[1]}, false};
  ASSERT(!dump_has_pattern(UID_B, attacker_main, &a, nonce));
  ASSERT(dump_has_pattern(0, admin_reader, &a, nonce)); /* the scan does find it */
  ASSERT(write(down[1], "g", 1) == 1);
  char done;
  ASSERT(read(up[0], &done, 1) == 1); /* checked, then removed: pages free */
  a.after_remove = true;
  ASSERT(!dump_has_pattern(UID_B, attacker_main, &a, nonce));
  ASSERT(write(down[1], "g", 1) == 1);
  int st;
  ASSERT(waitpid(vp, &st, 0) == vp);
  ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  daemon_stop(&d);
}

/* ---- shared caches, grouped tenants, a single-tenant node ------------------------ */

typedef struct step {
  const daemon_t *d;
  int what;
} step_t;

static void shared_step(void *p) {
  step_t *s = p;
  kvc_client_t *c = client_open(s->d);
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_open(c, "sys", &l, &h));
  size_t nk = it_tok_floats(&l, false) * 16, nv = it_tok_floats(&l, true) * 16;
  float *k = calloc(nk, 4), *v = calloc(nv, 4), *gk = calloc(nk, 4), *gv = calloc(nv, 4);
  ASSERT(k && v && gk && gv);
  it_fill_f32(k, v, &l, 1, 0, 16, 1);
  if (s->what == 0) { /* the writer */
    ASSERT_OK(kvc_put(h, 1, 0, 16, k, v));
  } else if (s->what == 1) { /* a reader: reads, may not write or clear */
    ASSERT_OK(kvc_get(h, 1, 0, 16, gk, gv));
    ASSERT(memcmp(gk, k, nk * 4) == 0 && memcmp(gv, v, nv * 4) == 0);
    ASSERT_ERR(kvc_put(h, 2, 0, 16, k, v), KVC_E_PERM);
    ASSERT_ERR(kvc_seq_remove(h, 1, 0, UINT64_MAX), KVC_E_PERM);
    ASSERT_ERR(kvc_cache_clear(h), KVC_E_PERM);
    kvc_cache_info_t infos[4];
    size_t n;
    ASSERT_OK(kvc_cache_list(c, infos, 4, &n));
    ASSERT_EQ(n, 1);
    ASSERT_STR_EQ(infos[0].tenant, "shared");
  } else { /* no grant: its own "sys", empty */
    kvc_seq_info_t si;
    ASSERT_ERR(kvc_seq_info(h, 1, &si), KVC_E_NOSEQ);
  }
  free(k), free(v), free(gk), free(gv);
  kvc_cache_close(h);
  kvc_client_close(c);
}

TEST(tenants_shared_cache_has_exactly_the_rights_the_config_grants) {
  if (geteuid() != 0) TEST_SKIP("needs root to take other uids");
  daemon_t d;
  const char *more[] = {"--shared-caches", "sys=uid:64001:rw,uid:64002:r", NULL};
  start_shared(&d, more);
  step_t s = {&d, 0};
  ASSERT_EQ(as_uid(UID_A, shared_step, &s), 0);
  s.what = 1;
  ASSERT_EQ(as_uid(UID_B, shared_step, &s), 0);
  s.what = 2;
  ASSERT_EQ(as_uid(UID_C, shared_step, &s), 0);
  daemon_stop(&d);
}

static void group_step(void *p) {
  step_t *s = p;
  kvc_client_t *c = client_open(s->d);
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_open(c, "fleet-cache", &l, &h));
  uint32_t ids[V_TOKENS];
  prompt_ids(ids);
  kvc_match_t m;
  if (s->what == 0) {
    victim_put(h, 1, 42, ids);
  } else {
    ASSERT_OK(kvc_match(h, ids, V_TOKENS, &m)); /* one tenant: its prompt is ours */
    ASSERT_U64_EQ(m.tokens, s->what == 1 ? V_TOKENS : 0);
    if (s->what == 1) victim_check(h, 1, 42);
    kvc_tenant_info_t *t;
    size_t n;
    ASSERT_OK(kvc_tenants(c, &t, &n));
    ASSERT_EQ(n, 1);
    ASSERT_STR_EQ(t[0].name, s->what == 1 ? "fleet" : "uid:64003");
    kvc_tenants_free(t);
  }
  kvc_cache_close(h);
  kvc_client_close(c);
}

TEST(tenants_grouped_uids_share_one_namespace_others_do_not) {
  if (geteuid() != 0) TEST_SKIP("needs root to take other uids");
  daemon_t d;
  const char *more[] = {"--tenants", "fleet=uid:64001,uid:64002", NULL};
  start_shared(&d, more);
  step_t s = {&d, 0};
  ASSERT_EQ(as_uid(UID_A, group_step, &s), 0);
  s.what = 1;
  ASSERT_EQ(as_uid(UID_B, group_step, &s), 0);
  s.what = 2;
  ASSERT_EQ(as_uid(UID_C, group_step, &s), 0);
  daemon_stop(&d);
}

/* ---- stats: a tenant's own caches, by name and by pages held ----------------- */

/* Opens name and puts pages * 16 tokens (page_tokens 16) as sequence 1. */
static void stats_cache(kvc_client_t *c, const char *name, uint64_t pages) {
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_open(c, name, &l, &h));
  uint64_t n = pages * 16;
  float *k = calloc(n * it_tok_floats(&l, false), sizeof *k);
  float *v = calloc(n * it_tok_floats(&l, true), sizeof *v);
  ASSERT(k && v);
  if (n) ASSERT_OK(kvc_put(h, 1, 0, n, k, v));
  free(k);
  free(v);
  kvc_cache_close(h);
}

/* The caches of a reply, in its order: "name@tenant:pages" joined by
 * spaces; and that their pages never grow from one to the next. */
static void stats_caches(kvc_client_t *c, const kvc_stats_opts_t *q, char *out, size_t len) {
  kvc_stat_t *st;
  size_t n;
  ASSERT_OK(kvc_stats_query(c, q, &st, &n));
  size_t used = 0;
  uint64_t prev = UINT64_MAX;
  out[0] = '\0';
  for (size_t i = 0; i < n; i++) {
    if (strcmp(st[i].name, "cache_pages") != 0) continue;
    const char *t = kvc_stat_label(&st[i], "tenant");
    ASSERT(t != NULL);
    ASSERT(st[i].value <= prev);
    prev = st[i].value;
    int w = snprintf(out + used, len - used, "%s%s@%s:%" PRIu64, used ? " " : "", st[i].cache, t,
                     st[i].value);
    ASSERT(w > 0 && (size_t)w < len - used);
    used += (size_t)w;
  }
  /* The node's figures whatever was asked: node-wide. */
  bool node = false;
  for (size_t i = 0; i < n; i++) node |= strcmp(st[i].name, "pages_used") == 0 && !st[i].cache[0];
  ASSERT(node);
  kvc_stats_free(st);
}

static void stats_step(void *p) {
  step_t *s = p;
  kvc_client_t *c = client_open(s->d);
  char got[512];
  const kvc_stats_opts_t top = {.top = 1000}, big = {.cache = "big"}, sys = {.cache = "sys"},
                         same = {.cache = "same"};
  kvc_stat_t *st;
  size_t n;
  switch (s->what) {
  case 0: /* A: its caches, the shared one (rw), a name C uses too (no two
           caches of a reply hold as many pages: ties have no set order) */
    stats_cache(c, "big", 6);
    stats_cache(c, "a1", 5);
    stats_cache(c, "sys", 4);
    stats_cache(c, "same", 2);
    stats_caches(c, &top, got, sizeof got);
    ASSERT_STR_EQ(got, "big@uid:64001:6 a1@uid:64001:5 sys@shared:4 same@uid:64001:2");
    stats_caches(c, NULL, got, sizeof got); /* the default top: all four */
    ASSERT_STR_EQ(got, "big@uid:64001:6 a1@uid:64001:5 sys@shared:4 same@uid:64001:2");
    stats_caches(c, &(kvc_stats_opts_t){.top = 2}, got, sizeof got);
    ASSERT_STR_EQ(got, "big@uid:64001:6 a1@uid:64001:5");
    break;
  case 1: /* B: reads the shared cache, sees none of A's own */
    stats_cache(c, "b1", 3);
    stats_caches(c, &top, got, sizeof got);
    ASSERT_STR_EQ(got, "sys@shared:4 b1@uid:64002:3");
    stats_caches(c, &sys, got, sizeof got);
    ASSERT_STR_EQ(got, "sys@shared:4");
    ASSERT_ERR(kvc_stats_query(c, &big, &st, &n), KVC_E_NOCACHE);
    ASSERT(st == NULL && n == 0);
    break;
  case 2: /* C: no right on the shared cache; its own "same" only */
    stats_cache(c, "same", 1);
    stats_cache(c, "c0", 0);
    stats_caches(c, &top, got, sizeof got);
    ASSERT_STR_EQ(got, "same@uid:64003:1 c0@uid:64003:0");
    stats_caches(c, &same, got, sizeof got);
    ASSERT_STR_EQ(got, "same@uid:64003:1");
    ASSERT_ERR(kvc_stats_query(c, &big, &st, &n), KVC_E_NOCACHE);
    ASSERT_ERR(kvc_stats_query(c, &sys, &st, &n), KVC_E_NOCACHE);
    stats_caches(c, &(kvc_stats_opts_t){.node_only = true}, got, sizeof got);
    ASSERT_STR_EQ(got, "");
    break;
  default: /* root, an admin: every tenant's, merged by pages */
    stats_caches(c, &top, got, sizeof got);
    ASSERT_STR_EQ(got, "big@uid:64001:6 a1@uid:64001:5 sys@shared:4 b1@uid:64002:3 "
                       "same@uid:64001:2 same@uid:64003:1 c0@uid:64003:0");
    stats_caches(c, &same, got, sizeof got);
    ASSERT_STR_EQ(got, "same@uid:64001:2 same@uid:64003:1");
    stats_caches(c, &(kvc_stats_opts_t){.top = 3}, got, sizeof got);
    ASSERT_STR_EQ(got, "big@uid:64001:6 a1@uid:64001:5 sys@shared:4");
    break;
  }
  kvc_client_close(c);
}

/* A Stats reply shows a tenant its own caches and the shared ones it may
 * read, by name or the top by pages held, never another tenant's (an
 * admin: every tenant's, merged); the node's figures to everyone. */
TEST(tenants_stats_show_a_tenant_only_the_caches_it_may_see) {
  if (geteuid() != 0) TEST_SKIP("needs root to take other uids");
  daemon_t d;
  const char *more[] = {"--shared-caches", "sys=uid:64001:rw,uid:64002:r", NULL};
  start_shared(&d, more);
  step_t s = {&d, 0};
  for (s.what = 0; s.what < 3; s.what++)
    ASSERT_EQ(as_uid(s.what == 0 ? UID_A : s.what == 1 ? UID_B : UID_C, stats_step, &s), 0);
  ASSERT_EQ(as_uid(0, stats_step, &s), 0); /* what 3: root */
  daemon_stop(&d);
}

static void single_step(void *p) {
  step_t *s = p;
  kvc_client_t *c = client_open(s->d);
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *h;
  if (s->what == 0) { /* the node's tenant: zero-copy reads */
    ASSERT_OK(kvc_cache_open(c, "mine", &l, &h));
    victim_put(h, 1, 7, NULL);
    kvc_lease_t *lease;
    ASSERT_OK(kvc_lease(h, 1, 0, 16, &lease));
    ASSERT(kvc_lease_k(lease, 0, 0) != NULL);
    ASSERT_OK(kvc_lease_release(lease));
    kvc_cache_close(h);
  } else {
    ASSERT_ERR(kvc_cache_open(c, "mine", &l, &h), KVC_E_PERM);
  }
  kvc_client_close(c);
}

TEST(tenants_single_tenant_node_maps_the_pool_for_its_tenant_only) {
  if (geteuid() != 0) TEST_SKIP("needs root to take other uids");
  daemon_t d;
  const char *more[] = {"--zero-copy-tenant", "uid:64001", NULL};
  start_shared(&d, more);
  step_t s = {&d, 0};
  ASSERT_EQ(as_uid(UID_A, single_step, &s), 0);
  s.what = 1;
  ASSERT_EQ(as_uid(UID_B, single_step, &s), 0);
  daemon_stop(&d);
}

/* ---- the socket, the peer, the logs ----------------------------------------------- */

TEST(tenants_socket_directory_must_be_ours_and_not_writable_by_others) {
  char dir[64], sock[128], out[1024];
  snprintf(dir, sizeof dir, "/tmp/kvcit-XXXXXX");
  ASSERT(mkdtemp(dir) != NULL);
  snprintf(sock, sizeof sock, "%s/s/kvcached.sock", dir);
  char sub[96];
  snprintf(sub, sizeof sub, "%s/s", dir);
  ASSERT_EQ(mkdir(sub, 0777), 0);
  ASSERT_EQ(chmod(sub, 0777), 0); /* anyone could plant a socket here */
  int rc = it_sh(out, sizeof out, "%s/kvcached --socket %s --pool-bytes 8MiB --page-bytes 16KiB 2>&1",
                 it_build(), sock);
  ASSERT(rc != 0);
  ASSERT(strstr(out, "is writable by others") != NULL);
  ASSERT_EQ(chmod(sub, 0755), 0);
  ASSERT_EQ(chown(sub, UID_B, UID_B), 0); /* another user's directory */
  rc = it_sh(out, sizeof out, "%s/kvcached --socket %s --pool-bytes 8MiB --page-bytes 16KiB 2>&1",
             it_build(), sock);
  ASSERT(rc != 0);
  ASSERT(strstr(out, "is another user's (owned by uid 64002") != NULL);
  ASSERT_EQ(it_sh(out, sizeof out, "rm -rf '%s'", dir), 0);
}

typedef struct impostor {
  const char *sock;
  int ready;
} impostor_t;

static void impostor_serve(void *p) {
  impostor_t *im = p;
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", im->sock);
  if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, 4) != 0) _exit(92);
  chmod(im->sock, 0666);
  if (write(im->ready, "r", 1) != 1) _exit(93);
  for (int i = 0; i < 2; i++) { /* two clients, then gone */
    int c = accept(fd, NULL, NULL);
    if (c < 0) _exit(94);
    char buf[64];
    (void)!read(c, buf, sizeof buf); /* what a client sends, if anything */
    close(c);
  }
  _exit(0);
}

static void impostor_client(void *p) {
  impostor_t *im = p;
  kvc_client_opts_t o = {.socket_path = im->sock, .timeout_ms = 5000};
  kvc_client_t *c = NULL;
  ASSERT_ERR(kvc_client_open(&o, &c), KVC_E_PEER);
  ASSERT(strstr(kvc_client_open_error(), "uid 64005") != NULL);
  o.server_uid = UID_X; /* named: trusted, then the fake fails the handshake */
  int rc = kvc_client_open(&o, &c);
  ASSERT(rc != 0 && rc != KVC_E_PEER);
}

TEST(tenants_client_refuses_a_server_of_an_unexpected_uid) {
  if (geteuid() != 0) TEST_SKIP("needs root to take other uids");
  char dir[64], sock[128];
  snprintf(dir, sizeof dir, "/tmp/kvcit-XXXXXX");
  ASSERT(mkdtemp(dir) != NULL);
  ASSERT_EQ(chmod(dir, 0777), 0);
  snprintf(sock, sizeof sock, "%s/kvcached.sock", dir);
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  impostor_t im = {sock, ready[1]};
  fflush(NULL);
  pid_t srv = fork();
  ASSERT(srv >= 0);
  if (srv == 0) {
    close(ready[0]);
    drop_to(UID_X);
    impostor_serve(&im);
  }
  close(ready[1]);
  char r;
  ASSERT(read(ready[0], &r, 1) == 1);
  ASSERT_EQ(as_uid(UID_A, impostor_client, &im), 0);
  int st;
  ASSERT(waitpid(srv, &st, 0) == srv);
  ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  char out[128];
  ASSERT_EQ(it_sh(out, sizeof out, "rm -rf '%s'", dir), 0);
}

TEST(tenants_client_names_cannot_forge_log_lines) {
  daemon_t d;
  daemon_start(&d);
  kvc_client_opts_t o = {.socket_path = d.sock, .timeout_ms = 5000,
                         .client_name = "x\" level=error event=forged\nlevel=error event=forged"};
  kvc_client_t *c;
  ASSERT_OK(kvc_client_open(&o, &c));
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_open(c, "c", &l, &h));
  kvc_cache_close(h);
  kvc_client_close(c);
  /* the connect line logs the name: wait for it, then look for a forged line */
  ASSERT(it_log_wait(&d, "x\\x22 level=error event=forged\\x0alevel=error", 5000));
  FILE *f = fopen(d.log, "r");
  ASSERT(f != NULL);
  char line[1024];
  while (fgets(line, sizeof line, f)) ASSERT(strncmp(line, "level=error event=forged", 24) != 0);
  fclose(f);
  daemon_stop(&d);
}
