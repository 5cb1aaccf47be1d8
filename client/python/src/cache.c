/* cache.c: kvcache.Cache, an opened cache of a Client (kvc_cache_t): tensor
 * transfers (put, get and their batched, per-token, per-head, raw int8 and
 * shared-buffer forms) and every sequence operation, each one C call with
 * the GIL released while it waits.
 */
#include "pykvc.h"

#include <string.h>

static PyTypeObject *cache_cls = &pykvc_cache_type; /* kvcache.Cache once registered */

PyObject *cache_new(client_t *cl, kvc_cache_t *h) {
  cache_t *ca = (cache_t *)cache_cls->tp_alloc(cache_cls, 0);
  if (!ca) return NULL;
  Py_INCREF(cl);
  ca->client = cl;
  ca->h = h;
  ca->layout = *kvc_cache_layout(h);
  return (PyObject *)ca;
}

/* ValueError for a call on a closed cache (or on a cache of a closed client). */
static PyObject *closed_error(cache_t *ca) {
  PyErr_SetString(PyExc_ValueError, ca->client->c ? "operation on a closed kvcache.Cache"
                                                  : "operation on a closed kvcache.Client");
  return NULL;
}

int cache_enter(cache_t *ca) {
  if (ca->client->c && !ca->h) {
    PyErr_SetString(PyExc_ValueError, "operation on a closed kvcache.Cache");
    return -1;
  }
  return client_enter(ca->client);
}

static void cache_dealloc(cache_t *ca) {
  /* While another thread is in a call on the client, the handle is left to
   * kvc_client_close (closing it now would race with that call). */
  if (ca->client->c && ca->h && !ca->client->busy_thread) kvc_cache_close(ca->h);
  Py_DECREF(ca->client);
  Py_TYPE(ca)->tp_free((PyObject *)ca);
}

/* ---- argument helpers ---- */

static int range_arg(PyObject *o, uint32_t *b, uint32_t *e, const char *what) {
  *b = *e = 0;
  if (!o || o == Py_None) return 0;
  unsigned int x, y;
  if (!PyTuple_Check(o) || !PyArg_ParseTuple(o, "O&O&", pykvc_u32, &x, pykvc_u32, &y)) {
    PyErr_Clear();
    PyErr_Format(PyExc_ValueError, "%s must be a (begin, end) tuple or None, got %R", what, o);
    return -1;
  }
  *b = x;
  *e = y;
  return 0;
}

/* Fills x from layers, heads and dtype; the counts of layers and heads the
 * transfer covers go to *nl and *nh (-1 if the ranges are out of bounds:
 * the daemon then reports them). */
static int xfer_arg(cache_t *ca, PyObject *layers, PyObject *heads, PyObject *dtype,
                    kvc_xfer_t *x, Py_ssize_t *nl, Py_ssize_t *nh) {
  memset(x, 0, sizeof *x);
  int d;
  if (range_arg(layers, &x->layer_begin, &x->layer_end, "layers") < 0 ||
      range_arg(heads, &x->head_begin, &x->head_end, "heads") < 0 || dtype_parse(dtype, &d) < 0)
    return -1;
  x->dtype = (kvc_dtype_t)d;
  const kvc_layout_t *l = &ca->layout;
  uint32_t le = x->layer_end ? x->layer_end : l->num_layers;
  uint32_t he = x->head_end ? x->head_end : l->num_kv_heads;
  if (x->layer_begin >= le || le > l->num_layers) {
    PyErr_Format(PyExc_ValueError, "layers (%u, %u) outside the cache's %u layers",
                 x->layer_begin, le, l->num_layers);
    return -1;
  }
  if (x->head_begin >= he || he > l->num_kv_heads) {
    PyErr_Format(PyExc_ValueError, "heads (%u, %u) outside the cache's %u KV heads",
                 x->head_begin, he, l->num_kv_heads);
    return -1;
  }
  *nl = le - x->layer_begin;
  *nh = he - x->head_begin;
  return 0;
}

static bool is_fp8(int d) { return d == KVC_DTYPE_FP8_E4M3 || d == KVC_DTYPE_FP8_E5M2; }
static bool is_block(int d) { return d == KVC_DTYPE_Q8_0 || d == KVC_DTYPE_Q4_0; }
/* Caches whose own bytes come as uint8 arrays (NumPy has no fp8 or blocks). */
static bool is_bytes(int d) { return is_fp8(d) || is_block(d); }

/* The last dimension of a head row of hd values in dtype d: hd, or for
 * q8_0 / q4_0 the bytes of its blocks (34 or 18 a 32 values). */
static Py_ssize_t row_dim(int d, uint32_t hd) {
  return d == KVC_DTYPE_Q8_0 ? hd / 32 * 34 : d == KVC_DTYPE_Q4_0 ? hd / 32 * 18 : hd;
}

/* The dtypes a put accepts: the cache's and f32 (int8 caches: f32, f16,
 * bf16; fp8 caches: their own, f32, f16, bf16). A uint16 array stands for
 * bf16 bits in a bf16, int8 or fp8 cache, a uint8 array for an fp8 cache's
 * codes (NumPy has no fp8). */
static int put_dtype(cache_t *ca, tensor_t *t) {
  int cd = ca->layout.dtype;
  if (t->dtype == T_U16 && (cd == KVC_DTYPE_BF16 || cd == KVC_DTYPE_INT8 || is_bytes(cd)))
    t->dtype = KVC_DTYPE_BF16;
  if (t->dtype == T_U8 && is_bytes(cd)) t->dtype = cd;
  return cd;
}

static int put_ok(int cd, int *ok) {
  if (is_bytes(cd)) {
    ok[0] = cd;
    ok[1] = KVC_DTYPE_F32;
    ok[2] = KVC_DTYPE_F16;
    ok[3] = KVC_DTYPE_BF16;
    return 4;
  }
  if (cd == KVC_DTYPE_INT8) {
    ok[0] = KVC_DTYPE_F32;
    ok[1] = KVC_DTYPE_F16;
    ok[2] = KVC_DTYPE_BF16;
    return 3;
  }
  ok[0] = cd;
  ok[1] = KVC_DTYPE_F32;
  return cd == KVC_DTYPE_F32 ? 1 : 2;
}

/* Checks one put entry's k and v (already fetched) and returns its ntokens,
 * or -1. *dt is the common dtype (0 on the first entry). */
static Py_ssize_t put_check(cache_t *ca, tensor_t *k, tensor_t *v, Py_ssize_t nl, int *dt) {
  int cd = put_dtype(ca, k);
  put_dtype(ca, v);
  int ok[4], nok = put_ok(cd, ok);
  Py_ssize_t n = k->ndim == 4 ? k->shape[1] : -1;
  Py_ssize_t wk[4] = {nl, n < 0 ? -1 : n, ca->layout.num_kv_heads,
                      row_dim(k->dtype, ca->layout.head_dim_k)};
  Py_ssize_t wv[4] = {nl, n < 0 ? -1 : n, ca->layout.num_kv_heads,
                      row_dim(v->dtype, ca->layout.head_dim_v)};
  if (tensor_check(k, "k", wk, 4, ok, nok) < 0 || tensor_check(v, "v", wv, 4, ok, nok) < 0)
    return -1;
  if (k->dtype != v->dtype || (*dt && *dt != k->dtype)) {
    PyErr_Format(PyExc_ValueError, "k and v (and every entry of a batch) must share one dtype: "
                 "got %s and %s", dtype_name(*dt ? *dt : k->dtype), dtype_name(v->dtype));
    return -1;
  }
  *dt = k->dtype;
  return n;
}

/* ---- span keys ---- */

/* A sequence of (begin, end, key) with key bytes or str (UTF-8), into a
 * new PyMem block *out (keys copied after the array; free it with
 * PyMem_Free). None: none. -1 with an exception. */
static int span_keys_get(PyObject *o, kvc_span_key_t **out, size_t *n) {
  *out = NULL;
  *n = 0;
  if (o == Py_None) return 0;
  PyObject *seq = PySequence_Fast(o, "span_keys: a sequence of (begin, end, key)");
  if (!seq) return -1;
  Py_ssize_t m = PySequence_Fast_GET_SIZE(seq);
  if (m > (Py_ssize_t)KVC_MAX_SPAN_KEYS) {
    PyErr_Format(PyExc_ValueError, "span_keys: %zd keys, at most %u", m, KVC_MAX_SPAN_KEYS);
    Py_DECREF(seq);
    return -1;
  }
  kvc_span_key_t *s = PyMem_Malloc((size_t)(m ? m : 1) * (sizeof *s + KVC_MAX_KEY_BYTES));
  if (!s) {
    Py_DECREF(seq);
    PyErr_NoMemory();
    return -1;
  }
  char *keys = (char *)(s + m);
  for (Py_ssize_t i = 0; i < m; i++) {
    PyObject *t = PySequence_Fast_GET_ITEM(seq, i), *ko;
    unsigned long long b, e;
    if (!PyArg_ParseTuple(t, "O&O&O:span_keys", pykvc_u64, &b, pykvc_u64, &e, &ko)) goto fail;
    const char *kb;
    Py_ssize_t kl;
    if (PyUnicode_Check(ko)) {
      if (!(kb = PyUnicode_AsUTF8AndSize(ko, &kl))) goto fail;
    } else if (PyBytes_Check(ko)) {
      kb = PyBytes_AS_STRING(ko);
      kl = PyBytes_GET_SIZE(ko);
    } else {
      PyErr_Format(PyExc_TypeError, "span_keys[%zd]: the key is bytes or str", i);
      goto fail;
    }
    if (kl < 1 || kl > (Py_ssize_t)KVC_MAX_KEY_BYTES) {
      PyErr_Format(PyExc_ValueError, "span_keys[%zd]: a key of %zd bytes, 1 to %u", i, kl,
                   KVC_MAX_KEY_BYTES);
      goto fail;
    }
    memcpy(keys + i * KVC_MAX_KEY_BYTES, kb, (size_t)kl);
    s[i] = (kvc_span_key_t){b, e, keys + i * KVC_MAX_KEY_BYTES, (size_t)kl};
  }
  Py_DECREF(seq);
  *out = s;
  *n = (size_t)m;
  return 0;
fail:
  Py_DECREF(seq);
  PyMem_Free(s);
  return -1;
}

/* ---- buffers born in the shared buffer ---- */

/* If every tensor of t[0..n) (NULL ptrs skipped) lies in the client's
 * shared buffer (Client.shm_tensor), the bytes of the library's part below
 * the blocks (at least 1); else 0. The call then sends offsets. */
