/* tensor.c: what a Python argument holding tensor bytes is: a C-contiguous
 * buffer-protocol object (NumPy arrays, memoryview, bytearray) or a
 * contiguous CPU torch tensor (any dtype, bfloat16 included), read or written
 * in place; never copied. A non-contiguous input is refused with ValueError.
 */
#include "pykvc.h"

#include <string.h>

static const struct {
  const char *name;
  int dtype;
  size_t size;
} dtypes[] = {
    {"f32", KVC_DTYPE_F32, 4},  {"f64", KVC_DTYPE_F64, 8},  {"f16", KVC_DTYPE_F16, 2},
    {"bf16", KVC_DTYPE_BF16, 2}, {"int8", KVC_DTYPE_INT8, 1},
    {"fp8_e4m3", KVC_DTYPE_FP8_E4M3, 1}, {"fp8_e5m2", KVC_DTYPE_FP8_E5M2, 1},
    {"q8_0", KVC_DTYPE_Q8_0, 1}, {"q4_0", KVC_DTYPE_Q4_0, 1}, /* bytes of blocks */
    {"uint8", T_U8, 1}, {"uint16", T_U16, 2}, {"uint32", T_U32, 4}, {"int64", T_I64, 8},
};
#define NNAMED 9 /* the first entries are the cache dtypes */
#define NDTYPES (sizeof dtypes / sizeof dtypes[0])

size_t dtype_size(int d) {
  for (size_t i = 0; i < NDTYPES; i++)
    if (dtypes[i].dtype == d) return dtypes[i].size;
  return 0;
}

const char *dtype_name(int d) {
  for (size_t i = 0; i < NDTYPES; i++)
    if (dtypes[i].dtype == d) return dtypes[i].name;
  return "other";
}

int dtype_parse(PyObject *o, int *out) {
  *out = 0;
  if (!o || o == Py_None) return 0;
  if (PyLong_Check(o)) {
    long v = PyLong_AsLong(o);
    if (v >= KVC_DTYPE_F32 && v <= KVC_DTYPE_Q4_0) {
      *out = (int)v;
      return 0;
    }
  } else if (PyUnicode_Check(o)) {
    const char *s = PyUnicode_AsUTF8(o);
    if (!s) return -1;
    static const struct {
      const char *alias;
      int dtype;
    } aliases[] = {{"float32", KVC_DTYPE_F32}, {"float64", KVC_DTYPE_F64},
                   {"float16", KVC_DTYPE_F16}, {"bfloat16", KVC_DTYPE_BF16},
                   {"float8_e4m3fn", KVC_DTYPE_FP8_E4M3}, {"float8_e5m2", KVC_DTYPE_FP8_E5M2}};
    for (size_t i = 0; i < NNAMED; i++)
      if (strcmp(s, dtypes[i].name) == 0) {
        *out = dtypes[i].dtype;
        return 0;
      }
    for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
      if (strcmp(s, aliases[i].alias) == 0) {
        *out = aliases[i].dtype;
        return 0;
      }
  }
  PyErr_Format(PyExc_ValueError,
               "dtype must be one of 'f32', 'f64', 'f16', 'bf16', 'int8', 'fp8_e4m3', "
               "'fp8_e5m2', 'q8_0', 'q4_0' (or None), got %R", o);
  return -1;
}

/* The struct-module format of a buffer as a dtype. */
static int format_dtype(const char *f, size_t itemsize) {
  if (!f) return T_U8;
  if (*f == '@' || *f == '=' || *f == '<') f++;
  if (f[0] && f[1]) return T_OTHER;
  switch (*f) {
    case 'f': return KVC_DTYPE_F32;
    case 'd': return KVC_DTYPE_F64;
    case 'e': return KVC_DTYPE_F16;
    case 'b': return KVC_DTYPE_INT8;
    case 'B': case 'c': return T_U8;
    case 'H': return T_U16;
    case 'I': case 'L': return itemsize == 4 ? T_U32 : itemsize == 8 ? T_I64 : T_OTHER;
    case 'l': case 'q': case 'Q': return itemsize == 8 ? T_I64 : T_OTHER;
    default: return T_OTHER;
  }
}

