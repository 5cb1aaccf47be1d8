/* client.c: a client's connection: connect, handshake with the shared buffer's
 * fd, one framed request/reply round trip, close. */
#include "client.h"

#include <errno.h>
#include <poll.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <sys/un.h>
#include <unistd.h>

#include "frame.h"
#include "iowire.h"
#include "sockpath.h"

static _Thread_local char open_err[256];

int client_fail(kvc_client_t *c, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->err, sizeof c->err, fmt, ap);
  va_end(ap);
  return code;
}

int client_code(Kvcache__V1__Status s) {
  if (s == KVCACHE__V1__STATUS__OK) return 0;
  if ((int)s > 0 && -(int)s > KVC_E_MIN_) return -(int)s;
  return KVC_E_PROTO;
}

/* Marks the connection unusable: the reply stream is out of step. */
static int broken(kvc_client_t *c, int code, const char *what, int err) {
  c->broken = true;
  c->broken_code = code == KVC_E_SHUTDOWN ? KVC_E_SHUTDOWN : KVC_E_IO;
  if (err == EAGAIN || err == EWOULDBLOCK) code = KVC_E_TIMEOUT;
  if (what == c->err) /* the reason is written already */
    return code;
  if (err)
    snprintf(c->err, sizeof c->err, "%s: %s", what, strerror(err));
  else
    snprintf(c->err, sizeof c->err, "%s", what);
  return code;
}

static int ensure(uint8_t **buf, size_t *cap, size_t need) {
  if (need <= *cap) return 0;
  size_t n = *cap ? *cap : 4096;
  while (n < need) n *= 2;
  uint8_t *p = realloc(*buf, n);
  if (!p) return KVC_E_NOMEM;
  *buf = p;
  *cap = n;
  return 0;
}

static int send_all(kvc_client_t *c, const uint8_t *p, size_t len) {
  while (len) {
    ssize_t n = send(c->fd, p, len, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

static int pack_request(kvc_client_t *c, Kvcache__V1__Request *req, size_t *len) {
  /* A put or get packs by hand (proto/iowire.h): the same bytes, in a
   * third of the time. */
  size_t hand = iowire_packed_size(req), n = hand ? hand : kvcache__v1__request__get_packed_size(req);
  if (n > c->info.max_frame_bytes && c->info.max_frame_bytes)
    return client_fail(c, KVC_E_TOOMANY, "request of %zu bytes exceeds max_frame_bytes %llu",
                       n, (unsigned long long)c->info.max_frame_bytes);
  if (ensure(&c->wbuf, &c->wcap, FRAME_HEADER_BYTES + n) != 0)
    return client_fail(c, KVC_E_NOMEM, "out of memory");
  frame_put_header(c->wbuf, (uint32_t)n);
  if (hand) iowire_pack(req, c->wbuf + FRAME_HEADER_BYTES);
  else kvcache__v1__request__pack(req, c->wbuf + FRAME_HEADER_BYTES);
  *len = FRAME_HEADER_BYTES + n;
  return 0;
}

static uint64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* recv that polls for spin_ns before it blocks: a reply that arrives within
 * that time needs no wakeup of this thread (on a VM, a wakeup of an idle
 * vCPU is most of a round trip). Costs this thread's CPU while it waits. */
static ssize_t recv_spin(kvc_client_t *c, uint8_t *buf, size_t len) {
  uint64_t end = mono_ns() + c->spin_ns;
  do {
    ssize_t n = recv(c->fd, buf, len, MSG_DONTWAIT);
    if (n >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) return n;
  } while (mono_ns() < end);
  return recv(c->fd, buf, len, 0);
}

/* Receives one reply frame into rbuf; fds[0..3) get passed descriptors, if
 * any (fds NULL: none expected). flags go to recv (MSG_DONTWAIT). Bytes that
 * arrived past the frame (the daemon's goodbye can follow a reply at once)
 * are kept for the next call. Returns the payload length or a negative code. */
/* Receives one reply frame; with fds (room for maxfds, -1 filled), the
 * descriptors that come with its first byte go there (*nfds of them; more
 * than maxfds are closed). */
static int64_t recv_frame(kvc_client_t *c, int *fds, int maxfds, int *nfds, int flags) {
  if (nfds) *nfds = 0;
  size_t have = c->rnext_len, need = FRAME_HEADER_BYTES;
  if (ensure(&c->rbuf, &c->rcap, 4096) != 0) return client_fail(c, KVC_E_NOMEM, "out of memory");
  if (have) memmove(c->rbuf, c->rbuf + c->rnext_off, have);
  c->rnext_len = 0;
  for (;;) {
    uint32_t len = 0;
    int st = frame_parse(c->rbuf, have, CLIENT_MAX_REPLY_BYTES, &len);
    if (st == FRAME_TOO_BIG) return broken(c, KVC_E_PROTO, "reply frame too large", 0);
    if (have >= FRAME_HEADER_BYTES && need == FRAME_HEADER_BYTES) {
      need = FRAME_HEADER_BYTES + (size_t)len;
      if (ensure(&c->rbuf, &c->rcap, need) != 0)
        return broken(c, KVC_E_NOMEM, "out of memory for a reply", 0);
    }
    if (st == FRAME_OK) break;
    ssize_t n;
    if (fds && have == 0) {
      union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(CLIENT_POOL_SEGMENTS * sizeof(int))];
      } ctl;
      struct iovec iov = {.iov_base = c->rbuf, .iov_len = c->rcap};
      struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf,
                           .msg_controllen = sizeof ctl.buf};
      n = recvmsg(c->fd, &msg, MSG_CMSG_CLOEXEC | flags);
      if (n > 0)
        for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
          if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
          int got = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
          for (int i = 0; i < got; i++) {
            int fd;
            memcpy(&fd, CMSG_DATA(cm) + (size_t)i * sizeof fd, sizeof fd);
            if (nfds && *nfds < maxfds) fds[(*nfds)++] = fd;
            else close(fd); /* not asked for: never leaked */
          }
        }
    } else {
      /* A blocking wait polls first when the client asked for it. */
      n = c->spin_ns && !(flags & MSG_DONTWAIT)
              ? recv_spin(c, c->rbuf + have, c->rcap - have)
              : recv(c->fd, c->rbuf + have, c->rcap - have, flags);
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return broken(c, KVC_E_IO, "receiving from kvcached", errno);
    if (n == 0) return broken(c, KVC_E_IO, "kvcached closed the connection", 0);
    have += (size_t)n;
  }
  c->rnext_off = need;
  c->rnext_len = have - need;
  return (int64_t)(need - FRAME_HEADER_BYTES);
}

