/* prefix_model.c: the prefix cache against a model of what produced each
 * byte. Random puts with and without token ids (appends, rewrites of earlier
 * pages with other ids, layer-range overwrites), truncations, drops, copies,
 * trims, matches and attaches from other handles and keys, under eviction.
 *
 * Every token the test writes carries a fresh tag in all its elements. The
 * model records, per tag, the exact context its bytes were computed in: the
 * key and every token id before it and its own, if every byte before it in
 * its sequence was computed in that same context, else "tainted" (what a
 * worker computes after a rewrite of an earlier position, or after ids it
 * did not give). A match may answer any length, but every byte an attach
 * hands over must carry the context of the query's prefix up to it: that is
 * the invariant of doc/prefix.md, checked byte by byte.
 */
#include "engine_fixture.h"

#define NSLOT 10u  /* sequence ids 1..NSLOT */
#define MAXTOK 48u /* tokens a sequence holds at most */
#define PT 4u      /* tokens a page */
#define NL 2u      /* layers */
#define NPROMPT 3u
#define TAINT 0ull

typedef struct mseq {
  bool live;
  bool trimmed;            /* trim_front ran: nothing written later chains */
  uint64_t start, len;      /* len: the least of llen */
  uint64_t llen[NL];        /* written length of each layer */
  uint32_t tag[NL][MAXTOK]; /* tag of the bytes at (layer, pos) */
  int64_t id[MAXTOK];      /* token id at pos, -1 unknown */
  uint8_t sk[MAXTOK];      /* span key at pos: 0 none, 1 or 2 (SPANKEY) */
  int key;                 /* key of the last put with ids */
} mseq_t;

typedef struct pm {
  fx_t f;
  uint64_t rng;
  mseq_t s[NSLOT + 1];
  uint64_t *ctx; /* per tag: the context its bytes were computed in */
  uint32_t ntags, cap;
  uint32_t prompt[NPROMPT][MAXTOK];
  /* figures */
  uint64_t ops, puts, rewrites, untokened, layer_puts, layer_saves, truncs, drops, copies, trims,
      matches, attaches, hit_tokens, span_hit_tokens, bytes_checked, evicted, full;
} pm_t;

static const engine_pkey_t KEYS[2] = {{"tenant-a", 8, NULL, 0}, {"tenant-a", 8, "lora-7", 6}};

static uint64_t rnd(pm_t *m) {
  m->rng = m->rng * 6364136223846793005ull + 1442695040888963407ull;
  return fx_mix(m->rng);
}
static uint64_t below(pm_t *m, uint64_t n) { return n ? rnd(m) % n : 0; }

/* The context of a prefix: its key, then its ids one by one. */
static uint64_t ctx_root(int key) { return fx_mix(0x1234567ull + (uint64_t)key) | 1; }
static uint64_t ctx_next(uint64_t prev, int64_t id, uint8_t sk) {
  return id < 0 ? TAINT
                : fx_mix(prev ^ ((uint64_t)id * 0x9e3779b97f4a7c15ull) ^
                         ((uint64_t)sk << 40)) | 1;
}

/* The span keys (an image's hash over its placeholder tokens) the model
 * gives positions. */
static const char *const SPANKEY[3] = {NULL, "image-1", "image-2"};

/* sk[0..n) of positions from pos as a span key list (runs), into sp; the
 * first and last run sometimes reach past [pos, pos + n) (clipped by the
 * engine). */
static size_t spans_of(pm_t *m, const uint8_t *sk, uint64_t pos, uint64_t n,
                       kvc_span_key_t *sp) {
  size_t k = 0;
  for (uint64_t t = 0; t < n;) {
    uint64_t u = t + 1;
    while (u < n && sk[u] == sk[t]) u++;
    if (sk[t]) sp[k++] = (kvc_span_key_t){pos + t, pos + u, SPANKEY[sk[t]], 7};
    t = u;
  }
  if (k && sp[0].begin == pos && pos > 0 && below(m, 3) == 0) sp[0].begin -= 1 + below(m, pos);
  if (k && sp[k - 1].end == pos + n && below(m, 3) == 0) sp[k - 1].end += 1 + below(m, 5);
  return k;
}

