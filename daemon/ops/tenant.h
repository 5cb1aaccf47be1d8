/* tenant.h: who a peer is and what it may touch (doc/security.md).
 *
 * A tenant comes from the kernel's credentials of the peer and the
 * operator's `tenants` rules, never from what the client sends:
 *
 *   peer (uid, gid, groups) --tenants rules--> "fleet-a"  (first match)
 *                           --no rule-------->  "uid:1003"
 *   name --registry--> id 1, 2, ...   (0 is the namespace of shared caches)
 *
 * The engine keys caches by (tenant id, name); every request naming a cache
 * is checked against the caller's tenant in one place (dispatch.c). Parsing
 * the rules is here too, so the config reports a bad rule with its option.
 */
#ifndef KVCD_TENANT_H
#define KVCD_TENANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "kvcache/kvcache.h"

#define TENANT_SHARED 0u      /* engine tenant of the shared caches */
#define TENANT_NAME_MAX 48    /* bytes of a tenant name with its NUL */
#define TENANT_RULES_MAX 64   /* rules of `tenants`, of `shared_caches` */
#define TENANTS_MAX 4096      /* distinct tenants a daemon tracks */

/* One `tenants` rule: peers with this uid (or gid, primary or
 * supplementary) belong to tenant name. */
typedef struct tenant_rule {
  char name[TENANT_NAME_MAX];
  bool is_gid;
  uint32_t id;
} tenant_rule_t;

/* One `shared_caches` grant: tenant may read (and write) shared cache. */
typedef struct shared_rule {
  char cache[KVC_MAX_NAME + 1];
  char tenant[TENANT_NAME_MAX];
  bool write;
} shared_rule_t;

enum tenant_right { RIGHT_NONE = 0, RIGHT_READ = 1, RIGHT_WRITE = 2 };

/* Parses `tenants` ("fleet-a=uid:1001,gid:3000; fleet-b=uid:1003"; "" is
 * none) into rules[cap]; 0, or -1 with the reason in err. */
int tenant_rules_parse(const char *text, tenant_rule_t *rules, uint32_t cap, uint32_t *n,
                       char *err, size_t errlen);
/* Parses `shared_caches` ("sysprompts=fleet-a:rw,fleet-b:r; ..."). */
int shared_rules_parse(const char *text, shared_rule_t *rules, uint32_t cap, uint32_t *n,
                       char *err, size_t errlen);
/* Whether s is a tenant name a rule may use: 1-47 of [A-Za-z0-9._-], or
 * uid:N. */
bool tenant_name_valid(const char *s);

/* The tenant name of a peer: the first rule naming its uid, else its gid or
 * one of its groups; else "uid:N". */
void tenant_of_peer(const tenant_rule_t *rules, uint32_t nrules, uid_t uid, gid_t gid,
                    const gid_t *groups, size_t ngroups, char out[TENANT_NAME_MAX]);
/* What tenant (by name) may do with the shared cache `cache`. */
enum tenant_right tenant_shared_right(const shared_rule_t *rules, uint32_t nrules,
                                      const char *cache, const char *tenant);
/* Whether cache is a declared shared cache at all. */
bool tenant_is_shared(const shared_rule_t *rules, uint32_t nrules, const char *cache);

/* The registry of tenants seen: name <-> id (1..), for the daemon's life. */
typedef struct tenants {
  char (*names)[TENANT_NAME_MAX]; /* names[id - 1] */
  uint32_t n, cap;
} tenants_t;

/* The id of name, registering it; 0 when the registry is full (or out of
 * memory). */
uint32_t tenants_id(tenants_t *t, const char *name);
/* The name of id ("shared" for 0, "?" if unknown). */
const char *tenants_name(const tenants_t *t, uint32_t id);
void tenants_free(tenants_t *t);

/* Copies s into out (len bytes) with every byte that could forge or break a
 * log line (a quote, a backslash, a control or non-ASCII byte) escaped as
 * \xHH; truncates. */
void tenant_log_escape(const char *s, char *out, size_t len);

#endif
