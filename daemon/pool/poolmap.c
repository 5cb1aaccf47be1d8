/* poolmap.c: the pool's segments in one reserved address range (poolmap.h). */
#include "poolmap.h"

#include <errno.h>
#include <signal.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uv.h>

#include "log.h"
#include "shm.h"
#include "units.h"

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010 /* Linux 5.1 */
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif

#define HUGE_BYTES (2ull << 20)
#define PREFAULT_RUN (64ull << 20) /* faulted in between two looks at a stop */

volatile sig_atomic_t poolmap_stop_asked;
static uint64_t prefault_total, prefault_done, prefault_last_ns, prefault_t0_ns;

void poolmap_prefault_expect(uint64_t bytes) {
  prefault_total = bytes;
  prefault_done = 0;
  prefault_t0_ns = prefault_last_ns = uv_hrtime();
}

/* One line a second while the start backs the pool (a large pool takes
 * seconds: 11.8 s for 4 GiB here). */
static void prefault_progress(uint64_t n) {
  prefault_done += n;
  uint64_t now = uv_hrtime();
  if (!prefault_total || now - prefault_last_ns < 1000000000ull) return;
  prefault_last_ns = now;
  LOG_INFO("pool_prefault", "done_bytes=%llu bytes=%llu pct=%llu elapsed_ms=%llu",
           (unsigned long long)prefault_done, (unsigned long long)prefault_total,
           (unsigned long long)(prefault_done * 100 / prefault_total),
           (unsigned long long)((now - prefault_t0_ns) / 1000000));
}

/* The range [p, p + n) of the reservation is reserved again: no memory, no
 * access, still ours. */
static void unreserve(uint8_t *p, uint64_t n) {
  (void)mmap(p, n, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
}

/* Whether shmem (memfds) takes transparent huge pages when advised. */
static bool shmem_thp(void) {
  FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/shmem_enabled", "r");
  char line[256] = "";
  if (!f) return false;
  if (!fgets(line, sizeof line, f)) line[0] = '\0';
  fclose(f);
  return strstr(line, "[always]") || strstr(line, "[within_size]") || strstr(line, "[advise]") ||
         strstr(line, "[force]");
}

uint64_t poolmap_default_reserve(uint64_t bytes) {
  FILE *f = fopen("/proc/meminfo", "r");
  unsigned long long kib = 0;
  char line[256];
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "MemTotal: %llu kB", &kib) == 1) break;
  if (f) fclose(f);
  uint64_t total = (uint64_t)kib * 1024u;
  return total > bytes ? total : bytes;
}

/* A memfd of bytes, backed: hugetlb (true in *huge) if asked and possible. */
static int backed_memfd(uint64_t bytes, bool hugetlb, char *err, size_t errlen) {
  int fd = memfd_create("kvcached-pool",
                        MFD_CLOEXEC | MFD_ALLOW_SEALING | (hugetlb ? MFD_HUGETLB : 0));
  if (fd < 0) {
    snprintf(err, errlen, "memfd_create: %s", strerror(errno));
    return -1;
  }
  char u[UNITS_LEN];
  if (ftruncate(fd, (off_t)bytes) != 0) {
    snprintf(err, errlen, "ftruncate %s: %s", units_bytes(bytes, u, sizeof u), strerror(errno));
    close(fd);
    return -1;
  }
  /* Reserve the memory now: without it a later page fault could SIGBUS. */
  int rc;
  while ((rc = fallocate(fd, 0, 0, (off_t)bytes)) != 0 && errno == EINTR) {}
  if (rc != 0) {
    snprintf(err, errlen, "cannot back %s (fallocate: %s)", units_bytes(bytes, u, sizeof u),
             strerror(errno));
    close(fd);
    return -1;
  }
  return fd;
}

/* Maps fd at p, faults every page in (so the loop never does), and seals
 * it against every writable mapping but this one. */
static int map_seal(int fd, uint8_t *p, uint64_t bytes, bool advise_thp, bool *thp, char *err,
                    size_t errlen) {
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) {
    snprintf(err, errlen, "sealing: %s", strerror(errno));
    return -1;
  }
  if (mmap(p, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) {
    char u[UNITS_LEN];
    snprintf(err, errlen, "mmap pool segment of %s: %s", units_bytes(bytes, u, sizeof u),
             strerror(errno));
    unreserve(p, bytes);
    return -1;
  }
  /* Advised before the pages fault in, so they fault in huge. */
  *thp = advise_thp && madvise(p, bytes, MADV_HUGEPAGE) == 0;
  /* In runs: a stop asked meanwhile ends it, and the start says how far it is. */
  for (uint64_t at = 0; at < bytes; at += PREFAULT_RUN) {
    uint64_t n = bytes - at < PREFAULT_RUN ? bytes - at : PREFAULT_RUN;
    if (poolmap_stop_asked) {
      snprintf(err, errlen, "stopped by a signal while the pool was backed");
      unreserve(p, bytes);
      return -1;
    }
    if (madvise(p + at, n, MADV_POPULATE_WRITE) != 0) /* before 5.14: one write a page */
      for (uint64_t i = 0; i < n; i += 4096) ((volatile uint8_t *)p)[at + i] = 0;
    prefault_progress(n);
  }
  /* From now on this mapping is the only writable one there will ever be:
   * no new writable mapping, write() or hole punch, through any descriptor,
   * and the mode refuses a read-write reopening to anyone but root. */
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) != 0 || fchmod(fd, 0400) != 0) {
    snprintf(err, errlen, "sealing the pool against writes: %s", strerror(errno));
    unreserve(p, bytes);
    return -1;
  }
  return 0;
}

