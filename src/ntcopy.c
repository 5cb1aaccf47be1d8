/* ntcopy.c: memcpy with streaming stores (ntcopy.h says why). */
#include "ntcopy.h"

#include <stdint.h>
#include <string.h>

#if defined(__SSE2__)
#include <emmintrin.h>

#define NT_MIN 1024u /* shorter runs: the fence and the edges cost more than they save */

void ntcopy(void *dst, const void *src, size_t n) {
  if (n < NT_MIN) {
    memcpy(dst, src, n);
    return;
  }
  unsigned char *d = dst;
  const unsigned char *s = src;
  size_t head = (16u - ((uintptr_t)d & 15u)) & 15u; /* streaming stores want 16-byte alignment */
  memcpy(d, s, head);
  d += head, s += head, n -= head;
  for (; n >= 64; d += 64, s += 64, n -= 64) {
    __m128i a = _mm_loadu_si128((const __m128i *)(const void *)s);
    __m128i b = _mm_loadu_si128((const __m128i *)(const void *)(s + 16));
    __m128i c = _mm_loadu_si128((const __m128i *)(const void *)(s + 32));
    __m128i e = _mm_loadu_si128((const __m128i *)(const void *)(s + 48));
    _mm_stream_si128((__m128i *)(void *)d, a);
    _mm_stream_si128((__m128i *)(void *)(d + 16), b);
    _mm_stream_si128((__m128i *)(void *)(d + 32), c);
    _mm_stream_si128((__m128i *)(void *)(d + 48), e);
  }
  memcpy(d, s, n);
}

void ntcopy_fence(void) { _mm_sfence(); }

#else

void ntcopy(void *dst, const void *src, size_t n) { memcpy(dst, src, n); }

void ntcopy_fence(void) {}

#endif
