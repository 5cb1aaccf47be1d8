/* share.c: two client processes share one cache; copy_prefix forks a prompt
 * and copy on write keeps each branch's bytes its own. */
#include "harness.h"

#define PROMPT 40u /* 2.5 pages: the third page is shared partly filled */
#define EXTRA 12u

/* Extends seq from PROMPT by EXTRA tokens with salt, then reads back all of
 * it and compares with the prompt (salt 0) followed by the extension. */
static void extend_and_check(kvc_cache_t *h, uint64_t seq, uint32_t salt) {
  const kvc_layout_t *l = kvc_cache_layout(h);
  size_t kt = it_tok_floats(l, false), vt = it_tok_floats(l, true);
  uint32_t total = PROMPT + EXTRA;
  float *k = calloc(kt * EXTRA, 4), *v = calloc(vt * EXTRA, 4);
  it_fill_f32(k, v, l, seq, PROMPT, EXTRA, salt);
  ASSERT_OK(kvc_put(h, seq, PROMPT, EXTRA, k, v));
  free(k);
  free(v);
  /* Expected, layer by layer: tokens 0..PROMPT of the prompt (seq 1, salt 0),
   * then the extension. */
  float *ek = calloc(kt * total, 4), *ev = calloc(vt * total, 4);
  float *pk = calloc(kt * PROMPT, 4), *pv = calloc(vt * PROMPT, 4);
  float *xk = calloc(kt * EXTRA, 4), *xv = calloc(vt * EXTRA, 4);
  it_fill_f32(pk, pv, l, 1, 0, PROMPT, 0);
  it_fill_f32(xk, xv, l, seq, PROMPT, EXTRA, salt);
  size_t rk = kt / l->num_layers, rv = vt / l->num_layers; /* floats per token per layer */
  for (uint32_t layer = 0; layer < l->num_layers; layer++) {
    memcpy(ek + layer * total * rk, pk + layer * PROMPT * rk, PROMPT * rk * 4);
    memcpy(ek + (layer * total + PROMPT) * rk, xk + layer * EXTRA * rk, EXTRA * rk * 4);
    memcpy(ev + layer * total * rv, pv + layer * PROMPT * rv, PROMPT * rv * 4);
    memcpy(ev + (layer * total + PROMPT) * rv, xv + layer * EXTRA * rv, EXTRA * rv * 4);
  }
  float *gk = calloc(kt * total, 4), *gv = calloc(vt * total, 4);
  ASSERT_OK(kvc_get(h, seq, 0, total, gk, gv));
  ASSERT_MEM_EQ(gk, ek, kt * total * 4);
  ASSERT_MEM_EQ(gv, ev, vt * total * 4);
  free(ek), free(ev), free(pk), free(pv), free(xk), free(xv), free(gk), free(gv);
}

TEST(share_copy_prefix_cow_across_processes) {
  daemon_t d;
  daemon_start(&d);
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_client_t *a = client_open(&d);
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_open(a, "shared", &l, &h));
  size_t kt = it_tok_floats(&l, false), vt = it_tok_floats(&l, true);
  float *k = calloc(kt * PROMPT, 4), *v = calloc(vt * PROMPT, 4);
  it_fill_f32(k, v, &l, 1, 0, PROMPT, 0);
  ASSERT_OK(kvc_put(h, 1, 0, PROMPT, k, v));
  free(k);
  free(v);
  ASSERT_OK(kvc_seq_copy_prefix(h, 1, 2, PROMPT));
  kvc_seq_info_t si;
  ASSERT_OK(kvc_seq_info(h, 2, &si));
  ASSERT_U64_EQ(si.length, PROMPT);
  ASSERT_EQ(si.pages, 3);
  ASSERT_EQ(si.shared_pages, 3);
  ASSERT_U64_EQ(stat_get(a, "pages_used", NULL), 3);
  ASSERT_U64_EQ(stat_get(a, "pages_shared", NULL), 3);

  /* Process B extends branch 2 while A extends branch 1. */
  int go[2], done[2];
  ASSERT(pipe(go) == 0 && pipe(done) == 0);
  fflush(NULL);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    char ch;
    kvc_client_t *b = client_open(&d);
    kvc_cache_t *hb;
    ASSERT_OK(kvc_cache_open(b, "shared", &l, &hb));
    ASSERT_EQ(read(go[0], &ch, 1), 1);
    extend_and_check(hb, 2, 7);
    ASSERT_EQ(write(done[1], "x", 1), 1);
    kvc_client_close(b);
    _exit(0);
  }
  ASSERT_EQ(write(go[1], "x", 1), 1);
  extend_and_check(h, 1, 3);
  char ch;
  ASSERT_EQ(read(done[0], &ch, 1), 1);
  int st;
  ASSERT_EQ(waitpid(pid, &st, 0), pid);
  ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0);

  /* Each branch still reads its own bytes after the other wrote. */
  extend_and_check(h, 1, 3);
  ASSERT_OK(kvc_seq_info(h, 1, &si));
  ASSERT_U64_EQ(si.length, PROMPT + EXTRA);
  ASSERT_EQ(si.shared_pages, 2); /* the two full prompt pages */
  ASSERT_U64_EQ(stat_get(a, "cow_copies_total", NULL), 1);
  ASSERT_U64_EQ(stat_get(a, "cow_copies_total", "shared"), 1);
  ASSERT_U64_EQ(stat_get(a, "pages_shared", NULL), 2);
  ASSERT_U64_EQ(stat_get(a, "pages_used", NULL), 6); /* 2 shared + 2 per branch */
  ASSERT_U64_EQ(stat_get(a, "sequences", "shared"), 2);
  ASSERT_U64_EQ(stat_get(a, "requests_total{op=copy_prefix}", NULL), 1);
  ASSERT_U64_EQ(stat_get(a, "connections_total", NULL), 3); /* + the start probe */
  ASSERT_U64_EQ(stat_get(a, "connections_current", NULL), 1);
  kvc_client_close(a);
  daemon_stop(&d);
}
