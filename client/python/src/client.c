/* client.c: kvcache.Client, one connection to kvcached (kvc_client_t): a
 * context manager that opens caches, pings, lists caches, reads stats and
 * exposes the shared buffer as a writable memoryview.
 */
#include "pykvc.h"

#include <pythread.h>

int client_enter(client_t *cl) {
  if (!cl->c) {
    PyErr_SetString(PyExc_ValueError, "operation on a closed kvcache.Client");
    return -1;
  }
  if (cl->busy_thread) {
    PyErr_SetString(PyExc_RuntimeError,
                    "kvcache.Client used from two threads at once: a Client (and its caches "
                    "and leases) belongs to one thread at a time; open one Client per thread");
    return -1;
  }
  cl->busy_thread = PyThread_get_thread_ident();
  return 0;
}

void client_leave(client_t *cl) {
  cl->busy_thread = 0;
  if (cl->limit_dirty && cl->c) { /* a block was freed while the call ran */
    cl->limit_dirty = false;
    kvc_client_shm_limit(cl->c, cl->nblks ? cl->blks[0].off : UINT64_MAX);
  }
}

int client_track(client_t *cl, region_t *r) {
  if (!cl->regions && !(cl->regions = PyList_New(0))) return -1;
  Py_ssize_t n = PyList_GET_SIZE(cl->regions);
  if (n >= 64 && (n & (n - 1)) == 0) { /* at powers of two: drop the dead */
    PyObject *live = PyList_New(0);
    if (!live) return -1;
    for (Py_ssize_t i = 0; i < n; i++) {
      region_t *x = (region_t *)PyList_GET_ITEM(cl->regions, i);
      if (!x->dead && PyList_Append(live, (PyObject *)x) < 0) {
        Py_DECREF(live);
        return -1;
      }
    }
    Py_SETREF(cl->regions, live);
  }
  return PyList_Append(cl->regions, (PyObject *)r);
}

static void kill_all(client_t *cl) {
  if (cl->shm) region_kill(cl->shm);
  for (Py_ssize_t i = 0; cl->regions && i < PyList_GET_SIZE(cl->regions); i++)
    region_kill((region_t *)PyList_GET_ITEM(cl->regions, i));
  Py_CLEAR(cl->regions);
}

static int client_init(client_t *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"socket", "shm_bytes", "timeout", "spin_us", "name", NULL};
  const char *sock = NULL, *name = NULL;
  unsigned long long shm = 0;
  unsigned int spin = 0;
  PyObject *timeout = Py_None;
  if (self->c) {
    PyErr_SetString(PyExc_RuntimeError, "Client is already open");
    return -1;
  }
  if (!PyArg_ParseTupleAndKeywords(args, kw, "|zO&OO&z:Client", kwlist, &sock, pykvc_u64, &shm, &timeout, pykvc_u32,
                                   &spin, &name))
    return -1;
  kvc_client_opts_t o = {.socket_path = sock, .shm_bytes = shm, .spin_us = spin,
                         .client_name = name ? name : "python"};
  if (timeout != Py_None) {
    double s = PyFloat_AsDouble(timeout);
    if (s == -1.0 && PyErr_Occurred()) return -1;
    if (!(s > 0) || s > 4e6) {
      PyErr_Format(PyExc_ValueError, "timeout must be seconds > 0 (or None), got %R", timeout);
      return -1;
    }
    o.timeout_ms = (uint32_t)(s * 1000.0 + 0.5);
    if (o.timeout_ms == 0) o.timeout_ms = 1;
  }
  kvc_client_t *c = NULL;
  int rc;
  Py_BEGIN_ALLOW_THREADS rc = kvc_client_open(&o, &c);
  Py_END_ALLOW_THREADS
  if (rc) {
    pykvc_raise_open(rc);
    return -1;
  }
  self->c = c;
  fast_client_opened(self);
  return 0;
}

