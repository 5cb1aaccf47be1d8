/* activate.h: systemd socket activation, the pgbouncer way: use the socket
 * systemd passes when there is one, else bind the configured path.
 *
 * systemd (or systemd-socket-activate) opens the listening socket itself and
 * starts the daemon with it as fd 3, setting LISTEN_PID to the daemon's pid
 * and LISTEN_FDS to the number of descriptors passed (sd_listen_fds(3)).
 */
#ifndef KVCD_ACTIVATE_H
#define KVCD_ACTIVATE_H

#include <stddef.h>

#define ACTIVATE_FIRST_FD 3 /* SD_LISTEN_FDS_START */

/* The inherited listening socket: its fd (>= 3), -1 when the process was not
 * socket-activated (no LISTEN_FDS, or LISTEN_PID names another process), or
 * -2 with err when it was but the descriptor is unusable: more than one, or
 * not a listening AF_UNIX SOCK_STREAM socket. Unsets LISTEN_PID, LISTEN_FDS
 * and LISTEN_FDNAMES so no child inherits them; marks the fd close-on-exec. */
int activate_listen_fd(char *err, size_t errlen);

#endif
