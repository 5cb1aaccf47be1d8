/* engine_model.c: the engine against a plain reference, on random operations.
 *
 * The reference keeps, per sequence, a byte array [pos][layer][head][dim] of
 * K and of V in the cache dtype, the written length of every layer, start,
 * the owners pinning it and when it was last used. Both receive the same
 * random puts (batched, layer ranges, overwrites), gets, removes, copies,
 * trims and pins, over 64 sequences in two caches of different layouts that
 * share a pool of 40 pages, so that eviction and copy on write never stop.
 *
 * The reference cannot know which sequences the engine evicts, so it learns
 * it: after a put, a sequence the engine no longer has must have been
 * unpinned and not part of the put, and must not have been used more recently
 * than an unpinned survivor (lu_lo: last certain use, a read or a write;
 * lu_hi: last call that named it at all, on one clock). Everywhere else the engine and the
 * reference must agree exactly. After every operation engine_audit() == 0;
 * every 8 operations (and after every FULL) every sequence is read back in
 * full and its info, and the pool's page figures rebuilt from
 * engine_page_offset, are compared.
 */
#include <math.h>

#include "engine_fixture.h"

#define NSEQ_A 48
#define NSEQ_B 16
#define NSEQ (NSEQ_A + NSEQ_B)
#define MAXTOK 48
#define NPAGES 40
#define NOWNERS 3
#define MAXL 3

typedef struct rseq {
  bool live;
  uint8_t pins;           /* bit o: owner o + 1 pins it */
  uint64_t start;
  uint64_t llen[MAXL];    /* written length per layer (a position) */
  uint64_t lu_lo, lu_hi;  /* use clock at the last certain / possible use */
  uint8_t *k, *v;         /* [pos][layer][head][dim], cache dtype */
  bool hole[MAXTOK];      /* slots a reservation skipped (rows kept zero) */
} rseq_t;

typedef struct model {
  engine_t *eng;
  void *base;
  uint64_t page_bytes;
  uint32_t cid[2];
  kvc_layout_t lay[2];
  uint32_t esize[2];
  rseq_t seq[NSEQ];
  uint64_t rng, seed, op;
  uint64_t clock; /* ticks at every call naming a sequence */
  bool trace;
  uint64_t nops, nfull, nevicted, ncow_seen, nlru_checked, nfull_decided, mismatches, ngaps;
} model_t;

static uint64_t rnd(model_t *m) {
  m->rng ^= m->rng >> 12;
  m->rng ^= m->rng << 25;
  m->rng ^= m->rng >> 27;
  return m->rng * 0x2545f4914f6cdd1dull;
}
static uint64_t below(model_t *m, uint64_t n) { return n ? rnd(m) % n : 0; }

static int cache_of(int i) { return i < NSEQ_A ? 0 : 1; }
static uint64_t id_of(int i) { return i < NSEQ_A ? (uint64_t)i * 7919 : (uint64_t)(i - NSEQ_A); }