int poolmap_make(const poolmap_t *pm, uint64_t off, uint64_t bytes, poolseg_t *out, char *err,
                 size_t errlen) {
  memset(out, 0, sizeof *out);
  out->fd = out->ro_fd = -1;
  char a[UNITS_LEN], b[UNITS_LEN];
  if (off + bytes > pm->reserve || bytes == 0) {
    snprintf(err, errlen, "a pool of %s: more than the %s reserved at start "
             "(pool_reserve_bytes)", units_bytes(off + bytes, a, sizeof a),
             units_bytes(pm->reserve, b, sizeof b));
    return -1;
  }
  uint64_t avail = shm_mem_available();
  if (avail != 0 && bytes > avail) {
    snprintf(err, errlen, "%s more of pool exceed the memory available (MemAvailable %s)",
             units_bytes(bytes, a, sizeof a), units_bytes(avail, b, sizeof b));
    return -1;
  }
  if (poolmap_stop_asked) {
    snprintf(err, errlen, "stopped by a signal while the pool was backed");
    return -1;
  }
  uint8_t *p = pm->base + off;
  bool huge_ok = pm->mode != POOL_HUGE_OFF && off % HUGE_BYTES == 0 && bytes % HUGE_BYTES == 0;
  char why[256];
  bool thp = false;
  int fd = huge_ok ? backed_memfd(bytes, true, why, sizeof why) : -1;
  if (fd >= 0 && map_seal(fd, p, bytes, false, &thp, why, sizeof why) == 0) {
    out->huge = POOL_HUGE_HUGETLB;
  } else { /* no huge pages reserved on this host (or they do not seal): plain */
    if (fd >= 0) close(fd);
    if ((fd = backed_memfd(bytes, false, err, errlen)) < 0) return -1;
    if (map_seal(fd, p, bytes, pm->mode != POOL_HUGE_OFF && shmem_thp(), &thp, err, errlen) != 0) {
      close(fd);
      return -1;
    }
    out->huge = thp ? POOL_HUGE_THP : POOL_HUGE_NONE;
  }
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  out->ro_fd = open(path, O_RDONLY | O_CLOEXEC);
  if (out->ro_fd < 0) {
    snprintf(err, errlen, "reopening the pool read-only (%s): %s", path, strerror(errno));
    unreserve(p, bytes);
    close(fd);
    return -1;
  }
  out->fd = fd;
  out->off = off;
  out->bytes = bytes;
  return 0;
}

void poolmap_add(poolmap_t *pm, const poolseg_t *s) {
  pm->seg[pm->nseg] = *s;
  pm->seg[pm->nseg++].id = ++pm->next_id;
  pm->bytes += s->bytes;
  pm->gen++;
}

void poolmap_discard(const poolmap_t *pm, poolseg_t *s) {
  unreserve(pm->base + s->off, s->bytes);
  if (s->fd >= 0) close(s->fd);
  if (s->ro_fd >= 0) close(s->ro_fd);
  s->fd = s->ro_fd = -1;
}

int poolmap_make_run(const poolmap_t *pm, uint64_t off, uint64_t bytes, poolseg_t *out,
                     uint32_t *n, char *err, size_t errlen) {
  uint64_t step = pm->seg_bytes ? pm->seg_bytes : bytes;
  *n = 0;
  if (bytes % step || pm->nseg + bytes / step > POOLMAP_SEGMENTS_MAX) {
    snprintf(err, errlen, "a pool of more than %u segments", POOLMAP_SEGMENTS_MAX);
    return -1;
  }
  for (uint64_t at = 0; at < bytes; at += step) {
    if (poolmap_make(pm, off + at, step, &out[*n], err, errlen) != 0) {
      while (*n) poolmap_discard(pm, &out[--*n]);
      return -1;
    }
    (*n)++;
  }
  return 0;
}

