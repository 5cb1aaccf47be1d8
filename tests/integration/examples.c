/* examples.c (integration): the worker examples that `make` builds
 * (client/examples/, doc/worker-guide.md) run against a real daemon and say
 * ok: as root, which maps the pool (the zero-copy lease view), and as
 * another uid, which does not (the gathered view). */
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

TEST(examples_prefill_decode_runs_both_views) {
  daemon_t d;
  daemon_start_args(&d, args);
  ASSERT_EQ(chmod(d.dir, 0755), 0);
  char out[4096];
  ASSERT_EQ(run_example(&d, "prefill_decode", 0, out, sizeof out), 0);
  ASSERT(strstr(out, "lease view, 1 request") && strstr(out, "\nok\n"));
  ASSERT_EQ(run_example(&d, "prefill_decode", 64021, out, sizeof out), 0);
  ASSERT(strstr(out, "gathered view, 1 request") && strstr(out, "\nok\n"));
  daemon_stop(&d);
}

TEST(examples_prefix_pair_shares_the_system_prompt) {
  daemon_t d;
  daemon_start_args(&d, args);
  char out[4096];
  ASSERT_EQ(run_example(&d, "prefix_pair", 0, out, sizeof out), 0);
  ASSERT(strstr(out, "64 of 74 tokens cached") && strstr(out, "\nok\n"));
  daemon_stop(&d);
}