static uint64_t in_shm(cache_t *ca, const tensor_t *t, size_t n) {
  client_t *cl = ca->client;
  for (size_t i = 0; i < n; i++)
    if (t[i].ptr && shm_off(cl, t[i].ptr, t[i].nbytes) < 0) return 0;
  if (!n || !cl->shm) return 0;
  uint64_t lim = cl->nblks ? cl->blks[0].off : cl->shm->bytes;
  return lim ? lim : 1; /* (nonzero: a library part of 0 bytes holds no ids) */
}

/* The entries as kvc_put_shm / kvc_get_shm entries (their buffers in the
 * shared buffer: in_shm), token ids copied to the start of the library's
 * part; runs without the GIL. 1 if the ids do not fit there (the caller
 * takes the copying path), else the call's code. */
static int shm_xfer(cache_t *ca, const kvc_xfer_t *x, const kvc_io_t *io, size_t n, bool put,
                    uint64_t lim) {
  client_t *cl = ca->client;
  kvc_shm_io_t *s = PyMem_RawCalloc(n ? n : 1, sizeof *s);
  if (!s) return 1;
  void *base;
  uint64_t tok = 0;
  kvc_client_shm(cl->c, &base, NULL);
  for (size_t i = 0; i < n; i++) {
    const kvc_io_t *e = &io[i];
    s[i] = (kvc_shm_io_t){.seq_id = e->seq_id, .pos = e->pos, .ntokens = e->ntokens,
                          .k_off = (uint64_t)shm_off(cl, e->k, 0),
                          .v_off = (uint64_t)shm_off(cl, e->v, 0),
                          .span_keys = e->span_keys, .nspan_keys = e->nspan_keys};
    if (e->tokens && e->ntokens) {
      uint64_t tb = 4 * e->ntokens;
      if (tb > lim || tok > lim - tb) {
        PyMem_RawFree(s);
        return 1;
      }
      memcpy((char *)base + tok, e->tokens, tb);
      s[i].tok_off = tok, s[i].tok_len = tb;
      tok += tb;
    }
  }
  int rc = put ? kvc_put_shm(ca->h, x, s, n) : kvc_get_shm(ca->h, x, s, n);
  PyMem_RawFree(s);
  return rc;
}

/* A put or get of n entries: as offsets when every buffer is in the shared
 * buffer (no copy here; shm is then the library's part, taken with the GIL:
 * a block freed meanwhile changes the client's list), else through the
 * library's copies. No GIL. */
static int xfer_call(cache_t *ca, const kvc_xfer_t *x, const kvc_io_t *io, size_t n, bool put,
                     uint64_t shm) {
  int rc = shm ? shm_xfer(ca, x, io, n, put, shm) : 1;
  if (rc == 1) rc = put ? kvc_put_batch(ca->h, x, io, n) : kvc_get_batch(ca->h, x, io, n);
  return rc;
}

/* ---- put ---- */

static PyObject *cache_put(cache_t *ca, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"seq", "pos", "k", "v", "tokens", "layers", "span_keys",
                           "k_scale", "v_scale", NULL};
  unsigned long long seq, pos;
  PyObject *ko, *vo, *toks = Py_None, *layers = Py_None, *spo = Py_None;
  float ksc = 0, vsc = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O&O&OO|OOOff:put", kwlist, pykvc_u64, &seq, pykvc_u64, &pos, &ko, &vo, &toks,
                                   &layers, &spo, &ksc, &vsc))
    return NULL;
  kvc_xfer_t x;
  Py_ssize_t nl, nh;
  if (xfer_arg(ca, layers, Py_None, Py_None, &x, &nl, &nh) < 0) return NULL;
  x.k_scale = ksc, x.v_scale = vsc;
  tensor_t k, v, tt = {0};
  uint32_t *ids = NULL, *owned = NULL;
  Py_ssize_t nids = 0;
  PyObject *ret = NULL;
  kvc_span_key_t *spans;
  size_t nspans;
  if (span_keys_get(spo, &spans, &nspans) < 0) return NULL;
  if (tensor_get(ko, &k, false, "k") < 0) {
    PyMem_Free(spans);
    return NULL;
  }
  if (tensor_get(vo, &v, false, "v") < 0) {
    tensor_release(&k);
    PyMem_Free(spans);
    return NULL;
  }
  int dt = 0;
  Py_ssize_t n = put_check(ca, &k, &v, nl, &dt);
  if (n < 0) goto out;
  if (toks != Py_None) {
    if (tokens_get(toks, &tt, &ids, &owned, &nids) < 0) goto out;
    if (nids != n) {
      PyErr_Format(PyExc_ValueError, "tokens: %zd ids for %zd tokens", nids, n);
      goto out;
    }
  }
  x.dtype = dt == (int)ca->layout.dtype ? 0 : (kvc_dtype_t)dt;
  kvc_io_t io = {seq, pos, (uint64_t)n, k.ptr, v.ptr, NULL, NULL, ids, spans, nspans};
  if (cache_enter(ca) < 0) goto out;
  int rc;
  tensor_t kv[2] = {k, v};
  uint64_t shm = in_shm(ca, kv, 2);
  Py_BEGIN_ALLOW_THREADS rc = xfer_call(ca, &x, &io, 1, true, shm);
  Py_END_ALLOW_THREADS
  cache_leave(ca);
  if (rc) pykvc_raise(ca->client->c, rc);
  else ret = Py_NewRef(Py_None);
out:
  tensor_release(&k);
  tensor_release(&v);
  tensor_release(&tt);
  PyMem_Free(owned);
  PyMem_Free(spans);
  return ret;
}

/* One written entry (seq, pos, k, v[, tokens]) of put_batch (what
 * "entries") or a step (what "writes", tuple its expected form): its tensors
 * fetched into t[0..3), checked (*dt the batch's dtype), its ids into *ids
 * (*owned to free). Returns its tokens, or -1 with the error set and
 * nothing held. */
static Py_ssize_t put_entry_arg(cache_t *ca, PyObject *e, Py_ssize_t i, const char *what,
                                const char *tuple, Py_ssize_t nl, int *dt, tensor_t *t,
                                uint64_t *seq, uint64_t *pos, uint32_t **ids, uint32_t **owned) {
  unsigned long long s, p;
  PyObject *ko, *vo, *toks = Py_None;
  *ids = *owned = NULL;
  if (!PyTuple_Check(e) ||
      !PyArg_ParseTuple(e, "O&O&OO|O", pykvc_u64, &s, pykvc_u64, &p, &ko, &vo, &toks)) {
    if (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_TypeError)) {
      PyErr_Clear();
      PyErr_Format(PyExc_ValueError, "%s[%zd]: expected %s", what, i, tuple);
    }
    return -1;
  }
  *seq = s, *pos = p;
  tensor_t *k = &t[0], *v = &t[1], *tt = &t[2];
  memset(tt, 0, sizeof *tt);
  if (tensor_get(ko, k, false, "k") < 0) return -1;
  if (tensor_get(vo, v, false, "v") < 0) {
    tensor_release(k);
    return -1;
  }
  Py_ssize_t nt = put_check(ca, k, v, nl, dt);
  if (nt >= 0 && toks != Py_None) {
    Py_ssize_t nids;
    if (tokens_get(toks, tt, ids, owned, &nids) < 0) {
      nt = -1;
    } else if (nids != nt) {
      PyErr_Format(PyExc_ValueError, "%s[%zd]: %zd token ids for %zd tokens", what, i, nids, nt);
      nt = -1;
    }
  }
  if (nt < 0) {
    tensor_release(k);
    tensor_release(v);
    tensor_release(tt);
    PyMem_Free(*owned);
    *ids = *owned = NULL;
  }
  return nt;
}

static PyObject *cache_put_batch(cache_t *ca, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"entries", "layers", NULL};
  PyObject *entries, *layers = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O:put_batch", kwlist, &entries, &layers))
    return NULL;
  kvc_xfer_t x;
  Py_ssize_t nl, nh;
  if (xfer_arg(ca, layers, Py_None, Py_None, &x, &nl, &nh) < 0) return NULL;
  PyObject *seq = PySequence_Fast(entries, "entries: a sequence of (seq, pos, k, v[, tokens])");
  if (!seq) return NULL;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), got = 0;
  PyObject *ret = NULL;
  kvc_io_t *io = PyMem_Calloc((size_t)(n ? n : 1), sizeof *io);
  tensor_t *ts = PyMem_Calloc((size_t)(n ? n : 1) * 3, sizeof *ts);
  uint32_t **owned = PyMem_Calloc((size_t)(n ? n : 1), sizeof *owned);
  if (!io || !ts || !owned) {
    PyErr_NoMemory();
    goto out;
  }
  int dt = 0;
  for (; got < n; got++) {
    uint64_t s, p;
    uint32_t *ids;
    Py_ssize_t nt = put_entry_arg(ca, PySequence_Fast_GET_ITEM(seq, got), got, "entries",
                                  "(seq, pos, k, v[, tokens])", nl, &dt, &ts[3 * got], &s, &p,
                                  &ids, &owned[got]);
    if (nt < 0) goto out;
    io[got] = (kvc_io_t){s, p, (uint64_t)nt, ts[3 * got].ptr, ts[3 * got + 1].ptr, NULL, NULL,
                         ids};
  }
  x.dtype = dt == (int)ca->layout.dtype ? 0 : (kvc_dtype_t)dt;
  if (cache_enter(ca) < 0) goto out;
  int rc;
  uint64_t shm = n > 0;
  for (Py_ssize_t i = 0; i < n && shm; i++) shm = in_shm(ca, &ts[3 * i], 2);
  Py_BEGIN_ALLOW_THREADS rc = xfer_call(ca, &x, io, (size_t)n, true, shm);
  Py_END_ALLOW_THREADS
  cache_leave(ca);
  if (rc) pykvc_raise(ca->client->c, rc);
  else ret = Py_NewRef(Py_None);
out:
  for (Py_ssize_t i = 0; ts && i < got; i++) {
    tensor_release(&ts[3 * i]);
    tensor_release(&ts[3 * i + 1]);
    tensor_release(&ts[3 * i + 2]);
    PyMem_Free(owned[i]);
  }
  PyMem_Free(io);
  PyMem_Free(ts);
  PyMem_Free(owned);
  Py_DECREF(seq);
  return ret;
}

/* ---- get ---- */

/* The dtype a get returns for x.dtype d (0: natural). */
static int get_dtype(cache_t *ca, int d) {
  if (d) return d;
  return ca->layout.dtype == KVC_DTYPE_INT8 ? KVC_DTYPE_F32 : (int)ca->layout.dtype;
}

/* An output of shape want and dtype d: out (checked, fetched into *t) or a
 * new array (returned, fetched into *t). Returns a new reference or NULL. */
