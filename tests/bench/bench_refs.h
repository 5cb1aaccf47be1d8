/* bench_refs.h: the references kvc_bench measures in the same run as
 * kvcached: memcpy into a pool-sized region, a bare 64-byte Unix-socket
 * ping-pong between two processes, and Redis and memcached on private Unix
 * sockets, spoken to directly (RESP and the memcached ASCII protocol).
 */
#ifndef KVC_BENCH_REFS_H
#define KVC_BENCH_REFS_H

#include <sys/mman.h>
#include <sys/uio.h>

#include "bench_util.h"

/* ---- memcpy into a pool-sized region --------------------------------------- */

#define REGION_BYTES (1ull << 30)

typedef struct mc_ctx {
  uint8_t *region; /* REGION_BYTES, pre-faulted */
  uint8_t *src;    /* the caller's side of the copy */
  uint64_t bytes;  /* per copy */
  uint64_t off;    /* next place in the region; walks it so it stays cold */
  bool out;        /* copy out of the region (a get) instead of into it */
} mc_ctx_t;

static int op_memcpy(void *p) {
  mc_ctx_t *c = p;
  if (c->off + c->bytes > REGION_BYTES) c->off = 0;
  if (c->out) memcpy(c->src, c->region + c->off, c->bytes);
  else memcpy(c->region + c->off, c->src, c->bytes);
  c->off += (c->bytes + 4095) & ~4095ull;
  return 0;
}

/* A pre-faulted private mapping that children never inherit: the bench
 * forks (the echo process, the daemons before exec, the 8 clients), and a
 * fork write-protects every private page, so each later write into it took
 * a copy-on-write fault while the child lived (or a fault after). That made
 * the memcpy of a put's limit 3-30x slower in the trials after a fork: the
 * "limit 0.19 GB/s" of issue 20. */
static BU_UNUSED uint8_t *region_new(uint64_t bytes) {
  uint8_t *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (p == MAP_FAILED) die("mmap %" PRIu64 " bytes: %s", bytes, strerror(errno));
  if (madvise(p, bytes, MADV_DONTFORK) != 0) die("madvise DONTFORK: %s", strerror(errno));
  memset(p, 1, bytes);
  return p;
}

/* ---- bare Unix-socket ping-pong -------------------------------------------- */

typedef struct pp_ctx {
  int fd;
} pp_ctx_t;

static int read_full(int fd, void *buf, size_t n) {
  uint8_t *p = buf;
  while (n) {
    ssize_t r = read(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    p += r;
    n -= (size_t)r;
  }
  return 0;
}

static int write_full(int fd, const void *buf, size_t n) {
  const uint8_t *p = buf;
  while (n) {
    ssize_t r = write(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    p += r;
    n -= (size_t)r;
  }
  return 0;
}

static int op_pingpong(void *p) {
  pp_ctx_t *c = p;
  char buf[64] = {1};
  if (write_full(c->fd, buf, 64) || read_full(c->fd, buf, 64)) return -1;
  return 0;
}

/* Forks an echo process on a socketpair; returns the parent's end. */
static BU_UNUSED int pingpong_open(pid_t *pid) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) die("socketpair: %s", strerror(errno));
  fflush(NULL);
  *pid = fork();
  if (*pid == 0) {
    place_on(true);
    close(sv[0]);
    char buf[64];
    while (read_full(sv[1], buf, 64) == 0 && write_full(sv[1], buf, 64) == 0) {
    }
    _exit(0);
  }
  close(sv[1]);
  watch_pid(*pid);
  return sv[0];
}

/* ---- a buffered reader for the text protocols ------------------------------- */

typedef struct rd {
  int fd;
  uint8_t buf[1 << 16];
  size_t lo, hi;
} rd_t;

/* Reads a line ending in \r\n into out (without it). */
static int rd_line(rd_t *r, char *out, size_t cap) {
  size_t n = 0;
  for (;;) {
    while (r->lo < r->hi) {
      char ch = (char)r->buf[r->lo++];
      if (ch == '\n') {
        if (n && out[n - 1] == '\r') n--;
        out[n] = '\0';
        return 0;
      }
      if (n + 1 < cap) out[n++] = ch;
    }
    ssize_t k = read(r->fd, r->buf, sizeof r->buf);
    if (k <= 0) return -1;
    r->lo = 0;
    r->hi = (size_t)k;
  }
}

