/* isa.c: the CPU's vector extensions, as __builtin_cpu_supports reads them. */
#include "isa.h"

#include <stdatomic.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>

/* F16C from CPUID leaf 1 (ECX bit 29): clang 14's __builtin_cpu_supports
 * does not know "f16c" and refuses to compile it (make fuzz). */
static bool have_f16c(void) {
  unsigned a, b, c, d;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
}
#endif

/* What the CPU has, read once: CPUID traps to the hypervisor on a VM (a
 * microsecond or more), and a converting copy asks for every run. Bit 0:
 * read; 1: AVX2 (and F16C); 2: AVX-512 (F, BW, VL, DQ). Threads that race
 * to read it first store the same value. */
static _Atomic unsigned isa_bits;

static unsigned read_bits(void) {
  unsigned bits = 1;
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && have_f16c()) {
    bits |= 2;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
      bits |= 4;
  }
#endif
  return bits;
}

bool isa_have(isa_t isa) {
  unsigned bits = atomic_load_explicit(&isa_bits, memory_order_relaxed);
  if (!bits) {
    bits = read_bits();
    atomic_store_explicit(&isa_bits, bits, memory_order_relaxed);
  }
  switch (isa) {
  case ISA_SCALAR: return true;
  case ISA_AVX2: return bits & 2;
  case ISA_AVX512: return bits & 4;
  case ISA_BEST: return true;
  }
  return false;
}

isa_t isa_pick(isa_t isa, kvc_dtype_t t) {
  if (isa == ISA_SCALAR || t == KVC_DTYPE_F64) return ISA_SCALAR;
  if ((isa == ISA_BEST || isa == ISA_AVX512) && isa_have(ISA_AVX512)) return ISA_AVX512;
  return isa_have(ISA_AVX2) ? ISA_AVX2 : ISA_SCALAR;
}