/* Span keys for n positions: mostly none, else one run of one key. */
static void pick_sk(pm_t *m, uint64_t n, uint8_t *sk) {
  memset(sk, 0, n);
  if (below(m, 3)) return;
  uint64_t b = below(m, n), e = b + 1 + below(m, n - b);
  uint8_t key = (uint8_t)(1 + below(m, 2));
  for (uint64_t t = b; t < e; t++) sk[t] = key;
}

static uint32_t new_tag(pm_t *m, uint64_t ctx) {
  if (m->ntags == m->cap) {
    m->cap = m->cap ? m->cap * 2 : 4096;
    m->ctx = realloc(m->ctx, m->cap * sizeof *m->ctx);
    if (!m->ctx) TEST_FAIL_("realloc");
  }
  m->ctx[m->ntags] = ctx;
  return m->ntags++;
}

/* Whether every byte of layers [l0, l1) of s at positions [0, p) was
 * computed in the context of s's ids and key k; *c gets that context
 * through p - 1. (A layer's bytes are computed over that layer's history:
 * a layer-by-layer save of a prompt writes layer 0 of every chunk before
 * layer 1 of the first.) */
static bool clean_upto(const pm_t *m, const mseq_t *s, uint64_t p, int k, uint32_t l0,
                       uint32_t l1, uint64_t *c) {
  uint64_t x = ctx_root(k);
  if (s->trimmed) return false;
  for (uint64_t q = 0; q < p; q++) {
    x = ctx_next(x, s->id[q], s->sk[q]);
    for (uint32_t l = l0; l < l1; l++)
      if (x == TAINT || m->ctx[s->tag[l][q]] != x) return false;
  }
  *c = x;
  return true;
}

/* Writes tags of [pos, pos+n) for layers [l0, l1) into buffers k, v (every
 * element of a token carries its tag). */
static void fill(const pm_t *m, const uint32_t *tags, uint64_t n, uint32_t l0, uint32_t l1,
                 fx_buf_t *b) {
  uint64_t per_k = m->f.lay.num_kv_heads * m->f.lay.head_dim_k;
  uint64_t per_v = m->f.lay.num_kv_heads * m->f.lay.head_dim_v;
  for (uint32_t l = l0; l < l1; l++)
    for (uint64_t t = 0; t < n; t++) {
      float v = (float)tags[(l - l0) * n + t];
      for (uint64_t e = 0; e < per_k; e++) b->k[((l - l0) * n + t) * per_k + e] = v;
      for (uint64_t e = 0; e < per_v; e++) b->v[((l - l0) * n + t) * per_v + e] = v;
    }
}

static bool trace;
#define TRACE(...) (trace ? (void)fprintf(stderr, __VA_ARGS__) : (void)0)

static const char *what_key(int k) { return k ? "key B" : "key A"; }

static void set_len(mseq_t *s) {
  s->len = s->llen[0];
  for (uint32_t l = 1; l < NL; l++) s->len = s->llen[l] < s->len ? s->llen[l] : s->len;
}

