/* seqops.c: the sequence and cache operations that move no tensor bytes,
 * through the client library: remove, can_resume, trim_front, list, clear. */
#include <pthread.h>

#include "harness.h"

static void put_tokens(kvc_cache_t *h, uint64_t seq, uint64_t pos, uint64_t n) {
  const kvc_layout_t *l = kvc_cache_layout(h);
  float *k = calloc(it_tok_floats(l, false) * n, 4), *v = calloc(it_tok_floats(l, true) * n, 4);
  it_fill_f32(k, v, l, seq, pos, n, 0);
  ASSERT_OK(kvc_put(h, seq, pos, n, k, v));
  free(k);
  free(v);
}

TEST(seqops_remove_resume_trim_list_clear) {
  daemon_t d;
  daemon_start(&d);
  kvc_client_t *c = client_open(&d);
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_open(c, "ops", &l, &h));
  ASSERT_EQ(kvc_cache_layout(h)->page_tokens, 16);
  ASSERT_STR_EQ(kvc_cache_name(h), "ops");
  put_tokens(h, 1, 0, 50);
  put_tokens(h, 2, 0, 10);

  bool ok = false;
  ASSERT_OK(kvc_seq_can_resume(h, 1, 50, &ok));
  ASSERT(ok);
  ASSERT_OK(kvc_seq_can_resume(h, 1, 51, &ok));
  ASSERT(!ok);
  ASSERT_OK(kvc_seq_can_resume(h, 77, 0, &ok));
  ASSERT(ok);

  /* Truncate to 40 tokens: the fourth page goes. */
  ASSERT_OK(kvc_seq_remove(h, 1, 40, UINT64_MAX));
  kvc_seq_info_t si;
  ASSERT_OK(kvc_seq_info(h, 1, &si));
  ASSERT_U64_EQ(si.length, 40);
  ASSERT_EQ(si.pages, 3);

  /* Sliding window: drop the first 33 tokens, two whole pages are freed. */
  uint64_t used = stat_get(c, "pages_used", NULL);
  ASSERT_OK(kvc_seq_trim_front(h, 1, 33));
  ASSERT_OK(kvc_seq_info(h, 1, &si));
  ASSERT_U64_EQ(si.start, 33);
  ASSERT_U64_EQ(si.length, 40);
  ASSERT_U64_EQ(stat_get(c, "pages_used", NULL), used - 2);
  ASSERT_OK(kvc_seq_can_resume(h, 1, 40, &ok));
  ASSERT(!ok); /* the causal prefix is gone */
  float buf[4096];
  ASSERT_ERR(kvc_get(h, 1, 0, 1, buf, buf), KVC_E_RANGE);
  ASSERT_OK(kvc_get(h, 1, 33, 34, buf, buf));

  /* Remove everything of seq 2: it is dropped. */
  ASSERT_OK(kvc_seq_remove(h, 2, 0, UINT64_MAX));
  ASSERT_ERR(kvc_seq_info(h, 2, &si), KVC_E_NOSEQ);

  /* List and info. */
  kvc_cache_info_t infos[4];
  size_t n = 0;
  ASSERT_OK(kvc_cache_list(c, infos, 4, &n));
  ASSERT_EQ(n, 1);
  ASSERT_STR_EQ(infos[0].name, "ops");
  ASSERT_U64_EQ(infos[0].sequences, 1);
  ASSERT_EQ(infos[0].layout.head_dim_k, 32);
  ASSERT_U64_EQ(infos[0].page_bytes, 16384);

  /* Clear drops pinned sequences too; the cache stays. */
  put_tokens(h, 3, 0, 5);
  ASSERT_OK(kvc_seq_pin(h, 3));
  ASSERT_OK(kvc_cache_clear(h));
  ASSERT_ERR(kvc_seq_info(h, 3, &si), KVC_E_NOSEQ);
  ASSERT_U64_EQ(stat_get(c, "sequences", "ops"), 0);
  ASSERT_U64_EQ(stat_get(c, "pages_used", NULL), 0);
  ASSERT_U64_EQ(stat_get(c, "removes_total", NULL), 2);
  ASSERT_U64_EQ(stat_get(c, "trims_total", NULL), 1);
  ASSERT_U64_EQ(stat_get(c, "requests_total{op=can_resume}", NULL), 4);
  put_tokens(h, 4, 0, 1);
  kvc_cache_close(h);
  kvc_client_close(c);
  daemon_stop(&d);
}

/* ---- sequence lifecycle: ids the daemon picks, owned sequences, no replace ---- */

typedef struct creator {
  const daemon_t *d;
  uint64_t ids[400];
  int rc;
} creator_t;

