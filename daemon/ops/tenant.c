/* tenant.c: the tenant of a peer, the operator's tenant and shared-cache
 * rules, and the registry of tenant names (tenant.h draws the model). */
#include "tenant.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int bad(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int bad(char *err, size_t errlen, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
  return -1;
}

static bool plain_name(const char *s) {
  size_t n = strlen(s);
  if (n == 0 || n >= TENANT_NAME_MAX) return false;
  for (size_t i = 0; i < n; i++) {
    char ch = s[i];
    bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '.' || ch == '_' || ch == '-';
    if (!ok) return false;
  }
  return true;
}

/* "uid:N" or "gid:N" with N a decimal id; *id set. */
static bool id_token(const char *s, const char *kind, uint32_t *id) {
  size_t k = strlen(kind);
  if (strncmp(s, kind, k) != 0 || s[k] != ':' || !s[k + 1]) return false;
  char *end;
  unsigned long v = strtoul(s + k + 1, &end, 10);
  if (*end || v > UINT32_MAX || s[k + 1] == '-' || s[k + 1] == '+') return false;
  *id = (uint32_t)v;
  return true;
}

bool tenant_name_valid(const char *s) {
  uint32_t id;
  return plain_name(s) || id_token(s, "uid", &id);
}

/* Splits text at sep into trimmed pieces; calls fn on each non-empty one. */
static int each_piece(const char *text, char sep, int (*fn)(char *piece, void *arg), void *arg) {
  char buf[1024];
  if (strlen(text) >= sizeof buf) return -2;
  strcpy(buf, text);
  char *p = buf;
  while (p) {
    char *next = strchr(p, sep);
    if (next) *next++ = '\0';
    while (*p == ' ' || *p == '\t') p++;
    size_t n = strlen(p);
    while (n && (p[n - 1] == ' ' || p[n - 1] == '\t')) p[--n] = '\0';
    if (n) {
      int rc = fn(p, arg);
      if (rc) return rc;
    }
    p = next;
  }
  return 0;
}

typedef struct tparse {
  tenant_rule_t *rules;
  uint32_t cap, n;
  const char *name; /* of the group being read */
  char *err;
  size_t errlen;
} tparse_t;

static int tenant_member(char *tok, void *arg) {
  tparse_t *t = arg;
  tenant_rule_t r = {{0}, false, 0};
  if (id_token(tok, "uid", &r.id)) r.is_gid = false;
  else if (id_token(tok, "gid", &r.id)) r.is_gid = true;
  else return bad(t->err, t->errlen, "tenant %s: '%s' is not uid:N or gid:N", t->name, tok);
  if (t->n == t->cap) return bad(t->err, t->errlen, "more than %u members", t->cap);
  snprintf(r.name, sizeof r.name, "%s", t->name);
  t->rules[t->n++] = r;
  return 0;
}

static int tenant_group(char *grp, void *arg) {
  tparse_t *t = arg;
  char *eq = strchr(grp, '=');
  if (!eq) return bad(t->err, t->errlen, "'%s' is not NAME=uid:N,gid:N,...", grp);
  *eq = '\0';
  char *name = grp;
  size_t n = strlen(name);
  while (n && name[n - 1] == ' ') name[--n] = '\0';
  if (!plain_name(name))
    return bad(t->err, t->errlen, "tenant name '%s': 1-%d of letters, digits, '.', '_', '-'",
               name, TENANT_NAME_MAX - 1);
  t->name = name;
  uint32_t before = t->n;
  int rc = each_piece(eq + 1, ',', tenant_member, t);
  if (rc == 0 && t->n == before) return bad(t->err, t->errlen, "tenant %s has no member", name);
  return rc;
}

int tenant_rules_parse(const char *text, tenant_rule_t *rules, uint32_t cap, uint32_t *n,
                       char *err, size_t errlen) {
  tparse_t t = {rules, cap, 0, "", err, errlen};
  int rc = each_piece(text, ';', tenant_group, &t);
  if (rc == -2) return bad(err, errlen, "longer than 1023 bytes");
  if (rc) return -1;
  *n = t.n;
  return 0;
}

typedef struct sparse {
  shared_rule_t *rules;
  uint32_t cap, n;
  const char *cache;
  char *err;
  size_t errlen;
} sparse_t;

static int shared_grant(char *tok, void *arg) {
  sparse_t *s = arg;
  char *colon = strrchr(tok, ':');
  shared_rule_t r;
  memset(&r, 0, sizeof r);
  if (!colon || (strcmp(colon + 1, "r") != 0 && strcmp(colon + 1, "rw") != 0))
    return bad(s->err, s->errlen, "shared cache %s: '%s' is not TENANT:r or TENANT:rw",
               s->cache, tok);
  r.write = strcmp(colon + 1, "rw") == 0;
  *colon = '\0';
  if (!tenant_name_valid(tok))
    return bad(s->err, s->errlen, "shared cache %s: '%s' is not a tenant name", s->cache, tok);
  if (s->n == s->cap) return bad(s->err, s->errlen, "more than %u grants", s->cap);
  snprintf(r.cache, sizeof r.cache, "%s", s->cache);
  snprintf(r.tenant, sizeof r.tenant, "%s", tok);
  s->rules[s->n++] = r;
  return 0;
}