static PyObject *client_close(client_t *self, PyObject *noargs) {
  (void)noargs;
  if (self->busy_thread) {
    PyErr_SetString(PyExc_RuntimeError, "kvcache.Client closed while another thread is in a call");
    return NULL;
  }
  kill_all(self);
  kvc_client_t *c = self->c;
  self->c = NULL;
  if (c) {
    Py_BEGIN_ALLOW_THREADS kvc_client_close(c);
    Py_END_ALLOW_THREADS
    fast_client_closed(self);
  }
  Py_RETURN_NONE;
}

static void client_dealloc(client_t *self) {
  if (self->weakrefs) PyObject_ClearWeakRefs((PyObject *)self);
  kill_all(self);
  kvc_client_close(self->c);
  if (self->c) {
    self->c = NULL;
    fast_client_closed(self);
  }
  Py_XDECREF(self->shm);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *client_enter_ctx(client_t *self, PyObject *noargs) {
  (void)noargs;
  if (!self->c) {
    PyErr_SetString(PyExc_ValueError, "operation on a closed kvcache.Client");
    return NULL;
  }
  Py_INCREF(self);
  return (PyObject *)self;
}

static PyObject *client_exit_ctx(client_t *self, PyObject *args) {
  (void)args;
  PyObject *r = client_close(self, NULL);
  if (!r) return NULL;
  Py_DECREF(r);
  Py_RETURN_FALSE;
}

static PyObject *client_ping(client_t *self, PyObject *noargs) {
  (void)noargs;
  if (client_enter(self) < 0) return NULL;
  int rc;
  Py_BEGIN_ALLOW_THREADS rc = kvc_ping(self->c);
  Py_END_ALLOW_THREADS
  client_leave(self);
  if (rc) return pykvc_raise(self->c, rc);
  Py_RETURN_NONE;
}

/* layout: an object with _astuple() -> the 18 fields of kvc_layout_t. */
static int layout_from(PyObject *o, kvc_layout_t *l) {
  PyObject *t = PyObject_CallMethod(o, "_astuple", NULL);
  if (!t) return -1;
  unsigned int v[12], scaling, orig;
  float theta, scale, lo, hi;
  int ok = PyArg_ParseTuple(t, "O&O&O&O&O&O&O&O&O&O&O&O&ffO&ffO&:layout", pykvc_u32, &v[0], pykvc_u32, &v[1], pykvc_u32, &v[2], pykvc_u32, &v[3], pykvc_u32, &v[4], pykvc_u32,
                            &v[5], pykvc_u32, &v[6], pykvc_u32, &v[7], pykvc_u32, &v[8], pykvc_u32, &v[9], pykvc_u32, &v[10], pykvc_u32, &v[11], &theta, &scale,
                            pykvc_u32, &scaling, &lo, &hi, pykvc_u32, &orig);
  Py_DECREF(t);
  if (!ok) return -1;
  *l = (kvc_layout_t){v[0], v[1], v[2], v[3], (kvc_dtype_t)v[4], v[5], (kvc_attn_t)v[6],
                      v[7], v[8], v[9], v[10], (kvc_rope_style_t)v[11], theta, scale,
                      (kvc_rope_scaling_t)scaling, lo, hi, orig};
  return 0;
}

static PyObject *client_open_cache(client_t *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"name", "layout", "salt", NULL};
  const char *name;
  PyObject *layout = Py_None;
  Py_buffer salt = {0};
  if (!PyArg_ParseTupleAndKeywords(args, kw, "s|Oy*:open_cache", kwlist, &name, &layout, &salt))
    return NULL;
  kvc_layout_t l;
  if (layout != Py_None && layout_from(layout, &l) < 0) {
    PyBuffer_Release(&salt);
    return NULL;
  }
  if (client_enter(self) < 0) {
    PyBuffer_Release(&salt);
    return NULL;
  }
  kvc_cache_t *h = NULL;
  int rc;
  Py_BEGIN_ALLOW_THREADS
  if (layout == Py_None) rc = kvc_cache_find(self->c, name, &h);
  else rc = kvc_cache_open_salted(self->c, name, &l, salt.buf, (size_t)salt.len, &h);
  Py_END_ALLOW_THREADS
  client_leave(self);
  PyBuffer_Release(&salt);
  if (rc) return pykvc_raise(self->c, rc);
  PyObject *r = cache_new(self, h);
  if (!r) kvc_cache_close(h);
  return r;
}