/* The daemon's goodbye when it drains: id 0, status SHUTDOWN. */
static bool is_goodbye(const Kvcache__V1__Response *r) {
  return r->id == 0 && r->status == KVCACHE__V1__STATUS__SHUTDOWN;
}

/* After a failed send: whether the daemon said goodbye before closing (it
 * is then waiting in the socket, or already received). */
static bool goodbye_waiting(kvc_client_t *c) {
  int64_t n = recv_frame(c, NULL, 0, NULL, MSG_DONTWAIT);
  if (n < 0) return false;
  Kvcache__V1__Response *r =
      kvcache__v1__response__unpack(NULL, (size_t)n, c->rbuf + FRAME_HEADER_BYTES);
  bool bye = r && is_goodbye(r);
  if (r) kvcache__v1__response__free_unpacked(r, NULL);
  return bye;
}

/* Turns a decoded reply into a code; keeps the message and FULL figures. */
static int reply_status(kvc_client_t *c, const Kvcache__V1__Response *r) {
  int code = client_code(r->status);
  if (code == 0) return 0;
  snprintf(c->err, sizeof c->err, "%s", r->error && r->error[0] ? r->error : kvc_strerror(code));
  if (code == KVC_E_FULL) {
    c->full_needed = r->full_needed;
    c->full_freeable = r->full_freeable;
  }
  return code;
}

/* ---- the fast slots (proto/ringfast.h) --------------------------------------- */

bool client_fast_ok(const kvc_client_t *c) {
  return !c->broken && c->fd >= 0 && !c->ev_req_id && c->nrelease <= 1 && ring_fast_usable(c);
}

/* The daemon closed the rings before the fast reply came: its word is on
 * the socket (the goodbye: the request did not run), or EOF. */
static int fast_socket_word(kvc_client_t *c) {
  int64_t n = recv_frame(c, NULL, 0, NULL, 0);
  if (n < 0) return (int)n;
  Kvcache__V1__Response *r =
      kvcache__v1__response__unpack(NULL, (size_t)n, c->rbuf + FRAME_HEADER_BYTES);
  bool bye = r && is_goodbye(r);
  if (r) kvcache__v1__response__free_unpacked(r, NULL);
  if (bye) return broken(c, KVC_E_SHUTDOWN, "kvcached is shutting down (request not run)", 0);
  return broken(c, KVC_E_PROTO, r ? "reply id does not match the request" : "reply does not decode",
                0);
}

int client_call_fast(kvc_client_t *c, ringfast_req_t *q, ringfast_rep_t *rep) {
  q->release = c->nrelease ? c->release_q[0] : 0;
  ring_fast_submit(c, q);
  c->nrelease = 0; /* sent: the daemon releases it before the request runs */
  int rc = ring_fast_wait(c, rep);
  if (rc == RING_WAIT_SOCKET) return fast_socket_word(c);
  if (rc < 0) return broken(c, rc, c->err, 0); /* the reply stream is out of step */
  int code = client_code((Kvcache__V1__Status)rep->status);
  if (code == 0) return 0;
  snprintf(c->err, sizeof c->err, "%s", rep->err[0] ? rep->err : kvc_strerror(code));
  if (code == KVC_E_FULL) {
    c->full_needed = rep->full_needed;
    c->full_freeable = rep->full_freeable;
  }
  return code;
}

int client_call(kvc_client_t *c, Kvcache__V1__Request *req, Kvcache__V1__Response **resp) {
  return client_call_fds(c, req, resp, NULL, 0, NULL);
}

static void close_fds(int *fds, int *nfds) {
  for (int i = 0; nfds && i < *nfds; i++) close(fds[i]);
  if (nfds) *nfds = 0;
}

