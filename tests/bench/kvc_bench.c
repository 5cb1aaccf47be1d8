/* kvc_bench.c: `make bench`: kvcached measured against the physical limit,
 * Redis and memcached in one run, printed as one table of ratios.
 *
 * Everything runs in this one process and its children: the references
 * (memcpy into a pool-sized region, a bare Unix-socket ping-pong, Redis and
 * memcached started on private sockets in a temporary directory), then
 * kvcached daemons started from the same build directory with the pool each
 * part needs. Every figure is a median over TRIALS trials; each ratio is held
 * to its goal from BRIEF section 7 and judged met, NOT MET or unreliable
 * (bench_verdict.h), and the run ends with one summary line. BENCH_ROWS
 * limits the run to some groups of rows. Timings are never asserted: the
 * program fails only if a server refuses a call that must work.
 *
 * The layout is Llama-class: 32 layers x 8 KV heads x 128 dims, bf16, 16
 * tokens a page (a 2 MiB page). One token of one layer, K and V, is 4 KiB;
 * one token of every layer is 128 KiB.
 */
#include <dirent.h>
#include <grp.h>
#include <sys/stat.h>
#include <libgen.h>
#include <msgpack.h>
#include <poll.h>
#include <pthread.h>
#include <sys/mman.h>
#include <zmq.h>

#include "bench_floor.h"
#include "bench_refs.h"
#include "bench_util.h"
#include "kvcache/kvcache.h"

#define KiB 1024ull
#define MiB (1024ull * 1024)
#define GiB (1024ull * 1024 * 1024)
#define TOKEN_LAYER_BYTES 4096ull            /* K + V of one token, one layer */
#define TOKEN_BYTES (32 * TOKEN_LAYER_BYTES) /* K + V of one token, all layers */
#define NSIZES 5
#define TRIAL_MS 40

static const uint64_t sizes[NSIZES] = {4 * KiB, 64 * KiB, 256 * KiB, 1 * MiB, 4 * MiB};
static const char *const size_names[NSIZES] = {"4 KiB", "64 KiB", "256 KiB", "1 MiB", "4 MiB"};
static const kvc_layout_t llama = {32, 8, 128, 128, KVC_DTYPE_BF16, 16};

static char build_dir[4096];
static char tmpdir[64];

/* Every trial of each reference over the run (bench_util.h series_t): the
 * band a row's reference trials are held to, and the references table. */
static series_t mc_ser[2][NSIZES];  /* memcpy [0]: into the region (puts), [1]: out of it */
static series_t rtt_ser = {.name = "round trip"};
enum srv_op { REDIS_SET, REDIS_GET, MC_SET, MC_GET, NSRV };
static const char *const srv_names[NSRV] = {"Redis SET", "Redis GET", "memcached set",
                                            "memcached get"};
static series_t srv_ser[NSRV][NSIZES];
static double rtt_p99_ns;           /* of the bare round trip at the start */
/* The shared-memory request floor (bench_floor.h): its server and every
 * trial of each kind over the run. */
static sf_ctx_t sf;
static sf_op_t sf_ops[SF_NKINDS];
static series_t sf_ser[SF_NKINDS];
static meas_t rtt_start;

/* BENCH_ROWS: a comma list; a group of rows runs if its name contains one
 * of the words (unset or empty: every group). */
static const char *const groups[] = {"ping", "copy", "direct", "lease", "held", "servers",
                                     "spin", "nopoll", "stall", "multi", "decode", "step",
                                     "idle", "prefix", "eviction", "scale", "tier", "events",
                                     "cluster", "arenas", "formats", "scaling"};
#define NGROUPS (sizeof groups / sizeof groups[0])
static const char *rows_filter;

static bool want(const char *group) {
  if (!rows_filter || !*rows_filter) return true;
  char buf[256];
  snprintf(buf, sizeof buf, "%s", rows_filter);
  for (char *save = NULL, *w = strtok_r(buf, ", ", &save); w; w = strtok_r(NULL, ", ", &save))
    if (strstr(group, w)) return true;
  return false;
}
#define DECODE_SEQS 64
#define DECODE_BYTES (DECODE_SEQS * TOKEN_BYTES) /* 8 MiB */
static mc_ctx_t mc;

/* ---- kvcached daemons and clients ------------------------------------------ */

typedef struct kd {
  pid_t pid;
  char sock[108];
  double start_ms; /* spawn to accepting */
} kd_t;

/* A daemon on the servers' CPU (pinned) or free to use every CPU. */
static void kd_start_on(kd_t *d, const char *name, const char *const *extra, bool pinned) {
  char bin[4200], log[160];
  snprintf(bin, sizeof bin, "%s/kvcached", build_dir);
  snprintf(d->sock, sizeof d->sock, "%s/%s.sock", tmpdir, name);
  snprintf(log, sizeof log, "%s/%s.log", tmpdir, name);
  /* The bench measures speed, not the quotas (doc/security.md): one tenant
   * may take the whole pool, pin or lease all of it, and open what it likes. */
  const char *argv[48] = {bin, "--socket", d->sock, "--log-level", "warn",
                          "--pin-limit-pct", "100", "--tenant-max-pinned-pct", "100",
                          "--tenant-max-pages-pct", "100", "--tenant-max-caches", "0",
                          "--tenant-max-seqs", "0", "--tenant-max-keys", "0",
                          "--max-connections-per-uid", "0", "--shm-bytes-per-uid", "64TiB",
                          "--shm-bytes-total", "64TiB"};
  int n = 23;
  for (int i = 0; extra[i] && n < 46; i++) argv[n++] = extra[i];
  argv[n] = NULL;
  double t0 = now_ns();
  d->pid = spawn_on(argv, log, pinned);
  if (!wait_socket(d->sock, d->pid, 120000)) die("kvcached %s did not start; see %s", name, log);
  d->start_ms = (now_ns() - t0) / 1e6;
}

static void kd_start(kd_t *d, const char *name, const char *const *extra) {
  kd_start_on(d, name, extra, true);
}

/* A client with spin_us and KVC_CLIENT_* flags (0, 0: the defaults: rings,
 * polling KVC_SPIN_US_DEFAULT for a reply, the pool prefaulted). */
static kvc_client_t *kc_open_with(const kd_t *d, uint64_t shm_bytes, uint32_t spin_us,
                                  uint32_t flags) {
  kvc_client_opts_t o = {.socket_path = d->sock, .shm_bytes = shm_bytes, .timeout_ms = 60000,
                         .client_name = "bench", .spin_us = spin_us, .flags = flags};
  kvc_client_t *c;
  int rc = kvc_client_open(&o, &c);
  if (rc) die("kvc_client_open: %s: %s", kvc_err_name(rc), kvc_client_open_error());
  return c;
}

static kvc_client_t *kc_open(const kd_t *d, uint64_t shm_bytes) {
  return kc_open_with(d, shm_bytes, 0, 0);
}

static kvc_cache_t *kc_cache(kvc_client_t *c, const char *name, const kvc_layout_t *l) {
  kvc_cache_t *h;
  int rc = kvc_cache_open(c, name, l, &h);
  if (rc) die("kvc_cache_open %s: %s: %s", name, kvc_err_name(rc), kvc_client_last_error(c));
  return h;
}

static void must(kvc_client_t *c, int rc, const char *what) {
  if (rc) die("%s: %s: %s", what, kvc_err_name(rc), kvc_client_last_error(c));
}

static void fill_bytes(uint8_t *p, uint64_t n, unsigned salt) {
  for (uint64_t i = 0; i < n; i++) p[i] = (uint8_t)(i * 31 + salt);
}

/* Writes tokens [0, ntok) of seq, every layer, through the shared buffer. */
static void kc_fill(kvc_cache_t *h, kvc_client_t *c, uint64_t seq, uint64_t ntok) {
  void *base;
  uint64_t cap;
  kvc_client_shm(c, &base, &cap);
  uint64_t per = cap / TOKEN_BYTES;
  fill_bytes(base, (ntok < per ? ntok : per) * TOKEN_BYTES, (unsigned)seq);
  for (uint64_t pos = 0; pos < ntok; pos += per) {
    uint64_t n = ntok - pos < per ? ntok - pos : per;
    kvc_shm_io_t e = {.seq_id = seq, .pos = pos, .ntokens = n, .k_off = 0,
                      .v_off = n * TOKEN_BYTES / 2};
    must(c, kvc_put_shm(h, NULL, &e, 1), "fill");
  }
}

/* ---- one transfer of a given size ---------------------------------------- */

/* How a size maps onto the layout: under one token of every layer, one token
 * of the first size/4 KiB layers; else size/128 KiB tokens of every layer. */
static void size_shape(uint64_t bytes, uint32_t *nl, uint64_t *nt) {
  if (bytes < TOKEN_BYTES) {
    *nl = (uint32_t)(bytes / TOKEN_LAYER_BYTES);
    *nt = 1;
  } else {
    *nl = 32;
    *nt = bytes / TOKEN_BYTES;
  }
}

typedef struct kx {
  kvc_client_t *c;
  kvc_cache_t *h;
  kvc_xfer_t x;
  kvc_io_t io;       /* the pointer form */
  kvc_shm_io_t sio;  /* the direct-buffer form */
  uint64_t bytes;
  uint64_t span;     /* tokens of the sequence the operations walk */
  uint8_t *k, *v;    /* the caller's buffers of the pointer form */
} kx_t;

static void kx_init(kx_t *t, kvc_client_t *c, kvc_cache_t *h, uint64_t seq, uint64_t bytes,
                    uint64_t span) {
  uint32_t nl;
  uint64_t nt;
  size_shape(bytes, &nl, &nt);
  memset(t, 0, sizeof *t);
  t->c = c;
  t->h = h;
  t->bytes = bytes;
  t->span = span;
  t->x = (kvc_xfer_t){.layer_begin = 0, .layer_end = nl};
  t->k = malloc(bytes / 2);
  t->v = malloc(bytes / 2);
  if (!t->k || !t->v) die("out of memory");
  fill_bytes(t->k, bytes / 2, 1);
  fill_bytes(t->v, bytes / 2, 2);
  t->io = (kvc_io_t){.seq_id = seq, .pos = 0, .ntokens = nt, .k = t->k, .v = t->v};
  t->sio = (kvc_shm_io_t){.seq_id = seq, .pos = 0, .ntokens = nt, .k_off = 0,
                          .v_off = bytes / 2};
}

static void kx_deinit(kx_t *t) {
  free(t->k);
  free(t->v);
}

/* Each operation moves to the next tokens of a SPAN-token sequence, so the
 * pool side of the copy is as cold as the reference's region. */
#define SPAN 4096
static void kx_step(kx_t *t) {
  uint64_t n = t->io.ntokens, pos = t->io.pos + n;
  if (pos + n > t->span) pos = 0;
  t->io.pos = t->sio.pos = pos;
}

static int op_put_copy(void *p) {
  kx_t *t = p;
  kx_step(t);
  return kvc_put_batch(t->h, &t->x, &t->io, 1);
}
static int op_get_copy(void *p) {
  kx_t *t = p;
  kx_step(t);
  return kvc_get_batch(t->h, &t->x, &t->io, 1);
}
static int op_put_shm(void *p) {
  kx_t *t = p;
  kx_step(t);
  return kvc_put_shm(t->h, &t->x, &t->sio, 1);
}
static int op_get_shm(void *p) {
  kx_t *t = p;
  kx_step(t);
  return kvc_get_shm(t->h, &t->x, &t->sio, 1);
}

/* Reads layers [0, nl) of the leased tokens in place, every byte once (as a
 * consumer would: the sum stands for its use of them). */
static uint64_t read_row(const uint64_t *w, uint64_t bytes) {
  uint64_t a = 0, b = 0, c = 0, d = 0; /* four chains: the loads, not the adds, bound it */
  for (uint64_t i = 0; i + 4 <= bytes / 8; i += 4) {
    a += w[i];
    b += w[i + 1];
    c += w[i + 2];
    d += w[i + 3];
  }
  return a ^ b ^ c ^ d;
}

static uint64_t read_leased(const kvc_lease_t *l, uint32_t nl, uint64_t pos, uint64_t nt) {
  const kvc_lease_info_t *li = kvc_lease_info(l);
  uint64_t sum = 0;
  for (uint32_t ly = 0; ly < nl; ly++) {
    /* The rows of consecutive tokens of a layer are contiguous in a page. */
    for (uint64_t p = pos; p < pos + nt;) {
      uint64_t row = (p - li->first_pos) % li->page_tokens;
      uint64_t run = li->page_tokens - row < pos + nt - p ? li->page_tokens - row : pos + nt - p;
      sum += read_row(kvc_lease_k(l, ly, p), run * li->k_row_bytes);
      sum += read_row(kvc_lease_v(l, ly, p), run * li->v_row_bytes);
      p += run;
    }
  }
  return sum;
}

static volatile uint64_t sink;

/* A zero-copy read: lease, read in place, release with the next request
 * (one round trip a read). */
static int op_lease_read(void *p) {
  kx_t *t = p;
  kx_step(t);
  kvc_lease_t *l;
  int rc = kvc_lease(t->h, t->io.seq_id, t->io.pos, t->io.pos + t->io.ntokens, &l);
  if (rc) return rc;
  sink += read_leased(l, t->x.layer_end, t->io.pos, t->io.ntokens);
  return kvc_lease_release_later(l);
}

enum path { PATH_COPY, PATH_SHM, PATH_LEASE, PATH_NPATHS };
static const char *const path_names[PATH_NPATHS] = {"copy path", "direct buffer",
                                                    "zero-copy read"};
static const op_fn put_ops[PATH_NPATHS] = {op_put_copy, op_put_shm, NULL};
static const op_fn get_ops[PATH_NPATHS] = {op_get_copy, op_get_shm, op_lease_read};

/* ---- references ------------------------------------------------------------- */

static pp_ctx_t pp;          /* the bare round trip, kept up for the whole run */
static pid_t echo_pid;
static server_proc_t redis_srv, mc_srv;
static rd_t redis_rd, mc_rd; /* connections to them, -1 when absent */
static uint8_t *val_big; /* a value of the largest size */

/* A reference row of the table at the top: m's trials, with p50/p99 or the
 * time of one operation as its text. */
static row_t *ref_row(const char *name, const meas_t *m, enum fmt f, double bytes) {
  row_t *r = row_add(name, BV_GOAL_NONE, 0);
  row_fig(r, m, f, bytes);
  if (!m->ok) return r;
  if (f == FMT_GBS) fmt_us(r->ref, sizeof r->ref, m->ns);
  else snprintf(r->ref, sizeof r->ref, "p50 %.1f us, p99 %.1f us", m->p50 / 1e3, m->p99 / 1e3);
  return r;
}

static bool servers_wanted(void) { return want("servers") || want("decode"); }

/* Redis and memcached SET and GET of each size, alternating. */
static void bench_servers_ref(void) {
  static kv_ctx_t rk, mk;
  for (int i = 0; i < NSIZES; i++) {
    rk = (kv_ctx_t){.r = &redis_rd, .val = val_big, .bytes = sizes[i]};
    mk = (kv_ctx_t){.r = &mc_rd, .val = val_big, .bytes = sizes[i]};
    for (int get = 0; get < 2; get++) {
      op_fn fns[2];
      void *ctxs[2];
      int ids[2], n = 0;
      if (redis_rd.fd >= 0) {
        fns[n] = get ? redis_get : redis_set;
        ctxs[n] = &rk;
        ids[n++] = get ? REDIS_GET : REDIS_SET;
      }
      if (mc_rd.fd >= 0) {
        fns[n] = get ? mc_get : mc_set;
        ctxs[n] = &mk;
        ids[n++] = get ? MC_GET : MC_SET;
      }
      meas_t m[2];
      if (n) measure_side(fns, ctxs, n, TRIAL_MS, 10, m);
      for (int k = 0; k < n; k++) {
        series_add(&srv_ser[ids[k]][i], &m[k]);
        char name[64];
        snprintf(name, sizeof name, "%s %s", srv_names[ids[k]], size_names[i]);
        ref_row(name, &m[k], FMT_GBS, (double)sizes[i]);
      }
    }
  }
}

static void bench_references(void) {
  section("reference");
  mc.region = region_new(REGION_BYTES);
  mc.src = region_new(sizes[NSIZES - 1]);
  fill_bytes(mc.src, sizes[NSIZES - 1], 3);
  for (int out = 0; out < 2; out++)
    for (int i = 0; i < NSIZES; i++) {
      mc.bytes = sizes[i];
      mc.out = out;
      meas_t m = measure(op_memcpy, &mc, TRIAL_MS, 10);
      mc_ser[out][i].name = "memcpy";
      mc_ser[out][i].hog = true;
      series_add(&mc_ser[out][i], &m);
      char name[64];
      snprintf(name, sizeof name, "memcpy %s %s a 1 GiB region", size_names[i],
               out ? "out of" : "into");
      ref_row(name, &m, FMT_GBS, (double)sizes[i]);
    }
  pp.fd = pingpong_open(&echo_pid);
  rtt_start = measure(op_pingpong, &pp, 200, 100);
  rtt_p99_ns = rtt_start.p99;
  series_add(&rtt_ser, &rtt_start);
  ref_row("Unix-socket 64-byte round trip, start of the run", &rtt_start, FMT_US, 0);
  sf_open(&sf);
  for (int k = 0; k < SF_NKINDS; k++) {
    sf_ops[k] = (sf_op_t){&sf, (enum sf_kind)k};
    sf_ser[k].name = "shm floor";
    meas_t m = measure(op_shmfloor, &sf_ops[k], 100, 100);
    series_add(&sf_ser[k], &m);
    ref_row(sf_names[k], &m, FMT_US, 0);
  }
  val_big = malloc(sizes[NSIZES - 1]);
  fill_bytes(val_big, sizes[NSIZES - 1], 5);
  for (int k = 0; k < NSRV; k++)
    for (int i = 0; i < NSIZES; i++) srv_ser[k][i].name = srv_names[k];
  redis_rd.fd = mc_rd.fd = -1;
  if (!servers_wanted()) return;
  if (redis_start(&redis_srv, tmpdir)) redis_rd.fd = unix_connect(redis_srv.sock);
  if (memcached_start(&mc_srv, tmpdir)) mc_rd.fd = unix_connect(mc_srv.sock);
  if (redis_rd.fd < 0) fprintf(stderr, "kvc_bench: no redis-server: its rows are n/a\n");
  if (mc_rd.fd < 0) fprintf(stderr, "kvc_bench: no memcached: its rows are n/a\n");
  bench_servers_ref();
}