static PyObject *client_list_caches(client_t *self, PyObject *noargs) {
  (void)noargs;
  if (client_enter(self) < 0) return NULL;
  size_t cap = 16, n = 0;
  kvc_cache_info_t *a = NULL;
  int rc;
  for (;;) {
    kvc_cache_info_t *b = PyMem_Realloc(a, cap * sizeof *a);
    if (!b) {
      PyMem_Free(a);
      client_leave(self);
      return PyErr_NoMemory();
    }
    a = b;
    Py_BEGIN_ALLOW_THREADS rc = kvc_cache_list(self->c, a, cap, &n);
    Py_END_ALLOW_THREADS
    if (rc || n <= cap) break;
    cap = n;
  }
  client_leave(self);
  if (rc) {
    PyMem_Free(a);
    return pykvc_raise(self->c, rc);
  }
  PyObject *l = PyList_New(0);
  for (size_t i = 0; l && i < n; i++) {
    PyObject *d = Py_BuildValue("{s:s,s:I,s:K,s:K,s:K,s:K}", "name", a[i].name, "cache_id",
                                a[i].cache_id, "page_bytes", a[i].page_bytes, "sequences",
                                a[i].sequences, "tokens", a[i].tokens, "pages", a[i].pages);
    if (!d || PyList_Append(l, d) < 0) Py_CLEAR(l);
    Py_XDECREF(d);
  }
  PyMem_Free(a);
  return l;
}

static PyObject *client_stats(client_t *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"cache", "top", "node_only", NULL};
  const char *cache = NULL;
  long long top = 0;
  int node_only = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "|zLp:stats", kwlist, &cache, &top, &node_only))
    return NULL;
  if (top < 0 || top > UINT32_MAX) {
    PyErr_Format(PyExc_ValueError, "top is 0 (the default, %d) or a count of caches, got %lld",
                 KVC_STATS_TOP_DEFAULT, top);
    return NULL;
  }
  kvc_stats_opts_t q = {.cache = cache, .top = (uint32_t)top, .node_only = node_only != 0};
  if (client_enter(self) < 0) return NULL;
  kvc_stat_t *s = NULL;
  size_t n = 0;
  int rc;
  Py_BEGIN_ALLOW_THREADS rc = kvc_stats_query(self->c, &q, &s, &n);
  Py_END_ALLOW_THREADS
  client_leave(self);
  if (rc) return pykvc_raise(self->c, rc);
  PyObject *d = PyDict_New(), *caches = PyDict_New();
  for (size_t i = 0; d && caches && i < n; i++) {
    PyObject *target = d;
    if (s[i].cache && *s[i].cache) {
      target = PyDict_GetItemString(caches, s[i].cache);
      if (!target) {
        target = PyDict_New();
        if (!target || PyDict_SetItemString(caches, s[i].cache, target) < 0) {
          Py_XDECREF(target);
          Py_CLEAR(d);
          break;
        }
        Py_DECREF(target);
      }
    }
    /* A labelled sample's key names its labels, as stat names are written in
     * doc/stats.md: "requests_total{op=put}"; a cache's tenant label is the
     * cache's, not a key of its own. */
    char key[256];
    size_t used = (size_t)snprintf(key, sizeof key, "%s", s[i].name);
    bool open = false;
    for (size_t k = 0; k < s[i].nlabels && used < sizeof key; k++) {
      if (s[i].cache && *s[i].cache && strcmp(s[i].labels[k].key, "tenant") == 0) continue;
      used += (size_t)snprintf(key + used, sizeof key - used, "%s%s=%s", open ? "," : "{",
                               s[i].labels[k].key, s[i].labels[k].value);
      open = true;
    }
    if (open && used < sizeof key) snprintf(key + used, sizeof key - used, "}");
    PyObject *v = PyLong_FromUnsignedLongLong(s[i].value);
    if (!v || PyDict_SetItemString(target, key, v) < 0) Py_CLEAR(d);
    Py_XDECREF(v);
  }
  kvc_stats_free(s);
  if (d && caches && PyDict_SetItemString(d, "caches", caches) < 0) Py_CLEAR(d);
  Py_XDECREF(caches);
  return d;
}

