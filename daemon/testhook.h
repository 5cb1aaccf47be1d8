/* testhook.h: test-only checks around each request, switched on by the
 * environment and off (one branch per request) otherwise.
 *
 *   KVCACHED_TEST_AUDIT=1       run engine_audit after every request; a
 *                               violation is logged (event=audit_failed) and
 *                               the daemon aborts, so the test sees it.
 *   KVCACHED_TEST_FAILALLOC=N   every other request fails one engine heap
 *                               allocation, the 0th, 1st, ... (N-1)th in turn
 *                               (engine_fail_alloc_after), to show that
 *                               exhaustion is an error reply, never a crash
 *                               or a leak; the requests between run clean.
 *
 * The integration harness sets KVCACHED_TEST_AUDIT; the fuzzers call the
 * engine hooks directly and leave these unset.
 */
#ifndef KVCD_TESTHOOK_H
#define KVCD_TESTHOOK_H

#include "engine.h"

/* Before the handler of a request runs. */
void testhook_before(engine_t *eng);
/* After it ran (the engine is idle again). */
void testhook_after(engine_t *eng);

#endif