/* The round trip again at the end of the kvcached rows, and its median over
 * every trial of the run; if the end and the start differ by more than
 * RTT_DRIFT, the rows that divide by it are unreliable (table_drift). */
#define RTT_DRIFT 2.0
static meas_t rtt_end;
static void bench_rtt_end(void) {
  section("reference");
  rtt_end = measure(op_pingpong, &pp, 200, 100);
  series_add(&rtt_ser, &rtt_end);
  ref_row("Unix-socket 64-byte round trip, end of the run", &rtt_end, FMT_US, 0);
  row_t *r = row_add("Unix-socket 64-byte round trip, median over the run", BV_GOAL_NONE, 0);
  r->measured = true;
  r->fmt = FMT_TEXT;
  fmt_us(r->fig, sizeof r->fig, series_median(&rtt_ser));
  snprintf(r->ref, sizeof r->ref, "%d trials", rtt_ser.n);
}

static void table_drift(void) {
  double a = rtt_start.ns, b = rtt_end.ns;
  if (!rtt_start.ok || !rtt_end.ok || (b <= a * RTT_DRIFT && a <= b * RTT_DRIFT)) return;
  for (int i = 0; i < nrows; i++) {
    row_t *r = &rows[i];
    if (r->bv.gk == BV_GOAL_NONE || !r->measured) continue;
    for (int k = 0; k < r->bv.nparts; k++)
      if (r->ser[k] == &rtt_ser) {
        r->res.v = BV_UNRELIABLE;
        snprintf(r->res.why, sizeof r->res.why,
                 "the round trip moved from %.1f us to %.1f us over the run", a / 1e3, b / 1e3);
      }
  }
}

static void refs_stop(void) {
  if (redis_rd.fd >= 0) close(redis_rd.fd);
  if (mc_rd.fd >= 0) close(mc_rd.fd);
  stop(redis_srv.pid);
  stop(mc_srv.pid);
  close(pp.fd);
  sf_close(&sf);
  unwatch_pid(echo_pid);
  waitpid(echo_pid, NULL, 0);
}

/* ---- kvcached, one client ---------------------------------------------------- */

/* How a transfer waits, which sets the floor its time cannot beat
 * (bench_verdict.h rule 4): a blocking request needs one bare round trip
 * and one copy. A polling client needs the copy only: it never sleeps, and
 * its requests were measured at 0.3-0.8x the bare round trip, so no part of
 * that is a bound. A zero-copy read only reads the bytes: at most twice as
 * fast as a memcpy, which also writes them. */
enum xkind { X_BLOCK, X_SPIN, X_LEASE, X_SPIN_LEASE };

/* The goals of a transfer row: at 4 KiB its time over the bare round trip
 * (at most small), above its share of the limit (at least big); 0: none. */
typedef struct goals {
  double small, big;
} goals_t;
static const goals_t G_NONE = {0, 0};
/* Both sides poll (the defaults): at 4 KiB the time over the shared-memory
 * floor moving the same 4 KiB the same way (bench_floor.h). */
static const goals_t G_POLL = {1.5, 0.9};
static const goals_t G_NOPOLL = {1.3, 0};   /* polling off on both sides */

/* A row comparing a transfer of size i (m[0]) with the limit: the memcpy
 * (m[1], into the region for puts, out of it for gets) + the bare round
 * trip (m[2]), measured in alternating trials; at 4 KiB the round trip
 * itself is the reference, or, where the row has one (sfk >= 0), the
 * shared-memory floor moving the same 4 KiB the same way (m[3]), with the
 * round trip's ratio in the note. */
static void transfer_row(const char *what, int i, const meas_t *m, bool get, goals_t g,
                         enum xkind kind, const char *note, int sfk) {
  char name[64];
  snprintf(name, sizeof name, "%s %s", what, size_names[i]);
  double rtt_floor = kind == X_SPIN || kind == X_SPIN_LEASE ? 0 : 1;
  /* A zero-copy read only reads the bytes; a put streams them past the
   * caches (src/ntcopy.c), without the read for ownership a memcpy into the
   * cold region pays: either may take half a memcpy's time. */
  double mc_floor = kind == X_LEASE || kind == X_SPIN_LEASE || !get ? 0.5 : 1;
  series_add(&mc_ser[get][i], &m[1]);
  series_add(&rtt_ser, &m[2]);
  row_t *r;
  if (i == 0 && sfk >= 0) {
    series_add(&sf_ser[sfk], &m[3]);
    r = row_add(name, g.small ? BV_GOAL_MAX : BV_GOAL_NONE, g.small);
    row_fig(r, &m[0], FMT_US, 0);
    row_part(r, &m[3], 1, 1, &sf_ser[sfk]); /* nothing moves the same bytes faster */
    r->bv.fig_over_ref = true;
    snprintf(r->ref, sizeof r->ref, "shm floor");
    char rtt[40];
    snprintf(rtt, sizeof rtt, "%.3fx RTT %.1f us", m[0].ns / m[2].ns, m[2].ns / 1e3);
    snprintf(r->note, sizeof r->note, "%s%s%s", rtt, note ? "; " : "", note ? note : "");
    return;
  }
  if (i == 0) {
    r = row_add(name, g.small ? BV_GOAL_MAX : BV_GOAL_NONE, g.small);
    row_fig(r, &m[0], FMT_US, 0);
    row_part(r, &m[2], 1, rtt_floor, &rtt_ser);
    r->bv.fig_over_ref = true;
    snprintf(r->ref, sizeof r->ref, "RTT");
  } else {
    r = row_add(name, g.big ? BV_GOAL_MIN : BV_GOAL_NONE, g.big);
    row_fig(r, &m[0], FMT_GBS, (double)sizes[i]);
    row_part(r, &m[1], 1, mc_floor, &mc_ser[get][i]);
    row_part(r, &m[2], 1, rtt_floor, &rtt_ser);
    snprintf(r->ref, sizeof r->ref, "limit");
  }
  if (note) snprintf(r->note, sizeof r->note, "%s", note);
}

/* One transfer row: op on t (a client's transfer of size i) alternating
 * with its memcpy, the bare round trip and (sfk >= 0, at 4 KiB) the
 * shared-memory floor of kind sfk. */
static void transfer_measure_floor(kx_t *t, op_fn op, const char *what, int i, bool get,
                                   goals_t g, enum xkind kind, const char *note, int sfk) {
  mc.bytes = sizes[i];
  mc.out = get;
  if (i != 0) sfk = -1;
  const op_fn fns[4] = {op, op_memcpy, op_pingpong, op_shmfloor};
  void *const ctxs[4] = {t, &mc, &pp, sfk >= 0 ? &sf_ops[sfk] : NULL};
  meas_t m[4];
  measure_side(fns, ctxs, sfk >= 0 ? 4 : 3, TRIAL_MS, 20, m);
  if (!m[0].ok) must(t->c, -1, what);
  transfer_row(what, i, m, get, g, kind, note, sfk);
}

static void transfer_measure(kx_t *t, op_fn op, const char *what, int i, bool get, goals_t g,
                             enum xkind kind, const char *note) {
  transfer_measure_floor(t, op, what, i, get, g, kind, note, -1);
}

static int op_ping(void *p) { return kvc_ping(p); }

/* Reading again under a lease held across reads (attention over a prefix at
 * every decode step): no round trip at all. */
typedef struct held {
  kvc_lease_t *l;
  uint64_t nt, pos, span;
} held_t;

static int op_held_read(void *p) {
  held_t *hd = p;
  hd->pos = hd->pos + 2 * hd->nt > hd->span ? 0 : hd->pos + hd->nt;
  sink += read_leased(hd->l, 32, hd->pos, hd->nt);
  return 0;
}

static void bench_held_lease(kvc_client_t *c, kvc_cache_t *h) {
  for (int i = 3; i < NSIZES; i++) {
    held_t hd = {NULL, sizes[i] / TOKEN_BYTES, 0, SPAN};
    must(c, kvc_lease(h, 1, 0, SPAN, &hd.l), "lease");
    mc.bytes = sizes[i];
    mc.out = true;
    const op_fn fns[2] = {op_held_read, op_memcpy};
    void *const ctxs[2] = {&hd, &mc};
    meas_t m[2];
    measure_side(fns, ctxs, 2, TRIAL_MS, 10, m);
    must(c, kvc_lease_release(hd.l), "lease release");
    char name[64];
    snprintf(name, sizeof name, "re-read %s under a held lease", size_names[i]);
    series_add(&mc_ser[1][i], &m[1]);
    row_t *r = row_add(name, BV_GOAL_NONE, 0);
    row_fig(r, &m[0], FMT_GBS, (double)sizes[i]);
    row_part(r, &m[1], 1, 0, &mc_ser[1][i]); /* reading alone may beat a memcpy: no floor */
    snprintf(r->ref, sizeof r->ref, "memcpy out");
    snprintf(r->note, sizeof r->note, "no round trip");
  }
}

/* kvcached at 1 MiB beside Redis and memcached at 1 MiB. */
#define SRV_SIZE 3 /* sizes[3]: 1 MiB */
static void bench_vs_servers(kvc_client_t *c, kvc_cache_t *h) {
  static kv_ctx_t rk, mk;
  rk = (kv_ctx_t){.r = &redis_rd, .val = val_big, .bytes = MiB};
  mk = (kv_ctx_t){.r = &mc_rd, .val = val_big, .bytes = MiB};
  for (int get = 0; get < 2; get++) {
    kx_t t;
    kx_init(&t, c, h, 1, MiB, SPAN);
    int ids[3] = {0, get ? REDIS_GET : REDIS_SET, get ? MC_GET : MC_SET};
    op_fn fns[3] = {get ? op_get_shm : op_put_shm, get ? redis_get : redis_set,
                    get ? mc_get : mc_set};
    void *ctxs[3] = {&t, &rk, &mk};
    int n = 1;
    if (redis_rd.fd >= 0) n = 2;
    if (mc_rd.fd >= 0) {
      fns[n] = fns[2];
      ids[n] = ids[2];
      ctxs[n++] = &mk;
    }
    meas_t m[3];
    measure_side(fns, ctxs, n, TRIAL_MS, 10, m);
    if (!m[0].ok) must(c, -1, "1 MiB transfer");
    section("1 client");
    for (int k = 1; k < 3; k++) {
      int id = get ? (k == 1 ? REDIS_GET : MC_GET) : (k == 1 ? REDIS_SET : MC_SET);
      const meas_t *ref = NULL;
      for (int j = 1; j < n; j++)
        if (ids[j] == id) ref = &m[j];
      char name[64];
      snprintf(name, sizeof name, "%s 1 MiB vs %s", get ? "get" : "put", srv_names[id]);
      /* A put: 2.5x Redis and 2x memcached (this wave); a get: 2x and 1.5x. */
      double goal = get ? (k == 2 ? 1.5 : 2) : (k == 2 ? 2 : 2.5);
      row_t *r = row_add(name, BV_GOAL_MIN, goal);
      row_fig(r, &m[0], FMT_GBS, (double)MiB);
      snprintf(r->note, sizeof r->note, "direct buffer");
      if (ref) series_add(&srv_ser[id][SRV_SIZE], ref);
      row_part(r, ref, 1, 0, &srv_ser[id][SRV_SIZE]); /* Redis is no bound on kvcached */
    }
    kx_deinit(&t);
  }
}

/* The same transfers on the socket with a client that polls it (spin_us
 * 200 us, KVC_CLIENT_NO_RINGS): what polling gave before the rings. */
#define SPIN_US 200
static void bench_spin(const kd_t *d) {
  section("1 client");
  kvc_client_t *c = kc_open_with(d, 16 * MiB, SPIN_US, KVC_CLIENT_NO_RINGS);
  kvc_cache_t *h = kc_cache(c, "llama", &llama);
  static const op_fn ops[2] = {op_put_shm, op_get_shm};
  static const char *const names[2] = {"put", "get"};
  for (int i = 0; i < 4; i++)
    for (int k = 0; k < 2; k++) {
      kx_t t;
      kx_init(&t, c, h, 1, sizes[i], SPAN);
      char what[64];
      snprintf(what, sizeof what, "%s, socket, client polls %d us:", names[k], SPIN_US);
      transfer_measure(&t, ops[k], what, i, k > 0, G_NONE, X_SPIN, "KVC_CLIENT_NO_RINGS");
      kx_deinit(&t);
    }
  kvc_client_close(c);
}

/* Small requests with polling off on both sides: a daemon that never polls
 * its rings (ring_poll_us 0) and a client that sleeps at once for its reply
 * (KVC_CLIENT_NO_SPIN): every request wakes the daemon through its doorbell
 * and the client through its futex, two wakeups as on the socket; and the
 * socket itself (KVC_CLIENT_NO_RINGS). */
static void bench_nopoll(void) {
  section("1 client");
  kd_t d;
  const char *args[] = {"--pool-bytes", "256MiB", "--page-bytes", "2MiB", "--ring-poll-us", "0",
                        NULL};
  kd_start(&d, "nopoll", args);
  static const uint32_t flags[2] = {KVC_CLIENT_NO_SPIN, KVC_CLIENT_NO_SPIN | KVC_CLIENT_NO_RINGS};
  static const char *const how[2] = {"rings", "socket"};
  for (int f = 0; f < 2; f++) {
    kvc_client_t *c = kc_open_with(&d, 16 * MiB, 0, flags[f]);
    kvc_cache_t *h = kc_cache(c, "llama", &llama);
    kc_fill(h, c, 1, 256);
    for (int get = 0; get < 2; get++) {
      kx_t t;
      kx_init(&t, c, h, 1, sizes[0], 256);
      char what[64];
      snprintf(what, sizeof what, "%s direct buffer, polling off, %s:", get ? "get" : "put",
               how[f]);
      transfer_measure(&t, get ? op_get_shm : op_put_shm, what, 0, get,
                       f == 0 ? G_NOPOLL : G_NONE, X_BLOCK,
                       f == 0 ? "ring_poll_us 0, KVC_CLIENT_NO_SPIN" : "KVC_CLIENT_NO_RINGS");
      kx_deinit(&t);
    }
    kvc_client_close(c);
  }
  stop(d.pid);
}

/* Zero-copy reads of pages this client's mapping has never touched: each
 * 4 KiB page's first read is a page fault. The walk drops the mapping's
 * page-table entries (MADV_DONTNEED; the pool's pages stay) whenever it
 * starts over, so every read is a first one. */
typedef struct cold {
  kx_t t;
  const void *pool;
  uint64_t pool_bytes;
} cold_t;

static int op_lease_read_cold(void *p) {
  cold_t *cd = p;
  if (cd->t.io.pos + 4 * cd->t.io.ntokens > cd->t.span &&
      madvise((void *)cd->pool, cd->pool_bytes, MADV_DONTNEED) != 0)
    return -1;
  /* A token's row of a layer is 2 KiB: reading one token a time, the next
   * read would find half its 4 KiB pages mapped; skip a token. */
  if (cd->t.io.ntokens == 1) kx_step(&cd->t);
  return op_lease_read(&cd->t);
}

/* Reads the whole walk once: its pages warm. */
static void warm_walk(kx_t *t) {
  kvc_lease_t *l;
  must(t->c, kvc_lease(t->h, t->io.seq_id, 0, t->span, &l), "lease");
  sink += read_leased(l, 32, 0, t->span);
  must(t->c, kvc_lease_release(l), "lease release");
}

/* Zero-copy reads, warm (the default client: its mapping prefaulted after
 * the Hello, as a decode loop rereads its pages) and cold. */
static void bench_lease(const kd_t *d, kvc_client_t *c, kvc_cache_t *h) {
  uint64_t total = 0, done = kvc_client_pool_prefaulted(c, &total);
  for (int i = 0; i < 30000 && done < total; i++) { /* SCHED_IDLE: may take a while */
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
    done = kvc_client_pool_prefaulted(c, &total);
  }
  for (int i = 0; i < NSIZES; i++) {
    kx_t t;
    kx_init(&t, c, h, 1, sizes[i], SPAN);
    warm_walk(&t);
    transfer_measure_floor(&t, op_lease_read, "zero-copy read, warm pages", i, true, G_POLL,
                           X_SPIN_LEASE, i ? NULL : "release rides on the next request",
                           SF_READ);
    kx_deinit(&t);
  }
  kvc_client_t *cc = kc_open_with(d, 16 * MiB, 0, KVC_CLIENT_NO_PREFAULT);
  kvc_cache_t *ch = kc_cache(cc, "llama", &llama);
  for (int i = 0; i < NSIZES; i++) {
    static cold_t cd;
    kx_init(&cd.t, cc, ch, 1, sizes[i], SPAN);
    kvc_client_pool(cc, &cd.pool, &cd.pool_bytes);
    if (madvise((void *)cd.pool, cd.pool_bytes, MADV_DONTNEED) != 0) die("madvise");
    /* The op's context is cd, whose first member is the transfer. */
    transfer_measure(&cd.t, op_lease_read_cold, "zero-copy read, cold pages", i, true, G_NONE,
                     X_SPIN_LEASE, "every 4 KiB page's first read faults");
    kx_deinit(&cd.t);
  }
  kvc_client_close(cc);
}