/* ---- the event stream (kvc_events_subscribe, kvc_events_next) ---- */

static PyObject *client_subscribe(client_t *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"cache", "token_ids", NULL};
  const char *cache = NULL;
  int token_ids = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "|zp:subscribe", kwlist, &cache, &token_ids))
    return NULL;
  if (client_enter(self) < 0) return NULL;
  int rc;
  Py_BEGIN_ALLOW_THREADS rc = kvc_events_subscribe(self->c, cache, token_ids != 0);
  Py_END_ALLOW_THREADS
  client_leave(self);
  if (rc) return pykvc_raise(self->c, rc);
  Py_RETURN_NONE;
}

#define EVENT_SLICE_MS 200 /* next_event looks at signals this often while it waits */

static const char *const event_kinds[] = {"stored", "removed", "cleared", "dropped", "reset"};

static PyObject *event_dict(const kvc_event_t *e) {
  const char *kind = (unsigned)e->kind < sizeof event_kinds / sizeof event_kinds[0]
                         ? event_kinds[e->kind]
                         : "unknown";
  PyObject *ids = e->token_ids ? PyList_New(e->ntokens) : (Py_INCREF(Py_None), Py_None);
  if (!ids) return NULL;
  if (e->token_ids) {
    for (uint32_t i = 0; i < e->ntokens; i++) {
      PyObject *v = PyLong_FromUnsignedLong(e->token_ids[i]);
      if (!v) {
        Py_DECREF(ids);
        return NULL;
      }
      PyList_SET_ITEM(ids, i, v);
    }
  }
  PyObject *parent = e->parent_len ? PyBytes_FromStringAndSize((const char *)e->parent,
                                                               e->parent_len)
                                   : (Py_INCREF(Py_None), Py_None);
  if (!parent) {
    Py_DECREF(ids);
    return NULL;
  }
  PyObject *d = Py_BuildValue(
      "{s:s,s:I,s:s,s:s,s:y#,s:O,s:I,s:s,s:O,s:K,s:K,s:d}", "kind", kind, "cache_id",
      e->cache_id, "cache", e->cache, "tenant", e->tenant, "hash", (const char *)e->hash,
      (Py_ssize_t)e->hash_len, "parent", parent, "block_size", e->block_size, "medium",
      e->medium, "token_ids", ids, "seq", (unsigned long long)e->seq, "missed",
      (unsigned long long)e->missed, "ts", e->ts);
  Py_DECREF(parent);
  Py_DECREF(ids);
  return d;
}

static PyObject *client_next_event(client_t *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"timeout", NULL};
  PyObject *timeout = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:next_event", kwlist, &timeout)) return NULL;
  long long ms = -1; /* -1: no bound */
  if (timeout != Py_None) {
    double s = PyFloat_AsDouble(timeout);
    if (s == -1.0 && PyErr_Occurred()) return NULL;
    if (!(s >= 0) || s > 2e6) {
      PyErr_Format(PyExc_ValueError, "timeout must be seconds >= 0 (or None), got %R", timeout);
      return NULL;
    }
    ms = (long long)(s * 1000.0 + 0.5);
    if (ms == 0 && s > 0) ms = 1; /* a wait, however short: not only what has arrived */
  }
  if (client_enter(self) < 0) return NULL;
  kvc_event_t e;
  int rc;
  /* Waits in slices, looking at signals between them: Ctrl-C (KeyboardInterrupt)
   * ends a wait for a quiet stream. */
  for (;;) {
    int slice = ms < 0 || ms > EVENT_SLICE_MS ? EVENT_SLICE_MS : (int)ms;
    Py_BEGIN_ALLOW_THREADS rc = kvc_events_next(self->c, slice, &e);
    Py_END_ALLOW_THREADS
    if (rc != KVC_E_TIMEOUT || ms == slice) break;
    if (ms > 0) ms -= slice;
    if (PyErr_CheckSignals() < 0) {
      client_leave(self);
      return NULL;
    }
  }
  /* The dict first: the event's token ids are the client's until its next
   * call, which another thread may make once this one has left. */
  PyObject *d = rc ? NULL : event_dict(&e);
  client_leave(self);
  if (rc == KVC_E_TIMEOUT) Py_RETURN_NONE;
  if (rc) return pykvc_raise(self->c, rc);
  return d;
}