static int torch_dtype_named(PyObject *dt) {
  PyObject *s = PyObject_Str(dt);
  if (!s) return -1;
  const char *n = PyUnicode_AsUTF8(s);
  int r = T_OTHER;
  if (!n) r = -1;
  else if (!strcmp(n, "torch.float32")) r = KVC_DTYPE_F32;
  else if (!strcmp(n, "torch.float64")) r = KVC_DTYPE_F64;
  else if (!strcmp(n, "torch.float16")) r = KVC_DTYPE_F16;
  else if (!strcmp(n, "torch.bfloat16")) r = KVC_DTYPE_BF16;
  else if (!strcmp(n, "torch.int8")) r = KVC_DTYPE_INT8;
  else if (!strcmp(n, "torch.float8_e4m3fn")) r = KVC_DTYPE_FP8_E4M3;
  else if (!strcmp(n, "torch.float8_e5m2")) r = KVC_DTYPE_FP8_E5M2;
  else if (!strcmp(n, "torch.uint8")) r = T_U8;
  else if (!strcmp(n, "torch.int64")) r = T_I64;
  Py_DECREF(s);
  return r;
}

/* torch's dtypes are singletons: each one's code is looked up by name once,
 * then by identity (a decode step parses 16 tensors: this is its cost). */
static int torch_dtype(PyObject *dt) {
  static struct { PyObject *dt; int code; } seen[16];
  static int nseen;
  for (int i = 0; i < nseen; i++)
    if (seen[i].dt == dt) return seen[i].code;
  int r = torch_dtype_named(dt);
  if (r >= 0 && nseen < 16) {
    Py_INCREF(dt);
    seen[nseen].dt = dt;
    seen[nseen++].code = r;
  }
  return r;
}

static PyObject *call0(PyObject *o, PyObject *name) {
  return PyObject_CallMethodNoArgs(o, name);
}

static int tensor_get_(PyObject *o, tensor_t *t, bool writable, const char *what);

static PyObject *s_device, *s_type, *s_is_cpu, *s_is_contiguous, *s_dtype, *s_shape, *s_data_ptr,
    *s_numel, *s_element_size;

static int torch_names(void) {
  if (s_numel) return 0;
  struct { PyObject **p; const char *n; } names[] = {
      {&s_device, "device"}, {&s_type, "type"}, {&s_is_cpu, "is_cpu"},
      {&s_is_contiguous, "is_contiguous"}, {&s_dtype, "dtype"}, {&s_shape, "shape"},
      {&s_data_ptr, "data_ptr"}, {&s_element_size, "element_size"}, {&s_numel, "numel"}};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (!*names[i].p && !(*names[i].p = PyUnicode_InternFromString(names[i].n))) return -1;
  return 0;
}

static int torch_get(PyObject *o, tensor_t *t, const char *what) {
  PyObject *dev = NULL, *devtype = NULL, *contig = NULL, *dt = NULL, *shape = NULL,
           *ptr = NULL, *numel = NULL, *cpu = NULL;
  int rc = -1;
  if (torch_names() < 0) return -1;
  /* is_cpu: one attribute; the device's type only to name another device */
  cpu = PyObject_GetAttr(o, s_is_cpu);
  if (!cpu) PyErr_Clear();
  if (!cpu || !PyObject_IsTrue(cpu)) {
    dev = PyObject_GetAttr(o, s_device);
    if (!dev || !(devtype = PyObject_GetAttr(dev, s_type))) goto out;
    if (!PyUnicode_Check(devtype) || PyUnicode_CompareWithASCIIString(devtype, "cpu") != 0) {
      PyErr_Format(PyExc_ValueError, "%s: a tensor on device %S; kvcache reads and writes CPU "
                   "tensors (copy it with .cpu(), or use the shared buffer's direct forms)",
                   what, dev);
      goto out;
    }
  }
  if (!(contig = call0(o, s_is_contiguous))) goto out;
  if (!PyObject_IsTrue(contig)) {
    PyErr_Format(PyExc_ValueError, "%s: the tensor is not contiguous; pass .contiguous()", what);
    goto out;
  }
  if (!(dt = PyObject_GetAttr(o, s_dtype))) goto out;
  if ((t->dtype = torch_dtype(dt)) < 0) goto out;
  if (!(shape = PyObject_GetAttr(o, s_shape))) goto out;
  PyObject *tup = PySequence_Fast(shape, "shape");
  if (!tup) goto out;
  Py_ssize_t nd = PySequence_Fast_GET_SIZE(tup);
  if (nd > 8) {
    Py_DECREF(tup);
    PyErr_Format(PyExc_ValueError, "%s: %zd dimensions", what, nd);
    goto out;
  }
  t->ndim = (int)nd;
  size_t count = 1;
  for (Py_ssize_t i = 0; i < nd; i++) {
    t->shape[i] = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(tup, i));
    count *= (size_t)(t->shape[i] > 0 ? t->shape[i] : 0);
  }
  Py_DECREF(tup);
  if (!(ptr = call0(o, s_data_ptr))) goto out;
  t->ptr = PyLong_AsVoidPtr(ptr);
  size_t es = dtype_size(t->dtype);
  if (es == 0) {
    PyObject *e = call0(o, s_element_size);
    if (!e) goto out;
    es = PyLong_AsSize_t(e);
    Py_DECREF(e);
  }
  if (nd == 0) { /* a scalar: numel, not the empty product of no dims */
    if (!(numel = call0(o, s_numel))) goto out;
    count = PyLong_AsSize_t(numel);
  }
  t->nbytes = count * es;
  if (PyErr_Occurred()) goto out;
  t->is_torch = true;
  rc = 0;
