/* lease.c: kvcache.Lease, a zero-copy read lease (kvc_lease_t) as a context
 * manager. Its views (kvcache.Lease.k / .v, built in Python) export a Region
 * of the pool that the lease's exit overlays with zeros: a view kept past
 * the block reads zeros, never pages another sequence now owns.
 */
#include "pykvc.h"

#include <string.h>

static PyTypeObject *lease_cls = &pykvc_lease_type;

PyObject *lease_new(cache_t *ca, kvc_lease_t *l, uint64_t seq, uint64_t b, uint64_t e) {
  lease_t *le = (lease_t *)lease_cls->tp_alloc(lease_cls, 0);
  if (!le) return NULL;
  Py_INCREF(ca);
  le->cache = ca;
  le->l = l;
  le->seq_id = seq;
  le->begin = b;
  le->end = e;
  return (PyObject *)le;
}

static int lease_live(lease_t *le) {
  if (!le->l || !le->cache->client->c) {
    PyErr_SetString(PyExc_ValueError, "kvcache.Lease used after it was released (its views "
                    "read zeros once the with block exits)");
    return -1;
  }
  return 0;
}

/* Releases in the daemon (later: with the next request) and kills views. */
static int lease_drop(lease_t *le, bool later) {
  region_kill(le->pool);
  kvc_lease_t *l = le->l;
  le->l = NULL;
  if (!l) return 0;
  client_t *cl = le->cache->client;
  if (!cl->c) return 0; /* the client's close freed it */
  if (client_enter(cl) < 0) return -1;
  int rc;
  Py_BEGIN_ALLOW_THREADS rc = later ? kvc_lease_release_later(l) : kvc_lease_release(l);
  Py_END_ALLOW_THREADS
  client_leave(cl);
  if (rc) {
    pykvc_raise(cl->c, rc);
    return -1;
  }
  return 0;
}

static void lease_dealloc(lease_t *le) {
  region_kill(le->pool);
  if (le->l && le->cache->client->c && !le->cache->client->busy_thread)
    kvc_lease_release_later(le->l);
  Py_XDECREF(le->pool);
  Py_DECREF(le->cache);
  Py_TYPE(le)->tp_free((PyObject *)le);
}

static PyObject *lease_release(lease_t *le, PyObject *noargs) {
  (void)noargs;
  if (lease_drop(le, false) < 0) return NULL;
  Py_RETURN_NONE;
}

static PyObject *lease_release_later(lease_t *le, PyObject *noargs) {
  (void)noargs;
  if (lease_drop(le, true) < 0) return NULL;
  Py_RETURN_NONE;
}

static PyObject *lease_enter(lease_t *le, PyObject *noargs) {
  (void)noargs;
  if (lease_live(le) < 0) return NULL;
  return Py_NewRef((PyObject *)le);
}

static PyObject *lease_exit(lease_t *le, PyObject *args) {
  (void)args;
  if (lease_drop(le, true) < 0) return NULL;
  Py_RETURN_FALSE;
}

/* The pool's Region and each leased page's offset in it, for the views. */
static PyObject *lease_geometry(lease_t *le, PyObject *noargs) {
  (void)noargs;
  if (lease_live(le) < 0) return NULL;
  const void *base;
  uint64_t bytes;
  kvc_client_pool(le->cache->client->c, &base, &bytes);
  if (!base) return pykvc_raise(NULL, KVC_E_PROTO);
  const kvc_lease_info_t *i = kvc_lease_info(le->l);
  if (!le->pool) {
    /* A daemon of arenas maps the pool segment by segment: the lease's own
     * pages, duplicated at their offsets; else the one mapping of it. */
    le->pool = i->arena_base ? lease_pages_region(le) : region_new(base, (size_t)bytes, 1);
    if (!le->pool) return NULL;
    if (client_track(le->cache->client, le->pool) < 0) return NULL;
  }
  PyObject *offs = PyList_New(i->npages);
  for (uint32_t p = 0; offs && p < i->npages; p++)
    PyList_SET_ITEM(offs, p, PyLong_FromSsize_t((const char *)i->pages[p] - (const char *)base));
  if (!offs) return NULL;
  return Py_BuildValue("{s:O,s:N,s:K,s:K,s:K,s:I,s:K,s:K,s:K,s:K,s:K,s:K}", "region", le->pool,
                       "page_offsets", offs, "begin", i->begin, "end", i->end, "first_pos",
                       i->first_pos, "page_tokens", i->page_tokens, "layer_bytes",
                       i->layer_bytes, "v_offset", i->v_offset, "k_row_bytes", i->k_row_bytes,
                       "v_row_bytes", i->v_row_bytes, "k_scale_offset", i->k_scale_offset,
                       "v_scale_offset", i->v_scale_offset);
}