static PyObject *out_arg(PyObject *out, tensor_t *t, const Py_ssize_t *want, int nd, int d,
                         const char *what) {
  PyObject *o = out;
  if (!o || o == Py_None) {
    if (!(o = array_new(want, nd, d))) return NULL;
  } else {
    Py_INCREF(o);
  }
  if (tensor_get(o, t, true, what) < 0) {
    Py_DECREF(o);
    return NULL;
  }
  if (t->dtype == T_U16 && d == KVC_DTYPE_BF16) t->dtype = KVC_DTYPE_BF16;
  if (t->dtype == T_U8 && is_bytes(d)) t->dtype = d;
  if (tensor_check(t, what, want, nd, &d, 1) < 0) {
    tensor_release(t);
    Py_DECREF(o);
    return NULL;
  }
  return o;
}

/* dtype for a get: an explicit dtype, else out's dtype if it is f32 and the
 * natural one is not, else natural. */
static int get_xdtype(cache_t *ca, PyObject *dtype, PyObject *out_k, int *d) {
  if (dtype_parse(dtype, d) < 0) return -1;
  if (*d || !out_k || out_k == Py_None) return 0;
  tensor_t t;
  if (tensor_get(out_k, &t, false, "out") < 0) return -1;
  if (t.dtype == KVC_DTYPE_F32 && get_dtype(ca, 0) != KVC_DTYPE_F32) *d = KVC_DTYPE_F32;
  /* an fp8 cache converts into f16 and bf16 too (uint16 bits stay bf16's) */
  if (is_bytes(ca->layout.dtype) && (t.dtype == KVC_DTYPE_F16 || t.dtype == KVC_DTYPE_BF16 ||
                                   t.dtype == T_U16))
    *d = t.dtype == KVC_DTYPE_F16 ? KVC_DTYPE_F16 : KVC_DTYPE_BF16;
  tensor_release(&t);
  return 0;
}

static int out_pair(PyObject *out, PyObject **ok, PyObject **ov) {
  *ok = *ov = Py_None;
  if (!out || out == Py_None) return 0;
  if (!PyTuple_Check(out) || PyTuple_GET_SIZE(out) != 2) {
    PyErr_SetString(PyExc_ValueError, "out must be a (k, v) tuple of arrays or tensors");
    return -1;
  }
  *ok = PyTuple_GET_ITEM(out, 0);
  *ov = PyTuple_GET_ITEM(out, 1);
  return 0;
}

static PyObject *cache_get(cache_t *ca, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"seq", "begin", "end", "out", "dtype", "layers", "heads",
                           "k_scale", "v_scale", NULL};
  unsigned long long seq, b, e;
  PyObject *out = Py_None, *dtype = Py_None, *layers = Py_None, *heads = Py_None, *ok, *ov;
  float ksc = 0, vsc = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O&O&O&|OOOOff:get", kwlist, pykvc_u64, &seq, pykvc_u64, &b, pykvc_u64, &e, &out, &dtype,
                                   &layers, &heads, &ksc, &vsc))
    return NULL;
  if (out_pair(out, &ok, &ov) < 0) return NULL;
  if (e < b || e - b > KVC_MAX_SEQ_TOKENS) {
    PyErr_Format(PyExc_ValueError, "get: end %llu before begin %llu or range too large", e, b);
    return NULL;
  }
  kvc_xfer_t x;
  Py_ssize_t nl, nh;
  int d;
  if (xfer_arg(ca, layers, heads, dtype, &x, &nl, &nh) < 0) return NULL;
  if (get_xdtype(ca, dtype, ok, &d) < 0) return NULL;
  x.dtype = (kvc_dtype_t)d;
  x.k_scale = ksc, x.v_scale = vsc;
  int gd = get_dtype(ca, d);
  Py_ssize_t n = (Py_ssize_t)(e - b);
  Py_ssize_t wk[4] = {nl, n, nh, row_dim(gd, ca->layout.head_dim_k)},
             wv[4] = {nl, n, nh, row_dim(gd, ca->layout.head_dim_v)};
  if (wk[0] * wk[1] * wk[2] * wk[3] > (Py_ssize_t)1 << 40) {
    PyErr_Format(PyExc_ValueError, "get: %zd tokens is too large a read", n);
    return NULL;
  }
  tensor_t tk, tv;
  PyObject *rk = out_arg(ok, &tk, wk, 4, gd, "out k");
  if (!rk) return NULL;
  PyObject *rv = out_arg(ov, &tv, wv, 4, gd, "out v");
  if (!rv) {
    tensor_release(&tk);
    Py_DECREF(rk);
    return NULL;
  }
  PyObject *ret = NULL;
  kvc_io_t io = {seq, b, (uint64_t)n, tk.ptr, tv.ptr, NULL, NULL, NULL};
  if (cache_enter(ca) == 0) {
    int rc;
    tensor_t kv[2] = {tk, tv};
    uint64_t shm = in_shm(ca, kv, 2);
    Py_BEGIN_ALLOW_THREADS rc = n ? xfer_call(ca, &x, &io, 1, false, shm) : 0;
    Py_END_ALLOW_THREADS
    cache_leave(ca);
    if (rc) pykvc_raise(ca->client->c, rc);
    else ret = PyTuple_Pack(2, rk, rv);
  }
  tensor_release(&tk);
  tensor_release(&tv);
  Py_DECREF(rk);
  Py_DECREF(rv);
  return ret;
}

static PyObject *cache_get_batch(cache_t *ca, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"entries", "dtype", "layers", "heads", NULL};
  PyObject *entries, *dtype = Py_None, *layers = Py_None, *heads = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O|OOO:get_batch", kwlist, &entries, &dtype,
                                   &layers, &heads))
    return NULL;
  kvc_xfer_t x;
  Py_ssize_t nl, nh;
  if (xfer_arg(ca, layers, heads, dtype, &x, &nl, &nh) < 0) return NULL;
  int gd = get_dtype(ca, x.dtype);
  PyObject *seq = PySequence_Fast(entries, "entries: a sequence of (seq, pos, n[, out_k, out_v])");
  if (!seq) return NULL;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), got = 0;
  PyObject *ret = NULL, *outs = PyList_New(n);
  kvc_io_t *io = PyMem_Calloc((size_t)(n ? n : 1), sizeof *io);
  tensor_t *ts = PyMem_Calloc((size_t)(n ? n : 1) * 2, sizeof *ts);
  if (!io || !ts || !outs) {
    if (outs) PyErr_NoMemory();
    goto out;
  }
  for (; got < n; got++) {
    PyObject *e = PySequence_Fast_GET_ITEM(seq, got), *ok = Py_None, *ov = Py_None;
    unsigned long long s, p, nt;
    if (!PyTuple_Check(e) || !PyArg_ParseTuple(e, "O&O&O&|OO", pykvc_u64, &s, pykvc_u64, &p, pykvc_u64, &nt, &ok, &ov)) {
      PyErr_Clear();
      PyErr_Format(PyExc_ValueError, "entries[%zd]: expected (seq, pos, n[, out_k, out_v])", got);
      goto out;
    }
    if (nt > KVC_MAX_SEQ_TOKENS) {
      PyErr_Format(PyExc_ValueError, "entries[%zd]: %llu tokens is too large a read", got, nt);
      goto out;
    }
    Py_ssize_t wk[4] = {nl, (Py_ssize_t)nt, nh, row_dim(gd, ca->layout.head_dim_k)};
    Py_ssize_t wv[4] = {nl, (Py_ssize_t)nt, nh, row_dim(gd, ca->layout.head_dim_v)};
    PyObject *rk = out_arg(ok, &ts[2 * got], wk, 4, gd, "out k");
    if (!rk) goto out;
    PyObject *rv = out_arg(ov, &ts[2 * got + 1], wv, 4, gd, "out v");
    if (!rv) {
      tensor_release(&ts[2 * got]);
      Py_DECREF(rk);
      goto out;
    }
    PyObject *pair = PyTuple_Pack(2, rk, rv);
    Py_DECREF(rk);
    Py_DECREF(rv);
    if (!pair) {
      tensor_release(&ts[2 * got]);
      tensor_release(&ts[2 * got + 1]);
      goto out;
    }
    PyList_SET_ITEM(outs, got, pair);
    io[got] = (kvc_io_t){s, p, nt, ts[2 * got].ptr, ts[2 * got + 1].ptr, NULL, NULL, NULL};
  }
  if (cache_enter(ca) < 0) goto out;
  int rc;
  uint64_t shm = n > 0 ? in_shm(ca, ts, 2 * (size_t)n) : 0;
  Py_BEGIN_ALLOW_THREADS rc = xfer_call(ca, &x, io, (size_t)n, false, shm);
  Py_END_ALLOW_THREADS
  cache_leave(ca);
  if (rc) pykvc_raise(ca->client->c, rc);
  else ret = Py_NewRef(outs);
out:
  for (Py_ssize_t i = 0; ts && i < got; i++) {
    tensor_release(&ts[2 * i]);
    tensor_release(&ts[2 * i + 1]);
  }
  PyMem_Free(io);
  PyMem_Free(ts);
  Py_XDECREF(outs);
  Py_DECREF(seq);
  return ret;
}

static PyObject *cache_get_token(cache_t *ca, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"seq", "pos", "dtype", "layers", "heads", NULL};
  unsigned long long seq, pos;
  PyObject *dtype = Py_None, *layers = Py_None, *heads = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O&O&|OOO:get_token", kwlist, pykvc_u64, &seq, pykvc_u64, &pos, &dtype,
                                   &layers, &heads))
    return NULL;
  kvc_xfer_t x;
  Py_ssize_t nl, nh;
  if (xfer_arg(ca, layers, heads, dtype, &x, &nl, &nh) < 0) return NULL;
  int gd = get_dtype(ca, x.dtype);
  Py_ssize_t wk[3] = {nl, nh, row_dim(gd, ca->layout.head_dim_k)},
             wv[3] = {nl, nh, row_dim(gd, ca->layout.head_dim_v)};
  tensor_t tk, tv;
  PyObject *rk = out_arg(NULL, &tk, wk, 3, gd, "k"), *rv = NULL, *ret = NULL;
  if (!rk) return NULL;
  if (!(rv = out_arg(NULL, &tv, wv, 3, gd, "v"))) {
    tensor_release(&tk);
    Py_DECREF(rk);
    return NULL;
  }
  if (cache_enter(ca) == 0) {
    int rc;
    Py_BEGIN_ALLOW_THREADS rc = kvc_get_token(ca->h, seq, pos, &x, tk.ptr, tv.ptr);
    Py_END_ALLOW_THREADS
    cache_leave(ca);
    if (rc) pykvc_raise(ca->client->c, rc);
    else ret = PyTuple_Pack(2, rk, rv);
  }
  tensor_release(&tk);
  tensor_release(&tv);
  Py_DECREF(rk);
  Py_DECREF(rv);
  return ret;
}

