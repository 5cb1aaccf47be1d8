/* convert.c: dtype_convert, the one conversion between any two dtypes: it
 * picks ggml.c's blocks, fp8.c's vectors or dtype.c's elements. Above all
 * three, so that none of them calls back into it. */
#include <string.h>

#include "dtype.h"
#include "fp8.h"
#include "ggml.h"

void dtype_convert(void *dst, kvc_dtype_t dt, const void *src, kvc_dtype_t st, size_t n) {
  if (dt == st) {
    memcpy(dst, src, dtype_row_bytes(st, n));
    return;
  }
  if (dtype_is_block(dt)) {
    ggml_encode(dst, dt, src, st, n, ISA_BEST);
    return;
  }
  if (dtype_is_block(st)) {
    ggml_decode(dst, dt, src, st, n, ISA_BEST);
    return;
  }
  if (fp8_is(dt) && !fp8_is(st)) {
    fp8_encode(dst, dt, src, st, n, 1.0f, ISA_BEST, false);
    return;
  }
  if (fp8_is(st) && !fp8_is(dt)) {
    fp8_decode(dst, dt, src, st, n, 1.0f, ISA_BEST);
    return;
  }
  dtype_convert_elems(dst, dt, src, st, n);
}
