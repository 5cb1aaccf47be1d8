/* arenas.c: the pool as segments owned by arenas, seen from outside with
 * real other uids (doc/security.md, "The pool's memory"): a worker that is
 * no admin reads its pages in place; no mapping a client holds ever shows
 * another tenant's bytes, after those were removed, evicted and their
 * segments given to another tenant; a client that keeps a revoked segment
 * mapped is charged for it until it maps the pool again; a 5 MiB-page
 * cache lives beside a 256 KiB one with no padding but segment tails.
 * Children drop to unused uids (setgroups/setresgid/setresuid). */
#include <grp.h>

#include "harness.h"

#define UID_A 64101u
#define UID_B 64102u
#define MAGIC 0x5eb3a1d0u /* tenant B's bytes: a word no float of A's makes */

static void drop_to(uid_t uid) {
  if (setgroups(0, NULL) != 0 || setresgid(uid, uid, uid) != 0 || setresuid(uid, uid, uid) != 0)
    _exit(90);
  prctl(PR_SET_DUMPABLE, 1, 0, 0, 0);
}

/* A daemon of arenas (no page_bytes) other uids can reach. */
static void start_arenas(daemon_t *d, const char *pool, const char *seg, const char *extra) {
  const char *args[16] = {"--page-bytes", "0", "--pool-bytes", pool, "--segment-bytes", seg,
                          "--allow-uids", "self,root,64101,64102", "--socket-mode", "0666"};
  int n = 10;
  if (extra) {
    args[n++] = "--shm-bytes-per-uid";
    args[n++] = extra;
    args[n++] = "--shm-max-bytes";
    args[n++] = "4MiB";
  }
  args[n] = NULL;
  daemon_start_args(d, args);
  ASSERT_EQ(chmod(d->dir, 0755), 0);
}

/* A layout of 128 KiB pages: 16 tokens x 4 layers x 4 heads x (64 + 64) f32. */
static kvc_layout_t lay128k(void) {
  kvc_layout_t l = {.num_layers = 4, .num_kv_heads = 4, .head_dim_k = 64, .head_dim_v = 64,
                    .dtype = KVC_DTYPE_F32, .page_tokens = 16};
  return l;
}

#define TOK 256 /* tokens a sequence: 16 pages, 2 MiB */

static size_t seq_floats(const kvc_layout_t *l) { return it_tok_floats(l, false) * TOK; }

/* Puts sequence s of n tokens filled with word w (K and V). */
static int put_words(kvc_cache_t *h, const kvc_layout_t *l, uint64_t s, uint32_t w) {
  size_t n = seq_floats(l);
  uint32_t *k = malloc(n * 4), *v = malloc(n * 4);
  if (!k || !v) _exit(91);
  for (size_t i = 0; i < n; i++) k[i] = v[i] = w;
  int rc = kvc_put(h, s, 0, TOK, k, v);
  free(k), free(v);
  return rc;
}

/* Every byte this process maps of the pool (its /proc/self/maps lines of
 * the pool's memfd): the count of 4-byte words equal to w. */
static uint64_t scan_pool_maps(uint32_t w, uint64_t *mapped) {
  FILE *f = fopen("/proc/self/maps", "r");
  if (!f) _exit(92);
  char line[512];
  uint64_t hits = 0;
  *mapped = 0;
  while (fgets(line, sizeof line, f)) {
    if (!strstr(line, "kvcached-pool")) continue;
    unsigned long lo, hi;
    char perms[8];
    if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) != 3 || perms[0] != 'r') continue;
    *mapped += hi - lo;
    for (const uint32_t *p = (const uint32_t *)lo; p < (const uint32_t *)hi; p++) hits += *p == w;
  }
  fclose(f);
  return hits;
}

typedef struct arg {
  const daemon_t *d;
  int ready, go; /* pipes: the child says ready, the parent says go */
} arg_t;

static kvc_client_t *open_as(const daemon_t *d, uint64_t shm) {
  kvc_client_opts_t o = {.socket_path = d->sock, .shm_bytes = shm, .timeout_ms = 20000,
                         .client_name = "arenas"};
  kvc_client_t *c = NULL;
  if (kvc_client_open(&o, &c) != 0) _exit(93);
  return c;
}

