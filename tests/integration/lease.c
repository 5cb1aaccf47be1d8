/* lease.c (integration): zero-copy reads through the real daemon: reading in
 * place equals a get, the pool mapping cannot be made writable, a later write
 * does not change what a lease sees, eviction does not free leased pages, and
 * a killed client's leases are released. */
#include <sys/mman.h>

#include "raw.h"

#define NTOK 40 /* 3 pages of 16 tokens, the last partly filled */

static kvc_cache_t *open_f32(kvc_client_t *c) {
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  kvc_cache_t *h;
  ASSERT_OK(kvc_cache_open(c, "lease", &l, &h));
  return h;
}

static void put_seq(kvc_cache_t *h, uint64_t seq, uint64_t pos, uint64_t n, uint32_t salt) {
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  size_t nk = it_tok_floats(&l, false) * n, nv = it_tok_floats(&l, true) * n;
  float *k = malloc(nk * 4), *v = malloc(nv * 4);
  it_fill_f32(k, v, &l, seq, pos, n, salt);
  ASSERT_OK(kvc_put(h, seq, pos, n, k, v));
  free(k);
  free(v);
}

/* Bytes of one token's K (or V) of one layer, every head: the row a lease
 * pointer points at. */
static size_t row_bytes(void) {
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  return (size_t)l.num_kv_heads * l.head_dim_k * 4;
}

/* Copies what the lease shows of [b, e) into k/v ([layer][token][...]). */
static void read_lease(const kvc_lease_t *ls, uint64_t b, uint64_t e, uint8_t *k, uint8_t *v) {
  size_t rb = row_bytes(), n = (size_t)(e - b);
  for (uint32_t ly = 0; ly < 2; ly++)
    for (uint64_t p = b; p < e; p++) {
      const void *pk = kvc_lease_k(ls, ly, p), *pv = kvc_lease_v(ls, ly, p);
      ASSERT(pk != NULL && pv != NULL);
      memcpy(k + (ly * n + (p - b)) * rb, pk, rb);
      memcpy(v + (ly * n + (p - b)) * rb, pv, rb);
    }
}

TEST(lease_read_in_place_equals_get) {
  daemon_t d;
  daemon_start(&d);
  kvc_client_t *c = client_open(&d);
  kvc_cache_t *h = open_f32(c);
  put_seq(h, 1, 0, NTOK, 0);
  kvc_lease_t *ls;
  ASSERT_OK(kvc_lease(h, 1, 3, 37, &ls));
  const kvc_lease_info_t *li = kvc_lease_info(ls);
  ASSERT_U64_EQ(li->seq_id, 1);
  ASSERT_U64_EQ(li->first_pos, 0);
  ASSERT_EQ(li->npages, 3);
  ASSERT_EQ(li->page_tokens, 16);
  ASSERT(kvc_lease_k(ls, 0, 2) == NULL && kvc_lease_k(ls, 0, 37) == NULL);
  ASSERT(kvc_lease_k(ls, 2, 5) == NULL); /* layer outside the layout */
  size_t bytes = 2 * 34 * row_bytes();
  uint8_t *gk = malloc(bytes), *gv = malloc(bytes), *lk = malloc(bytes), *lv = malloc(bytes);
  ASSERT_OK(kvc_get(h, 1, 3, 37, gk, gv));
  read_lease(ls, 3, 37, lk, lv);
  ASSERT_MEM_EQ(lk, gk, bytes);
  ASSERT_MEM_EQ(lv, gv, bytes);
  ASSERT_U64_EQ(stat_get(c, "leases", NULL), 1);
  ASSERT_U64_EQ(stat_get(c, "leased_pages", NULL), 3);
  ASSERT_U64_EQ(stat_get(c, "requests_total{op=lease}", NULL), 1);
  ASSERT_OK(kvc_lease_release(ls));
  ASSERT_U64_EQ(stat_get(c, "leases", NULL), 0);
  ASSERT_U64_EQ(stat_get(c, "leases_taken_total", NULL), 1);
  ASSERT_U64_EQ(stat_get(c, "pages_shared", NULL), 0);
  free(gk), free(gv), free(lk), free(lv);
  kvc_client_close(c);
  daemon_stop(&d);
}

