/* examples.c (integration): the worker examples that `make` builds
 * (client/examples/, doc/worker-guide.md) run against a real daemon and say
 * ok, again and again on the same daemon: under arenas every client reads
 * in place (the zero-copy lease view); a daemon with the deprecated
 * page_bytes leases to admins alone, and another uid gets the gathered
 * view. */
#include <grp.h>

#include "harness.h"

static const char *const args[] = {"--pool-bytes", "256MiB", "--page-bytes", "2MiB",
                                   "--allow-uids", "self,root,64021", "--socket-mode", "0666",
                                   NULL};

/* Runs build/examples/NAME SOCK as uid (0: as we are); its stdout in out. */
static int run_example(const daemon_t *d, const char *name, uid_t uid, char *out, size_t cap) {
  char bin[256];
  snprintf(bin, sizeof bin, "%s/examples/%s", it_build(), name);
  int p[2];
  ASSERT(pipe(p) == 0);
  fflush(NULL);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    dup2(p[1], 1);
    close(p[0]);
    if (uid && (setgroups(0, NULL) != 0 || setresgid(uid, uid, uid) != 0 ||
                setresuid(uid, uid, uid) != 0))
      _exit(90);
    execl(bin, bin, d->sock, (char *)NULL);
    _exit(91);
  }
  close(p[1]);
  FILE *f = fdopen(p[0], "r");
  ASSERT(f != NULL);
  it_read_all(f, out, cap);
  fclose(f);
  int st;
  ASSERT(waitpid(pid, &st, 0) == pid);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

TEST(examples_prefill_decode_leases_as_every_client) {
  /* Arenas: every client reads in place. The address range reserved for the
   * pool (1000 MiB) is no whole number of its 32 MiB segments: the daemon
   * rounds it up (a client reserves it in segments, and refused every lease
   * with PROTO "the pool's range is not whole segments" on a host whose
   * memory was not a multiple of 32 MiB). */
  static const char *const arenas[] = {"--pool-bytes", "256MiB", "--page-bytes", "0",
                                       "--pool-reserve-bytes", "1000MiB", "--allow-uids",
                                       "self,root,64021", "--socket-mode", "0666", NULL};
  daemon_t d;
  daemon_start_args(&d, arenas);
  ASSERT_EQ(chmod(d.dir, 0755), 0);
  char out[4096];
  ASSERT_EQ(run_example(&d, "prefill_decode", 0, out, sizeof out), 0);
  ASSERT(strstr(out, "lease view, 1 request") && strstr(out, "\nok\n"));
  ASSERT_EQ(run_example(&d, "prefill_decode", 64021, out, sizeof out), 0);
  ASSERT(strstr(out, "lease view, 1 request") && strstr(out, "\nok\n"));
  /* Its sequences are owned: gone with its connection. */
  kvc_client_t *c = client_open(&d);
  it_wait_stat(c, "sequences", 0, false);
  kvc_client_close(c);
  daemon_stop(&d);
}

TEST(examples_prefill_decode_gathers_where_leases_are_for_admins) {
  daemon_t d;
  daemon_start_args(&d, args); /* page_bytes (deprecated): leases for admins alone */
  ASSERT_EQ(chmod(d.dir, 0755), 0);
  char out[4096];
  ASSERT_EQ(run_example(&d, "prefill_decode", 0, out, sizeof out), 0);
  ASSERT(strstr(out, "lease view, 1 request") && strstr(out, "\nok\n"));
  ASSERT_EQ(run_example(&d, "prefill_decode", 64021, out, sizeof out), 0);
  ASSERT(strstr(out, "gathered view, 1 request") && strstr(out, "\nok\n"));
  daemon_stop(&d);
}

TEST(examples_prefix_pair_runs_again_on_the_same_daemon) {
  daemon_t d;
  daemon_start_args(&d, args);
  char out[4096];
  /* The first run prefills the system prompt; every later one finds it
   * cached (A puts nothing) and still shares it. */
  ASSERT_EQ(run_example(&d, "prefix_pair", 0, out, sizeof out), 0);
  ASSERT(strstr(out, "A's prompt: 0 of 64 tokens cached") &&
         strstr(out, "B's prompt: 64 of 74 tokens cached") && strstr(out, "\nok\n"));
  for (int run = 2; run <= 3; run++) {
    ASSERT_EQ(run_example(&d, "prefix_pair", 0, out, sizeof out), 0);
    if (!strstr(out, "A's prompt: 64 of 64 tokens cached") ||
        !strstr(out, "B's prompt: 64 of 74 tokens cached") || !strstr(out, "\nok\n"))
      TEST_FAIL_("run %d said:\n%s", run, out);
  }
  /* Nothing left behind: its sequences are owned. */
  kvc_client_t *c = client_open(&d);
  it_wait_stat(c, "sequences", 0, false);
  kvc_client_close(c);
  daemon_stop(&d);
}