int client_call_fds(kvc_client_t *c, Kvcache__V1__Request *req, Kvcache__V1__Response **resp,
                    int *fds, int maxfds, int *nfds) {
  if (nfds) *nfds = 0;
  if (c->ev_req_id && !c->broken) /* its replies would mix with the pushed batches */
    return client_fail(c, KVC_E_INVAL, "this connection is subscribed to events: it only "
                       "receives them (use another client for requests)");
  if (c->broken || c->fd < 0)
    return client_fail(c, c->fd < 0 ? KVC_E_IO : c->broken_code,
                       c->broken_code == KVC_E_SHUTDOWN
                           ? "kvcached shut down; reopen the client when it is back"
                           : "connection to kvcached is broken; reopen the client");
  req->id = ++c->next_id;
  req->n_release_leases = c->nrelease;
  req->release_leases = c->release_q;
  size_t len;
  int rc = pack_request(c, req, &len);
  if (rc) return rc;
  /* Through the ring when there is one and the frame fits, else the socket;
   * a reply that brings descriptors comes on the socket, so its request goes
   * there too. */
  int via_ring = ring_usable(&c->ring) && !maxfds ? ring_submit(c, c->wbuf, len) : 1;
  if (via_ring < 0) return broken(c, KVC_E_PROTO, c->err, 0);
  if (via_ring == 1) {
    rc = send_all(c, c->wbuf, len);
    if (rc && goodbye_waiting(c))
      return broken(c, KVC_E_SHUTDOWN, "kvcached is shutting down (request not sent)", 0);
    if (rc) return broken(c, KVC_E_IO, "sending to kvcached", -rc);
  }
  c->nrelease = 0; /* sent: the daemon releases them before the body runs */
  const uint8_t *payload = c->rbuf + FRAME_HEADER_BYTES;
  int64_t n = via_ring == 0 ? ring_wait(c, &payload) : RING_WAIT_SOCKET;
  if (n == RING_WAIT_SOCKET) {
    n = recv_frame(c, fds, maxfds, nfds, 0);
    payload = c->rbuf + FRAME_HEADER_BYTES;
  } else if (n < 0) {
    return broken(c, (int)n, c->err, 0); /* the reply stream is out of step */
  }
  if (n < 0) {
    close_fds(fds, nfds);
    return (int)n;
  }
  Kvcache__V1__Response *r = kvcache__v1__response__unpack(NULL, (size_t)n, payload);
  if (!r) {
    close_fds(fds, nfds);
    return broken(c, KVC_E_PROTO, "reply does not decode", 0);
  }
  if (is_goodbye(r)) {
    kvcache__v1__response__free_unpacked(r, NULL);
    close_fds(fds, nfds);
    return broken(c, KVC_E_SHUTDOWN, "kvcached is shutting down (request not run)", 0);
  }
  if (r->id != req->id) {
    kvcache__v1__response__free_unpacked(r, NULL);
    close_fds(fds, nfds);
    return broken(c, KVC_E_PROTO, "reply id does not match the request", 0);
  }
  rc = reply_status(c, r);
  if (rc) close_fds(fds, nfds);
  if (rc || !resp)
    kvcache__v1__response__free_unpacked(r, NULL);
  else
    *resp = r;
  return rc;
}

int client_recv(kvc_client_t *c, int timeout_ms, Kvcache__V1__Response **resp) {
  if (c->broken || c->fd < 0)
    return client_fail(c, c->fd < 0 ? KVC_E_IO : c->broken_code, "connection to kvcached is broken");
  if (c->rnext_len == 0) { /* nothing buffered past the last frame: wait for the socket */
    struct pollfd p = {.fd = c->fd, .events = POLLIN};
    int n;
    while ((n = poll(&p, 1, timeout_ms)) < 0 && errno == EINTR) {
    }
    if (n < 0) return broken(c, KVC_E_IO, "waiting for kvcached", errno);
    if (n == 0) return client_fail(c, KVC_E_TIMEOUT, "nothing from kvcached within %d ms", timeout_ms);
  }
  int64_t len = recv_frame(c, NULL, 0, NULL, 0);
  if (len < 0) return (int)len;
  Kvcache__V1__Response *r =
      kvcache__v1__response__unpack(NULL, (size_t)len, c->rbuf + FRAME_HEADER_BYTES);
  if (!r) return broken(c, KVC_E_PROTO, "a frame from kvcached does not decode", 0);
  if (is_goodbye(r)) {
    kvcache__v1__response__free_unpacked(r, NULL);
    return broken(c, KVC_E_SHUTDOWN, "kvcached is shutting down", 0);
  }
  *resp = r;
  return 0;
}

/* ---- open ---------------------------------------------------------------- */

/* A uid from text: a number or a user name; false if neither. */
static bool uid_from_text(const char *s, uid_t *uid) {
  char *end;
  unsigned long v = strtoul(s, &end, 10);
  if (*s && !*end && v <= UINT32_MAX) {
    *uid = (uid_t)v;
    return true;
  }
  struct passwd pw, *res = NULL;
  char buf[1024];
  if (getpwnam_r(s, &pw, buf, sizeof buf, &res) == 0 && res) {
    *uid = res->pw_uid;
    return true;
  }
  return false;
}

/* The socket may have been taken over by someone else (a stale path in a
 * directory another user could write): talk only to a daemon whose uid is
 * one this process trusts (doc/security.md). */