/* The Hello's descriptors, received by hand: [0] the buffer, [1] the pool. */
static void raw_hello_fds(int fd, int fds[2]) {
  raw_hello(fd, KVC_PROTOCOL_VERSION);
  uint8_t buf[4096];
  char ctl[CMSG_SPACE(2 * sizeof(int))];
  struct iovec iov = {.iov_base = buf, .iov_len = sizeof buf};
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl,
                       .msg_controllen = sizeof ctl};
  ASSERT(recvmsg(fd, &msg, MSG_CMSG_CLOEXEC) > 0);
  struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
  ASSERT(cm != NULL && cm->cmsg_type == SCM_RIGHTS);
  ASSERT_EQ(cm->cmsg_len, CMSG_LEN(2 * sizeof(int)));
  memcpy(fds, CMSG_DATA(cm), 2 * sizeof(int));
}

TEST(lease_pool_mapping_is_read_only) {
  daemon_t d;
  daemon_start(&d);
  kvc_client_t *c = client_open(&d);
  const void *base;
  uint64_t bytes;
  kvc_client_pool(c, &base, &bytes);
  ASSERT(base != NULL);
  ASSERT_U64_EQ(bytes, 8u << 20);
  ASSERT_EQ(mprotect((void *)base, 4096, PROT_READ | PROT_WRITE), -1);
  ASSERT_EQ(errno, EACCES);
  kvc_client_close(c);

  int s = it_connect_raw(d.sock), fds[2];
  raw_hello_fds(s, fds);
  int pool = fds[1];
  ASSERT_EQ(fcntl(pool, F_GETFL) & O_ACCMODE, O_RDONLY);
  ASSERT(mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, pool, 0) == MAP_FAILED);
  ASSERT_EQ(errno, EACCES);
  void *ro = mmap(NULL, 4096, PROT_READ, MAP_SHARED, pool, 0);
  ASSERT(ro != MAP_FAILED);
  ASSERT_EQ(mprotect(ro, 4096, PROT_READ | PROT_WRITE), -1);
  ASSERT_EQ(errno, EACCES);
  munmap(ro, 4096);
  ASSERT_EQ(write(pool, "x", 1), -1);
  ASSERT_EQ(ftruncate(pool, 0), -1);
  ASSERT_EQ(fallocate(pool, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 4096), -1);
  ASSERT_EQ(fcntl(pool, F_ADD_SEALS, F_SEAL_WRITE), -1);
  /* Reopening it read-write through /proc is refused to a non-root owner by
   * the file's mode (0400); root may reopen it, but the pool's
   * F_SEAL_FUTURE_WRITE still refuses every new writable mapping, write and
   * hole punch. */
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", pool);
  int rw = open(path, O_RDWR);
  if (geteuid() != 0) ASSERT_EQ(rw, -1);
  if (rw >= 0) {
    ASSERT(mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, rw, 0) == MAP_FAILED);
    ASSERT_EQ(errno, EPERM);
    ASSERT_EQ(write(rw, "x", 1), -1);
    ASSERT_EQ(fallocate(rw, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 4096), -1);
    ASSERT_EQ(ftruncate(rw, 4096), -1);
    close(rw);
  }
  close(fds[0]);
  close(pool);
  close(s);
  daemon_stop(&d);
}

TEST(lease_unchanged_by_later_writes) {
  daemon_t d;
  daemon_start(&d);
  kvc_client_t *c = client_open(&d);
  kvc_cache_t *h = open_f32(c);
  put_seq(h, 1, 0, NTOK, 0);
  kvc_lease_t *ls;
  ASSERT_OK(kvc_lease(h, 1, 0, NTOK, &ls));
  size_t bytes = 2 * NTOK * row_bytes();
  uint8_t *k0 = malloc(bytes), *v0 = malloc(bytes), *k1 = malloc(bytes), *v1 = malloc(bytes);
  read_lease(ls, 0, NTOK, k0, v0);
  uint64_t cow = stat_get(c, "cow_copies_total", NULL);
  put_seq(h, 1, 0, NTOK, 7);  /* overwrite every token */
  put_seq(h, 1, NTOK, 4, 7);  /* and append into the partial page */
  read_lease(ls, 0, NTOK, k1, v1);
  ASSERT_MEM_EQ(k1, k0, bytes);
  ASSERT_MEM_EQ(v1, v0, bytes);
  ASSERT_U64_EQ(stat_get(c, "cow_copies_total", NULL), cow + 3);
  /* The sequence reads its new bytes. */
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  float *wk = malloc(bytes), *wv = malloc(bytes);
  it_fill_f32(wk, wv, &l, 1, 0, NTOK, 7);
  ASSERT_OK(kvc_get(h, 1, 0, NTOK, k1, v1));
  ASSERT_MEM_EQ(k1, wk, bytes);
  ASSERT_MEM_EQ(v1, wv, bytes);
  ASSERT_OK(kvc_lease_release(ls));
  ASSERT_U64_EQ(stat_get(c, "pages_used", NULL), 3);
  free(k0), free(v0), free(k1), free(v1), free(wk), free(wv);
  kvc_client_close(c);
  daemon_stop(&d);
}

