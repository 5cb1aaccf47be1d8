/* hard_soak.c: the verified soak. N client processes run a random mix of
 * put, get, copy_prefix, remove, pin and unpin on sequences of their own in
 * one cache, with payloads derived from (origin sequence, position, salt) so
 * that every get is checked byte for byte against a model of what the
 * sequence must hold. The pool holds a little less than the working set, so
 * eviction runs all the time: an evicted sequence reads as NOSEQ (never while
 * pinned) and its client writes it again from the model, as a worker would
 * prefill again. Reports ops/s, p50/p99/p999 latency, errors by code,
 * evictions, mismatched bytes (must be 0) and the daemon's RSS, shared memory
 * and fd count at start, after warm-up and at the end.
 *
 *   make test:   4 clients, 3 s      make check: 16 clients, 60 s
 *   make soak SOAK_CLIENTS=64 SOAK_SECONDS=600   (KVC_SOAK_CLIENTS/SECONDS)
 */
#include "hard.h"

#define SEQS 24          /* sequences per client */
#define MAXTOK 192       /* tokens per sequence at most */
#define MAXPINS 2        /* sequences a client pins at once */
#define POOL_PAGES_PER_CLIENT 72 /* a little less than the working set */
#define MAXLAT 400000    /* latency samples kept per client */

typedef struct origin {
  uint32_t seq;  /* whose pattern the token holds */
  uint32_t salt;
} origin_t;

typedef struct model {
  uint64_t len;
  bool pinned;
  origin_t tok[MAXTOK];
} model_t;

typedef struct result {
  uint64_t ops, gets_verified, mismatched_bytes, evicted_seen, rewrites;
  uint64_t errors[64]; /* by -code */
} result_t;

static kvc_layout_t lay;
static size_t row; /* floats of one token, every layer, K (= V) */

static void fill(float *k, float *v, const origin_t *o, uint64_t pos, uint64_t n) {
  size_t lrow = row / lay.num_layers;
  static float tk[1024], tv[1024];
  for (uint64_t t = 0; t < n; t++) {
    it_fill_f32(tk, tv, &lay, o[t].seq, pos + t, 1, o[t].salt);
    for (uint32_t layer = 0; layer < lay.num_layers; layer++) {
      memcpy(k + (layer * n + t) * lrow, tk + layer * lrow, lrow * 4);
      memcpy(v + (layer * n + t) * lrow, tv + layer * lrow, lrow * 4);
    }
  }
}

static uint64_t mismatches(const float *a, const float *b, size_t n) {
  uint64_t bad = 0;
  for (size_t i = 0; i < n; i++) bad += memcmp(a + i, b + i, 4) != 0 ? 4 : 0;
  return bad;
}

static float k[MAXTOK * 256], v[MAXTOK * 256], ek[MAXTOK * 256], ev[MAXTOK * 256];

/* seq was evicted (NOSEQ, or an append found it empty): it must not be
 * there, and it cannot have been pinned. Its client writes it again from the
 * model; if the pool cannot take it now, the model forgets it. */
static void evicted(kvc_cache_t *h, uint64_t seq, model_t *s, result_t *r, int *npins) {
  kvc_seq_info_t si;
  int q = kvc_seq_info(h, seq, &si);
  if (q != KVC_E_NOSEQ || s->pinned) r->errors[-KVC_E_INTERNAL]++;
  if (s->pinned) (*npins)--;
  s->pinned = false;
  r->evicted_seen++;
  if (s->len == 0) return;
  fill(k, v, s->tok, 0, s->len);
  int rc = kvc_put(h, seq, 0, s->len, k, v);
  if (rc == 0) r->rewrites++;
  else if (rc == KVC_E_FULL) s->len = 0;
  else if (-rc < 64) r->errors[-rc]++, s->len = 0;
}