/* Reads exactly n bytes into out (NULL: discard). */
static int rd_bytes(rd_t *r, uint8_t *out, size_t n) {
  size_t have = r->hi - r->lo, take = have < n ? have : n;
  if (out) memcpy(out, r->buf + r->lo, take);
  r->lo += take;
  n -= take;
  if (out) out += take;
  while (n) {
    if (out && n >= sizeof r->buf) {
      ssize_t k = read(r->fd, out, n);
      if (k <= 0) return -1;
      out += k;
      n -= (size_t)k;
      continue;
    }
    ssize_t k = read(r->fd, r->buf, sizeof r->buf);
    if (k <= 0) return -1;
    r->lo = 0;
    r->hi = (size_t)k;
    take = r->hi < n ? r->hi : n;
    if (out) memcpy(out, r->buf, take), out += take;
    r->lo = take;
    n -= take;
  }
  return 0;
}

static int unix_connect(const char *path) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
  if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
    if (fd >= 0) close(fd);
    return -1;
  }
  return fd;
}

/* Sends iov[0..n), whatever the kernel takes at a time. */
static int send_iov(int fd, struct iovec *iov, int n) {
  while (n > 0) {
    ssize_t k = writev(fd, iov, n > 1024 ? 1024 : n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return -1;
    while (n > 0 && (size_t)k >= iov->iov_len) {
      k -= (ssize_t)iov->iov_len;
      iov++;
      n--;
    }
    if (n > 0) {
      iov->iov_base = (uint8_t *)iov->iov_base + k;
      iov->iov_len -= (size_t)k;
    }
  }
  return 0;
}

/* ---- Redis (RESP) ---------------------------------------------------------------- */

typedef struct kv_ctx {
  rd_t *r;
  uint8_t *val;     /* value to send / where a reply lands */
  uint64_t bytes;   /* per value */
  int nkeys;        /* MSET/MGET: keys per command */
  uint8_t **vals;   /* nkeys values (MSET/MGET) */
  char hdr[4096 * 4];
} kv_ctx_t;

static int redis_set(void *p) {
  kv_ctx_t *c = p;
  char h[128];
  int n = snprintf(h, sizeof h, "*3\r\n$3\r\nSET\r\n$4\r\nkey0\r\n$%" PRIu64 "\r\n", c->bytes);
  struct iovec iov[3] = {{h, (size_t)n}, {c->val, c->bytes}, {(char *)"\r\n", 2}};
  char line[256];
  if (send_iov(c->r->fd, iov, 3) || rd_line(c->r, line, sizeof line)) return -1;
  return strcmp(line, "+OK") != 0;
}

static int redis_get(void *p) {
  kv_ctx_t *c = p;
  static const char cmd[] = "*2\r\n$3\r\nGET\r\n$4\r\nkey0\r\n";
  char line[256];
  if (write_full(c->r->fd, cmd, sizeof cmd - 1) || rd_line(c->r, line, sizeof line)) return -1;
  if (line[0] != '$' || strtoull(line + 1, NULL, 10) != c->bytes) return -1;
  return rd_bytes(c->r, c->val, c->bytes) || rd_bytes(c->r, NULL, 2);
}

/* One MSET of nkeys values: the decode step as Redis would store it. */
static int redis_mset(void *p) {
  kv_ctx_t *c = p;
  struct iovec iov[3 * 512 + 1];
  char *h = c->hdr;
  /* Each key's header (after the previous value's CRLF), then its value. */
  int ni = 0, start = 0, n = sprintf(h, "*%d\r\n$4\r\nMSET\r\n", 1 + 2 * c->nkeys);
  for (int i = 0; i < c->nkeys; i++) {
    n += sprintf(h + n, "%s$6\r\nk%05d\r\n$%" PRIu64 "\r\n", i ? "\r\n" : "", i, c->bytes);
    iov[ni++] = (struct iovec){h + start, (size_t)(n - start)};
    iov[ni++] = (struct iovec){c->vals[i], c->bytes};
    start = n;
  }
  iov[ni++] = (struct iovec){(char *)"\r\n", 2};
  char line[256];
  if (send_iov(c->r->fd, iov, ni) || rd_line(c->r, line, sizeof line)) return -1;
  return strcmp(line, "+OK") != 0;
}

static int redis_mget(void *p) {
  kv_ctx_t *c = p;
  char *h = c->hdr;
  int n = sprintf(h, "*%d\r\n$4\r\nMGET\r\n", 1 + c->nkeys);
  for (int i = 0; i < c->nkeys; i++) n += sprintf(h + n, "$6\r\nk%05d\r\n", i);
  char line[256];
  if (write_full(c->r->fd, h, (size_t)n) || rd_line(c->r, line, sizeof line)) return -1;
  if (line[0] != '*' || atoi(line + 1) != c->nkeys) return -1;
  for (int i = 0; i < c->nkeys; i++) {
    if (rd_line(c->r, line, sizeof line) || line[0] != '$' ||
        strtoull(line + 1, NULL, 10) != c->bytes)
      return -1;
    if (rd_bytes(c->r, c->vals[i], c->bytes) || rd_bytes(c->r, NULL, 2)) return -1;
  }
  return 0;
}

/* ---- memcached (ASCII) ---------------------------------------------------------- */

static int mc_set(void *p) {
  kv_ctx_t *c = p;
  char h[128], line[256];
  int n = snprintf(h, sizeof h, "set key0 0 0 %" PRIu64 "\r\n", c->bytes);
  struct iovec iov[3] = {{h, (size_t)n}, {c->val, c->bytes}, {(char *)"\r\n", 2}};
  if (send_iov(c->r->fd, iov, 3) || rd_line(c->r, line, sizeof line)) return -1;
  return strcmp(line, "STORED") != 0;
}

static int mc_get(void *p) {
  kv_ctx_t *c = p;
  static const char cmd[] = "get key0\r\n";
  char line[256];
  if (write_full(c->r->fd, cmd, sizeof cmd - 1) || rd_line(c->r, line, sizeof line)) return -1;
  unsigned flags;
  unsigned long long len;
  if (sscanf(line, "VALUE key0 %u %llu", &flags, &len) != 2 || len != c->bytes) return -1;
  if (rd_bytes(c->r, c->val, c->bytes) || rd_bytes(c->r, NULL, 2)) return -1;
  return rd_line(c->r, line, sizeof line) || strcmp(line, "END") != 0;
}

/* ---- starting the servers ----------------------------------------------------- */

typedef struct server_proc {
  pid_t pid;
  char sock[108];
  const char *name;
} server_proc_t;

/* Finds an executable in the usual places; NULL if absent. */
static BU_UNUSED const char *find_exe(const char *name, char *buf, size_t len) {
  static const char *const dirs[] = {"/usr/bin", "/usr/sbin", "/usr/local/bin", "/bin"};
  for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
    snprintf(buf, len, "%s/%s", dirs[i], name);
    if (access(buf, X_OK) == 0) return buf;
  }
  return NULL;
}