static void bench_one_client(const kd_t *d) {
  section("1 client");
  kvc_client_t *c = kc_open(d, 64 * MiB);
  kvc_cache_t *h = kc_cache(c, "llama", &llama);
  kc_fill(h, c, 1, SPAN); /* 512 MiB: each size walks it, reading or overwriting */
  if (want("ping")) {
    const op_fn fns[3] = {op_ping, op_pingpong, op_shmfloor};
    void *const ctxs[3] = {c, &pp, &sf_ops[SF_EMPTY]};
    meas_t m[3];
    measure_side(fns, ctxs, 3, 100, 100, m);
    series_add(&rtt_ser, &m[1]);
    series_add(&sf_ser[SF_EMPTY], &m[2]);
    row_t *r = row_add("ping (a request with no body)", BV_GOAL_NONE, 0);
    row_fig(r, &m[0], FMT_US, 0);
    row_part(r, &m[2], 1, 1, &sf_ser[SF_EMPTY]);
    r->bv.fig_over_ref = true;
    snprintf(r->ref, sizeof r->ref, "shm floor");
    snprintf(r->note, sizeof r->note, "%.3fx RTT %.1f us; both sides poll", m[0].ns / m[1].ns,
             m[1].ns / 1e3);
  }
  static const char *const path_groups[2] = {"copy", "direct"};
  for (int p = 0; p < 2; p++) {
    if (!want(path_groups[p])) continue;
    for (int dir = 0; dir < 2; dir++)
      for (int i = 0; i < NSIZES; i++) {
        kx_t t;
        kx_init(&t, c, h, 1, sizes[i], SPAN);
        if (p == PATH_SHM) {
          void *base;
          kvc_client_shm(c, &base, NULL);
          fill_bytes(base, sizes[i], 7);
        }
        char what[48];
        snprintf(what, sizeof what, "%s %s", dir == 0 ? "put" : "get", path_names[p]);
        op_fn op = dir == 0 ? put_ops[p] : get_ops[p];
        if (p == PATH_COPY)
          transfer_measure(&t, op, what, i, dir == 1, G_NONE, X_SPIN, "2 copies by design");
        else
          transfer_measure_floor(&t, op, what, i, dir == 1, G_POLL, X_SPIN,
                                 i ? NULL : "both sides poll", dir == 1 ? SF_GET : SF_PUT);
        kx_deinit(&t);
      }
  }
  if (want("lease")) bench_lease(d, c, h);
  if (want("held")) bench_held_lease(c, h);
  if (want("servers")) bench_vs_servers(c, h);
  if (want("spin")) bench_spin(d);
  kvc_client_close(c);
  if (want("nopoll")) bench_nopoll();
}

/* ---- kvcached, 8 clients ---------------------------------------------------------- */

#define NCLIENTS 8
#define MC_TRIALS 5

/* A child: its own client and sequence; each byte on `go` starts a trial of
 * trial_ms, after which it writes its op count and elapsed ns to `done`. */
static void multi_child(const kd_t *d, int go, int done, int idx, uint64_t bytes, op_fn op) {
  place_free(); /* as the 8 threads of the reference: the whole machine */
  kvc_client_t *c = kc_open(d, 16 * MiB);
  kvc_cache_t *h = kc_cache(c, "llama", &llama);
  kc_fill(h, c, 100 + (uint64_t)idx, SPAN / 16);
  kx_t t;
  kx_init(&t, c, h, 100 + (uint64_t)idx, bytes, SPAN / 16);
  char b;
  uint64_t out[2] = {0, 0};
  if (write_full(done, out, sizeof out)) _exit(1); /* ready */
  while (read_full(go, &b, 1) == 0) {
    double t0 = now_ns(), end = t0 + TRIAL_MS * 2 * 1e6, now = t0;
    uint64_t n = 0;
    while (now < end) {
      if (op(&t) != 0) _exit(2);
      n++;
      now = now_ns();
    }
    out[0] = n;
    out[1] = (uint64_t)(now - t0);
    if (write_full(done, out, sizeof out)) _exit(1);
  }
  _exit(0);
}

/* The floor of the 8-client rows: NCLIENTS threads of this process on any
 * CPU, each making its client's own copies for as long as a client's trial:
 * the same transfers (size_shape), walking the same 256 tokens of its own
 * 16 pages of 2 MiB, between its own shared buffer and pool (shared
 * mappings, as the client's buffer and the daemon's pool), streaming for
 * puts; a zero-copy read reads the rows in place. */
#define MULTI_SPAN (SPAN / 16)
typedef struct mthread {
  pthread_t t;
  uint64_t bytes;
  int mode;   /* 0 put, 1 get, 2 read in place */
  uint8_t *buf;
  uint8_t *pages[MULTI_SPAN / FL_PAGE_TOKENS];
  double gbs; /* its rate over the trial */
} mthread_t;

/* Reads the K and V rows of tokens [pos, pos + nt) of nl layers in place,
 * as a zero-copy read does. */
static void read_in_place(uint8_t *const *pages, uint64_t pos, uint64_t nt, uint32_t nl) {
  for (uint64_t p = pos; p < pos + nt;) {
    uint64_t pt = p % FL_PAGE_TOKENS, cnt = FL_PAGE_TOKENS - pt;
    if (cnt > pos + nt - p) cnt = pos + nt - p;
    for (uint32_t l = 0; l < nl; l++) {
      const uint8_t *k = pages[p / FL_PAGE_TOKENS] + l * FL_LAYER_BYTES + pt * FL_ROW;
      fl_sink +=
          fl_read_rows(k, cnt * FL_ROW) + fl_read_rows(k + FL_PAGE_TOKENS * FL_ROW, cnt * FL_ROW);
    }
    p += cnt;
  }
}

static void *mthread_run(void *arg) {
  mthread_t *mt = arg;
  place_free();
  uint32_t nl;
  uint64_t nt, pos = 0;
  size_shape(mt->bytes, &nl, &nt);
  double t0 = now_ns(), end = t0 + TRIAL_MS * 2 * 1e6, now = t0;
  uint64_t n = 0;
  while (now < end) {
    pos += nt; /* as kx_step */
    if (pos + nt > MULTI_SPAN) pos = 0;
    if (mt->mode < 2) copy_xfer(mt->pages, pos, nt, nl, 0, nl, mt->buf, mt->mode == 1);
    else read_in_place(mt->pages, pos, nt, nl);
    n++;
    now = now_ns();
  }
  mt->gbs = (double)n * (double)mt->bytes / (now - t0);
  return NULL;
}

static uint8_t *mpool, *mbuf[NCLIENTS];

/* Client i's pages, in the pool of the floors' trials (16 of 2 MiB each). */
static void mpages(unsigned i, uint8_t **pages) {
  for (uint64_t k = 0; k < MULTI_SPAN / FL_PAGE_TOKENS; k++)
    pages[k] = mpool + ((uint64_t)i * (MULTI_SPAN / FL_PAGE_TOKENS) + k) * FL_PAGE_BYTES;
}

/* One trial of the floor: the threads' total GB/s. */
static double mthreads_trial(uint64_t bytes, int mode) {
  static mthread_t mt[NCLIENTS];
  double total = 0;
  const uint64_t npages = MULTI_SPAN / FL_PAGE_TOKENS;
  if (!mpool) mpool = fl_shared(NCLIENTS * npages * FL_PAGE_BYTES);
  for (int i = 0; i < NCLIENTS; i++) {
    if (!mbuf[i]) mbuf[i] = fl_shared(sizes[NSIZES - 1]);
    mt[i] = (mthread_t){.bytes = bytes, .mode = mode, .buf = mbuf[i]};
    mpages((unsigned)i, mt[i].pages);
    if (pthread_create(&mt[i].t, NULL, mthread_run, &mt[i]) != 0) die("pthread_create");
  }
  for (int i = 0; i < NCLIENTS; i++) {
    pthread_join(mt[i].t, NULL);
    total += mt[i].gbs;
  }
  return total;
}

/* The hand-off floor of the 8-client rows: NCLIENTS processes, each asking
 * for its copies through a cache line of shared memory and waiting for the
 * answer as a client of the library does when the CPUs are crowded (a few
 * looks, then a futex), and a server of one thread a CPU (as the daemon's
 * copy threads) making each client's copies as mthread_run does, clients
 * dealt to the threads in turn; for a zero-copy read the server answers at
 * once and the client reads the rows in place. What 8 processes that each
 * wait for another's work cost on this machine with no protocol, no pool
 * and no daemon: beside the 8 threads that hand nothing off, the floor of
 * the rows' work as 8 clients do it (doc/benchmarks.md, "Floors"). */
typedef struct hslot {
  _Atomic uint32_t req, rep, waiting; /* rep == req: answered */
  uint8_t pad[64 - 3 * sizeof(uint32_t)];
} hslot_t;

typedef struct hshared {
  hslot_t s[NCLIENTS];
  _Atomic uint32_t bell, sleepers, stop; /* the server's */
} hshared_t;

typedef struct hserver {
  pthread_t t;
  unsigned me, n;
  uint64_t bytes;
  int mode;
  hshared_t *h;
} hserver_t;

static void *hserver_run(void *arg) {
  hserver_t *sv = arg;
  hshared_t *h = sv->h;
  place_free();
  uint32_t nl, seen[NCLIENTS] = {0};
  uint64_t nt, pos[NCLIENTS] = {0};
  size_shape(sv->bytes, &nl, &nt);
  uint8_t *pages[NCLIENTS][MULTI_SPAN / FL_PAGE_TOKENS];
  for (unsigned i = sv->me; i < NCLIENTS; i += sv->n) mpages(i, pages[i]);
  double idle_since = 0;
  while (!atomic_load(&h->stop)) {
    bool did = false;
    for (unsigned i = sv->me; i < NCLIENTS; i += sv->n) {
      hslot_t *sl = &h->s[i];
      uint32_t r = atomic_load_explicit(&sl->req, memory_order_acquire);
      if (r == seen[i]) continue;
      seen[i] = r;
      did = true;
      if (sv->mode < 2) {
        pos[i] += nt; /* as kx_step */
        if (pos[i] + nt > MULTI_SPAN) pos[i] = 0;
        copy_xfer(pages[i], pos[i], nt, nl, 0, nl, mbuf[i], sv->mode == 1);
      }
      atomic_store(&sl->rep, r); /* seq_cst: before the look at waiting */
      if (atomic_load(&sl->waiting)) fl_futex_wake(&sl->rep);
    }
    if (did) {
      idle_since = 0;
      continue;
    }
    fl_relax();
    double now = now_ns();
    if (idle_since == 0) idle_since = now;
    if (now - idle_since < FL_SPIN_NS) continue;
    /* Idle a while: sleep until a client rings (it looks at sleepers). */
    uint32_t b = atomic_load(&h->bell);
    atomic_fetch_add(&h->sleepers, 1);
    bool asked = false;
    for (unsigned i = sv->me; i < NCLIENTS; i += sv->n)
      asked |= atomic_load(&h->s[i].req) != seen[i];
    if (!asked && !atomic_load(&h->stop)) fl_futex_wait(&h->bell, b);
    atomic_fetch_sub(&h->sleepers, 1);
    idle_since = 0;
  }
  return NULL;
}

/* A client of the hand-off floor, in its own process: asks, waits, and for
 * a zero-copy read reads its rows, for as long as a client's trial. */
static void hclient(hshared_t *h, unsigned i, uint64_t bytes, int mode, int out) {
  place_free();
  hslot_t *sl = &h->s[i];
  uint32_t nl, r = atomic_load(&sl->req);
  uint64_t nt, pos = 0, n = 0;
  size_shape(bytes, &nl, &nt);
  uint8_t *pages[MULTI_SPAN / FL_PAGE_TOKENS];
  mpages(i, pages);
  double t0 = now_ns(), end = t0 + TRIAL_MS * 2 * 1e6, now = t0;
  while (now < end) {
    atomic_store(&sl->req, ++r); /* seq_cst: before the look at sleepers */
    if (atomic_load(&h->sleepers)) {
      atomic_fetch_add(&h->bell, 1);
      fl_futex_wake(&h->bell);
    }
    for (int k = 0; k < 64 && atomic_load_explicit(&sl->rep, memory_order_acquire) != r; k++)
      fl_relax();
    while (atomic_load(&sl->rep) != r) {
      atomic_store(&sl->waiting, 1);
      if (atomic_load(&sl->rep) != r) fl_futex_wait(&sl->rep, r - 1);
      atomic_store(&sl->waiting, 0);
    }
    if (mode == 2) {
      pos += nt;
      if (pos + nt > MULTI_SPAN) pos = 0;
      read_in_place(pages, pos, nt, nl);
    }
    n++;
    now = now_ns();
  }
  uint64_t res[2] = {n, (uint64_t)(now - t0)};
  _exit(write_full(out, res, sizeof res) ? 1 : 0);
}

/* One trial of the hand-off floor: the clients' total GB/s. */
static double mhandoff_trial(uint64_t bytes, int mode) {
  static hshared_t *h;
  static hserver_t sv[NCLIENTS];
  if (!h) {
    h = mmap(NULL, sizeof *h, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (h == MAP_FAILED) die("mmap: %s", strerror(errno));
  }
  memset(h, 0, sizeof *h);
  unsigned nsv = (unsigned)sysconf(_SC_NPROCESSORS_ONLN); /* as place_free: every CPU */
  if (nsv > NCLIENTS) nsv = NCLIENTS;
  for (unsigned t = 0; t < nsv; t++) {
    sv[t] = (hserver_t){.me = t, .n = nsv, .bytes = bytes, .mode = mode, .h = h};
    if (pthread_create(&sv[t].t, NULL, hserver_run, &sv[t]) != 0) die("pthread_create");
  }
  int p[2];
  if (pipe(p)) die("pipe: %s", strerror(errno));
  pid_t pids[NCLIENTS];
  for (unsigned i = 0; i < NCLIENTS; i++) {
    fflush(NULL);
    if ((pids[i] = fork()) == 0) {
      close(p[0]);
      hclient(h, i, bytes, mode, p[1]);
    }
    if (pids[i] < 0) die("fork: %s", strerror(errno));
  }
  close(p[1]);
  double total = 0;
  for (unsigned i = 0; i < NCLIENTS; i++) {
    uint64_t res[2];
    if (read_full(p[0], res, sizeof res)) die("a client of the hand-off floor failed");
    total += (double)res[0] * (double)bytes / (double)res[1];
  }
  close(p[0]);
  for (unsigned i = 0; i < NCLIENTS; i++) waitpid(pids[i], NULL, 0);
  atomic_store(&h->stop, 1);
  atomic_fetch_add(&h->bell, 1);
  fl_futex_wake(&h->bell);
  for (unsigned t = 0; t < nsv; t++) pthread_join(sv[t].t, NULL);
  return total;
}

/* The median totals over MC_TRIALS trials, GB/s, of the 8 clients, of the
 * 8 threads' memcpy and of the hand-off floor, in alternating trials; lo
 * and hi: the clients' extremes. */
static double multi_run(const kd_t *d, uint64_t bytes, op_fn op, int mode, double *ref,
                        double *handoff, double *lo, double *hi) {
  int go[NCLIENTS], done[NCLIENTS];
  pid_t pids[NCLIENTS];
  for (int i = 0; i < NCLIENTS; i++) {
    int a[2], b[2];
    if (pipe(a) || pipe(b)) die("pipe: %s", strerror(errno));
    fflush(NULL);
    pids[i] = fork();
    if (pids[i] == 0) {
      close(a[1]);
      close(b[0]);
      for (int j = 0; j < i; j++) { /* or an earlier child never sees EOF */
        close(go[j]);
        close(done[j]);
      }
      multi_child(d, a[0], b[1], i, bytes, op);
    }
    close(a[0]);
    close(b[1]);
    go[i] = a[1];
    done[i] = b[0];
  }
  uint64_t res[2];
  for (int i = 0; i < NCLIENTS; i++)
    if (read_full(done[i], res, sizeof res)) die("a client of the 8-client run failed");
  double bw[MC_TRIALS], mbw[MC_TRIALS], hbw[MC_TRIALS];
  for (int t = 0; t < MC_TRIALS; t++) {
    for (int i = 0; i < NCLIENTS; i++) write_full(go[i], "g", 1);
    bw[t] = 0;
    for (int i = 0; i < NCLIENTS; i++) {
      if (read_full(done[i], res, sizeof res)) die("a client of the 8-client run failed");
      bw[t] += (double)res[0] * (double)bytes / (double)res[1];
    }
    mbw[t] = mthreads_trial(bytes, mode);
    hbw[t] = mhandoff_trial(bytes, mode);
  }
  for (int i = 0; i < NCLIENTS; i++) {
    close(go[i]);
    close(done[i]);
    waitpid(pids[i], NULL, 0);
  }
  double med = quantile(bw, MC_TRIALS, 0.5); /* sorts bw */
  *lo = bw[0];
  *hi = bw[MC_TRIALS - 1];
  *ref = quantile(mbw, MC_TRIALS, 0.5);
  *handoff = quantile(hbw, MC_TRIALS, 0.5);
  return med;
}

/* A flooder runs at nice 19 on the clients' CPU: what the rows measure is
 * what its requests cost the daemon's other clients, not how often the
 * flooder's own process preempts the measuring one on their shared CPU (no
 * daemon can prevent that). */
static void flooder_nice(void) {
  errno = 0;
  if (nice(19) == -1 && errno) _exit(7);
}

/* A child putting (or getting) 4 MiB blocks in a loop until killed; says
 * when it starts. */
static pid_t big_mover(const kd_t *d, int idx, int ready, op_fn op) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid != 0) return pid;
  flooder_nice();
  kvc_client_t *c = kc_open(d, 16 * MiB);
  kvc_cache_t *h = kc_cache(c, "llama", &llama);
  kc_fill(h, c, 200 + (uint64_t)idx, SPAN / 16);
  kx_t t;
  kx_init(&t, c, h, 200 + (uint64_t)idx, 4 * MiB, SPAN / 16);
  if (write_full(ready, "r", 1)) _exit(1);
  for (;;)
    if (op(&t) != 0) _exit(2);
}

/* ---- one client's flood beside another's small gets ------------------------------- */


/* A child matching (never attaching) the largest id count a 256 MiB buffer
 * holds, 64M ids, in a loop: the first 16 pages are cached, the rest miss. */
#define MATCH_SHM (256 * MiB)
static const kvc_layout_t match_layout = {2, 2, 32, 32, KVC_DTYPE_F32, 16};

