/* config.h: every option of kvcached, defined once in a table.
 *
 * Each row gives the option's name, type, default, bounds, whether it may
 * change at run time (a SIGHUP reload) and its help line; --help, the example
 * file (systemd/kvcached.conf) and --print-config are generated from the rows.
 * A configuration is built in a fresh struct from three sources, later ones
 * winning: the defaults, the config file (config_file.c), the command-line
 * flags (config_cmdline.c). The whole struct is validated and only then
 * swapped in, so a bad value never leaves a half-applied configuration.
 *
 *   --name VALUE, --name=VALUE   (dashes or underscores: --pool-bytes 4GiB)
 *   name = value                 in the file (see config_file.c)
 *   sizes accept B, KiB, MiB, GiB, TiB (also K, M, G, T, KB, MB, GB: powers of two)
 */
#ifndef KVCD_CONFIG_H
#define KVCD_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "tenant.h"

#define CONFIG_MAX_IDS 32 /* entries of an id list (allow_uids, admin_gids, ...) */
#define CONFIG_EVENTS_TEXT 128 /* bytes of an events_* text option with its NUL */

/* A list of uids or gids. */
typedef struct id_list {
  uint32_t ids[CONFIG_MAX_IDS];
  uint32_t n;
} id_list_t;

/* The file read when no --config is given, if it exists. */
#ifndef CONFIG_DEFAULT_PATH
#define CONFIG_DEFAULT_PATH "/etc/kvcached/kvcached.conf"
#endif