/* A put of [pos, pos+n) of layers [l0, l1) of slot i, with ids or without. */
static int put(pm_t *m, uint32_t i, uint64_t pos, uint64_t n, const int64_t *ids,
               const uint8_t *sk, int key, uint32_t l0, uint32_t l1) {
  mseq_t *s = &m->s[i];
  fx_rng_t r = fx_rng(&m->f.lay, l0, l1, 0, 0);
  fx_buf_t b = fx_buf_new(&m->f.lay, r, n);
  uint32_t tags[NL * MAXTOK], u[MAXTOK];
  /* the model's contexts, as the bytes would be computed */
  mseq_t after = *s;
  if (!after.live) memset(&after, 0, sizeof after), after.live = true, after.key = key;
  uint64_t c = 0;
  bool clean = ids && clean_upto(m, &after, pos, key, l0, l1, &c);
  for (uint64_t t = 0; t < n; t++) {
    after.id[pos + t] = ids ? ids[t] : -1;
    after.sk[pos + t] = ids && sk ? sk[t] : 0;
    if (ids) u[t] = (uint32_t)ids[t];
    uint64_t x = TAINT;
    if (clean) c = x = ctx_next(c, ids[t], after.sk[pos + t]);
    for (uint32_t l = l0; l < l1; l++) after.tag[l][pos + t] = tags[(l - l0) * n + t] = new_tag(m, x);
  }
  for (uint32_t l = l0; l < l1; l++)
    if (pos + n > after.llen[l]) after.llen[l] = pos + n;
  set_len(&after);
  fill(m, tags, n, l0, l1, &b);
  engine_io_t io = fx_io(i, pos, n, &b);
  kvc_span_key_t sp[MAXTOK];
  if (ids) io.tokens = u;
  if (ids && sk) io.nspans = spans_of(m, sk, pos, n, sp), io.spans = sp;
  engine_xfer_t x = fx_xfer(r, KVC_DTYPE_F32);
  x.pkey = ids ? &KEYS[key] : NULL;
  int rc = engine_put(m->f.eng, m->f.cid, &x, &io, 1);
  TRACE("put slot %u [%llu, +%llu) layers %u-%u %s%s -> %s (tags %u..%u, clean %d)\n", i,
        (unsigned long long)pos, (unsigned long long)n, l0, l1, ids ? "ids " : "no ids",
        ids ? what_key(key) : "", kvc_err_name(rc), tags[0], tags[(l1 - l0) * n - 1], clean);
  fx_buf_free(&b);
  if (rc == KVC_E_FULL) {
    m->full++;
    return rc;
  }
  if (rc) TEST_FAIL_("put slot %u [%" PRIu64 ", +%" PRIu64 ") %s: %s (%s)", i, pos, n,
                     ids ? what_key(key) : "no ids", kvc_err_name(rc),
                     engine_last_error(m->f.eng)->msg);
  if (ids) after.key = key;
  *s = after;
  return 0;
}

/* Reads [0, len) of slot i (every layer) and checks each element's tag. */
static void check_seq(pm_t *m, uint32_t i) {
  mseq_t *s = &m->s[i];
  uint64_t n = s->len - s->start;
  if (!n) return;
  fx_rng_t r = fx_all(&m->f.lay);
  fx_buf_t b = fx_buf_new(&m->f.lay, r, n);
  engine_io_t io = fx_io(i, s->start, n, &b);
  engine_xfer_t x = fx_xfer(r, KVC_DTYPE_F32);
  int rc = engine_get(m->f.eng, m->f.cid, &x, &io, 1);
  if (rc) TEST_FAIL_("get slot %u: %s", i, kvc_err_name(rc));
  uint64_t per_k = m->f.lay.num_kv_heads * m->f.lay.head_dim_k;
  uint64_t per_v = m->f.lay.num_kv_heads * m->f.lay.head_dim_v;
  for (uint32_t l = 0; l < NL; l++)
    for (uint64_t t = 0; t < n; t++) {
      float want = (float)s->tag[l][s->start + t];
      for (uint64_t e = 0; e < per_k; e++)
        if (b.k[(l * n + t) * per_k + e] != want)
          TEST_FAIL_("slot %u layer %u pos %" PRIu64 ": K tag %.0f, want %.0f", i, l,
                     s->start + t, (double)b.k[(l * n + t) * per_k + e], (double)want);
      for (uint64_t e = 0; e < per_v; e++)
        if (b.v[(l * n + t) * per_v + e] != want)
          TEST_FAIL_("slot %u layer %u pos %" PRIu64 ": V tag %.0f, want %.0f", i, l,
                     s->start + t, (double)b.v[(l * n + t) * per_v + e], (double)want);
    }
  m->bytes_checked += b.kb + b.vb;
  fx_buf_free(&b);
}

