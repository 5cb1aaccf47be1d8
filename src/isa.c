/* isa.c: the CPU's vector extensions, as __builtin_cpu_supports reads them. */
#include "isa.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>

/* F16C from CPUID leaf 1 (ECX bit 29): clang 14's __builtin_cpu_supports
 * does not know "f16c" and refuses to compile it (make fuzz). */
static bool have_f16c(void) {
  unsigned a, b, c, d;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
}
#endif

bool isa_have(isa_t isa) {
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  bool avx2 = __builtin_cpu_supports("avx2") && have_f16c();
  switch (isa) {
  case ISA_SCALAR: return true;
  case ISA_AVX2: return avx2;
  case ISA_AVX512:
    return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  case ISA_BEST: return true;
  }
  return false;
#else
  return isa == ISA_SCALAR || isa == ISA_BEST;
#endif
}

isa_t isa_pick(isa_t isa, kvc_dtype_t t) {
  if (isa == ISA_SCALAR || t == KVC_DTYPE_F64) return ISA_SCALAR;
  if ((isa == ISA_BEST || isa == ISA_AVX512) && isa_have(ISA_AVX512)) return ISA_AVX512;
  return isa_have(ISA_AVX2) ? ISA_AVX2 : ISA_SCALAR;
}
