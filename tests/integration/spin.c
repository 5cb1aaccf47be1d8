/* spin.c: a client opened with spin_us polls for its replies before it
 * blocks; it must see exactly what a blocking client sees. */
#include "harness.h"

/* A client that polls for its replies (spin_us) sees the same answers. */
TEST(client_spin_polls_for_replies) {
  daemon_t d;
  daemon_start(&d);
  kvc_client_opts_t o = {.socket_path = d.sock, .timeout_ms = 20000, .spin_us = 50};
  kvc_client_t *c = NULL;
  ASSERT_OK(kvc_client_open(&o, &c));
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_open(c, "spin", &l, &h));
  size_t nk = it_tok_floats(&l, false) * 20, nv = it_tok_floats(&l, true) * 20;
  float *k = malloc(nk * 4), *v = malloc(nv * 4), *gk = malloc(nk * 4), *gv = malloc(nv * 4);
  it_fill_f32(k, v, &l, 1, 0, 20, 0);
  for (int i = 0; i < 100; i++) ASSERT_OK(kvc_ping(c));
  ASSERT_OK(kvc_put(h, 1, 0, 20, k, v));
  ASSERT_OK(kvc_get(h, 1, 0, 20, gk, gv));
  ASSERT_MEM_EQ(gk, k, nk * 4);
  ASSERT_MEM_EQ(gv, v, nv * 4);
  ASSERT_ERR(kvc_get(h, 2, 0, 1, gk, gv), KVC_E_NOSEQ);
  free(k), free(v), free(gk), free(gv);
  kvc_client_close(c);
  daemon_stop(&d);
}
