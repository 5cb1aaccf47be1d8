/* hard.h: helpers of the hardening tests (hard_*.c): the daemon's resident
 * memory and descriptors seen from /proc, greeted raw connections, a clock,
 * and latency figures. */
#ifndef KVC_IT_HARD_H
#define KVC_IT_HARD_H

#include <dirent.h>
#include <poll.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/resource.h>

#include "harness.h"
#include "raw.h"

IT_UNUSED static double hard_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* A field of /proc/PID/status in kB (VmRSS, VmHWM, ...). */
IT_UNUSED static uint64_t hard_status_kb(pid_t pid, const char *field) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "r");
  ASSERT(f != NULL);
  uint64_t v = 0;
  size_t n = strlen(field);
  while (fgets(line, sizeof line, f))
    if (strncmp(line, field, n) == 0 && line[n] == ':') v = strtoull(line + n + 1, NULL, 10);
  fclose(f);
  return v;
}

IT_UNUSED static uint64_t hard_rss_kb(pid_t pid) { return hard_status_kb(pid, "VmRSS"); }

/* A frame header announcing n bytes. */
IT_UNUSED static void hard_hdr(uint8_t h[4], uint32_t n) {
  h[0] = (uint8_t)n, h[1] = (uint8_t)(n >> 8), h[2] = (uint8_t)(n >> 16), h[3] = (uint8_t)(n >> 24);
}

/* Whether the daemon runs under make valgrind (slow, its fds and limits
 * are valgrind's too). */
IT_UNUSED static bool hard_valgrind(void) { return getenv("KVC_VALGRIND") != NULL; }

/* Whether the daemon is a sanitizer build (ASan, TSan) or runs under valgrind (the
 * allocator's quarantine and shadow memory make RSS figures meaningless). */
IT_UNUSED static bool hard_sanitized(void) {
  return strstr(it_build(), "asan") != NULL || strstr(it_build(), "tsan") != NULL ||
         hard_valgrind();
}

/* Descriptors the process holds. */
IT_UNUSED static int hard_fd_count(pid_t pid) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
  DIR *d = opendir(path);
  ASSERT(d != NULL);
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d))) n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

/* Waits up to ms for the daemon's fd count to equal want; returns the last count. */
IT_UNUSED static int hard_wait_fds(pid_t pid, int want, int ms) {
  int n = hard_fd_count(pid);
  for (int i = 0; i < ms / 10 && n != want; i++) {
    it_sleep_ms(10);
    n = hard_fd_count(pid);
  }
  return n;
}

/* The daemon's fd count once it has not changed for 200 ms (a connection
 * that just closed, or a buffer's memfd just passed, is gone by then). */
IT_UNUSED static int hard_stable_fds(pid_t pid) {
  int n = hard_fd_count(pid), same = 0;
  while (same < 20) {
    it_sleep_ms(10);
    int m = hard_fd_count(pid);
    same = m == n ? same + 1 : 0;
    n = m;
  }
  return n;
}

/* The soft RLIMIT_NOFILE raised to the hard limit (children inherit it). */
IT_UNUSED static void hard_raise_nofile(rlim_t want) {
  struct rlimit rl;
  ASSERT(getrlimit(RLIMIT_NOFILE, &rl) == 0);
  if (rl.rlim_cur < want) {
    rl.rlim_cur = want < rl.rlim_max ? want : rl.rlim_max;
    ASSERT(setrlimit(RLIMIT_NOFILE, &rl) == 0);
  }
}

/* A raw connection that has done its Hello; the buffer fd is closed. */
IT_UNUSED static int hard_greeted(const daemon_t *d) {
  int fd = it_connect_raw(d->sock);
  ASSERT(fd >= 0);
  raw_hello(fd, KVC_PROTOCOL_VERSION);
  Kvcache__V1__Response *r = raw_reply(fd);
  ASSERT(r && r->status == KVCACHE__V1__STATUS__OK);
  kvcache__v1__response__free_unpacked(r, NULL);
  return fd;
}

/* Milliseconds until the daemon closes fd (EOF or reset), at most limit_ms;
 * -1 if it did not. Replies that arrive first are skipped. */
IT_UNUSED static double hard_ms_until_closed(int fd, int limit_ms) {
  double t0 = hard_now_ms();
  char b[4096];
  for (;;) {
    double left = limit_ms - (hard_now_ms() - t0);
    if (left <= 0) return -1;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, (int)left + 1) <= 0) continue;
    ssize_t n = recv(fd, b, sizeof b, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno == ECONNRESET)) return hard_now_ms() - t0;
  }
}

/* Waits (10 s at most) until the daemon has read everything we sent on fd:
 * the bytes of a Unix socket count in the sender's queue until read. */
IT_UNUSED static void hard_wait_read(int fd) {
  int unread = 1;
  for (int i = 0; i < 10000 && unread > 0; i++) {
    ASSERT(ioctl(fd, SIOCOUTQ, &unread) == 0);
    if (unread > 0) it_sleep_ms(1);
  }
  ASSERT_EQ(unread, 0);
}

IT_UNUSED static int hard_cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Sorts v[0..n) and returns its q-quantile. */
IT_UNUSED static double hard_quantile(double *v, size_t n, double q) {
  if (n == 0) return 0;
  qsort(v, n, sizeof *v, hard_cmp_double);
  size_t i = (size_t)(q * (double)(n - 1) + 0.5);
  return v[i < n ? i : n - 1];
}

#endif