static void client_main(const daemon_t *d, int id, double ms, const char *latfile, int out) {
  kvc_client_t *c = client_open_shm(d, 4u << 20);
  kvc_cache_t *h;
  if (kvc_cache_open(c, "soak", &lay, &h)) _exit(3);
  static model_t m[SEQS];
  static double lat[MAXLAT];
  size_t nlat = 0;
  result_t r = {0};
  int npins = 0;
  uint64_t x = 0x9e3779b97f4a7c15ull * (uint64_t)(id + 1), salt = 1;
  /* Prefill: the sequences start long enough for the pool to be full. */
  for (int i = 0; i < SEQS; i++) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    uint64_t seq = (uint64_t)id * 1000 + (uint64_t)i, n = 64 + (x >> 40) % 64;
    for (uint64_t t = 0; t < n; t++) m[i].tok[t] = (origin_t){(uint32_t)seq, (uint32_t)salt};
    fill(k, v, m[i].tok, 0, n);
    int rc = kvc_put(h, seq, 0, n, k, v);
    if (rc == 0) m[i].len = n, salt++;
    else if (rc != KVC_E_FULL && -rc < 64) r.errors[-rc]++;
  }
  double t0 = hard_now_ms();
  while (hard_now_ms() - t0 < ms) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    uint64_t rnd = x >> 24;
    int i = (int)(rnd % SEQS);
    uint64_t seq = (uint64_t)id * 1000 + (uint64_t)i;
    model_t *s = &m[i];
    int op = (int)((rnd >> 8) % 16), rc = 0;
    bool gone = false; /* the daemon said seq was evicted */
    double a = hard_now_ms();
    if (op < 6) { /* append */
      uint64_t n = 1 + (rnd >> 12) % 16;
      if (s->len + n > MAXTOK) n = MAXTOK - s->len;
      if (n == 0) op = 15;
      else {
        origin_t o[16];
        for (uint64_t t = 0; t < n; t++) o[t] = (origin_t){(uint32_t)seq, (uint32_t)salt};
        fill(k, v, o, s->len, n);
        rc = kvc_put(h, seq, s->len, n, k, v);
        if (rc == 0) {
          memcpy(s->tok + s->len, o, n * sizeof *o);
          s->len += n;
          salt++;
        } else if (rc == KVC_E_RANGE && s->len > 0) {
          gone = true; /* a new, empty sequence cannot take pos > 0 */
          rc = 0;
        }
      }
    } else if (op < 11) { /* get everything and verify */
      if (s->len == 0) op = 15;
      else {
        rc = kvc_get(h, seq, 0, s->len, k, v);
        if (rc == 0) {
          fill(ek, ev, s->tok, 0, s->len);
          r.mismatched_bytes += mismatches(k, ek, row * s->len) + mismatches(v, ev, row * s->len);
          r.gets_verified++;
        }
      }
    } else if (op == 11) { /* copy a prefix of another of ours */
      int j = (int)((rnd >> 12) % SEQS);
      model_t *src = &m[j];
      if (j == i || src->len == 0) op = 15;
      else {
        uint64_t n = 1 + (rnd >> 20) % src->len;
        uint64_t src_seq = (uint64_t)id * 1000 + (uint64_t)j;
        rc = kvc_seq_copy_prefix(h, src_seq, seq, n);
        if (rc == 0) {
          memcpy(s->tok, src->tok, n * sizeof *s->tok);
          s->len = n; /* pins of dst stay */
        } else if (rc == KVC_E_NOSEQ) {
          evicted(h, src_seq, src, &r, &npins); /* the source was evicted */
          rc = 0;
        }
      }
    } else if (op == 12) { /* truncate */
      if (s->len == 0) op = 15;
      else {
        uint64_t b = (rnd >> 12) % s->len;
        rc = kvc_seq_remove(h, seq, b, UINT64_MAX);
        if (rc == 0) {
          s->len = b;
          if (b == 0 && s->pinned) s->pinned = false, npins--; /* dropped with its pins */
        }
      }
    } else if (op == 13) { /* pin a few at a time, so most of the pool stays evictable */
      if (s->len == 0 || s->pinned || npins >= MAXPINS) op = 15;
      else if ((rc = kvc_seq_pin(h, seq)) == 0) s->pinned = true, npins++;
    } else if (op == 14) {
      if (!s->pinned) op = 15;
      else if ((rc = kvc_seq_unpin(h, seq)) == 0) s->pinned = false, npins--;
    }
    if (op == 15) rc = kvc_ping(c);
    if (nlat < MAXLAT) lat[nlat++] = hard_now_ms() - a;
    r.ops++;
    if (rc == KVC_E_NOSEQ || gone) {
      evicted(h, seq, s, &r, &npins);
    } else if (rc < 0 && -rc < 64) {
      r.errors[-rc]++;
    }
  }
  FILE *f = fopen(latfile, "wb");
  if (!f || fwrite(lat, sizeof *lat, nlat, f) != nlat || fclose(f)) _exit(8);
  if (write(out, &r, sizeof r) != (ssize_t)sizeof r) _exit(9);
  kvc_client_close(c);
  _exit(0);
}

