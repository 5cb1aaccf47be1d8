/* bench_floor.h: the physical floor of a row's own work, measured by kvc_bench
 * in the same run as the row (issue 34, doc/benchmarks.md "Floors").
 *
 * - The shared-memory request floor: two processes polling one cache line
 *   each way (the client on the clients' CPU, a server on the daemon's), and
 *   the same floor with a 4 KiB row's own copies: the server copies the
 *   shared buffer's two 2 KiB rows into the row of a 2 MiB page of a large
 *   shared region (a put: streaming stores, as src/ntcopy.c), or the page's
 *   rows into the shared buffer (a get: memcpy), before answering; or the
 *   client reads the rows in place after the answer (a zero-copy read).
 *   The token walks a 512 MiB region as the rows walk their sequence.
 * - The plain copies of a copy row: the same runs (the llama layout's rows,
 *   2 KiB a token of a layer, a page [layer][K rows][V rows], a buffer
 *   [layer][token]), the same sizes, the same streaming, by the same number
 *   of threads, between shared mappings like the pool's and the client's
 *   buffer (copy_xfer, team_t).
 *
 * A floor's spinning side sleeps on a futex once idle for FL_SPIN_NS, so it
 * takes no CPU from the daemon during the rows' own trials.
 */
#ifndef KVC_BENCH_FLOOR_H
#define KVC_BENCH_FLOOR_H

#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/syscall.h>

#include "bench_util.h"
#include "ntcopy.h"

#define FL_SPIN_NS 200000.0 /* a floor's side polls this long after its last work */
#define FL_ROW 2048ull      /* K (or V) of one token of one layer, bytes */
#define FL_PAGE_TOKENS 16ull
#define FL_LAYER_BYTES (2 * FL_PAGE_TOKENS * FL_ROW) /* K rows, then V rows: 64 KiB */
#define FL_PAGE_BYTES (32 * FL_LAYER_BYTES)          /* 2 MiB */

static inline void fl_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

static BU_UNUSED void fl_futex_wait(_Atomic uint32_t *w, uint32_t old) {
  syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT, old, NULL, NULL, 0);
}

static BU_UNUSED void fl_futex_wake(_Atomic uint32_t *w) {
  syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* Waits until *w differs from old: polls it, and sleeps on it once it has
 * not changed for FL_SPIN_NS (counted in *sleepers, so a waker knows to
 * wake). Returns the new value. Works across processes (shared futexes). */
static BU_UNUSED uint32_t fl_wait_change(_Atomic uint32_t *w, uint32_t old,
                                         _Atomic uint32_t *sleepers) {
  uint32_t v;
  double until = 0;
  for (unsigned i = 1;; i++) {
    if ((v = atomic_load_explicit(w, memory_order_acquire)) != old) return v;
    fl_relax();
    if (i % 256) continue;
    double now = now_ns();
    if (until == 0) until = now + FL_SPIN_NS;
    if (now < until) continue;
    atomic_fetch_add(sleepers, 1);
    if (atomic_load(w) == old) fl_futex_wait(w, old);
    atomic_fetch_sub(sleepers, 1);
    until = 0;
  }
}

/* Publishes *w = v and wakes its sleepers, if any. */
static BU_UNUSED void fl_publish(_Atomic uint32_t *w, uint32_t v, _Atomic uint32_t *sleepers) {
  atomic_store(w, v); /* seq_cst: ordered before the load of sleepers */
  if (atomic_load(sleepers)) fl_futex_wake(w);
}

/* A pre-faulted shared mapping (the pool and the clients' buffers are
 * shared memory: shmem pages, as these). */
static BU_UNUSED uint8_t *fl_shared(uint64_t bytes) {
  uint8_t *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS | MAP_POPULATE,
                    -1, 0);
  if (p == MAP_FAILED) die("mmap %" PRIu64 " shared bytes: %s", bytes, strerror(errno));
  memset(p, 1, bytes);
  return p;
}

/* ---- one transfer's copies -------------------------------------------------- */

/* The copies the engine makes for a put (get) of tokens [pos, pos + nt) of
 * layers [l0, l1) of a transfer of nl layers of a plain bf16 cache of the
 * llama layout: pages[k] is the sequence's k-th page, buf the transfer's
 * buffer (K [layer][token] rows, then V at buf + nl * nt * FL_ROW). Per page,
 * per layer: one run of K rows and one of V rows. A put streams (ntcopy)
 * and fences; a get is memcpy (src/copy.c copy_in, copy_out). */