static pid_t match_flooder(const kd_t *d, int ready) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid != 0) return pid;
  flooder_nice();
  kvc_client_t *c = kc_open(d, MATCH_SHM);
  kvc_cache_t *h = kc_cache(c, "match", &match_layout);
  uint64_t n = MATCH_SHM / 4;
  uint32_t *ids = malloc(n * 4);
  if (!ids) _exit(1);
  for (uint64_t i = 0; i < n; i++) ids[i] = (uint32_t)(i * 2654435761u);
  uint64_t nt = 256, tok = 2 * 2 * 64 * 4; /* K and V of one token, every layer */
  uint8_t *kv = calloc(nt, tok);
  if (!kv || kvc_put_tokens(h, 1, 0, nt, kv, kv + nt * tok / 2, ids)) _exit(2);
  if (write_full(ready, "r", 1)) _exit(1);
  for (;;) {
    kvc_match_t m;
    if (kvc_match(h, ids, n, &m) || m.tokens != nt) _exit(3);
  }
}

/* A child that connects, says Hello and pipelines pings (or, stats, Stats
 * requests: replies of about 18 KB) it never reads until the daemon stops
 * reading from it, then closes and starts again. */
static pid_t never_reader(const kd_t *d, int ready, bool stats) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid != 0) return pid;
  flooder_nice();
  /* Request{id 1, hello{protocol_version, shm_bytes 1 MiB}}, then
   * Request{id 2, ping{}} 256 times: frames built by hand. */
  uint8_t hello[] = {10, 0, 0, 0, 0x08, 0x01, 0x12, 0x06, 0x08, KVC_PROTOCOL_VERSION,
                     0x10, 0x80, 0x80, 0x40};
  uint8_t pings[256 * 9];
  size_t flen = stats ? 9 : 8;
  for (int i = 0; i < 256; i++)
    if (stats) /* Request{id 2, stats{}}: field 18, length-delimited, empty */
      memcpy(pings + 9 * i, (uint8_t[]){5, 0, 0, 0, 0x08, 0x02, 0x92, 0x01, 0x00}, 9);
    else
      memcpy(pings + 8 * i, (uint8_t[]){4, 0, 0, 0, 0x08, 0x02, 0x1a, 0x00}, 8);
  bool said = false;
  for (;;) {
    int fd = unix_connect(d->sock);
    if (fd < 0 || write_full(fd, hello, sizeof hello)) _exit(1);
    for (;;) {
      ssize_t k = send(fd, pings, 256 * flen, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (k > 0) continue;
      if (k < 0 && errno != EAGAIN) _exit(2);
      struct pollfd pf = {.fd = fd, .events = POLLOUT};
      if (poll(&pf, 1, 20) == 0) break; /* the daemon no longer reads */
    }
    close(fd);
    if (!said && write_full(ready, "r", 1)) _exit(1);
    said = true;
  }
}

typedef enum flood {
  FLOOD_PUTS, FLOOD_GETS, FLOOD_MATCH, FLOOD_NEVER_READ, FLOOD_STATS, NFLOODS
} flood_t;
static const char *const flood_rows[NFLOODS] = {
    "p99 of a 4 KiB get beside 7 clients putting 4 MiB",
    "p99 of a 4 KiB get beside 7 clients getting 4 MiB",
    "p99 of a 4 KiB get beside a Match of 64M token ids, looped",
    "p99 of a 4 KiB get beside 7 pipelines never read",
    "p99 of a 4 KiB get beside 16 pipelines of Stats (18 KB replies) never read"};
static const int flood_procs[NFLOODS] = {7, 7, 1, 7, 16};
#define FLOOD_MAX_PROCS 16

#define FAIR_ROUNDS 7
#define FAIR_MS 150
#define FAIR_MAX (1 << 18)
static double fair_t[2][FAIR_MAX]; /* [0]: alone, [1]: beside the flood, ns */

/* Single operation times of op for ms, appended at out[*n]. */
static void fair_sample(op_fn op, kx_t *ctx, double ms, double *out, size_t *n) {
  double end = now_ns() + ms * 1e6;
  for (double t0 = now_ns(); t0 < end && *n < FAIR_MAX;) {
    int rc = op(ctx);
    if (rc) die("a 4 KiB get beside a flood: %s: %s", kvc_err_name(rc),
                kvc_client_last_error(ctx->c));
    double t1 = now_ns();
    out[(*n)++] = t1 - t0;
    t0 = t1;
  }
}

/* The 4 KiB get's p99 alone and beside flood f, in alternating rounds: the
 * flooders stopped (SIGSTOP), then running (SIGCONT). */
static void fair_row(const kd_t *d, kx_t *t, flood_t f) {
  int ready[2];
  if (pipe(ready)) die("pipe");
  pid_t pids[FLOOD_MAX_PROCS];
  int np = flood_procs[f];
  for (int i = 0; i < np; i++)
    pids[i] = f == FLOOD_PUTS    ? big_mover(d, i, ready[1], op_put_shm)
              : f == FLOOD_GETS  ? big_mover(d, i, ready[1], op_get_shm)
              : f == FLOOD_MATCH ? match_flooder(d, ready[1])
                                 : never_reader(d, ready[1], f == FLOOD_STATS);
  char b;
  for (int i = 0; i < np; i++)
    if (read_full(ready[0], &b, 1)) die("a flooder failed");
  size_t n[2] = {0, 0}, nwarm;
  static double warm[FAIR_MAX];
  for (int r = 0; r < FAIR_ROUNDS; r++) {
    for (int i = 0; i < np; i++) kill(pids[i], SIGSTOP);
    nwarm = 0;
    fair_sample(op_get_shm, t, 10, warm, &nwarm); /* what the flood left behind */
    fair_sample(op_get_shm, t, FAIR_MS, fair_t[0], &n[0]);
    for (int i = 0; i < np; i++) kill(pids[i], SIGCONT);
    nwarm = 0;
    fair_sample(op_get_shm, t, 10, warm, &nwarm); /* the flood resumes */
    fair_sample(op_get_shm, t, FAIR_MS, fair_t[1], &n[1]);
  }
  int st = 0;
  for (int i = 0; i < np; i++) {
    if (waitpid(pids[i], &st, WNOHANG) != 0) die("a flooder of \"%s\" failed", flood_rows[f]);
    kill(pids[i], SIGKILL);
    waitpid(pids[i], NULL, 0);
  }
  close(ready[0]);
  close(ready[1]);
  double p50 = quantile(fair_t[1], n[1], 0.5), busy = quantile(fair_t[1], n[1], 0.99);
  double alone = quantile(fair_t[0], n[0], 0.99);
  double max = fair_t[1][n[1] - 1], max_alone = fair_t[0][n[0] - 1]; /* sorted */
  row_t *row = row_add(flood_rows[f], BV_GOAL_MAX, 2);
  row->fmt = FMT_TEXT;
  fmt_us(row->fig, sizeof row->fig, busy);
  snprintf(row->ref, sizeof row->ref, "alone %.1f us", alone / 1e3);
  row_values(row, busy, alone, true);
  /* A stall delays one get of a client that waits for each reply: p99 can
   * miss a few long ones, the max shows them. */
  snprintf(row->note, sizeof row->note, "p50 %.0f us, max %.2f ms, alone %.2f ms",
           p50 / 1e3, max / 1e6, max_alone / 1e6);
}

/* How long a small request waits behind another client's flood. */
static void bench_stall(const kd_t *d) {
  kvc_client_t *c = kc_open(d, 16 * MiB);
  kvc_cache_t *h = kc_cache(c, "llama", &llama);
  kx_t t;
  kc_fill(h, c, 1, SPAN / 16);
  kx_init(&t, c, h, 1, 4 * KiB, SPAN / 16);
  for (int f = 0; f < NFLOODS; f++) fair_row(d, &t, (flood_t)f);
  kx_deinit(&t);
  kvc_client_close(c);
}

/* 8 clients at once, each moving blocks of one size through its own
 * connection, against 8 threads doing memcpy of the same blocks in the
 * same run. Both use the whole machine: the clients and this daemon run on
 * any CPU (the other rows pin them apart, to time a wakeup). */
static void bench_multi(void) {
  section("8 clients");
  kd_t d;
  const char *args[] = {"--pool-bytes", "1GiB", "--page-bytes", "2MiB", NULL};
  kd_start_on(&d, "multi", args, false);
  static const op_fn ops[3] = {op_put_shm, op_get_shm, op_lease_read};
  static const char *const names[3] = {"put direct buffer", "get direct buffer",
                                       "zero-copy read"};
  for (int k = 0; k < 3; k++)
    for (int i = 0; i < NSIZES; i++) {
      double lo, hi, ref, ho, bw = multi_run(&d, sizes[i], ops[k], k, &ref, &ho, &lo, &hi);
      char name[64];
      snprintf(name, sizeof name, "%s %s, total", names[k], size_names[i]);
      /* The goal holds where the bytes, not the requests, set the pace. */
      bool goal = k < 2 && i >= 3;
      row_t *r = row_add(name, goal ? BV_GOAL_MIN : BV_GOAL_NONE, 0.8);
      r->fmt = FMT_TEXT;
      snprintf(r->fig, sizeof r->fig, "%.2f GB/s", bw);
      snprintf(r->ref, sizeof r->ref, "8 threads, same copies %.2f GB/s", ref);
      snprintf(r->note, sizeof r->note, "trials %.1f-%.1f; hand-off floor %.2f GB/s, %.2fx", lo,
               hi, ho, bw / ho);
      row_values(r, bw, ref, true);
    }
  stop(d.pid);
}

static void bench_multi_client(const kd_t *d) {
  section("8 clients");
  if (want("stall")) bench_stall(d);
  if (want("multi")) bench_multi();
}

/* CPU seconds (user and system) of process pid so far. */
static double proc_cpu_s(pid_t pid) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  const char *p = strrchr(buf, ')'); /* after the command name */
  unsigned long long ut = 0, st = 0;
  if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
    return 0;
  return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

/* An idle daemon: a client connected through its rings, after a burst of
 * requests (the daemon polled its ring), then nothing for 10 s. */
#define IDLE_S 10
static void bench_idle(const kd_t *d) {
  section("idle");
  kvc_client_t *c = kc_open(d, 16 * MiB);
  for (int i = 0; i < 1000; i++) must(c, kvc_ping(c), "ping");
  double c0 = proc_cpu_s(d->pid), t0 = now_ns();
  struct timespec ts = {IDLE_S, 0};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
  double cpu = proc_cpu_s(d->pid) - c0, wall = (now_ns() - t0) / 1e9;
  row_t *r = row_add("idle daemon's CPU over 10 s, a ring client connected", BV_GOAL_MAX, 0.01);
  r->fmt = FMT_TEXT;
  snprintf(r->fig, sizeof r->fig, "%.3f s", cpu);
  snprintf(r->ref, sizeof r->ref, "%.1f s", wall);
  snprintf(r->note, sizeof r->note, "ratio: CPU / wall time (clock ticks)");
  row_values(r, cpu > 0 ? cpu : 1e-9, wall, true);
  kvc_client_close(c);
}

/* ---- the decode step ---------------------------------------------------------------- */

typedef struct dec {
  kvc_cache_t *h;
  kvc_io_t io[DECODE_SEQS];
  kvc_shm_io_t sio[DECODE_SEQS];
} dec_t;

static int op_dec_put_shm(void *p) {
  dec_t *d = p;
  return kvc_put_shm(d->h, NULL, d->sio, DECODE_SEQS);
}
static int op_dec_get_shm(void *p) {
  dec_t *d = p;
  return kvc_get_shm(d->h, NULL, d->sio, DECODE_SEQS);
}
static int op_dec_put_copy(void *p) {
  dec_t *d = p;
  return kvc_put_batch(d->h, NULL, d->io, DECODE_SEQS);
}
static int op_dec_get_copy(void *p) {
  dec_t *d = p;
  return kvc_get_batch(d->h, NULL, d->io, DECODE_SEQS);
}

/* Redis MSET and MGET of the decode step: every trial of the four rows. */
static series_t dec_ser[2] = {{.name = "Redis MSET"}, {.name = "Redis MGET"}};
static series_t decf_ser[2] = {{.name = "plain copy"}, {.name = "plain copy"}};

/* The decode step's floor: its own copies, token 15 of 64 sequences, every
 * layer, between a shared 8 MiB buffer and 64 pages of 2 MiB, split by
 * layers among as many threads as the daemon splits it (a share a CPU it
 * may use, doc/offload.md), streaming for the put. */
typedef struct decf {
  team_t team;
  uint8_t *pool, *buf;
  uint8_t *pages[DECODE_SEQS];
  bool get;
} decf_t;

static void decf_part(void *p, unsigned part, unsigned n) {
  decf_t *f = p;
  uint32_t l0 = (uint32_t)(32u * part / n), l1 = (uint32_t)(32u * (part + 1) / n);
  for (int i = 0; i < DECODE_SEQS; i++)
    copy_xfer(&f->pages[i], 15, 1, 32, l0, l1, f->buf + (uint64_t)i * TOKEN_BYTES, f->get);
}

static int op_decf(void *p) {
  decf_t *f = p;
  team_do(&f->team, decf_part, f);
  return 0;
}

static void decf_open(decf_t *f, bool get) {
  memset(f, 0, sizeof *f);
  f->get = get;
  f->pool = fl_shared(DECODE_SEQS * FL_PAGE_BYTES);
  f->buf = fl_shared(DECODE_BYTES);
  for (int i = 0; i < DECODE_SEQS; i++) f->pages[i] = f->pool + (uint64_t)i * FL_PAGE_BYTES;
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  team_open(&f->team, (unsigned)(cpus < 1 ? 1 : cpus));
}

static void decf_close(decf_t *f) {
  team_close(&f->team);
  munmap(f->pool, DECODE_SEQS * FL_PAGE_BYTES);
  munmap(f->buf, DECODE_BYTES);
}

static void bench_decode(const kd_t *kd) {
  section("decode step");
  kvc_client_t *c = kc_open(kd, 64 * MiB);
  kvc_cache_t *h = kc_cache(c, "llama", &llama);
  static dec_t d;
  d.h = h;
  for (int i = 0; i < DECODE_SEQS; i++) {
    kc_fill(h, c, 1000 + (uint64_t)i, 15); /* the step writes token 15 */
    d.io[i] = (kvc_io_t){.seq_id = 1000 + (uint64_t)i, .pos = 15, .ntokens = 1,
                         .k = malloc(TOKEN_BYTES / 2), .v = malloc(TOKEN_BYTES / 2)};
    fill_bytes(d.io[i].k, TOKEN_BYTES / 2, (unsigned)i);
    fill_bytes(d.io[i].v, TOKEN_BYTES / 2, (unsigned)i + 1);
    d.sio[i] = (kvc_shm_io_t){.seq_id = 1000 + (uint64_t)i, .pos = 15, .ntokens = 1,
                              .k_off = (uint64_t)i * TOKEN_BYTES,
                              .v_off = (uint64_t)i * TOKEN_BYTES + TOKEN_BYTES / 2};
  }
  must(c, op_dec_put_copy(&d), "decode put");
  /* The decode step as Redis stores it: K and V of each sequence's token as
   * two keys, 128 keys of 64 KiB in one MSET, read back by one MGET. */
  uint8_t *vals[2 * DECODE_SEQS];
  for (int i = 0; i < 2 * DECODE_SEQS; i++) {
    vals[i] = malloc(TOKEN_BYTES / 2);
    fill_bytes(vals[i], TOKEN_BYTES / 2, (unsigned)i);
  }
  kv_ctx_t rk = {.r = &redis_rd, .bytes = TOKEN_BYTES / 2, .nkeys = 2 * DECODE_SEQS,
                 .vals = vals};
  if (redis_rd.fd >= 0 && redis_mset(&rk) != 0) redis_rd.fd = -1;
  struct {
    const char *name;
    op_fn fn, ref;
    bool held;
  } v[] = {{"put 64 seqs x 1 token x 32 layers, direct vs MSET", op_dec_put_shm, redis_mset, true},
           {"get 64 seqs x 1 token x 32 layers, direct vs MGET", op_dec_get_shm, redis_mget, true},
           {"put 64 seqs x 1 token x 32 layers, copy path vs MSET", op_dec_put_copy, redis_mset,
            false},
           {"get 64 seqs x 1 token x 32 layers, copy path vs MGET", op_dec_get_copy, redis_mget,
            false}};
  meas_t refs[2];
  static decf_t fl[2];
  decf_open(&fl[0], false);
  decf_open(&fl[1], true);
  for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
    /* kvcached, its plain copy, Redis: alternating trials. */
    const op_fn fns[3] = {v[i].fn, op_decf, v[i].ref};
    void *const ctxs[3] = {&d, &fl[i % 2], &rk};
    meas_t m[3] = {{0}};
    measure_side(fns, ctxs, redis_rd.fd >= 0 ? 3 : 2, TRIAL_MS, 5, m);
    if (!m[0].ok) must(c, -1, v[i].name);
    if (i < 2) refs[i] = m[2];
    section("decode step");
    series_t *ser = &dec_ser[i % 2], *fser = &decf_ser[i % 2];
    series_add(fser, &m[1]);
    if (v[i].held) {
      char name[96];
      snprintf(name, sizeof name, "%s 64 seqs x 1 token x 32 layers, direct vs plain copy",
               i % 2 ? "get" : "put");
      row_t *r = row_add(name, BV_GOAL_MIN, 0.8);
      row_fig(r, &m[0], FMT_GBS, (double)DECODE_BYTES);
      row_part(r, &m[1], 1, 1, fser);
      snprintf(r->ref, sizeof r->ref, "floor");
      snprintf(r->note, sizeof r->note, "the same runs, %u threads%s", fl[i % 2].team.n,
               i % 2 ? "" : ", streaming");
    }
    series_add(ser, &m[2]);
    row_t *r = row_add(v[i].name, v[i].held ? BV_GOAL_MIN : BV_GOAL_NONE, 4);
    row_fig(r, &m[0], FMT_GBS, (double)DECODE_BYTES);
    row_part(r, redis_rd.fd >= 0 ? &m[2] : NULL, 1, 0, ser);
    snprintf(r->note, sizeof r->note, v[i].held ? "the peers' row" : "2 copies by design");
  }
  decf_close(&fl[0]);
  decf_close(&fl[1]);
  section("reference");
  for (int i = 0; i < 2 && redis_rd.fd >= 0; i++)
    ref_row(i ? "Redis MGET 128 x 64 KiB (decode step, first row's trials)"
              : "Redis MSET 128 x 64 KiB (decode step, first row's trials)",
            &refs[i], FMT_GBS, (double)DECODE_BYTES);
  for (int i = 0; i < 2 * DECODE_SEQS; i++) free(vals[i]);
  for (int i = 0; i < DECODE_SEQS; i++) {
    free(d.io[i].k);
    free(d.io[i].v);
  }
  kvc_client_close(c);
}