static BU_UNUSED bool redis_start(server_proc_t *s, const char *dir) {
  char exe[256], log[256];
  s->name = "redis";
  s->pid = 0;
  if (!find_exe("redis-server", exe, sizeof exe)) return false;
  snprintf(s->sock, sizeof s->sock, "%s/redis.sock", dir);
  snprintf(log, sizeof log, "%s/redis.log", dir);
  const char *argv[] = {exe, "--port", "0", "--unixsocket", s->sock, "--unixsocketperm", "700",
                        "--save", "", "--appendonly", "no", "--dir", dir,
                        "--daemonize", "no", "--proto-max-bulk-len", "1gb", NULL};
  s->pid = spawn(argv, log);
  return wait_socket(s->sock, s->pid, 10000);
}

static BU_UNUSED bool memcached_start(server_proc_t *s, const char *dir) {
  char exe[256], log[256];
  s->name = "memcached";
  s->pid = 0;
  if (!find_exe("memcached", exe, sizeof exe)) return false;
  snprintf(s->sock, sizeof s->sock, "%s/memcached.sock", dir);
  snprintf(log, sizeof log, "%s/memcached.log", dir);
  const char *argv[] = {exe, "-s", s->sock, "-a", "0700", "-I", "16m", "-m", "1024",
                        "-u", "root", NULL};
  s->pid = spawn(argv, log);
  return wait_socket(s->sock, s->pid, 10000);
}

#endif