static BU_UNUSED void copy_xfer(uint8_t *const *pages, uint64_t pos, uint64_t nt, uint32_t nl,
                                uint32_t l0, uint32_t l1, uint8_t *buf, bool get) {
  uint8_t *kb = buf, *vb = buf + (uint64_t)nl * nt * FL_ROW;
  for (uint64_t p = pos, bt = 0; p < pos + nt;) {
    uint64_t pt = p % FL_PAGE_TOKENS, cnt = FL_PAGE_TOKENS - pt;
    if (cnt > pos + nt - p) cnt = pos + nt - p;
    uint8_t *page = pages[p / FL_PAGE_TOKENS];
    for (uint32_t l = l0; l < l1; l++) {
      uint8_t *k = page + l * FL_LAYER_BYTES + pt * FL_ROW;
      uint8_t *v = k + FL_PAGE_TOKENS * FL_ROW;
      uint8_t *bk = kb + ((uint64_t)l * nt + bt) * FL_ROW, *bv = vb + ((uint64_t)l * nt + bt) * FL_ROW;
      if (get) {
        memcpy(bk, k, cnt * FL_ROW);
        memcpy(bv, v, cnt * FL_ROW);
      } else {
        ntcopy(k, bk, cnt * FL_ROW);
        ntcopy(v, bv, cnt * FL_ROW);
      }
    }
    p += cnt;
    bt += cnt;
  }
  if (!get) ntcopy_fence();
}

/* ---- the shared-memory request floor ------------------------------------------ */

enum sf_kind { SF_EMPTY, SF_PUT, SF_GET, SF_READ, SF_NKINDS };
static const char *const sf_names[SF_NKINDS] = {
    "shm floor: one cache line each way, both sides polling",
    "shm floor moving a 4 KiB put: the server streams the rows into a page",
    "shm floor moving a 4 KiB get: the server copies a page's rows out",
    "shm floor of a 4 KiB zero-copy read: the client reads the rows in place"};

#define SF_SPAN 4096ull /* tokens walked: 256 pages of 2 MiB (the rows' SPAN) */

typedef struct sf_shared {
  _Alignas(64) _Atomic uint32_t req; /* the request line: its number, what, where */
  uint32_t kind;
  uint64_t pos;
  _Alignas(64) _Atomic uint32_t resp; /* the answer line */
  _Alignas(64) _Atomic uint32_t sleepers;
  _Atomic uint32_t stop;
} sf_shared_t;

typedef struct sf_ctx {
  sf_shared_t *sh;
  uint8_t *pool;         /* SF_SPAN tokens of pages, shared with the server */
  uint8_t *buf;          /* the shared buffer (4 KiB used) */
  uint8_t *pages[SF_SPAN / FL_PAGE_TOKENS];
  pid_t pid;
  uint32_t seq;
  uint64_t pos[SF_NKINDS]; /* each kind's walk */
} sf_ctx_t;

typedef struct sf_op {
  sf_ctx_t *c;
  enum sf_kind kind;
} sf_op_t;

static volatile uint64_t fl_sink;

static uint64_t fl_read_rows(const uint8_t *p, uint64_t bytes) {
  const uint64_t *w = (const uint64_t *)(const void *)p;
  uint64_t a = 0, b = 0, c = 0, d = 0;
  for (uint64_t i = 0; i + 4 <= bytes / 8; i += 4) {
    a += w[i];
    b += w[i + 1];
    c += w[i + 2];
    d += w[i + 3];
  }
  return a ^ b ^ c ^ d;
}

static void sf_serve(sf_ctx_t *c) {
  sf_shared_t *sh = c->sh;
  uint32_t last = 0;
  for (;;) {
    last = fl_wait_change(&sh->req, last, &sh->sleepers);
    if (atomic_load(&sh->stop)) _exit(0);
    if (sh->kind == SF_PUT) copy_xfer(c->pages, sh->pos, 1, 1, 0, 1, c->buf, false);
    else if (sh->kind == SF_GET) copy_xfer(c->pages, sh->pos, 1, 1, 0, 1, c->buf, true);
    atomic_store_explicit(&sh->resp, last, memory_order_release);
  }
}

/* Forks the server, on the daemon's CPU. */
static BU_UNUSED void sf_open(sf_ctx_t *c) {
  memset(c, 0, sizeof *c);
  c->sh = (sf_shared_t *)(void *)fl_shared(4096);
  memset(c->sh, 0, sizeof *c->sh);
  c->pool = fl_shared(SF_SPAN / FL_PAGE_TOKENS * FL_PAGE_BYTES);
  c->buf = fl_shared(1 << 20);
  for (uint64_t i = 0; i < SF_SPAN / FL_PAGE_TOKENS; i++) c->pages[i] = c->pool + i * FL_PAGE_BYTES;
  fflush(NULL);
  c->pid = fork();
  if (c->pid < 0) die("fork: %s", strerror(errno));
  if (c->pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    place_on(true);
    sf_serve(c);
  }
  watch_pid(c->pid);
}