static void *create_ids(void *arg) {
  creator_t *cr = arg;
  kvc_client_t *c = client_open(cr->d);
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *h;
  cr->rc = kvc_cache_open(c, "life", &l, &h);
  for (int i = 0; cr->rc == 0 && i < 4; i++) cr->rc = kvc_seq_create(h, 100, false, cr->ids + 100 * i);
  kvc_client_close(c);
  return NULL;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* Two clients creating sequences at once get 800 different ids, all at or
 * above 2^63, each a live empty sequence a put can start. */
TEST(seq_create_ids_unique_across_clients) {
  daemon_t d;
  daemon_start(&d);
  static creator_t cr[2];
  pthread_t t[2];
  for (int i = 0; i < 2; i++) {
    cr[i] = (creator_t){.d = &d, .rc = -1};
    ASSERT(pthread_create(&t[i], NULL, create_ids, &cr[i]) == 0);
  }
  for (int i = 0; i < 2; i++) ASSERT(pthread_join(t[i], NULL) == 0);
  static uint64_t all[800];
  for (int i = 0; i < 2; i++) {
    ASSERT_OK(cr[i].rc);
    memcpy(all + 400 * i, cr[i].ids, sizeof cr[i].ids);
  }
  qsort(all, 800, sizeof all[0], cmp_u64);
  for (int i = 0; i < 800; i++) {
    ASSERT(all[i] >= (1ull << 63));
    if (i) ASSERT(all[i] != all[i - 1]);
  }
  kvc_client_t *c = client_open(&d);
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_open(c, "life", &l, &h));
  ASSERT_U64_EQ(stat_get(c, "sequences", NULL), 800);
  kvc_seq_info_t si;
  ASSERT_OK(kvc_seq_info(h, all[17], &si));
  ASSERT_U64_EQ(si.length, 0);
  float k[128], v[128];
  it_fill_f32(k, v, &l, 1, 0, 1, 0);
  ASSERT_OK(kvc_put(h, all[17], 0, 1, k, v));
  uint64_t one;
  ASSERT_ERR(kvc_seq_create(h, 0, false, &one), KVC_E_INVAL);
  kvc_client_close(c);
  daemon_stop(&d);
}

/* A client's owned sequences go when its connection closes (a process that
 * exits); its other sequences, and other clients', stay. */
TEST(seq_create_owned_dropped_on_close) {
  daemon_t d;
  daemon_start(&d);
  int p[2];
  ASSERT(pipe(p) == 0);
  fflush(NULL);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    kvc_client_t *c = client_open(&d);
    kvc_layout_t l = it_layout(KVC_DTYPE_F32);
    kvc_cache_t *h;
    uint64_t ids[3];
    float k[128], v[128];
    it_fill_f32(k, v, &l, 1, 0, 1, 0);
    if (kvc_cache_open(c, "life", &l, &h) || kvc_seq_create(h, 2, true, ids) ||
        kvc_seq_create(h, 1, false, ids + 2) || kvc_put(h, ids[0], 0, 1, k, v) ||
        kvc_put(h, ids[2], 0, 1, k, v))
      _exit(1);
    if (write(p[1], ids, sizeof ids) != sizeof ids) _exit(2);
    _exit(0); /* closes the connection */
  }
  close(p[1]);
  uint64_t ids[3];
  ASSERT(read(p[0], ids, sizeof ids) == sizeof ids);
  int st;
  ASSERT(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
  kvc_client_t *c = client_open(&d);
  /* The daemon sees the close on its own time: the log says when. */
  ASSERT(it_log_wait(&d, "owned_dropped=2", 5000));
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_open(c, "life", &l, &h));
  kvc_seq_info_t si;
  ASSERT_ERR(kvc_seq_info(h, ids[0], &si), KVC_E_NOSEQ);
  ASSERT_ERR(kvc_seq_info(h, ids[1], &si), KVC_E_NOSEQ);
  ASSERT_OK(kvc_seq_info(h, ids[2], &si)); /* not owned: stays */
  ASSERT_U64_EQ(si.length, 1);
  kvc_client_close(c);
  daemon_stop(&d);
}

/* no_replace: an attach or a copy onto an existing sequence is refused with
 * EXISTS and the sequence keeps every byte; onto a new id it works. */
TEST(seq_no_replace_refuses_an_existing_destination) {
  daemon_t d;
  daemon_start(&d);
  kvc_client_t *c = client_open(&d);
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_open(c, "life", &l, &h));
  size_t nk = it_tok_floats(&l, false) * 32, nv = it_tok_floats(&l, true) * 32;
  float *k = malloc(nk * 4), *v = malloc(nv * 4), *gk = malloc(nk * 4), *gv = malloc(nv * 4);
  uint32_t toks[32];
  for (int i = 0; i < 32; i++) toks[i] = 500u + (uint32_t)i;
  it_fill_f32(k, v, &l, 1, 0, 32, 1);
  ASSERT_OK(kvc_put_tokens(h, 1, 0, 32, k, v, toks)); /* the prompt, indexed */
  it_fill_f32(k, v, &l, 2, 0, 32, 2);
  ASSERT_OK(kvc_put(h, 2, 0, 32, k, v)); /* another worker's sequence 2 */
  kvc_match_t m;
  ASSERT_ERR(kvc_attach_ex(h, 2, toks, 32, KVC_ATTACH_NO_REPLACE, &m), KVC_E_EXISTS);
  ASSERT(strstr(kvc_client_last_error(c), "no_replace") != NULL);
  ASSERT_ERR(kvc_seq_copy_prefix_new(h, 1, 2, 16), KVC_E_EXISTS);
  ASSERT_OK(kvc_get(h, 2, 0, 32, gk, gv));
  ASSERT_MEM_EQ(gk, k, nk * 4);
  ASSERT_MEM_EQ(gv, v, nv * 4);
  ASSERT_OK(kvc_attach_ex(h, 3, toks, 32, KVC_ATTACH_NO_REPLACE, &m));
  ASSERT_U64_EQ(m.tokens, 32);
  ASSERT_OK(kvc_seq_copy_prefix_new(h, 1, 4, 16));
  ASSERT_OK(kvc_attach(h, 2, toks, 32, false, &m)); /* without the flag: replaced */
  free(k), free(v), free(gk), free(gv);
  kvc_client_close(c);
  daemon_stop(&d);
}