static PyObject *client_get_info(client_t *self, void *closure) {
  (void)closure;
  if (!self->c) {
    PyErr_SetString(PyExc_ValueError, "operation on a closed kvcache.Client");
    return NULL;
  }
  kvc_client_info_t i;
  kvc_client_info(self->c, &i);
  return Py_BuildValue("{s:K,s:K,s:K,s:I,s:I,s:K,s:K,s:s}", "conn_id", i.conn_id, "shm_bytes",
                       i.shm_bytes, "max_frame_bytes", i.max_frame_bytes, "max_entries",
                       i.max_entries, "protocol_version", i.protocol_version, "pool_bytes",
                       i.pool_bytes, "page_bytes", i.page_bytes, "server_version",
                       i.server_version);
}

static PyObject *client_get_shm(client_t *self, void *closure) {
  (void)closure;
  if (!self->c) {
    PyErr_SetString(PyExc_ValueError, "operation on a closed kvcache.Client");
    return NULL;
  }
  if (!self->shm) {
    void *base;
    uint64_t bytes;
    kvc_client_shm(self->c, &base, &bytes);
    if (!(self->shm = region_new(base, (size_t)bytes, 0))) return NULL;
  }
  return PyMemoryView_FromObject((PyObject *)self->shm);
}

static PyObject *client_get_closed(client_t *self, void *closure) {
  (void)closure;
  return PyBool_FromLong(self->c == NULL);
}

static PyObject *client_get_in_call(client_t *self, void *closure) {
  (void)closure;
  return PyBool_FromLong(self->busy_thread != 0);
}

static PyObject *client_last_error(client_t *self, void *closure) {
  (void)closure;
  return PyUnicode_FromString(self->c ? kvc_client_last_error(self->c) : "");
}

