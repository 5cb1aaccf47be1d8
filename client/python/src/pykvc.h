/* pykvc.h: the objects of the CPython extension kvcache._kvcache and the
 * helpers its files share.
 *
 *   Client ----owns----> kvc_client_t (one connection)
 *     ^  \--lazily----> Region (a private mapping of the shared buffer)
 *     |
 *   Cache -----owns----> kvc_cache_t (freed by kvc_client_close too)
 *     ^
 *   Lease -----owns----> kvc_lease_t, and lazily a Region of the pool
 *
 * A Region is a second mapping (mremap of size 0) of a shared mapping the
 * library made: Python objects (memoryviews, NumPy views) export it, and
 * when its owner goes (the client closes, the lease exits) it is overlaid
 * with zero pages: later reads see zeros, never a freed address. It is
 * unmapped when its last export goes.
 *
 * Every call that talks to the daemon runs through client_enter/client_leave:
 * the client must be open and not in use by another thread (the GIL protects
 * the flag; the call releases the GIL while it waits).
 */
#ifndef PYKVC_H
#define PYKVC_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdbool.h>
#include <stdint.h>

#include "kvcache/kvcache.h"

typedef struct {
  PyObject_HEAD
  void *base;        /* our own mapping; NULL once unmapped */
  size_t bytes;
  int readonly;      /* exports are read-only */
  bool dead;         /* overlaid with zeros: the owner is gone */
  bool borrowed;     /* the library's mapping (an arena's view): never unmapped
                        here until the client's close hands it over */
} region_t;

/* A block of the shared buffer handed out by Client._shm_alloc (fast.c). */
typedef struct {
  uint64_t off, len;
} shm_blk_t;

typedef struct {
  PyObject_HEAD
  kvc_client_t *c;   /* NULL once closed */
  unsigned long busy_thread; /* thread inside a call, 0 if none */
  region_t *shm;     /* the shared buffer's Region, made on first use */
  PyObject *regions; /* list of the leases' live Regions, killed at close */
  PyObject *weakrefs;
  PyObject *arenas;  /* {arena view base: Region (borrowed)} (fast.c) */
  struct { void *base; size_t bytes; } *kept; /* views the close handed over */
  size_t nkept, capkept;
  shm_blk_t *blks;   /* live blocks of the shared buffer, by offset (fast.c) */
  Py_ssize_t nblks, capblks;
  bool limit_dirty;  /* a block was freed during a call: set the limit after it */
  uint32_t gen;      /* counts opens: a block of an earlier one is not this one's */
} client_t;

typedef struct {
  PyObject_HEAD
  client_t *client;  /* strong reference */
  kvc_cache_t *h;    /* NULL once closed; invalid once client->c is NULL */
  kvc_layout_t layout;
} cache_t;

typedef struct {
  PyObject_HEAD
  cache_t *cache;    /* strong reference */
  kvc_lease_t *l;    /* NULL once released */
  region_t *pool;    /* the pool's Region, made on first view */
  uint64_t seq_id, begin, end;
} lease_t;

extern PyTypeObject pykvc_client_type, pykvc_cache_type, pykvc_lease_type, pykvc_region_type;

/* ---- errors (module.c) ---- */
/* Raises the exception class of code rc with the client's last error;
 * returns NULL. c may be NULL (the message is kvc_strerror's). */
PyObject *pykvc_raise(kvc_client_t *c, int rc);
/* The exception class of code rc with message msg; returns NULL. */
PyObject *pykvc_raise_msg(int rc, const char *msg);
/* The same for kvc_client_open's failure. */
PyObject *pykvc_raise_open(int rc);

/* PyArg "O&" converters of unsigned integers that, unlike "K" and "I",
 * raise OverflowError for a negative or too large value. out is a uint64_t
 * (unsigned long long) or a uint32_t (unsigned int). */
int pykvc_u64(PyObject *o, void *out);
int pykvc_u32(PyObject *o, void *out);

/* ---- regions (region.c) ---- */
/* A new Region duplicating [base, base + bytes) of a MAP_SHARED mapping;
 * NULL with an exception set. */