/* A disagreement ends the test at once, saying at which op of which seed. */
#define MISMATCH(m, fmt, ...)                                                  \
  do {                                                                         \
    (m)->mismatches++;                                                         \
    TEST_FAIL_("seed %" PRIu64 " op %" PRIu64 ": " fmt, (m)->seed, (m)->op, ##__VA_ARGS__); \
  } while (0)

static uint64_t row_bytes(const model_t *m, int c, int is_v) {
  const kvc_layout_t *l = &m->lay[c];
  return (uint64_t)l->num_kv_heads * (is_v ? l->head_dim_v : l->head_dim_k) * m->esize[c];
}

static uint8_t *ref_row(model_t *m, int i, int is_v, uint64_t pos, uint32_t layer) {
  int c = cache_of(i);
  uint8_t *base = is_v ? m->seq[i].v : m->seq[i].k;
  return base + (pos * m->lay[c].num_layers + layer) * row_bytes(m, c, is_v);
}

static uint64_t ref_len(const model_t *m, int i, uint32_t lb, uint32_t le) {
  uint64_t n = UINT64_MAX;
  for (uint32_t l = lb; l < le; l++) n = m->seq[i].llen[l] < n ? m->seq[i].llen[l] : n;
  return n;
}
static uint64_t ref_extent(const model_t *m, int i) {
  uint64_t n = 0;
  for (uint32_t l = 0; l < m->lay[cache_of(i)].num_layers; l++)
    n = m->seq[i].llen[l] > n ? m->seq[i].llen[l] : n;
  return n;
}

/* Records a call that named seq i: certain (a read or a write that
 * succeeded) or only possible (anything else might count as a use). */
static void use(model_t *m, int i, bool certain) {
  m->seq[i].lu_hi = ++m->clock;
  if (certain) m->seq[i].lu_lo = m->clock;
}

static void ref_drop(model_t *m, int i) {
  m->seq[i].live = false;
  m->seq[i].pins = 0;
  memset(m->seq[i].hole, 0, sizeof m->seq[i].hole);
}

/* Whether logical page idx of live seq i holds no token (every slot of it
 * in [start, extent) a hole): the engine keeps no page for it. */
static bool page_none(const model_t *m, int i, uint64_t idx) {
  const rseq_t *r = &m->seq[i];
  uint64_t pt = m->lay[cache_of(i)].page_tokens, b = idx * pt, e = b + pt, ext = ref_extent(m, i);
  for (uint64_t t = b > r->start ? b : r->start; t < e && t < ext; t++)
    if (!r->hole[t]) return false;
  return true;
}

static void audit(model_t *m) {
  char why[256] = "";
  int r = engine_audit(m->eng, why, sizeof why);
  if (r) MISMATCH(m, "audit: %s", why);
}

/* KVC_MODEL_TRACE=1 prints every operation (to replay a failing seed). */
#define TRACE(m, fmt, ...)                                                     \
  do {                                                                         \
    if ((m)->trace) fprintf(stderr, "op %" PRIu64 ": " fmt "\n", (m)->op, ##__VA_ARGS__); \
  } while (0)

/* ---- setup ------------------------------------------------------------------------- */

static void model_open(model_t *m, uint64_t seed) {
  memset(m, 0, sizeof *m);
  m->seed = seed;
  m->trace = getenv("KVC_MODEL_TRACE") != NULL;
  m->rng = seed * 0x9e3779b97f4a7c15ull + 1;
  m->lay[0] = fx_layout(3, 2, 4, 2, KVC_DTYPE_F32, 4);  /* 576 bytes a page */
  m->lay[1] = fx_layout(2, 1, 8, 8, KVC_DTYPE_BF16, 8); /* 512 bytes a page */
  m->esize[0] = 4, m->esize[1] = 2;
  m->page_bytes = 576;
  m->base = fx_pool_alloc(NPAGES * m->page_bytes);
  engine_config_t cfg = {.base = m->base, .pool_bytes = NPAGES * m->page_bytes, .page_bytes = m->page_bytes, .max_caches = 0, .max_seqs = 0};
  ASSERT_OK(engine_new(&cfg, &m->eng));
  ASSERT_OK(engine_cache_open(m->eng, "a", &m->lay[0], &m->cid[0]));
  ASSERT_OK(engine_cache_open(m->eng, "b", &m->lay[1], &m->cid[1]));
  for (int i = 0; i < NSEQ; i++) {
    int c = cache_of(i);
    m->seq[i].k = calloc(MAXTOK * m->lay[c].num_layers, row_bytes(m, c, 0));
    m->seq[i].v = calloc(MAXTOK * m->lay[c].num_layers, row_bytes(m, c, 1));
  }
}

static void model_close(model_t *m) {
  for (int i = 0; i < NSEQ; i++) free(m->seq[i].k), free(m->seq[i].v);
  engine_free(m->eng);
  free(m->base);
}

/* ---- the pool rebuilt from engine_page_offset ------------------------------------------ */

typedef struct pages {
  uint16_t ref[NPAGES];      /* holders of each pool page */
  bool evictable_only[NPAGES]; /* every holder unpinned and not protected */
} pages_t;

static uint64_t page_of(model_t *m, int i, uint64_t pos) {
  uint64_t off = 0;
  int rc = engine_page_offset(m->eng, m->cid[cache_of(i)], id_of(i), pos, &off);
  if (rc) MISMATCH(m, "page_offset seq %d pos %" PRIu64 ": %s", i, pos, kvc_err_name(rc));
  if (off % m->page_bytes || off / m->page_bytes >= NPAGES)
    MISMATCH(m, "page offset %" PRIu64 " not a page", off);
  return off / m->page_bytes;
}

/* Counts the holders of every pool page from the block tables of the live
 * sequences; protect marks the sequences of the call under way. */
static void rebuild(model_t *m, pages_t *p, const bool *protect) {
  memset(p, 0, sizeof *p);
  for (int pg = 0; pg < NPAGES; pg++) p->evictable_only[pg] = true;
  for (int i = 0; i < NSEQ; i++) {
    if (!m->seq[i].live) continue;
    uint64_t pt = m->lay[cache_of(i)].page_tokens, st = m->seq[i].start;
    for (uint64_t idx = st / pt; idx < (ref_extent(m, i) + pt - 1) / pt; idx++) {
      if (page_none(m, i, idx)) continue;
      uint64_t pg = page_of(m, i, idx * pt > st ? idx * pt : st);
      p->ref[pg]++;
      if (m->seq[i].pins || (protect && protect[i])) p->evictable_only[pg] = false;
    }
  }
}

/* Pages free now plus pages every unprotected unpinned holder would free. */
static uint64_t freeable(model_t *m, const pages_t *p) {
  engine_stats_t s;
  engine_stats(m->eng, &s);
  uint64_t n = s.pages_free;
  for (int pg = 0; pg < NPAGES; pg++) n += p->ref[pg] && p->evictable_only[pg];
  return n;
}

/* ---- reading back ---------------------------------------------------------------------- */

static bool bf16_is_nan(uint16_t b) { return (b & 0x7f80) == 0x7f80 && (b & 0x7f); }

/* Compares one got element (dtype dt) with the reference element. */
static void cmp_elem(model_t *m, int c, kvc_dtype_t dt, const uint8_t *got, const uint8_t *want,
                     int i, uint64_t pos, uint32_t layer, int is_v) {
  bool same;
  if (c == 0 || dt == KVC_DTYPE_BF16) {
    same = memcmp(got, want, m->esize[c]) == 0;
  } else { /* bf16 widened to f32: exact, a NaN only needs to stay a NaN */
    uint16_t b;
    uint32_t g;
    memcpy(&b, want, 2);
    memcpy(&g, got, 4);
    same = bf16_is_nan(b) ? (g & 0x7f800000) == 0x7f800000 && (g & 0x7fffff) &&
                                (g >> 31) == (uint32_t)(b >> 15)
                          : g == (uint32_t)b << 16;
  }
  if (!same)
    MISMATCH(m, "seq %d (cache %d) %c pos %" PRIu64 " layer %u differs from the reference", i,
             c, is_v ? 'V' : 'K', pos, layer);
}

typedef struct span {
  uint64_t pos, n;
  uint32_t lb, le, hb, he;
  kvc_dtype_t dt;
} span_t;

/* Gets sp of seq i, expecting rc_want; on success compares every element. */
static void check_get(model_t *m, int i, span_t sp, int rc_want) {
  int c = cache_of(i);
  const kvc_layout_t *l = &m->lay[c];
  uint32_t oes = sp.dt == KVC_DTYPE_F32 ? 4 : m->esize[c], nh = sp.he - sp.hb;
  uint64_t rows = (uint64_t)(sp.le - sp.lb) * sp.n * nh;
  uint64_t kb = rows * l->head_dim_k * oes, vb = rows * l->head_dim_v * oes;
  uint8_t *k = malloc(kb + 1), *v = malloc(vb + 1);
  engine_io_t io = {id_of(i), sp.pos, sp.n, k, v, kb, vb, NULL, NULL, 0, 0};
  engine_xfer_t x = {.layer_begin = sp.lb, .layer_end = sp.le, .head_begin = sp.hb, .head_end = sp.he, .dtype = sp.dt};
  int rc = engine_get(m->eng, m->cid[c], &x, &io, 1);
  if (rc_want != 0 || sp.n != 1 || sp.lb != 0) /* not one of verify_all's reads */
    TRACE(m, "get seq %d [%" PRIu64 ", +%" PRIu64 ") -> %s", i, sp.pos, sp.n, kvc_err_name(rc));
  if (rc != rc_want)
    MISMATCH(m, "get seq %d [%" PRIu64 ", +%" PRIu64 ") layers [%u,%u): %s, want %s (%s)", i,
             sp.pos, sp.n, sp.lb, sp.le, kvc_err_name(rc), kvc_err_name(rc_want),
             engine_last_error(m->eng)->msg);
  use(m, i, rc == 0);
  for (int is_v = 0; rc == 0 && is_v < 2; is_v++) {
    uint32_t dim = is_v ? l->head_dim_v : l->head_dim_k;
    const uint8_t *g = is_v ? v : k;
    for (uint32_t ly = sp.lb; ly < sp.le; ly++)
      for (uint64_t t = sp.pos; t < sp.pos + sp.n; t++)
        for (uint32_t h = sp.hb; h < sp.he; h++) {
          const uint8_t *w = ref_row(m, i, is_v, t, ly) + (uint64_t)h * dim * m->esize[c];
          for (uint32_t d = 0; d < dim; d++, g += oes)
            cmp_elem(m, c, sp.dt, g, w + d * m->esize[c], i, t, ly, is_v);
        }
  }
  free(k);
  free(v);
}

static span_t whole(model_t *m, int i, uint64_t pos, uint64_t n, uint32_t lb, uint32_t le) {
  span_t sp = {pos, n, lb, le, 0, m->lay[cache_of(i)].num_kv_heads,
               cache_of(i) ? KVC_DTYPE_BF16 : KVC_DTYPE_F32};
  return sp;
}

/* seq_info of i against the reference, and every byte it holds. */
static void verify_seq(model_t *m, int i, const pages_t *p) {
  int c = cache_of(i);
  const rseq_t *r = &m->seq[i];
  kvc_seq_info_t si;
  int rc = engine_seq_info(m->eng, m->cid[c], id_of(i), &si);
  if (rc != (r->live ? 0 : KVC_E_NOSEQ))
    MISMATCH(m, "seq %d: seq_info %s, reference %s", i, kvc_err_name(rc),
             r->live ? "live" : "absent");
  if (!r->live) return;
  uint32_t L = m->lay[c].num_layers, pt = m->lay[c].page_tokens;
  uint64_t len = ref_len(m, i, 0, L), ext = ref_extent(m, i);
  uint64_t pages = 0, shared = 0;
  for (uint64_t idx = r->start / pt; idx < (ext + pt - 1) / pt; idx++) {
    if (page_none(m, i, idx)) continue; /* a page of holes: none held */
    pages++;
    shared += p->ref[page_of(m, i, idx * pt > r->start ? idx * pt : r->start)] > 1;
  }
  if (si.start != r->start || si.length != len || si.extent != ext || si.pages != pages ||
      si.shared_pages != shared || si.pins != (uint32_t)__builtin_popcount(r->pins))
    MISMATCH(m, "seq %d info: start %" PRIu64 "/%" PRIu64 " length %" PRIu64 "/%" PRIu64
             " extent %" PRIu64 "/%" PRIu64 " pages %u/%" PRIu64 " shared %u/%" PRIu64
             " pins %u/%d (engine/reference)", i, si.start, r->start, si.length, len,
             si.extent, ext, si.pages, pages, si.shared_pages, shared, si.pins,
             __builtin_popcount(r->pins));
  if (len > r->start) check_get(m, i, whole(m, i, r->start, len - r->start, 0, L), 0);
  for (uint32_t ly = 0; ly < L; ly++)
    if (r->llen[ly] > len) check_get(m, i, whole(m, i, len, r->llen[ly] - len, ly, ly + 1), 0);
}

/* Everything: every sequence, and the pool figures from the block tables. */
static void verify_all(model_t *m) {
  pages_t p;
  rebuild(m, &p, NULL);
  uint64_t used = 0, shared = 0, live = 0, pinned = 0, tokens = 0;
  for (int pg = 0; pg < NPAGES; pg++) used += p.ref[pg] > 0, shared += p.ref[pg] > 1;
  for (int i = 0; i < NSEQ; i++) {
    verify_seq(m, i, &p);
    if (!m->seq[i].live) continue;
    live++, pinned += m->seq[i].pins != 0;
    tokens += ref_len(m, i, 0, m->lay[cache_of(i)].num_layers);
  }
  engine_stats_t s;
  engine_stats(m->eng, &s);
  if (s.pages_used != used || s.pages_shared != shared || s.pages_free != NPAGES - used ||
      s.sequences != live || s.sequences_pinned != pinned || s.tokens != tokens)
    MISMATCH(m, "stats: used %" PRIu64 "/%" PRIu64 " shared %" PRIu64 "/%" PRIu64
             " free %" PRIu64 " seqs %" PRIu64 "/%" PRIu64 " pinned %" PRIu64 "/%" PRIu64
             " tokens %" PRIu64 "/%" PRIu64 " (engine/reference)", s.pages_used, used,
             s.pages_shared, shared, s.pages_free, s.sequences, live, s.sequences_pinned,
             pinned, s.tokens, tokens);
}

/* ---- put ------------------------------------------------------------------------------- */

typedef struct pent {
  int i;
  uint64_t pos, n;
  uint8_t *k, *v; /* the call's buffers, [layer][token][head][dim] in the put dtype */
  uint64_t kb, vb;
} pent_t;

typedef struct pcall {
  int c, n;
  uint32_t lb, le;
  kvc_dtype_t dt;
  pent_t e[3];
  bool in_call[NSEQ];
  uint64_t lb_need, ub_need; /* pages: certainly needed, needed at most */
} pcall_t;

/* A random payload element for cache c, in the put dtype, and the stored
 * reference bytes it becomes. */
static void rand_elem(model_t *m, int c, kvc_dtype_t dt, uint8_t *put, uint8_t *ref) {
  uint64_t r = rnd(m);
  if (c == 0) {
    uint32_t b = (uint32_t)r;
    memcpy(put, &b, 4), memcpy(ref, &b, 4);
    return;
  }
  uint16_t b = (uint16_t)r;
  if (dt == KVC_DTYPE_F32 && bf16_is_nan(b)) b = 0x7f80; /* NaN payloads may change */
  memcpy(ref, &b, 2);
  if (dt == KVC_DTYPE_F32) {
    uint32_t w = (uint32_t)b << 16;
    memcpy(put, &w, 4);
  } else {
    memcpy(put, &b, 2);
  }
}

/* Picks entry e of seq i: an append or an overwrite of 1..8 tokens. */
static void pick_entry(model_t *m, pcall_t *pc, pent_t *e, int i) {
  rseq_t *r = &m->seq[i];
  uint64_t st = r->live ? r->start : 0, have = r->live ? ref_len(m, i, pc->lb, pc->le) : 0;
  e->i = i;
  e->pos = below(m, 2) ? have : st + below(m, have - st + 1);
  if (e->pos >= MAXTOK) e->pos = st + below(m, MAXTOK - st);
  e->n = 1 + below(m, 8);
  if (e->pos + e->n > MAXTOK) e->n = MAXTOK - e->pos;
}

/* Fills e's buffers; ref_out gets the reference bytes in the same order. */
static void fill_entry(model_t *m, pcall_t *pc, pent_t *e, uint8_t **ref_k, uint8_t **ref_v) {
  const kvc_layout_t *l = &m->lay[pc->c];
  uint32_t pes = pc->dt == KVC_DTYPE_F32 ? 4 : m->esize[pc->c];
  uint64_t rows = (uint64_t)(pc->le - pc->lb) * e->n * l->num_kv_heads;
  uint64_t ke = rows * l->head_dim_k, ve = rows * l->head_dim_v;
  e->kb = ke * pes, e->vb = ve * pes;
  e->k = malloc(e->kb), e->v = malloc(e->vb);
  *ref_k = malloc(ke * m->esize[pc->c]), *ref_v = malloc(ve * m->esize[pc->c]);
  for (uint64_t j = 0; j < ke; j++)
    rand_elem(m, pc->c, pc->dt, e->k + j * pes, *ref_k + j * m->esize[pc->c]);
  for (uint64_t j = 0; j < ve; j++)
    rand_elem(m, pc->c, pc->dt, e->v + j * pes, *ref_v + j * m->esize[pc->c]);
}

/* Writes an applied entry into the reference. */
static void apply_entry(model_t *m, const pcall_t *pc, const pent_t *e, const uint8_t *rk,
                        const uint8_t *rv) {
  rseq_t *r = &m->seq[e->i];
  if (!r->live) {
    memset(r->llen, 0, sizeof r->llen);
    r->start = 0, r->pins = 0, r->live = true;
  }
  for (int is_v = 0; is_v < 2; is_v++) {
    uint64_t rb = row_bytes(m, pc->c, is_v);
    const uint8_t *src = is_v ? rv : rk;
    for (uint32_t ly = pc->lb; ly < pc->le; ly++)
      for (uint64_t t = e->pos; t < e->pos + e->n; t++, src += rb)
        memcpy(ref_row(m, e->i, is_v, t, ly), src, rb);
  }
  for (uint32_t ly = pc->lb; ly < pc->le; ly++)
    if (e->pos + e->n > r->llen[ly]) r->llen[ly] = e->pos + e->n;
  memset(r->hole + e->pos, 0, e->n * sizeof *r->hole); /* written: tokens again */
  use(m, e->i, true);
}

/* Pages the call needs: new pages past each table for certain, plus at most
 * one copy per shared page it writes into. */
static void need_pages(model_t *m, pcall_t *pc, const pages_t *p) {
  pc->lb_need = pc->ub_need = 0;
  uint64_t pt = m->lay[pc->c].page_tokens;
  for (int j = 0; j < pc->n; j++) {
    const pent_t *e = &pc->e[j];
    const rseq_t *r = &m->seq[e->i];
    uint64_t first = e->pos / pt, end = (e->pos + e->n + pt - 1) / pt;
    uint64_t held = r->live ? (ref_extent(m, e->i) + pt - 1) / pt : 0;
    if (held < first) held = first;
    pc->lb_need += end > held ? end - held : 0;
    for (uint64_t idx = first; r->live && idx < end && idx < held; idx++) {
      if (page_none(m, e->i, idx)) pc->lb_need++; /* a page of holes gets one */
      else pc->ub_need += p->ref[page_of(m, e->i, idx * pt > r->start ? idx * pt : r->start)] > 1;
    }
  }
  pc->ub_need += pc->lb_need;
}

/* After a successful put: which sequences did the engine evict, and were
 * they fair game, and the least recently used? */
static void learn_evictions(model_t *m, const pcall_t *pc, uint64_t free_before,
                            uint64_t evicted_before) {
  int gone[NSEQ], ngone = 0;
  for (int i = 0; i < NSEQ; i++) {
    if (!m->seq[i].live || pc->in_call[i]) continue;
    kvc_seq_info_t si;
    int rc = engine_seq_info(m->eng, m->cid[cache_of(i)], id_of(i), &si);
    if (rc == 0) continue;
    if (rc != KVC_E_NOSEQ) MISMATCH(m, "seq_info %d: %s", i, kvc_err_name(rc));
    if (m->seq[i].pins) MISMATCH(m, "pinned seq %d was evicted", i);
    gone[ngone++] = i;
  }
  if (ngone && pc->ub_need <= free_before)
    MISMATCH(m, "evicted %d sequences with %" PRIu64 " pages free for at most %" PRIu64
             " needed", ngone, free_before, pc->ub_need);
  for (int g = 0; g < ngone; g++)
    for (int i = 0; i < NSEQ; i++) {
      const rseq_t *y = &m->seq[i];
      if (!y->live || y->pins || pc->in_call[i] || i == gone[g]) continue;
      /* The two caches are two arenas (page sizes): across them the older
       * victim goes first only when its arena can give room (src/evict.c);
       * one whose victims free nothing keeps them. */
      if (cache_of(i) != cache_of(gone[g])) continue;
      bool y_gone = false;
      for (int h = 0; h < ngone; h++) y_gone |= gone[h] == i;
      if (y_gone) continue;
      m->nlru_checked++;
      if (m->seq[gone[g]].lu_lo > y->lu_hi)
        MISMATCH(m, "seq %d (used at tick %" PRIu64 ") evicted before seq %d (last named "
                 "at tick %" PRIu64 ")", gone[g], m->seq[gone[g]].lu_lo, i, y->lu_hi);
    }
  for (int g = 0; g < ngone; g++) ref_drop(m, gone[g]);
  m->nevicted += (uint64_t)ngone;
  engine_stats_t s;
  engine_stats(m->eng, &s);
  if (s.evicted_sequences - evicted_before != (uint64_t)ngone)
    MISMATCH(m, "evicted_sequences moved by %" PRIu64 ", %d sequences are gone",
             s.evicted_sequences - evicted_before, ngone);
}

/* A refused put changed nothing: same figures, every sequence intact. */
static void expect_unchanged(model_t *m, const engine_stats_t *s0) {
  engine_stats_t s1;
  engine_stats(m->eng, &s1);
#define SAME_(name, kind, unit, help)                                                \
  if (strcmp(#name, "errors") && strcmp(#name, "full_errors") &&              \
      strcmp(#name, "metadata_bytes") && s0->name != s1.name)                  \
    MISMATCH(m, "a failed call moved stat %s: %" PRIu64 " -> %" PRIu64, #name, s0->name, s1.name);
  ENGINE_STATS(SAME_)
#undef SAME_
  verify_all(m);
}

static void check_full(model_t *m, const pcall_t *pc, uint64_t can_free) {
  const engine_err_t *e = engine_last_error(m->eng);
  m->nfull++;
  if (pc->ub_need <= can_free)
    MISMATCH(m, "FULL, but at most %" PRIu64 " pages were needed and %" PRIu64
             " could be freed", pc->ub_need, can_free);
  if (e->needed <= e->freeable)
    MISMATCH(m, "FULL with needed %" PRIu64 " <= freeable %" PRIu64, e->needed, e->freeable);
  if (pc->lb_need == pc->ub_need) { /* no shared page written: the figures are exact */
    m->nfull_decided++;
    if (e->needed != pc->lb_need || e->freeable != can_free)
      MISMATCH(m, "FULL figures needed %" PRIu64 " freeable %" PRIu64 ", want %" PRIu64
               " and %" PRIu64, e->needed, e->freeable, pc->lb_need, can_free);
  }
}

static void op_put(model_t *m) {
  pcall_t pc;
  memset(&pc, 0, sizeof pc);
  pc.c = (int)below(m, 4) == 0;
  const kvc_layout_t *l = &m->lay[pc.c];
  pc.lb = 0, pc.le = l->num_layers;
  if (below(m, 5) == 0) {
    pc.lb = (uint32_t)below(m, l->num_layers);
    pc.le = pc.lb + 1 + (uint32_t)below(m, l->num_layers - pc.lb);
  }
  pc.dt = pc.c == 0 || below(m, 2) ? (pc.c ? KVC_DTYPE_BF16 : KVC_DTYPE_F32) : KVC_DTYPE_F32;
  int want = 1 + (below(m, 3) == 0) + (below(m, 6) == 0);
  for (int j = 0; j < want; j++) {
    int i = pc.c == 0 ? (int)below(m, NSEQ_A) : NSEQ_A + (int)below(m, NSEQ_B);
    if (pc.in_call[i]) continue;
    if (m->seq[i].live && m->seq[i].start >= MAXTOK) continue;
    pc.in_call[i] = true;
    pick_entry(m, &pc, &pc.e[pc.n++], i);
  }
  if (pc.n == 0) return;
  /* A layer range written into holes makes the other layers' slots tokens
   * that read as zeros, as the holes did (their rows stay zero here). */
  uint8_t *rk[3], *rv[3];
  engine_io_t io[3];
  for (int j = 0; j < pc.n; j++) {
    fill_entry(m, &pc, &pc.e[j], &rk[j], &rv[j]);
    engine_io_t x = {id_of(pc.e[j].i), pc.e[j].pos, pc.e[j].n, pc.e[j].k, pc.e[j].v,
                     pc.e[j].kb, pc.e[j].vb, NULL, NULL, 0, 0};
    io[j] = x;
  }
  bool bad = below(m, 40) == 0; /* one entry past the written length: RANGE */
  if (bad) {
    int j = (int)below(m, (uint64_t)pc.n);
    const rseq_t *r = &m->seq[pc.e[j].i];
    io[j].pos = (r->live ? ref_len(m, pc.e[j].i, pc.lb, pc.le) : 0) + 1;
    if (io[j].pos + io[j].ntokens > MAXTOK) bad = false, io[j].pos = pc.e[j].pos;
  }
  pages_t p;
  rebuild(m, &p, pc.in_call);
  need_pages(m, &pc, &p);
  uint64_t can_free = freeable(m, &p);
  engine_stats_t s0;
  engine_stats(m->eng, &s0);
  engine_xfer_t x = {.layer_begin = pc.lb, .layer_end = pc.le, .head_begin = 0, .head_end = 0, .dtype = pc.dt};
  int rc = engine_put(m->eng, m->cid[pc.c], &x, io, (size_t)pc.n);
  for (int j = 0; j < pc.n; j++)
    TRACE(m, "put seq %d [%" PRIu64 ", +%" PRIu64 ") layers [%u,%u) -> %s", pc.e[j].i,
          io[j].pos, io[j].ntokens, pc.lb, pc.le, kvc_err_name(rc));
  if (rc != 0)
    for (int j = 0; j < pc.n; j++) use(m, pc.e[j].i, false);
  if (bad) {
    if (rc != KVC_E_RANGE) MISMATCH(m, "put with a hole: %s, want RANGE", kvc_err_name(rc));
    expect_unchanged(m, &s0);
  } else if (rc == KVC_E_FULL) {
    check_full(m, &pc, can_free);
    expect_unchanged(m, &s0);
  } else if (rc == 0) {
    if (pc.lb_need > can_free)
      MISMATCH(m, "put fit %" PRIu64 " new pages with only %" PRIu64 " freeable",
               pc.lb_need, can_free);
    for (int j = 0; j < pc.n; j++) apply_entry(m, &pc, &pc.e[j], rk[j], rv[j]);
    learn_evictions(m, &pc, s0.pages_free, s0.evicted_sequences);
  } else {
    MISMATCH(m, "put: %s (%s)", kvc_err_name(rc), engine_last_error(m->eng)->msg);
  }
  for (int j = 0; j < pc.n; j++) free(pc.e[j].k), free(pc.e[j].v), free(rk[j]), free(rv[j]);
}

/* ---- the other operations --------------------------------------------------------------- */

static int pick_seq(model_t *m) { return (int)below(m, NSEQ); }

/* A sequence of the same cache as i, other than i. */
static int pick_other(model_t *m, int i) {
  int c = cache_of(i), n = c == 0 ? NSEQ_A : NSEQ_B, base = c == 0 ? 0 : NSEQ_A;
  int j = base + (int)below(m, (uint64_t)n - 1);
  return j >= i ? j + 1 : j;
}

static void expect_rc(model_t *m, const char *what, int i, int rc, int want) {
  if (rc != want)
    MISMATCH(m, "%s seq %d: %s, want %s (%s)", what, i, kvc_err_name(rc), kvc_err_name(want),
             engine_last_error(m->eng)->msg);
}

static void op_get(model_t *m) {
  int i = pick_seq(m), c = cache_of(i);
  const kvc_layout_t *l = &m->lay[c];
  rseq_t *r = &m->seq[i];
  span_t sp = whole(m, i, 0, 1, 0, l->num_layers);
  sp.lb = (uint32_t)below(m, l->num_layers);
  sp.le = sp.lb + 1 + (uint32_t)below(m, l->num_layers - sp.lb);
  sp.hb = (uint32_t)below(m, l->num_kv_heads);
  sp.he = sp.hb + 1 + (uint32_t)below(m, l->num_kv_heads - sp.hb);
  if (c == 1 && below(m, 2)) sp.dt = KVC_DTYPE_F32;
  if (!r->live) return check_get(m, i, sp, KVC_E_NOSEQ);
  uint64_t have = ref_len(m, i, sp.lb, sp.le);
  if (have <= r->start || below(m, 10) == 0) { /* one token past what is held */
    sp.pos = below(m, 2) && r->start > 0 ? r->start - 1 : have;
    return check_get(m, i, sp, KVC_E_RANGE);
  }
  sp.pos = r->start + below(m, have - r->start);
  sp.n = 1 + below(m, have - sp.pos);
  check_get(m, i, sp, 0);
}

/* The outcome engine.h gives remove(begin, end) on live seq i. */
static int remove_rule(model_t *m, int i, uint64_t b, uint64_t e, bool *drop, bool *cut) {
  uint64_t ext = ref_extent(m, i), len = ref_len(m, i, 0, m->lay[cache_of(i)].num_layers);
  *drop = *cut = false;
  if (b > e) return KVC_E_RANGE;
  if (b == e) return 0;
  if (e < len) return KVC_E_NOROPE; /* a middle range; these caches have no RoPE */
  if (b <= m->seq[i].start) *drop = true;
  else if (b < ext) *cut = true;
  return 0;
}

static void op_remove(model_t *m) {
  int i = pick_seq(m);
  rseq_t *r = &m->seq[i];
  uint64_t ext = r->live ? ref_extent(m, i) : 0, b, e = UINT64_MAX;
  uint64_t len = r->live ? ref_len(m, i, 0, m->lay[cache_of(i)].num_layers) : 0;
  switch (below(m, 5)) {
  case 0: b = below(m, r->start + 1); break;                        /* drop */
  case 1: /* cut, the end between the length and the extent */
    b = r->start + below(m, ext - r->start + 2), e = len + below(m, ext - len + 1);
    if (b > e) e = b;
    break;
  case 2: b = r->start + below(m, ext - r->start + 2); break;        /* cut */
  case 3: b = below(m, ext + 1), e = b + below(m, ext - b + 1); break; /* any range */
  default: e = below(m, ext + 1), b = e + 1 + below(m, 3); break;    /* begin > end */
  }
  use(m, i, false);
  int rc = engine_remove(m->eng, m->cid[cache_of(i)], id_of(i), b, e);
  TRACE(m, "remove seq %d [%" PRIu64 ", %" PRIu64 ") -> %s", i, b, e, kvc_err_name(rc));
  if (!r->live) return expect_rc(m, "remove", i, rc, KVC_E_NOSEQ);
  bool drop, cut;
  int want = remove_rule(m, i, b, e, &drop, &cut);
  expect_rc(m, "remove", i, rc, want);
  if (drop) ref_drop(m, i);
  for (uint32_t l = 0; cut && l < MAXL; l++) r->llen[l] = r->llen[l] < b ? r->llen[l] : b;
  if (cut && b < MAXTOK) memset(r->hole + b, 0, (MAXTOK - b) * sizeof *r->hole);
}

static void op_copy(model_t *m) {
  int i = pick_seq(m), j = pick_other(m, i), c = cache_of(i);
  rseq_t *s = &m->seq[i], *d = &m->seq[j];
  uint32_t L = m->lay[c].num_layers;
  uint64_t len = s->live ? ref_len(m, i, 0, L) : 0, n;
  int want = 0;
  switch (below(m, 10)) {
  case 0: n = len + 1 + below(m, 3), want = KVC_E_RANGE; break;
  case 1: n = s->start ? below(m, s->start) : len + 1, want = KVC_E_RANGE; break;
  default: n = s->start + below(m, len - s->start + 1); break;
  }
  if (!s->live) want = KVC_E_NOSEQ;
  if (want == 0 && n == s->start && n % m->lay[c].page_tokens) return; /* see op_trim */
  use(m, i, false), use(m, j, false);
  int rc = engine_copy_prefix(m->eng, m->cid[c], id_of(i), id_of(j), n);
  TRACE(m, "copy seq %d -> %d n %" PRIu64 " -> %s", i, j, n, kvc_err_name(rc));
  expect_rc(m, "copy_prefix", i, rc, want);
  if (rc) return;
  if (!d->live) d->pins = 0;
  d->live = true;
  d->start = s->start;
  for (uint32_t l = 0; l < MAXL; l++) d->llen[l] = l < L ? n : 0;
  memset(d->hole, 0, sizeof d->hole);
  memcpy(d->hole + s->start, s->hole + s->start, (n - s->start) * sizeof *d->hole);
  for (uint64_t t = s->start; t < n; t++)
    for (uint32_t ly = 0; ly < L; ly++)
      for (int is_v = 0; is_v < 2; is_v++)
        memcpy(ref_row(m, j, is_v, t, ly), ref_row(m, i, is_v, t, ly), row_bytes(m, c, is_v));
  use(m, i, true), use(m, j, true);
}

static void op_trim(model_t *m) {
  int i = pick_seq(m);
  rseq_t *r = &m->seq[i];
  uint64_t len = r->live ? ref_len(m, i, 0, m->lay[cache_of(i)].num_layers) : 0;
  uint64_t n = below(m, 8) ? below(m, len + 1) : len + 1 + below(m, 2);
  /* start == extent inside a page leaves a page with no position that
   * engine_page_offset can name; the pool rebuild needs one */
  if (r->live && n == ref_extent(m, i) && n % m->lay[cache_of(i)].page_tokens) n--;
  use(m, i, false);
  int rc = engine_trim_front(m->eng, m->cid[cache_of(i)], id_of(i), n);
  TRACE(m, "trim seq %d n %" PRIu64 " -> %s", i, n, kvc_err_name(rc));
  expect_rc(m, "trim_front", i, rc, !r->live ? KVC_E_NOSEQ : n > len ? KVC_E_RANGE : 0);
  if (rc == 0 && n > r->start) r->start = n;
}

static void op_pin(model_t *m, bool pin) {
  int i = pick_seq(m);
  rseq_t *r = &m->seq[i];
  uint8_t bit = (uint8_t)(1u << below(m, NOWNERS));
  uint64_t owner = (uint64_t)__builtin_ctz(bit) + 1;
  use(m, i, false); /* the engine counts pins as uses: see engine_api.c */
  uint32_t cid = m->cid[cache_of(i)];
  int rc = pin ? engine_pin(m->eng, cid, id_of(i), owner)
               : engine_unpin(m->eng, cid, id_of(i), owner);
  int want = !r->live ? KVC_E_NOSEQ : !pin && !(r->pins & bit) ? KVC_E_NOTPINNED : 0;
  TRACE(m, "%s seq %d owner %" PRIu64 " -> %s", pin ? "pin" : "unpin", i, owner, kvc_err_name(rc));
  expect_rc(m, pin ? "pin" : "unpin", i, rc, want);
  if (rc == 0) r->pins = pin ? (uint8_t)(r->pins | bit) : (uint8_t)(r->pins & ~bit);
}

static void op_unpin_all(model_t *m) {
  uint64_t o = below(m, NOWNERS);
  size_t want = 0;
  for (int i = 0; i < NSEQ; i++) {
    if (!m->seq[i].live || !(m->seq[i].pins & (1u << o))) continue;
    want++;
    m->seq[i].pins = (uint8_t)(m->seq[i].pins & ~(1u << o));
    use(m, i, false);
  }
  size_t got = engine_unpin_all(m->eng, o + 1);
  TRACE(m, "unpin_all %" PRIu64 " -> %zu", o + 1, got);
  if (got != want) MISMATCH(m, "unpin_all(%" PRIu64 ") released %zu, want %zu", o + 1, got, want);
}

static void op_clear(model_t *m) {
  int c = (int)below(m, 2);
  ASSERT_OK(engine_cache_clear(m->eng, m->cid[c]));
  TRACE(m, "clear cache %d", c);
  for (int i = 0; i < NSEQ; i++)
    if (cache_of(i) == c) ref_drop(m, i);
}

/* A forward pass that continues seq i past its length (ollama's reserve
 * after a copy_prefix): the slots skipped become holes (read as zeros;
 * their whole pages take no pool page), then the batch's tokens are put. */
static void op_gap(model_t *m) {
  int i = pick_seq(m);
  pcall_t pc;
  memset(&pc, 0, sizeof pc);
  pc.c = cache_of(i);
  const kvc_layout_t *l = &m->lay[pc.c];
  rseq_t *r = &m->seq[i];
  pc.lb = 0, pc.le = l->num_layers;
  pc.dt = pc.c ? KVC_DTYPE_BF16 : KVC_DTYPE_F32;
  uint64_t len = r->live ? ref_len(m, i, 0, l->num_layers) : 0;
  uint64_t lo = len + 1 + below(m, 3 * l->page_tokens), n = 1 + below(m, 4);
  if (lo + n > MAXTOK) return;
  pent_t *e = &pc.e[pc.n++];
  *e = (pent_t){.i = i, .pos = lo, .n = n};
  pc.in_call[i] = true;
  engine_tok_t toks[4];
  for (uint64_t k = 0; k < n; k++) toks[k] = (engine_tok_t){id_of(i), lo + k};
  pages_t p;
  rebuild(m, &p, pc.in_call);
  need_pages(m, &pc, &p);
  uint64_t can_free = freeable(m, &p);
  engine_stats_t s0;
  engine_stats(m->eng, &s0);
  int rc = engine_reserve(m->eng, m->cid[pc.c], toks, n);
  TRACE(m, "reserve seq %d [%" PRIu64 ", +%" PRIu64 ") after length %" PRIu64 " -> %s", i, lo,
        n, len, kvc_err_name(rc));
  use(m, i, false);
  if (r->live && ref_extent(m, i) != len) { /* layers of different lengths */
    if (rc != KVC_E_RANGE) MISMATCH(m, "reserve with uneven layers: %s, want RANGE", kvc_err_name(rc));
    return expect_unchanged(m, &s0);
  }
  if (rc == KVC_E_FULL) {
    check_full(m, &pc, can_free);
    return expect_unchanged(m, &s0);
  }
  if (rc) {
    MISMATCH(m, "reserve: %s (%s)", kvc_err_name(rc), engine_last_error(m->eng)->msg);
    return;
  }
  if (pc.lb_need > can_free)
    MISMATCH(m, "reserve fit %" PRIu64 " new pages with only %" PRIu64 " freeable", pc.lb_need,
             can_free);
  if (!r->live) {
    memset(r->llen, 0, sizeof r->llen);
    r->start = 0, r->pins = 0, r->live = true;
  }
  for (uint64_t t = len; t < lo; t++) { /* the gap: holes, read as zeros */
    r->hole[t] = true;
    for (uint32_t ly = 0; ly < l->num_layers; ly++) {
      memset(ref_row(m, i, 0, t, ly), 0, row_bytes(m, pc.c, 0));
      memset(ref_row(m, i, 1, t, ly), 0, row_bytes(m, pc.c, 1));
    }
  }
  for (uint32_t ly = 0; ly < l->num_layers; ly++) r->llen[ly] = lo;
  learn_evictions(m, &pc, s0.pages_free, s0.evicted_sequences);
  /* the put of the reserved slots needs no page: it cannot fail */
  uint8_t *rk, *rv;
  fill_entry(m, &pc, e, &rk, &rv);
  engine_io_t io = {id_of(i), lo, n, e->k, e->v, e->kb, e->vb, NULL, NULL, 0, 0};
  engine_xfer_t x = {.layer_begin = 0, .layer_end = 0, .head_begin = 0, .head_end = 0, .dtype = pc.dt};
  engine_stats(m->eng, &s0);
  rc = engine_put(m->eng, m->cid[pc.c], &x, &io, 1);
  if (rc) MISMATCH(m, "put of reserved slots: %s (%s)", kvc_err_name(rc), engine_last_error(m->eng)->msg);
  else apply_entry(m, &pc, e, rk, rv);
  engine_stats_t s1;
  engine_stats(m->eng, &s1);
  if (s1.pages_free != s0.pages_free || s1.evicted_sequences != s0.evicted_sequences)
    MISMATCH(m, "the put of reserved slots took pages: free %" PRIu64 " -> %" PRIu64,
             s0.pages_free, s1.pages_free);
  free(e->k), free(e->v), free(rk), free(rv);
  m->ngaps++;
}

static void step(model_t *m) {
  uint64_t r = below(m, 1000);

  engine_set_now(m->eng, m->op);
  if (r < 340) op_put(m);
  else if (r < 380) op_gap(m);
  else if (r < 580) op_get(m);
  else if (r < 660) op_remove(m);
  else if (r < 760) op_copy(m);
  else if (r < 830) op_trim(m);
  else if (r < 920) op_pin(m, true);
  else if (r < 987) op_pin(m, false);
  else if (r < 999) op_unpin_all(m);
  else op_clear(m);
  audit(m);
  if (m->op % 8 == 0) verify_all(m);
  m->op++;
}

static void run_seed(uint64_t seed, uint64_t nops, uint64_t *total, uint64_t *cow,
                     model_t *sum) {
  model_t *m = calloc(1, sizeof *m);
  model_open(m, seed);
  while (m->op < nops) step(m);
  verify_all(m);
  engine_stats_t s;
  engine_stats(m->eng, &s);
  *total += m->op;
  *cow += s.cow_copies;
  sum->nfull += m->nfull, sum->nevicted += m->nevicted, sum->mismatches += m->mismatches;
  sum->nlru_checked += m->nlru_checked, sum->nfull_decided += m->nfull_decided;
  sum->ngaps += m->ngaps;
  model_close(m);
  free(m);
}

#if defined(__SANITIZE_ADDRESS__)
#define MODEL_OPS 300000 /* per seed: about 40 s for 4 seeds under ASan */
#else
#define MODEL_OPS 500000 /* per seed: about 17 s for 4 seeds */
#endif

TEST_TIMEOUT(model_random_ops_match_reference, 170) {
  uint64_t per = MODEL_OPS * (test_long() ? 10 : 1), total = 0, cow = 0;
  model_t sum;
  memset(&sum, 0, sizeof sum);
  for (uint64_t seed = 1; seed <= 4; seed++) run_seed(seed, per, &total, &cow, &sum);
  fprintf(stderr,
          "model: %" PRIu64 " ops, %" PRIu64 " mismatches, %" PRIu64 " evictions, %" PRIu64
          " FULL (%" PRIu64 " with exact figures), %" PRIu64 " COW copies, %" PRIu64
          " LRU pairs checked, %" PRIu64 " reservations past a gap\n",
          total, sum.mismatches, sum.nevicted, sum.nfull, sum.nfull_decided, cow,
          sum.nlru_checked, sum.ngaps);
  ASSERT_U64_EQ(sum.mismatches, 0);
  ASSERT(total >= 4 * per);
  ASSERT(sum.nevicted > 0 && sum.nfull > 0 && cow > 0 && sum.ngaps > 0); /* the scenario happened */
}