TEST(lease_pages_survive_eviction_pressure) {
  daemon_t d;
  daemon_start(&d); /* 8 MiB of 16 KiB pages: 512 */
  kvc_client_t *a = client_open(&d), *b = client_open(&d);
  kvc_cache_t *ha = open_f32(a), *hb = open_f32(b);
  put_seq(ha, 1, 0, 32, 0);
  kvc_lease_t *ls;
  ASSERT_OK(kvc_lease(ha, 1, 0, 32, &ls));
  size_t bytes = 2 * 32 * row_bytes();
  uint8_t *k0 = malloc(bytes), *v0 = malloc(bytes), *k1 = malloc(bytes), *v1 = malloc(bytes);
  read_lease(ls, 0, 32, k0, v0);
  for (uint64_t s = 100; s < 100 + 600; s++) put_seq(hb, s, 0, 16, 1); /* > the pool */
  kvc_seq_info_t si;
  ASSERT_ERR(kvc_seq_info(ha, 1, &si), KVC_E_NOSEQ); /* evicted */
  ASSERT(stat_get(b, "evicted_sequences_total", NULL) >= 90);
  read_lease(ls, 0, 32, k1, v1);
  ASSERT_MEM_EQ(k1, k0, bytes);
  ASSERT_MEM_EQ(v1, v0, bytes);
  ASSERT_U64_EQ(stat_get(a, "pages_free", NULL), 0);
  ASSERT_OK(kvc_lease_release(ls));
  ASSERT_U64_EQ(stat_get(a, "pages_free", NULL), 2);
  free(k0), free(v0), free(k1), free(v1);
  kvc_client_close(a);
  kvc_client_close(b);
  daemon_stop(&d);
}

TEST(lease_released_when_client_killed) {
  daemon_t d;
  daemon_start(&d);
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  fflush(NULL);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    kvc_client_t *c = client_open(&d);
    kvc_cache_t *h = open_f32(c);
    put_seq(h, 1, 0, NTOK, 0);
    kvc_lease_t *l1, *l2;
    if (kvc_lease(h, 1, 0, NTOK, &l1) || kvc_lease(h, 1, 16, 20, &l2)) _exit(3);
    if (write(ready[1], "r", 1) != 1) _exit(4);
    pause();
    _exit(0);
  }
  char b;
  ASSERT_EQ(read(ready[0], &b, 1), 1);
  kvc_client_t *c = client_open(&d);
  ASSERT_U64_EQ(stat_get(c, "leases", NULL), 2);
  ASSERT_U64_EQ(stat_get(c, "leased_pages", NULL), 4);
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  (void)it_wait_stat(c, "leases", 0, false);
  ASSERT_U64_EQ(stat_get(c, "leases", NULL), 0);
  ASSERT_U64_EQ(stat_get(c, "leased_pages", NULL), 0);
  kvc_cache_t *h = open_f32(c);
  ASSERT_OK(kvc_seq_remove(h, 1, 0, UINT64_MAX));
  ASSERT_U64_EQ(stat_get(c, "pages_used", NULL), 0); /* nothing leaked */
  kvc_client_close(c);
  daemon_stop(&d);
}

