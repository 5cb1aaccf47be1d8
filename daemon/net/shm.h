/* shm.h: the per-connection buffers kvcached maps (the pool's segments are
 * poolmap.c's).
 *
 * A connection's buffer is a memfd of its own, sealed (SHRINK, GROW, SEAL) so
 * the client cannot truncate it under the daemon, and mapped read-write by
 * both sides: the client writes put data into it, the engine copies from it
 * into the pool (or from the pool into it for a get). It is not fallocated:
 * the client pre-faults it (MAP_POPULATE) so the daemon's loop never zeroes
 * tens of MiB for a new connection.
 */
#ifndef KVCD_SHM_H
#define KVCD_SHM_H

#include <stddef.h>
#include <stdint.h>

typedef struct shm_region {
  int fd;         /* memfd, -1 once closed */
  uint8_t *base;  /* MAP_SHARED read-write mapping, NULL when unmapped */
  uint64_t bytes; /* size of the file and of the mapping */
} shm_region_t;

/* Bytes of MemAvailable in /proc/meminfo, or 0 if it cannot be read. */
uint64_t shm_mem_available(void);

#define SHM_E_NOFD (-2) /* out of file descriptors (EMFILE, ENFILE) */

/* Creates a connection buffer of `bytes` (page-rounded by the caller), sealed,
 * mapped read-write (neither backed nor populated: the client touches it).
 * The memfd holds extra bytes more past them (the rings, which ring.c maps
 * itself; 0: none); *out maps and counts only `bytes`.
 * Returns 0, SHM_E_NOFD, or -1; a reason in err either way. The fd stays open
 * in *out until shm_close_fd (after it has been sent). */
int shm_buffer_open(uint64_t bytes, uint64_t extra, shm_region_t *out, char *err,
                    size_t errlen);

/* Closes the fd, keeping the mapping. */
void shm_close_fd(shm_region_t *r);
/* Unmaps and closes. Accepts an already closed region (fd -1, base NULL). */
void shm_close(shm_region_t *r);

/* requested clamped to [min_bytes, max_bytes] (0 means def), rounded up to the
 * system page size. */
uint64_t shm_buffer_size(uint64_t requested, uint64_t def, uint64_t min_bytes,
                         uint64_t max_bytes);

#endif