/* ---- a worker that is no admin reads in place ------------------------------ */

static int worker_leases(const daemon_t *d) {
  kvc_client_t *c = open_as(d, 0);
  kvc_layout_t l = lay128k();
  kvc_cache_t *h;
  if (kvc_cache_open(c, "worker", &l, &h)) return 10;
  size_t n = seq_floats(&l);
  float *k = malloc(n * 4), *v = malloc(n * 4), *gk = malloc(n * 4), *gv = malloc(n * 4);
  it_fill_f32(k, v, &l, 7, 0, TOK, 3);
  if (kvc_put(h, 7, 0, TOK, k, v)) return 11;
  kvc_lease_t *ls;
  int rc = kvc_lease(h, 7, 0, TOK, &ls);
  if (rc) {
    fprintf(stderr, "lease: %s: %s\n", kvc_err_name(rc), kvc_client_last_error(c));
    return 12;
  }
  const kvc_lease_info_t *li = kvc_lease_info(ls);
  if (li->npages != TOK / 16) return 13;
  /* Layer 0 of each page: K rows of its 16 tokens, every head. */
  for (uint32_t p = 0; p < li->npages; p++) {
    const float *pk = li->pages[p];
    for (uint32_t t = 0; t < 16; t++)
      for (size_t e = 0; e < li->k_row_bytes / 4; e++)
        if (pk[t * li->k_row_bytes / 4 + e] != k[((size_t)(p * 16 + t)) * li->k_row_bytes / 4 + e])
          return 14;
  }
  /* The arena as one array: each page again at its block-table index. */
  if (!li->arena_base || li->page_stride != 128 * 1024 || !li->block_table) return 17;
  for (uint32_t p = 0; p < li->npages; p++) {
    if (li->block_table[p] < 0 || (uint64_t)li->block_table[p] >= li->arena_pages) return 18;
    const char *a = (const char *)li->arena_base + (uint64_t)li->block_table[p] * li->page_stride;
    if (memcmp(a, li->pages[p], 128 * 1024) != 0) return 19;
    for (uint32_t q = 0; q < p; q++)
      if (li->block_table[q] == li->block_table[p]) return 20;
  }
  if (kvc_lease_release(ls)) return 15;
  if (kvc_get(h, 7, 0, TOK, gk, gv) || memcmp(gk, k, n * 4) || memcmp(gv, v, n * 4)) return 16;
  free(k), free(v), free(gk), free(gv);
  kvc_client_close(c);
  return 0;
}

TEST(arenas_a_worker_that_is_no_admin_reads_in_place) {
  daemon_t d;
  start_arenas(&d, "32MiB", "2MiB", NULL);
  fflush(NULL);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    drop_to(UID_A);
    _exit(worker_leases(&d));
  }
  int st;
  ASSERT(waitpid(pid, &st, 0) == pid);
  if (!WIFEXITED(st) || WEXITSTATUS(st)) it_dump_log(&d);
  ASSERT(WIFEXITED(st));
  ASSERT_EQ(WEXITSTATUS(st), 0);
  daemon_stop(&d);
}

/* ---- no mapping shows another tenant's bytes ---------------------------------- */

/* Tenant B: fills half the pool with MAGIC, leases (so its client maps its
 * segments), removes half its sequences (the rest stays, to be evicted),
 * says ready, waits, then checks its own mappings show nothing of A's
 * (A writes no MAGIC: trivially none) and exits. */
