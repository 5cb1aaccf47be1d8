/* install.c: `make install DESTDIR=...` lays out the binaries, the library
 * with its soname links, the headers, kvcache.pc, the units, the sysusers
 * file, the config and the man pages; a client built with `pkg-config
 * --cflags --libs kvcache` against that tree talks to the installed daemon. */
#include "harness.h"

static const char client_src[] =
    "#include <stdio.h>\n"
    "#include <string.h>\n"
    "#include <kvcache/kvcache.h>\n"
    "int main(int argc, char **argv) {\n"
    "  if (argc != 2) return 2;\n"
    "  kvc_client_opts_t o = {.socket_path = argv[1], .shm_bytes = 1 << 20, .timeout_ms = 10000};\n"
    "  kvc_client_t *c;\n"
    "  int rc = kvc_client_open(&o, &c);\n"
    "  if (rc) { fprintf(stderr, \"open: %s\\n\", kvc_err_name(rc)); return 1; }\n"
    "  kvc_layout_t l = {.num_layers = 1, .num_kv_heads = 1, .head_dim_k = 4, .head_dim_v = 4,\n"
    "                    .dtype = KVC_DTYPE_F32, .page_tokens = 16};\n"
    "  kvc_cache_t *cache;\n"
    "  float k[8] = {1, 2, 3, 4, 5, 6, 7, 8}, v[8] = {-1, -2, -3, -4, -5, -6, -7, -8};\n"
    "  float k2[8], v2[8];\n"
    "  if ((rc = kvc_cache_open(c, \"installed\", &l, &cache)) ||\n"
    "      (rc = kvc_put(cache, 1, 0, 2, k, v)) || (rc = kvc_get(cache, 1, 0, 2, k2, v2))) {\n"
    "    fprintf(stderr, \"%s: %s\\n\", kvc_err_name(rc), kvc_client_last_error(c));\n"
    "    return 1;\n"
    "  }\n"
    "  if (memcmp(k, k2, sizeof k) || memcmp(v, v2, sizeof v)) return 3;\n"
    "  printf(\"put/get ok %s\\n\", KVC_VERSION_STRING);\n"
    "  kvc_client_close(c);\n"
    "  return 0;\n"
    "}\n";

static bool have_tool(const char *tool) {
  char out[256];
  return it_sh(out, sizeof out, "command -v %s", tool) == 0;
}