/* ---- the decode step in one request (issue decode-step) ------------------------------ */

/* 64 sequences x 1 new token x 32 layers over a 2,000-token history each. The
 * heads are small (one KV head of 16 dims, f16: 2 KiB a token) so that the
 * 64 histories (256 MiB) fit the bench's pool; the step's cost is its round
 * trips and its bookkeeping, not its bytes (128 KiB a step). */
#define STEP_SEQS 64
#define STEP_HIST 2000
static const kvc_layout_t step_layout = {32, 1, 16, 16, KVC_DTYPE_F16, 1024}; /* 2 MiB pages */

typedef struct stepb {
  kvc_cache_t *h;
  kvc_shm_io_t sio[STEP_SEQS];
  kvc_hist_span_t spans[STEP_SEQS];
  kvc_lease_t *leases[STEP_SEQS];
  uint64_t out_off, out_len;
} stepb_t;

/* Today's best: one batched put, then a lease per sequence (65 requests);
 * each lease released with the next request. */
static int op_step_today(void *p) {
  stepb_t *s = p;
  int rc = kvc_put_shm(s->h, NULL, s->sio, STEP_SEQS);
  for (int i = 0; rc == 0 && i < STEP_SEQS; i++) {
    kvc_lease_t *l;
    rc = kvc_lease(s->h, s->sio[i].seq_id, 0, STEP_HIST + 1, &l);
    if (rc == 0) rc = kvc_lease_release_later(l);
  }
  return rc;
}

/* The step request: the put and every sequence's lease in one request. */
static int op_step_one(void *p) {
  stepb_t *s = p;
  kvc_step_t st = {.view = KVC_VIEW_LEASE, .no_mask = true, .out_off = s->out_off,
                   .out_len = s->out_len, .spans = s->spans, .spans_cap = STEP_SEQS,
                   .leases = s->leases, .leases_cap = STEP_SEQS};
  int rc = kvc_step(s->h, NULL, s->sio, STEP_SEQS, &st);
  for (int i = 0; rc == 0 && i < STEP_SEQS; i++) rc = kvc_lease_release_later(s->leases[i]);
  return rc;
}

/* One run of the step rows on kd with a client of flags (0: both sides
 * poll, as by default). */
static void step_rows(const kd_t *kd, uint32_t flags, bool polling) {
  section("step");
  kvc_client_t *c = kc_open_with(kd, 64 * MiB, 0, flags);
  kvc_cache_t *h = kc_cache(c, "step", &step_layout);
  static stepb_t s;
  s.h = h;
  void *base;
  uint64_t cap, kb, vb;
  kvc_client_shm(c, &base, &cap);
  must(c, kvc_xfer_bytes(h, NULL, true, STEP_HIST, &kb, &vb, NULL), "step sizes");
  fill_bytes(base, kb + vb, 7);
  for (uint64_t i = 0; i < STEP_SEQS; i++) {
    kvc_shm_io_t e = {.seq_id = 5000 + i, .pos = 0, .ntokens = STEP_HIST, .k_off = 0,
                      .v_off = kb};
    must(c, kvc_put_shm(h, NULL, &e, 1), "step history");
  }
  must(c, kvc_xfer_bytes(h, NULL, true, 1, &kb, &vb, NULL), "step sizes");
  for (uint64_t i = 0; i < STEP_SEQS; i++) /* token STEP_HIST of each, rewritten each step */
    s.sio[i] = (kvc_shm_io_t){.seq_id = 5000 + i, .pos = STEP_HIST, .ntokens = 1,
                              .k_off = i * (kb + vb), .v_off = i * (kb + vb) + kb};
  s.out_off = STEP_SEQS * (kb + vb);
  s.out_len = cap - s.out_off;
  must(c, op_step_today(&s), "step today");
  const op_fn fns[2] = {op_step_one, op_step_today};
  void *const ctxs[2] = {&s, &s};
  meas_t m[2] = {{0}};
  measure_side(fns, ctxs, 2, TRIAL_MS, 5, m);
  if (!m[0].ok || !m[1].ok) must(c, -1, "decode step");
  /* The ratio is today's time over the step's: how many times faster. With
   * both sides polling a request costs ~2 us and no wakeup, so the 64 saved
   * are worth little beside the step's own work (informational); with
   * polling off each costs two wakeups, the decode step's cost the issue
   * measured (the goal). */
  row_t *r = row_add(polling ? "64 x 1 token x 32 layers, 2k history, both sides poll: "
                               "kvc_step vs put + 64 leases"
                             : "64 x 1 token x 32 layers, 2k history, polling off: "
                               "kvc_step vs put + 64 leases",
                     polling ? BV_GOAL_NONE : BV_GOAL_MIN, 2);
  row_fig(r, &m[0], FMT_US, 0);
  row_part(r, &m[1], 1, 0, NULL);
  snprintf(r->note, sizeof r->note, "requests per step: 1 vs %d", 1 + STEP_SEQS);
  kvc_client_close(c);
}

static void bench_step(const kd_t *kd) {
  step_rows(kd, 0, true);
  kd_t d;
  const char *args[] = {"--pool-bytes", "1GiB", "--page-bytes", "2MiB", "--ring-poll-us", "0",
                        NULL};
  kd_start(&d, "step-nopoll", args);
  step_rows(&d, KVC_CLIENT_NO_SPIN, false);
  stop(d.pid);
}

/* ---- copy_prefix ------------------------------------------------------------------- */

#define PREFIX_TOKENS 32768ull

static void bench_copy_prefix(void) {
  section("copy_prefix");
  kd_t d;
  char pool[32];
  snprintf(pool, sizeof pool, "%llu", (PREFIX_TOKENS / 16 + 8) * 2 * MiB);
  const char *args[] = {"--pool-bytes", pool, "--page-bytes", "2MiB", NULL};
  kd_start(&d, "prefix", args);
  kvc_client_t *c = kc_open(&d, 64 * MiB);
  kvc_cache_t *h = kc_cache(c, "llama", &llama);
  kc_fill(h, c, 1, PREFIX_TOKENS);
  static const uint64_t ns_[3] = {1024, 8192, PREFIX_TOKENS};
  for (int k = 0; k < 3; k++) {
    /* Alternating trials: one copy_prefix, then copying the bytes (2 MiB
     * pages from one half of the region into the other, as a copy of every
     * page would). */
    uint64_t npages = ns_[k] * TOKEN_BYTES / (2 * MiB), half = REGION_BYTES / 2 / (2 * MiB);
    meas_t cp = {.ok = true}, mcp = {.ok = true};
    for (int r = 0; r < TRIALS; r++) {
      double w0 = run_delay_ns(), t0 = now_ns();
      must(c, kvc_seq_copy_prefix(h, 1, 2, ns_[k]), "copy_prefix");
      cp.tr[r] = now_ns() - t0;
      cp.wait[r] = (run_delay_ns() - w0) / cp.tr[r];
      must(c, kvc_seq_remove(h, 2, 0, UINT64_MAX), "remove");
      t0 = now_ns();
      for (uint64_t p = 0; p < npages; p++)
        memcpy(mc.region + REGION_BYTES / 2 + (p % half) * 2 * MiB,
               mc.region + (p % half) * 2 * MiB, 2 * MiB);
      mcp.tr[r] = now_ns() - t0;
    }
    char name[96];
    snprintf(name, sizeof name, "copy_prefix %lluk tokens (%llu MiB) vs memcpy",
             (unsigned long long)ns_[k] / 1024,
             (unsigned long long)(ns_[k] * TOKEN_BYTES / MiB));
    row_t *r = row_add(name, k == 2 ? BV_GOAL_MIN : BV_GOAL_NONE, 100);
    row_fig(r, &cp, FMT_US, 0);
    row_part(r, &mcp, 1, 0, NULL);
    snprintf(r->note, sizeof r->note, "one round trip included");
  }
  kvc_client_close(c);
  stop(d.pid);
}

/* ---- compact formats --------------------------------------------------------------- */

#define FMT_SPAN 2048 /* tokens each walk covers: 256 MiB of bf16 */

/* Tokens of a layout one GiB of pool holds: whole pages of the cache's own
 * size, as the daemon reports it (arenas: no padding between pages). */
static double tokens_per_gib(kvc_client_t *c, const char *name) {
  kvc_cache_info_t ci[8];
  size_t n;
  must(c, kvc_cache_list(c, ci, 8, &n), "cache list");
  for (size_t i = 0; i < n && i < 8; i++)
    if (strcmp(ci[i].name, name) == 0)
      return (double)(GiB / ci[i].page_bytes) * ci[i].layout.page_tokens;
  die("no cache %s", name);
}

/* A transfer row of the formats: fig against ref in alternating trials. */
static void fmt_pair(kx_t *fig, op_fn ffn, kx_t *ref, op_fn rfn, const char *name,
                     bv_goal_t gk, double goal, bool fig_over_ref, const char *note) {
  const op_fn fns[2] = {ffn, rfn};
  void *const ctxs[2] = {fig, ref};
  meas_t m[2];
  measure_side(fns, ctxs, 2, TRIAL_MS, 20, m);
  if (!m[0].ok || !m[1].ok) must(fig->c, -1, name);
  row_t *r = row_add(name, gk, goal);
  row_fig(r, &m[0], FMT_GBS, (double)MiB);
  row_part(r, &m[1], 1, 0, NULL);
  r->bv.fig_over_ref = fig_over_ref;
  snprintf(r->ref, sizeof r->ref, "bf16 cache");
  snprintf(r->note, sizeof r->note, "%s", note);
}

/* bf16 beside fp8, q8_0 and q4_0: tokens a GiB holds, 1 MiB of bf16 put
 * into and got from an fp8 (and a q8_0) cache, converted in the daemon's
 * copy, against the same bf16 bytes in a bf16 cache, and 1 MiB of fp8 codes
 * as given against 1 MiB of bf16 (per byte). Direct-buffer transfers, as
 * the headline rows. */
static void bench_formats(void) {
  section("formats");
  kd_t d;
  const char *args[] = {"--pool-bytes", "1GiB", NULL};
  kd_start(&d, "formats", args);
  kvc_client_t *c = kc_open(&d, 64 * MiB);
  kvc_layout_t l8 = llama, l5 = llama, lq8 = llama, lq4 = llama;
  l8.dtype = KVC_DTYPE_FP8_E4M3;
  l5.dtype = KVC_DTYPE_FP8_E5M2;
  lq8.dtype = KVC_DTYPE_Q8_0;
  lq4.dtype = KVC_DTYPE_Q4_0;
  kvc_cache_t *hb = kc_cache(c, "bf16", &llama), *h8 = kc_cache(c, "fp8_e4m3", &l8);
  kvc_cache_t *hq = kc_cache(c, "q8_0", &lq8);
  kvc_cache_close(kc_cache(c, "fp8_e5m2", &l5));
  kvc_cache_close(kc_cache(c, "q4_0", &lq4));
  static const char *const held[4] = {"fp8_e4m3", "fp8_e5m2", "q8_0", "q4_0"};
  static const double goal[4] = {1.9, 1.9, 1.8, 3.2};
  double tb = tokens_per_gib(c, "bf16");
  for (int i = 0; i < 4; i++) {
    double t8 = tokens_per_gib(c, held[i]);
    char name[96];
    snprintf(name, sizeof name, "tokens held per GiB of pool: %s vs bf16", held[i]);
    row_t *r = row_add(name, BV_GOAL_MIN, goal[i]);
    row_values(r, t8, tb, true);
    r->fmt = FMT_TEXT;
    snprintf(r->fig, sizeof r->fig, "%.0f", t8);
    snprintf(r->ref, sizeof r->ref, "%.0f bf16", tb);
    snprintf(r->note, sizeof r->note, "whole pages of each cache's own size");
  }
  kc_fill(hb, c, 1, FMT_SPAN);
  kc_fill(h8, c, 1, FMT_SPAN); /* fp8 codes as given: half the bytes a token */
  void *base;
  kvc_client_shm(c, &base, NULL);
  fill_bytes(base, 4 * MiB, 7);
  kx_t b, conv, raw;
  kx_init(&b, c, hb, 1, MiB, FMT_SPAN);
  kx_init(&conv, c, h8, 1, MiB, FMT_SPAN); /* 8 tokens of bf16, converted */
  conv.x.dtype = KVC_DTYPE_BF16;
  kx_init(&raw, c, h8, 1, 2 * MiB, FMT_SPAN); /* 16 tokens: 1 MiB of codes */
  raw.sio.v_off = MiB / 2;
  fmt_pair(&conv, op_put_shm, &b, op_put_shm, "put 1 MiB bf16 into fp8 (converted)",
           BV_GOAL_MIN, 0.5, false, "e4m3, RNE, saturating");
  fmt_pair(&conv, op_get_shm, &b, op_get_shm, "get 1 MiB bf16 from fp8 (converted)",
           BV_GOAL_MIN, 0.5, false, "decoded in the copy");
  fmt_pair(&raw, op_put_shm, &b, op_put_shm, "put 1 MiB fp8 as given, time vs bf16",
           BV_GOAL_MAX, 1.1, true, "same bytes: per byte");
  fmt_pair(&raw, op_get_shm, &b, op_get_shm, "get 1 MiB fp8 as given, time vs bf16",
           BV_GOAL_MAX, 1.1, true, "same bytes: per byte");
  kx_t q;
  kc_fill(hq, c, 1, FMT_SPAN / 2); /* 17 bytes a 16 of bf16: under a bf16 fill's bytes */
  uint16_t *w = base; /* finite values: a block cache refuses NaN and inf */
  for (uint64_t i = 0; i < MiB / 2; i++) {
    float f = (float)((int)(i * 37 % 2001) - 1000) / 250.0f;
    uint32_t u;
    memcpy(&u, &f, 4);
    w[i] = (uint16_t)(u >> 16);
  }
  kx_init(&q, c, hq, 1, MiB, FMT_SPAN / 2);
  q.x.dtype = KVC_DTYPE_BF16;
  fmt_pair(&q, op_put_shm, &b, op_put_shm, "put 1 MiB bf16 into q8_0 (converted)", BV_GOAL_NONE,
           0, false, "ggml's reference rounding");
  fmt_pair(&q, op_get_shm, &b, op_get_shm, "get 1 MiB bf16 from q8_0 (converted)", BV_GOAL_NONE,
           0, false, "");
  kx_deinit(&q);
  kx_deinit(&b);
  kx_deinit(&conv);
  kx_deinit(&raw);
  kvc_client_close(c);
  stop(d.pid);
}

/* ---- steady puts into a full pool --------------------------------------------------- */

#define EV_BATCH 64    /* new sequences per put request */
#define EV_REQS 32     /* timed requests per trial: half the pool */

static const kvc_layout_t small = {2, 2, 32, 32, KVC_DTYPE_F32, 16}; /* 16 KiB pages */

static void ev_puts(kvc_cache_t *h, kvc_client_t *c, uint64_t *next, int reqs) {
  kvc_shm_io_t e[EV_BATCH];
  for (int r = 0; r < reqs; r++) {
    for (int i = 0; i < EV_BATCH; i++)
      e[i] = (kvc_shm_io_t){.seq_id = (*next)++, .pos = 0, .ntokens = 16,
                            .k_off = (uint64_t)i * 16 * KiB, .v_off = (uint64_t)i * 16 * KiB + 8 * KiB};
    must(c, kvc_put_shm(h, NULL, e, EV_BATCH), "steady put");
  }
}

static uint64_t stat_of(kvc_client_t *c, const char *name) {
  kvc_stat_t *st;
  size_t n;
  must(c, kvc_stats(c, &st, &n), "stats");
  uint64_t v = 0;
  for (size_t i = 0; i < n; i++)
    if (strcmp(st[i].name, name) == 0 && st[i].cache[0] == '\0') v = st[i].value;
  kvc_stats_free(st);
  return v;
}

static void bench_full_pool(void) {
  section("eviction");
  kd_t d;
  const char *args[] = {"--pool-bytes", "64MiB", "--page-bytes", "16KiB", NULL};
  kd_start(&d, "evict", args);
  kvc_client_t *c = kc_open(&d, 4 * MiB);
  kvc_cache_t *h = kc_cache(c, "small", &small);
  void *base;
  kvc_client_shm(c, &base, NULL);
  fill_bytes(base, 1 * MiB, 9);
  uint64_t next = 1;
  meas_t e = {.ok = true}, f = {.ok = true}; /* times per put, alternating */
  uint64_t ev0 = 0, ev = 0;
  for (int t = 0; t < TRIALS; t++) {
    must(c, kvc_cache_clear(h), "clear");
    double w0 = run_delay_ns(), t0 = now_ns();
    ev_puts(h, c, &next, EV_REQS);
    e.tr[t] = (now_ns() - t0) / EV_REQS;
    e.wait[t] = (run_delay_ns() - w0) / (e.tr[t] * EV_REQS);
    ev_puts(h, c, &next, EV_REQS); /* now the pool is full */
    ev0 = stat_of(c, "evicted_sequences_total");
    w0 = run_delay_ns();
    t0 = now_ns();
    ev_puts(h, c, &next, EV_REQS);
    f.tr[t] = (now_ns() - t0) / EV_REQS;
    f.wait[t] = (run_delay_ns() - w0) / (f.tr[t] * EV_REQS);
    ev += stat_of(c, "evicted_sequences_total") - ev0;
  }
  row_t *r = row_add("puts of 64 new 16 KiB seqs: full pool vs empty", BV_GOAL_MIN, 0.8);
  row_fig(r, &f, FMT_RATE, 0);
  row_part(r, &e, 1, 0, NULL);
  snprintf(r->ref, sizeof r->ref, "empty");
  snprintf(r->note, sizeof r->note, "%.0f evictions a put",
           (double)ev / (TRIALS * EV_REQS));
  kvc_client_close(c);
  stop(d.pid);
}