static PyObject *cache_get_head(cache_t *ca, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"seq", "layer", "head", "begin", "end", NULL};
  unsigned long long seq, b, e;
  unsigned int layer, head;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O&O&O&O&O&:get_head", kwlist, pykvc_u64, &seq, pykvc_u32, &layer, pykvc_u32, &head, pykvc_u64, &b, pykvc_u64,
                                   &e))
    return NULL;
  if (e < b || e - b > (1ull << 31)) {
    PyErr_Format(PyExc_ValueError, "get_head: bad range [%llu, %llu)", b, e);
    return NULL;
  }
  int gd = get_dtype(ca, 0);
  Py_ssize_t wk[2] = {(Py_ssize_t)(e - b), row_dim(gd, ca->layout.head_dim_k)};
  Py_ssize_t wv[2] = {(Py_ssize_t)(e - b), row_dim(gd, ca->layout.head_dim_v)};
  tensor_t tk, tv;
  PyObject *rk = out_arg(NULL, &tk, wk, 2, gd, "k"), *rv = NULL, *ret = NULL;
  if (!rk) return NULL;
  if (!(rv = out_arg(NULL, &tv, wv, 2, gd, "v"))) {
    tensor_release(&tk);
    Py_DECREF(rk);
    return NULL;
  }
  if (cache_enter(ca) == 0) {
    int rc;
    Py_BEGIN_ALLOW_THREADS rc = kvc_get_head(ca->h, seq, layer, head, b, e, tk.ptr, tv.ptr);
    Py_END_ALLOW_THREADS
    cache_leave(ca);
    if (rc) pykvc_raise(ca->client->c, rc);
    else ret = PyTuple_Pack(2, rk, rv);
  }
  tensor_release(&tk);
  tensor_release(&tv);
  Py_DECREF(rk);
  Py_DECREF(rv);
  return ret;
}

static PyObject *cache_get_raw(cache_t *ca, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"seq", "begin", "end", "layers", "heads", NULL};
  unsigned long long seq, b, e;
  PyObject *layers = Py_None, *heads = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O&O&O&|OO:get_raw", kwlist, pykvc_u64, &seq, pykvc_u64, &b, pykvc_u64, &e, &layers,
                                   &heads))
    return NULL;
  if (e < b || e - b > (1ull << 31)) {
    PyErr_Format(PyExc_ValueError, "get_raw: bad range [%llu, %llu)", b, e);
    return NULL;
  }
  if (ca->layout.dtype != KVC_DTYPE_INT8) return pykvc_raise(NULL, KVC_E_DTYPE);
  kvc_xfer_t x;
  Py_ssize_t nl, nh, n = (Py_ssize_t)(e - b);
  if (xfer_arg(ca, layers, heads, Py_None, &x, &nl, &nh) < 0) return NULL;
  Py_ssize_t wk[4] = {nl, n, nh, ca->layout.head_dim_k}, wv[4] = {nl, n, nh, ca->layout.head_dim_v};
  Py_ssize_t ws[3] = {nl, n, nh};
  tensor_t t[4];
  PyObject *o[4] = {NULL, NULL, NULL, NULL}, *ret = NULL;
  int i = 0;
  if (!(o[0] = out_arg(NULL, &t[0], wk, 4, KVC_DTYPE_INT8, "k"))) goto out;
  i++;
  if (!(o[1] = out_arg(NULL, &t[1], wv, 4, KVC_DTYPE_INT8, "v"))) goto out;
  i++;
  if (!(o[2] = out_arg(NULL, &t[2], ws, 3, KVC_DTYPE_F32, "k_scale"))) goto out;
  i++;
  if (!(o[3] = out_arg(NULL, &t[3], ws, 3, KVC_DTYPE_F32, "v_scale"))) goto out;
  i++;
  if (cache_enter(ca) == 0) {
    int rc;
    Py_BEGIN_ALLOW_THREADS rc = n ? kvc_get_raw(ca->h, seq, b, e, &x, t[0].ptr, t[1].ptr,
                                                t[2].ptr, t[3].ptr)
                                  : 0;
    Py_END_ALLOW_THREADS
    cache_leave(ca);
    if (rc) pykvc_raise(ca->client->c, rc);
    else ret = PyTuple_Pack(4, o[0], o[1], o[2], o[3]);
  }
out:
  for (int j = 0; j < i; j++) tensor_release(&t[j]);
  for (int j = 0; j < 4; j++) Py_XDECREF(o[j]);
  return ret;
}

/* ---- shared-buffer forms ---- */

/* The entries of a direct-buffer call: a new array (PyMem_Free it) and *n,
 * or NULL with the error set. */
static kvc_shm_io_t *shm_entries_arg(PyObject *entries, Py_ssize_t *n_out) {
  PyObject *seq = PySequence_Fast(entries, "entries: a sequence of tuples of ints");
  if (!seq) return NULL;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  kvc_shm_io_t *io = PyMem_Calloc((size_t)(n ? n : 1), sizeof *io);
  if (!io) {
    PyErr_NoMemory();
    goto out;
  }
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *e = PySequence_Fast_GET_ITEM(seq, i);
    kvc_shm_io_t *s = &io[i];
    if (!PyTuple_Check(e) ||
        !PyArg_ParseTuple(e, "O&O&O&O&O&|O&O&O&O&O&O&", pykvc_u64, &s->seq_id, pykvc_u64, &s->pos, pykvc_u64, &s->ntokens, pykvc_u64, &s->k_off, pykvc_u64,
                          &s->v_off, pykvc_u64, &s->k_len, pykvc_u64, &s->v_len, pykvc_u64, &s->k_scale_off, pykvc_u64, &s->v_scale_off, pykvc_u64,
                          &s->tok_off, pykvc_u64, &s->tok_len)) {
      PyErr_Clear();
      PyErr_Format(PyExc_ValueError, "entries[%zd]: expected (seq, pos, n, k_off, v_off[, k_len, "
                   "v_len, k_scale_off, v_scale_off, tok_off, tok_len])", i);
      PyMem_Free(io);
      io = NULL;
      goto out;
    }
  }
  *n_out = n;
out:
  Py_DECREF(seq);
  return io;
}

static PyObject *cache_shm_xfer(cache_t *ca, PyObject *args, PyObject *kw, bool put) {
  static char *kwlist[] = {"entries", "dtype", "layers", "heads", NULL};
  PyObject *entries, *dtype = Py_None, *layers = Py_None, *heads = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O|OOO", kwlist, &entries, &dtype, &layers, &heads))
    return NULL;
  kvc_xfer_t x;
  Py_ssize_t nl, nh, n = 0;
  if (xfer_arg(ca, layers, heads, dtype, &x, &nl, &nh) < 0) return NULL;
  kvc_shm_io_t *io = shm_entries_arg(entries, &n);
  PyObject *ret = NULL;
  if (!io) return NULL;
  if (cache_enter(ca) < 0) goto out;
  int rc;
  Py_BEGIN_ALLOW_THREADS rc = put ? kvc_put_shm(ca->h, &x, io, (size_t)n)
                                  : kvc_get_shm(ca->h, &x, io, (size_t)n);
  Py_END_ALLOW_THREADS
  cache_leave(ca);
  if (rc) pykvc_raise(ca->client->c, rc);
  else ret = Py_NewRef(Py_None);
out:
  PyMem_Free(io);
  return ret;
}

static PyObject *cache_put_shm(cache_t *ca, PyObject *a, PyObject *k) { return cache_shm_xfer(ca, a, k, true); }
static PyObject *cache_get_shm(cache_t *ca, PyObject *a, PyObject *k) { return cache_shm_xfer(ca, a, k, false); }

static PyObject *cache_xfer_bytes(cache_t *ca, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"ntokens", "put", "dtype", "layers", "heads", NULL};
  unsigned long long n;
  int put = 0;
  PyObject *dtype = Py_None, *layers = Py_None, *heads = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O&|pOOO:xfer_bytes", kwlist, pykvc_u64, &n, &put, &dtype,
                                   &layers, &heads))
    return NULL;
  kvc_xfer_t x;
  Py_ssize_t nl, nh;
  if (xfer_arg(ca, layers, heads, dtype, &x, &nl, &nh) < 0) return NULL;
  if (!ca->client->c || !ca->h) return closed_error(ca);
  uint64_t kb, vb, sb;
  int rc = kvc_xfer_bytes(ca->h, &x, put != 0, n, &kb, &vb, &sb);
  if (rc) return pykvc_raise(NULL, rc);
  return Py_BuildValue("(KKK)", kb, vb, sb);
}

/* ---- batches of tokens: reserve, history ---- */

/* kvc_tok_t[n] from an [n, 2] int64/uint64 array (used in place) or a
 * sequence of (seq, pos) pairs (copied into *owned). */
static int toks_arg(PyObject *o, tensor_t *t, kvc_tok_t **toks, kvc_tok_t **owned, size_t *n) {
  *owned = NULL;
  memset(t, 0, sizeof *t);
  if (PyObject_CheckBuffer(o)) {
    if (tensor_get(o, t, false, "toks") < 0) return -1;
    if (t->dtype == T_I64 && t->ndim == 2 && t->shape[1] == 2) {
      *toks = t->ptr;
      *n = (size_t)t->shape[0];
      return 0;
    }
    tensor_release(t);
  }
  PyObject *seq = PySequence_Fast(o, "toks: a sequence of (seq, pos) or an [n, 2] int64 array");
  if (!seq) return -1;
  Py_ssize_t len = PySequence_Fast_GET_SIZE(seq);
  kvc_tok_t *a = PyMem_Malloc((size_t)(len ? len : 1) * sizeof *a);
  if (!a) {
    Py_DECREF(seq);
    PyErr_NoMemory();
    return -1;
  }
  for (Py_ssize_t i = 0; i < len; i++) {
    PyObject *e = PySequence_Fast_GET_ITEM(seq, i);
    unsigned long long s, p;
    if (!PyTuple_Check(e) || !PyArg_ParseTuple(e, "O&O&", pykvc_u64, &s, pykvc_u64, &p)) {
      PyErr_Clear();
      PyErr_Format(PyExc_ValueError, "toks[%zd]: expected a (seq, pos) tuple", i);
      PyMem_Free(a);
      Py_DECREF(seq);
      return -1;
    }
    a[i] = (kvc_tok_t){s, p};
  }
  Py_DECREF(seq);
  *toks = *owned = a;
  *n = (size_t)len;
  return 0;
}

