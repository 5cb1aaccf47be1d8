/* config.h: every option of kvcached, defined once in a table.
 *
 * Each row gives the option's name, type, default, bounds, whether it may
 * change at run time (a later SIGHUP reload) and its help line; --help is
 * generated from the rows. Loading fills a fresh struct from the defaults,
 * applies overrides (flags now, a config file later), validates the whole
 * struct and only then is it swapped in, so a bad value never leaves a half
 * applied configuration.
 *
 *   --name VALUE, --name=VALUE   (dashes or underscores: --pool-bytes 4GiB)
 *   sizes accept B, KiB, MiB, GiB, TiB (also K, M, G, T, KB, MB, GB: powers of two)
 */
#ifndef KVCD_CONFIG_H
#define KVCD_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#define CONFIG_MAX_IDS 32 /* entries of allow_uids / allow_gids */

typedef struct config {
  char socket_path[108];     /* Unix socket to listen on */
  uint32_t socket_mode;      /* permission bits of the socket file */
  uint64_t pool_bytes;       /* bytes of the page pool */
  uint64_t page_bytes;       /* bytes of one pool page */
  uint32_t max_caches;       /* caches the engine may hold */
  uint64_t max_seqs;         /* sequences the engine may hold, 0: unlimited */
  uint64_t shm_default_bytes;/* a connection's shared buffer when Hello asks 0 */
  uint64_t shm_max_bytes;    /* largest shared buffer a connection may get */
  uint64_t max_frame_bytes;  /* largest request frame payload */
  uint64_t max_decode_bytes; /* heap one request may take when decoded */
  uint32_t max_entries;      /* IoEntry items per put/get request */
  uint32_t max_connections;  /* concurrent clients; more get CONNLIMIT */
  uint32_t frames_per_turn;  /* requests one connection runs per loop turn */
  uint64_t write_queue_bytes;/* pending reply bytes that pause reading */
  uid_t allow_uids[CONFIG_MAX_IDS]; /* peers allowed by uid */
  uint32_t n_allow_uids;
  gid_t allow_gids[CONFIG_MAX_IDS]; /* peers allowed by primary gid */
  uint32_t n_allow_gids;
  int log_level;             /* LOG_LEVEL_* */
} config_t;

/* Fills *cfg with the defaults (the embedded configuration). */
void config_defaults(config_t *cfg);

/* Sets one option by name ("pool_bytes" or "pool-bytes") from text. Returns 0,
 * or -1 with a one-line reason in err (unknown name, bad value, out of
 * bounds). The struct is only changed on success. */
int config_set(config_t *cfg, const char *name, const char *value, char *err,
               size_t errlen);

/* Cross-option checks (page_bytes vs pool_bytes, shm bounds). 0 or -1 + err. */
int config_validate(const config_t *cfg, char *err, size_t errlen);

enum config_args_result { CONFIG_ARGS_OK = 0, CONFIG_ARGS_EXIT = 1, CONFIG_ARGS_ERROR = -1 };

/* Loads defaults + argv into *out (untouched on error). --help and --version
 * print to stdout and return CONFIG_ARGS_EXIT. */
int config_load_args(int argc, char **argv, config_t *out, char *err, size_t errlen);

/* Prints every option with its value as one `key=value` log-style list. */
void config_format(const config_t *cfg, char *buf, size_t len);

/* Prints the generated --help text. */
void config_print_help(FILE *f);

/* Parses "4GiB", "512MiB", "65536". Returns 0 or -1 (bad text, overflow). */
int config_parse_size(const char *s, uint64_t *out);

/* Whether the named option may change at run time; -1 if unknown. */
int config_is_reloadable(const char *name);

#endif