/* ---- the KV event stream (doc/events.md) ---------------------------------------------- */

/* What the subscriber child has received, in memory shared with it. */
typedef struct ev_seen {
  volatile uint64_t batches, stored, removed, gaps;
} ev_seen_t;

/* Block hashes of the events of one payload, by kind (array form). */
static void ev_count(const char *p, size_t len, ev_seen_t *seen) {
  msgpack_unpacked u;
  msgpack_unpacked_init(&u);
  if (msgpack_unpack_next(&u, p, len, NULL) == MSGPACK_UNPACK_SUCCESS &&
      u.data.type == MSGPACK_OBJECT_ARRAY && u.data.via.array.size >= 2 &&
      u.data.via.array.ptr[1].type == MSGPACK_OBJECT_ARRAY) {
    const msgpack_object_array *evs = &u.data.via.array.ptr[1].via.array;
    for (uint32_t i = 0; i < evs->size; i++) {
      const msgpack_object *e = &evs->ptr[i];
      if (e->type != MSGPACK_OBJECT_ARRAY || e->via.array.size < 2 ||
          e->via.array.ptr[0].type != MSGPACK_OBJECT_STR ||
          e->via.array.ptr[1].type != MSGPACK_OBJECT_ARRAY)
        continue;
      uint64_t n = e->via.array.ptr[1].via.array.size;
      if (e->via.array.ptr[0].via.str.size == 11) seen->stored += n; /* BlockStored */
      else seen->removed += n;                                        /* BlockRemoved */
    }
  }
  msgpack_unpacked_destroy(&u);
}

/* A subscriber as a router runs one: receives and decodes every batch. */
static pid_t ev_subscriber(const char *ep, ev_seen_t *seen, int ready) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0) die("fork: %s", strerror(errno));
  if (pid) return pid;
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  void *ctx = zmq_ctx_new(), *s = zmq_socket(ctx, ZMQ_SUB);
  int hwm = 100000;
  zmq_setsockopt(s, ZMQ_RCVHWM, &hwm, sizeof hwm);
  if (zmq_connect(s, ep) != 0 || zmq_setsockopt(s, ZMQ_SUBSCRIBE, "", 0) != 0) _exit(1);
  if (write(ready, "r", 1) != 1) _exit(1);
  uint64_t last = UINT64_MAX;
  for (;;) {
    zmq_msg_t f[3];
    for (int i = 0; i < 3; i++) {
      zmq_msg_init(&f[i]);
      if (zmq_msg_recv(&f[i], s, 0) < 0) _exit(1);
    }
    uint64_t seq = 0;
    const uint8_t *sb = zmq_msg_data(&f[1]);
    for (size_t i = 0; i < zmq_msg_size(&f[1]); i++) seq = seq << 8 | sb[i];
    if (last != UINT64_MAX && seq != last + 1) seen->gaps++;
    last = seq;
    ev_count(zmq_msg_data(&f[2]), zmq_msg_size(&f[2]), seen);
    seen->batches++;
    for (int i = 0; i < 3; i++) zmq_msg_close(&f[i]);
  }
}

/* One put of `pages` whole pages of new token ids to a new sequence (and,
 * with attach, an attach of a second one to the same prompt): every page
 * is indexed, and the full pool reclaims earlier ones. */
typedef struct evput {
  kvc_client_t *c;
  kvc_cache_t *h;
  uint64_t pages, tokens, seq, next_tok;
  uint64_t kb, vb;      /* bytes of K and V of the put */
  bool attach;
} evput_t;

static int op_ev_put(void *p) {
  evput_t *e = p;
  uint8_t *base;
  void *b;
  kvc_client_shm(e->c, &b, NULL);
  base = b;
  uint32_t *ids = (uint32_t *)(void *)(base + e->kb + e->vb);
  for (uint64_t i = 0; i < e->tokens; i++) ids[i] = (uint32_t)(e->next_tok++ % 4000000000u);
  kvc_shm_io_t io = {.seq_id = ++e->seq, .pos = 0, .ntokens = e->tokens, .k_off = 0,
                     .v_off = e->kb, .tok_off = e->kb + e->vb, .tok_len = 4 * e->tokens};
  int rc = kvc_put_shm(e->h, NULL, &io, 1);
  if (rc || !e->attach) return rc;
  kvc_match_t m;
  if ((rc = kvc_attach(e->h, ++e->seq, ids, e->tokens, false, &m))) return rc;
  return m.pages == e->pages ? 0 : -1;
}

static void evput_init(evput_t *e, const kd_t *d, const kvc_layout_t *l, uint64_t pages,
                       bool attach, uint64_t tok0) {
  memset(e, 0, sizeof *e);
  e->c = kc_open(d, 64 * MiB);
  e->h = kc_cache(e->c, attach ? "ev-prefix" : "ev-put", l);
  e->pages = pages;
  e->tokens = pages * l->page_tokens;
  e->attach = attach;
  e->next_tok = tok0;
  must(e->c, kvc_xfer_bytes(e->h, NULL, true, e->tokens, &e->kb, &e->vb, NULL), "sizes");
  void *base;
  kvc_client_shm(e->c, &base, NULL);
  fill_bytes(base, e->kb + e->vb, 11);
}

static void bench_events(void) {
  section("events");
  char ep[128], rp[128];
  snprintf(ep, sizeof ep, "ipc://%s/events", tmpdir);
  snprintf(rp, sizeof rp, "ipc://%s/replay", tmpdir);
  kd_t on, off;
  const char *on_args[] = {"--pool-bytes", "256MiB", "--page-bytes", "2MiB", "--events-endpoint",
                           ep, "--events-replay-endpoint", rp, "--events-tenant", "*", NULL};
  const char *off_args[] = {"--pool-bytes", "256MiB", "--page-bytes", "2MiB", NULL};
  kd_start(&on, "events-on", on_args);
  kd_start(&off, "events-off", off_args);
  /* What a worker pays: the log, the batch encoded, sent and kept for
   * replay, with no subscriber here (a router reads from its own machine;
   * on this one it would take a CPU from the client or the daemon). */
  static evput_t pon, poff;
  evput_init(&pon, &on, &llama, 1, false, 1);
  evput_init(&poff, &off, &llama, 1, false, 1);
  const op_fn put_fns[2] = {op_ev_put, op_ev_put};
  void *const put_ctx[2] = {&pon, &poff};
  meas_t m[2];
  measure_side(put_fns, put_ctx, 2, TRIAL_MS, 5, m);
  if (!m[0].ok || !m[1].ok) must(pon.c, -1, "put with events");
  row_t *r = row_add("put 2 MiB page with token ids: events on vs off", BV_GOAL_MIN, 0.95);
  row_fig(r, &m[0], FMT_US, 0);
  row_part(r, &m[1], 1, 0, NULL);
  snprintf(r->ref, sizeof r->ref, "off");
  snprintf(r->note, sizeof r->note, "1 page stored a put");
  /* A 1024-token prompt (64 pages of 16 KiB) put with ids, then attached:
   * 64 pages indexed and, the pool full, 64 reclaimed a round. */
  static evput_t qon, qoff;
  evput_init(&qon, &on, &small, 64, true, 2000000000);
  evput_init(&qoff, &off, &small, 64, true, 2000000000);
  void *const pre_ctx[2] = {&qon, &qoff};
  measure_side(put_fns, pre_ctx, 2, TRIAL_MS, 5, m);
  if (!m[0].ok || !m[1].ok) must(qon.c, -1, "prefix with events");
  r = row_add("put 1k-token prompt + attach it: events on vs off", BV_GOAL_MIN, 0.95);
  row_fig(r, &m[0], FMT_US, 0);
  row_part(r, &m[1], 1, 0, NULL);
  snprintf(r->ref, sizeof r->ref, "off");
  snprintf(r->note, sizeof r->note, "64 pages stored a put");
  /* The rate one subscriber keeps up with: puts of 64 new pages as fast as
   * one client goes for a second, every page stored and (the pool full)
   * one reclaimed; then what the subscriber decoded of it. */
  ev_seen_t *seen = mmap(NULL, sizeof *seen, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (seen == MAP_FAILED) die("mmap");
  memset((void *)seen, 0, sizeof *seen);
  int rd[2];
  if (pipe(rd) != 0) die("pipe");
  pid_t sub = ev_subscriber(ep, seen, rd[1]);
  char x;
  if (read(rd[0], &x, 1) != 1) die("the subscriber did not start");
  kvc_client_t *sc = kc_open(&on, 1 * MiB);
  for (int i = 0; i < 1000 && stat_of(sc, "events_subscriptions") < 1; i++) {
    struct timespec ts = {0, 10 * 1000000L};
    nanosleep(&ts, NULL);
  }
  uint64_t rec0 = stat_of(sc, "cached_reclaimed_total");
  uint64_t slow0 = stat_of(sc, "events_slow_drops_total"), b0 = stat_of(sc, "events_batches_total");
  uint64_t made = 0;
  double t0 = now_ns();
  while (now_ns() - t0 < 1e9) {
    if (op_ev_put(&qon) != 0) must(qon.c, -1, "flood");
    made += 64;
  }
  double secs = (now_ns() - t0) / 1e9;
  made += stat_of(sc, "cached_reclaimed_total") - rec0; /* stored, then removed */
  /* Waits (2 s at most) for the subscriber to have read every batch. */
  uint64_t published = stat_of(sc, "events_batches_total") - b0;
  for (int i = 0; i < 200 && seen->batches < published; i++) {
    struct timespec ts = {0, 10 * 1000000L};
    nanosleep(&ts, NULL);
  }
  uint64_t got = seen->stored + seen->removed;
  r = row_add("events one subscriber decodes a second", BV_GOAL_NONE, 0);
  row_values(r, (double)got / secs, (double)made / secs, true);
  r->fmt = FMT_TEXT;
  snprintf(r->fig, sizeof r->fig, "%.0f/s", (double)got / secs);
  snprintf(r->ref, sizeof r->ref, "%.0f/s made", (double)made / secs);
  snprintf(r->note, sizeof r->note, "pages; %llu gaps, %llu slow drops",
           (unsigned long long)seen->gaps,
           (unsigned long long)(stat_of(sc, "events_slow_drops_total") - slow0));
  kvc_client_close(pon.c), kvc_client_close(poff.c), kvc_client_close(qon.c);
  kvc_client_close(qoff.c), kvc_client_close(sc);
  kill(sub, SIGKILL);
  waitpid(sub, NULL, 0);
  close(rd[0]), close(rd[1]);
  munmap((void *)seen, sizeof *seen);
  stop(on.pid);
  stop(off.pid);
}

/* ---- scale ---------------------------------------------------------------------- */

#define SCALE_CLIENTS 256
#define SCALE_SEQS 100000
#define SCALE_TOKENS 76 /* 10 pages of 8 tokens, the last one partly filled */
static const kvc_layout_t tiny = {2, 1, 64, 64, KVC_DTYPE_BF16, 8}; /* 512 B a token, 4 KiB pages */

typedef struct small_get {
  kvc_cache_t *h;
  kvc_io_t io;
  uint8_t k[256], v[256];
} small_get_t;

static int op_small_get(void *p) {
  small_get_t *s = p;
  return kvc_get_batch(s->h, NULL, &s->io, 1);
}

static void scale_fill(kvc_client_t *c, kvc_cache_t *h) {
  void *base;
  uint64_t cap;
  kvc_client_shm(c, &base, &cap);
  const uint64_t per = SCALE_TOKENS * 256; /* K (or V) bytes of one sequence */
  fill_bytes(base, cap, 11);
  static kvc_shm_io_t e[500];
  for (uint64_t s = 0; s < SCALE_SEQS;) {
    size_t n = 0;
    while (n < 500 && s < SCALE_SEQS) {
      e[n] = (kvc_shm_io_t){.seq_id = s + 1, .pos = 0, .ntokens = SCALE_TOKENS,
                            .k_off = n * 2 * per, .v_off = n * 2 * per + per};
      n++;
      s++;
    }
    must(c, kvc_put_shm(h, NULL, e, n), "scale fill");
  }
}

/* A child keeping one parent-opened client busy with small gets. */
static pid_t busy_child(kvc_client_t *c, uint64_t seq) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid != 0) return pid;
  kvc_cache_t *h;
  if (kvc_cache_find(c, "tiny", &h) != 0) _exit(1);
  small_get_t s = {.h = h};
  s.io = (kvc_io_t){.seq_id = seq, .pos = 5, .ntokens = 1, .k = s.k, .v = s.v};
  for (;;)
    if (op_small_get(&s) != 0) _exit(0);
}

static void bench_scale(void) {
  section("scale");
  kd_t d;
  char pool[32];
  snprintf(pool, sizeof pool, "%llu", (1ull << 20) * 4 * KiB);
  /* Arenas (the default pool): 4 KiB pages in 32 MiB segments. */
  const char *args[] = {"--pool-bytes", pool, "--segment-bytes", "32MiB", "--max-connections",
                        "300", NULL};
  kd_start(&d, "scale", args);
  row_t *r = row_add("start with a pre-faulted 4 GiB pool (1M pages)", BV_GOAL_NONE, 0);
  r->measured = true;
  snprintf(r->fig, sizeof r->fig, "%.0f ms", d.start_ms);
  kvc_client_t *clients[SCALE_CLIENTS];
  clients[0] = kc_open(&d, 32 * MiB);
  kvc_cache_t *h = kc_cache(clients[0], "tiny", &tiny);
  double t0 = now_ns();
  scale_fill(clients[0], h);
  double fill_ms = (now_ns() - t0) / 1e6;
  for (int i = 1; i < SCALE_CLIENTS; i++) clients[i] = kc_open(&d, 1 * MiB);
  uint64_t conns = stat_of(clients[0], "connections_current");
  uint64_t pages = stat_of(clients[0], "pool_pages"), used = stat_of(clients[0], "pages_used");
  uint64_t meta = stat_of(clients[0], "metadata_bytes"), seqs = stat_of(clients[0], "sequences");
  uint64_t pool_bytes = stat_of(clients[0], "pool_bytes");
  uint64_t rss = proc_kb(d.pid, "VmRSS"), anon = proc_kb(d.pid, "RssAnon");

  r = row_add("connected clients / sequences / pages used", BV_GOAL_NONE, 0);
  r->measured = true;
  snprintf(r->fig, sizeof r->fig, "%" PRIu64 " / %" PRIu64 " / %" PRIu64, conns, seqs, used);
  snprintf(r->ref, sizeof r->ref, "%" PRIu64 " pages, fill %.0f ms", pages, fill_ms);
  r = row_add("metadata bytes per page", BV_GOAL_MAX, 0.01);
  snprintf(r->fig, sizeof r->fig, "%.1f B", (double)meta / (double)pages);
  snprintf(r->ref, sizeof r->ref, "page 4096 B");
  row_values(r, (double)meta, (double)pool_bytes, true);
  snprintf(r->note, sizeof r->note, "ratio: engine metadata / pool bytes");
  r = row_add("daemon RSS outside the pool", BV_GOAL_NONE, 0);
  snprintf(r->fig, sizeof r->fig, "%.1f MiB", (double)anon / 1024);
  snprintf(r->ref, sizeof r->ref, "VmRSS %.0f MiB", (double)rss / 1024);
  row_values(r, (double)anon * 1024, (double)pool_bytes, true);
  snprintf(r->note, sizeof r->note, "RssAnon / pool bytes");
  uint64_t full_pages = (uint64_t)SCALE_SEQS * ((SCALE_TOKENS + 7) / 8);
  r = row_add("pages used / pages the tokens need", BV_GOAL_MAX, 1.0);
  snprintf(r->fig, sizeof r->fig, "%" PRIu64, used);
  snprintf(r->ref, sizeof r->ref, "%" PRIu64, full_pages);
  row_values(r, (double)used, (double)full_pages, true);
  snprintf(r->note, sizeof r->note, "at most 1 partial page a sequence");

  small_get_t s = {.h = h};
  s.io = (kvc_io_t){.seq_id = 7, .pos = 5, .ntokens = 1, .k = s.k, .v = s.v};
  meas_t idle = measure(op_small_get, &s, 200, 100);
  r = row_add("p99 of a 512 B get, 255 clients idle", BV_GOAL_NONE, 0);
  snprintf(r->fig, sizeof r->fig, "%.1f us", idle.p99 / 1e3);
  snprintf(r->ref, sizeof r->ref, "bare p99 %.1f us", rtt_p99_ns / 1e3);
  row_values(r, idle.p99, rtt_p99_ns, true);
  snprintf(r->note, sizeof r->note, "p50 %.1f us", idle.p50 / 1e3);
  pid_t busy[7];
  for (int i = 0; i < 7; i++) busy[i] = busy_child(clients[1 + i], 100 + (uint64_t)i);
  meas_t load = measure(op_small_get, &s, 200, 100);
  for (int i = 0; i < 7; i++) {
    kill(busy[i], SIGKILL);
    waitpid(busy[i], NULL, 0);
  }
  r = row_add("p99 of a 512 B get, 7 other clients busy", BV_GOAL_NONE, 0);
  snprintf(r->fig, sizeof r->fig, "%.1f us", load.p99 / 1e3);
  snprintf(r->ref, sizeof r->ref, "bare p99 %.1f us", rtt_p99_ns / 1e3);
  row_values(r, load.p99, rtt_p99_ns, true);
  snprintf(r->note, sizeof r->note, "p50 %.1f us; 2 cores, 8 processes",
           load.p50 / 1e3);
  for (int i = 0; i < SCALE_CLIENTS; i++) kvc_client_close(clients[i]);
  stop(d.pid);
}

