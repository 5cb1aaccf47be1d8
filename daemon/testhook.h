/* testhook.h: test-only checks around each request, switched on by the
 * environment, read once at start (testhook_init); off, a request pays one
 * predicted-not-taken branch on a global and no call.
 *
 *   KVCACHED_TEST_AUDIT=1       run engine_audit after every request; a
 *                               violation is logged (event=audit_failed) and
 *                               the daemon aborts, so the test sees it.
 *   KVCACHED_TEST_FAILALLOC=N   every other request fails one engine heap
 *                               allocation, the 0th, 1st, ... (N-1)th in turn
 *                               (engine_fail_alloc_after), to show that
 *                               exhaustion is an error reply, never a crash
 *                               or a leak; the requests between run clean.
 *   KVCACHED_TEST_OFFLOAD_GATE=DIR
 *                               a pool thread, before the first offloaded
 *                               copy, writes one byte to the FIFO
 *                               DIR/reached and then reads one from the FIFO
 *                               DIR/go: a test holds that copy in flight for
 *                               as long as it wants, and knows when it is
 *                               (no sleeps); later copies pass.
 *   KVCACHED_TEST_DISK_GATE=DIR the same for the disk tier's first read of
 *                               a page back (on its I/O thread): a test
 *                               holds a lookup's read in flight.
 *
 * The integration harness sets KVCACHED_TEST_AUDIT; the fuzzers call the
 * engine hooks directly and leave these unset (they never call
 * testhook_init, so the hooks stay off).
 */
#ifndef KVCD_TESTHOOK_H
#define KVCD_TESTHOOK_H

#include <stdbool.h>

#include "engine.h"

/* Either hook is on; written only by testhook_init. */
extern bool testhook_active;

/* Reads the environment (main, once, after logging is set up). */
void testhook_init(void);

/* Before the handler of a request runs. */
void testhook_before(engine_t *eng);
/* After it ran (the engine is idle again). */
void testhook_after(engine_t *eng);
/* On a pool thread, before an offloaded copy. */
void testhook_offload(engine_t *eng);
/* On a disk I/O thread, before a page is read back (eng unused). */
void testhook_disk(engine_t *eng);

#define TESTHOOK(call, eng)                                                    \
  do {                                                                         \
    if (__builtin_expect(testhook_active, 0)) testhook_##call(eng);            \
  } while (0)

#endif