static int check_server(kvc_client_t *c, const kvc_client_opts_t *o) {
  struct ucred cred;
  socklen_t len = sizeof cred;
  if (getsockopt(c->fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0)
    return client_fail(c, KVC_E_PEER, "cannot read the server's credentials: %s",
                       strerror(errno));
  uid_t ok[4] = {0, geteuid(), 0, 0};
  size_t n = 2;
  if (uid_from_text("kvcached", &ok[n])) n++;
  const char *env = getenv("KVCACHE_SERVER_UID");
  if (env && *env && uid_from_text(env, &ok[n])) n++;
  for (size_t i = 0; i < n; i++)
    if (cred.uid == ok[i]) return 0;
  if (o->server_uid && cred.uid == (uid_t)o->server_uid) return 0;
  return client_fail(c, KVC_E_PEER,
                     "the socket is served by uid %u (pid %d), which is neither root, this "
                     "process's uid, the user kvcached nor KVCACHE_SERVER_UID: refusing to "
                     "talk to it", (unsigned)cred.uid, (int)cred.pid);
}

/* Connects c->fd to path: 0, or the errno of the failure. */
static int connect_to(kvc_client_t *c, const kvc_client_opts_t *o, const char *path) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  memcpy(sa.sun_path, path, strlen(path) + 1);
  if (c->fd >= 0) close(c->fd);
  c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (c->fd < 0) return errno;
  if (o->timeout_ms) {
    struct timeval tv = {.tv_sec = o->timeout_ms / 1000,
                         .tv_usec = (suseconds_t)(o->timeout_ms % 1000) * 1000};
    setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(c->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  }
  while (connect(c->fd, (struct sockaddr *)&sa, sizeof sa) != 0)
    if (errno != EINTR) return errno;
  return 0;
}

/* The named socket, or the first of the default ones (sockpath.h) where a
 * daemon accepts. */
static int connect_socket(kvc_client_t *c, const kvc_client_opts_t *o) {
  char paths[3][SOCKPATH_MAX];
  int n = 1;
  if (o->socket_path) {
    if (strlen(o->socket_path) >= SOCKPATH_MAX)
      return client_fail(c, KVC_E_INVAL, "socket path too long: %s", o->socket_path);
    strcpy(paths[0], o->socket_path);
  } else if ((n = sockpath_client(paths, 3)) < 0) {
    return client_fail(c, KVC_E_INVAL, "the default socket path is too long");
  }
  int e = 0;
  for (int i = 0; i < n; i++) {
    e = connect_to(c, o, paths[i]);
    if (e == 0) return check_server(c, o);
    if (e == EACCES || e == EPERM)
      return client_fail(c, KVC_E_PERM, "permission denied connecting to %s", paths[i]);
    if (e != ENOENT && e != ECONNREFUSED && e != ENOTDIR)
      return client_fail(c, KVC_E_IO, "connect %s: %s", paths[i], strerror(e));
  }
  const char *named = getenv(KVC_SOCKET_ENV);
  if (o->socket_path || (named && *named))
    return client_fail(c, KVC_E_NOTRUNNING, "kvcached is not running (%s: %s)", paths[0],
                       strerror(e));
  return client_fail(c, KVC_E_NOTRUNNING, "kvcached is not running (no daemon at %s%s%s%s%s; "
                     "$" KVC_SOCKET_ENV " names another socket)", paths[0],
                     n > 2 ? ", " : "", n > 2 ? paths[1] : "", n > 1 ? " or " : "",
                     n > 1 ? paths[n - 1] : "");
}

static int map_buffer(kvc_client_t *c, int fd, uint64_t bytes) {
  struct stat st;
  if (fstat(fd, &st) != 0 || (uint64_t)st.st_size < bytes || bytes == 0)
    return client_fail(c, KVC_E_PROTO, "shared buffer fd does not match its size");
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED)
    return client_fail(c, KVC_E_NOMEM, "mmap shared buffer: %s", strerror(errno));
  c->shm = p;
  c->shm_bytes = c->shm_use = bytes;
  return 0;
}

/* Maps the pool read-only for zero-copy reads (the daemon passed an O_RDONLY
 * descriptor, so no writable mapping can be made of it). Not populated: the
 * pool may be far larger than what this client reads, and 4 KiB page tables
 * of all of it would cost memory per client; pages fault in on first read.
 * The descriptor is the pool's first segment: the address range the daemon
 * reserved for all of them is reserved here too (huge-page aligned), so a
 * page's offset is the same in both (doc/tiers.md, online resize). */