static PyObject *cache_reserve(cache_t *ca, PyObject *args) {
  PyObject *o;
  if (!PyArg_ParseTuple(args, "O:reserve", &o)) return NULL;
  tensor_t t;
  kvc_tok_t *toks, *owned;
  size_t n;
  if (toks_arg(o, &t, &toks, &owned, &n) < 0) return NULL;
  PyObject *ret = NULL;
  if (cache_enter(ca) == 0) {
    int rc;
    Py_BEGIN_ALLOW_THREADS rc = kvc_reserve(ca->h, toks, n);
    Py_END_ALLOW_THREADS
    cache_leave(ca);
    ret = rc ? pykvc_raise(ca->client->c, rc) : Py_NewRef(Py_None);
  }
  tensor_release(&t);
  PyMem_Free(owned);
  return ret;
}

/* The raw history: (entries, k_off, k_bytes, v_off, v_bytes, mask_off,
 * mask_bytes, dtype, [(seq, pos, first, n)]); kvcache.Cache.history makes
 * the arrays. */
/* A view's per-entry positions as bytes of int64, or None when they are
 * the spans' slots (no sequence of the view has positions of its own). */
static PyObject *positions_obj(const kvc_hist_t *h) {
  if (!h->positions) Py_RETURN_NONE;
  return PyBytes_FromStringAndSize((const char *)h->positions,
                                   (Py_ssize_t)(h->entries * sizeof *h->positions));
}

static PyObject *cache_history_raw(cache_t *ca, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"toks", "dtype", "layers", NULL};
  PyObject *o, *dtype = Py_None, *layers = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O|OO:history", kwlist, &o, &dtype, &layers))
    return NULL;
  kvc_xfer_t x;
  Py_ssize_t nl, nh;
  if (xfer_arg(ca, layers, Py_None, dtype, &x, &nl, &nh) < 0) return NULL;
  tensor_t t;
  kvc_tok_t *toks, *owned;
  size_t n;
  if (toks_arg(o, &t, &toks, &owned, &n) < 0) return NULL;
  PyObject *ret = NULL;
  size_t cap = n ? n : 1;
  kvc_hist_span_t *spans = PyMem_Calloc(cap, sizeof *spans);
  kvc_hist_t h;
  if (!spans) {
    PyErr_NoMemory();
  } else if (cache_enter(ca) == 0) {
    int rc;
    Py_BEGIN_ALLOW_THREADS rc = kvc_history(ca->h, &x, toks, n, &h, spans, cap);
    Py_END_ALLOW_THREADS
    cache_leave(ca);
    if (rc) {
      pykvc_raise(ca->client->c, rc);
    } else {
      PyObject *sl = PyList_New(0);
      for (size_t i = 0; sl && i < h.nspans && i < cap; i++) {
        PyObject *s = Py_BuildValue("(KKKK)", spans[i].seq_id, spans[i].pos, spans[i].first,
                                    spans[i].n);
        if (!s || PyList_Append(sl, s) < 0) Py_CLEAR(sl);
        Py_XDECREF(s);
      }
      PyObject *pos = sl ? positions_obj(&h) : NULL;
      if (sl && pos)
        ret = Py_BuildValue("(KKKKKKKsNN)", h.entries, h.k_off, h.k_bytes, h.v_off, h.v_bytes,
                            h.mask_off, h.mask_bytes, dtype_name(get_dtype(ca, x.dtype)), sl,
                            pos);
      else
        Py_XDECREF(sl);
    }
  }
  PyMem_Free(spans);
  tensor_release(&t);
  PyMem_Free(owned);
  return ret;
}

/* What a step returns: view 0 None; else (entries, k_off, k_bytes, v_off,
 * v_bytes, mask_off, mask_bytes, dtype, [(seq, pos, first, n)], [Lease],
 * positions, tables) with tables Cache._block_tables of the leases (None
 * without a lease view or arenas); kvcache.Cache.step makes the arrays.
 * Takes the leases (released later on failure). */
static PyObject *step_reply(cache_t *ca, int view, const kvc_step_t *st, int xdtype,
                            kvc_hist_span_t *spans, kvc_lease_t **leases, size_t cap) {
  PyObject *ret = NULL, *sl = NULL, *ll = NULL, *pos = NULL, *tables = NULL;
  if (view == KVC_VIEW_NONE) return Py_NewRef(Py_None);
  sl = PyList_New(0);
  ll = PyList_New(0);
  for (size_t i = 0; sl && ll && i < st->hist.nspans && i < cap; i++) {
    PyObject *s = Py_BuildValue("(KKKK)", spans[i].seq_id, spans[i].pos, spans[i].first,
                                spans[i].n);
    if (!s || PyList_Append(sl, s) < 0) Py_CLEAR(sl);
    Py_XDECREF(s);
    if (view != KVC_VIEW_LEASE || !ll) continue;
    PyObject *l = lease_new(ca, leases[i], spans[i].seq_id, spans[i].pos,
                            spans[i].pos + spans[i].n);
    if (l) leases[i] = NULL; /* the Lease object owns it */
    if (!l || PyList_Append(ll, l) < 0) Py_CLEAR(ll);
    Py_XDECREF(l);
  }
  if (sl && ll && view == KVC_VIEW_LEASE && PyList_GET_SIZE(ll) > 0 &&
      kvc_lease_info(((lease_t *)PyList_GET_ITEM(ll, 0))->l)->block_table) {
    PyObject *a = PyTuple_Pack(1, ll);
    tables = a ? cache_block_tables(ca, a) : NULL;
    Py_XDECREF(a);
    if (!tables) goto out;
  } else {
    tables = Py_NewRef(Py_None);
  }
  if (sl && ll && (pos = positions_obj(&st->hist)))
    ret = Py_BuildValue("(KKKKKKKsOONN)", st->hist.entries, st->hist.k_off, st->hist.k_bytes,
                        st->hist.v_off, st->hist.v_bytes, st->hist.mask_off, st->hist.mask_bytes,
                        dtype_name(get_dtype(ca, xdtype)), sl, ll, pos, Py_NewRef(tables));
out:
  for (size_t i = 0; view == KVC_VIEW_LEASE && leases && i < cap; i++)
    if (leases[i]) {
      kvc_lease_release_later(leases[i]);
      leases[i] = NULL;
    }
  Py_XDECREF(tables);
  Py_XDECREF(sl);
  Py_XDECREF(ll);
  return ret;
}

static PyObject *cache_step_raw(cache_t *ca, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"entries", "view", "out_off", "out_len", "no_mask", "dtype", "layers",
                           NULL};
  PyObject *entries, *dtype = Py_None, *layers = Py_None;
  int view = 0, no_mask = 0;
  unsigned long long off = 0, len = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O|iO&O&pOO:step", kwlist, &entries, &view,
                                   pykvc_u64, &off, pykvc_u64, &len, &no_mask, &dtype, &layers))
    return NULL;
  kvc_xfer_t x;
  Py_ssize_t nl, nh, n = 0;
  if (xfer_arg(ca, layers, Py_None, dtype, &x, &nl, &nh) < 0) return NULL;
  kvc_shm_io_t *io = shm_entries_arg(entries, &n);
  if (!io) return NULL;
  size_t cap = n ? (size_t)n : 1;
  kvc_hist_span_t *spans = PyMem_Calloc(cap, sizeof *spans);
  kvc_lease_t **leases = PyMem_Calloc(cap, sizeof *leases);
  PyObject *ret = NULL;
  kvc_step_t st = {.view = (kvc_view_t)view, .out_off = off, .out_len = len,
                   .no_mask = no_mask != 0, .spans = spans, .spans_cap = cap,
                   .leases = view == KVC_VIEW_LEASE ? leases : NULL, .leases_cap = cap};
  if (!spans || !leases) {
    PyErr_NoMemory();
    goto out;
  }
  if (cache_enter(ca) < 0) goto out;
  int rc;
  Py_BEGIN_ALLOW_THREADS rc = kvc_step(ca->h, &x, io, (size_t)n, &st);
  Py_END_ALLOW_THREADS
  cache_leave(ca);
  if (rc) pykvc_raise(ca->client->c, rc);
  else ret = step_reply(ca, view, &st, x.dtype, spans, leases, cap);
out:
  PyMem_Free(io);
  PyMem_Free(spans);
  PyMem_Free(leases);
  return ret;
}

/* A copy into the shared buffer that _step_io makes without the GIL. */
typedef struct {
  uint64_t off;
  const void *src;
  uint64_t n;
} stage_t;

static uint64_t al64(uint64_t x) { return (x + 63) & ~(uint64_t)63; }

/* The step with tensors: writes are (seq, pos, k, v[, tokens]) as put's
 * (kvcache.StepWrite); a tensor in the shared buffer (Client.shm_tensor)
 * goes as its offset, any other is copied into the library's part (below
 * the lowest block) here, without the GIL, then kvc_step; the view lands
 * after the copies. Returns step_reply's tuple. */
