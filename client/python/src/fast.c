/* fast.c: what a Python worker's decode step runs on (doc/worker-guide.md,
 * "The loop in Python"):
 *
 * - an arena as one array: the library maps each arena a client reads as
 *   one array of pages (kvc_lease_info_t.arena_base); a borrowed Region
 *   exports it (Lease._arena), and a lease's block table indexes it. At the
 *   client's close the library overlays the views with zeros and hands them
 *   to us (kvc_client_keep_views): a Region still exported then owns and
 *   later unmaps its view, so an array kept past the close reads zeros;
 * - blocks of the shared buffer (Client._shm_alloc): tensors born there are
 *   put and read into with no copy in the client. Blocks are taken from the
 *   buffer's top; the library's own use (staging, histories, token lists)
 *   is kept below the lowest of them (kvc_client_shm_limit);
 * - block tables of a step's leases, one int32 array for the batch.
 */
#include "pykvc.h"

#include <string.h>
#include <sys/mman.h>

/* ---- views handed over at close ---- */

/* Runs inside kvc_client_close, without the GIL: no Python calls. */
static void keep_view(void *base, size_t bytes, void *arg) {
  client_t *cl = arg;
  if (cl->nkept == cl->capkept) {
    size_t cap = cl->capkept ? 2 * cl->capkept : 8;
    void *k = PyMem_RawRealloc(cl->kept, cap * sizeof *cl->kept);
    if (!k) return; /* left mapped (zeros): an array over it stays readable */
    cl->kept = k;
    cl->capkept = cap;
  }
  cl->kept[cl->nkept].base = base;
  cl->kept[cl->nkept].bytes = bytes;
  cl->nkept++;
}

void fast_client_opened(client_t *cl) {
  kvc_client_keep_views(cl->c, keep_view, cl);
  cl->gen++;
}

void fast_client_closed(client_t *cl) {
  for (size_t i = 0; i < cl->nkept; i++) {
    region_t *r = NULL;
    PyObject *key = PyLong_FromVoidPtr(cl->kept[i].base);
    if (key && cl->arenas) r = (region_t *)PyDict_GetItemWithError(cl->arenas, key);
    Py_XDECREF(key);
    if (r) { /* the Region owns it now: unmapped when its last export goes */
      r->dead = true;
      r->borrowed = false;
    } else if (!PyErr_Occurred()) {
      munmap(cl->kept[i].base, cl->kept[i].bytes);
    } else {
      PyErr_Clear(); /* left mapped: never a dangling export */
    }
  }
  PyMem_RawFree(cl->kept);
  cl->kept = NULL;
  cl->nkept = cl->capkept = 0;
  Py_CLEAR(cl->arenas);
  PyMem_Free(cl->blks);
  cl->blks = NULL;
  cl->nblks = cl->capblks = 0;
  cl->limit_dirty = false;
}

/* ---- the shared buffer ---- */

int64_t shm_off(const client_t *cl, const void *p, size_t n) {
  const region_t *r = cl->shm;
  if (!r || r->dead || !r->base || !p) return -1;
  uintptr_t a = (uintptr_t)p, b = (uintptr_t)r->base;
  if (a < b || a - b > r->bytes || n > r->bytes - (a - b)) return -1;
  return (int64_t)(a - b);
}

static region_t *shm_region(client_t *cl) {
  if (!cl->shm) {
    void *base;
    uint64_t bytes;
    kvc_client_shm(cl->c, &base, &bytes);
    if (!(cl->shm = region_new(base, (size_t)bytes, 0))) return NULL;
  }
  return cl->shm;
}

typedef struct {
  PyObject_HEAD
  client_t *cl;    /* strong */
  region_t *shm;   /* strong: the bytes stay mapped (zeros after the close) */
  uint64_t off, len;
  uint32_t gen;    /* the client's open it belongs to */
} shmblock_t;

