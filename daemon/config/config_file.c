/* config_file.c: reading kvcached.conf, one `name = value` per line.
 *
 *   # a comment line
 *   pool_bytes = 4GiB        # a comment after whitespace
 *   socket = "/run/kv cached/kvcached.sock"
 *   allow_gids = ""          # quotes for an empty value or one with spaces
 *
 * Names are those of the option table (dashes or underscores). An option
 * may appear once. Every error names the file and line, and the option when
 * there is one: "kvcached.conf:12: pool_bytes: expected a size like 512MiB".
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"

#define FILE_MAX_BYTES (1u << 20)

/* The whole file, NUL-terminated; NULL with err on failure. */
static char *read_all(const char *path, char *err, size_t errlen) {
  FILE *f = fopen(path, "r");
  if (!f) {
    snprintf(err, errlen, "%s: cannot read: %s", path, strerror(errno));
    return NULL;
  }
  char *buf = malloc(FILE_MAX_BYTES + 1);
  size_t n = buf ? fread(buf, 1, FILE_MAX_BYTES + 1, f) : 0;
  int bad = ferror(f) ? errno : 0;
  fclose(f);
  if (!buf) {
    snprintf(err, errlen, "%s: out of memory", path);
    return NULL;
  }
  if (bad || n > FILE_MAX_BYTES) {
    snprintf(err, errlen, "%s: %s", path, bad ? strerror(bad) : "larger than 1 MiB");
    free(buf);
    return NULL;
  }
  buf[n] = '\0';
  const char *nul = memchr(buf, '\0', n);
  if (nul) {
    unsigned line = 1;
    for (const char *p = buf; p < nul; p++) line += *p == '\n';
    snprintf(err, errlen, "%s:%u: a NUL byte: not a text file", path, line);
    free(buf);
    return NULL;
  }
  return buf;
}

static char *trim(char *s) {
  while (*s == ' ' || *s == '\t') s++;
  size_t n = strlen(s);
  while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r')) s[--n] = '\0';
  return s;
}

/* Splits one line in place into name and value. Returns NULL, or the reason
 * the line is malformed (*name is then set if it was readable). */
static const char *split(char *line, char **name, char **value) {
  char *eq = strchr(line, '=');
  *name = NULL;
  if (!eq) return "expected 'name = value'";
  *eq = '\0';
  char *n = trim(line);
  if (*n == '\0') return "missing option name before '='";
  for (const char *p = n; *p; p++)
    if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '_' || *p == '-'))
      return "bad option name (letters, digits, '_' and '-' only)";
  *name = n;
  char *v = trim(eq + 1);
  if (*v == '"') {
    char *close = strchr(v + 1, '"');
    if (!close) return "unterminated quote";
    char *rest = trim(close + 1);
    if (*rest != '\0' && *rest != '#') return "text after the closing quote";
    *close = '\0';
    *value = v + 1;
    return NULL;
  }
  /* A '#' after whitespace (or first) starts a comment. */
  for (char *p = v; *p; p++)
    if (*p == '#' && (p == v || p[-1] == ' ' || p[-1] == '\t')) {
      *p = '\0';
      break;
    }
  *value = trim(v);
  if (strchr(*value, '"')) return "stray quote in the value";
  return NULL;
}

int config_file_apply(config_t *cfg, const char *path, char *err, size_t errlen) {
  char *buf = read_all(path, err, errlen);
  if (!buf) return -1;
  unsigned *set_on = calloc(config_option_count(), sizeof *set_on); /* line, 0: unset */
  int rc = -1;
  if (!set_on) {
    snprintf(err, errlen, "%s: out of memory", path);
    goto out;
  }
  unsigned lineno = 0;
  for (char *line = buf; line; ) {
    char *eol = strchr(line, '\n');
    if (eol) *eol = '\0';
    lineno++;
    char *s = trim(line);
    line = eol ? eol + 1 : NULL;
    if (*s == '\0' || *s == '#') continue;
    char *name, *value;
    const char *why = split(s, &name, &value);
    if (why) {
      if (name)
        snprintf(err, errlen, "%s:%u: %s: %s", path, lineno, name, why);
      else
        snprintf(err, errlen, "%s:%u: %s, got '%.60s'", path, lineno, why, s);
      goto out;
    }
    int idx = config_option_index(name);
    if (idx < 0) {
      snprintf(err, errlen, "%s:%u: unknown option '%s' (see kvcached --help)", path, lineno,
               name);
      goto out;
    }
    if (set_on[idx]) {
      snprintf(err, errlen, "%s:%u: %s: already set on line %u", path, lineno,
               config_option_name((size_t)idx), set_on[idx]);
      goto out;
    }
    char why_set[256];
    if (config_set(cfg, name, value, why_set, sizeof why_set) != 0) {
      snprintf(err, errlen, "%s:%u: %s", path, lineno, why_set);
      goto out;
    }
    set_on[idx] = lineno;
  }
  rc = 0;
out:
  free(set_on);
  free(buf);
  return rc;
}