PyObject *cache_step_io(cache_t *ca, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"writes", "view", "no_mask", "layers", NULL};
  PyObject *writes, *layers = Py_None;
  int view = 0, no_mask = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O|ipO:step", kwlist, &writes, &view, &no_mask,
                                   &layers))
    return NULL;
  kvc_xfer_t x;
  Py_ssize_t nl, nh;
  if (xfer_arg(ca, layers, Py_None, Py_None, &x, &nl, &nh) < 0) return NULL;
  PyObject *seq = PySequence_Fast(writes, "writes: a sequence of StepWrite (seq, pos, k, v[, "
                                  "tokens])");
  if (!seq) return NULL;
  client_t *cl = ca->client;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), got = 0;
  size_t cap = n ? (size_t)n : 1;
  PyObject *ret = NULL;
  kvc_shm_io_t *io = PyMem_Calloc(cap, sizeof *io);
  tensor_t *ts = PyMem_Calloc(cap * 3, sizeof *ts);
  uint32_t **owned = PyMem_Calloc(cap, sizeof *owned);
  stage_t *cp = PyMem_Calloc(cap * 3, sizeof *cp);
  kvc_hist_span_t *spans = PyMem_Calloc(cap, sizeof *spans);
  kvc_lease_t **leases = PyMem_Calloc(cap, sizeof *leases);
  size_t ncp = 0;
  if (!io || !ts || !owned || !cp || !spans || !leases) {
    PyErr_NoMemory();
    goto out;
  }
  if (!cl->c) {
    PyErr_SetString(PyExc_ValueError, "operation on a closed kvcache.Client");
    goto out;
  }
  void *base;
  uint64_t bytes, used = 0;
  kvc_client_shm(cl->c, &base, &bytes);
  uint64_t lim = cl->nblks ? cl->blks[0].off : bytes;
  int dt = 0;
  for (; got < n; got++) {
    uint64_t s, p;
    uint32_t *ids;
    tensor_t *k = &ts[3 * got], *v = k + 1;
    Py_ssize_t nt = put_entry_arg(ca, PySequence_Fast_GET_ITEM(seq, got), got, "writes",
                                  "StepWrite(seq, pos, k, v[, tokens]) with k and v [layer, "
                                  "token, head, dim] tensors", nl, &dt, k, &s, &p, &ids,
                                  &owned[got]);
    if (nt < 0) goto out;
    io[got] = (kvc_shm_io_t){.seq_id = s, .pos = p, .ntokens = (uint64_t)nt,
                             .k_len = k->nbytes, .v_len = v->nbytes};
    const tensor_t *kv[2] = {k, v};
    uint64_t *offs[2] = {&io[got].k_off, &io[got].v_off};
    for (int j = 0; j < 2; j++) {
      int64_t o = shm_off(cl, kv[j]->ptr, kv[j]->nbytes);
      if (o >= 0) {
        *offs[j] = (uint64_t)o;
        continue;
      }
      *offs[j] = al64(used);
      used = *offs[j] + kv[j]->nbytes;
      cp[ncp++] = (stage_t){*offs[j], kv[j]->ptr, kv[j]->nbytes};
    }
    if (ids) {
      io[got].tok_off = al64(used);
      io[got].tok_len = 4 * (uint64_t)nt;
      used = io[got].tok_off + io[got].tok_len;
      cp[ncp++] = (stage_t){io[got].tok_off, ids, io[got].tok_len};
    }
  }
  if (used > lim) {
    char msg[256];
    snprintf(msg, sizeof msg,
             "the step's writes need %llu bytes of the shared buffer to be copied into, it has "
             "%llu below its blocks: make K/V in it (Client.shm_tensor: no copy), or open the "
             "client with a larger shm_bytes",
             (unsigned long long)used, (unsigned long long)lim);
    pykvc_raise_msg(KVC_E_SIZE, msg);
    goto out;
  }
  x.dtype = dt == (int)ca->layout.dtype ? 0 : (kvc_dtype_t)dt;
  uint64_t off = al64(used);
  kvc_step_t st = {.view = (kvc_view_t)view, .out_off = off, .out_len = lim > off ? lim - off : 0,
                   .no_mask = no_mask != 0, .spans = spans, .spans_cap = cap,
                   .leases = view == KVC_VIEW_LEASE ? leases : NULL, .leases_cap = cap};
  if (cache_enter(ca) < 0) goto out;
  int rc;
  Py_BEGIN_ALLOW_THREADS
  for (size_t i = 0; i < ncp; i++) memcpy((char *)base + cp[i].off, cp[i].src, cp[i].n);
  rc = kvc_step(ca->h, &x, io, (size_t)n, &st);
  Py_END_ALLOW_THREADS
  cache_leave(ca);
  if (rc) pykvc_raise(cl->c, rc);
  else ret = step_reply(ca, view, &st, x.dtype, spans, leases, cap);
out:
  for (Py_ssize_t i = 0; ts && i < got; i++) {
    tensor_release(&ts[3 * i]);
    tensor_release(&ts[3 * i + 1]);
    tensor_release(&ts[3 * i + 2]);
  }
  for (Py_ssize_t i = 0; owned && i < n; i++) PyMem_Free(owned[i]);
  PyMem_Free(io);
  PyMem_Free(ts);
  PyMem_Free(owned);
  PyMem_Free(cp);
  PyMem_Free(spans);
  PyMem_Free(leases);
  Py_DECREF(seq);
  return ret;
}

/* ---- sequence operations ---- */

#define CALL_(expr)                                      \
  do {                                                   \
    if (cache_enter(ca) < 0) return NULL;                \
    int rc_;                                             \
    Py_BEGIN_ALLOW_THREADS rc_ = (expr);                 \
    Py_END_ALLOW_THREADS                                 \
    cache_leave(ca);                                     \
    if (rc_) return pykvc_raise(ca->client->c, rc_);     \
  } while (0)

static PyObject *cache_remove(cache_t *ca, PyObject *args) {
  unsigned long long seq, b = 0, e = UINT64_MAX >> 1;
  if (!PyArg_ParseTuple(args, "O&|O&O&:remove", pykvc_u64, &seq, pykvc_u64, &b, pykvc_u64, &e)) return NULL;
  CALL_(kvc_seq_remove(ca->h, seq, b, e));
  Py_RETURN_NONE;
}

static PyObject *cache_copy_prefix(cache_t *ca, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"src", "dst", "n", "replace", NULL};
  unsigned long long src, dst, n;
  int replace = 1;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O&O&O&|p:copy_prefix", kwlist, pykvc_u64, &src,
                                   pykvc_u64, &dst, pykvc_u64, &n, &replace))
    return NULL;
  CALL_(replace ? kvc_seq_copy_prefix(ca->h, src, dst, n) : kvc_seq_copy_prefix_new(ca->h, src, dst, n));
  Py_RETURN_NONE;
}

static PyObject *cache_copy_range(cache_t *ca, PyObject *args) {
  unsigned long long src, dst, p0, p1;
  if (!PyArg_ParseTuple(args, "O&O&O&O&:copy_range", pykvc_u64, &src, pykvc_u64, &dst,
                        pykvc_u64, &p0, pykvc_u64, &p1))
    return NULL;
  CALL_(kvc_seq_copy_range(ca->h, src, dst, p0, p1));
  Py_RETURN_NONE;
}

static PyObject *cache_can_resume(cache_t *ca, PyObject *args) {
  unsigned long long seq, pos;
  bool r = false;
  if (!PyArg_ParseTuple(args, "O&O&:can_resume", pykvc_u64, &seq, pykvc_u64, &pos)) return NULL;
  CALL_(kvc_seq_can_resume(ca->h, seq, pos, &r));
  return PyBool_FromLong(r);
}

static PyObject *cache_trim_front(cache_t *ca, PyObject *args) {
  unsigned long long seq, n;
  if (!PyArg_ParseTuple(args, "O&O&:trim_front", pykvc_u64, &seq, pykvc_u64, &n)) return NULL;
  CALL_(kvc_seq_trim_front(ca->h, seq, n));
  Py_RETURN_NONE;
}

static PyObject *cache_shift(cache_t *ca, PyObject *args) {
  unsigned long long seq;
  long long p0, p1, delta;
  if (!PyArg_ParseTuple(args, "O&LLL:shift", pykvc_u64, &seq, &p0, &p1, &delta)) return NULL;
  CALL_(kvc_seq_shift(ca->h, seq, p0, p1, delta));
  Py_RETURN_NONE;
}

static PyObject *cache_seq_div(cache_t *ca, PyObject *args) {
  unsigned long long seq;
  long long p0, p1, d;
  if (!PyArg_ParseTuple(args, "O&LLL:seq_div", pykvc_u64, &seq, &p0, &p1, &d)) return NULL;
  CALL_(kvc_seq_div(ca->h, seq, p0, p1, d));
  Py_RETURN_NONE;
}

static PyObject *cache_punch(cache_t *ca, PyObject *args) {
  unsigned long long seq;
  long long p0, p1;
  if (!PyArg_ParseTuple(args, "O&LL:punch", pykvc_u64, &seq, &p0, &p1)) return NULL;
  CALL_(kvc_seq_punch(ca->h, seq, p0, p1));
  Py_RETURN_NONE;
}

static PyObject *cache_keep(cache_t *ca, PyObject *args) {
  unsigned long long seq;
  if (!PyArg_ParseTuple(args, "O&:keep", pykvc_u64, &seq)) return NULL;
  CALL_(kvc_seq_keep(ca->h, seq));
  Py_RETURN_NONE;
}

static PyObject *cache_pos_range(cache_t *ca, PyObject *args) {
  unsigned long long seq;
  int64_t a = -1, b = -1;
  if (!PyArg_ParseTuple(args, "O&:pos_range", pykvc_u64, &seq)) return NULL;
  CALL_(kvc_seq_pos_range(ca->h, seq, &a, &b));
  return Py_BuildValue("(LL)", (long long)a, (long long)b);
}

static PyObject *cache_pin(cache_t *ca, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"seq", "ttl_ms", NULL};
  unsigned long long seq;
  PyObject *ttl = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O&|O:pin", kwlist, pykvc_u64, &seq, &ttl)) return NULL;
  if (ttl == Py_None) {
    CALL_(kvc_seq_pin(ca->h, seq));
  } else {
    unsigned long long t = PyLong_AsUnsignedLongLong(ttl);
    if (PyErr_Occurred()) return NULL;
    CALL_(kvc_seq_pin_ttl(ca->h, seq, t));
  }
  Py_RETURN_NONE;
}

static PyObject *cache_unpin(cache_t *ca, PyObject *args) {
  unsigned long long seq;
  if (!PyArg_ParseTuple(args, "O&:unpin", pykvc_u64, &seq)) return NULL;
  CALL_(kvc_seq_unpin(ca->h, seq));
  Py_RETURN_NONE;
}

static PyObject *cache_set_priority(cache_t *ca, PyObject *args) {
  unsigned long long seq;
  unsigned int p;
  if (!PyArg_ParseTuple(args, "O&O&:set_priority", pykvc_u64, &seq, pykvc_u32, &p)) return NULL;
  CALL_(kvc_seq_set_priority(ca->h, seq, p));
  Py_RETURN_NONE;
}

static PyObject *seq_info_dict(const kvc_seq_info_t *i) {
  return Py_BuildValue("{s:K,s:K,s:K,s:K,s:I,s:I,s:I,s:K}", "seq_id", i->seq_id, "start",
                       i->start, "length", i->length, "extent", i->extent, "pages", i->pages,
                       "shared_pages", i->shared_pages, "pins", i->pins, "last_use_ms",
                       i->last_use_ms);
}

static PyObject *cache_info(cache_t *ca, PyObject *args) {
  unsigned long long seq;
  kvc_seq_info_t i;
  if (!PyArg_ParseTuple(args, "O&:info", pykvc_u64, &seq)) return NULL;
  CALL_(kvc_seq_info(ca->h, seq, &i));
  return seq_info_dict(&i);
}

