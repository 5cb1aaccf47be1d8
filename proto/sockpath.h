/* sockpath.h: where kvcached listens and where its clients connect when no
 * socket is named: one rule, linked by the daemon and the client library
 * alike, so that a daemon started with no --socket and a client given none
 * always meet.
 *
 *   $KVCACHED_SOCKET                      when set: both sides
 *   $RUNTIME_DIRECTORY/kvcached.sock      the daemon under systemd
 *   /run/kvcached/kvcached.sock           root
 *   $XDG_RUNTIME_DIR/kvcached.sock        other users, else
 *   /tmp/kvcached-UID/kvcached.sock       (a directory only UID may write)
 *
 * A client that is not root and finds no daemon at its own default tries
 * next the other users' path of its uid, then the system daemon's
 * /run/kvcached/kvcached.sock (a node's systemd service). */
#ifndef KVC_PROTO_SOCKPATH_H
#define KVC_PROTO_SOCKPATH_H

#include <stddef.h>

/* The daemon's default socket into out[len]; -1 if it does not fit. */
int sockpath_daemon(char *out, size_t len);

/* Longest path either side builds (sun_path's size). */
#define SOCKPATH_MAX 108

/* The client's paths, in the order to try them: the first that accepts a
 * connection is the daemon's. Returns how many (1 to 3), -1 if one does not
 * fit in SOCKPATH_MAX. */
int sockpath_client(char paths[][SOCKPATH_MAX], int max);

#endif
