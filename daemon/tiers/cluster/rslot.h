/* rslot.h: the Redis Cluster key slot (rslot.c): CRC16 of the key, or of
 * the part between the first '{' and the next '}' when that part is not
 * empty (a hash tag), modulo 16384, as the Redis Cluster specification
 * defines it. */
#ifndef KVCD_RSLOT_H
#define KVCD_RSLOT_H

#include <stddef.h>
#include <stdint.h>

#define RSLOT_COUNT 16384u

/* CRC16-CCITT (XMODEM: polynomial 0x1021, initial 0) of n bytes. */
uint16_t rslot_crc16(const void *p, size_t n);
/* The slot of a key of n bytes. */
uint16_t rslot_of(const void *key, size_t n);

#endif
