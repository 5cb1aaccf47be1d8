/* testhook.c: the environment-driven audit and allocation-failure hooks. */
#include "testhook.h"

#include <stdlib.h>

#include "log.h"

bool testhook_active;

static struct {
  bool audit;      /* KVCACHED_TEST_AUDIT */
  uint64_t period; /* KVCACHED_TEST_FAILALLOC, 0: off */
  uint64_t nreq;   /* requests seen */
} hook;

void testhook_init(void) {
  const char *a = getenv("KVCACHED_TEST_AUDIT");
  const char *f = getenv("KVCACHED_TEST_FAILALLOC");
  hook.audit = a && *a && *a != '0';
  hook.period = f ? strtoull(f, NULL, 10) : 0;
  testhook_active = hook.audit || hook.period;
  if (testhook_active)
    LOG_WARN("testhook", "audit=%d failalloc_period=%llu (test build behaviour)",
             hook.audit, (unsigned long long)hook.period);
}

void testhook_before(engine_t *eng) {
  /* Every other request runs clean, so a client that retries gets through. */
  uint64_t i = hook.nreq++;
  if (hook.period && i % 2) engine_fail_alloc_after(eng, (int64_t)(i / 2 % hook.period));
}

void testhook_after(engine_t *eng) {
  if (hook.period) engine_fail_alloc_after(eng, -1);
  if (!hook.audit) return;
  char why[256];
  if (engine_audit(eng, why, sizeof why) != 0) {
    LOG_ERROR("audit_failed", "why=\"%s\"", why);
    abort();
  }
}