static int tenant_b(arg_t *a) {
  kvc_client_t *c = open_as(a->d, 0);
  kvc_layout_t l = lay128k();
  kvc_cache_t *h;
  if (kvc_cache_open(c, "b", &l, &h)) return 20;
  for (uint64_t s = 1; s <= 12; s++) /* 24 MiB of 32 */
    if (put_words(h, &l, s, MAGIC)) return 21;
  kvc_lease_t *ls;
  if (kvc_lease(h, 1, 0, TOK, &ls) || kvc_lease_release(ls)) return 22;
  uint64_t mapped, hits = scan_pool_maps(MAGIC, &mapped);
  if (!mapped || !hits) return 23; /* it sees its own bytes in place */
  for (uint64_t s = 1; s <= 7; s++)
    if (kvc_seq_remove(h, s, 0, UINT64_MAX)) return 24;
  kvc_client_close(c);
  char x = 1;
  if (write(a->ready, &x, 1) != 1 || read(a->go, &x, 1) != 1) return 25;
  return 0;
}

/* Tenant A: fills its share of the pool (B's removed pages' segments, then
 * B's evicted ones, pass to A) with sequences of half a page each, so half
 * of every page A holds is never written by A: whatever was there before
 * stays in its memory. It leases every sequence (its client maps every
 * segment it may read) and scans every byte of its mappings. */
#define HALF 8
static int tenant_a(arg_t *a) {
  kvc_client_t *c = open_as(a->d, 0);
  kvc_layout_t l = lay128k();
  kvc_cache_t *h;
  if (kvc_cache_open(c, "a", &l, &h)) return 30;
  size_t n = it_tok_floats(&l, false) * HALF;
  float *k = malloc(n * 4), *v = malloc(n * 4);
  for (uint64_t s = 1; s <= 256; s++) { /* more than the pool: B's data is evicted */
    it_fill_f32(k, v, &l, s, 0, HALF, 1);
    if (kvc_put(h, s, 0, HALF, k, v)) return 31;
  }
  uint64_t leased = 0;
  for (uint64_t s = 1; s <= 256; s++) {
    kvc_lease_t *ls;
    if (kvc_lease(h, s, 0, HALF, &ls) == 0) {
      leased++;
      if (kvc_lease_release(ls)) return 32;
    }
  }
  if (leased < 160) return 33; /* its share (75%) of the pool is A's now: 192 pages */
  uint64_t mapped, hits = scan_pool_maps(MAGIC, &mapped);
  fprintf(stderr, "tenant A maps %llu bytes of the pool, %llu words of B's\n",
          (unsigned long long)mapped, (unsigned long long)hits);
  if (mapped < 20ull << 20) return 34;
  if (hits) return 35;
  free(k), free(v);
  kvc_client_close(c);
  return 0;
}

static int run_b(void *p) { return tenant_b(p); }

TEST(arenas_no_mapping_shows_another_tenants_bytes) {
  daemon_t d;
  start_arenas(&d, "32MiB", "2MiB", NULL);
  int rp[2], gp[2];
  ASSERT_EQ(pipe(rp), 0);
  ASSERT_EQ(pipe(gp), 0);
  arg_t a = {&d, rp[1], gp[0]};
  fflush(NULL);
  pid_t b = fork();
  ASSERT(b >= 0);
  if (b == 0) {
    drop_to(UID_B);
    _exit(run_b(&a));
  }
  char x;
  ASSERT_EQ(read(rp[0], &x, 1), 1); /* B is done writing */
  pid_t pa = fork();
  ASSERT(pa >= 0);
  if (pa == 0) {
    drop_to(UID_A);
    _exit(tenant_a(&a));
  }
  int st;
  ASSERT(waitpid(pa, &st, 0) == pa);
  int sa = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
  if (getenv("KVC_DBG")) {
    static char out[65536];
    ctl_run(&d, out, sizeof out, true, "tenants");
    fprintf(stderr, "%s\n", out);
    ctl_run(&d, out, sizeof out, true, "stats --json");
    fprintf(stderr, "%s\n", out);
  }
  ASSERT_EQ(write(gp[1], &x, 1), 1);
  ASSERT(waitpid(b, &st, 0) == b);
  int sb = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
  if (sa || sb) it_dump_log(&d);
  ASSERT_EQ(sb, 0);
  ASSERT_EQ(sa, 0);
  kvc_client_t *c = client_open(&d);
  ASSERT(stat_get(c, "pool_segment_refreshes_total", NULL) > 0); /* B's memory never became A's */
  ASSERT(stat_get(c, "segment_moves_total", NULL) > 0);
  kvc_client_close(c);
  daemon_stop(&d);
}