TEST_TIMEOUT(install_destdir_then_a_pkg_config_client_runs_put_get, 120) {
  if (!have_tool("pkg-config")) TEST_SKIP("pkg-config not installed (make deps)");
  static char out[16384];
  char dir[64], dest[96], src[128], exe[128], pc[512];
  snprintf(dir, sizeof dir, "/tmp/kvcit-XXXXXX");
  ASSERT(mkdtemp(dir) != NULL);
  snprintf(dest, sizeof dest, "%s/root", dir);
  bool asan = strstr(it_build(), "asan") != NULL, tsan = strstr(it_build(), "tsan") != NULL;
  int rc = it_sh(out, sizeof out,
                 "env -u MAKEFLAGS -u MAKELEVEL -u MFLAGS make -s -C '%s' install B='%s' %s "
                 "DESTDIR='%s' PREFIX=/usr",
                 it_srcdir(), it_build(), asan ? "SANITIZE=1" : tsan ? "SANITIZE=thread" : "",
                 dest);
  if (rc != 0) TEST_FAIL_("make install: %s", out);
  /* make valgrind: the build's kvcached is tests/valgrind.sh, which runs the
   * kvcached.real beside it; put that beside the installed one too. */
  bool vg = getenv("KVC_VALGRIND") != NULL;
  if (vg)
    ASSERT_EQ(it_sh(out, sizeof out, "cp %s/kvcached.real %s/usr/bin/", it_build(), dest), 0);

  /* The tree. */
  static const char *const files[] = {
      "usr/bin/kvcached", "usr/bin/kvcachectl", "usr/lib/libkvcache.so.1.0.0",
      "usr/lib/libkvcache.a", "usr/include/kvcache/kvcache.h", "usr/include/kvcache/errors.h",
      "usr/include/kvcache/types.h", "usr/lib/pkgconfig/kvcache.pc",
      "usr/lib/systemd/system/kvcached.service", "usr/lib/systemd/system/kvcached.socket",
      "usr/lib/sysusers.d/kvcached.conf", "etc/kvcached/kvcached.conf",
      "usr/share/doc/kvcached/kvcached.conf.example", "usr/share/man/man8/kvcached.8",
      "usr/share/doc/kvcached/kvcached-alerts.yml", "usr/share/doc/kvcached/kvcached-dashboard.json",
      "usr/share/man/man1/kvcachectl.1"};
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dest, files[i]);
    if (access(path, R_OK) != 0) TEST_FAIL_("not installed: %s", files[i]);
  }
  char link[256], target[64];
  snprintf(link, sizeof link, "%s/usr/lib/libkvcache.so", dest);
  ssize_t n = readlink(link, target, sizeof target - 1);
  ASSERT(n > 0);
  target[n] = '\0';
  ASSERT_STR_EQ(target, "libkvcache.so.1");
  snprintf(link, sizeof link, "%s/usr/lib/libkvcache.so.1", dest);
  n = readlink(link, target, sizeof target - 1);
  ASSERT(n > 0);
  target[n] = '\0';
  ASSERT_STR_EQ(target, "libkvcache.so.1.0.0");
  ASSERT_EQ(it_sh(out, sizeof out, "readelf -d %s/usr/lib/libkvcache.so.1.0.0 | grep SONAME", dest), 0);
  ASSERT(strstr(out, "[libkvcache.so.1]") != NULL);
  ASSERT_EQ(it_sh(out, sizeof out, "cat %s/usr/lib/pkgconfig/kvcache.pc", dest), 0);
  ASSERT(strstr(out, "prefix=/usr\n") && strstr(out, "Version: " KVC_VERSION_STRING "\n"));
  ASSERT_EQ(it_sh(out, sizeof out, "grep -x 'ExecStart=/usr/bin/kvcached' "
                                   "%s/usr/lib/systemd/system/kvcached.service", dest), 0);
  ASSERT_EQ(it_sh(out, sizeof out, "cmp %s/systemd/kvcached.conf %s/etc/kvcached/kvcached.conf",
                  it_srcdir(), dest), 0);
  ASSERT_EQ(it_sh(out, sizeof out, "%s/usr/bin/kvcached --version", dest), 0);

  /* A client built with pkg-config against the tree (sysroot = DESTDIR). */
  snprintf(src, sizeof src, "%s/client.c", dir);
  snprintf(exe, sizeof exe, "%s/client", dir);
  it_write_file(src, client_src);
  snprintf(pc, sizeof pc, "PKG_CONFIG_SYSROOT_DIR='%s' PKG_CONFIG_PATH='%s/usr/lib/pkgconfig'",
           dest, dest);
  ASSERT_EQ(it_sh(out, sizeof out, "%s pkg-config --cflags --libs kvcache", pc), 0);
  char want[160];
  snprintf(want, sizeof want, "-I%s/usr/include", dest);
  ASSERT(strstr(out, want) != NULL);
  snprintf(want, sizeof want, "-L%s/usr/lib -lkvcache", dest);
  ASSERT(strstr(out, want) != NULL);
  rc = it_sh(out, sizeof out, "cc -std=c11 -Wall -Wextra -Werror %s -o %s %s $(%s pkg-config --cflags --libs kvcache)",
             /* Built as the library was: a ThreadSanitizer library (its
              * prefault thread) needs its runtime set up by the program. */
             asan ? "-fsanitize=address,undefined" : tsan ? "-fsanitize=thread" : "", exe, src,
             pc);
  if (rc != 0) TEST_FAIL_("building the client: %s", out);
  ASSERT_EQ(it_sh(out, sizeof out, "LD_LIBRARY_PATH=%s/usr/lib ldd %s | grep libkvcache", dest, exe), 0);
  snprintf(want, sizeof want, "%s/usr/lib/libkvcache.so.1", dest);
  ASSERT(strstr(out, want) != NULL);

  /* ...talks to the installed daemon. */
  char daemon_bin[160];
  snprintf(daemon_bin, sizeof daemon_bin, "%s/usr/bin/kvcached", dest);
  daemon_t d;
  daemon_start_full(&d, daemon_bin, NULL, NULL);
  rc = it_sh(out, sizeof out, "LD_LIBRARY_PATH=%s/usr/lib %s %s", dest, exe, d.sock);
  if (rc != 0) TEST_FAIL_("installed client: exit %d: %s", rc, out);
  ASSERT(strstr(out, "put/get ok " KVC_VERSION_STRING) != NULL);
  ASSERT_EQ(it_sh(out, sizeof out, "%s/usr/bin/kvcachectl --socket %s caches", dest, d.sock), 0);
  ASSERT(strstr(out, "installed") != NULL);
  daemon_stop(&d);

  /* uninstall takes everything back but the config, which may hold edits. */
  if (vg) ASSERT_EQ(it_sh(out, sizeof out, "rm %s/usr/bin/kvcached.real", dest), 0);
  rc = it_sh(out, sizeof out,
             "env -u MAKEFLAGS -u MAKELEVEL -u MFLAGS make -s -C '%s' uninstall B='%s' "
             "DESTDIR='%s' PREFIX=/usr && find %s -type f -o -type l",
             it_srcdir(), it_build(), dest, dest);
  ASSERT_EQ(rc, 0);
  snprintf(want, sizeof want, "%s/etc/kvcached/kvcached.conf\n", dest);
  ASSERT_STR_EQ(out, want);
  ASSERT_EQ(it_sh(out, sizeof out, "rm -rf '%s'", dir), 0);
}