#define POOL_ALIGN (2ull << 20)
static int map_pool(kvc_client_t *c, int fd, const Kvcache__V1__HelloReply *h) {
  struct stat st;
  uint64_t reserve = h->pool_reserve_bytes, bytes;
  if (fstat(fd, &st) != 0 || st.st_size <= 0 ||
      (uint64_t)st.st_size > (reserve ? reserve : h->pool_bytes) ||
      (!reserve && (uint64_t)st.st_size < h->pool_bytes))
    return client_fail(c, KVC_E_PROTO, "pool fd does not match the pool size");
  bytes = reserve ? (uint64_t)st.st_size : h->pool_bytes;
  uint8_t *base = NULL;
  if (reserve) {
    uint8_t *r = mmap(NULL, reserve + POOL_ALIGN, PROT_NONE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (r == MAP_FAILED)
      return client_fail(c, KVC_E_NOMEM, "reserving the pool's address range: %s",
                         strerror(errno));
    base = (uint8_t *)(((uintptr_t)r + POOL_ALIGN - 1) & ~(uintptr_t)(POOL_ALIGN - 1));
    if (base > r) munmap(r, (size_t)(base - r));
    munmap(base + reserve, (size_t)(r + reserve + POOL_ALIGN - (base + reserve)));
  }
  void *p = mmap(base, bytes, PROT_READ, MAP_SHARED | (base ? MAP_FIXED : 0), fd, 0);
  if (p == MAP_FAILED) {
    int e = errno;
    if (base) munmap(base, reserve);
    return client_fail(c, KVC_E_NOMEM, "mmap pool read-only: %s", strerror(e));
  }
  c->pool = p;
  c->pool_bytes = bytes;
  c->pool_reserve = reserve;
  c->pool_gen = h->pool_gen;
  c->pool_seg[0] = (struct pool_seg){0, bytes, 0}; /* the first segment: never released */
  c->pool_nseg = 1;
  return 0;
}

/* Arenas: reserves the range at the first sync (nothing is mapped at the
 * Hello: a client that never reads in place maps nothing). */
static int arena_reserve(kvc_client_t *c) {
  if (c->pool) return 0;
  uint64_t reserve = c->pool_reserve;
  if (!reserve || reserve % c->seg_bytes)
    return client_fail(c, KVC_E_PROTO, "the pool's range is not whole segments");
  uint8_t *r = mmap(NULL, reserve + POOL_ALIGN, PROT_NONE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (r == MAP_FAILED)
    return client_fail(c, KVC_E_NOMEM, "reserving the pool's address range: %s", strerror(errno));
  uint8_t *base = (uint8_t *)(((uintptr_t)r + POOL_ALIGN - 1) & ~(uintptr_t)(POOL_ALIGN - 1));
  if (base > r) munmap(r, (size_t)(base - r));
  munmap(base + reserve, (size_t)(r + reserve + POOL_ALIGN - (base + reserve)));
  uint32_t n = (uint32_t)(reserve / c->seg_bytes);
  c->seg_ids = calloc(n, sizeof *c->seg_ids);
  c->seg_view = calloc(n, sizeof *c->seg_view);
  if (!c->seg_ids || !c->seg_view) {
    free(c->seg_ids), free(c->seg_view);
    c->seg_ids = NULL, c->seg_view = NULL;
    munmap(base, reserve);
    return client_fail(c, KVC_E_NOMEM, "out of memory");
  }
  c->nseg_ids = n;
  c->pool = base;
  return 0;
}

/* The view of arena uid (made at its first segment), or NULL. */
static struct arena_view *view_of(kvc_client_t *c, uint64_t uid, uint64_t stride,
                                  uint32_t per_seg) {
  for (uint32_t i = 0; i < c->nviews; i++)
    if (c->views[i].uid == uid) return &c->views[i];
  if (stride % 4096 || !per_seg) return NULL; /* not mappable as one array */
  struct arena_view *v = realloc(c->views, (c->nviews + 1) * sizeof *v);
  if (!v) return NULL;
  c->views = v;
  uint64_t span = (uint64_t)c->nseg_ids * per_seg * stride;
  /* Holes (pages of segments not this arena's) read as zeros, never fault. */
  void *base = mmap(NULL, span, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  uint64_t *ids = base != MAP_FAILED ? calloc(c->nseg_ids, sizeof *ids) : NULL;
  if (!ids) {
    if (base != MAP_FAILED) munmap(base, span);
    return NULL;
  }
  v[c->nviews] = (struct arena_view){uid, stride, per_seg, base, ids};
  return &v[c->nviews++];
}

void client_views_free(kvc_client_t *c) {
  for (uint32_t i = 0; i < c->nviews; i++) {
    uint64_t span = (uint64_t)c->nseg_ids * c->views[i].per_seg * c->views[i].stride;
    if (c->view_keeper) { /* zeros in one step: the addresses stay valid for the keeper */
      (void)mmap(c->views[i].base, span, PROT_READ,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
      c->view_keeper(c->views[i].base, (size_t)span, c->view_keeper_arg);
    } else {
      munmap(c->views[i].base, span);
    }
    free(c->views[i].ids);
  }
  free(c->views);
  c->views = NULL;
  c->nviews = 0;
}

/* Arenas: maps the segments this client may read, page by page of the
 * daemon's list; what it mapped before and may not read now reads as zeros
 * (its memory goes back to the system once no client maps it). */
static int arena_sync(kvc_client_t *c) {
  int rc = arena_reserve(c);
  if (rc) return rc;
  uint8_t *base = (uint8_t *)(uintptr_t)c->pool;
  uint8_t *listed = calloc(c->nseg_ids ? c->nseg_ids : 1, 1);
  if (!listed) return client_fail(c, KVC_E_NOMEM, "out of memory");
  uint32_t from = 0;
  uint64_t gen = 0, bytes = 0;
  do {
    Kvcache__V1__Request req = KVCACHE__V1__REQUEST__INIT;
    Kvcache__V1__PoolMap pm_req = KVCACHE__V1__POOL_MAP__INIT;
    pm_req.from = from;
    req.body_case = KVCACHE__V1__REQUEST__BODY_POOL_MAP;
    req.pool_map = &pm_req;
    Kvcache__V1__Response *r = NULL;
    int fds[CLIENT_POOL_SEGMENTS], nfds = 0;
    if ((rc = client_call_fds(c, &req, &r, fds, CLIENT_POOL_SEGMENTS, &nfds))) break;
    const Kvcache__V1__PoolMapReply *pm =
        r->body_case == KVCACHE__V1__RESPONSE__BODY_POOL_MAP ? r->pool_map : NULL;
    bool ok = pm && pm->n_segments == (size_t)nfds && pm->reserve_bytes == c->pool_reserve &&
              pm->pool_bytes <= c->pool_reserve && (!pm->next_from || pm->next_from > from);
    for (size_t i = 0; ok && i < pm->n_segments; i++) {
      const Kvcache__V1__PoolSegment *s = pm->segments[i];
      ok = s->bytes == c->seg_bytes && s->offset % c->seg_bytes == 0 &&
           s->offset < pm->pool_bytes && s->id != 0;
      if (!ok) break;
      uint32_t k = (uint32_t)(s->offset / c->seg_bytes);
      listed[k] = 1;
      if (c->seg_ids[k] != s->id &&
          mmap(base + s->offset, s->bytes, PROT_READ, MAP_SHARED | MAP_FIXED, fds[i], 0) ==
              MAP_FAILED) {
        rc = client_fail(c, KVC_E_NOMEM, "mmap pool segment: %s", strerror(errno));
        break;
      }
      c->seg_ids[k] = s->id;
      /* Its arena's view: the same memory again, at its place in the array. */
      struct arena_view *v = view_of(c, s->arena, s->page_stride, s->pages);
      c->seg_view[k] = v ? (uint32_t)(v - c->views) : UINT32_MAX;
      uint64_t run = v ? (uint64_t)v->per_seg * v->stride : 0;
      if (v && v->ids[k] != s->id) {
        if (run > s->bytes ||
            mmap(v->base + (uint64_t)k * run, run, PROT_READ, MAP_SHARED | MAP_FIXED, fds[i], 0) ==
                MAP_FAILED) {
          rc = client_fail(c, KVC_E_NOMEM, "mmap an arena's view: %s", strerror(errno));
          break;
        }
        /* the same place of the other views: not theirs now */
        for (uint32_t w = 0; w < c->nviews; w++)
          if (&c->views[w] != v && c->views[w].ids[k]) {
            uint64_t r2 = (uint64_t)c->views[w].per_seg * c->views[w].stride;
            (void)mmap(c->views[w].base + (uint64_t)k * r2, r2, PROT_READ,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
            c->views[w].ids[k] = 0;
          }
        v->ids[k] = s->id;
      }
    }
    if (!ok && !rc) rc = client_fail(c, KVC_E_PROTO, "the pool's segments do not fit its range");
    if (pm && !rc) {
      gen = pm->gen;
      bytes = pm->pool_bytes;
      from = pm->next_from;
    }
    for (int i = 0; i < nfds; i++) close(fds[i]);
    kvcache__v1__response__free_unpacked(r, NULL);
  } while (!rc && from);
  for (uint32_t k = 0; !rc && k < c->nseg_ids; k++) {
    if (listed[k] || !c->seg_ids[k]) continue;
    (void)mmap(base + (uint64_t)k * c->seg_bytes, c->seg_bytes, PROT_READ,
               MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    c->seg_ids[k] = 0;
    for (uint32_t w = 0; w < c->nviews; w++)
      if (c->views[w].ids[k]) {
        uint64_t r2 = (uint64_t)c->views[w].per_seg * c->views[w].stride;
        (void)mmap(c->views[w].base + (uint64_t)k * r2, r2, PROT_READ,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
        c->views[w].ids[k] = 0;
      }
  }
  free(listed);
  if (!rc) {
    c->pool_gen = gen;
    c->pool_bytes = bytes;
  }
  return rc;
}

int client_pool_sync(kvc_client_t *c, uint64_t gen, uint64_t need) {
  if (c->seg_bytes) {
    if (c->pool && gen == c->pool_gen && need <= c->pool_bytes) return 0;
    return arena_sync(c);
  }
  if ((gen == c->pool_gen || !gen) && need <= c->pool_bytes) return 0;
  if (!c->pool_reserve)
    return client_fail(c, KVC_E_PROTO, "lease page at %llu lies outside the pool",
                       (unsigned long long)(need ? need - 1 : 0));
  Kvcache__V1__Request req = KVCACHE__V1__REQUEST__INIT;
  Kvcache__V1__PoolMap empty = KVCACHE__V1__POOL_MAP__INIT;
  req.body_case = KVCACHE__V1__REQUEST__BODY_POOL_MAP;
  req.pool_map = &empty;
  Kvcache__V1__Response *r = NULL;
  int fds[CLIENT_POOL_SEGMENTS], nfds = 0;
  int rc = client_call_fds(c, &req, &r, fds, CLIENT_POOL_SEGMENTS, &nfds);
  if (rc) return rc;
  const Kvcache__V1__PoolMapReply *pm =
      r->body_case == KVCACHE__V1__RESPONSE__BODY_POOL_MAP ? r->pool_map : NULL;
  uint64_t at = 0;
  bool ok = pm && pm->n_segments == (size_t)nfds && pm->n_segments >= 1 &&
            pm->reserve_bytes == c->pool_reserve;
  for (size_t i = 0; ok && i < pm->n_segments; i++) {
    ok = pm->segments[i]->offset == at && pm->segments[i]->bytes > 0 &&
         pm->segments[i]->bytes <= c->pool_reserve - at;
    at += ok ? pm->segments[i]->bytes : 0;
  }
  if (!ok) rc = client_fail(c, KVC_E_PROTO, "the pool's segments do not fit its range");
  uint8_t *base = (uint8_t *)(uintptr_t)c->pool;
  if (pm && !c->pool_seg[0].id && c->pool_seg[0].bytes == (ok ? pm->segments[0]->bytes : 0))
    c->pool_seg[0].id = pm->segments[0]->id; /* the first segment: the one mapped at open */
  for (size_t i = 0; rc == 0 && i < pm->n_segments; i++) {
    const Kvcache__V1__PoolSegment *s = pm->segments[i];
    bool have = i < c->pool_nseg && c->pool_seg[i].id == s->id && c->pool_seg[i].bytes == s->bytes;
    if (!have && mmap(base + s->offset, s->bytes, PROT_READ, MAP_SHARED | MAP_FIXED, fds[i], 0) ==
                     MAP_FAILED)
      rc = client_fail(c, KVC_E_NOMEM, "mmap pool segment: %s", strerror(errno));
    c->pool_seg[i] = (struct pool_seg){s->offset, s->bytes, s->id};
  }
  /* What the pool released reads as zeros here: its memory goes back once
   * no client maps it, and a stale pointer still reads without a fault. */
  if (rc == 0 && at < c->pool_bytes)
    (void)mmap(base + at, c->pool_bytes - at, PROT_READ,
               MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
  if (rc == 0) {
    c->pool_nseg = (uint32_t)pm->n_segments;
    c->pool_bytes = at;
    c->pool_gen = pm->gen;
  }
  for (int i = 0; i < nfds; i++) close(fds[i]);
  kvcache__v1__response__free_unpacked(r, NULL);
  return rc;
}

/* Whether [off, off + n) of the pool lies in segments this client maps. */
bool client_pool_holds(const kvc_client_t *c, uint64_t off, uint64_t n) {
  if (!c->pool || off > c->pool_bytes || c->pool_bytes - off < n) return false;
  if (!c->seg_bytes) return true;
  for (uint64_t k = off / c->seg_bytes; n && k <= (off + n - 1) / c->seg_bytes; k++)
    if (k >= c->nseg_ids || !c->seg_ids[k]) return false;
  return true;
}

static void take_info(kvc_client_t *c, const Kvcache__V1__HelloReply *h) {
  kvc_client_info_t *i = &c->info;
  i->conn_id = h->conn_id;
  i->shm_bytes = h->shm_bytes;
  i->max_frame_bytes = h->max_frame_bytes;
  i->max_entries = h->max_entries ? h->max_entries : 1;
  i->protocol_version = h->protocol_version;
  i->pool_bytes = h->pool_bytes;
  i->page_bytes = h->page_bytes;
  c->seg_bytes = h->segment_bytes;
  if (c->seg_bytes) c->pool_reserve = h->pool_reserve_bytes; /* mapped at the first lease */
  snprintf(i->server_version, sizeof i->server_version, "%s",
           h->server_version ? h->server_version : "");
  /* An IoEntry packs to at most 146 bytes (13 varints and its header); the
   * rest of an Io (ids, xfer, salt and extra key) to under 200. */
  uint64_t by_frame = h->max_frame_bytes > 512 ? (h->max_frame_bytes - 256) / 160 : 1;
  c->max_io_entries = (uint32_t)(by_frame < i->max_entries ? by_frame : i->max_entries);
}

static int handshake(kvc_client_t *c, const kvc_client_opts_t *o) {
  Kvcache__V1__Request req = KVCACHE__V1__REQUEST__INIT;
  Kvcache__V1__Hello hello = KVCACHE__V1__HELLO__INIT;
  hello.protocol_version = KVC_PROTOCOL_VERSION;
  hello.shm_bytes = o->shm_bytes;
  hello.client_name = (char *)(o->client_name ? o->client_name : "libkvcache");
  hello.rings = !(c->flags & KVC_CLIENT_NO_RINGS);
  req.body_case = KVCACHE__V1__REQUEST__BODY_HELLO;
  req.hello = &hello;
  req.id = ++c->next_id;
  size_t len;
  int rc = pack_request(c, &req, &len);
  if (rc) return rc;
  /* A refused peer may find the socket closed already; its reply still
   * waits to be read, so a failed send is not yet an answer. */
  (void)send_all(c, c->wbuf, len);
  int fds[3] = {-1, -1, -1}, nfds = 0;
  int64_t n = recv_frame(c, fds, 3, &nfds, 0);
  Kvcache__V1__Response *r =
      n < 0 ? NULL : kvcache__v1__response__unpack(NULL, (size_t)n, c->rbuf + FRAME_HEADER_BYTES);
  if (n >= 0 && !r) rc = client_fail(c, KVC_E_PROTO, "handshake reply does not decode");
  else if (n < 0) rc = (int)n;
  else rc = reply_status(c, r);
  if (rc == 0 && (r->body_case != KVCACHE__V1__RESPONSE__BODY_HELLO || fds[0] < 0))
    rc = client_fail(c, KVC_E_PROTO, "handshake reply without the shared buffer");
  if (rc == 0) {
    take_info(c, r->hello);
    rc = map_buffer(c, fds[0], r->hello->shm_bytes);
  }
  if (rc == 0 && r->hello->pool_fd) {
    if (fds[1] < 0) rc = client_fail(c, KVC_E_PROTO, "handshake reply without the pool fd");
    else rc = map_pool(c, fds[1], r->hello);
  }
  /* The doorbell comes last: after the pool's descriptor when there is one. */
  int bell = rc == 0 && r->hello->ring_sq_bytes ? 1 + (r->hello->pool_fd ? 1 : 0) : -1;
  if (bell >= 0 && fds[bell] >= 0) {
    /* Rings that do not add up are not used: the socket still works. */
    if (ring_attach(c, fds[0], fds[bell], r->hello) != 0) c->err[0] = '\0';
    fds[bell] = -1; /* taken */
  }
  for (int i = 0; i < 3; i++)
    if (fds[i] >= 0) close(fds[i]);
  if (!r) return rc;
  kvcache__v1__response__free_unpacked(r, NULL);
  return rc;
}

KVC_API int kvc_client_open(const kvc_client_opts_t *opts, kvc_client_t **out) {
  static const kvc_client_opts_t defaults;
  open_err[0] = '\0';
  if (!out) {
    snprintf(open_err, sizeof open_err, "kvc_client_open: out is NULL");
    return KVC_E_INVAL;
  }
  *out = NULL;
  kvc_client_t *c = calloc(1, sizeof *c);
  if (!c) {
    snprintf(open_err, sizeof open_err, "out of memory");
    return KVC_E_NOMEM;
  }
  c->fd = -1;
  c->ring.bell = -1;
  const kvc_client_opts_t *o = opts ? opts : &defaults;
  c->flags = o->flags;
  c->timeout_ms = o->timeout_ms;
  int rc = connect_socket(c, o);
  if (rc == 0) rc = handshake(c, o);
  /* Polling a ring costs a few loads; polling the socket, a system call a
   * look: the default spins only on the ring. */
  uint32_t spin_us = o->spin_us ? o->spin_us : c->ring.hdr ? KVC_SPIN_US_DEFAULT : 0;
  c->spin_ns = c->flags & KVC_CLIENT_NO_SPIN ? 0 : (uint64_t)spin_us * 1000u;
  c->ring.spin_ns = c->spin_ns;
  if (rc != 0) {
    snprintf(open_err, sizeof open_err, "%s", c->err);
    kvc_client_close(c);
    return rc;
  }
  *out = c;
  return 0;
}

KVC_API const char *kvc_client_open_error(void) { return open_err; }

KVC_API void kvc_client_close(kvc_client_t *c) {
  if (!c) return;
  while (c->caches) kvc_cache_close(c->caches);
  client_leases_free(c);
  ring_detach(&c->ring);
  if (c->ev_batch) kvcache__v1__response__free_unpacked(c->ev_batch, NULL);
  if (c->fd >= 0) close(c->fd);
  if (c->shm) munmap(c->shm, c->shm_bytes);
  prefault_stop(c->prefault); /* before its mapping goes */
  if (c->pool) munmap((void *)c->pool, c->pool_reserve ? c->pool_reserve : c->pool_bytes);
  client_views_free(c);
  free(c->seg_ids);
  free(c->seg_view);
  free(c->hist_pos);
  free(c->wbuf);
  free(c->rbuf);
  free(c->io_wire);
  free(c->io_ptrs);
  free(c->io_parts);
  free(c);
}

KVC_API const char *kvc_client_last_error(const kvc_client_t *c) { return c ? c->err : ""; }

KVC_API void kvc_client_last_full(const kvc_client_t *c, uint64_t *needed, uint64_t *freeable) {
  if (needed) *needed = c ? c->full_needed : 0;
  if (freeable) *freeable = c ? c->full_freeable : 0;
}

KVC_API void kvc_client_info(const kvc_client_t *c, kvc_client_info_t *out) {
  if (c && out) *out = c->info;
}

KVC_API void kvc_client_shm(const kvc_client_t *c, void **base, uint64_t *bytes) {
  if (base) *base = c ? c->shm : NULL;
  if (bytes) *bytes = c ? c->shm_bytes : 0;
}

KVC_API void kvc_client_shm_limit(kvc_client_t *c, uint64_t bytes) {
  if (c) c->shm_use = bytes < c->shm_bytes ? bytes : c->shm_bytes;
}

KVC_API void kvc_client_keep_views(kvc_client_t *c, void (*keep)(void *base, size_t bytes, void *arg),
                                   void *arg) {
  if (!c) return;
  c->view_keeper = keep;
  c->view_keeper_arg = arg;
}

KVC_API void kvc_client_pool(const kvc_client_t *c, const void **base, uint64_t *bytes) {
  if (base) *base = c ? c->pool : NULL;
  if (bytes) *bytes = c ? c->pool_bytes : 0;
}

/* Started at the first lease, not at the Hello: a client that never reads
 * in place (most put and get only) starts no thread, and one created in a
 * fork child of a threaded process runs none before it needs one. */
void client_pool_read(kvc_client_t *c) {
  /* Arenas: the range has holes (segments it may not read): no prefault. */
  if (c->pool && !c->seg_bytes && !c->prefault && !c->prefault_tried &&
      !(c->flags & KVC_CLIENT_NO_PREFAULT)) {
    c->prefault_tried = true;
    c->prefault = prefault_start(c->pool, c->pool_bytes);
  }
}

KVC_API uint64_t kvc_client_pool_prefaulted(const kvc_client_t *c, uint64_t *total) {
  if (total) *total = c ? prefault_total(c->prefault) : 0;
  return c ? prefault_done(c->prefault) : 0;
}

KVC_API int kvc_ping(kvc_client_t *c) {
  if (!c) return KVC_E_INVAL;
  Kvcache__V1__Request req = KVCACHE__V1__REQUEST__INIT;
  Kvcache__V1__Ping ping = KVCACHE__V1__PING__INIT;
  req.body_case = KVCACHE__V1__REQUEST__BODY_PING;
  req.ping = &ping;
  return client_call(c, &req, NULL);
}