region_t *region_new(const void *base, size_t bytes, int readonly);
/* Overlays the Region with zeros (idempotent). */
void region_kill(region_t *r);

/* ---- client state (client.c) ---- */
/* 0 if the client may run a call now (and marks it busy), else -1 with
 * ValueError (closed) or RuntimeError (another thread is in a call). */
int client_enter(client_t *cl);
void client_leave(client_t *cl);
/* Keeps r to be killed when the client closes (drops dead ones). */
int client_track(client_t *cl, region_t *r);
/* Like client_enter for a cache: the cache and its client must be open. */
int cache_enter(cache_t *ca);
#define cache_leave(ca) client_leave((ca)->client)

/* ---- tensors (tensor.c) ---- */
enum { T_U8 = 100, T_U16, T_U32, T_I64, T_OTHER, T_I32 };

typedef struct {
  void *ptr;
  size_t nbytes;
  int dtype;              /* a kvc_dtype_t or a T_* code */
  int ndim;
  Py_ssize_t shape[8];
  Py_buffer view;         /* when has_view */
  bool has_view;
  bool is_torch;
  char type_name[40];     /* T_OTHER: what it is (int32, torch.int32), for errors */
} tensor_t;

/* Fills *t from a C-contiguous buffer-protocol object or a contiguous CPU
 * torch tensor; writable: the caller will write into it. -1 with ValueError
 * (non-contiguous, wrong device) or TypeError. what names it in messages. */
int tensor_get(PyObject *o, tensor_t *t, bool writable, const char *what);
void tensor_release(tensor_t *t);
/* The element size of a kvc dtype (0 if unknown) and its name. */
size_t dtype_size(int dtype);
const char *dtype_name(int dtype);
/* Parses a dtype argument (None, a name, a kvc code); -1 with ValueError. */
int dtype_parse(PyObject *o, int *out);
/* Checks t's shape against want (ndim dims; -1 matches any) and its dtype
 * against ok[0..nok); -1 with a ValueError saying what was expected. */
int tensor_check(const tensor_t *t, const char *what, const Py_ssize_t *want, int ndim,
                 const int *ok, int nok);
/* u32 token ids from a uint32 buffer or any sequence of ints: *ids points
 * into the buffer (released by tensor_release) or into *owned (PyMem_Free).
 * -1 with an exception. */
int tokens_get(PyObject *o, tensor_t *t, uint32_t **ids, uint32_t **owned, Py_ssize_t *n);
/* A new NumPy array (numpy.empty) of shape and kvc dtype (bf16: uint16). */
PyObject *array_new(const Py_ssize_t *shape, int ndim, int dtype);

/* ---- the fast paths (fast.c) ---- */
extern PyTypeObject pykvc_shmblock_type;
/* After kvc_client_open: the views are handed over at close (keep_views). */
void fast_client_opened(client_t *cl);
/* After kvc_client_close: the handed-over views become dead Regions' (or are
 * unmapped); the blocks are forgotten. */
void fast_client_closed(client_t *cl);
/* The offset of [p, p + n) in the client's shared buffer (as Python maps it:
 * client.shm and blocks of Client._shm_alloc), or -1. */
int64_t shm_off(const client_t *cl, const void *p, size_t n);
/* The arena's Region of a lease (borrowed, one per view), or NULL (no
 * arena: NULL without an exception). */
region_t *lease_arena_region(lease_t *le);
/* A lease's pages duplicated at their pool offsets in a new Region (a daemon
 * of arenas maps the pool segment by segment: no one mapping to duplicate). */
region_t *lease_pages_region(lease_t *le);
PyObject *cache_step_io(cache_t *ca, PyObject *args, PyObject *kw);
PyObject *cache_block_tables(cache_t *ca, PyObject *args);
PyObject *client_shm_alloc(client_t *cl, PyObject *args);
PyObject *client_shm_blocks(client_t *cl, PyObject *noargs);
PyObject *client_shm_offset(client_t *cl, PyObject *o);

/* ---- types' method tables ---- */
PyObject *cache_new(client_t *cl, kvc_cache_t *h);
PyObject *lease_new(cache_t *ca, kvc_lease_t *l, uint64_t seq, uint64_t b, uint64_t e);

#endif