static BU_UNUSED void sf_close(sf_ctx_t *c) {
  if (c->pid <= 0) return;
  atomic_store(&c->sh->stop, 1);
  fl_publish(&c->sh->req, ++c->seq, &c->sh->sleepers);
  unwatch_pid(c->pid);
  waitpid(c->pid, NULL, 0);
  c->pid = 0;
  munmap(c->pool, SF_SPAN / FL_PAGE_TOKENS * FL_PAGE_BYTES);
  munmap(c->buf, 1 << 20);
  munmap(c->sh, 4096);
}

/* One request: publish it, poll for the answer (and read in place). Walks
 * tokens as the rows' kx_step does. */
static BU_UNUSED int op_shmfloor(void *p) {
  sf_op_t *o = p;
  sf_ctx_t *c = o->c;
  uint64_t pos = c->pos[o->kind] + 1;
  if (pos + 1 > SF_SPAN) pos = 0;
  c->pos[o->kind] = pos;
  c->sh->kind = o->kind;
  c->sh->pos = pos;
  uint32_t s = ++c->seq;
  fl_publish(&c->sh->req, s, &c->sh->sleepers);
  while (atomic_load_explicit(&c->sh->resp, memory_order_acquire) != s) fl_relax();
  if (o->kind == SF_READ) {
    const uint8_t *k = c->pages[pos / FL_PAGE_TOKENS] + (pos % FL_PAGE_TOKENS) * FL_ROW;
    fl_sink += fl_read_rows(k, FL_ROW) + fl_read_rows(k + FL_PAGE_TOKENS * FL_ROW, FL_ROW);
  }
  return 0;
}

/* ---- plain copies by a team of threads ------------------------------------------ */

/* n threads doing parts of one job: the caller part 0, helpers the others,
 * handed over as the daemon's copy threads are (a shared counter each way,
 * polled, a futex once idle). */
#define TEAM_MAX 8
typedef void (*team_fn)(void *ctx, unsigned part, unsigned nparts);

typedef struct team {
  unsigned n;
  pthread_t t[TEAM_MAX];
  _Alignas(64) _Atomic uint32_t gen;
  _Atomic uint32_t sleepers;
  _Alignas(64) _Atomic uint32_t left;
  team_fn fn;
  void *ctx;
  bool stop;
} team_t;

typedef struct team_arg {
  team_t *tm;
  unsigned idx;
} team_arg_t;

static void *team_run(void *p) {
  team_arg_t *a = p;
  team_t *tm = a->tm;
  unsigned idx = a->idx;
  free(a);
  place_free();
  uint32_t last = 0;
  for (;;) {
    last = fl_wait_change(&tm->gen, last, &tm->sleepers);
    if (tm->stop) return NULL;
    tm->fn(tm->ctx, idx, tm->n);
    atomic_fetch_sub_explicit(&tm->left, 1, memory_order_release);
  }
}

static BU_UNUSED void team_open(team_t *tm, unsigned n) {
  memset(tm, 0, sizeof *tm);
  tm->n = n < 1 ? 1 : n > TEAM_MAX ? TEAM_MAX : n;
  for (unsigned i = 1; i < tm->n; i++) {
    team_arg_t *a = malloc(sizeof *a);
    if (!a) die("out of memory");
    *a = (team_arg_t){tm, i};
    if (pthread_create(&tm->t[i], NULL, team_run, a) != 0) die("pthread_create");
  }
}

/* Runs fn(ctx, part, n) for every part, part 0 here; returns when all are done. */
static BU_UNUSED void team_do(team_t *tm, team_fn fn, void *ctx) {
  tm->fn = fn;
  tm->ctx = ctx;
  atomic_store(&tm->left, tm->n - 1);
  fl_publish(&tm->gen, atomic_load(&tm->gen) + 1, &tm->sleepers);
  fn(ctx, 0, tm->n);
  while (atomic_load_explicit(&tm->left, memory_order_acquire)) fl_relax();
}

static BU_UNUSED void team_close(team_t *tm) {
  tm->stop = true;
  fl_publish(&tm->gen, atomic_load(&tm->gen) + 1, &tm->sleepers);
  for (unsigned i = 1; i < tm->n; i++) pthread_join(tm->t[i], NULL);
}

#endif