static uint64_t env_u64(const char *name, uint64_t def) {
  const char *s = getenv(name);
  return s && *s ? strtoull(s, NULL, 10) : def;
}

typedef struct snap {
  uint64_t rss_kb, shm_bytes;
  int fds;
} snap_t;

static snap_t snapshot(const daemon_t *d, kvc_client_t *c) {
  snap_t s = {hard_rss_kb(d->pid), stat_get(c, "shm_bytes", NULL), hard_fd_count(d->pid)};
  return s;
}

TEST_TIMEOUT(hard_soak_verified_mix, 900) {
  int nclients = (int)env_u64("KVC_SOAK_CLIENTS", test_long() ? 16 : 4);
  double secs = (double)env_u64("KVC_SOAK_SECONDS", test_long() ? 60 : 3);
  lay = it_layout(KVC_DTYPE_F32);
  row = it_tok_floats(&lay, false);
  hard_raise_nofile(4096);
  /* A page per 16 tokens; each client's sequences want about 3x its share of
   * the pool. No pin limit: a client pins at most MAXPINS sequences. */
  char pool[32];
  snprintf(pool, sizeof pool, "%dKiB", nclients * POOL_PAGES_PER_CLIENT * 16);
  const char *const args[] = {"--pool-bytes", pool, "--log-level", "info",
                              "--max-connections", "1024", "--pin-limit-pct", "100", NULL};
  daemon_t d;
  daemon_start_args(&d, args);
  kvc_client_t *c = client_open_shm(&d, 1u << 20);
  snap_t si = snapshot(&d, c);
  int pfd[2];
  ASSERT_EQ(pipe(pfd), 0);
  pid_t *kids = calloc((size_t)nclients, sizeof *kids);
  char (*latfiles)[96] = calloc((size_t)nclients, sizeof *latfiles);
  for (int i = 0; i < nclients; i++) {
    snprintf(latfiles[i], sizeof latfiles[i], "%s/lat.%d", d.dir, i);
    fflush(NULL);
    kids[i] = fork();
    ASSERT(kids[i] >= 0);
    if (kids[i] == 0) client_main(&d, i, secs * 1000, latfiles[i], pfd[1]);
  }
  close(pfd[1]);
  double warm = secs * 1000 / 4;
  it_sleep_ms((long)warm);
  snap_t s0 = snapshot(&d, c);
  uint64_t ev0 = stat_get(c, "evicted_sequences_total", NULL);
  result_t total = {0};
  for (int i = 0; i < nclients; i++) {
    result_t r;
    ASSERT_EQ(read(pfd[0], &r, sizeof r), (long long)sizeof r);
    total.ops += r.ops, total.mismatched_bytes += r.mismatched_bytes;
    total.evicted_seen += r.evicted_seen, total.rewrites += r.rewrites;
    total.gets_verified += r.gets_verified;
    for (int e = 0; e < 64; e++) total.errors[e] += r.errors[e];
  }
  snap_t s1 = snapshot(&d, c); /* every client done, most still connected */
  for (int i = 0; i < nclients; i++) {
    int st;
    ASSERT_EQ(waitpid(kids[i], &st, 0), kids[i]);
    if (!WIFEXITED(st) || WEXITSTATUS(st)) TEST_FAIL_("soak client %d: status %d", i, st);
  }
  /* Latency over every client's samples. */
  size_t cap = 1 << 20, n = 0;
  double *all = malloc(cap * sizeof *all);
  for (int i = 0; i < nclients; i++) {
    FILE *f = fopen(latfiles[i], "rb");
    ASSERT(f != NULL);
    size_t got;
    while ((got = fread(all + n, sizeof *all, cap - n, f)) > 0) {
      n += got;
      if (n == cap) all = realloc(all, (cap *= 2) * sizeof *all);
    }
    fclose(f);
  }
  double p50 = hard_quantile(all, n, 0.5), p99 = hard_quantile(all, n, 0.99);
  double p999 = hard_quantile(all, n, 0.999);
  uint64_t evictions = stat_get(c, "evicted_sequences_total", NULL);
  uint64_t evicted_pages = stat_get(c, "evicted_pages_total", NULL);
  printf("# soak: %d clients, %.0f s, pool %s: %llu ops, %.0f ops/s; latency p50 %.3f ms, "
         "p99 %.3f ms, p999 %.3f ms; %llu gets verified, mismatched bytes %llu; evictions %llu "
         "sequences / %llu pages (seen by clients %llu, rewritten %llu)\n",
         nclients, secs, pool, (unsigned long long)total.ops, (double)total.ops / secs, p50,
         p99, p999, (unsigned long long)total.gets_verified,
         (unsigned long long)total.mismatched_bytes, (unsigned long long)evictions,
         (unsigned long long)evicted_pages, (unsigned long long)total.evicted_seen,
         (unsigned long long)total.rewrites);
  fprintf(stderr, "soak: %d clients %.0f s, pool %s: %llu ops (%.0f ops/s), p50 %.3f ms "
          "p99 %.3f ms p999 %.3f ms, %llu gets verified, mismatched bytes %llu, evictions %llu "
          "sequences / %llu pages (%llu after warm-up), seen by clients %llu, rewritten %llu\n",
          nclients, secs, pool, (unsigned long long)total.ops, (double)total.ops / secs, p50,
          p99, p999, (unsigned long long)total.gets_verified,
          (unsigned long long)total.mismatched_bytes, (unsigned long long)evictions,
          (unsigned long long)evicted_pages, (unsigned long long)(evictions - ev0),
          (unsigned long long)total.evicted_seen, (unsigned long long)total.rewrites);
  fprintf(stderr, "errors by code:");
  for (int e = 1; e < 64; e++)
    if (total.errors[e]) fprintf(stderr, " %s=%llu", kvc_err_name(-e), (unsigned long long)total.errors[e]);
  fprintf(stderr, "\ndaemon at start: RSS %llu kB, shm %llu bytes, %d fds; after warm-up: "
          "RSS %llu kB, shm %llu bytes, %d fds; at the end: RSS %llu kB, shm %llu bytes, %d fds\n",
          (unsigned long long)si.rss_kb, (unsigned long long)si.shm_bytes, si.fds,
          (unsigned long long)s0.rss_kb, (unsigned long long)s0.shm_bytes, s0.fds,
          (unsigned long long)s1.rss_kb, (unsigned long long)s1.shm_bytes, s1.fds);
  ASSERT_U64_EQ(total.mismatched_bytes, 0);
  ASSERT_U64_EQ(total.errors[-KVC_E_INTERNAL], 0);
  for (int e = 1; e < 64; e++) /* FULL is possible when a write needs pinned pages */
    if (e != -KVC_E_FULL && total.errors[e]) TEST_FAIL_("%llu %s errors", (unsigned long long)total.errors[e], kvc_err_name(-e));
  ASSERT(total.ops > 100u * (uint64_t)nclients);
  ASSERT(total.gets_verified > 10u * (uint64_t)nclients);
  /* Eviction ran all along: after warm-up too, and clients saw it. */
  ASSERT(evictions - ev0 > 0);
  ASSERT(total.evicted_seen > 0 && total.rewrites > 0);
  if (!hard_sanitized()) ASSERT(s1.rss_kb <= s0.rss_kb + s0.rss_kb / 20); /* 5% after warm-up */
  ASSERT(s1.fds <= s0.fds);
  ASSERT(s1.shm_bytes <= s0.shm_bytes);
  free(all), free(kids), free(latfiles);
  kvc_client_close(c);
  daemon_stop(&d);
}
