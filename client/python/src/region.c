/* region.c: Region, a private second mapping of a shared mapping that Python
 * objects export through the buffer protocol, and that its owner can
 * invalidate (overlay with zero pages) while exports remain: a view that
 * outlives its lease or client reads zeros instead of freed memory.
 */
#include "pykvc.h"

#include <sys/mman.h>
#include <unistd.h>

region_t *region_new(const void *base, size_t bytes, int readonly) {
  size_t pg = (size_t)sysconf(_SC_PAGESIZE);
  uintptr_t a = (uintptr_t)base & ~(uintptr_t)(pg - 1);
  size_t lead = (uintptr_t)base - a;
  /* mremap with old size 0 maps the same shared pages at a new address. */
  void *p = mremap((void *)a, 0, lead + bytes, MREMAP_MAYMOVE);
  if (p == MAP_FAILED) {
    PyErr_SetFromErrno(PyExc_OSError);
    return NULL;
  }
  region_t *r = PyObject_New(region_t, &pykvc_region_type);
  if (!r) {
    munmap(p, lead + bytes);
    return NULL;
  }
  r->base = (char *)p + lead;
  r->bytes = bytes;
  r->readonly = readonly;
  r->dead = false;
  r->borrowed = false;
  return r;
}

static void region_span(const region_t *r, void **a, size_t *len) {
  size_t pg = (size_t)sysconf(_SC_PAGESIZE);
  uintptr_t s = (uintptr_t)r->base & ~(uintptr_t)(pg - 1);
  *a = (void *)s;
  *len = ((uintptr_t)r->base - s) + r->bytes;
}

void region_kill(region_t *r) {
  if (!r || r->dead || !r->base || r->borrowed) return; /* borrowed: the library's close */
  void *a;
  size_t len;
  region_span(r, &a, &len);
  /* Replaces the mapping in one step: the addresses stay valid. */
  mmap(a, len, PROT_READ | (r->readonly ? 0 : PROT_WRITE),
       MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  r->dead = true;
}

static void region_dealloc(region_t *r) {
  if (r->base && !r->borrowed) {
    void *a;
    size_t len;
    region_span(r, &a, &len);
    munmap(a, len);
  }
  PyObject_Free(r);
}

static int region_getbuffer(region_t *r, Py_buffer *view, int flags) {
  return PyBuffer_FillInfo(view, (PyObject *)r, r->base, (Py_ssize_t)r->bytes, r->readonly,
                           flags);
}

static PyObject *region_alive(region_t *r, void *closure) {
  (void)closure;
  return PyBool_FromLong(!r->dead);
}

static PyBufferProcs region_buffer = {(getbufferproc)region_getbuffer, NULL};

static PyGetSetDef region_getset[] = {
    {"alive", (getter)region_alive, NULL,
     "False once the owner (lease or client) is gone: the bytes read as zeros.", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

PyTypeObject pykvc_region_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvcache._kvcache.Region",
    .tp_basicsize = sizeof(region_t),
    .tp_dealloc = (destructor)region_dealloc,
    .tp_as_buffer = &region_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Bytes of the shared buffer or of the pool, exported through the buffer "
              "protocol; they read as zeros once their lease or client is gone.",
    .tp_getset = region_getset,
};
