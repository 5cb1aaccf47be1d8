/* prefault.c: the pool's read-only mapping faulted in the background from
 * the client's first zero-copy read on, so that its reads find their pages
 * mapped.
 *
 * Why: the mapping is not populated at open (the pool may be far larger than
 * what this client reads), so the first touch of each 4 KiB page of it is a
 * page fault. Measured here on a 512 MiB memfd, a first read pass ran at 2.4
 * GB/s and a second at 27 GB/s; MADV_POPULATE_READ or MAP_POPULATE ran at
 * 3.3-3.4 GB/s, one touch a page at about 1.4 us a page. Faulting ahead of
 * each lease would pay the same price on the reader's own time; a decode
 * loop rereads warm pages anyway. So a thread of the lowest priority
 * (SCHED_IDLE: it runs only on a CPU nobody else wants) populates the
 * mapping, 2 MiB at a time, from its start, and stops when the client
 * closes. Its cost is the page tables: 2 MiB per GiB of pool with 4 KiB
 * pages, per client, hence the cap (KVC_PREFAULT_MAX_BYTES). Where the host
 * backs shared memory with transparent huge pages, the mapping asks for
 * them (MADV_HUGEPAGE): a 2 MiB page then costs one fault and one entry.
 * It starts at the first lease rather than at the Hello: a client that only
 * puts and gets starts no thread, and neither does one opened in the fork
 * child of a process with threads before it reads in place.
 * KVC_CLIENT_NO_PREFAULT turns it off.
 */
#include "prefault.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22 /* Linux 5.14 */
#endif

#define CHUNK (2u << 20)

struct prefault {
  const uint8_t *base;
  uint64_t bytes;
  atomic_bool stop;
  atomic_uint_fast64_t done; /* bytes populated so far */
  pid_t pid;                 /* the process the thread runs in (not a fork child) */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool over;                 /* the thread touches the mapping no more (under mu) */
};

/* One byte a page where MADV_POPULATE_READ is unknown (before Linux 5.14). */
static void touch(const volatile uint8_t *p, uint64_t n, uint64_t pg) {
  for (uint64_t i = 0; i < n; i += pg) (void)p[i];
}

static void *run(void *arg) {
  prefault_t *pf = arg;
  struct sched_param sp = {0};
  (void)pthread_setschedparam(pthread_self(), SCHED_IDLE, &sp);
  uint64_t pg = (uint64_t)sysconf(_SC_PAGESIZE);
  bool madv = true;
  for (uint64_t off = 0; off < pf->bytes && !atomic_load(&pf->stop); off += CHUNK) {
    uint64_t n = pf->bytes - off < CHUNK ? pf->bytes - off : CHUNK;
    if (madv && madvise((void *)(pf->base + off), n, MADV_POPULATE_READ) != 0 && errno == EINVAL)
      madv = false;
    if (!madv) touch(pf->base + off, n, pg);
    atomic_store(&pf->done, off + n);
  }
  pthread_mutex_lock(&pf->mu);
  pf->over = true;
  pthread_cond_signal(&pf->cv);
  pthread_mutex_unlock(&pf->mu);
  return NULL;
}

prefault_t *prefault_start(const uint8_t *base, uint64_t bytes) {
  prefault_t *pf = calloc(1, sizeof *pf);
  if (!pf) return NULL;
  pf->base = base;
  pf->bytes = bytes < KVC_PREFAULT_MAX_BYTES ? bytes : KVC_PREFAULT_MAX_BYTES;
  atomic_init(&pf->stop, false);
  atomic_init(&pf->done, 0);
  pf->pid = getpid();
  pthread_mutex_init(&pf->mu, NULL);
  pthread_cond_init(&pf->cv, NULL);
  (void)madvise((void *)base, bytes, MADV_HUGEPAGE); /* where the host has them */
  /* Detached: a process may exit, or fork and exit, with its client open;
   * prefault_stop waits for the thread to leave the mapping instead. */
  pthread_t t;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  int rc = pthread_create(&t, &attr, run, pf);
  pthread_attr_destroy(&attr);
  if (rc != 0) {
    pthread_mutex_destroy(&pf->mu);
    pthread_cond_destroy(&pf->cv);
    free(pf);
    return NULL;
  }
  return pf;
}

uint64_t prefault_done(const prefault_t *pf) { return pf ? atomic_load(&pf->done) : 0; }

uint64_t prefault_total(const prefault_t *pf) { return pf ? pf->bytes : 0; }

void prefault_stop(prefault_t *pf) {
  if (!pf) return;
  atomic_store(&pf->stop, true);
  /* A fork child has the client but not the thread: nothing to wait for. */
  if (getpid() == pf->pid) {
    pthread_mutex_lock(&pf->mu);
    while (!pf->over) pthread_cond_wait(&pf->cv, &pf->mu);
    pthread_mutex_unlock(&pf->mu);
  }
  pthread_mutex_destroy(&pf->mu);
  pthread_cond_destroy(&pf->cv);
  free(pf);
}