/* ---- a revoked segment is charged until the client maps the pool again ----- */

static int tenant_b_keeps(arg_t *a) {
  kvc_client_t *c = open_as(a->d, 1 << 20);
  kvc_layout_t l = lay128k();
  kvc_cache_t *h;
  if (kvc_cache_open(c, "b", &l, &h)) return 40;
  for (uint64_t s = 1; s <= 2; s++) /* 4 MiB: two segments */
    if (put_words(h, &l, s, MAGIC)) return 41;
  kvc_lease_t *ls;
  if (kvc_lease(h, 1, 0, TOK, &ls) || kvc_lease_release(ls)) return 42; /* maps its segments */
  for (uint64_t s = 1; s <= 2; s++)
    if (kvc_seq_remove(h, s, 0, UINT64_MAX)) return 43;
  char x = 1;
  if (write(a->ready, &x, 1) != 1 || read(a->go, &x, 1) != 1) return 44;
  /* Its segments went to A with fresh memory; this client still maps the
   * old: 4 MiB charged to uid B. A second connection's 2 MiB buffer would
   * pass the 6 MiB quota now. */
  kvc_client_opts_t o = {.socket_path = a->d->sock, .shm_bytes = 2 << 20, .timeout_ms = 20000};
  kvc_client_t *c2 = NULL;
  int rc = kvc_client_open(&o, &c2);
  if (rc != KVC_E_QUOTA_SHM || !strstr(kvc_client_open_error(), "revoked")) {
    fprintf(stderr, "second connection: %s: %s\n", kvc_err_name(rc), kvc_client_open_error());
    return 45;
  }
  /* Mapping the pool again (a lease maps what it may read now) ends it. */
  if (put_words(h, &l, 9, MAGIC) || kvc_lease(h, 9, 0, TOK, &ls) || kvc_lease_release(ls))
    return 46;
  if ((rc = kvc_client_open(&o, &c2)) != 0) {
    fprintf(stderr, "after remapping: %s: %s\n", kvc_err_name(rc), kvc_client_open_error());
    return 47;
  }
  kvc_client_close(c2);
  kvc_client_close(c);
  return 0;
}

TEST(arenas_a_revoked_segment_is_charged_until_mapped_again) {
  daemon_t d;
  start_arenas(&d, "16MiB", "2MiB", "6MiB");
  int rp[2], gp[2];
  ASSERT_EQ(pipe(rp), 0);
  ASSERT_EQ(pipe(gp), 0);
  arg_t a = {&d, rp[1], gp[0]};
  fflush(NULL);
  pid_t b = fork();
  ASSERT(b >= 0);
  if (b == 0) {
    drop_to(UID_B);
    _exit(tenant_b_keeps(&a));
  }
  char x;
  ASSERT_EQ(read(rp[0], &x, 1), 1);
  /* Root's tenant fills the pool: B's empty segments pass to it. */
  kvc_client_t *c = client_open(&d);
  kvc_layout_t l = lay128k();
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_open(c, "root", &l, &h));
  for (uint64_t s = 1; s <= 8; s++) ASSERT_OK(put_words(h, &l, s, 7)); /* the whole pool */
  ASSERT(stat_get(c, "pool_revoked_bytes", NULL) >= (2u << 20));
  ASSERT_EQ(write(gp[1], &x, 1), 1);
  int st;
  ASSERT(waitpid(b, &st, 0) == b);
  if (!WIFEXITED(st) || WEXITSTATUS(st)) it_dump_log(&d);
  ASSERT(WIFEXITED(st));
  ASSERT_EQ(WEXITSTATUS(st), 0);
  ASSERT_U64_EQ(it_wait_stat(c, "pool_revoked_bytes", 0, false), 0); /* B closed: nothing held */
  kvc_client_close(c);
  daemon_stop(&d);
}

/* ---- a 5 MiB page beside a 256 KiB one ------------------------------------ */