int poolmap_refresh(poolmap_t *pm, uint32_t i, char *err, size_t errlen) {
  poolseg_t *s = &pm->seg[i], fresh;
  /* Made in place: the memory is backed before the mapping changes (a
   * failure to back it leaves the old one); then the new mapping replaces
   * the old at once (MAP_FIXED). */
  if (poolmap_make(pm, s->off, s->bytes, &fresh, err, errlen) != 0) return -1;
  close(s->fd);
  close(s->ro_fd);
  fresh.id = ++pm->next_id;
  *s = fresh;
  pm->gen++;
  return 0;
}

int poolmap_open(poolmap_t *pm, uint64_t bytes, uint64_t reserve, int mode, uint64_t seg_bytes,
                 char *err, size_t errlen) {
  memset(pm, 0, sizeof *pm);
  pm->mode = mode;
  pm->seg_bytes = seg_bytes;
  if (seg_bytes) bytes = bytes / seg_bytes * seg_bytes; /* whole segments */
  if (reserve < bytes) reserve = bytes;
  reserve = (reserve + HUGE_BYTES - 1) / HUGE_BYTES * HUGE_BYTES;
  if (seg_bytes) reserve = reserve / seg_bytes * seg_bytes; /* whole segments (bytes is) */
  /* A pool the memory cannot hold is refused as such before the address
   * space is reserved, which may fail first where it is scarce (under
   * ThreadSanitizer, 64 TiB cannot be). */
  uint64_t avail = shm_mem_available();
  char a[UNITS_LEN], b[UNITS_LEN];
  if (avail != 0 && bytes > avail) {
    snprintf(err, errlen, "a pool of %s exceeds the memory available (MemAvailable %s)",
             units_bytes(bytes, a, sizeof a), units_bytes(avail, b, sizeof b));
    return -1;
  }
  LOG_INFO("pool_prefault", "bytes=%llu state=start", (unsigned long long)bytes);
  /* One more huge page, to align the start of the range to one. */
  uint8_t *r = mmap(NULL, reserve + HUGE_BYTES, PROT_NONE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (r == MAP_FAILED) {
    snprintf(err, errlen, "reserving %s of address space for the pool: %s",
             units_bytes(reserve, a, sizeof a), strerror(errno));
    return -1;
  }
  uint8_t *base = (uint8_t *)(((uintptr_t)r + HUGE_BYTES - 1) & ~(uintptr_t)(HUGE_BYTES - 1));
  if (base > r) munmap(r, (size_t)(base - r));
  munmap(base + reserve, (size_t)(r + reserve + HUGE_BYTES - (base + reserve)));
  pm->base = base;
  pm->reserve = reserve;
  static poolseg_t made[POOLMAP_SEGMENTS_MAX]; /* at start, on one thread */
  uint32_t n;
  if (poolmap_make_run(pm, 0, bytes, made, &n, err, errlen) != 0) {
    munmap(base, reserve);
    pm->base = NULL;
    return -1;
  }
  for (uint32_t i = 0; i < n; i++) poolmap_add(pm, &made[i]);
  return 0;
}

bool poolmap_is_boundary(const poolmap_t *pm, uint64_t bytes) {
  uint64_t at = 0;
  for (uint32_t i = 0; i < pm->nseg; i++)
    if ((at += pm->seg[i].bytes) == bytes) return true;
  return false;
}

void poolmap_detach_to(poolmap_t *pm, uint64_t bytes, poolseg_t *out, uint32_t *n) {
  *n = 0;
  while (pm->nseg > 1 && pm->bytes > bytes) {
    poolseg_t *s = &pm->seg[--pm->nseg];
    out[(*n)++] = *s;
    pm->bytes -= s->bytes;
  }
  pm->gen++;
}

void poolmap_boundaries(const poolmap_t *pm, char *buf, size_t len) {
  size_t used = 0;
  uint64_t at = 0;
  buf[0] = '\0';
  for (uint32_t i = 0; i + 1 < pm->nseg && used < len; i++) {
    char s[32];
    units_bytes(at += pm->seg[i].bytes, s, sizeof s);
    int w = snprintf(buf + used, len - used, "%s%s", i ? ", " : "", s);
    if (w < 0) break;
    used += (size_t)w;
  }
}

int poolmap_huge(const poolmap_t *pm) {
  int h = POOL_HUGE_HUGETLB;
  for (uint32_t i = 0; i < pm->nseg; i++)
    if (pm->seg[i].huge < h) h = pm->seg[i].huge;
  return pm->nseg ? h : POOL_HUGE_NONE;
}

void poolmap_close(poolmap_t *pm) {
  for (uint32_t i = 0; i < pm->nseg; i++) {
    if (pm->seg[i].fd >= 0) close(pm->seg[i].fd);
    if (pm->seg[i].ro_fd >= 0) close(pm->seg[i].ro_fd);
  }
  if (pm->base) munmap(pm->base, pm->reserve);
  memset(pm, 0, sizeof *pm);
}
