/* replay.c: runs a fuzz target over its checked-in inputs, without libFuzzer
 * (any compiler): tests/fuzz/corpus/<target>/ (seeds) and
 * tests/fuzz/regress/<target>/ (inputs that once found a bug). Built once per
 * target with -DFUZZ_NAME=<target>; the test is fuzz_replay_<target>.
 * KVC_FUZZ_DIR overrides tests/fuzz.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define STR2_(x) #x
#define STR_(x) STR2_(x)
#define CAT2_(a, b) a##b
#define CAT_(a, b) CAT2_(a, b)

/* Replays every file of dir; returns how many. */
static size_t replay_dir(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return 0;
  size_t n = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    FILE *f = fopen(path, "rb");
    if (!f) continue;
    static uint8_t buf[1 << 20];
    size_t len = fread(buf, 1, sizeof buf, f);
    fclose(f);
    /* A private copy of exactly len bytes, so ASan sees overreads. */
    uint8_t *copy = malloc(len ? len : 1);
    memcpy(copy, buf, len);
    fprintf(stderr, "replay %s (%zu bytes)\n", path, len);
    LLVMFuzzerTestOneInput(copy, len);
    free(copy);
    n++;
  }
  closedir(d);
  return n;
}

#define REPLAY_TEST_(name) TEST_TIMEOUT(name, 120)
REPLAY_TEST_(CAT_(fuzz_replay_, FUZZ_NAME)) {
  const char *root = getenv("KVC_FUZZ_DIR");
  if (!root || !*root) root = "tests/fuzz";
  char dir[512];
  snprintf(dir, sizeof dir, "%s/corpus/%s", root, STR_(FUZZ_NAME));
  size_t seeds = replay_dir(dir);
  snprintf(dir, sizeof dir, "%s/regress/%s", root, STR_(FUZZ_NAME));
  size_t regress = replay_dir(dir);
  fprintf(stderr, "%s: %zu seeds, %zu regression inputs\n", STR_(FUZZ_NAME), seeds, regress);
  if (seeds < 5) TEST_FAIL_("corpus %s/corpus/%s has %zu inputs", root, STR_(FUZZ_NAME), seeds);
}