TEST(arenas_a_70b_page_beside_a_draft_page) {
  daemon_t d;
  start_arenas(&d, "256MiB", "0", NULL); /* 32 MiB segments */
  kvc_client_t *c = client_open_shm(&d, 32 << 20);
  kvc_layout_t big = {.num_layers = 80, .num_kv_heads = 8, .head_dim_k = 128, .head_dim_v = 128,
                      .dtype = KVC_DTYPE_F16, .page_tokens = 16}; /* 5 MiB */
  kvc_layout_t small = {.num_layers = 16, .num_kv_heads = 8, .head_dim_k = 64,
                        .head_dim_v = 64, .dtype = KVC_DTYPE_F16, .page_tokens = 8}; /* 256 KiB */
  kvc_cache_t *hb, *hs;
  ASSERT_OK(kvc_cache_open(c, "target", &big, &hb));
  ASSERT_OK(kvc_cache_open(c, "draft", &small, &hs));
  uint64_t kb, vb;
  for (int which = 0; which < 2; which++) {
    kvc_cache_t *h = which ? hs : hb;
    uint64_t ntok = which ? 64 : 32;
    ASSERT_OK(kvc_xfer_bytes(h, NULL, true, ntok, &kb, &vb, NULL));
    uint16_t *k = malloc(kb), *v = malloc(vb), *gk = malloc(kb), *gv = malloc(vb);
    for (uint64_t s = 1; s <= 4; s++) {
      for (size_t i = 0; i < kb / 2; i++) k[i] = (uint16_t)(i * 7 + s * 13 + (size_t)which);
      for (size_t i = 0; i < vb / 2; i++) v[i] = (uint16_t)(i * 5 + s * 11 + (size_t)which);
      ASSERT_OK(kvc_put(h, s, 0, ntok, k, v));
      ASSERT_OK(kvc_get(h, s, 0, ntok, gk, gv));
      ASSERT_MEM_EQ(gk, k, kb);
      ASSERT_MEM_EQ(gv, v, vb);
      /* Read in place too (32 MiB segments, a reserve of whole segments). */
      kvc_lease_t *ls;
      ASSERT_OK(kvc_lease(h, s, 0, ntok, &ls));
      const kvc_lease_info_t *li = kvc_lease_info(ls);
      ASSERT(li->npages >= 1 && li->arena_base != NULL);
      ASSERT_MEM_EQ(li->pages[0], gk, li->k_row_bytes); /* layer 0, token 0's K */
      ASSERT_OK(kvc_lease_release(ls));
    }
    free(k), free(v), free(gk), free(gv);
  }
  /* The 5 MiB arena's segments hold 6 pages (30 of 32 MiB): its tails are
   * the only padding; the draft's 256 KiB pages fill theirs. */
  uint64_t segs = stat_get(c, "segments", NULL) - stat_get(c, "segments_free", NULL);
  ASSERT_U64_EQ(segs, 3); /* 8 target pages: 2 segments; 32 draft pages: 1 */
  ASSERT_U64_EQ(stat_get(c, "bytes_padding", NULL), 2 * (2u << 20));
  /* kvcachectl pool: a row an arena, as the figures say. */
  static char out[8192];
  ASSERT_EQ(ctl_run(&d, out, sizeof out, true, "pool"), 0);
  ASSERT(strstr(out, "256.0 MiB in 8 segments of 32.0 MiB, 5 free") != NULL);
  ASSERT(strstr(out, "5.0 MiB") && strstr(out, "256.0 KiB") && strstr(out, "4.0 MiB"));
  ASSERT_EQ(ctl_run(&d, out, sizeof out, true, "pool --json"), 0);
  ASSERT(strstr(out, "\"page_bytes\": 5242880, \"segments\": 2, \"pages_used\": 8, "
                     "\"pages_free\": 4, \"padding_bytes\": 4194304") != NULL);
  ASSERT(strstr(out, "\"page_bytes\": 262144, \"segments\": 1, \"pages_used\": 32, "
                     "\"pages_free\": 96, \"padding_bytes\": 0") != NULL);
  kvc_client_close(c);
  daemon_stop(&d);
}