static PyObject *cache_seqs(cache_t *ca, PyObject *noargs) {
  (void)noargs;
  PyObject *l = PyList_New(0);
  uint64_t cursor = 0;
  kvc_seq_info_t buf[64];
  if (!l) return NULL;
  do {
    size_t n = 0;
    if (cache_enter(ca) < 0) goto fail;
    int rc;
    Py_BEGIN_ALLOW_THREADS rc = kvc_seq_list(ca->h, &cursor, buf, 64, &n);
    Py_END_ALLOW_THREADS
    cache_leave(ca);
    if (rc) {
      pykvc_raise(ca->client->c, rc);
      goto fail;
    }
    for (size_t i = 0; i < n; i++) {
      PyObject *d = seq_info_dict(&buf[i]);
      if (!d || PyList_Append(l, d) < 0) {
        Py_XDECREF(d);
        goto fail;
      }
      Py_DECREF(d);
    }
  } while (cursor != 0);
  return l;
fail:
  Py_DECREF(l);
  return NULL;
}

/* ---- prefix cache ---- */

static PyObject *match_dict(const kvc_match_t *m) {
  return Py_BuildValue("{s:K,s:K,s:K}", "tokens", m->tokens, "pages", m->pages, "ineligible",
                       m->ineligible);
}

static PyObject *cache_match_attach(cache_t *ca, PyObject *tokens, PyObject *spo, bool attach,
                                    uint64_t dst, int flags) {
  tensor_t t;
  uint32_t *ids, *owned;
  Py_ssize_t n;
  kvc_span_key_t *spans;
  size_t nspans;
  if (span_keys_get(spo, &spans, &nspans) < 0) return NULL;
  if (tokens_get(tokens, &t, &ids, &owned, &n) < 0) {
    PyMem_Free(spans);
    return NULL;
  }
  kvc_match_t m = {0};
  PyObject *ret = NULL;
  if (cache_enter(ca) == 0) {
    int rc;
    Py_BEGIN_ALLOW_THREADS rc =
        attach ? kvc_attach_spans(ca->h, dst, ids, (uint64_t)n, spans, nspans, (unsigned)flags, &m)
               : kvc_match_spans(ca->h, ids, (uint64_t)n, spans, nspans, &m);
    Py_END_ALLOW_THREADS
    cache_leave(ca);
    ret = rc ? pykvc_raise(ca->client->c, rc) : match_dict(&m);
  }
  tensor_release(&t);
  PyMem_Free(owned);
  PyMem_Free(spans);
  return ret;
}

static PyObject *cache_match(cache_t *ca, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"tokens", "span_keys", NULL};
  PyObject *tokens, *spo = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O:match", kwlist, &tokens, &spo)) return NULL;
  return cache_match_attach(ca, tokens, spo, false, 0, 0);
}

static PyObject *cache_attach(cache_t *ca, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"dst", "tokens", "pin", "replace", "span_keys", NULL};
  unsigned long long dst;
  PyObject *tokens, *spo = Py_None;
  int pin = 0, replace = 1;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O&O|ppO:attach", kwlist, pykvc_u64, &dst, &tokens,
                                   &pin, &replace, &spo))
    return NULL;
  return cache_match_attach(ca, tokens, spo, true, dst,
                            (pin ? KVC_ATTACH_PIN : 0) | (replace ? 0 : KVC_ATTACH_NO_REPLACE));
}

static PyObject *cache_create(cache_t *ca, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"n", "owned", NULL};
  unsigned long long n = 1;
  int owned = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "|O&p:create", kwlist, pykvc_u64, &n, &owned))
    return NULL;
  if (n == 0 || n > 4096) {
    PyErr_SetString(PyExc_ValueError, "create: n is 1 to 4096");
    return NULL;
  }
  uint64_t ids[4096];
  CALL_(kvc_seq_create(ca->h, (size_t)n, owned != 0, ids));
  PyObject *l = PyList_New((Py_ssize_t)n);
  for (size_t i = 0; l && i < n; i++) {
    PyObject *v = PyLong_FromUnsignedLongLong(ids[i]);
    if (!v) {
      Py_CLEAR(l);
      break;
    }
    PyList_SET_ITEM(l, (Py_ssize_t)i, v);
  }
  return l;
}

static PyObject *cache_set_extra(cache_t *ca, PyObject *args) {
  Py_buffer b;
  if (!PyArg_ParseTuple(args, "y*:set_extra", &b)) return NULL;
  int rc = KVC_E_INVAL;
  if (cache_enter(ca) == 0) {
    rc = kvc_cache_set_extra(ca->h, b.buf, (size_t)b.len);
    cache_leave(ca);
  } else {
    PyBuffer_Release(&b);
    return NULL;
  }
  PyBuffer_Release(&b);
  if (rc) return pykvc_raise(ca->client->c, rc);
  Py_RETURN_NONE;
}

static PyObject *cache_prefix_top(cache_t *ca, PyObject *args) {
  unsigned int cap = 10;
  if (!PyArg_ParseTuple(args, "|O&:prefix_top", pykvc_u32, &cap)) return NULL;
  if (cap == 0 || cap > 1000) {
    PyErr_Format(PyExc_ValueError, "prefix_top: n must be 1..1000, got %u", cap);
    return NULL;
  }
  kvc_prefix_head_t *a = PyMem_Calloc(cap, sizeof *a);
  if (!a) return PyErr_NoMemory();
  size_t n = 0;
  int rc = KVC_E_INVAL;
  if (cache_enter(ca) < 0) {
    PyMem_Free(a);
    return NULL;
  }
  Py_BEGIN_ALLOW_THREADS rc = kvc_prefix_top(ca->h, a, cap, &n);
  Py_END_ALLOW_THREADS
  cache_leave(ca);
  if (rc) {
    PyMem_Free(a);
    return pykvc_raise(ca->client->c, rc);
  }
  PyObject *l = PyList_New(0);
  for (size_t i = 0; l && i < n; i++) {
    PyObject *d = Py_BuildValue("{s:y#,s:I,s:K}", "hash", (const char *)a[i].hash,
                                (Py_ssize_t)a[i].hash_len, "depth", a[i].depth, "hits", a[i].hits);
    if (!d || PyList_Append(l, d) < 0) Py_CLEAR(l);
    Py_XDECREF(d);
  }
  PyMem_Free(a);
  return l;
}

/* ---- the cache itself ---- */

static PyObject *cache_clear(cache_t *ca, PyObject *noargs) {
  (void)noargs;
  CALL_(kvc_cache_clear(ca->h));
  Py_RETURN_NONE;
}

static PyObject *cache_drop(cache_t *ca, PyObject *noargs) {
  (void)noargs;
  CALL_(kvc_cache_drop(ca->h));
  Py_RETURN_NONE;
}

static PyObject *cache_close(cache_t *ca, PyObject *noargs) {
  (void)noargs;
  if (ca->client->busy_thread) {
    PyErr_SetString(PyExc_RuntimeError, "kvcache.Cache closed while another thread is in a call");
    return NULL;
  }
  if (ca->client->c && ca->h) kvc_cache_close(ca->h);
  ca->h = NULL;
  Py_RETURN_NONE;
}

static PyObject *cache_lease(cache_t *ca, PyObject *args) {
  unsigned long long seq, b, e;
  if (!PyArg_ParseTuple(args, "O&O&O&:lease", pykvc_u64, &seq, pykvc_u64, &b, pykvc_u64, &e)) return NULL;
  kvc_lease_t *l = NULL;
  CALL_(kvc_lease(ca->h, seq, b, e, &l));
  PyObject *r = lease_new(ca, l, seq, b, e);
  if (!r) kvc_lease_release(l);
  return r;
}

static PyObject *cache_lease_batch(cache_t *ca, PyObject *args) {
  PyObject *o;
  if (!PyArg_ParseTuple(args, "O:lease_batch", &o)) return NULL;
  PyObject *seq = PySequence_Fast(o, "ranges: a sequence of (seq, begin, end)");
  if (!seq) return NULL;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  kvc_lease_range_t *r = PyMem_Calloc((size_t)(n ? n : 1), sizeof *r);
  kvc_lease_t **out = PyMem_Calloc((size_t)(n ? n : 1), sizeof *out);
  PyObject *ret = NULL;
  if (!r || !out) {
    PyErr_NoMemory();
    goto done;
  }
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *e = PySequence_Fast_GET_ITEM(seq, i);
    unsigned long long s, b, en;
    if (!PyTuple_Check(e) ||
        !PyArg_ParseTuple(e, "O&O&O&", pykvc_u64, &s, pykvc_u64, &b, pykvc_u64, &en)) {
      PyErr_Clear();
      PyErr_Format(PyExc_ValueError, "ranges[%zd]: expected a (seq, begin, end) tuple", i);
      goto done;
    }
    r[i] = (kvc_lease_range_t){s, b, en};
  }
  if (cache_enter(ca) < 0) goto done;
  int rc;
  Py_BEGIN_ALLOW_THREADS rc = kvc_lease_batch(ca->h, r, (size_t)n, out);
  Py_END_ALLOW_THREADS
  cache_leave(ca);
  if (rc) {
    pykvc_raise(ca->client->c, rc);
    goto done;
  }
  ret = PyList_New(0);
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *l = ret ? lease_new(ca, out[i], r[i].seq_id, r[i].begin, r[i].end) : NULL;
    if (l) out[i] = NULL;
    if (!l || PyList_Append(ret, l) < 0) Py_CLEAR(ret);
    Py_XDECREF(l);
  }
done:
  for (Py_ssize_t i = 0; out && i < n; i++)
    if (out[i]) kvc_lease_release_later(out[i]);
  PyMem_Free(r);
  PyMem_Free(out);
  Py_DECREF(seq);
  return ret;
}

static PyObject *cache_get_name(cache_t *ca, void *c) {
  (void)c;
  if (!ca->client->c || !ca->h) return closed_error(ca);
  return PyUnicode_FromString(kvc_cache_name(ca->h));
}

static PyObject *cache_get_id(cache_t *ca, void *c) {
  (void)c;
  if (!ca->client->c || !ca->h) return closed_error(ca);
  return PyLong_FromUnsignedLong(kvc_cache_id(ca->h));
}

static PyObject *cache_get_layout(cache_t *ca, void *c) {
  (void)c;
  const kvc_layout_t *l = &ca->layout;
  return Py_BuildValue("(IIIIIIIIIIIIffIffI)", l->num_layers, l->num_kv_heads, l->head_dim_k,
                       l->head_dim_v, (unsigned)l->dtype, l->page_tokens, (unsigned)l->attn,
                       l->attn_window, l->attn_memory, l->attn_chunk, l->rope_dims,
                       (unsigned)l->rope_style, (double)l->rope_theta, (double)l->rope_scale,
                       (unsigned)l->rope_scaling, (double)l->rope_lo, (double)l->rope_hi,
                       l->rope_orig_ctx);
}

