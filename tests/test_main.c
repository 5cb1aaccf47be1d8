/* test_main.c: runs the registered tests, each in a child with a timeout.
 * Prints one line per test ("PASS name", "FAIL name (why)", "SKIP name
 * (why)") for tests/run.sh. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "test.h"

#define MAX_TESTS 512

static struct {
  const char *name;
  test_fn fn;
  unsigned timeout_s;
} tests[MAX_TESTS];
static int ntests;
static const char *running; /* the test of this child process */

#define EXIT_SKIP 77 /* the child skipped; it printed the verdict itself */

void test_skip(const char *reason) {
  printf("SKIP %s (%s)\n", running ? running : "?", reason);
  fflush(NULL);
  _exit(EXIT_SKIP);
}

void test_register(const char *name, test_fn fn, unsigned timeout_s) {
  if (ntests == MAX_TESTS) {
    fprintf(stderr, "too many tests\n");
    exit(2);
  }
  tests[ntests].name = name;
  tests[ntests].fn = fn;
  tests[ntests].timeout_s = timeout_s;
  ntests++;
}

int test_long(void) {
  const char *v = getenv("KVC_LONG");
  return v && *v && strcmp(v, "0") != 0;
}

static int run_one(int i) {
  fflush(stdout);
  pid_t pid = fork();
  if (pid < 0) {
    perror("fork");
    return 1;
  }
  if (pid == 0) {
    running = tests[i].name;
    alarm(tests[i].timeout_s * (test_long() ? 10u : 1u));
    tests[i].fn();
    fflush(NULL);
    _exit(0);
  }
  int st;
  while (waitpid(pid, &st, 0) < 0) {
  }
  if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
    printf("PASS %s\n", tests[i].name);
    return 0;
  }
  if (WIFEXITED(st) && WEXITSTATUS(st) == EXIT_SKIP) return 0;
  if (WIFSIGNALED(st) && WTERMSIG(st) == SIGALRM)
    printf("FAIL %s (timed out after %us)\n", tests[i].name, tests[i].timeout_s);
  else if (WIFSIGNALED(st))
    printf("FAIL %s (signal %d)\n", tests[i].name, WTERMSIG(st));
  else
    printf("FAIL %s (exit %d)\n", tests[i].name, WEXITSTATUS(st));
  return 1;
}

int main(int argc, char **argv) {
  int failed = 0, ran = 0;
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc > 1 && strcmp(argv[1], "--list") == 0) {
    for (int i = 0; i < ntests; i++) printf("%s\n", tests[i].name);
    return 0;
  }
  for (int i = 0; i < ntests; i++) {
    if (argc > 1) {
      int want = 0;
      for (int a = 1; a < argc; a++) want |= strcmp(argv[a], tests[i].name) == 0;
      if (!want) continue;
    }
    failed += run_one(i);
    ran++;
  }
  if (argc > 1 && ran == 0) {
    fprintf(stderr, "no test named %s\n", argv[1]);
    return 2;
  }
  return failed ? 1 : 0;
}
