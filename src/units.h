/* units.h: a byte count as people read it in a message, in the binary units
 * the options take: 64GiB, 1.5MiB, 100 bytes. Logs keep exact counts
 * (key=value lines are for machines); messages people read use this. */
#ifndef KVC_UNITS_H
#define KVC_UNITS_H

#include <stddef.h>
#include <stdint.h>

/* Enough for any uint64_t: "18446744073709551615 bytes", or "16.0EiB". */
#define UNITS_LEN 32

/* Writes v into buf[len] and returns buf: the largest unit that divides it
 * exactly ("64GiB", the form an option takes back), else one decimal of the
 * largest unit under it ("31.4GiB"), else "N bytes" below 1 KiB. */
const char *units_bytes(uint64_t v, char *buf, size_t len);

#endif
