/* testhook.c: the environment-driven audit and allocation-failure hooks. */
#include "testhook.h"

#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "log.h"

bool testhook_active;

static struct {
  bool audit;      /* KVCACHED_TEST_AUDIT */
  uint64_t period; /* KVCACHED_TEST_FAILALLOC, 0: off */
  uint64_t nreq;   /* requests seen */
  const char *gate; /* KVCACHED_TEST_OFFLOAD_GATE */
  const char *disk_gate; /* KVCACHED_TEST_DISK_GATE */
} hook;

void testhook_init(void) {
  const char *a = getenv("KVCACHED_TEST_AUDIT");
  const char *f = getenv("KVCACHED_TEST_FAILALLOC");
  hook.audit = a && *a && *a != '0';
  hook.period = f ? strtoull(f, NULL, 10) : 0;
  hook.gate = getenv("KVCACHED_TEST_OFFLOAD_GATE");
  if (hook.gate && !*hook.gate) hook.gate = NULL;
  hook.disk_gate = getenv("KVCACHED_TEST_DISK_GATE");
  if (hook.disk_gate && !*hook.disk_gate) hook.disk_gate = NULL;
  testhook_active = hook.audit || hook.period || hook.gate || hook.disk_gate;
  if (testhook_active)
    LOG_WARN("testhook", "audit=%d failalloc_period=%llu offload_gate=\"%s\" disk_gate=\"%s\" "
             "(test build behaviour)", hook.audit, (unsigned long long)hook.period,
             hook.gate ? hook.gate : "", hook.disk_gate ? hook.disk_gate : "");
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

/* Opens, writes or reads one byte, closes: the FIFOs block until the test
 * opens its end, which is the point. */
static void gate_byte(const char *dir, const char *name, bool write_it) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  int fd = open(path, write_it ? O_WRONLY | O_CLOEXEC : O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  char b = 'g';
  ssize_t k = write_it ? write(fd, &b, 1) : read(fd, &b, 1);
  (void)k;
  close(fd);
}

void testhook_offload(engine_t *eng) {
  static atomic_bool passed; /* pool threads: the first one takes the gate */
  (void)eng;
  if (!hook.gate || atomic_exchange(&passed, true)) return;
  gate_byte(hook.gate, "reached", true);
  gate_byte(hook.gate, "go", false);
}

void testhook_disk(engine_t *eng) {
  static atomic_bool passed; /* I/O threads: the first one takes the gate */
  (void)eng;
  if (!hook.disk_gate || atomic_exchange(&passed, true)) return;
  gate_byte(hook.disk_gate, "reached", true);
  gate_byte(hook.disk_gate, "go", false);
}