/* Learns which sequences eviction took; a live one must be as modelled. */
static void sync_live(pm_t *m) {
  for (uint32_t i = 1; i <= NSLOT; i++) {
    kvc_seq_info_t si;
    int rc = engine_seq_info(m->f.eng, m->f.cid, i, &si);
    mseq_t *s = &m->s[i];
    if (rc == KVC_E_NOSEQ) {
      if (s->live) m->evicted++, TRACE("evicted slot %u\n", i);
      s->live = false;
      continue;
    }
    if (rc || !s->live || si.length != s->len || si.start != s->start)
      TEST_FAIL_("slot %u: %s, length %" PRIu64 " start %" PRIu64 "; model: %s, %" PRIu64
                 " from %" PRIu64, i, kvc_err_name(rc), si.length, si.start,
                 s->live ? "live" : "gone", s->len, s->start);
  }
}

/* Ids for [pos, pos+n): a prompt's (so prompts meet), or small random ones. */
static void pick_ids(pm_t *m, uint64_t pos, uint64_t n, int64_t *ids) {
  uint32_t p = (uint32_t)below(m, NPROMPT);
  bool noise = below(m, 4) == 0;
  for (uint64_t t = 0; t < n; t++)
    ids[t] = noise ? (int64_t)below(m, 3) : m->prompt[p][pos + t];
}

static void op_put(pm_t *m) {
  uint32_t i = 1 + (uint32_t)below(m, NSLOT);
  mseq_t *s = &m->s[i];
  uint64_t len = s->live ? s->len : 0, lo = s->live ? s->start : 0, pos;
  switch (below(m, 4)) {
  case 0: pos = lo + below(m, len - lo + 1); break;               /* anywhere */
  case 1: pos = (lo + below(m, len - lo + 1)) / PT * PT; break;   /* a page start */
  default: pos = len; break;                                      /* append */
  }
  if (pos < lo) pos = lo;
  if (pos >= MAXTOK) return;
  uint64_t n = 1 + below(m, MAXTOK - pos < 12 ? MAXTOK - pos : 12);
  int64_t ids[MAXTOK];
  int key = s->live && below(m, 8) ? s->key : (int)below(m, 2);
  uint32_t kind = (uint32_t)below(m, 10);
  if (kind == 0) { /* without ids */
    if (put(m, i, pos, n, NULL, NULL, key, 0, NL) == 0) m->untokened++;
  } else if (kind == 1 && s->live && pos + n <= s->len) { /* one layer, inside */
    uint32_t l = (uint32_t)below(m, NL);
    if (put(m, i, pos, n, NULL, NULL, key, l, l + 1) == 0) m->layer_puts++;
  } else if (kind == 2 || kind == 3) {
    /* A layer-by-layer save with ids (vLLM's save_kv_layer): each layer
     * alone, in order; sometimes one layer gets other ids, or the save
     * stops before the last layer, or one layer runs ahead by itself. */
    pick_ids(m, pos, n, ids);
    uint8_t sk[MAXTOK];
    pick_sk(m, n, sk);
    uint32_t odd = below(m, 4) == 0 ? (uint32_t)below(m, NL) : NL;
    uint32_t stop = below(m, 4) == 0 ? 1 + (uint32_t)below(m, NL) : NL;
    for (uint32_t l = 0; l < stop; l++) {
      uint64_t p = l == 0 || kind == 2 ? pos : (s->live ? s->llen[l] : 0);
      if (p < pos) p = pos; /* (kind 3: a layer continues from its own length) */
      if (s->live && (p > s->llen[l] || p < s->start)) break;
      if (!s->live && p != 0) break;
      if (p + n > MAXTOK) break;
      int64_t lid[MAXTOK];
      uint8_t lsk[MAXTOK];
      pick_ids(m, p, n, lid);
      pick_sk(m, n, lsk);
      for (uint64_t t = 0; t < n; t++)
        if (l != odd && p == pos) lid[t] = ids[t], lsk[t] = sk[t];
      if (put(m, i, p, n, lid, lsk, key, l, l + 1) != 0) break;
      m->layer_saves++;
    }
  } else {
    pick_ids(m, pos, n, ids);
    uint8_t sk[MAXTOK];
    pick_sk(m, n, sk);
    bool rewrite = pos < len;
    if (put(m, i, pos, n, ids, sk, key, 0, NL) == 0) m->puts++, m->rewrites += rewrite;
  }
}