static void set_limit(client_t *cl) {
  if (cl->busy_thread) { /* the call in progress uses the library's part */
    cl->limit_dirty = true;
    return;
  }
  kvc_client_shm_limit(cl->c, cl->nblks ? cl->blks[0].off : UINT64_MAX);
}

PyObject *client_shm_alloc(client_t *cl, PyObject *args) {
  unsigned long long n, align = 256;
  if (!PyArg_ParseTuple(args, "O&|O&:_shm_alloc", pykvc_u64, &n, pykvc_u64, &align)) return NULL;
  if (n == 0 || align == 0 || (align & (align - 1)) || align > 4096) {
    PyErr_SetString(PyExc_ValueError, "a block of the shared buffer: bytes > 0 and an alignment "
                    "that is a power of two up to 4096");
    return NULL;
  }
  if (client_enter(cl) < 0) return NULL; /* never below a call's staging on another thread */
  region_t *r = shm_region(cl);
  client_leave(cl);
  if (!r) return NULL;
  uint64_t end = r->bytes, off = UINT64_MAX;
  Py_ssize_t at = cl->nblks; /* insert before at */
  for (Py_ssize_t i = cl->nblks; i >= 0; i--) {
    uint64_t lo = i > 0 ? cl->blks[i - 1].off + cl->blks[i - 1].len : 0;
    if (end >= n && ((end - n) & ~(align - 1)) >= lo) {
      off = (end - n) & ~(align - 1);
      at = i;
      break;
    }
    if (i > 0) end = cl->blks[i - 1].off;
  }
  if (off == UINT64_MAX) {
    uint64_t used = 0;
    for (Py_ssize_t i = 0; i < cl->nblks; i++) used += cl->blks[i].len;
    return PyErr_Format(PyExc_MemoryError,
                        "the shared buffer (%llu bytes, %llu of them in %zd blocks) has no "
                        "free run of %llu bytes: free tensors made with shm_tensor, or open "
                        "the client with a larger shm_bytes",
                        (unsigned long long)r->bytes, (unsigned long long)used, cl->nblks, n);
  }
  if (cl->nblks == cl->capblks) {
    Py_ssize_t cap = cl->capblks ? 2 * cl->capblks : 16;
    shm_blk_t *b = PyMem_Realloc(cl->blks, (size_t)cap * sizeof *b);
    if (!b) return PyErr_NoMemory();
    cl->blks = b;
    cl->capblks = cap;
  }
  shmblock_t *blk = PyObject_New(shmblock_t, &pykvc_shmblock_type);
  if (!blk) return NULL;
  memmove(&cl->blks[at + 1], &cl->blks[at], (size_t)(cl->nblks - at) * sizeof *cl->blks);
  cl->blks[at] = (shm_blk_t){off, n};
  cl->nblks++;
  set_limit(cl);
  Py_INCREF(cl);
  Py_INCREF(r);
  blk->cl = cl;
  blk->shm = r;
  blk->off = off;
  blk->len = n;
  blk->gen = cl->gen;
  return (PyObject *)blk;
}

PyObject *client_shm_offset(client_t *cl, PyObject *o) {
  tensor_t t;
  if (tensor_get(o, &t, false, "shm_offset") < 0) return NULL;
  int64_t off = shm_off(cl, t.ptr, t.nbytes);
  tensor_release(&t);
  if (off < 0) {
    PyErr_SetString(PyExc_ValueError, "shm_offset: not inside this client's shared buffer (make "
                    "it with shm_tensor or shm_array)");
    return NULL;
  }
  return PyLong_FromLongLong(off);
}

PyObject *client_shm_blocks(client_t *cl, PyObject *noargs) {
  (void)noargs;
  PyObject *l = PyList_New(cl->nblks);
  for (Py_ssize_t i = 0; l && i < cl->nblks; i++) {
    PyObject *t = Py_BuildValue("(KK)", cl->blks[i].off, cl->blks[i].len);
    if (!t) {
      Py_CLEAR(l);
      break;
    }
    PyList_SET_ITEM(l, i, t);
  }
  return l;
}

