/* poolmap.h: the page pool as segments: sealed memfds mapped one after the
 * other into one address range reserved at start (doc/tiers.md, online
 * resize).
 *
 *   base                                                   base + reserve
 *   | segment 0 (pool_bytes at start) | segment 1 (a grow) | PROT_NONE ... |
 *   <------------------------ bytes ------------------------>
 *
 * The engine sees one region that never moves (engine_resize.h). A grow
 * creates, backs and pre-faults a new segment after the last (on a thread:
 * backing gigabytes takes long) and maps it in place; a shrink releases
 * whole segments from the end (mapped PROT_NONE again, their descriptors
 * closed). Each segment is sealed as the pool always was: no size change,
 * and once the daemon's read-write mapping exists, no other writable one
 * (F_SEAL_FUTURE_WRITE); clients get a read-only reopening of each. A
 * client still mapping a released segment keeps reading what it held
 * (never SIGBUS: nothing truncates it); its memory returns when the last
 * mapping goes. Every change bumps gen, which lease replies carry, so a
 * client knows when to map again.
 *
 * Huge pages: a segment is made with MFD_HUGETLB where the host has huge
 * pages reserved, else its mapping is advised MADV_HUGEPAGE where shmem
 * takes transparent huge pages, else it is plain (pool_huge_pages).
 */
#ifndef KVCD_POOLMAP_H
#define KVCD_POOLMAP_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define POOLMAP_SEGMENTS_MAX 4096u /* segments of a pool */
#define POOLMAP_FDS_MAX 64u        /* descriptors one reply passes (PoolMap pages) */

enum pool_huge { POOL_HUGE_NONE = 0, POOL_HUGE_THP = 1, POOL_HUGE_HUGETLB = 2 };
/* pool_huge_pages: what to try. */
enum pool_huge_mode { POOL_HUGE_AUTO = 0, POOL_HUGE_OFF, POOL_HUGE_TRY_THP, POOL_HUGE_TRY_HUGETLB };

typedef struct poolseg {
  int fd;          /* read-write memfd, the daemon's alone */
  int ro_fd;       /* read-only reopening, passed to the clients that map the pool */
  uint64_t off;    /* bytes from base */
  uint64_t bytes;
  uint64_t id;     /* never reused: a client tells a new segment at an old offset */
  int huge;        /* enum pool_huge */
} poolseg_t;

typedef struct poolmap {
  uint8_t *base;    /* the reserved range, huge-page aligned */
  uint64_t seg_bytes; /* every segment's size: the engine's segments, each
                         its own memfd (arenas); 0: one memfd and a
                         segment a grow (page_bytes set) */
  uint64_t reserve; /* its bytes: the most the pool may grow to */
  uint64_t bytes;   /* mapped: the sum of the segments */
  poolseg_t seg[POOLMAP_SEGMENTS_MAX];
  uint32_t nseg;
  uint64_t gen;     /* bumped by every change of the segments */
  uint64_t next_id;
  int mode;         /* enum pool_huge_mode */
} poolmap_t;

/* Reserves `reserve` bytes of address space (at least bytes) and maps a
 * first segment of bytes (backed and pre-faulted: a pool the machine
 * cannot hold fails here, never later with SIGBUS). 0, or -1 with a reason
 * in err (nothing is left on failure). */
int poolmap_open(poolmap_t *pm, uint64_t bytes, uint64_t reserve, int mode, uint64_t seg_bytes,
                 char *err, size_t errlen);
/* Gives segment i fresh memory (zeros): a new memfd mapped in place of the
 * old, which is closed (a client still mapping it keeps what it held; the
 * memory returns when its last mapping goes). Its id changes, gen bumps.
 * 0, or -1 with a reason (the segment is as it was). */
int poolmap_refresh(poolmap_t *pm, uint32_t i, char *err, size_t errlen);
/* Makes the segments of [off, off + bytes) in segments of seg_bytes (or
 * one, without), into out[] (*n of them): as poolmap_make, all or none. */
int poolmap_make_run(const poolmap_t *pm, uint64_t off, uint64_t bytes, poolseg_t *out,
                     uint32_t *n, char *err, size_t errlen);

/* Makes a segment of bytes at offset off (= pm->bytes when asked), mapped in
 * place, backed, pre-faulted and sealed, into *out; does not add it. Reads
 * only base and mode: another thread may run it while the loop goes on (one
 * grow at a time). 0, or -1 with a reason. */
int poolmap_make(const poolmap_t *pm, uint64_t off, uint64_t bytes, poolseg_t *out, char *err,
                 size_t errlen);
/* Adds a segment poolmap_make made (it is the next one). */
void poolmap_add(poolmap_t *pm, const poolseg_t *s);
/* Unmaps a segment (its range reserved again) and closes its descriptors:
 * one poolmap_make made that is not to be added, or one detached. Its
 * memory is freed here unless a client still maps it. */
void poolmap_discard(const poolmap_t *pm, poolseg_t *s);

/* Whether the pool can shrink to bytes: a boundary between segments. */
bool poolmap_is_boundary(const poolmap_t *pm, uint64_t bytes);
/* Takes the segments past bytes (a boundary) out of the map into out[]
 * (*n of them), still mapped: poolmap_discard each (any thread may: it
 * reads only base), before the map changes again. */
void poolmap_detach_to(poolmap_t *pm, uint64_t bytes, poolseg_t *out, uint32_t *n);
/* "1GiB, 1.5GiB" (the sizes the pool may shrink to) into buf. */
void poolmap_boundaries(const poolmap_t *pm, char *buf, size_t len);

/* The huge pages backing the pool: the least of its segments'. */
int poolmap_huge(const poolmap_t *pm);

/* Set (by a signal handler) to stop a start that backs the pool: the
 * fault-in looks at it between runs of 64 MiB and fails with a reason. */
extern volatile sig_atomic_t poolmap_stop_asked;
/* The bytes the start is about to back: progress lines (event=pool_prefault)
 * say how far it is, one a second. */
void poolmap_prefault_expect(uint64_t bytes);

/* Unmaps everything and closes the descriptors. Accepts a closed map. */
void poolmap_close(poolmap_t *pm);

/* The address space a pool may reserve by default: MemTotal (the pool is
 * backed, it never exceeds memory), at least bytes. */
uint64_t poolmap_default_reserve(uint64_t bytes);

#endif