static void op_remove(pm_t *m) {
  uint32_t i = 1 + (uint32_t)below(m, NSLOT);
  mseq_t *s = &m->s[i];
  if (!s->live) {
    ASSERT_ERR(engine_remove(m->f.eng, m->f.cid, i, 0, UINT64_MAX), KVC_E_NOSEQ);
    return;
  }
  uint64_t b = below(m, s->len + 2);
  ASSERT_OK(engine_remove(m->f.eng, m->f.cid, i, b, UINT64_MAX));
  TRACE("remove slot %u from %llu\n", i, (unsigned long long)b);
  if (b <= s->start) {
    s->live = false;
    m->drops++;
  } else {
    m->truncs += b < s->len;
    for (uint32_t l = 0; l < NL; l++) s->llen[l] = s->llen[l] < b ? s->llen[l] : b;
    set_len(s);
  }
}

static void op_copy(pm_t *m) {
  uint32_t i = 1 + (uint32_t)below(m, NSLOT), j = 1 + (uint32_t)below(m, NSLOT);
  mseq_t *s = &m->s[i];
  if (i == j || !s->live) return;
  uint64_t n = s->start + below(m, s->len - s->start + 1);
  if (n == s->start && n % PT) return; /* would leave a page holding no position */
  ASSERT_OK(engine_copy_prefix(m->f.eng, m->f.cid, i, j, n));
  TRACE("copy slot %u -> %u n %llu\n", i, j, (unsigned long long)n);
  mseq_t *d = &m->s[j];
  *d = *s;
  d->len = n;
  for (uint32_t l = 0; l < NL; l++) d->llen[l] = n;
  m->copies++;
}

static void op_trim(pm_t *m) {
  uint32_t i = 1 + (uint32_t)below(m, NSLOT);
  mseq_t *s = &m->s[i];
  if (!s->live || s->len == s->start) return;
  uint64_t n = s->start + 1 + below(m, s->len - s->start);
  if (n == s->len && n % PT) n--; /* keep a position in the last page */
  if (n <= s->start) return;
  ASSERT_OK(engine_trim_front(m->f.eng, m->f.cid, i, n));
  TRACE("trim slot %u to %llu\n", i, (unsigned long long)n);
  s->start = n;
  s->trimmed = true;
  m->trims++;
}

/* A query: a sequence's ids (some mutated), or a prompt's, under a key. */
static uint64_t make_query(pm_t *m, uint32_t *q, uint8_t *qsk, int *key) {
  uint32_t i = 1 + (uint32_t)below(m, NSLOT);
  const mseq_t *s = &m->s[i];
  uint64_t n = 1 + below(m, MAXTOK);
  uint32_t p = (uint32_t)below(m, NPROMPT);
  bool from_seq = s->live && s->len > 0 && below(m, 3);
  if (from_seq) n = 1 + below(m, s->len);
  *key = from_seq && below(m, 4) ? s->key : (int)below(m, 2);
  for (uint64_t t = 0; t < n; t++) {
    int64_t id = from_seq ? s->id[t] : (int64_t)m->prompt[p][t];
    q[t] = id < 0 ? (uint32_t)below(m, 3) : (uint32_t)id;
  }
  if (from_seq) memcpy(qsk, s->sk, n);
  else pick_sk(m, n, qsk);
  if (below(m, 4) == 0) q[below(m, n)] = (uint32_t)below(m, 3); /* one id off */
  if (below(m, 6) == 0) qsk[below(m, n)] = (uint8_t)below(m, 3); /* one span key off */
  return n;
}