/* ---- scaling: a request's cost as the daemon's state grows 100x (issue 34) ---------- */

/* Two daemons side by side, one holding 100x the other's state, the same
 * request timed on each in alternating trials; ratio = time at the large
 * state / time at the small one, goal at most 1.3x. The pools hold 4 KiB
 * pages of the tiny layout (8 tokens a page, 512 B a token). */
#define SC_SEQ_TOKENS 80 /* a filler sequence: 10 pages */
#define SC_PROMPT 4096   /* the matched prompt: 512 pages */
#define SC_BATCH 500     /* filler sequences a put */

typedef struct sc_side {
  kd_t d;
  kvc_client_t *c;
  kvc_cache_t *h;
  uint64_t pages, next_seq;
  uint32_t next_id;      /* token ids: every page of the fill is new */
  uint32_t *prompt;
} sc_side_t;

/* Puts n filler sequences of new token ids (every page indexed). */
static void sc_put_seqs(sc_side_t *s, uint64_t n) {
  void *b;
  uint64_t cap;
  kvc_client_shm(s->c, &b, &cap);
  uint8_t *base = b;
  const uint64_t kv = SC_SEQ_TOKENS * 256; /* K (or V) bytes of one sequence */
  static kvc_shm_io_t e[SC_BATCH];
  while (n) {
    size_t k = n < SC_BATCH ? (size_t)n : SC_BATCH;
    for (size_t i = 0; i < k; i++) {
      uint64_t tok = 2 * kv + i * SC_SEQ_TOKENS * 4;
      uint32_t *ids = (uint32_t *)(void *)(base + tok);
      for (int t = 0; t < SC_SEQ_TOKENS; t++) ids[t] = s->next_id++;
      e[i] = (kvc_shm_io_t){.seq_id = s->next_seq++, .pos = 0, .ntokens = SC_SEQ_TOKENS,
                            .k_off = 0, .v_off = kv, .tok_off = tok,
                            .tok_len = 4 * SC_SEQ_TOKENS};
    }
    must(s->c, kvc_put_shm(s->h, NULL, e, k), "scaling fill");
    n -= k;
  }
}

static void sc_open(sc_side_t *s, const char *name, uint64_t pages) {
  memset(s, 0, sizeof *s);
  char pool[32];
  snprintf(pool, sizeof pool, "%" PRIu64, (uint64_t)(pages * 4 * KiB));
  /* The default pool (arenas), in 8 MiB segments: 5 and 512 of them. */
  const char *args[] = {"--pool-bytes", pool, "--segment-bytes", "8MiB", NULL};
  kd_start(&s->d, name, args);
  s->c = kc_open(&s->d, 32 * MiB);
  s->h = kc_cache(s->c, "tiny", &tiny);
  s->pages = pages;
  s->next_seq = 1;
  s->next_id = 1;
  /* The prompt first (its own ids), then fillers up to the pool. */
  s->prompt = malloc(SC_PROMPT * 4);
  if (!s->prompt) die("out of memory");
  for (uint32_t i = 0; i < SC_PROMPT; i++) s->prompt[i] = 3000000000u + i;
  void *b;
  kvc_client_shm(s->c, &b, NULL);
  memcpy((uint8_t *)b + SC_PROMPT * 512, s->prompt, SC_PROMPT * 4);
  kvc_shm_io_t e = {.seq_id = 0x7fffffff, .pos = 0, .ntokens = SC_PROMPT, .k_off = 0,
                    .v_off = SC_PROMPT * 256, .tok_off = SC_PROMPT * 512,
                    .tok_len = SC_PROMPT * 4};
  must(s->c, kvc_put_shm(s->h, NULL, &e, 1), "scaling prompt");
  sc_put_seqs(s, (pages - SC_PROMPT / 8) / (SC_SEQ_TOKENS / 8));
}

static int op_sc_match(void *p) {
  sc_side_t *s = p;
  kvc_match_t m;
  int rc = kvc_match(s->h, s->prompt, SC_PROMPT, &m);
  return rc ? rc : m.tokens == SC_PROMPT ? 0 : -1;
}

/* A put of one new 10-page sequence into the full pool: it evicts. */
static int op_sc_put(void *p) {
  sc_side_t *s = p;
  sc_put_seqs(s, 1);
  return 0;
}

static int op_sc_stats(void *p) {
  sc_side_t *s = p;
  kvc_stat_t *st;
  size_t n;
  int rc = kvc_stats(s->c, &st, &n);
  if (rc == 0) kvc_stats_free(st);
  return rc;
}

static void sc_row(const char *name, const meas_t *m, const char *note) {
  row_t *r = row_add(name, BV_GOAL_MAX, 1.3);
  row_fig(r, &m[0], FMT_US, 0);
  row_part(r, &m[1], 1, 0, NULL);
  r->bv.fig_over_ref = true;
  snprintf(r->ref, sizeof r->ref, "100x less");
  snprintf(r->note, sizeof r->note, "%s", note);
}

static void sc_close(sc_side_t *s) {
  kvc_client_close(s->c);
  stop(s->d.pid);
  free(s->prompt);
}

/* `kvcachectl stats` (the Stats request) on a daemon of n caches, a
 * sequence in each. */
static void sc_open_caches(sc_side_t *s, const char *name, int n) {
  memset(s, 0, sizeof *s);
  char maxc[16];
  snprintf(maxc, sizeof maxc, "%d", n + 8);
  const char *args[] = {"--pool-bytes", "128MiB", "--segment-bytes", "8MiB", "--max-caches",
                        maxc, NULL};
  kd_start(&s->d, name, args);
  s->c = kc_open(&s->d, 1 * MiB);
  for (int i = 0; i < n; i++) {
    char cn[32];
    snprintf(cn, sizeof cn, "c%05d", i);
    kvc_cache_t *h = kc_cache(s->c, cn, &tiny);
    kvc_shm_io_t e = {.seq_id = 1, .pos = 0, .ntokens = 8, .k_off = 0, .v_off = 8 * 256};
    must(s->c, kvc_put_shm(h, NULL, &e, 1), "scaling caches");
  }
}

static void bench_scaling(void) {
  section("scaling");
  static sc_side_t big, small_;
  sc_open(&small_, "scaling-1e4", 10240);
  sc_open(&big, "scaling-1e6", 1048576);
  const op_fn match[2] = {op_sc_match, op_sc_match}, put[2] = {op_sc_put, op_sc_put};
  void *const ctxs[2] = {&big, &small_};
  meas_t m[2];
  measure_side(match, ctxs, 2, TRIAL_MS, 20, m);
  if (!m[0].ok || !m[1].ok) must(big.c, -1, "scaling match");
  sc_row("match of a 4k-token prompt: 10^6 vs 10^4 pages indexed", m, "512 pages hit");
  measure_side(put, ctxs, 2, TRIAL_MS, 20, m);
  if (!m[0].ok || !m[1].ok) must(big.c, -1, "scaling put");
  sc_row("put of a new 10-page sequence into a full pool: 10^6 vs 10^4 pages", m,
         "with token ids: it evicts");
  sc_close(&big);
  sc_close(&small_);
  sc_open_caches(&small_, "scaling-10c", 10);
  sc_open_caches(&big, "scaling-1e4c", 10000);
  const op_fn st[2] = {op_sc_stats, op_sc_stats};
  measure_side(st, ctxs, 2, TRIAL_MS, 5, m);
  if (!m[0].ok || !m[1].ok) must(big.c, -1, "scaling stats");
  sc_row("Stats (kvcachectl stats): 10^4 vs 10 caches and sequences", m, "a sequence a cache");
  sc_close(&big);
  sc_close(&small_);
}

/* ---- the disk tier (doc/tiers.md) ---------------------------------------------------- */

#define TIER_PAGES 64                  /* a prompt read back: 64 pages, 128 MiB */
#define TIER_TOKENS (TIER_PAGES * 16)
#define TIER_POOL_PAGES 128            /* a 256 MiB pool */
#define TIER_RESTART_PROMPTS 32        /* 32 prompts of 128 MiB: 4 GiB on disk */

static uint32_t *tier_ids(uint32_t seed) {
  uint32_t *t = malloc(TIER_TOKENS * sizeof *t);
  if (!t) die("out of memory");
  for (uint32_t i = 0; i < TIER_TOKENS; i++) t[i] = seed * 1000003u + i;
  return t;
}

/* Tokens [from, ntok) of seq with ids (NULL: none), through the shared
 * buffer, at most `chunk` tokens a request. */
static void tier_put(kvc_client_t *c, kvc_cache_t *h, uint64_t seq, uint64_t from,
                     uint64_t ntok, const uint32_t *ids, uint64_t chunk) {
  void *base;
  uint64_t cap;
  kvc_client_shm(c, &base, &cap);
  uint64_t per = (cap - 64 * KiB) / TOKEN_BYTES;
  if (per > chunk) per = chunk;
  fill_bytes(base, per * TOKEN_BYTES, (unsigned)seq);
  for (uint64_t pos = from; pos < ntok; pos += per) {
    uint64_t n = ntok - pos < per ? ntok - pos : per;
    kvc_shm_io_t e = {.seq_id = seq, .pos = pos, .ntokens = n, .k_off = 0,
                      .v_off = n * TOKEN_BYTES / 2};
    if (ids) {
      e.tok_off = per * TOKEN_BYTES;
      e.tok_len = 4 * n;
      memcpy((uint8_t *)base + e.tok_off, ids + pos, 4 * n);
    }
    must(c, kvc_put_shm(h, NULL, &e, 1), "tier put");
  }
}

/* Waits until the tier has written `want` pages (60 s at most). */
static void tier_wait_writes(kvc_client_t *c, uint64_t want) {
  for (int i = 0; i < 60000 && stat_of(c, "tier_disk_writes_total") < want; i++) {
    struct timespec ts = {0, 1000000L};
    nanosleep(&ts, NULL);
  }
  if (stat_of(c, "tier_disk_writes_total") < want) die("the disk tier did not write its pages");
}

/* Sends SIGTERM and waits for the exit, however long a clean stop takes. */
static void stop_slow(pid_t pid) {
  unwatch_pid(pid);
  kill(pid, SIGTERM);
  int st;
  waitpid(pid, &st, 0);
}

/* Reads every page file of dir in turn, whole, with plain read(2), each
 * into its own slot of a region (as the tier reads each into its own pool
 * page). */
typedef struct plain_read {
  const char *dir;
  uint8_t *buf;    /* slots of `slot` bytes */
  size_t slot, nslots;
  uint64_t bytes;
} plain_read_t;