out:
  Py_XDECREF(cpu);
  Py_XDECREF(dev);
  Py_XDECREF(devtype);
  Py_XDECREF(contig);
  Py_XDECREF(dt);
  Py_XDECREF(shape);
  Py_XDECREF(ptr);
  Py_XDECREF(numel);
  return rc;
}

/* The name an error gives a dtype kvcache does not take: the object's own
 * dtype (NumPy's int32, torch.int32), else the buffer's format. */
static void other_name(PyObject *o, tensor_t *t) {
  PyObject *dt = PyObject_GetAttrString(o, "dtype");
  PyObject *s = dt ? PyObject_Str(dt) : NULL;
  const char *n = s ? PyUnicode_AsUTF8(s) : NULL;
  if (n) snprintf(t->type_name, sizeof t->type_name, "%s", n);
  else if (t->has_view && t->view.format)
    snprintf(t->type_name, sizeof t->type_name, "format '%s'", t->view.format);
  PyErr_Clear();
  Py_XDECREF(s);
  Py_XDECREF(dt);
}

int tensor_get(PyObject *o, tensor_t *t, bool writable, const char *what) {
  int rc = tensor_get_(o, t, writable, what);
  if (rc == 0 && t->dtype == T_OTHER) other_name(o, t);
  return rc;
}

static int tensor_get_(PyObject *o, tensor_t *t, bool writable, const char *what) {
  memset(t, 0, sizeof *t);
  if (PyObject_CheckBuffer(o)) {
    if (PyObject_GetBuffer(o, &t->view, (writable ? PyBUF_WRITABLE : 0) | PyBUF_RECORDS_RO) < 0) {
      if (writable && PyErr_ExceptionMatches(PyExc_BufferError)) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s: the buffer is read-only", what);
      }
      return -1;
    }
    t->has_view = true;
    if (!PyBuffer_IsContiguous(&t->view, 'C')) {
      tensor_release(t);
      PyErr_Format(PyExc_ValueError,
                   "%s: the buffer is not C-contiguous; pass numpy.ascontiguousarray(x) "
                   "(kvcache never copies an input behind your back)", what);
      return -1;
    }
    t->ptr = t->view.buf;
    t->nbytes = (size_t)t->view.len;
    t->dtype = format_dtype(t->view.format, (size_t)t->view.itemsize);
    t->ndim = t->view.ndim > 8 ? 8 : t->view.ndim;
    for (int i = 0; i < t->ndim; i++) t->shape[i] = t->view.shape ? t->view.shape[i] : t->view.len;
    if (t->view.ndim == 0) {
      t->ndim = 1;
      t->shape[0] = t->view.len / (t->view.itemsize ? t->view.itemsize : 1);
    }
    return 0;
  }
  if (torch_names() < 0) return -1;
  PyObject *dp = PyObject_GetAttr(o, s_data_ptr); /* a torch tensor (or alike) */
  if (dp) {
    Py_DECREF(dp);
    return torch_get(o, t, what);
  }
  PyErr_Clear();
  PyErr_Format(PyExc_TypeError, "%s: expected a NumPy array, a buffer or a CPU torch tensor, "
               "got %.100s", what, Py_TYPE(o)->tp_name);
  return -1;
}

void tensor_release(tensor_t *t) {
  if (t->has_view) PyBuffer_Release(&t->view);
  t->has_view = false;
}

