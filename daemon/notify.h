/* notify.h: systemd's readiness protocol, spoken directly (no libsystemd).
 *
 * When systemd starts a Type=notify service it sets $NOTIFY_SOCKET to a Unix
 * datagram socket (a path, or "@name" for the abstract namespace); the
 * service reports its state with one datagram of newline-separated
 * KEY=VALUE assignments each time:
 *
 *   READY=1                         listening, pool backed: start is complete
 *   RELOADING=1 MONOTONIC_USEC=...  a reload begins (READY=1 ends it)
 *   STOPPING=1                      the drain began
 *   STATUS=...                      a free-form line for `systemctl status`
 *
 * Without $NOTIFY_SOCKET (no systemd, or another Type) every call is a no-op,
 * so the daemon runs the same anywhere.
 */
#ifndef KVCD_NOTIFY_H
#define KVCD_NOTIFY_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/socket.h>
#include <sys/un.h>

typedef struct notify {
  int fd;                    /* datagram socket; -1 when not under systemd */
  struct sockaddr_un addr;   /* $NOTIFY_SOCKET */
  socklen_t addr_len;
} notify_t;

/* Reads $NOTIFY_SOCKET and opens the socket. Returns 0 (also when the
 * variable is absent: n->fd stays -1) or -1 with err for an unusable value. */
int notify_open(notify_t *n, char *err, size_t errlen);

/* Whether a state can be sent. */
bool notify_enabled(const notify_t *n);

/* Sends one datagram of printf-formatted assignments. Returns 0, or -1 (the
 * caller logs; systemd being gone never stops the daemon). */
int notify_send(notify_t *n, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Closes the socket. Accepts a closed notify_t. */
void notify_close(notify_t *n);

#endif
