/* disk.h: the local disk tier and the warm restart (doc/tiers.md).
 *
 * Pages of the prefix index that eviction reclaims are written to disk_dir
 * (one file a page, diskfmt.h) instead of being dropped, within disk_bytes,
 * least recently used out first. A match or attach that reaches pages on
 * disk reads them back on the tier's I/O threads while its connection waits
 * (parked, as for a busy sequence), imports those that verify, and runs
 * again; the event loop never touches a file.
 *
 *   evict -> spill (copy to staging) -> turn's end (newest first) -> write thread
 *         -> <hash>.kvp
 *   match -> probe -> index hit -> import_begin, read thread -> import_end
 *         -> the request runs again and hits
 *
 * A clean stop (after the drain) writes every indexed page not on disk yet;
 * a start indexes the directory's files on a thread while the daemon
 * serves. The tenant registry (names -> numbers, which seed the chains) is
 * kept beside the pages so that tenants keep their numbers.
 */
#ifndef KVCD_DISK_H
#define KVCD_DISK_H

#include <stddef.h>
#include <stdint.h>

#include "engine.h"
#include "server.h"

typedef struct disk disk_t;

/* With disk_dir set: makes or checks the directory (ours, mode 0700: not
 * writable by others), locks it against a second daemon, restores the
 * tenant registry (call before any tenant is registered), starts the I/O
 * threads and the start-up scan, and sets the engine's spill callback.
 * Without it does nothing. 0, or -1 with a reason in err. */
int disk_open(server_t *srv, char *err, size_t errlen);

/* After the loop ended: with clean (a drain), persists every indexed page
 * not on disk and the registry, then syncs the file system. Then joins the
 * threads and frees everything (the poll handle closes on the next loop
 * run). Accepts a server without a tier. */
void disk_close(server_t *srv, bool clean);

/* A reload: disk_bytes again (and the bound a full disk lowered, reset). */
void disk_reload(server_t *srv);

/* The once-a-second timer: the start-up scan's progress into the stats. */
void disk_tick(server_t *srv);

#endif