static int op_plain_read(void *p) {
  plain_read_t *pr = p;
  DIR *d = opendir(pr->dir);
  if (!d) return -1;
  pr->bytes = 0;
  struct dirent *de;
  for (size_t i = 0; (de = readdir(d)) && i < pr->nslots;) {
    size_t len = strlen(de->d_name);
    if (len < 5 || strcmp(de->d_name + len - 4, ".kvp") != 0) continue;
    int fd = openat(dirfd(d), de->d_name, O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    ssize_t n;
    uint8_t *p0 = pr->buf + i++ * pr->slot;
    for (size_t off = 0; (n = read(fd, p0 + off, pr->slot - off)) > 0; off += (size_t)n)
      pr->bytes += (uint64_t)n;
    close(fd);
  }
  closedir(d);
  return 0;
}

static void bench_tier(void) {
  section("tier");
  char dir[128], pool[32], log[160];
  snprintf(dir, sizeof dir, "%s/tier", tmpdir);
  snprintf(pool, sizeof pool, "%llu", TIER_POOL_PAGES * 2 * MiB);
  const char *args[] = {"--pool-bytes", pool, "--page-bytes", "2MiB", "--disk-dir", dir,
                        "--disk-bytes", "5GiB", NULL};
  kd_t d;
  /* Every CPU: the tier reads with a thread a CPU (two here); the client
   * only waits meanwhile. */
  spawn_any_cpu = true;
  kd_start(&d, "tier", args);
  kvc_client_t *c = kc_open(&d, 64 * MiB);
  kvc_cache_t *h = kc_cache(c, "llama", &llama);
  /* A prompt on disk: written with its ids, pushed out of memory by a
   * sequence of the whole pool without ids (16 pages a request: the
   * evicted pages wait for the write threads within 64 MiB). */
  uint32_t *ids = tier_ids(1);
  tier_put(c, h, 1, 0, TIER_TOKENS, ids, 256);
  must(c, kvc_seq_remove(h, 1, 0, UINT64_MAX), "remove");
  for (uint64_t pos = 0; pos < TIER_POOL_PAGES * 16; pos += 256) {
    tier_put(c, h, 2, pos, pos + 256, NULL, 256);
    uint64_t filled = (pos + 256) / 16, free0 = TIER_POOL_PAGES - TIER_PAGES;
    if (filled > free0) tier_wait_writes(c, filled - free0); /* what it evicted */
  }
  must(c, kvc_seq_remove(h, 2, 0, UINT64_MAX), "remove");
  /* Alternating trials: a match that reads the 64 pages back (then the
   * filler pushes them out again, untimed: they are on disk already), and a
   * plain read of the same files. */
  plain_read_t pr = {.dir = dir, .slot = 2 * MiB + 4 * KiB, .nslots = TIER_PAGES};
  pr.buf = mmap(NULL, pr.slot * pr.nslots, PROT_READ | PROT_WRITE,
                MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (pr.buf == MAP_FAILED) die("out of memory");
  madvise(pr.buf, pr.slot * pr.nslots, MADV_DONTFORK);
  meas_t fig = {.ok = true}, ref = {.ok = true};
  uint64_t file_bytes = TIER_PAGES * (2 * MiB + 4 * KiB);
  /* The CPU wait of these trials is the bench's own: the daemon's I/O
   * threads and its loop take both CPUs by design and wait for each other,
   * which says nothing of other load; other load shows in the reference's
   * trials, alternating with the tier's. */
  unwatch_pid(d.pid);
  for (int t = 0; t < TRIALS; t++) {
    kvc_match_t m;
    double w0 = run_delay_ns(), t0 = now_ns();
    must(c, kvc_match(h, ids, TIER_TOKENS, &m), "match");
    fig.tr[t] = now_ns() - t0;
    fig.wait[t] = (run_delay_ns() - w0) / fig.tr[t];
    if (m.pages != TIER_PAGES) die("tier: the match read %llu pages back, not %d",
                                   (unsigned long long)m.pages, TIER_PAGES);
    tier_put(c, h, 2, 0, TIER_POOL_PAGES * 16, NULL, 256);
    must(c, kvc_seq_remove(h, 2, 0, UINT64_MAX), "remove");
    w0 = run_delay_ns();
    t0 = now_ns();
    if (op_plain_read(&pr) != 0 || pr.bytes != file_bytes) die("tier: plain read of %s", dir);
    ref.tr[t] = now_ns() - t0;
    ref.wait[t] = (run_delay_ns() - w0) / ref.tr[t];
  }
  watch_pid(d.pid);
  row_t *r = row_add("disk tier: a match reading 64 x 2 MiB back vs read(2)", BV_GOAL_MIN, 0.8);
  row_fig(r, &fig, FMT_GBS, (double)file_bytes);
  row_part(r, &ref, 1, 0, NULL);
  snprintf(r->ref, sizeof r->ref, "read(2)");
  snprintf(r->note, sizeof r->note, "page cache, 2 CPUs; ref: 1 thread, a slot a file");
  munmap(pr.buf, pr.slot * pr.nslots);
  /* 4 GiB of prompts on disk: 32 of 64 pages (the pool, empty now, holds
   * two), each pushing out the oldest (16 pages a request, waiting for the
   * writes), then a clean stop writes the last two. */
  uint64_t w = stat_of(c, "tier_disk_writes_total");
  for (uint32_t p = 0; p < TIER_RESTART_PROMPTS; p++) {
    uint32_t *pi = tier_ids(100 + p);
    for (uint64_t pos = 0; pos < TIER_TOKENS; pos += 256) {
      tier_put(c, h, 10 + p, pos, pos + 256, pi, 256);
      if (p >= 2) tier_wait_writes(c, w += 16);
    }
    must(c, kvc_seq_remove(h, 10 + p, 0, UINT64_MAX), "remove");
    free(pi);
  }
  kvc_client_close(c);
  double s0 = now_ns();
  stop_slow(d.pid);
  double stop_ms = (now_ns() - s0) / 1e6;
  /* The restart: from spawn to the first match that hits (the oldest
   * prompt, asked again and again until the start-up scan has indexed it). */
  uint32_t *first = tier_ids(100);
  double t0 = now_ns();
  kd_start(&d, "tier2", args);
  c = kc_open(&d, 64 * MiB);
  h = kc_cache(c, "llama", &llama);
  kvc_match_t m = {0, 0, 0};
  int tries = 0;
  for (; m.pages == 0 && tries < 100000; tries++) must(c, kvc_match(h, first, TIER_TOKENS, &m), "match");
  double hit_ms = (now_ns() - t0) / 1e6;
  uint64_t loaded = stat_of(c, "tier_disk_loaded"), scanned = stat_of(c, "tier_disk_scanned");
  r = row_add("restart: start to first hit, 4 GiB on disk", BV_GOAL_NONE, 0);
  r->measured = m.pages == TIER_PAGES;
  snprintf(r->fig, sizeof r->fig, "%.0f ms", hit_ms);
  snprintf(r->ref, sizeof r->ref, "socket up %.0f ms", d.start_ms);
  snprintf(r->note, sizeof r->note, "%.1f GiB, %llu/%llu files, %d matches",
           (double)loaded * (2 * MiB + 4 * KiB) / GiB, (unsigned long long)loaded,
           (unsigned long long)scanned, tries);
  r = row_add("clean stop persisting the index", BV_GOAL_NONE, 0);
  r->measured = true;
  snprintf(r->fig, sizeof r->fig, "%.0f ms", stop_ms);
  snprintf(r->ref, sizeof r->ref, "syncfs included");
  snprintf(log, sizeof log, "%s/tier.log", tmpdir);
  snprintf(r->note, sizeof r->note, "see event=tier_persisted in tier.log");
  free(first);
  free(ids);
  kvc_client_close(c);
  stop_slow(d.pid);
  spawn_any_cpu = false;
}

/* Online resize, per GiB: a grow of 1 GiB (a segment made, backed and
 * pre-faulted on a thread, then mapped into the engine), and a shrink of
 * 1 GiB that moves 1 GiB of pages in use below the new end. */
static void bench_resize(void) {
  kd_t d;
  const char *args[] = {"--pool-bytes", "1GiB", "--page-bytes", "2MiB", NULL};
  kd_start(&d, "resize", args);
  kvc_client_t *c = kc_open(&d, 64 * MiB);
  kvc_cache_t *h = kc_cache(c, "llama", &llama);
  double grow[3], shrink[3], loop[3];
  uint64_t moved = 0;
  for (int t = 0; t < 3; t++) {
    kvc_pool_resize_t r;
    double t0 = now_ns();
    must(c, kvc_pool_resize(c, 2 * GiB, &r), "grow");
    grow[t] = now_ns() - t0;
    /* Every page in use, then the first half freed: the second half (the
     * grown segment) moves down. */
    kc_fill(h, c, 1, 8192);       /* 1 GiB: the first segment */
    kc_fill(h, c, 2, 8192);       /* 1 GiB: the grown one */
    must(c, kvc_seq_remove(h, 1, 0, UINT64_MAX), "remove");
    t0 = now_ns();
    must(c, kvc_pool_resize(c, 1 * GiB, &r), "shrink");
    shrink[t] = now_ns() - t0;
    loop[t] = (double)r.loop_us * 1e3;
    moved = r.moved_pages;
    must(c, kvc_seq_remove(h, 2, 0, UINT64_MAX), "remove");
  }
  qsort(grow, 3, sizeof grow[0], cmp_double);
  qsort(shrink, 3, sizeof shrink[0], cmp_double);
  qsort(loop, 3, sizeof loop[0], cmp_double);
  row_t *r = row_add("pool resize: grow by 1 GiB", BV_GOAL_NONE, 0);
  r->measured = true;
  snprintf(r->fig, sizeof r->fig, "%.0f ms/GiB", grow[1] / 1e6);
  snprintf(r->ref, sizeof r->ref, "%.0f-%.0f ms", grow[0] / 1e6, grow[2] / 1e6);
  snprintf(r->note, sizeof r->note, "backed, pre-faulted on a thread; median of 3");
  r = row_add("pool resize: shrink by 1 GiB, 1 GiB moved", BV_GOAL_NONE, 0);
  r->measured = true;
  snprintf(r->fig, sizeof r->fig, "%.0f ms/GiB", shrink[1] / 1e6);
  snprintf(r->ref, sizeof r->ref, "%.0f-%.0f ms", shrink[0] / 1e6, shrink[2] / 1e6);
  snprintf(r->note, sizeof r->note, "%llu pages moved; the loop held %.0f ms; median of 3",
           (unsigned long long)moved, loop[1] / 1e6);
  kvc_client_close(c);
  stop(d.pid);
}


/* ---- arenas (issue 31): the pool of segments owned by (tenant, page size) ---- */

/* A speculative-decoding pair and the Python README's layout. */
static const kvc_layout_t ar_draft = {16, 8, 64, 64, KVC_DTYPE_F16, 8};    /* 256 KiB pages */
static const kvc_layout_t ar_target = {32, 8, 128, 128, KVC_DTYPE_F16, 16}; /* 2 MiB */
static const kvc_layout_t ar_py = {2, 2, 32, 32, KVC_DTYPE_F32, 16};        /* 16 KiB */

/* Puts tokens [0, ntok) of seq through the shared buffer (its bytes as they are). */
static void ar_put(kvc_client_t *c, kvc_cache_t *h, uint64_t seq, uint64_t ntok) {
  uint64_t kb, vb;
  must(c, kvc_xfer_bytes(h, NULL, true, ntok, &kb, &vb, NULL), "xfer bytes");
  kvc_shm_io_t e = {.seq_id = seq, .pos = 0, .ntokens = ntok, .k_off = 0, .v_off = kb};
  must(c, kvc_put_shm(h, NULL, &e, 1), "arena put");
}

/* The mix filled to eviction, round robin: fraction of the pool holding
 * keys and values (bytes_used / pool_bytes), and its padding. */
static void ar_fill_mix(kvc_client_t *c, kvc_cache_t *const h[3], double *used, double *pad) {
  uint64_t pool = stat_of(c, "pool_bytes"), seq = 1;
  for (int round = 0; round < 4000; round++) {
    ar_put(c, h[0], seq, 64);  /* 4 pages of 256 KiB */
    ar_put(c, h[1], seq, 32);  /* 2 pages of 2 MiB */
    ar_put(c, h[2], seq, 64);  /* 4 pages of 16 KiB */
    seq++;
    if (seq > 8 && stat_of(c, "evicted_sequences_total") > 64) break;
  }
  *used = (double)stat_of(c, "bytes_used") / (double)pool;
  *pad = (double)stat_of(c, "bytes_padding") / (double)pool;
}

/* Sums every 8 bytes of the leased pages of seq 1 (warm): ns a pass. */
static double ar_read_leased(kvc_client_t *c, kvc_cache_t *h, uint64_t ntok, uint64_t page) {
  kvc_lease_t *l;
  must(c, kvc_lease(h, 1, 0, ntok, &l), "lease");
  const kvc_lease_info_t *li = kvc_lease_info(l);
  double best = 0;
  volatile uint64_t keep = 0;
  for (int pass = 0; pass < 4; pass++) {
    double t0 = now_ns();
    uint64_t sum = 0;
    for (uint32_t p = 0; p < li->npages; p++) {
      const uint64_t *w = li->pages[p];
      for (uint64_t i = 0; i < page / 8; i++) sum += w[i];
    }
    keep += sum;
    double t = now_ns() - t0;
    if (pass && (!best || t < best)) best = t; /* the first pass warms */
  }
  (void)keep;
  kvc_lease_release(l);
  return best;
}

static void bench_arenas(void) {
  section("arenas");
  /* 1. The mix filled to eviction: arenas against the one page size. */
  double used[2], pad[2];
  for (int legacy = 0; legacy < 2; legacy++) {
    kd_t d;
    const char *args_a[] = {"--pool-bytes", "1GiB", "--segment-bytes", "32MiB", NULL};
    const char *args_l[] = {"--pool-bytes", "1GiB", "--page-bytes", "2MiB", NULL};
    kd_start(&d, legacy ? "arenas-legacy" : "arenas-mix", legacy ? args_l : args_a);
    kvc_client_t *c = kc_open(&d, 64 * MiB);
    kvc_cache_t *h[3] = {kc_cache(c, "draft", &ar_draft), kc_cache(c, "target", &ar_target),
                         kc_cache(c, "py", &ar_py)};
    ar_fill_mix(c, h, &used[legacy], &pad[legacy]);
    kvc_client_close(c);
    stop(d.pid);
  }
  row_t *r = row_add("pool bytes holding K/V: draft + target + py filled", BV_GOAL_MIN, 0.95);
  snprintf(r->fig, sizeof r->fig, "%.3f", used[0]);
  snprintf(r->ref, sizeof r->ref, "pool");
  row_values(r, used[0], 1.0, true);
  snprintf(r->note, sizeof r->note, "padding %.2f%%; one 2 MiB page size: %.3f", 100 * pad[0],
           used[1]);

  /* 2. A lease's read of warm pages: a worker that is no admin against an
   * admin, the same pages of the same daemon. */
  kd_t d;
  const char *args[] = {"--pool-bytes", "1GiB", "--segment-bytes", "32MiB", "--allow-uids",
                        "self,root,64201", "--socket-mode", "0666", NULL};
  kd_start(&d, "arenas", args);
  if (chmod(tmpdir, 0755) != 0) die("chmod %s", tmpdir);
  int wp[2], cp[2];
  if (pipe(wp) != 0 || pipe(cp) != 0) die("pipe");
  fflush(NULL);
  pid_t w = fork();
  if (w < 0) die("fork");
  if (w == 0) { /* the worker: its own cache, its own pages, read in place on each ask */
    close(cp[1]);
    close(wp[0]);
    if (setgroups(0, NULL) != 0 || setresgid(64201, 64201, 64201) != 0 ||
        setresuid(64201, 64201, 64201) != 0)
      _exit(90);
    kvc_client_t *c = kc_open(&d, 64 * MiB);
    kvc_cache_t *h = kc_cache(c, "worker", &ar_target);
    ar_put(c, h, 1, 256); /* 16 pages: 32 MiB */
    char x;
    while (read(cp[0], &x, 1) == 1) {
      double ns = ar_read_leased(c, h, 256, 2 * MiB);
      if (write(wp[1], &ns, sizeof ns) != sizeof ns) _exit(91);
    }
    kvc_client_close(c);
    _exit(0);
  }
  close(cp[0]);
  close(wp[1]);
  kvc_client_t *c = kc_open(&d, 64 * MiB);
  kvc_cache_t *h = kc_cache(c, "admin", &ar_target);
  ar_put(c, h, 1, 256);
  /* Alternating trials, the median of each: the machine's noise hits both. */
  double wt[TRIALS], at[TRIALS];
  for (int t = 0; t < TRIALS; t++) {
    char x = 1;
    if (write(cp[1], &x, 1) != 1 || read(wp[0], &wt[t], sizeof wt[t]) != sizeof wt[t])
      die("the worker's reading");
    at[t] = ar_read_leased(c, h, 256, 2 * MiB);
  }
  close(cp[1]);
  close(wp[0]);
  int st;
  waitpid(w, &st, 0);
  qsort(wt, TRIALS, sizeof wt[0], cmp_double);
  qsort(at, TRIALS, sizeof at[0], cmp_double);
  double worker_ns = wt[TRIALS / 2], admin_ns = at[TRIALS / 2];
  r = row_add("lease read of 32 MiB warm: a worker that is no admin vs an admin", BV_GOAL_MAX,
              1.1);
  snprintf(r->fig, sizeof r->fig, "%.2f GB/s", 32.0 * MiB / worker_ns);
  snprintf(r->ref, sizeof r->ref, "%.2f GB/s", 32.0 * MiB / admin_ns);
  row_values(r, worker_ns, admin_ns, true);
  snprintf(r->note, sizeof r->note, "median of %d alternating trials (uid 64201, root)", TRIALS);
  kvc_client_close(c);
  stop(d.pid);

  /* 3. A switch of models: the target's layout fills the pool, then only
   * the draft's writes, past the pool twice over. */
  kd_t s;
  const char *sargs[] = {"--pool-bytes", "1GiB", "--segment-bytes", "32MiB", NULL};
  kd_start(&s, "arenas-switch", sargs);
  c = kc_open(&s, 64 * MiB);
  kvc_cache_t *old = kc_cache(c, "target", &ar_target), *neu = kc_cache(c, "draft", &ar_draft);
  for (uint64_t q = 1; q <= 160; q++) ar_put(c, old, q, 64); /* 8 MiB each: 1.25 GiB */
  double t_steady = 0, t_move = 0;
  uint64_t q = 1;
  /* 4. Put rate during reassignment: the draft's first 1 GiB (every
   * segment taken from the target's arena) against its second (its own). */
  double t0 = now_ns();
  for (; q <= 512; q++) ar_put(c, neu, q, 128); /* 2 MiB each: 1 GiB */
  t_move = now_ns() - t0;
  uint64_t moves = stat_of(c, "segment_moves_total");
  t0 = now_ns();
  for (; q <= 1024; q++) ar_put(c, neu, q, 128);
  t_steady = now_ns() - t0;
  kvc_cache_info_t cis[4];
  size_t nci = 0;
  must(c, kvc_cache_list(c, cis, 4, &nci), "cache list");
  uint64_t npages = 0, pbytes = 0;
  for (size_t i = 0; i < nci; i++)
    if (strcmp(cis[i].name, "draft") == 0) npages = cis[i].pages, pbytes = cis[i].page_bytes;
  double held = (double)npages * (double)pbytes / (double)stat_of(c, "pool_bytes");
  r = row_add("after a switch of models: the new layout's share of the pool", BV_GOAL_MIN, 0.9);
  snprintf(r->fig, sizeof r->fig, "%.3f", held);
  snprintf(r->ref, sizeof r->ref, "pool");
  row_values(r, held, 1.0, true);
  snprintf(r->note, sizeof r->note, "%llu pages of 256 KiB; %llu segment moves",
           (unsigned long long)npages, (unsigned long long)moves);
  r = row_add("put rate while segments move to the new layout vs steady", BV_GOAL_MIN, 0.5);
  snprintf(r->fig, sizeof r->fig, "%.0f puts/s", 512 / (t_move / 1e9));
  snprintf(r->ref, sizeof r->ref, "%.0f puts/s", 512 / (t_steady / 1e9));
  row_values(r, t_steady, t_move, true);
  snprintf(r->note, sizeof r->note, "2 MiB puts; first GiB vs second");
  kvc_client_close(c);
  stop(s.pid);
}

#include "bench_cluster.h"

/* ---- main ------------------------------------------------------------------------- */

static void machine(FILE *f) {
  char model[512] = "?", line[512];
  FILE *ci = fopen("/proc/cpuinfo", "r");
  while (ci && fgets(line, sizeof line, ci))
    if (strncmp(line, "model name", 10) == 0) {
      char *p = strchr(line, ':');
      snprintf(model, sizeof model, "%s", p ? p + 2 : line);
      model[strcspn(model, "\n")] = '\0';
      break;
    }
  if (ci) fclose(ci);
  fprintf(f, "machine: %ld vCPUs (%s), %.1f GiB RAM\n", sysconf(_SC_NPROCESSORS_ONLN), model,
          (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE) / (double)GiB);
}

static bool any_wanted(const char *const *names, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (want(names[i])) return true;
  return false;
}

int main(int argc, char **argv) {
  (void)argc;
  rows_filter = getenv("BENCH_ROWS");
  if (!any_wanted(groups, NGROUPS)) {
    fprintf(stderr, "kvc_bench: BENCH_ROWS=%s names no group of rows; the groups:", rows_filter);
    for (size_t i = 0; i < NGROUPS; i++) fprintf(stderr, " %s", groups[i]);
    fputc('\n', stderr);
    return 2;
  }
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) die("readlink /proc/self/exe");
  self[n] = '\0';
  snprintf(build_dir, sizeof build_dir, "%s", dirname(dirname(self)));
  snprintf(tmpdir, sizeof tmpdir, "/tmp/kvcbench-XXXXXX");
  if (!mkdtemp(tmpdir)) die("mkdtemp: %s", strerror(errno));
  signal(SIGPIPE, SIG_IGN);
  place_on(false);
  double t0 = now_ns();
  fprintf(stderr, "kvc_bench: %s, daemons from %s, scratch in %s\n", argv[0], build_dir, tmpdir);

  bench_references();
  static const char *const main_groups[] = {"ping", "copy", "direct", "lease", "held",
                                            "servers", "spin", "nopoll", "stall", "multi",
                                            "decode", "step", "idle"};
  if (any_wanted(main_groups, sizeof main_groups / sizeof main_groups[0])) {
    kd_t d;
    const char *args[] = {"--pool-bytes", "1GiB", "--page-bytes", "2MiB", NULL};
    kd_start(&d, "main", args);
    if (any_wanted(main_groups, 8)) bench_one_client(&d);
    bench_multi_client(&d);
    if (want("decode")) { /* on a daemon that may use every CPU, as one under systemd */
      kd_t dd;
      kd_start_on(&dd, "decode", args, false);
      bench_decode(&dd);
      stop(dd.pid);
    }
    if (want("step")) bench_step(&d);
    if (want("idle")) bench_idle(&d);
    stop(d.pid);
  }
  bench_rtt_end();
  refs_stop();
  if (want("prefix")) bench_copy_prefix();
  if (want("eviction")) bench_full_pool();
  if (want("scale")) bench_scale();
  if (want("scaling")) bench_scaling();
  if (want("tier")) {
    bench_tier();
    bench_resize();
  }
  if (want("cluster")) bench_cluster();
  if (want("events")) bench_events();
  if (want("arenas")) bench_arenas();
  if (want("formats")) bench_formats();

  table_judge();
  table_drift();
  machine(stdout);
  printf("layout: 32 layers x 8 KV heads x 128 dims, bf16, 16-token 2 MiB pages; a trial's "
         "figure is its median operation, a row's the median over %d trials of >= %d ms; "
         "compared figures are measured in alternating trials\n", TRIALS, TRIAL_MS);
  printf("placement: clients on CPU 0; kvcached, Redis, memcached and the echo process on "
         "the last CPU (every round trip wakes the other CPU)\n");
  if (rows_filter && *rows_filter) printf("rows: BENCH_ROWS=%s\n", rows_filter);
  printf("\nreferences (min-max: over the trials of each):\n\n");
  table_print(stdout, true);
  printf("\nlimit = one memcpy of the bytes into (puts) or out of (gets) a 1 GiB region + one "
         "bare Unix-socket round trip, measured in the trials alternating with the row's; "
         "ratio = reference / kvcached (bandwidth rows) or kvcached / reference (latency "
         "rows), of the medians over the kept trials; kept = trials whose reference was "
         "within %.1f-%.0fx its median over the run and whose processes waited for a CPU "
         "(cpu wait: run_delay / trial time, the median shown) at most %.0f%% of the time; "
         "doc/benchmarks.md has the rules\n\n",
         BV_BAND_LO, BV_BAND_HI, 100 * BV_WAIT_MAX);
  table_print(stdout, false);
  printf("\n(%.0f s in all)\n", (now_ns() - t0) / 1e9);
  table_summary(stdout);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
  munmap(mc.region, REGION_BYTES);
  munmap(mc.src, sizes[NSIZES - 1]);
  return 0;
}
