/* fdbudget.c: the descriptor budget, how many connections RLIMIT_NOFILE lets
 * the daemon hold.
 *
 * A connection holds one descriptor (its socket), one more if it has rings
 * (their doorbell, an eventfd), and while its Hello is answered one more
 * (the shared buffer's memfd, closed once passed). The
 * descriptors the daemon holds without clients (stdio, the pool, the loop,
 * the listener, libuv's EMFILE reserve) are counted once listening. At start
 * and on reload the soft limit is raised (up to the hard limit) so that
 * max_connections fit; when the hard limit is too low a warning says how many
 * do. Past the budget a new connection is refused with CONNLIMIT, an explicit
 * answer, instead of running into EMFILE; libuv's reserve descriptor
 * (accept-and-close) covers what arrives while even the socket cannot be
 * accepted.
 */
#include <dirent.h>
#include <sys/resource.h>

#include "log.h"
#include "server.h"

/* Kept free beyond the sockets: a Hello's memfd and one spare. */
#define FD_SPARE 2u

static uint64_t open_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  if (!d) return 0;
  uint64_t n = 0;
  struct dirent *e;
  while ((e = readdir(d))) n += e->d_name[0] != '.';
  closedir(d);
  return n ? n - 1 : 0; /* not the directory's own */
}

static uint64_t soft_limit(void) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return UINT64_MAX;
  return (uint64_t)rl.rlim_cur;
}

void fdbudget_adjust(server_t *srv) {
  if (!srv->fd_base) srv->fd_base = open_fds();
  uint64_t want = srv->fd_base + srv->cfg.max_connections + FD_SPARE;
  /* Doorbells too if the hard limit allows; else some connections go
   * without rings, never without their socket (fdbudget_ring_fits). */
  uint64_t wish = want + (srv->cfg.rings ? srv->cfg.max_connections : 0);
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return;
  if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < wish) {
    rlim_t old = rl.rlim_cur;
    rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > wish ? (rlim_t)wish : rl.rlim_max;
    if (rl.rlim_cur > old && setrlimit(RLIMIT_NOFILE, &rl) == 0)
      LOG_INFO("fd_limit", "rlimit_nofile=%llu previous=%llu",
               (unsigned long long)rl.rlim_cur, (unsigned long long)old);
  }
  uint64_t lim = soft_limit();
  if (lim < want) {
    uint64_t room = lim > srv->fd_base + FD_SPARE ? lim - srv->fd_base - FD_SPARE : 0;
    LOG_WARN("fd_limit", "max_connections=%u rlimit_nofile=%llu connections_possible=%llu "
             "note=\"raise LimitNOFILE; connections past it are refused with CONNLIMIT\"",
             srv->cfg.max_connections, (unsigned long long)lim, (unsigned long long)room);
  }
}

bool fdbudget_full(const server_t *srv) {
  /* Read each time: an operator may change it with prlimit. */
  uint64_t lim = soft_limit();
  return srv->fd_base + srv->nconns + srv->nrings + FD_SPARE > lim;
}

bool fdbudget_ring_fits(const server_t *srv) {
  /* A doorbell never takes the descriptor a socket of max_connections needs. */
  uint64_t conns = srv->nconns > srv->cfg.max_connections ? srv->nconns : srv->cfg.max_connections;
  return srv->fd_base + conns + srv->nrings + 1 + FD_SPARE <= soft_limit();
}