static void op_match(pm_t *m) {
  uint32_t q[MAXTOK];
  uint8_t qsk[MAXTOK];
  int key;
  uint64_t n = make_query(m, q, qsk, &key);
  kvc_span_key_t sp[MAXTOK];
  engine_pkey_t k = KEYS[key];
  k.nspans = spans_of(m, qsk, 0, n, sp);
  k.spans = sp;
  if (k.nspans && sp[k.nspans - 1].end > n && below(m, 2)) sp[k.nspans - 1].end = n;
  engine_match_t mt, at;
  ASSERT_OK(engine_match(m->f.eng, m->f.cid, q, n, &k, &mt));
  m->matches++;
  if (mt.tokens % PT || mt.tokens > n)
    TEST_FAIL_("match of %" PRIu64 " tokens answered %" PRIu64, n, mt.tokens);
  if (below(m, 2)) return;
  /* attach into another handle's slot and check every byte it got */
  uint32_t d = 1 + (uint32_t)below(m, NSLOT);
  int rc = engine_attach(m->f.eng, m->f.cid, d, q, n, &k, 0, &at);
  if (rc) TEST_FAIL_("attach: %s", kvc_err_name(rc));
  TRACE("attach slot %u, %llu tokens %s -> %llu\n", d, (unsigned long long)n, what_key(key),
        (unsigned long long)at.tokens);
  if (at.tokens != mt.tokens)
    TEST_FAIL_("attach got %" PRIu64 " tokens, the match before it %" PRIu64, at.tokens,
               mt.tokens);
  mseq_t *s = &m->s[d];
  memset(s, 0, sizeof *s);
  s->live = true;
  s->key = key;
  s->len = at.tokens;
  for (uint32_t l = 0; l < NL; l++) s->llen[l] = at.tokens;
  /* what the pages hold, read back, must be the query's context throughout */
  uint64_t c = ctx_root(key);
  if (at.tokens) {
    fx_rng_t r = fx_all(&m->f.lay);
    fx_buf_t b = fx_buf_new(&m->f.lay, r, at.tokens);
    engine_io_t io = fx_io(d, 0, at.tokens, &b);
    engine_xfer_t x = fx_xfer(r, KVC_DTYPE_F32);
    ASSERT_OK(engine_get(m->f.eng, m->f.cid, &x, &io, 1));
    uint64_t per_k = m->f.lay.num_kv_heads * m->f.lay.head_dim_k;
    for (uint64_t t = 0; t < at.tokens; t++) {
      c = ctx_next(c, q[t], qsk[t]);
      s->id[t] = q[t];
      s->sk[t] = qsk[t];
      for (uint32_t l = 0; l < NL; l++) {
        uint32_t tag = (uint32_t)b.k[(l * at.tokens + t) * per_k];
        if ((float)tag != b.k[(l * at.tokens + t) * per_k] || tag >= m->ntags ||
            m->ctx[tag] != c)
          TEST_FAIL_("attach of %" PRIu64 " tokens (%s): layer %u pos %" PRIu64
                     " holds bytes of tag %u, computed %s", n, what_key(key), l, t, tag,
                     tag < m->ntags && m->ctx[tag] == TAINT
                         ? "after a rewrite or without ids"
                         : "for another prefix");
        s->tag[l][t] = tag;
      }
    }
    fx_buf_free(&b);
  }
  m->attaches++;
  m->hit_tokens += at.tokens;
  for (uint64_t t = 0; t < at.tokens; t++) m->span_hit_tokens += qsk[t] != 0;
  check_seq(m, d); /* every element, both K and V */
}