static void shmblock_dealloc(shmblock_t *b) {
  client_t *cl = b->cl;
  if (cl->c && b->gen == cl->gen) {
    for (Py_ssize_t i = 0; i < cl->nblks; i++)
      if (cl->blks[i].off == b->off) {
        memmove(&cl->blks[i], &cl->blks[i + 1], (size_t)(cl->nblks - i - 1) * sizeof *cl->blks);
        cl->nblks--;
        set_limit(cl);
        break;
      }
  }
  Py_DECREF(b->shm);
  Py_DECREF(cl);
  PyObject_Free(b);
}

static int shmblock_getbuffer(shmblock_t *b, Py_buffer *view, int flags) {
  return PyBuffer_FillInfo(view, (PyObject *)b, (char *)b->shm->base + b->off,
                           (Py_ssize_t)b->len, 0, flags);
}

static PyObject *shmblock_offset(shmblock_t *b, void *c) {
  (void)c;
  return PyLong_FromUnsignedLongLong(b->off);
}

static PyBufferProcs shmblock_buffer = {(getbufferproc)shmblock_getbuffer, NULL};

static PyGetSetDef shmblock_getset[] = {
    {"offset", (getter)shmblock_offset, NULL, "Where the block starts in client.shm.", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

PyTypeObject pykvc_shmblock_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvcache._kvcache.ShmBlock",
    .tp_basicsize = sizeof(shmblock_t),
    .tp_dealloc = (destructor)shmblock_dealloc,
    .tp_as_buffer = &shmblock_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A block of the shared buffer (Client.shm_tensor): writable bytes, free when the "
              "last tensor over them goes; zeros once the client is closed.",
    .tp_getset = shmblock_getset,
};

/* ---- arenas ---- */

region_t *lease_arena_region(lease_t *le) {
  client_t *cl = le->cache->client;
  const kvc_lease_info_t *i = kvc_lease_info(le->l);
  if (!i->arena_base || !i->page_stride) return NULL;
  PyObject *key = PyLong_FromVoidPtr((void *)(uintptr_t)i->arena_base);
  if (!key) return NULL;
  if (!cl->arenas && !(cl->arenas = PyDict_New())) {
    Py_DECREF(key);
    return NULL;
  }
  region_t *r = (region_t *)PyDict_GetItemWithError(cl->arenas, key);
  if (!r && !PyErr_Occurred()) {
    r = PyObject_New(region_t, &pykvc_region_type);
    if (r) {
      r->base = (void *)(uintptr_t)i->arena_base;
      r->bytes = (size_t)(i->arena_pages * i->page_stride);
      r->readonly = 1;
      r->dead = false;
      r->borrowed = true;
      if (PyDict_SetItem(cl->arenas, key, (PyObject *)r) < 0) Py_CLEAR(r);
      Py_XDECREF(r); /* the dict's reference */
    }
  }
  Py_DECREF(key);
  return r;
}

region_t *lease_pages_region(lease_t *le) {
  const kvc_lease_info_t *i = kvc_lease_info(le->l);
  const void *base;
  uint64_t bytes;
  kvc_client_pool(le->cache->client->c, &base, &bytes);
  if (!base || !i->page_stride) {
    pykvc_raise(NULL, KVC_E_PROTO);
    return NULL;
  }
  uint8_t *span = mmap(NULL, bytes, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (span == MAP_FAILED) {
    PyErr_SetFromErrno(PyExc_OSError);
    return NULL;
  }
  for (uint32_t p = 0; p < i->npages; p++) {
    uint64_t off = (uint64_t)((const uint8_t *)i->pages[p] - (const uint8_t *)base);
    if (off > bytes || i->page_stride > bytes - off ||
        mremap((void *)(uintptr_t)i->pages[p], 0, i->page_stride, MREMAP_MAYMOVE | MREMAP_FIXED,
               span + off) == MAP_FAILED) {
      PyErr_SetFromErrno(PyExc_OSError);
      munmap(span, bytes);
      return NULL;
    }
  }
  region_t *r = PyObject_New(region_t, &pykvc_region_type);
  if (!r) {
    munmap(span, bytes);
    return NULL;
  }
  r->base = span;
  r->bytes = bytes;
  r->readonly = 1;
  r->dead = false;
  r->borrowed = false;
  return r;
}

/* ---- block tables ---- */

/* (tables int32 [n, max pages] (0 past a lease's pages), starts int32 [n]
 * (the first leased token's row in its first page), ends int32 [n] (rows
 * from that page's first row to the lease's end: a kernel's sequence
 * length)) for a list of Leases of one cache. */
PyObject *cache_block_tables(cache_t *ca, PyObject *args) {
  PyObject *leases;
  if (!PyArg_ParseTuple(args, "O:_block_tables", &leases)) return NULL;
  PyObject *seq = PySequence_Fast(leases, "leases: a sequence of Lease");
  if (!seq) return NULL;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), maxp = 0;
  PyObject *ret = NULL, *bt = NULL, *st = NULL, *en = NULL;
  for (Py_ssize_t j = 0; j < n; j++) {
    PyObject *o = PySequence_Fast_GET_ITEM(seq, j);
    if (!PyObject_TypeCheck(o, &pykvc_lease_type)) {
      PyErr_Format(PyExc_TypeError, "leases[%zd]: not a Lease", j);
      goto out;
    }
    lease_t *le = (lease_t *)o;
    if (!le->l || !le->cache->client->c) {
      PyErr_Format(PyExc_ValueError, "leases[%zd] was released: its pages are no longer held", j);
      goto out;
    }
    if (le->cache->client != ca->client) {
      PyErr_Format(PyExc_ValueError, "leases[%zd] is another client's", j);
      goto out;
    }
    const kvc_lease_info_t *i = kvc_lease_info(le->l);
    if (!i->block_table) {
      PyErr_SetString(PyExc_ValueError, "block tables need a daemon of arenas (this one runs "
                      "with page_bytes, deprecated): read with lease.k(layer) or get");
      goto out;
    }
    if ((Py_ssize_t)i->npages > maxp) maxp = i->npages;
  }
  Py_ssize_t shape[2] = {n, maxp ? maxp : 1};
  if (!(bt = array_new(shape, 2, T_I32)) || !(st = array_new(shape, 1, T_I32)) ||
      !(en = array_new(shape, 1, T_I32)))
    goto out;
  Py_buffer b1, b2, b3;
  if (PyObject_GetBuffer(bt, &b1, PyBUF_WRITABLE) < 0) goto out;
  if (PyObject_GetBuffer(st, &b2, PyBUF_WRITABLE) < 0) {
    PyBuffer_Release(&b1);
    goto out;
  }
  if (PyObject_GetBuffer(en, &b3, PyBUF_WRITABLE) < 0) {
    PyBuffer_Release(&b1);
    PyBuffer_Release(&b2);
    goto out;
  }
  int32_t *t = b1.buf, *s = b2.buf, *e = b3.buf;
  memset(t, 0, (size_t)b1.len);
  for (Py_ssize_t j = 0; j < n; j++) {
    const kvc_lease_info_t *i = kvc_lease_info(((lease_t *)PySequence_Fast_GET_ITEM(seq, j))->l);
    memcpy(t + j * shape[1], i->block_table, i->npages * sizeof *t);
    s[j] = (int32_t)(i->begin - i->first_pos);
    e[j] = (int32_t)(i->end - i->first_pos);
  }
  PyBuffer_Release(&b1);
  PyBuffer_Release(&b2);
  PyBuffer_Release(&b3);
  ret = Py_BuildValue("(OOO)", bt, st, en);
out:
  Py_XDECREF(bt);
  Py_XDECREF(st);
  Py_XDECREF(en);
  Py_DECREF(seq);
  return ret;
}
