/* units.c: byte counts in binary units for messages (units.h). */
#include "units.h"

#include <stdio.h>

const char *units_bytes(uint64_t v, char *buf, size_t len) {
  static const char *const names[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = -1;
  while (u < 5 && v >> (10 * (u + 2)) != 0) u++; /* the largest unit under v */
  if (u < 0) {
    snprintf(buf, len, "%llu bytes", (unsigned long long)v);
    return buf;
  }
  for (int e = u; e >= 0; e--) /* exact in the largest unit that divides it */
    if (v % (1ull << (10 * (e + 1))) == 0) {
      if (e == u || v >> (10 * (e + 1)) < 10000) {
        snprintf(buf, len, "%llu%s", (unsigned long long)(v >> (10 * (e + 1))), names[e]);
        return buf;
      }
      break;
    }
  snprintf(buf, len, "%.1f%s", (double)v / (double)(1ull << (10 * (u + 1))), names[u]);
  return buf;
}