static void run(uint64_t seed, uint64_t nops, pm_t *tot) {
  trace = getenv("KVC_PM_TRACE") != NULL;
  pm_t *m = calloc(1, sizeof *m);
  if (!m) TEST_FAIL_("calloc");
  m->rng = seed;
  kvc_layout_t lay = fx_layout(NL, 1, 2, 2, KVC_DTYPE_F32, PT);
  fx_open(&m->f, &lay, 40);
  for (uint32_t p = 0; p < NPROMPT; p++)
    for (uint32_t t = 0; t < MAXTOK; t++) m->prompt[p][t] = (uint32_t)below(m, 4) + 10 * p;
  for (uint64_t k = 0; k < nops; k++) {
    m->ops++;
    uint64_t r = below(m, 100);
    if (r < 45) op_put(m);
    else if (r < 55) op_remove(m);
    else if (r < 62) op_copy(m);
    else if (r < 65) op_trim(m);
    else op_match(m);
    engine_set_now(m->f.eng, k + 2);
    sync_live(m);
    if (k % 16 == 0)
      for (uint32_t i = 1; i <= NSLOT; i++)
        if (m->s[i].live) check_seq(m, i);
    FX_AUDIT(m->f.eng);
  }
  tot->ops += m->ops, tot->puts += m->puts, tot->rewrites += m->rewrites;
  tot->untokened += m->untokened, tot->layer_puts += m->layer_puts, tot->truncs += m->truncs;
  tot->layer_saves += m->layer_saves, tot->span_hit_tokens += m->span_hit_tokens;
  tot->drops += m->drops, tot->copies += m->copies, tot->trims += m->trims;
  tot->matches += m->matches, tot->attaches += m->attaches, tot->hit_tokens += m->hit_tokens;
  tot->bytes_checked += m->bytes_checked, tot->evicted += m->evicted, tot->full += m->full;
  fx_close(&m->f);
  free(m->ctx);
  free(m);
}

TEST_TIMEOUT(prefix_model_every_attached_byte_is_the_query_prefix, 600) {
  pm_t tot;
  memset(&tot, 0, sizeof tot);
  uint64_t seeds = test_long() ? 40 : 6, ops = test_long() ? 50000 : 6000;
  for (uint64_t seed = 1; seed <= seeds; seed++) run(seed, ops, &tot);
  printf("prefix model: %" PRIu64 " ops over %" PRIu64 " seeds, 0 mismatches: %" PRIu64
         " puts with ids (%" PRIu64 " rewrites), %" PRIu64 " without, %" PRIu64
         " layer-range, %" PRIu64 " layer-range with ids, %" PRIu64 " truncations, %" PRIu64 " drops, %" PRIu64 " copies, %" PRIu64
         " trims, %" PRIu64 " matches, %" PRIu64 " attaches (%" PRIu64 " tokens hit, %" PRIu64 " under span keys), %" PRIu64
         " evictions, %" PRIu64 " FULL, %" PRIu64 " bytes verified\n",
         tot.ops, seeds, tot.puts, tot.rewrites, tot.untokened, tot.layer_puts, tot.layer_saves,
         tot.truncs,
         tot.drops, tot.copies, tot.trims, tot.matches, tot.attaches, tot.hit_tokens, tot.span_hit_tokens, tot.evicted,
         tot.full, tot.bytes_checked);
  /* the mix must reach what it is for: hits, rewrites and eviction */
  ASSERT(tot.hit_tokens > 0 && tot.rewrites > 0 && tot.evicted > 0 && tot.attaches > 0);
  ASSERT(tot.layer_saves > 0 && tot.span_hit_tokens > 0);
}
