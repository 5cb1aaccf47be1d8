/* module.c: the module kvcache._kvcache and its exception classes, one per
 * KVC_E_* code, generated from errors.h's KVC_ERRNO_MAP so they never drift.
 *
 *   kvcache.Error (Exception): .code, .name, .message
 *     kvcache.FullError: + .needed, .freeable (pages)
 *     kvcache.NoseqError, kvcache.RangeError, ... (the code's name, capitalized)
 */
#include "pykvc.h"

#include <ctype.h>

static PyObject *base_error;
#define NCODES 64
static PyObject *by_code[NCODES]; /* indexed by -code */

static PyObject *raise_code(int rc, const char *msg, kvc_client_t *c) {
  PyObject *cls = (rc < 0 && -rc < NCODES && by_code[-rc]) ? by_code[-rc] : base_error;
  if (!msg || !*msg) msg = kvc_strerror(rc);
  PyObject *exc = PyObject_CallFunction(cls, "s", msg);
  if (!exc) return NULL;
  PyObject *code = PyLong_FromLong(rc);
  if (code) {
    PyObject_SetAttrString(exc, "code", code);
    Py_DECREF(code);
  }
  PyObject *s = PyUnicode_FromString(kvc_err_name(rc));
  if (s) {
    PyObject_SetAttrString(exc, "name", s);
    Py_DECREF(s);
  }
  s = PyUnicode_FromString(msg);
  if (s) {
    PyObject_SetAttrString(exc, "message", s);
    Py_DECREF(s);
  }
  if (rc == KVC_E_FULL) {
    uint64_t needed = 0, freeable = 0;
    if (c) kvc_client_last_full(c, &needed, &freeable);
    PyObject *a = PyLong_FromUnsignedLongLong(needed), *b = PyLong_FromUnsignedLongLong(freeable);
    if (a) PyObject_SetAttrString(exc, "needed", a);
    if (b) PyObject_SetAttrString(exc, "freeable", b);
    Py_XDECREF(a);
    Py_XDECREF(b);
  }
  PyErr_SetObject(cls, exc);
  Py_DECREF(exc);
  return NULL;
}

PyObject *pykvc_raise(kvc_client_t *c, int rc) {
  return raise_code(rc, c ? kvc_client_last_error(c) : NULL, c);
}

PyObject *pykvc_raise_msg(int rc, const char *msg) { return raise_code(rc, msg, NULL); }

PyObject *pykvc_raise_open(int rc) { return raise_code(rc, kvc_client_open_error(), NULL); }

int pykvc_u64(PyObject *o, void *out) {
  if (!PyLong_Check(o)) {
    PyErr_Format(PyExc_TypeError, "expected an int, got %.100s", Py_TYPE(o)->tp_name);
    return 0;
  }
  unsigned long long v = PyLong_AsUnsignedLongLong(o);
  if (v == (unsigned long long)-1 && PyErr_Occurred()) return 0;
  *(unsigned long long *)out = v;
  return 1;
}

int pykvc_u32(PyObject *o, void *out) {
  unsigned long long v;
  if (!pykvc_u64(o, &v)) return 0;
  if (v > UINT32_MAX) {
    PyErr_Format(PyExc_OverflowError, "%llu does not fit 32 bits", v);
    return 0;
  }
  *(unsigned int *)out = (unsigned int)v;
  return 1;
}

/* "NOCACHE" -> "NocacheError", "QUOTA_PAGES" -> "QuotaPagesError". */
static int add_error(PyObject *m, const char *name, int code, const char *msg) {
  char cls[64], qual[80], doc[160];
  size_t n = strlen(name), k = 0;
  if (n + 6 > sizeof cls) return -1;
  for (size_t i = 0; i < n; i++) {
    if (name[i] == '_') continue;
    bool word = i == 0 || name[i - 1] == '_';
    cls[k++] = (char)(word ? toupper((unsigned char)name[i]) : tolower((unsigned char)name[i]));
  }
  memcpy(cls + k, "Error", 6);
  snprintf(qual, sizeof qual, "kvcache.%s", cls);
  snprintf(doc, sizeof doc, "KVC_E_%s (%d): %s.", name, code, msg);
  PyObject *e = PyErr_NewExceptionWithDoc(qual, doc, base_error, NULL);
  if (!e) return -1;
  PyObject *c = PyLong_FromLong(code);
  if (!c || PyObject_SetAttrString(e, "code", c) < 0) {
    Py_XDECREF(c);
    Py_DECREF(e);
    return -1;
  }
  Py_DECREF(c);
  by_code[-code] = e;
  Py_INCREF(e);
  return PyModule_AddObject(m, cls, e);
}

static PyObject *errors_dict(PyObject *self, PyObject *noargs) {
  (void)self;
  (void)noargs;
  PyObject *d = PyDict_New();
  for (int i = 1; d && i < NCODES; i++) {
    if (!by_code[i]) continue;
    PyObject *k = PyLong_FromLong(-i);
    if (!k || PyDict_SetItem(d, k, by_code[i]) < 0) {
      Py_XDECREF(k);
      Py_DECREF(d);
      return NULL;
    }
    Py_DECREF(k);
  }
  return d;
}

static PyMethodDef module_methods[] = {
    {"_errors", errors_dict, METH_NOARGS, "{code: exception class} for every KVC_E_* code."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "kvcache._kvcache",
    "The C extension under the kvcache package (import kvcache instead).", -1,
    module_methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__kvcache(void);
PyMODINIT_FUNC PyInit__kvcache(void) {
  PyObject *m = PyModule_Create(&module_def);
  if (!m) return NULL;
  base_error = PyErr_NewExceptionWithDoc(
      "kvcache.Error",
      "A kvcached call failed: .code is the negative KVC_E_* code, .name its name, "
      ".message the daemon's (or the library's) one-line reason.",
      NULL, NULL);
  if (!base_error) goto fail;
  Py_INCREF(base_error);
  if (PyModule_AddObject(m, "Error", base_error) < 0) goto fail;
#define ADD_ERR_(name, code, msg) \
  if (add_error(m, #name, code, msg) < 0) goto fail;
  KVC_ERRNO_MAP(ADD_ERR_)
#undef ADD_ERR_
  PyTypeObject *types[] = {&pykvc_region_type, &pykvc_client_type, &pykvc_cache_type,
                           &pykvc_lease_type, &pykvc_shmblock_type};
  for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
    if (PyType_Ready(types[i]) < 0) goto fail;
    Py_INCREF(types[i]);
    const char *dot = strrchr(types[i]->tp_name, '.');
    if (PyModule_AddObject(m, dot ? dot + 1 : types[i]->tp_name, (PyObject *)types[i]) < 0)
      goto fail;
  }
  if (PyModule_AddStringConstant(m, "LIBRARY_VERSION", KVC_VERSION_STRING) < 0 ||
      PyModule_AddIntConstant(m, "PROTOCOL_VERSION", KVC_PROTOCOL_VERSION) < 0)
    goto fail;
  return m;
fail:
  Py_DECREF(m);
  return NULL;
}