typedef struct config {
  char socket_path[108];     /* Unix socket to listen on */
  uint32_t socket_mode;      /* permission bits of the socket file */
  uint64_t pool_bytes;       /* bytes of the page pool */
  uint64_t pool_reserve_bytes; /* address space for the pool to grow in; 0: MemTotal */
  bool pool_huge_pages;      /* try huge pages for the pool */
  uint64_t page_bytes;       /* deprecated (0: unset): the pool of one page size
                                it was, segment and grain of that size */
  uint64_t segment_bytes;    /* the pool's unit of ownership (0: chosen) */
  uint32_t max_caches;       /* caches the engine may hold */
  uint64_t max_seqs;         /* sequences the engine may hold, 0: unlimited */
  uint64_t shm_default_bytes;/* a connection's shared buffer when Hello asks 0 */
  uint64_t shm_max_bytes;    /* largest shared buffer a connection may get */
  uint64_t max_frame_bytes;  /* largest request frame payload */
  uint64_t max_decode_bytes; /* heap one request may take when decoded */
  uint32_t max_entries;      /* IoEntry items per put/get request */
  uint32_t max_connections;  /* concurrent clients; more get CONNLIMIT */
  uint32_t frames_per_turn;  /* requests one connection runs per loop turn */
  uint64_t turn_bytes;       /* bytes one connection moves per loop turn */
  uint32_t turn_us;          /* us one connection runs per loop turn; 0: unbounded */
  uint64_t write_queue_bytes;/* pending reply bytes that pause reading */
  uint32_t background_quiet_us; /* a client behind on its replies waits while readers
                              made a request within it (conn.c); 0: never waits */
  uint32_t frame_timeout_ms; /* a started frame must be whole within it; 0: none */
  uint64_t offload_bytes;    /* gets and puts this large copy on a copy thread; 0: never */
  uint32_t offload_threads;  /* copy threads; 0: the CPUs the daemon may use */
  uint32_t offload_quiet_us; /* threads only if a small request came within this long */
  bool rings;                /* grant shared-memory rings to clients that ask */
  uint32_t ring_poll_us;     /* cap of the poll after a ring reply; 0: never poll */
  id_list_t allow_uids;      /* peers allowed by uid */
  id_list_t allow_gids;      /* peers allowed by primary or supplementary gid */
  id_list_t admin_uids;      /* admins by uid (root always is one) */
  id_list_t admin_gids;      /* admins by gid, primary or supplementary */
  char floors_text[1024];    /* `tenant_floors` as given; parsed into floors */
  struct { char tenant[TENANT_NAME_MAX]; uint32_t pct; } floors[TENANT_RULES_MAX];
  uint32_t n_floors;
  char tenants_text[1024];   /* `tenants` as given; parsed into tenant_rules */
  tenant_rule_t tenant_rules[TENANT_RULES_MAX];
  uint32_t n_tenant_rules;
  char shared_text[1024];    /* `shared_caches` as given; parsed into shared_rules */
  shared_rule_t shared_rules[TENANT_RULES_MAX];
  uint32_t n_shared_rules;
  char zero_copy_tenant[TENANT_NAME_MAX]; /* the one tenant of a single-tenant node */
  uint32_t drain_timeout_ms; /* longest graceful shutdown before closing clients */
  uint32_t status_interval_ms; /* period of STATUS= and of the eviction summary */
  int log_level;             /* LOG_LEVEL_* */
  uint32_t prefix_hash;      /* kvc_hash_t of the prefix index */
  bool prefix_single_tenant; /* the node declares one trusted tenant (allows xxh3) */
  uint32_t pin_limit_pct;    /* pinned pages at most this % of the pool */
  char metrics_listen[64];   /* HOST:PORT of the GET /metrics endpoint; "": off */
  /* Quotas (doc/security.md, quotas); 0 means unlimited where allowed. */
  uint32_t tenant_max_pages_pct;  /* pool pages one tenant may hold, % of the pool */
  uint32_t tenant_max_pinned_pct; /* pages one tenant may pin plus lease, % of the pool */
  uint64_t tenant_max_seqs;       /* sequences of one tenant, empty ones included */
  uint32_t tenant_max_caches;     /* caches of one tenant */
  uint32_t tenant_max_keys;       /* interned salt and extra keys of one tenant */
  uint32_t max_connections_per_uid; /* concurrent clients of one uid (admins exempt) */
  uint32_t idle_timeout_ms;       /* a connection silent this long is closed; 0: never */
  uint64_t shm_bytes_per_uid;     /* shared-buffer bytes the connections of one uid hold */
  uint64_t shm_bytes_total;       /* shared-buffer bytes all connections hold */
  /* The disk tier (doc/tiers.md). */
  char disk_dir[256];        /* directory of the disk tier; "": no disk tier */
  uint64_t disk_bytes;       /* bytes of page files the tier keeps at most */
  uint32_t tier_lookup_timeout_ms; /* the longest a request waits on one tier's lookup */
  /* The KV event stream (doc/events.md); off while events_endpoint is "". */
  char events_endpoint[CONFIG_EVENTS_TEXT];        /* ZeroMQ PUB endpoint */
  char events_replay_endpoint[CONFIG_EVENTS_TEXT]; /* ZeroMQ ROUTER endpoint; "": none */
  char events_topic[CONFIG_EVENTS_TEXT];           /* the first frame of every message */
  char events_tenant[TENANT_NAME_MAX];  /* whose caches the stream shows; "*": all */
  char events_cache[CONFIG_EVENTS_TEXT];  /* only caches of this name; "": all */
  uint32_t events_buffer;         /* batches kept for replay */
  uint32_t events_hwm;            /* ZeroMQ send high-water mark, messages a subscriber */
  bool events_token_ids;          /* stored events carry their token ids */
  uint32_t events_format;         /* EVENTS_FORMAT_*: tagged arrays or tagged maps */
  uint32_t events_hash;           /* EVENTS_HASH_*: which block hash is published */
  bool events_hash_int;           /* as a 64-bit int instead of bytes */
  char events_hash_seed[CONFIG_EVENTS_TEXT]; /* vllm hashes: PYTHONHASHSEED's value */
  uint64_t events_log_bytes;      /* the engine's event log between loop turns */
  /* The cluster tier (doc/cluster.md); off while cluster_nodes is empty. */
  char cluster_nodes[1024];       /* seed nodes, "host:port,host:port" */
  uint32_t cluster_write;         /* CLUSTER_WRITE_*: when pages are written */
  char cluster_auth_file[256];    /* "user password" or "password"; "": no AUTH */
  char cluster_secret_file[256];  /* the values' MAC secret; "": checksums only */
  bool cluster_tls;               /* refused: hiredis 0.14 has no TLS */
  bool cluster_read_replicas;     /* lookups read from replicas */
  uint32_t cluster_lookup_timeout_ms; /* the longest a request waits for the cluster */
  uint32_t cluster_lookup_max_pages;  /* pages one request looks up */
  uint64_t cluster_lookup_bytes;      /* value bytes all lookups may hold at once */
  uint32_t cluster_connect_timeout_ms;
  uint32_t cluster_command_timeout_ms; /* a node silent this long is dropped */
  uint32_t cluster_refresh_ms;    /* the slot map is read again this often */
  uint32_t cluster_breaker_failures; /* failures in a row that open a node's breaker */
  uint32_t cluster_breaker_ms;    /* its first open period */
  uint32_t cluster_queue_pages;   /* pages the write-behind queue holds */
  uint64_t cluster_inflight_bytes;/* value bytes being written at once */
  uint32_t cluster_retries;       /* tries again of a failed write */
  uint32_t cluster_backoff_ms;    /* before the first, doubling */
  uint32_t cluster_ttl_s;         /* values expire after this; 0: never */
} config_t;

enum { EVENTS_FORMAT_ARRAY = 0, EVENTS_FORMAT_MAP = 1 };
enum { EVENTS_HASH_CHAIN = 0, EVENTS_HASH_VLLM = 1 };

enum cluster_write { CLUSTER_WRITE_INDEXED = 0, CLUSTER_WRITE_EVICTED = 1, CLUSTER_WRITE_OFF = 2 };

/* ---- the option table (config.c) ----------------------------------------- */