/* (arena Region, page_stride, arena_pages, layer_bytes, v_offset,
 * k_row_bytes, v_row_bytes, k_scale_offset, v_scale_offset, page_tokens),
 * or None without arenas: kvcache.Arena makes the arrays. */
static PyObject *lease_arena(lease_t *le, PyObject *noargs) {
  (void)noargs;
  if (lease_live(le) < 0) return NULL;
  region_t *r = lease_arena_region(le);
  if (!r) {
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
  }
  const kvc_lease_info_t *i = kvc_lease_info(le->l);
  return Py_BuildValue("(OKKKKKKKKI)", r, i->page_stride, i->arena_pages, i->layer_bytes,
                       i->v_offset, i->k_row_bytes, i->v_row_bytes, i->k_scale_offset,
                       i->v_scale_offset, i->page_tokens);
}

/* The lease's pages as indices into its arena: a new int32 array. */
static PyObject *lease_get_block_table(lease_t *le, void *c) {
  (void)c;
  if (lease_live(le) < 0) return NULL;
  const kvc_lease_info_t *i = kvc_lease_info(le->l);
  if (!i->block_table) {
    PyErr_SetString(PyExc_ValueError, "block tables need a daemon of arenas (this one runs with "
                    "page_bytes, deprecated): read with lease.k(layer) or get");
    return NULL;
  }
  Py_ssize_t n = i->npages;
  PyObject *a = array_new(&n, 1, T_I32);
  Py_buffer b;
  if (!a || PyObject_GetBuffer(a, &b, PyBUF_WRITABLE) < 0) {
    Py_XDECREF(a);
    return NULL;
  }
  memcpy(b.buf, i->block_table, (size_t)n * sizeof(int32_t));
  PyBuffer_Release(&b);
  return a;
}

static PyObject *lease_get_first_pos(lease_t *le, void *c) {
  (void)c;
  if (lease_live(le) < 0) return NULL;
  return PyLong_FromUnsignedLongLong(kvc_lease_info(le->l)->first_pos);
}

static PyObject *lease_get_active(lease_t *le, void *c) {
  (void)c;
  return PyBool_FromLong(le->l && le->cache->client->c);
}

static PyObject *lease_get_range(lease_t *le, void *c) {
  (void)c;
  return Py_BuildValue("(KKK)", le->seq_id, le->begin, le->end);
}

static PyObject *lease_get_cache(lease_t *le, void *c) {
  (void)c;
  return Py_NewRef((PyObject *)le->cache);
}

static PyObject *lease_register(PyObject *cls, PyObject *sub) {
  (void)cls;
  if (!PyType_Check(sub) || !PyType_IsSubtype((PyTypeObject *)sub, &pykvc_lease_type)) {
    PyErr_SetString(PyExc_TypeError, "not a subclass of _kvcache.Lease");
    return NULL;
  }
  Py_INCREF(sub);
  lease_cls = (PyTypeObject *)sub;
  Py_RETURN_NONE;
}

static PyMethodDef lease_methods[] = {
    {"release", (PyCFunction)lease_release, METH_NOARGS,
     "release()\n\nReleases the lease now (one round trip); its views read zeros. Idempotent."},
    {"release_later", (PyCFunction)lease_release_later, METH_NOARGS,
     "release_later()\n\nReleases it with the client's next request (no round trip of its "
     "own); what leaving the with block does."},
    {"__enter__", (PyCFunction)lease_enter, METH_NOARGS, "Returns the lease."},
    {"__exit__", (PyCFunction)lease_exit, METH_VARARGS, "release_later()."},
    {"_geometry", (PyCFunction)lease_geometry, METH_NOARGS, "Where the leased tokens are."},
    {"_arena", (PyCFunction)lease_arena, METH_NOARGS, "The arena's Region and geometry."},
    {"_register", (PyCFunction)lease_register, METH_O | METH_CLASS,
     "Makes Cache.lease return instances of this subclass."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef lease_getset[] = {
    {"active", (getter)lease_get_active, NULL, "False once released.", NULL},
    {"range", (getter)lease_get_range, NULL, "(seq, begin, end).", NULL},
    {"cache", (getter)lease_get_cache, NULL, "The Cache leased from.", NULL},
    {"block_table", (getter)lease_get_block_table, NULL,
     "The leased pages as indices into the cache's arena (Lease.arena): a new int32 array, "
     "page 0 holding token first_pos. Valid while the lease is held.", NULL},
    {"first_pos", (getter)lease_get_first_pos, NULL,
     "The position of the first token of the lease's first page.", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

PyTypeObject pykvc_lease_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvcache._kvcache.Lease",
    .tp_basicsize = sizeof(lease_t),
    .tp_dealloc = (destructor)lease_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "A zero-copy read lease (Cache.lease); a context manager.",
    .tp_methods = lease_methods,
    .tp_getset = lease_getset,
};