static PyMethodDef client_methods[] = {
    {"close", (PyCFunction)client_close, METH_NOARGS,
     "close()\n\nCloses the connection: the daemon releases its pins and leases; every Cache "
     "and Lease of it becomes unusable and views of the shared buffer read zeros. Idempotent."},
    {"__enter__", (PyCFunction)client_enter_ctx, METH_NOARGS, "Returns the client."},
    {"__exit__", (PyCFunction)client_exit_ctx, METH_VARARGS, "Closes the client."},
    {"ping", (PyCFunction)client_ping, METH_NOARGS, "ping()\n\nOne round trip with no effect."},
    {"_shm_alloc", (PyCFunction)client_shm_alloc, METH_VARARGS,
     "_shm_alloc(nbytes, align=256) -> ShmBlock: a block from the top of the shared buffer "
     "(Client.shm_tensor); the library's own use stays below the lowest block."},
    {"shm_offset", (PyCFunction)client_shm_offset, METH_O,
     "shm_offset(t) -> int\n\nWhere a tensor or array made by shm_tensor / shm_array (or a "
     "contiguous view of one) starts in client.shm: for put_shm / get_shm entries."},
    {"_shm_blocks", (PyCFunction)client_shm_blocks, METH_NOARGS,
     "[(offset, bytes)] of the live blocks, lowest first."},
    {"open_cache", (PyCFunction)(void (*)(void))client_open_cache, METH_VARARGS | METH_KEYWORDS,
     "open_cache(name, layout=None, salt=b'') -> Cache\n\nOpens the cache name, creating it "
     "with layout (a kvcache.Layout) if it does not exist; layout None opens an existing cache "
     "with whatever layout it has (NocacheError if none). salt: the tenant salt of the prefix "
     "cache. LayoutError if it exists with another layout."},
    {"list_caches", (PyCFunction)client_list_caches, METH_NOARGS,
     "list_caches() -> list of dict\n\nEvery cache of the daemon: name, cache_id, page_bytes, "
     "sequences, tokens, pages."},
    {"subscribe", (PyCFunction)(void (*)(void))client_subscribe, METH_VARARGS | METH_KEYWORDS,
     "subscribe(cache=None, token_ids=False)\n\nSubscribes this connection to the changes of "
     "the prefix indexes of the caches it may see (cache: one cache's only), as the C "
     "kvc_events_subscribe does (doc/events.md): from then on it only receives them, through "
     "next_event(), and any other call raises InvalError (use a second Client for requests). "
     "token_ids: stored events carry their pages' token ids. Changes before the call are not "
     "sent."},
    {"next_event", (PyCFunction)(void (*)(void))client_next_event, METH_VARARGS | METH_KEYWORDS,
     "next_event(timeout=None) -> dict or None\n\nThe next change after subscribe(), waiting "
     "up to timeout seconds (None: no bound; 0: only what has arrived); None if none came. A "
     "dict: kind ('stored', 'removed', 'cleared', 'dropped', or 'reset': changes were lost, "
     "forget what the stream said so far), cache_id, cache, tenant, hash (bytes; empty for "
     "cleared/dropped/reset), parent (bytes, None at a chain's head), block_size, medium "
     "('CPU', 'DISK', 'REMOTE'), token_ids (a list, when subscribed with them, else None), seq "
     "(the batch: 1, 2, ...), missed (batches dropped just before this one for reading too "
     "slowly), ts (Unix seconds the daemon published it). ShutdownError when the daemon "
     "drains, IoError when it went away."},
    {"stats", (PyCFunction)(void (*)(void))client_stats, METH_VARARGS | METH_KEYWORDS,
     "stats(cache=None, top=0, node_only=False) -> dict\n\nThe node's figures by name "
     "(doc/stats.md), a labelled one as 'requests_total{op=put}', and under "
     "stats()['caches'][name] the figures of the caches asked for: those named cache, or "
     "the top (0: 10; at most 1000) holding the most pages, or none with node_only "
     "(doc/protocol.md, \"Stats\"). NocacheError: no cache of that name you may see."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef client_getset[] = {
    {"info", (getter)client_get_info, NULL, "What the handshake told the client (a dict).", NULL},
    {"shm", (getter)client_get_shm, NULL,
     "The shared buffer as a writable memoryview, for put_shm/get_shm and history(copy=False). "
     "The library's own calls (put, get, history, match) overwrite it. Once the client closes "
     "it reads zeros.", NULL},
    {"closed", (getter)client_get_closed, NULL, "True once closed.", NULL},
    {"in_call", (getter)client_get_in_call, NULL,
     "True while a thread is inside a call on this client (with the GIL released).", NULL},
    {"last_error", (getter)client_last_error, NULL, "The last error's one-line reason.", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

PyTypeObject pykvc_client_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvcache._kvcache.Client",
    .tp_basicsize = sizeof(client_t),
    .tp_dealloc = (destructor)client_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "Client(socket=None, shm_bytes=0, timeout=None, spin_us=0, name=None)\n\n"
              "One connection to kvcached (socket None: $KVCACHED_SOCKET, else the default "
              "path). shm_bytes: the shared buffer wanted (0: the daemon's default); timeout: "
              "seconds per send/receive (None: forever); spin_us: poll for a reply at most that "
              "long before sleeping (0: libkvcache's default, 50 us through the shared-memory "
              "rings). A context manager; one Client per thread (a second thread "
              "using it during a call gets RuntimeError). NotrunningError if no daemon answers.",
    .tp_methods = client_methods,
    .tp_getset = client_getset,
    .tp_init = (initproc)client_init,
    .tp_new = PyType_GenericNew,
    .tp_weaklistoffset = offsetof(client_t, weakrefs),
};