static PyObject *shape_str(const Py_ssize_t *s, int nd) {
  PyObject *l = PyTuple_New(nd);
  for (int i = 0; l && i < nd; i++) {
    PyObject *v = s[i] < 0 ? PyUnicode_FromString("n") : PyLong_FromSsize_t(s[i]);
    if (!v) {
      Py_DECREF(l);
      return NULL;
    }
    PyTuple_SET_ITEM(l, i, v);
  }
  return l;
}

int tensor_check(const tensor_t *t, const char *what, const Py_ssize_t *want, int ndim,
                 const int *ok, int nok) {
  bool shape_ok = t->ndim == ndim, dtype_ok = false;
  for (int i = 0; shape_ok && i < ndim; i++)
    if (want[i] >= 0 && t->shape[i] != want[i]) shape_ok = false;
  for (int i = 0; i < nok; i++)
    if (t->dtype == ok[i]) dtype_ok = true;
  if (shape_ok && dtype_ok) return 0;
  char names[64] = "";
  for (int i = 0; i < nok; i++) {
    strncat(names, i ? " or " : "", sizeof names - strlen(names) - 1);
    strncat(names, dtype_name(ok[i]), sizeof names - strlen(names) - 1);
  }
  PyObject *w = shape_str(want, ndim), *g = shape_str(t->shape, t->ndim);
  if (w && g)
    PyErr_Format(PyExc_ValueError,
                 "%s: expected shape %S [layer, token, head, dim] (n: any) of %s, got shape %S "
                 "of %s", what, w, names, g,
                 t->dtype == T_OTHER && t->type_name[0] ? t->type_name : dtype_name(t->dtype));
  Py_XDECREF(w);
  Py_XDECREF(g);
  return -1;
}

int tokens_get(PyObject *o, tensor_t *t, uint32_t **ids, uint32_t **owned, Py_ssize_t *n) {
  *owned = NULL;
  memset(t, 0, sizeof *t);
  if (PyObject_CheckBuffer(o)) {
    if (tensor_get(o, t, false, "tokens") < 0) return -1;
    if (t->dtype == T_U32) {
      *ids = t->ptr;
      *n = (Py_ssize_t)(t->nbytes / 4);
      return 0;
    }
    tensor_release(t);
  }
  PyObject *seq = PySequence_Fast(o, "tokens: expected a uint32 array or a sequence of ints");
  if (!seq) return -1;
  Py_ssize_t len = PySequence_Fast_GET_SIZE(seq);
  uint32_t *a = PyMem_Malloc((size_t)(len ? len : 1) * sizeof *a);
  if (!a) {
    Py_DECREF(seq);
    PyErr_NoMemory();
    return -1;
  }
  for (Py_ssize_t i = 0; i < len; i++) {
    unsigned long long v = PyLong_AsUnsignedLongLong(PySequence_Fast_GET_ITEM(seq, i));
    if (PyErr_Occurred() || v > UINT32_MAX) {
      if (!PyErr_Occurred())
        PyErr_Format(PyExc_ValueError, "tokens[%zd] = %llu does not fit 32 bits", i, v);
      PyMem_Free(a);
      Py_DECREF(seq);
      return -1;
    }
    a[i] = (uint32_t)v;
  }
  Py_DECREF(seq);
  *ids = *owned = a;
  *n = len;
  return 0;
}

PyObject *array_new(const Py_ssize_t *shape, int ndim, int dtype) {
  static PyObject *empty;
  if (!empty) {
    PyObject *np = PyImport_ImportModule("numpy");
    if (!np) return NULL;
    empty = PyObject_GetAttrString(np, "empty");
    Py_DECREF(np);
    if (!empty) return NULL;
  }
  const char *npname;
  switch (dtype) {
    case KVC_DTYPE_F32: npname = "float32"; break;
    case KVC_DTYPE_F64: npname = "float64"; break;
    case KVC_DTYPE_F16: npname = "float16"; break;
    case KVC_DTYPE_BF16: case T_U16: npname = "uint16"; break;
    case KVC_DTYPE_INT8: npname = "int8"; break;
    case T_I32: npname = "int32"; break;
    default: npname = "uint8"; break;
  }
  PyObject *sh = PyTuple_New(ndim);
  if (!sh) return NULL;
  for (int i = 0; i < ndim; i++) PyTuple_SET_ITEM(sh, i, PyLong_FromSsize_t(shape[i]));
  PyObject *r = PyObject_CallFunction(empty, "Os", sh, npname);
  Py_DECREF(sh);
  return r;
}