static int shared_group(char *grp, void *arg) {
  sparse_t *s = arg;
  char *eq = strchr(grp, '=');
  if (!eq) return bad(s->err, s->errlen, "'%s' is not CACHE=TENANT:r|rw,...", grp);
  *eq = '\0';
  size_t n = strlen(grp);
  while (n && grp[n - 1] == ' ') grp[--n] = '\0';
  if (n == 0 || n > KVC_MAX_NAME || strpbrk(grp, " \t"))
    return bad(s->err, s->errlen, "shared cache name '%s' is not a cache name", grp);
  s->cache = grp;
  uint32_t before = s->n;
  int rc = each_piece(eq + 1, ',', shared_grant, s);
  if (rc == 0 && s->n == before) return bad(s->err, s->errlen, "shared cache %s grants nothing", grp);
  return rc;
}

int shared_rules_parse(const char *text, shared_rule_t *rules, uint32_t cap, uint32_t *n,
                       char *err, size_t errlen) {
  sparse_t s = {rules, cap, 0, "", err, errlen};
  int rc = each_piece(text, ';', shared_group, &s);
  if (rc == -2) return bad(err, errlen, "longer than 1023 bytes");
  if (rc) return -1;
  *n = s.n;
  return 0;
}

void tenant_of_peer(const tenant_rule_t *rules, uint32_t nrules, uid_t uid, gid_t gid,
                    const gid_t *groups, size_t ngroups, char out[TENANT_NAME_MAX]) {
  for (uint32_t i = 0; i < nrules; i++) /* a uid rule wins over any group rule */
    if (!rules[i].is_gid && rules[i].id == (uint32_t)uid) {
      snprintf(out, TENANT_NAME_MAX, "%s", rules[i].name);
      return;
    }
  for (uint32_t i = 0; i < nrules; i++) {
    if (!rules[i].is_gid) continue;
    bool member = rules[i].id == (uint32_t)gid;
    for (size_t g = 0; !member && g < ngroups; g++) member = rules[i].id == (uint32_t)groups[g];
    if (member) {
      snprintf(out, TENANT_NAME_MAX, "%s", rules[i].name);
      return;
    }
  }
  snprintf(out, TENANT_NAME_MAX, "uid:%u", (unsigned)uid);
}

enum tenant_right tenant_shared_right(const shared_rule_t *rules, uint32_t nrules,
                                      const char *cache, const char *tenant) {
  enum tenant_right best = RIGHT_NONE;
  for (uint32_t i = 0; i < nrules; i++)
    if (strcmp(rules[i].cache, cache) == 0 && strcmp(rules[i].tenant, tenant) == 0) {
      enum tenant_right r = rules[i].write ? RIGHT_WRITE : RIGHT_READ;
      if (r > best) best = r;
    }
  return best;
}

bool tenant_is_shared(const shared_rule_t *rules, uint32_t nrules, const char *cache) {
  for (uint32_t i = 0; i < nrules; i++)
    if (strcmp(rules[i].cache, cache) == 0) return true;
  return false;
}

uint32_t tenants_id(tenants_t *t, const char *name) {
  for (uint32_t i = 0; i < t->n; i++)
    if (strcmp(t->names[i], name) == 0) return i + 1;
  if (t->n == TENANTS_MAX) return 0;
  if (t->n == t->cap) {
    uint32_t cap = t->cap ? t->cap * 2 : 16;
    void *p = realloc(t->names, (size_t)cap * sizeof *t->names);
    if (!p) return 0;
    t->names = p;
    t->cap = cap;
  }
  snprintf(t->names[t->n], TENANT_NAME_MAX, "%s", name);
  return ++t->n;
}

const char *tenants_name(const tenants_t *t, uint32_t id) {
  if (id == TENANT_SHARED) return "shared";
  return id <= t->n ? t->names[id - 1] : "?";
}

void tenants_free(tenants_t *t) {
  free(t->names);
  t->names = NULL;
  t->n = t->cap = 0;
}

void tenant_log_escape(const char *s, char *out, size_t len) {
  static const char hex[] = "0123456789abcdef";
  size_t o = 0;
  if (!len) return;
  for (; *s && o + 1 < len; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch >= 0x20 && ch < 0x7f && ch != '"' && ch != '\\') {
      out[o++] = (char)ch;
      continue;
    }
    if (o + 4 >= len) break;
    out[o++] = '\\';
    out[o++] = 'x';
    out[o++] = hex[ch >> 4];
    out[o++] = hex[ch & 15];
  }
  out[o] = '\0';
}