static PyObject *cache_get_client(cache_t *ca, void *c) {
  (void)c;
  return Py_NewRef((PyObject *)ca->client);
}

static PyObject *cache_register(PyObject *cls, PyObject *sub) {
  if (!PyType_Check(sub) || !PyType_IsSubtype((PyTypeObject *)sub, &pykvc_cache_type)) {
    PyErr_SetString(PyExc_TypeError, "not a subclass of _kvcache.Cache");
    return NULL;
  }
  (void)cls;
  Py_INCREF(sub);
  cache_cls = (PyTypeObject *)sub;
  Py_RETURN_NONE;
}

#define M_(name, fn, flags, doc) {name, (PyCFunction)(void (*)(void))fn, flags, doc}
#define KW_ (METH_VARARGS | METH_KEYWORDS)
static PyMethodDef cache_methods[] = {
    M_("put", cache_put, KW_,
       "put(seq, pos, k, v, tokens=None, layers=None, span_keys=None, k_scale=0, v_scale=0)\n\n"
       "Writes tokens [pos, pos + n) of seq: k "
       "and v shaped [layers, n, heads, head_dim] (C-contiguous NumPy arrays, buffers or CPU "
       "torch tensors; the cache's dtype or float32; int8 caches take float32, float16 or "
       "bfloat16; a uint16 array stands for bfloat16 bits). tokens: the n token ids (a uint32 "
       "array or ints) to index full pages in the prefix cache (with layers, a page is indexed "
       "once every layer of it is saved). span_keys: (begin, end, key) extra keys of positions "
       "(an image's hash over its placeholder tokens: key bytes or str, 1-64 bytes). "
       "k_scale, v_scale: an fp8 cache converting floats stores x / scale (vLLM's per-layer "
       "k_scale / v_scale; 0: 1). FullError when the pool cannot make room."),
    M_("put_batch", cache_put_batch, KW_,
       "put_batch(entries, layers=None)\n\nOne request for many (seq, pos, k, v[, tokens]) "
       "entries (a decode step's ragged append). Every entry shares one dtype."),
    M_("get", cache_get, KW_,
       "get(seq, begin, end, out=None, dtype=None, layers=None, heads=None, k_scale=0, "
       "v_scale=0) -> (k, v)\n\nReads "
       "tokens [begin, end): new NumPy arrays [layers, n, heads, dim] (bf16 as uint16 bits), or "
       "fills out=(k, v) (arrays or CPU tensors of the right shape; float32 outs of a non-f32 "
       "cache get f32). dtype: 'f32' or the cache's. k_scale, v_scale: an fp8 cache converting "
       "to floats returns code x scale (0: 1)."),
    M_("get_batch", cache_get_batch, KW_,
       "get_batch(entries, dtype=None, layers=None, heads=None) -> [(k, v)]\n\nOne request for "
       "many (seq, pos, n[, out_k, out_v]) entries."),
    M_("get_token", cache_get_token, KW_,
       "get_token(seq, pos, dtype=None, layers=None, heads=None) -> (k, v)\n\nOne token: arrays "
       "[layers, heads, dim]."),
    M_("get_head", cache_get_head, KW_,
       "get_head(seq, layer, head, begin, end) -> (k, v)\n\nOne head of one layer: [n, dim]."),
    M_("get_raw", cache_get_raw, KW_,
       "get_raw(seq, begin, end, layers=None, heads=None) -> (k, v, k_scale, v_scale)\n\nThe "
       "stored int8 bytes and their f32 scales [layers, n, heads] of an int8 cache."),
    M_("put_shm", cache_put_shm, KW_,
       "put_shm(entries, dtype=None, layers=None, heads=None)\n\nThe direct form: each entry "
       "(seq, pos, n, k_off, v_off[, k_len, v_len, k_scale_off, v_scale_off, tok_off, tok_len]) "
       "names bytes already in client.shm. No copy in the library."),
    M_("get_shm", cache_get_shm, KW_,
       "get_shm(entries, dtype=None, layers=None, heads=None)\n\nThe direct form of get: the "
       "bytes land in client.shm at the entries' offsets."),
    M_("xfer_bytes", cache_xfer_bytes, KW_,
       "xfer_bytes(ntokens, put=False, dtype=None, layers=None, heads=None) -> (k, v, scales)\n\n"
       "Bytes one entry of ntokens needs in each buffer."),
    M_("reserve", cache_reserve, METH_VARARGS,
       "reserve(toks)\n\nReserves the slots of a batch (a sequence of (seq, pos) or an [n, 2] "
       "int64 array), all or nothing (FullError)."),
    M_("_history", cache_history_raw, KW_, "The raw history reply (see Cache.history)."),
    M_("remove", cache_remove, METH_VARARGS,
       "remove(seq, begin=0, end=inf)\n\nRemoves [begin, end): to the end truncates (from 0 "
       "drops the sequence); a middle range moves later tokens down, keys re-rotated by the "
       "daemon (NoropeError without a RoPE layout)."),
    M_("copy_prefix", cache_copy_prefix, KW_,
       "copy_prefix(src, dst, n, replace=True)\n\nMakes dst the first n tokens of src (pages "
       "shared, copy on write); replace=False raises ExistsError if dst exists."),
    M_("copy_range", cache_copy_range, METH_VARARGS,
       "copy_range(src, dst, p0, p1)\n\nllama.cpp's seq_cp: dst holds positions [p0, p1) of "
       "src at the same positions (pages shared, copy on write)."),
    M_("create", cache_create, KW_,
       "create(n=1, owned=False) -> list[int]\n\nn empty sequences with ids the daemon picks "
       "(unique across clients, >= 2**63); owned ones are dropped when this client closes."),
    M_("can_resume", cache_can_resume, METH_VARARGS,
       "can_resume(seq, pos) -> bool\n\nThe cache holds what is needed to continue seq at pos."),
    M_("trim_front", cache_trim_front, METH_VARARGS,
       "trim_front(seq, n)\n\nDrops tokens before n (positions kept)."),
    M_("shift", cache_shift, METH_VARARGS,
       "shift(seq, p0, p1, delta)\n\nMoves positions [p0, p1) by delta, keys re-rotated "
       "(negative p0/p1: open)."),
    M_("seq_div", cache_seq_div, METH_VARARGS,
       "seq_div(seq, p0, p1, d)\n\nllama.cpp's seq_div: positions in [p0, p1) (negative: open) "
       "become pos // d, keys re-rotated; no token moves (self-extend). d >= 1."),
    M_("punch", cache_punch, METH_VARARGS,
       "punch(seq, p0, p1)\n\nPunches [p0, p1) out as holes; never moves a token."),
    M_("keep", cache_keep, METH_VARARGS, "keep(seq)\n\nDrops every other sequence of the cache."),
    M_("pos_range", cache_pos_range, METH_VARARGS,
       "pos_range(seq) -> (min, max)\n\nFirst and last held positions; (-1, -1) if none."),
    M_("pin", cache_pin, KW_,
       "pin(seq, ttl_ms=None)\n\nPins seq for this connection; with ttl_ms, a soft pin that "
       "lapses ttl_ms after its last use (PinlimitError beyond the pool's pin limit)."),
    M_("unpin", cache_unpin, METH_VARARGS, "unpin(seq)\n\nNotpinnedError if not pinned here."),
    M_("set_priority", cache_set_priority, METH_VARARGS,
       "set_priority(seq, priority)\n\nRetention priority 0..100 (lower is evicted first)."),
    M_("info", cache_info, METH_VARARGS,
       "info(seq) -> dict\n\nseq_id, start, length, extent, pages, shared_pages, pins, "
       "last_use_ms. NoseqError."),
    M_("seqs", cache_seqs, METH_NOARGS, "seqs() -> list of dict\n\nEvery sequence's info."),
    M_("match", cache_match, KW_,
       "match(tokens, span_keys=None) -> dict\n\nHow many leading tokens the prefix cache holds "
       "(whole pages): {'tokens', 'pages', 'ineligible'}. span_keys: the query's, as put takes "
       "them."),
    M_("attach", cache_attach, KW_,
       "attach(dst, tokens, pin=False, replace=True, span_keys=None) -> dict\n\nMatches and makes dst exactly "
       "the matched pages (shared, no copy), pinned in the same step with pin; replace=False "
       "raises ExistsError if dst exists. Continue dst from result['tokens']."),
    M_("set_extra", cache_set_extra, METH_VARARGS,
       "set_extra(key)\n\nThe extra key (bytes, <= 64) of this handle's token-aware calls."),
    M_("prefix_top", cache_prefix_top, METH_VARARGS,
       "prefix_top(n=10) -> list of dict\n\nThe prefix chains with the most hits."),
    M_("clear", cache_clear, METH_NOARGS, "clear()\n\nDrops every sequence of the cache."),
    M_("drop", cache_drop, METH_NOARGS, "drop()\n\nDrops the cache in the daemon."),
    M_("close", cache_close, METH_NOARGS, "close()\n\nFrees the handle (the cache stays)."),
    M_("lease_batch", cache_lease_batch, METH_VARARGS,
       "lease_batch(ranges) -> list[Lease]\n\nLeases of every (seq, begin, end) in one round "
       "trip, all or nothing."),
    M_("_step", cache_step_raw, KW_, "The raw step reply (see Cache.step)."),
    M_("_step_io", cache_step_io, KW_, "The step with tensors (see Cache.step(writes=...))."),
    {"_block_tables", (PyCFunction)cache_block_tables, METH_VARARGS,
     "(tables, starts, ends) int32 arrays of a list of leases (see Cache.block_tables)."},
    M_("lease", cache_lease, METH_VARARGS,
       "lease(seq, begin, end) -> Lease\n\nA zero-copy read lease of tokens [begin, end) (use "
       "it as a context manager)."),
    {"_register", (PyCFunction)cache_register, METH_O | METH_CLASS,
     "Makes Client.open_cache return instances of this subclass."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef cache_getset[] = {
    {"name", (getter)cache_get_name, NULL, "The cache's name.", NULL},
    {"id", (getter)cache_get_id, NULL, "The cache's id.", NULL},
    {"_layout", (getter)cache_get_layout, NULL, "The layout's fields as a tuple.", NULL},
    {"client", (getter)cache_get_client, NULL, "The Client this handle belongs to.", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

PyTypeObject pykvc_cache_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvcache._kvcache.Cache",
    .tp_basicsize = sizeof(cache_t),
    .tp_dealloc = (destructor)cache_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "An opened cache (Client.open_cache).",
    .tp_methods = cache_methods,
    .tp_getset = cache_getset,
};
