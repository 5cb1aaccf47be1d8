/* rslot.c: the Redis Cluster key slot (rslot.h). Bitwise CRC16: a key is a
 * hundred bytes and a lookup hashes a few hundred keys, so a table would
 * save nothing worth its 512 bytes of cache. */
#include "rslot.h"

#include <string.h>

uint16_t rslot_crc16(const void *p, size_t n) {
  const uint8_t *b = p;
  uint16_t crc = 0;
  for (size_t i = 0; i < n; i++) {
    crc ^= (uint16_t)(b[i] << 8);
    for (int k = 0; k < 8; k++)
      crc = (uint16_t)(crc & 0x8000 ? (crc << 1) ^ 0x1021 : crc << 1);
  }
  return crc;
}

uint16_t rslot_of(const void *key, size_t n) {
  const char *k = key, *open = memchr(k, '{', n);
  if (open) {
    size_t from = (size_t)(open - k) + 1;
    const char *close = memchr(open + 1, '}', n - from);
    if (close && close > open + 1) { /* {} is no tag: the whole key counts */
      k = open + 1;
      n = (size_t)(close - k);
    }
  }
  return (uint16_t)(rslot_crc16(k, n) & (RSLOT_COUNT - 1));
}