TEST(lease_release_later_rides_on_the_next_request) {
  daemon_t d;
  daemon_start(&d);
  kvc_client_t *c = client_open(&d);
  kvc_cache_t *h = open_f32(c);
  put_seq(h, 1, 0, NTOK, 0);
  kvc_lease_t *ls;
  for (int i = 0; i < 3; i++) {
    ASSERT_OK(kvc_lease(h, 1, 0, NTOK, &ls));
    ASSERT_OK(kvc_lease_release_later(ls)); /* sent with the next lease */
  }
  ASSERT_U64_EQ(stat_get(c, "leases_taken_total", NULL), 3);
  /* The stats request itself carried the last release. */
  ASSERT_U64_EQ(stat_get(c, "leases", NULL), 0);
  ASSERT_U64_EQ(stat_get(c, "requests_total{op=lease_release}", NULL), 0);
  /* 64 deferred releases fill the queue; the 65th flushes it first. */
  kvc_lease_t *many[65];
  for (int i = 0; i < 65; i++) ASSERT_OK(kvc_lease(h, 1, 0, 4, &many[i]));
  for (int i = 0; i < 65; i++) ASSERT_OK(kvc_lease_release_later(many[i]));
  ASSERT_U64_EQ(stat_get(c, "requests_total{op=lease_release}", NULL), 1);
  ASSERT_U64_EQ(stat_get(c, "leases", NULL), 0);
  ASSERT_OK(kvc_lease_release_later(NULL));
  kvc_client_close(c);
  daemon_stop(&d);
}

TEST(lease_bad_input) {
  daemon_t d;
  daemon_start(&d);
  kvc_client_t *c = client_open(&d);
  kvc_cache_t *h = open_f32(c);
  put_seq(h, 1, 0, NTOK, 0);
  kvc_lease_t *ls = (kvc_lease_t *)1;
  ASSERT_ERR(kvc_lease(h, 2, 0, 1, &ls), KVC_E_NOSEQ);
  ASSERT(ls == NULL);
  ASSERT_ERR(kvc_lease(h, 1, 5, 5, &ls), KVC_E_RANGE);
  ASSERT_ERR(kvc_lease(h, 1, 0, NTOK + 1, &ls), KVC_E_RANGE);
  ASSERT(strstr(kvc_client_last_error(c), "outside") != NULL);
  ASSERT_ERR(kvc_lease(NULL, 1, 0, 1, &ls), KVC_E_INVAL);
  ASSERT_OK(kvc_lease_release(NULL));
  ASSERT_OK(kvc_ping(c));
  /* A release of a lease this connection does not hold. */
  int s = it_connect_raw(d.sock);
  raw_hello(s, KVC_PROTOCOL_VERSION);
  Kvcache__V1__Response *r = raw_reply(s);
  ASSERT(r && r->status == KVCACHE__V1__STATUS__OK);
  kvcache__v1__response__free_unpacked(r, NULL);
  ASSERT_OK(kvc_lease(h, 1, 0, 4, &ls)); /* held by c, not by s */
  Kvcache__V1__Request req = KVCACHE__V1__REQUEST__INIT;
  Kvcache__V1__LeaseRelease rel = KVCACHE__V1__LEASE_RELEASE__INIT;
  uint64_t id = kvc_lease_info(ls)->lease_id;
  rel.n_lease_ids = 1;
  rel.lease_ids = &id;
  req.id = 2;
  req.body_case = KVCACHE__V1__REQUEST__BODY_LEASE_RELEASE;
  req.lease_release = &rel;
  raw_send_request(s, &req);
  r = raw_reply(s);
  ASSERT(r != NULL);
  ASSERT_EQ(r->status, KVCACHE__V1__STATUS__NOLEASE);
  kvcache__v1__response__free_unpacked(r, NULL);
  close(s);
  ASSERT_U64_EQ(stat_get(c, "leases", NULL), 1);
  ASSERT_OK(kvc_lease_release(ls));
  kvc_client_close(c);
  daemon_stop(&d);
}

TEST_TIMEOUT(lease_limit_per_connection, 120) {
  daemon_t d;
  daemon_start(&d);
  kvc_client_t *c = client_open(&d);
  kvc_cache_t *h = open_f32(c);
  put_seq(h, 1, 0, 4, 0);
  kvc_lease_t *ls, *last = NULL;
  for (int i = 0; i < 4096; i++) ASSERT_OK(kvc_lease(h, 1, 0, 4, &last));
  ASSERT_ERR(kvc_lease(h, 1, 0, 4, &ls), KVC_E_TOOMANY);
  ASSERT_OK(kvc_lease_release(last));
  ASSERT_OK(kvc_lease(h, 1, 0, 4, &ls));
  ASSERT_U64_EQ(stat_get(c, "leases", NULL), 4096);
  kvc_client_close(c); /* frees the handles; the daemon releases the leases */
  c = client_open(&d);
  (void)it_wait_stat(c, "leases", 0, false);
  ASSERT_U64_EQ(stat_get(c, "leases", NULL), 0);
  kvc_client_close(c);
  daemon_stop(&d);
}
