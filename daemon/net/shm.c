/* shm.c: creating, backing, sealing and mapping kvcached's memfds. */
#include "shm.h"
#include "units.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

uint64_t shm_mem_available(void) {
  FILE *f = fopen("/proc/meminfo", "r");
  if (!f) return 0;
  char line[256];
  unsigned long long kib = 0;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1) break;
  fclose(f);
  return (uint64_t)kib * 1024u;
}

/* backed: reserve the memory now with fallocate. seals: added at once. */
static int create(const char *name, uint64_t bytes, bool backed, int seals,
                  shm_region_t *out, char *err, size_t errlen) {
  out->fd = -1;
  out->base = NULL;
  out->bytes = 0;
  int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) {
    int e = errno;
    snprintf(err, errlen, "memfd_create: %s", strerror(e));
    return e == EMFILE || e == ENFILE ? SHM_E_NOFD : -1;
  }
  if (ftruncate(fd, (off_t)bytes) != 0) {
    char u[UNITS_LEN];
    snprintf(err, errlen, "ftruncate %s: %s", units_bytes(bytes, u, sizeof u), strerror(errno));
    goto fail;
  }
  /* Reserve the memory now: without it a later page fault could SIGBUS. */
  int rc = 0;
  while (backed && (rc = fallocate(fd, 0, 0, (off_t)bytes)) != 0 && errno == EINTR) {
  }
  if (rc != 0) {
    char u[UNITS_LEN];
    snprintf(err, errlen, "cannot back %s (fallocate: %s)", units_bytes(bytes, u, sizeof u),
             strerror(errno));
    goto fail;
  }
  if (fcntl(fd, F_ADD_SEALS, seals) != 0) {
    snprintf(err, errlen, "sealing: %s", strerror(errno));
    goto fail;
  }
  out->fd = fd;
  out->bytes = bytes;
  return 0;
fail:
  close(fd);
  return -1;
}

int shm_buffer_open(uint64_t bytes, uint64_t extra, shm_region_t *out, char *err,
                    size_t errlen) {
  /* Not fallocated: zeroing tens of MiB here would stall every client's
   * event loop turn. The client populates its mapping at open (in its own
   * time); an unsized internal memfd cannot run out of space, so a later
   * fault cannot SIGBUS (memory pressure is the OOM killer's, as for any
   * anonymous memory). */
  int rc = create("kvcached-conn", bytes + extra, false,
                  F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL, out, err, errlen);
  if (rc != 0) return rc;
  out->bytes = bytes;
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, out->fd, 0);
  if (p == MAP_FAILED) {
    snprintf(err, errlen, "mmap buffer: %s", strerror(errno));
    shm_close(out);
    return -1;
  }
  out->base = p;
  return 0;
}

void shm_close_fd(shm_region_t *r) {
  if (r->fd >= 0) close(r->fd);
  r->fd = -1;
}

void shm_close(shm_region_t *r) {
  if (r->base) munmap(r->base, r->bytes);
  r->base = NULL;
  shm_close_fd(r);
  r->bytes = 0;
}

uint64_t shm_buffer_size(uint64_t requested, uint64_t def, uint64_t min_bytes,
                         uint64_t max_bytes) {
  uint64_t n = requested ? requested : def;
  if (n < min_bytes) n = min_bytes;
  if (n > max_bytes) n = max_bytes;
  uint64_t pg = (uint64_t)sysconf(_SC_PAGESIZE);
  return (n + pg - 1) / pg * pg;
}