/* Fills *cfg with the defaults (the embedded configuration). */
void config_defaults(config_t *cfg);

/* Sets one option by name ("pool_bytes" or "pool-bytes") from text. Returns 0,
 * or -1 with a one-line reason naming the option in err (unknown name, bad
 * value, out of bounds). The struct is only changed on success. */
int config_set(config_t *cfg, const char *name, const char *value, char *err,
               size_t errlen);

/* The pool's segment bytes (the largest cache page) and grain (the
 * smallest page stride) in force: page_bytes, if set, makes both its
 * size (the pool of one page size it was); else segment_bytes, or 32 MiB
 * (at most a quarter of the pool, at least 2 MiB), and a 4 KiB grain. */
uint64_t config_segment_bytes(const config_t *cfg);
uint64_t config_grain_bytes(const config_t *cfg);
/* Cross-option checks (page_bytes vs pool_bytes, shm bounds, xxh3 only for a
 * single tenant). 0 or -1 + err. */
int config_validate(const config_t *cfg, char *err, size_t errlen);

/* Number of options, and the index of a name ("pool-bytes" too), -1 if none. */
size_t config_option_count(void);
int config_option_index(const char *name);
/* The canonical name of option i ("pool_bytes"). */
const char *config_option_name(size_t i);

/* The value of option i as --print-config writes it. */
void config_value(const config_t *cfg, size_t i, char *buf, size_t len);

/* Formats every option as one `key=value ...` log list into buf. */
void config_format(const config_t *cfg, char *buf, size_t len);

/* Writes cfg as a config file (`key = value` lines) that reads back as the
 * same values: --print-config. */
void config_print(const config_t *cfg, FILE *f);

/* Writes the commented example file: every option with its help, bounds and
 * default, commented out (systemd/kvcached.conf is this output). */
void config_print_example(FILE *f);

/* Writes the option part of --help. */
void config_print_options_help(FILE *f);

/* Splits "127.0.0.1:9464", "[::1]:9464" or ":9464" (loopback) into host and
 * port. 0 or -1. */
int config_parse_listen(const char *s, char *host, size_t hostlen, unsigned *port);

/* Checks "host:port,host:port" (n: how many, may be NULL): 0 or -1. */
int config_parse_nodes(const char *s, size_t *n);

/* Parses "4GiB", "512MiB", "65536". Returns 0 or -1 (bad text, overflow). */
int config_parse_size(const char *s, uint64_t *out);

/* A reload: out = cur with every reloadable option that differs taken from
 * fresh. A non-reloadable option that differs keeps cur's value and is logged
 * (it needs a restart). Returns the number of options changed, or -1 with err
 * when the merged configuration does not validate (out untouched). */
int config_reload_merge(const config_t *cur, const config_t *fresh, config_t *out,
                        char *err, size_t errlen);

/* ---- the file (config_file.c) ---------------------------------------------- */

/* Applies the `key = value` lines of the file at path onto *cfg. Returns 0,
 * or -1 with "PATH:LINE: option: reason" (or "PATH: reason" when the file
 * cannot be read) in err; *cfg is then unspecified (load into a copy). */
int config_file_apply(config_t *cfg, const char *path, char *err, size_t errlen);

/* ---- the command line (config_cmdline.c) ------------------------------------ */

#define CONFIG_MAX_FLAGS 128

enum config_action {
  CONFIG_RUN = 0,       /* start the daemon */
  CONFIG_HELP,          /* --help */
  CONFIG_VERSION,       /* --version */
  CONFIG_PRINT,         /* --print-config: the effective configuration */
  CONFIG_CHECK,         /* --check-config: validate and exit */
  CONFIG_EXAMPLE,       /* --example-config: the commented example file */
};

typedef struct config_cmdline {
  enum config_action action;
  char config_path[4096];    /* --config PATH, or "" for the default */
  bool config_given;         /* --config was on the command line */
  struct {
    char name[64];           /* as given, without the dashes */
    const char *value;       /* borrows argv */
  } flags[CONFIG_MAX_FLAGS]; /* option flags, in order */
  int nflags;
} config_cmdline_t;

/* Splits argv into the action, --config and the option flags (values are not
 * parsed yet; argv must outlive *out). Returns 0 or -1 with err. */
int config_cmdline_parse(int argc, char **argv, config_cmdline_t *out, char *err,
                         size_t errlen);

/* Builds a configuration: defaults, then the config file (--config PATH must
 * exist; without it CONFIG_DEFAULT_PATH is read if it exists), then the
 * flags; validates. On 0, *out is the result and used_path the file read (""
 * if none). On -1, err says why (file:line and option for a bad line) and
 * *out is untouched. */
int config_load(const config_cmdline_t *cmd, config_t *out, char *used_path,
                size_t used_len, char *err, size_t errlen);

/* The whole --help text. */
void config_print_help(FILE *f);

#endif
