/* kvcachectl.c: the operator's command line for kvcached, built only on the
 * public client API. Each command parses its own options (getopt_long) and
 * refuses the ones it does not take with its usage, as redis-cli and
 * memcached's tools do; kvcachectl help COMMAND prints one command's usage.
 *
 *   kvcachectl [--socket PATH] COMMAND [OPTIONS] [ARGS]
 *
 * Reads: ping, stats, caches, seqs, info, prefix, top, events; for admins:
 * clients, config; admin writes: drop, remove, unpin, disconnect. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "kvcache/kvcache.h"

/* ---- commands and their usage ------------------------------------------------ */

typedef struct opts {
  const char *socket, *cache;
  bool json, prometheus, raw;
  unsigned top;        /* stats: caches to show; prefix: chain heads to show */
  double interval;     /* top: seconds between frames */
  long count;          /* top: frames to draw (0: until q) */
  int npos;
  char **pos;
} opts_t;

typedef int (*cmd_fn)(kvc_client_t *c, const opts_t *o);

/* Per-command option bits. */
enum { O_JSON = 1, O_PROM = 2, O_RAW = 4, O_CACHE = 8, O_TOP = 16, O_INTERVAL = 32, O_COUNT = 64 };

static int cmd_ping(kvc_client_t *c, const opts_t *o);
static int cmd_stats(kvc_client_t *c, const opts_t *o);
static int cmd_caches(kvc_client_t *c, const opts_t *o);
static int cmd_seqs(kvc_client_t *c, const opts_t *o);
static int cmd_info(kvc_client_t *c, const opts_t *o);
static int cmd_prefix(kvc_client_t *c, const opts_t *o);
static int cmd_top(kvc_client_t *c, const opts_t *o);
static int cmd_clients(kvc_client_t *c, const opts_t *o);
static int cmd_tenants(kvc_client_t *c, const opts_t *o);
static int cmd_config(kvc_client_t *c, const opts_t *o);
static int cmd_drop(kvc_client_t *c, const opts_t *o);
static int cmd_remove(kvc_client_t *c, const opts_t *o);
static int cmd_unpin(kvc_client_t *c, const opts_t *o);
static int cmd_disconnect(kvc_client_t *c, const opts_t *o);
static int cmd_tier(kvc_client_t *c, const opts_t *o);
static int cmd_pool(kvc_client_t *c, const opts_t *o);
static int cmd_events(kvc_client_t *c, const opts_t *o);

static const struct command {
  const char *name;
  cmd_fn fn;
  unsigned opts;       /* O_* it accepts */
  int min_pos, max_pos;
  const char *args;    /* synopsis after the name */
  const char *summary; /* kvcachectl help: a whole phrase, wrapped there */
  const char *help;    /* help COMMAND: the whole story */
} commands[] = {
    {"ping", cmd_ping, 0, 0, 0, "",
     "one round trip: the daemon's version and the time it took",
     "one round trip: the daemon's version and the time it took"},
    {"stats", cmd_stats, O_JSON | O_PROM | O_RAW | O_CACHE | O_TOP, 0, 0,
     "[--json | --prometheus | --raw] [--top N | --cache NAME]",
     "the node's figures, in sections with human units and rates, and the caches "
     "holding the most pages; --raw, --json or --prometheus for programs",
     "the node's figures: in sections with human units and rates (per second,\n"
     "averaged since the daemon started); then the caches you may see holding the\n"
     "most pages, most first: 10, or N with --top N (1..1000); --cache NAME: the\n"
     "figures of that cache only (an admin's: of that name in every tenant). --raw\n"
     "one `name{labels} value` line each, exact; --json with each figure's kind,\n"
     "unit and help; --prometheus the text format of a scrape (node_exporter's\n"
     "textfile collector; the daemon's metrics_listen endpoint has every cache).\n"
     "A figure has one name in every form but the Prometheus text, which puts\n"
     "kvcached_ before it (doc/stats.md)"},
    {"caches", cmd_caches, O_JSON, 0, 0, "[--json]",
     "the caches, their layouts and sizes", "the caches, their layouts and sizes"},
    {"seqs", cmd_seqs, O_JSON | O_CACHE, 0, 0, "[--cache NAME] [--json]",
     "the sequences of one cache or of all",
     "the sequences of one cache or of all; IDLE is the time since last use"},
    {"info", cmd_info, O_JSON, 2, 2, "[--json] CACHE SEQ",
     "one sequence", "one sequence"},
    {"prefix", cmd_prefix, O_JSON | O_CACHE | O_TOP, 0, 0, "[--cache NAME] [--json] [--top N]",
     "the prefix cache: hit rate, pages indexed and cached, the chain heads with most hits",
     "the prefix cache of one cache or of all: tokens queried, hit and ineligible,\n"
     "hit rate, pages indexed and cached, and the N (10) chain heads with most hits"},
    {"top", cmd_top, O_INTERVAL | O_COUNT, 0, 0, "[--interval SECONDS] [--count N]",
     "a live view of request rates, hit rate, free pages and the busiest caches (q quits)",
     "a live view refreshing in place: request rates, hit rate, free pages,\n"
     "evictions per second, the busiest operations, caches (among the 100 holding\n"
     "the most pages) and clients (clients for admins). q or Ctrl-C quits. Not a\n"
     "terminal: one frame, then exit"},
    {"tier", cmd_tier, O_JSON, 0, 0, "[--json]",
     "the tiers below memory (disk, cluster): lookups, hits and errors of each",
     "every tier below memory the same way, in the chain's order: the disk\n"
     "(doc/tiers.md), the cluster (doc/cluster.md): whether it is up (the\n"
     "cluster: whether its map is whole, each node's role, state and slots),\n"
     "lookups and hits, bytes, the write queue, errors by kind and values\n"
     "discarded by reason"},
    {"tenants", cmd_tenants, O_JSON, 0, 0, "[--json]",
     "connected clients and what the caches of each tenant hold",
     "connected clients and what the caches of each tenant hold (an admin sees every\n"
     "tenant, others their own)"},
    {"clients", cmd_clients, O_JSON, 0, 0, "[--json]",
     "every connection, like Redis CLIENT LIST (admins only)",
     "every connection (admins only), like Redis CLIENT LIST: id, pid, uid,\n"
     "tenant, name, pins, leases, buffer, requests, age and idle time"},
    {"config", cmd_config, O_JSON, 0, 0, "[--json]",
     "the running configuration, as kvcached --print-config (admins only)",
     "the running daemon's configuration (admins only), as kvcached --print-config;\n"
     "--json gives numbers (sizes in bytes), booleans and id lists as such"},
    {"drop", cmd_drop, 0, 1, 1, "CACHE",
     "drop a cache with every sequence (admins only)",
     "drop a cache with every sequence (admins only)"},
    {"remove", cmd_remove, 0, 2, 2, "CACHE SEQ",
     "drop one sequence, pinned or not (admins only)",
     "drop one sequence, pinned or not (admins only)"},
    {"unpin", cmd_unpin, 0, 2, 2, "CACHE SEQ",
     "release every pin of a sequence, whoever holds it (admins only)",
     "release every pin of a sequence, whoever holds it (admins only)"},
    {"disconnect", cmd_disconnect, 0, 1, 1, "CONN_ID",
     "close a client's connection; its pins and leases go with it (admins only)",
     "close a client's connection; its pins and leases go with it (admins only)"},
    {"pool", cmd_pool, O_JSON, 0, 2, "[resize SIZE]",
     "the pool's segments and arenas; with resize SIZE, resize it online (admins only)",
     "the pool's segments and arenas (tenant, page size: segments, pages used and\n"
     "free, padding; doc/design.md), or with resize SIZE resize it online (admins\n"
     "only; doc/tiers.md): a grow adds segments, a shrink releases whole segments\n"
     "from the end, evicting and moving what lives there, and is refused when\n"
     "pinned data would be lost. SIZE like 8GiB"},
    {"events", cmd_events, O_CACHE | O_COUNT | O_RAW, 0, 0, "[--cache NAME] [--count N] [--raw]",
     "follow the changes of the prefix indexes as they happen",
     "follow the changes of the prefix indexes as they happen, one line each:\n"
     "pages stored and removed, caches cleared and dropped (your tenant's caches;\n"
     "an admin's: every tenant's), until Ctrl-C or N events; --raw: whole hashes\n"
     "and the token ids"},
};
#define NCOMMANDS (sizeof commands / sizeof commands[0])

static const char *prog = "kvcachectl";

static void command_usage(FILE *f, const struct command *cmd, bool long_help) {
  fprintf(f, "usage: kvcachectl [--socket PATH] %s%s%s\n", cmd->name, cmd->args[0] ? " " : "",
          cmd->args);
  if (long_help) fprintf(f, "\n%s.\n", cmd->help);
}

/* A command's summary from column 33 on, in lines of at most 79 columns. */
static void print_summary(FILE *f, const char *p) {
  enum { WIDTH = 79 - 33 };
  while (*p) {
    size_t take = strlen(p);
    if (take > WIDTH) {
      take = WIDTH;
      while (take > 0 && p[take] != ' ') take--;
    }
    fprintf(f, "%.*s\n", (int)take, p);
    p += take;
    while (*p == ' ') p++;
    if (*p) fprintf(f, "%33s", "");
  }
}

static void usage(FILE *f) {
  fputs("usage: kvcachectl [--socket PATH] COMMAND [OPTIONS] [ARGS]\n"
        "       kvcachectl help [COMMAND] | --help | --version\n\ncommands:\n", f);
  for (size_t i = 0; i < NCOMMANDS; i++) {
    char syn[96];
    snprintf(syn, sizeof syn, "%s %s", commands[i].name, commands[i].args);
    if (strlen(syn) > 30) fprintf(f, "  %s\n  %-30s ", syn, "");
    else fprintf(f, "  %-30s ", syn);
    print_summary(f, commands[i].summary);
  }
  fputs("\noptions:\n"
        "  --socket PATH    the daemon's socket, before or after COMMAND. Default, as\n"
        "                   kvcached's: $KVCACHED_SOCKET if set; else as root\n"
        "                   /run/kvcached/kvcached.sock; else the first where a\n"
        "                   daemon answers of $XDG_RUNTIME_DIR/kvcached.sock,\n"
        "                   /tmp/kvcached-UID/kvcached.sock (kvcached's when\n"
        "                   XDG_RUNTIME_DIR is unset) and /run/kvcached/kvcached.sock\n"
        "  --help, -h       this text (help COMMAND: one command's)\n"
        "  --version, -V    kvcachectl's version\n"
        "\nExit status: 0 on success, 1 when the daemon refuses or cannot be reached,\n"
        "2 for a bad command line (with the command's usage).\n", f);
}

static int die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "%s: ", prog);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  return 1;
}

static int bad_usage(const struct command *cmd, const char *fmt, const char *what) {
  fprintf(stderr, "%s: ", prog);
  fprintf(stderr, fmt, what);
  fputc('\n', stderr);
  if (cmd) command_usage(stderr, cmd, false);
  else fputs("usage: kvcachectl [--socket PATH] COMMAND [OPTIONS] [ARGS] (see --help)\n", stderr);
  return 2;
}

/* "kvcachectl: what: why (NAME)"; what once, when the daemon's why already
 * starts with it ("clients: for admins only ..."). */
static int fail(kvc_client_t *c, int rc, const char *what) {
  const char *msg = c ? kvc_client_last_error(c) : kvc_client_open_error();
  if (!msg || !*msg) msg = kvc_strerror(rc);
  size_t wl = strlen(what);
  bool said = strncmp(msg, what, wl) == 0 && msg[wl] == ':';
  fprintf(stderr, "%s: %s%s%s (%s)\n", prog, said ? "" : what, said ? "" : ": ", msg,
          kvc_err_name(rc));
  return 1;
}

static bool parse_u64(const char *s, uint64_t *out) {
  if (!s || *s < '0' || *s > '9') return false;
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || *end) return false;
  *out = v;
  return true;
}

static const struct command *find_command(const char *name);

/* A positional argument that is not a number: the command's usage, exit 2. */
static int bad_number(const char *cmd, const char *what, const char *got) {
  fprintf(stderr, "%s: %s: %s must be a number, got '%s'\n", prog, cmd, what, got);
  command_usage(stderr, find_command(cmd), false);
  return 2;
}

/* The command's options; 0, or 2 after printing why and its usage. */
static int parse_command(const struct command *cmd, int argc, char **argv, opts_t *o) {
  static const struct option all[] = {
      {"json", no_argument, NULL, 'j'},         {"prometheus", no_argument, NULL, 'p'},
      {"raw", no_argument, NULL, 'r'},          {"cache", required_argument, NULL, 'c'},
      {"top", required_argument, NULL, 't'},    {"interval", required_argument, NULL, 'i'},
      {"count", required_argument, NULL, 'n'},  {"socket", required_argument, NULL, 's'},
      {"help", no_argument, NULL, 'h'},         {0, 0, 0, 0},
  };
  static const struct { int ch; unsigned bit; } bits[] = {
      {'j', O_JSON}, {'p', O_PROM}, {'r', O_RAW}, {'c', O_CACHE},
      {'t', O_TOP},  {'i', O_INTERVAL}, {'n', O_COUNT},
  };
  optind = 0; /* glibc: start afresh; argv[0] is the command */
  opterr = 0;
  int ch;
  while ((ch = getopt_long(argc, argv, ":h", all, NULL)) != -1) {
    if (ch == '?') {
      const char *bad = argv[optind - 1];
      return bad_usage(cmd, "%s: unknown option", bad);
    }
    if (ch == ':') return bad_usage(cmd, "%s needs a value", argv[optind - 1]);
    if (ch == 'h') {
      command_usage(stdout, cmd, true);
      exit(0);
    }
    if (ch == 's') {
      o->socket = optarg;
      continue;
    }
    unsigned bit = 0;
    for (size_t i = 0; i < sizeof bits / sizeof bits[0]; i++)
      if (bits[i].ch == ch) bit = bits[i].bit;
    if (!(cmd->opts & bit)) {
      char what[96];
      bool has_arg = ch == 'c' || ch == 't' || ch == 'i' || ch == 'n';
      snprintf(what, sizeof what, "%s", argv[optind - 1 - (has_arg && optarg == argv[optind - 1])]);
      char *eq = strchr(what, '=');
      if (eq) *eq = '\0';
      char msg[160];
      snprintf(msg, sizeof msg, "%%s: %s does not take this option", cmd->name);
      return bad_usage(cmd, msg, what);
    }
    uint64_t v;
    switch (ch) {
    case 'j': o->json = true; break;
    case 'p': o->prometheus = true; break;
    case 'r': o->raw = true; break;
    case 'c': o->cache = optarg; break;
    case 't':
      if (!parse_u64(optarg, &v) || v == 0 || v > 1000)
        return bad_usage(cmd, "--top takes 1..1000, got '%s'", optarg);
      o->top = (unsigned)v;
      break;
    case 'n':
      if (!parse_u64(optarg, &v) || v == 0 || v > 1000000)
        return bad_usage(cmd, "--count takes 1..1000000, got '%s'", optarg);
      o->count = (long)v;
      break;
    case 'i': {
      char *end;
      double d = strtod(optarg, &end);
      if (*end || !(d >= 0.1 && d <= 3600))
        return bad_usage(cmd, "--interval takes 0.1..3600 seconds, got '%s'", optarg);
      o->interval = d;
      break;
    }
    }
  }
  if ((o->json + o->prometheus + o->raw) > 1)
    return bad_usage(cmd, "%s", "--json, --prometheus and --raw exclude each other");
  o->pos = argv + optind;
  o->npos = argc - optind;
  if (o->npos < cmd->min_pos)
    return bad_usage(cmd, "%s: missing arguments", cmd->name);
  if (o->npos > cmd->max_pos) return bad_usage(cmd, "unexpected argument '%s'", o->pos[cmd->max_pos]);
  return 0;
}

/* ---- human units ----------------------------------------------------------- */

static const char *human_bytes(double v, char *buf, size_t len) {
  static const char *const u[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int i = 0;
  while (fabs(v) >= 1024 && i < 5) v /= 1024, i++;
  if (i == 0) snprintf(buf, len, "%.0f B", v);
  else snprintf(buf, len, "%.1f %s", v, u[i]);
  return buf;
}

static const char *human_count(double v, char *buf, size_t len) {
  static const char *const u[] = {"", "k", "M", "G", "T"};
  int i = 0;
  while (fabs(v) >= 10000 && i < 4) v /= 1000, i++;
  if (i == 0 && v == floor(v)) snprintf(buf, len, "%.0f", v);
  else if (i == 0) snprintf(buf, len, "%.1f", v);
  else snprintf(buf, len, "%.1f%s", v, u[i]);
  return buf;
}

static const char *human_seconds(double s, char *buf, size_t len) {
  if (s <= 0) snprintf(buf, len, "0 s");
  else if (s < 1e-3) snprintf(buf, len, "%.0f us", s * 1e6);
  else if (s < 1) snprintf(buf, len, "%.1f ms", s * 1e3);
  else if (s < 120) snprintf(buf, len, "%.1f s", s);
  else if (s < 7200) snprintf(buf, len, "%.0fm%02.0fs", floor(s / 60), fmod(s, 60));
  else if (s < 172800) snprintf(buf, len, "%.0fh%02.0fm", floor(s / 3600), floor(fmod(s, 3600) / 60));
  else snprintf(buf, len, "%.0fd%02.0fh", floor(s / 86400), floor(fmod(s, 86400) / 3600));
  return buf;
}

static const char *human(double v, const char *unit, char *buf, size_t len) {
  if (strcmp(unit, "bytes") == 0) return human_bytes(v, buf, len);
  if (strcmp(unit, "seconds") == 0) return human_seconds(v, buf, len);
  return human_count(v, buf, len);
}

/* ---- figures ----------------------------------------------------------------- */

typedef struct figs {
  kvc_stat_t *st;
  size_t n;
} figs_t;

static const kvc_stat_t *fig(const figs_t *f, const char *name, const char *cache,
                             const char *key, const char *value) {
  for (size_t i = 0; i < f->n; i++) {
    if (strcmp(f->st[i].name, name) != 0 || strcmp(f->st[i].cache, cache ? cache : "") != 0)
      continue;
    const char *v = key ? kvc_stat_label(&f->st[i], key) : NULL;
    if (key && (!v || strcmp(v, value) != 0)) continue;
    return &f->st[i];
  }
  return NULL;
}

static double figv(const figs_t *f, const char *name) {
  const kvc_stat_t *s = fig(f, name, NULL, NULL, NULL);
  return s ? (double)s->value : 0;
}

/* Sum of every sample of a family (over its labels), for one cache or global. */
static double fam_sum(const figs_t *f, const char *name, const char *cache) {
  double v = 0;
  for (size_t i = 0; i < f->n; i++)
    if (strcmp(f->st[i].name, name) == 0 && strcmp(f->st[i].cache, cache ? cache : "") == 0)
      v += (double)f->st[i].value;
  return v;
}

/* Quantile q of a histogram (0: none), as Prometheus's histogram_quantile
 * estimates it: linear within the bucket that holds it, from the bucket's
 * lower bound (0 for the first); in the +Inf bucket, the last finite bound. */
static double hist_quantile(const kvc_stat_t *h, double q) {
  if (!h || h->value == 0) return 0;
  double rank = q * (double)h->value, lo = 0, below = 0;
  for (size_t i = 0; i < h->nbuckets; i++) {
    double c = (double)h->bucket_count[i];
    if (c >= rank) {
      double in = c - below;
      return in > 0 ? lo + (h->bucket_le[i] - lo) * (rank - below) / in : h->bucket_le[i];
    }
    lo = h->bucket_le[i];
    below = c;
  }
  return lo;
}

static const char *stat_tenant(const kvc_stat_t *s);

/* The node's figures and the caches q asks for (NULL: the default top). */
static int fetch(kvc_client_t *c, figs_t *f, const kvc_stats_opts_t *q) {
  int rc = kvc_stats_query(c, q, &f->st, &f->n);
  return rc ? fail(c, rc, "stats") : 0;
}

/* One cache's figures in a reply: a run of samples of one cache and tenant
 * (the daemon sends each cache's together), and whether the viewer (an
 * admin) sees a cache of that name in another tenant too. */
typedef struct scope {
  size_t lo, hi;
  bool ambiguous;
} scope_t;

static bool same_cache(const kvc_stat_t *a, const kvc_stat_t *b) {
  return strcmp(a->cache, b->cache) == 0 && strcmp(stat_tenant(a), stat_tenant(b)) == 0;
}

/* The caches of f, in the reply's order (most pages first): new *out
 * (free it) and their count; 0 and NULL when none (or out of memory). */
static size_t cache_scopes(const figs_t *f, scope_t **out) {
  size_t n = 0;
  for (size_t i = 0; i < f->n; i++)
    n += f->st[i].cache[0] && (i == 0 || !same_cache(&f->st[i], &f->st[i - 1]));
  scope_t *v = n ? calloc(n, sizeof *v) : NULL;
  *out = v;
  if (!v) return 0;
  size_t k = 0;
  for (size_t i = 0; i < f->n; i++) {
    if (!f->st[i].cache[0]) continue;
    if (k && v[k - 1].hi == i && same_cache(&f->st[i], &f->st[v[k - 1].lo])) v[k - 1].hi = i + 1;
    else v[k++] = (scope_t){i, i + 1, false};
  }
  for (size_t a = 0; a < k; a++)
    for (size_t b = 0; b < k; b++)
      if (strcmp(f->st[v[a].lo].cache, f->st[v[b].lo].cache) == 0 &&
          !same_cache(&f->st[v[a].lo], &f->st[v[b].lo]))
        v[a].ambiguous = true;
  return k;
}

/* The sum of one cache's family over its samples (0 when absent). */
static double scope_sum(const figs_t *f, const scope_t *sc, const char *name) {
  double v = 0;
  for (size_t i = sc->lo; i < sc->hi; i++)
    if (strcmp(f->st[i].name, name) == 0) v += (double)f->st[i].value;
  return v;
}

/* ---- stats: JSON ---------------------------------------------------------------- */

static void json_string(const char *s) {
  putchar('"');
  for (; *s; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch == '"' || ch == '\\') printf("\\%c", ch);
    else if (ch < 0x20) printf("\\u%04x", ch);
    else putchar(ch);
  }
  putchar('"');
}

static const char *kind_name(kvc_stat_kind_t k) {
  switch (k) {
  case KVC_STAT_COUNTER: return "counter";
  case KVC_STAT_GAUGE: return "gauge";
  case KVC_STAT_HISTOGRAM: return "histogram";
  case KVC_STAT_INFO: return "info";
  }
  return "gauge";
}

/* A per-cache figure's tenant label is its cache's (shown once, with the
 * cache): the other labels make a family "labelled". */
static bool own_label(const kvc_stat_t *s, size_t k) {
  return !(s->cache[0] && strcmp(s->labels[k].key, "tenant") == 0);
}

static size_t own_labels(const kvc_stat_t *s) {
  size_t n = 0;
  for (size_t k = 0; k < s->nlabels; k++) n += own_label(s, k);
  return n;
}

static const char *stat_tenant(const kvc_stat_t *s) {
  const char *t = kvc_stat_label(s, "tenant");
  return t ? t : "";
}

static void json_sample(const kvc_stat_t *s) {
  printf("{\"labels\": {");
  bool firstl = true;
  for (size_t k = 0; k < s->nlabels; k++) {
    if (!own_label(s, k)) continue;
    printf("%s", firstl ? "" : ", ");
    firstl = false;
    json_string(s->labels[k].key);
    printf(": ");
    json_string(s->labels[k].value);
  }
  printf("}, \"value\": %" PRIu64, s->value);
  if (s->kind == KVC_STAT_HISTOGRAM) {
    printf(", \"sum\": %.9g, \"buckets\": [", s->sum);
    for (size_t b = 0; b < s->nbuckets; b++)
      printf("%s[%.9g, %" PRIu64 "]", b ? ", " : "", s->bucket_le[b], s->bucket_count[b]);
    printf("]");
  }
  printf("}");
}

/* The families of samples [lo, hi) as one JSON object: the global ones
 * (global), or every one of the range (a cache's). */
static void json_scope(const figs_t *f, size_t lo, size_t hi, bool global) {
  bool first = true;
#define IN_SCOPE_(x) (global ? !(x)->cache[0] : true)
  for (size_t i = lo; i < hi; i++) {
    const kvc_stat_t *s = &f->st[i];
    if (!IN_SCOPE_(s)) continue;
    bool seen = false;
    for (size_t j = lo; j < i && !seen; j++)
      seen = IN_SCOPE_(&f->st[j]) && strcmp(f->st[j].name, s->name) == 0;
    if (seen) continue;
    bool labelled = own_labels(s) > 0 || s->kind == KVC_STAT_HISTOGRAM;
    for (size_t j = i + 1; j < hi && !labelled; j++)
      labelled = IN_SCOPE_(&f->st[j]) && strcmp(f->st[j].name, s->name) == 0;
    printf("%s\n    ", first ? "" : ",");
    first = false;
    json_string(s->name);
    printf(": {\"kind\": \"%s\", \"unit\": ", kind_name(s->kind));
    json_string(s->unit);
    printf(", \"help\": ");
    json_string(s->help);
    if (!labelled) {
      printf(", \"value\": %" PRIu64 "}", s->value);
      continue;
    }
    printf(", \"samples\": [");
    bool firsts = true;
    for (size_t j = i; j < hi; j++) {
      if (!IN_SCOPE_(&f->st[j]) || strcmp(f->st[j].name, s->name) != 0) continue;
      printf("%s", firsts ? "" : ", ");
      firsts = false;
      json_sample(&f->st[j]);
    }
    printf("]}");
  }
#undef IN_SCOPE_
}

/* The global figures (unless one cache was asked for), then each cache's,
 * keyed by its name, or NAME@TENANT where the viewer (an admin) sees caches
 * of that name in several tenants. */
static void stats_json(const figs_t *f, bool one_cache) {
  printf("{");
  if (!one_cache) {
    printf("\"global\": {");
    json_scope(f, 0, f->n, true);
    printf("\n  },\n  ");
  }
  printf("\"caches\": {");
  scope_t *sc;
  size_t n = cache_scopes(f, &sc);
  for (size_t i = 0; i < n; i++) {
    const kvc_stat_t *st = &f->st[sc[i].lo];
    char key[160];
    if (sc[i].ambiguous) snprintf(key, sizeof key, "%s@%s", st->cache, stat_tenant(st));
    else snprintf(key, sizeof key, "%s", st->cache);
    printf("%s\n  ", i ? "," : "");
    json_string(key);
    printf(": {\"tenant\": ");
    json_string(stat_tenant(st));
    printf(",");
    json_scope(f, sc[i].lo, sc[i].hi, false);
    printf("\n  }");
  }
  free(sc);
  printf("\n}}\n");
}

/* ---- stats: the table -------------------------------------------------------------- */

/* The sections of the table: the figures named, then those whose name
 * starts with a prefix of the section's and no section names. A figure in
 * none would go to "Other" (a test keeps that section empty). */
static const struct {
  const char *title;
  const char *const names[24];
  const char *const prefixes[4];
} sections[] = {
    {"Pool", {"pool_bytes", "page_bytes", "segment_bytes", "segments", "segments_free", "arenas",
              "pool_pages", "pages_free", "pages_used", "pages_shared", "pages_pinned",
              "bytes_used", "bytes_free", "bytes_padding", "metadata_bytes",
              "segment_moves_total", "segment_moved_pages_total"},
     {"pool_"}},
    {"Contents", {"caches", "sequences", "sequences_pinned", "tokens", "leases", "leased_pages",
                  "leases_taken_total"}},
    {"Engine operations", {"puts_total", "put_tokens_total", "gets_total", "get_tokens_total",
                           "bytes_in_total", "bytes_out_total", "removes_total", "copies_total",
                           "trims_total", "pins_total", "unpins_total", "cow_copies_total",
                           "errors_total"}},
    {"Eviction and limits", {"evicted_sequences_total", "evicted_pages_total", "full_errors_total",
                             "pins_lapsed_total", "pin_limit_errors_total"},
     {"quota_"}},
    {"Prefix cache", {"prefix_matches_total", "prefix_tokens_queried_total",
                      "prefix_tokens_hit_total", "prefix_tokens_ineligible_total",
                      "pages_indexed", "pages_cached", "cached_reclaimed_total",
                      "hash_verify_failed_total", "hash_collisions_total"},
     {"prefix_", "hash_"}},
    {"Connections", {"connections_current", "connections_total", "connections_brief_total",
                     "connections_rejected_total", "connections_dropped_total",
                     "connections_timed_out_total", "connections_idle_closed_total",
                     "accept_pauses_total", "shm_bytes", "frames_in_total",
                     "socket_bytes_in_total", "socket_bytes_out_total", "deferred_turns_total",
                     "write_pauses_total", "background_waits_total", "parked_requests_total"},
     {"connections_"}},
    {"Rings and copies", {"ring_connections", "ring_requests_total", "ring_preempts_total",
                          "ring_doorbells_total", "ring_client_wakeups_total",
                          "offloaded_gets_total", "offloaded_puts_total",
                          "offloaded_shares_total", "helped_shares_total", "split_copies_total"},
     {"ring_", "offloaded_"}},
    {"Disk tier (disk_dir)", {NULL}, {"tier_disk_"}},
    {"Event stream (events_endpoint)", {NULL}, {"events_"}},
    {"Daemon", {"uptime_seconds", "process_start_time_seconds", "config_reloads_total",
                "config_reload_failures_total", "metrics_scrapes_total",
                "metrics_http_errors_total"},
     {"config_", "metrics_"}},
};
#define NSECTIONS (sizeof sections / sizeof sections[0])

static bool named_in_sections(const char *name) {
  for (size_t s = 0; s < NSECTIONS; s++)
    for (size_t i = 0; sections[s].names[i]; i++)
      if (strcmp(sections[s].names[i], name) == 0) return true;
  return false;
}

/* The section a figure falls in by a prefix (named ones aside), or -1. */
static int prefix_section(const char *name) {
  if (named_in_sections(name)) return -1;
  for (size_t s = 0; s < NSECTIONS; s++)
    for (size_t i = 0; i < 4 && sections[s].prefixes[i]; i++)
      if (strncmp(name, sections[s].prefixes[i], strlen(sections[s].prefixes[i])) == 0)
        return (int)s;
  return -1;
}

/* A global figure of one number: a row of the table. */
static bool table_figure(const kvc_stat_t *st) {
  return !st->cache[0] && !st->nlabels && st->kind != KVC_STAT_HISTOGRAM &&
         strcmp(st->name, "build_info") != 0;
}

/* One row: the figure's name, as every view names it (Prometheus's adds
 * kvcached_), its value in human units, and a counter's rate. */
static void table_row(const kvc_stat_t *s, double uptime) {
  char a[32], b[32];
  if (strcmp(s->name, "process_start_time_seconds") == 0) {
    time_t t = (time_t)s->value;
    struct tm tm;
    char when[64];
    strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S %Z", localtime_r(&t, &tm));
    printf("  %-32s %s\n", s->name, when);
    return;
  }
  printf("  %-32s %12s", s->name, human((double)s->value, s->unit, a, sizeof a));
  if (s->kind == KVC_STAT_COUNTER && uptime > 0)
    printf("  %12s/s", human((double)s->value / uptime, s->unit, b, sizeof b));
  putchar('\n');
}

/* The node's figures in sections, then the caches of the reply, most pages
 * first: the top (as many as asked) or those of only_cache. */
static void stats_table(const figs_t *f, const char *only_cache, unsigned top) {
  double uptime = figv(f, "uptime_seconds");
  char a[32], b[32], c2[32], d[32];
  const kvc_stat_t *bi = fig(f, "build_info", NULL, NULL, NULL);
  if (!only_cache) {
    printf("kvcached %s, up %s; rates are per second since start\n",
           bi && kvc_stat_label(bi, "version") ? kvc_stat_label(bi, "version") : "?",
           human_seconds(uptime, a, sizeof a));
    for (size_t s = 0; s < NSECTIONS; s++) {
      printf("\n%s\n", sections[s].title);
      for (size_t i = 0; sections[s].names[i]; i++) {
        const kvc_stat_t *st = fig(f, sections[s].names[i], NULL, NULL, NULL);
        if (st) table_row(st, uptime);
      }
      for (size_t i = 0; i < f->n; i++)
        if (table_figure(&f->st[i]) && prefix_section(f->st[i].name) == (int)s)
          table_row(&f->st[i], uptime);
    }
    bool other = false;
    for (size_t i = 0; i < f->n; i++) {
      const kvc_stat_t *st = &f->st[i];
      if (!table_figure(st) || named_in_sections(st->name) || prefix_section(st->name) >= 0)
        continue;
      if (!other) printf("\nOther\n");
      other = true;
      table_row(st, uptime);
    }
    /* Requests: the operations that ran. */
    printf("\nRequests (operations that ran; MEAN is exact, P50 and P99 are estimated within\n"
           "the buckets of request_duration_seconds, as Prometheus's histogram_quantile does)\n"
           "  %-16s %10s %10s %8s %10s %10s %10s\n", "OP",
           "REQUESTS", "RATE/S", "ERRORS", "MEAN", "P50", "P99");
    for (size_t i = 0; i < f->n; i++) {
      const kvc_stat_t *st = &f->st[i];
      if (strcmp(st->name, "requests_total") != 0 || st->value == 0) continue;
      const char *op = kvc_stat_label(st, "op");
      const kvc_stat_t *h = fig(f, "request_duration_seconds", NULL, "op", op);
      double errs = 0;
      for (size_t j = 0; j < f->n; j++) {
        const char *eop = kvc_stat_label(&f->st[j], "op");
        if (strcmp(f->st[j].name, "request_errors_total") == 0 && eop && strcmp(eop, op) == 0)
          errs += (double)f->st[j].value;
      }
      char e[32], p99[32];
      printf("  %-16s %10s %10s %8s %10s %10s %10s\n", op,
             human_count((double)st->value, a, sizeof a),
             human_count(uptime > 0 ? (double)st->value / uptime : 0, b, sizeof b),
             human_count(errs, e, sizeof e),
             human_seconds(h && h->value ? h->sum / (double)h->value : 0, c2, sizeof c2),
             human_seconds(hist_quantile(h, 0.5), d, sizeof d),
             human_seconds(hist_quantile(h, 0.99), p99, sizeof p99));
    }
    bool any_err = false;
    for (size_t i = 0; i < f->n; i++) {
      const kvc_stat_t *st = &f->st[i];
      if (strcmp(st->name, "request_errors_total") != 0) continue;
      if (!any_err) printf("\nErrors by status\n");
      any_err = true;
      printf("  %-16s %-12s %10s\n", kvc_stat_label(st, "op"), kvc_stat_label(st, "status"),
             human_count((double)st->value, a, sizeof a));
    }
  }
  /* Caches: one row each. */
  scope_t *sc;
  size_t n = cache_scopes(f, &sc);
  if (only_cache) printf("\nCaches\n");
  else printf("\nCaches (the %u holding the most pages; --top N for more, --cache NAME for one)\n", top);
  printf("  %-20s %9s %9s %9s %9s %9s %9s %7s\n", "CACHE", "SEQS", "TOKENS", "PAGES", "PUTS",
         "GETS", "EVICTED", "HIT");
  for (size_t i = 0; i < n; i++) {
    const scope_t *x = &sc[i];
    const kvc_stat_t *st = &f->st[x->lo];
    double q = scope_sum(f, x, "cache_prefix_tokens_queried_total");
    double hit = scope_sum(f, x, "cache_prefix_tokens_hit_total");
    char h2[32], e[32], g[32], name[160];
    if (q > 0) snprintf(h2, sizeof h2, "%.1f%%", 100.0 * hit / q);
    else snprintf(h2, sizeof h2, "-");
    if (x->ambiguous) snprintf(name, sizeof name, "%s@%s", st->cache, stat_tenant(st));
    else snprintf(name, sizeof name, "%s", st->cache);
    printf("  %-20s %9s %9s %9s %9s %9s %9s %7s\n", name,
           human_count(scope_sum(f, x, "cache_sequences"), a, sizeof a),
           human_count(scope_sum(f, x, "cache_tokens"), b, sizeof b),
           human_count(scope_sum(f, x, "cache_pages"), c2, sizeof c2),
           human_count(scope_sum(f, x, "cache_puts_total"), d, sizeof d),
           human_count(scope_sum(f, x, "cache_gets_total"), e, sizeof e),
           human_count(scope_sum(f, x, "cache_evicted_sequences_total"), g, sizeof g), h2);
  }
  if (!n) printf("  (none)\n");
  free(sc);
}

/* memcached's stats: one exact figure a line (one_cache: its figures only). */
static void stats_raw(const figs_t *f, bool one_cache) {
  for (size_t i = 0; i < f->n; i++) {
    const kvc_stat_t *s = &f->st[i];
    if (one_cache && !s->cache[0]) continue;
    printf("%s", s->name);
    bool any = false;
    if (s->cache[0]) printf("{cache=\"%s\"", s->cache), any = true;
    for (size_t k = 0; k < s->nlabels; k++)
      printf("%s%s=\"%s\"", any ? "," : "{", s->labels[k].key, s->labels[k].value), any = true;
    if (any) putchar('}');
    if (s->kind == KVC_STAT_HISTOGRAM) printf(" count=%" PRIu64 " sum=%.9g\n", s->value, s->sum);
    else printf(" %" PRIu64 "\n", s->value);
  }
}

static int cmd_stats(kvc_client_t *c, const opts_t *o) {
  if (o->cache && o->top)
    return bad_usage(find_command("stats"), "%s", "--cache and --top exclude each other");
  figs_t f;
  int rc = kvc_stats_query(c, &(kvc_stats_opts_t){.cache = o->cache, .top = o->top}, &f.st, &f.n);
  if (rc == KVC_E_NOCACHE)
    return die("stats: no cache named '%s' (kvcachectl caches lists them)", o->cache);
  if (rc) return fail(c, rc, "stats");
  bool one = o->cache != NULL;
  if (o->json) {
    stats_json(&f, one);
  } else if (o->prometheus) {
    char *text;
    size_t len;
    /* --cache: that cache's figures only (a copy of the list). */
    kvc_stat_t *sel = f.st;
    size_t n = f.n;
    if (one) {
      sel = calloc(f.n + 1, sizeof *sel);
      n = 0;
      for (size_t i = 0; sel && i < f.n; i++)
        if (f.st[i].cache[0]) sel[n++] = f.st[i];
    }
    if (!sel || kvc_stats_prometheus(sel, n, &text, &len) != 0) {
      rc = die("%s", "out of memory");
    } else {
      fwrite(text, 1, len, stdout);
      free(text);
    }
    if (sel != f.st) free(sel);
  } else if (o->raw) {
    stats_raw(&f, one);
  } else {
    stats_table(&f, o->cache, o->top ? o->top : KVC_STATS_TOP_DEFAULT);
  }
  kvc_stats_free(f.st);
  return rc;
}

/* ---- tiers ----------------------------------------------------------------------- */

/* A tier's figure (tier_NAME with its tier label; 0 when absent). */
static double tierv(const figs_t *f, const char *tier, const char *name) {
  const kvc_stat_t *st = fig(f, name, NULL, "tier", tier);
  return st ? (double)st->value : 0;
}

/* The samples of a labelled tier family, "key=value ..." (non-zero ones,
 * or all with json), into buf. */
static void tier_by(const figs_t *f, const char *tier, const char *name, const char *key,
                    bool json, char *buf, size_t len) {
  size_t used = 0;
  buf[0] = '\0';
  for (size_t i = 0; i < f->n && used < len; i++) {
    const kvc_stat_t *st = &f->st[i];
    const char *t = kvc_stat_label(st, "tier"), *k = kvc_stat_label(st, key);
    if (strcmp(st->name, name) != 0 || !t || strcmp(t, tier) != 0 || !k || (!json && !st->value))
      continue;
    int w = json ? snprintf(buf + used, len - used, "%s\"%s\": %" PRIu64, used ? ", " : "", k,
                            st->value)
                 : snprintf(buf + used, len - used, "%s%s %" PRIu64, used ? "  " : "", k, st->value);
    if (w > 0) used += (size_t)w;
  }
  if (!json && !buf[0]) snprintf(buf, len, "none");
}

static void tier_show(const figs_t *f, const char *t, bool json) {
  char a[32], b[32], errs[512], disc[512], red[128];
  tier_by(f, t, "tier_errors_total", "kind", json, errs, sizeof errs);
  tier_by(f, t, "tier_discarded_total", "reason", json, disc, sizeof disc);
  tier_by(f, t, "tier_redirects_total", "kind", json, red, sizeof red);
  const kvc_stat_t *lat = fig(f, "tier_lookup_duration_seconds", NULL, "tier", t);
  double asked = tierv(f, t, "tier_lookup_pages_total"), hit = tierv(f, t, "tier_hit_pages_total");
  if (json) {
    printf("  \"%s\": {\"up\": %.0f, \"slots_covered\": %.0f, \"nodes\": [", t,
           tierv(f, t, "tier_up"), tierv(f, t, "tier_slots_covered"));
  } else if (fig(f, "tier_node_slots", NULL, "tier", t)) { /* a tier of nodes: the cluster */
    printf("tier %s: %s, %.0f of 16384 slots mapped, %.0f nodes connected, %.0f breakers open\n",
           t, tierv(f, t, "tier_up") ? "up" : "DOWN", tierv(f, t, "tier_slots_covered"),
           tierv(f, t, "tier_nodes_connected"), tierv(f, t, "tier_breakers_open"));
    printf("  %-24s %-8s %-13s %s\n", "NODE", "ROLE", "STATE", "SLOTS");
  } else {
    printf("tier %s: %s\n", t, tierv(f, t, "tier_up") ? "up" : "DOWN");
  }
  bool first = true;
  for (size_t i = 0; i < f->n; i++) {
    const kvc_stat_t *st = &f->st[i];
    const char *tt = kvc_stat_label(st, "tier");
    if (strcmp(st->name, "tier_node_slots") != 0 || !tt || strcmp(tt, t) != 0) continue;
    const char *node = kvc_stat_label(st, "node"), *role = kvc_stat_label(st, "role"),
               *state = kvc_stat_label(st, "state");
    if (json)
      printf("%s{\"node\": \"%s\", \"role\": \"%s\", \"state\": \"%s\", \"slots\": %" PRIu64 "}",
             first ? "" : ", ", node, role, state, st->value);
    else
      printf("  %-24s %-8s %-13s %" PRIu64 "\n", node, role, state, st->value);
    first = false;
  }
  if (json) {
    printf("], \"lookups\": %.0f, \"lookup_pages\": %.0f, \"hit_pages\": %.0f, "
           "\"hit_tokens\": %.0f, \"read_bytes\": %.0f, \"writes\": %.0f, "
           "\"written_bytes\": %.0f, \"write_retries\": %.0f, \"queue_pages\": %.0f, "
           "\"queue_drops\": %.0f, \"lookup_p50_seconds\": %.9g, \"lookup_p99_seconds\": %.9g, "
           "\"errors\": {%s}, \"discarded\": {%s}, \"redirects\": {%s}}",
           tierv(f, t, "tier_lookups_total"), asked, hit, tierv(f, t, "tier_hit_tokens_total"),
           tierv(f, t, "tier_read_bytes_total"), tierv(f, t, "tier_writes_total"),
           tierv(f, t, "tier_written_bytes_total"), tierv(f, t, "tier_write_retries_total"),
           tierv(f, t, "tier_queue_pages"), tierv(f, t, "tier_queue_drops_total"),
           hist_quantile(lat, 0.5), hist_quantile(lat, 0.99), errs, disc, red);
    return;
  }
  printf("  lookups %.0f: %.0f pages asked, %.0f hit (%.1f%%), %.0f tokens; latency p50 %s p99 %s\n",
         tierv(f, t, "tier_lookups_total"), asked, hit, asked ? 100.0 * hit / asked : 0.0,
         tierv(f, t, "tier_hit_tokens_total"), human_seconds(hist_quantile(lat, 0.5), a, sizeof a),
         human_seconds(hist_quantile(lat, 0.99), b, sizeof b));
  printf("  read %s; written %s in %.0f pages (%.0f retries)\n",
         human_bytes(tierv(f, t, "tier_read_bytes_total"), a, sizeof a),
         human_bytes(tierv(f, t, "tier_written_bytes_total"), b, sizeof b),
         tierv(f, t, "tier_writes_total"), tierv(f, t, "tier_write_retries_total"));
  printf("  write queue: %.0f pages, %.0f dropped\n", tierv(f, t, "tier_queue_pages"),
         tierv(f, t, "tier_queue_drops_total"));
  printf("  errors: %s\n  discarded: %s\n  redirects: %s\n", errs, disc, red);
}

static int cmd_tier(kvc_client_t *c, const opts_t *o) {
  figs_t f;
  if (fetch(c, &f, &(kvc_stats_opts_t){.node_only = true})) return 1;
  const char *tiers[8];
  size_t nt = 0;
  for (size_t i = 0; i < f.n; i++) { /* the tiers: the labels of tier_up */
    const char *t = strcmp(f.st[i].name, "tier_up") == 0 ? kvc_stat_label(&f.st[i], "tier") : NULL;
    if (t && nt < 8) tiers[nt++] = t;
  }
  if (o->json) printf("{\"tiers\": {");
  else if (!nt) printf("no tier below memory (disk_dir and cluster_nodes are empty)\n");
  for (size_t i = 0; i < nt; i++) {
    if (o->json) printf("%s\n", i ? "," : "");
    tier_show(&f, tiers[i], o->json);
  }
  if (o->json) printf("%s}}\n", nt ? "\n" : "");
  kvc_stats_free(f.st);
  return 0;
}

/* ---- caches and sequences -------------------------------------------------- */

static const char *dtype_name(kvc_dtype_t d) {
  switch (d) {
  case KVC_DTYPE_F32: return "f32";
  case KVC_DTYPE_F64: return "f64";
  case KVC_DTYPE_F16: return "f16";
  case KVC_DTYPE_BF16: return "bf16";
  case KVC_DTYPE_INT8: return "int8";
  case KVC_DTYPE_FP8_E4M3: return "fp8_e4m3";
  case KVC_DTYPE_FP8_E5M2: return "fp8_e5m2";
  case KVC_DTYPE_Q8_0: return "q8_0";
  case KVC_DTYPE_Q4_0: return "q4_0";
  }
  return "?";
}

static int list_caches(kvc_client_t *c, kvc_cache_info_t **out, size_t *n) {
  size_t count = 0;
  *out = NULL;
  *n = 0;
  int rc = kvc_cache_list(c, NULL, 0, &count);
  if (rc) return rc;
  *out = calloc(count ? count : 1, sizeof **out);
  if (!*out) return KVC_E_NOMEM;
  rc = kvc_cache_list(c, *out, count, n);
  if (*n > count) *n = count;
  return rc;
}

static int cmd_caches(kvc_client_t *c, const opts_t *o) {
  kvc_cache_info_t *infos;
  size_t n = 0;
  int rc = list_caches(c, &infos, &n);
  if (rc) {
    free(infos);
    return fail(c, rc, "caches");
  }
  if (o->json) printf("{\"caches\": [");
  else
    printf("%-20s %-12s %4s %6s %5s %5s %5s %5s %4s %10s %8s %10s %8s\n", "NAME", "TENANT", "ID",
           "LAYERS", "HEADS", "DK", "DV", "DTYPE", "PT", "PAGE", "SEQS", "TOKENS", "PAGES");
  for (size_t i = 0; i < n; i++) {
    const kvc_cache_info_t *ci = &infos[i];
    if (o->json) {
      printf("%s\n  {\"name\": ", i ? "," : "");
      json_string(ci->name);
      printf(", \"tenant\": ");
      json_string(ci->tenant);
      printf(", \"id\": %u, \"num_layers\": %u, \"num_kv_heads\": %u, \"head_dim_k\": %u, "
             "\"head_dim_v\": %u, \"dtype\": \"%s\", \"page_tokens\": %u, \"page_bytes\": %"
             PRIu64 ", \"sequences\": %" PRIu64 ", \"tokens\": %" PRIu64 ", \"pages\": %" PRIu64
             "}",
             ci->cache_id, ci->layout.num_layers, ci->layout.num_kv_heads,
             ci->layout.head_dim_k, ci->layout.head_dim_v, dtype_name(ci->layout.dtype),
             ci->layout.page_tokens, ci->page_bytes, ci->sequences, ci->tokens, ci->pages);
      continue;
    }
    char pb[32];
    printf("%-20s %-12s %4u %6u %5u %5u %5u %5s %4u %10s %8" PRIu64 " %10" PRIu64 " %8" PRIu64
           "\n",
           ci->name, ci->tenant, ci->cache_id, ci->layout.num_layers, ci->layout.num_kv_heads,
           ci->layout.head_dim_k, ci->layout.head_dim_v, dtype_name(ci->layout.dtype),
           ci->layout.page_tokens, human_bytes((double)ci->page_bytes, pb, sizeof pb),
           ci->sequences, ci->tokens, ci->pages);
  }
  if (o->json) printf("\n]}\n");
  free(infos);
  return 0;
}

/* The daemon stamps last use with its monotonic clock (same node): an age. */
static double idle_seconds(uint64_t last_use_ms) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  double now = (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
  double d = (now - (double)last_use_ms) / 1e3;
  return d > 0 ? d : 0;
}

static void seq_json(const char *cache, const kvc_seq_info_t *s) {
  printf("{\"cache\": ");
  json_string(cache);
  printf(", \"seq_id\": %" PRIu64 ", \"start\": %" PRIu64 ", \"length\": %" PRIu64
         ", \"extent\": %" PRIu64 ", \"pages\": %u, \"shared_pages\": %u, \"pins\": %u, "
         "\"idle_seconds\": %.3f}",
         s->seq_id, s->start, s->length, s->extent, s->pages, s->shared_pages, s->pins,
         idle_seconds(s->last_use_ms));
}

/* Prints the sequences of one cache; *first tracks the JSON separators. */
static int print_seqs(kvc_client_t *c, const opts_t *o, const char *name, bool *first) {
  kvc_cache_t *h;
  int rc = kvc_cache_find(c, name, &h);
  if (rc) return fail(c, rc, name);
  kvc_seq_info_t buf[256];
  uint64_t cursor = 0;
  do {
    size_t n = 0;
    rc = kvc_seq_list(h, &cursor, buf, 256, &n);
    if (rc) {
      kvc_cache_close(h);
      return fail(c, rc, "seqs");
    }
    for (size_t i = 0; i < n; i++) {
      if (o->json) {
        printf("%s\n  ", *first ? "" : ",");
        seq_json(name, &buf[i]);
      } else {
        char idle[32];
        printf("%-20s %20" PRIu64 " %10" PRIu64 " %10" PRIu64 " %6u %6u %4u %10s\n", name,
               buf[i].seq_id, buf[i].start, buf[i].length, buf[i].pages, buf[i].shared_pages,
               buf[i].pins, human_seconds(idle_seconds(buf[i].last_use_ms), idle, sizeof idle));
      }
      *first = false;
    }
  } while (cursor != 0);
  kvc_cache_close(h);
  return 0;
}

static int cmd_seqs(kvc_client_t *c, const opts_t *o) {
  kvc_cache_info_t *infos = NULL;
  size_t n = 0;
  int rc;
  if (o->cache) {
    /* Found before anything is printed: an error comes alone. */
    kvc_cache_t *h;
    if ((rc = kvc_cache_find(c, o->cache, &h)) != 0) return fail(c, rc, o->cache);
    kvc_cache_close(h);
  } else if ((rc = list_caches(c, &infos, &n)) != 0) {
    free(infos);
    return fail(c, rc, "caches");
  }
  bool first = true;
  if (o->json) printf("{\"seqs\": [");
  else
    printf("%-20s %20s %10s %10s %6s %6s %4s %10s\n", "CACHE", "SEQ", "START", "LENGTH",
           "PAGES", "SHARED", "PINS", "IDLE");
  if (o->cache) rc = print_seqs(c, o, o->cache, &first);
  for (size_t i = 0; i < n && rc == 0; i++) rc = print_seqs(c, o, infos[i].name, &first);
  if (o->json && rc == 0) printf("\n]}\n");
  free(infos);
  return rc;
}

static int cmd_info(kvc_client_t *c, const opts_t *o) {
  uint64_t seq;
  if (!parse_u64(o->pos[1], &seq)) return bad_number("info", "SEQ", o->pos[1]);
  kvc_cache_t *h;
  int rc = kvc_cache_find(c, o->pos[0], &h);
  if (rc) return fail(c, rc, o->pos[0]);
  kvc_seq_info_t si;
  rc = kvc_seq_info(h, seq, &si);
  kvc_cache_close(h);
  if (rc) return fail(c, rc, "info");
  if (o->json) {
    seq_json(o->pos[0], &si);
    putchar('\n');
    return 0;
  }
  char idle[32];
  printf("cache         %s\nseq_id        %" PRIu64 "\nstart         %" PRIu64
         "\nlength        %" PRIu64 "\nextent        %" PRIu64 "\npages         %u\n"
         "shared_pages  %u\npins          %u\nidle          %s\n",
         o->pos[0], si.seq_id, si.start, si.length, si.extent, si.pages, si.shared_pages,
         si.pins, human_seconds(idle_seconds(si.last_use_ms), idle, sizeof idle));
  return 0;
}

/* ---- prefix ------------------------------------------------------------------ */

/* The prefix figures of a cache (the cache_ families without the prefix). */
static const struct {
  const char *name, *label;
} prefix_figures[] = {
    {"prefix_matches", "match requests"},
    {"prefix_tokens_queried", "tokens queried"},
    {"prefix_tokens_hit", "tokens hit"},
    {"prefix_tokens_ineligible", "tokens ineligible"},
    {"pages_indexed", "pages indexed"},
    {"pages_cached", "pages cached"},
    {"cached_reclaimed", "cached pages reclaimed"},
    {"hash_verify_failed", "verify failures"},
    {"hash_collisions", "hash collisions"},
};
#define NPREFIX_FIGURES (sizeof prefix_figures / sizeof prefix_figures[0])

static uint64_t cache_figure(const figs_t *f, const char *cache, const char *name) {
  char fam[96];
  snprintf(fam, sizeof fam, "cache_%s", name);
  const kvc_stat_t *s = fig(f, fam, cache, NULL, NULL);
  if (!s) {
    snprintf(fam, sizeof fam, "cache_%s_total", name);
    s = fig(f, fam, cache, NULL, NULL);
  }
  return s ? s->value : 0;
}

static void hex(const uint8_t *p, size_t n) {
  for (size_t i = 0; i < n; i++) printf("%02x", p[i]);
}

/* One cache's prefix figures (a Stats request by its name) and chain heads. */
static int print_prefix(kvc_client_t *c, const opts_t *o, const char *name, bool first) {
  kvc_cache_t *h;
  int rc = kvc_cache_find(c, name, &h);
  if (rc) return fail(c, rc, name);
  figs_t figs, *f = &figs;
  if ((rc = kvc_stats_query(c, &(kvc_stats_opts_t){.cache = name}, &figs.st, &figs.n)) != 0) {
    kvc_cache_close(h);
    return fail(c, rc, name);
  }
  size_t cap = o->top ? o->top : 10, nheads = 0;
  kvc_prefix_head_t *heads = calloc(cap, sizeof *heads);
  if (!heads) {
    kvc_cache_close(h);
    kvc_stats_free(figs.st);
    return die("%s", "out of memory");
  }
  rc = kvc_prefix_top(h, heads, cap, &nheads);
  kvc_cache_close(h);
  if (rc) {
    free(heads);
    kvc_stats_free(figs.st);
    return fail(c, rc, "prefix");
  }
  uint64_t v[NPREFIX_FIGURES];
  for (size_t i = 0; i < NPREFIX_FIGURES; i++) v[i] = cache_figure(f, name, prefix_figures[i].name);
  /* Hit rate in tokens: hit over queried (ineligible tokens count as missed). */
  double rate = v[1] ? (double)v[2] / (double)v[1] : 0.0;
  if (o->json) {
    printf("%s\n  ", first ? "" : ",");
    json_string(name);
    printf(": {");
    for (size_t i = 0; i < NPREFIX_FIGURES; i++)
      printf("\"%s\": %" PRIu64 ", ", prefix_figures[i].name, v[i]);
    printf("\"hit_rate\": %.6f, \"top\": [", rate);
    for (size_t i = 0; i < nheads; i++) {
      printf("%s{\"hash\": \"", i ? ", " : "");
      hex(heads[i].hash, heads[i].hash_len);
      printf("\", \"hits\": %" PRIu64 ", \"depth\": %u}", heads[i].hits, heads[i].depth);
    }
    printf("]}");
  } else {
    if (!first) putchar('\n');
    printf("cache %s\n", name);
    for (size_t i = 0; i < NPREFIX_FIGURES; i++) {
      printf("  %-24s %14" PRIu64, prefix_figures[i].label, v[i]);
      if (strcmp(prefix_figures[i].name, "prefix_tokens_hit") == 0)
        printf("   hit rate %.2f%%", 100.0 * rate);
      putchar('\n');
    }
    printf("  top prefixes by hits:\n    %-16s %14s %8s\n", "HASH", "HITS", "DEPTH");
    for (size_t i = 0; i < nheads; i++) {
      printf("    ");
      hex(heads[i].hash, 8);
      printf(" %14" PRIu64 " %8u\n", heads[i].hits, heads[i].depth);
    }
  }
  free(heads);
  kvc_stats_free(figs.st);
  return 0;
}

/* Each cache's prefix figures and chain heads: of one cache, or of every
 * cache the caller may see. */
static int cmd_prefix(kvc_client_t *c, const opts_t *o) {
  kvc_cache_info_t *infos = NULL;
  size_t n = 0;
  int rc;
  if (o->cache) {
    kvc_cache_t *h;
    if ((rc = kvc_cache_find(c, o->cache, &h)) != 0) return fail(c, rc, o->cache);
    kvc_cache_close(h);
  } else if ((rc = list_caches(c, &infos, &n)) != 0) {
    free(infos);
    return fail(c, rc, "caches");
  }
  if (o->json) printf("{\"caches\": {");
  else if (!o->cache && n == 0) printf("no caches\n");
  if (o->cache) rc = print_prefix(c, o, o->cache, true);
  for (size_t i = 0; i < n && rc == 0; i++) rc = print_prefix(c, o, infos[i].name, i == 0);
  if (o->json && rc == 0) printf("\n}}\n");
  free(infos);
  return rc;
}

/* ---- ping ------------------------------------------------------------------- */

static int cmd_ping(kvc_client_t *c, const opts_t *o) {
  (void)o;
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  int rc = kvc_ping(c);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  if (rc) return fail(c, rc, "ping");
  kvc_client_info_t info;
  kvc_client_info(c, &info);
  long us = (t1.tv_sec - t0.tv_sec) * 1000000L + (t1.tv_nsec - t0.tv_nsec) / 1000L;
  printf("pong from kvcached %s (protocol %u, conn %" PRIu64 ") in %ld us\n",
         info.server_version, info.protocol_version, info.conn_id, us);
  return 0;
}

/* ---- clients, config, admin writes ----------------------------------------------- */

/* "used/limit", or "used/-" for no limit. */
static void quota_cell(char *out, size_t len, uint64_t used, uint64_t limit) {
  if (limit) snprintf(out, len, "%" PRIu64 "/%" PRIu64, used, limit);
  else snprintf(out, len, "%" PRIu64 "/-", used);
}

/* The same in MiB (one decimal), for bytes of the pool. */
static void quota_cell_mib(char *out, size_t len, uint64_t used, uint64_t limit) {
  double u = (double)used / (1 << 20), l = (double)limit / (1 << 20);
  if (limit) snprintf(out, len, "%.1f/%.1f", u, l);
  else snprintf(out, len, "%.1f/-", u);
}

/* The same in human units without spaces (a column): 1.0MiB/1.0GiB. */
static void quota_cell_bytes(char *out, size_t len, uint64_t used, uint64_t limit) {
  char u[32], l[32];
  human_bytes((double)used, u, sizeof u);
  human_bytes((double)limit, l, sizeof l);
  for (char *p = u; (p = strchr(p, ' '));) memmove(p, p + 1, strlen(p));
  for (char *p = l; (p = strchr(p, ' '));) memmove(p, p + 1, strlen(p));
  snprintf(out, len, "%s/%s", u, limit ? l : "-");
}

/* Usage against each quota (used/limit, "-" for unlimited) and the refusals
 * of each, per tenant. */
static void tenants_quotas(const kvc_tenant_info_t *t, size_t n) {
  printf("\n%-24s %-6s %-17s %-15s %-13s %-13s %-11s %-9s %s\n", "TENANT", "LIMIT",
         "POOL_MIB", "PIN+LEASE_MIB", "SEQS", "CACHES", "KEYS", "CONNS/UID", "SHM");
  for (size_t i = 0; i < n; i++) {
    char a[64], b[48], s[40], cc[40], k[40], sh[72];
    quota_cell_mib(a, sizeof a, t[i].pool_bytes, t[i].max_bytes);
    if (t[i].min_bytes) /* the floor after the share: used/share>=floor */
      snprintf(a + strlen(a), sizeof a - strlen(a), ">=%.1f", (double)t[i].min_bytes / (1 << 20));
    quota_cell_mib(b, sizeof b, t[i].pinned_bytes + t[i].leased_bytes, t[i].max_pinned_bytes);
    quota_cell(s, sizeof s, t[i].sequences, t[i].max_sequences);
    quota_cell(cc, sizeof cc, t[i].caches, t[i].max_caches);
    quota_cell(k, sizeof k, t[i].keys, t[i].max_keys);
    quota_cell_bytes(sh, sizeof sh, t[i].shm_bytes, t[i].shm_bytes_per_uid);
    printf("%-24s %-6s %-17s %-15s %-13s %-13s %-11s %-9u %s\n", t[i].name, "used", a, b, s,
           cc, k, t[i].max_connections_per_uid, sh);
    printf("%-24s %-6s %-17" PRIu64 " %-15" PRIu64 " %-13" PRIu64 " %-13" PRIu64 " %-11" PRIu64
           " %-9" PRIu64 " %" PRIu64 "\n", "", "refuse", t[i].refused_pages, t[i].refused_pins,
           t[i].refused_sequences, t[i].refused_caches, t[i].refused_keys,
           t[i].refused_connections, t[i].refused_shm);
  }
}

static int cmd_tenants(kvc_client_t *c, const opts_t *o) {
  kvc_tenant_info_t *t;
  size_t n = 0;
  int rc = kvc_tenants(c, &t, &n);
  if (rc) return fail(c, rc, "tenants");
  if (o->json) printf("{\"tenants\": [");
  else
    printf("%-24s %6s %6s %10s %12s %10s\n", "TENANT", "CONNS", "CACHES", "SEQS", "TOKENS",
           "PAGES");
  for (size_t i = 0; i < n; i++) {
    if (o->json) {
      printf("%s\n  {\"name\": ", i ? "," : "");
      json_string(t[i].name);
      printf(", \"connections\": %u, \"caches\": %u, \"sequences\": %" PRIu64
             ", \"tokens\": %" PRIu64 ", \"pages\": %" PRIu64 ", \"pool_pages\": %" PRIu64
             ", \"pool_bytes\": %" PRIu64 ", \"max_bytes\": %" PRIu64 ", \"min_bytes\": %" PRIu64
             ", \"pinned_bytes\": %" PRIu64
             ", \"leased_bytes\": %" PRIu64 ", \"max_pinned_bytes\": %" PRIu64
             ", \"max_sequences\": %" PRIu64 ", \"max_caches\": %" PRIu64 ", \"keys\": %" PRIu64
             ", \"max_keys\": %" PRIu64 ", \"refused\": {\"pages\": %" PRIu64
             ", \"pins\": %" PRIu64 ", \"sequences\": %" PRIu64 ", \"caches\": %" PRIu64
             ", \"keys\": %" PRIu64 ", \"connections\": %" PRIu64 ", \"shm\": %" PRIu64 "}}",
             t[i].connections, t[i].caches, t[i].sequences, t[i].tokens, t[i].pages,
             (uint64_t)t[i].pool_pages, (uint64_t)t[i].pool_bytes, (uint64_t)t[i].max_bytes,
             (uint64_t)t[i].min_bytes, (uint64_t)t[i].pinned_bytes,
             (uint64_t)t[i].leased_bytes, (uint64_t)t[i].max_pinned_bytes,
             (uint64_t)t[i].max_sequences, (uint64_t)t[i].max_caches, (uint64_t)t[i].keys,
             (uint64_t)t[i].max_keys, (uint64_t)t[i].refused_pages, (uint64_t)t[i].refused_pins,
             (uint64_t)t[i].refused_sequences, (uint64_t)t[i].refused_caches,
             (uint64_t)t[i].refused_keys, (uint64_t)t[i].refused_connections,
             (uint64_t)t[i].refused_shm);
      continue;
    }
    printf("%-24s %6u %6u %10" PRIu64 " %12" PRIu64 " %10" PRIu64 "\n", t[i].name,
           t[i].connections, t[i].caches, t[i].sequences, t[i].tokens, t[i].pages);
  }
  if (o->json) printf("\n]}\n");
  else tenants_quotas(t, n);
  kvc_tenants_free(t);
  return 0;
}

static int cmd_clients(kvc_client_t *c, const opts_t *o) {
  kvc_client_entry_t *v;
  size_t n;
  int rc = kvc_clients(c, &v, &n);
  if (rc) return fail(c, rc, "clients");
  if (o->json) printf("{\"clients\": [");
  else
    printf("%6s %8s %6s %-10s %-16s %5s %6s %9s %9s %9s %9s\n", "ID", "PID", "UID", "TENANT",
           "NAME", "PINS", "LEASES", "BUFFER", "REQUESTS", "AGE", "IDLE");
  for (size_t i = 0; i < n; i++) {
    const kvc_client_entry_t *e = &v[i];
    if (o->json) {
      printf("%s\n  {\"id\": %" PRIu64 ", \"pid\": %d, \"uid\": %u, \"gid\": %u, \"tenant\": ",
             i ? "," : "", e->conn_id, (int)e->pid, e->uid, e->gid);
      json_string(e->tenant);
      printf(", \"name\": ");
      json_string(e->name);
      printf(", \"pins\": %u, \"leases\": %u, \"shm_bytes\": %" PRIu64 ", \"requests\": %" PRIu64
             ", \"age_seconds\": %.3f, \"idle_seconds\": %.3f, \"queued_bytes\": %" PRIu64
             ", \"self\": %s}",
             e->pins, e->leases, e->shm_bytes, e->requests, (double)e->age_ms / 1e3,
             (double)e->idle_ms / 1e3, e->wq_bytes, e->self ? "true" : "false");
      continue;
    }
    char buf[32], age[32], idle[32], req[32];
    printf("%6" PRIu64 " %8d %6u %-10s %-16.16s %5u %6u %9s %9s %9s %9s%s\n", e->conn_id,
           (int)e->pid, e->uid, e->tenant[0] ? e->tenant : "-", e->name[0] ? e->name : "-",
           e->pins, e->leases, human_bytes((double)e->shm_bytes, buf, sizeof buf),
           human_count((double)e->requests, req, sizeof req),
           human_seconds((double)e->age_ms / 1e3, age, sizeof age),
           human_seconds((double)e->idle_ms / 1e3, idle, sizeof idle), e->self ? " (this)" : "");
  }
  if (o->json) printf("\n]}\n");
  free(v);
  return 0;
}

static bool parse_size(const char *s, uint64_t *out);

/* A value of the configuration as JSON: true or false; the uid and gid
 * lists as arrays of numbers; a number (sizes in bytes); else the text as a
 * string (a path, a list, a mode such as 0660). */
static void json_config_value(const char *key, const char *v) {
  size_t kl = strlen(key);
  uint64_t n;
  if (strcmp(v, "true") == 0 || strcmp(v, "false") == 0) {
    printf("%s", v);
  } else if (kl > 5 && (strcmp(key + kl - 5, "_uids") == 0 || strcmp(key + kl - 5, "_gids") == 0)) {
    printf("[");
    for (const char *p = v; *p; p += strcspn(p, ",")) {
      if (*p == ',') p++;
      printf("%s%llu", p > v ? ", " : "", strtoull(p, NULL, 10));
    }
    printf("]");
  } else if ((v[0] != '0' || !v[1]) && parse_size(v, &n)) {
    printf("%" PRIu64, n);
  } else {
    json_string(v);
  }
}

static int cmd_config(kvc_client_t *c, const opts_t *o) {
  kvc_label_t *v;
  size_t n;
  int rc = kvc_config(c, &v, &n);
  if (rc) return fail(c, rc, "config");
  if (o->json) printf("{");
  else printf("# the configuration of the running kvcached (kvcachectl config)\n");
  for (size_t i = 0; i < n; i++) {
    if (o->json) {
      printf("%s\n  ", i ? "," : "");
      json_string(v[i].key);
      printf(": ");
      json_config_value(v[i].key, v[i].value);
    } else {
      bool quote = !v[i].value[0] || strpbrk(v[i].value, " \t#\"");
      printf("%s = %s%s%s\n", v[i].key, quote ? "\"" : "", v[i].value, quote ? "\"" : "");
    }
  }
  if (o->json) printf("\n}\n");
  free(v);
  return 0;
}

static int admin_write(kvc_client_t *c, const opts_t *o, kvc_admin_action_t act,
                       const char *what) {
  uint64_t seq = 0, conn = 0, count = 0;
  const char *cache = NULL;
  if (act == KVC_ADMIN_DISCONNECT) {
    if (!parse_u64(o->pos[0], &conn)) return bad_number(what, "CONN_ID", o->pos[0]);
  } else {
    cache = o->pos[0];
    if (act != KVC_ADMIN_DROP_CACHE && !parse_u64(o->pos[1], &seq))
      return bad_number(what, "SEQ", o->pos[1]);
  }
  int rc = kvc_admin(c, act, cache, seq, conn, &count);
  if (rc) return fail(c, rc, what);
  switch (act) {
  case KVC_ADMIN_DROP_CACHE: printf("dropped cache %s\n", cache); break;
  case KVC_ADMIN_REMOVE_SEQ: printf("removed sequence %" PRIu64 " of %s\n", seq, cache); break;
  case KVC_ADMIN_UNPIN_SEQ:
    printf("released %" PRIu64 " pin%s of sequence %" PRIu64 " of %s\n", count,
           count == 1 ? "" : "s", seq, cache);
    break;
  case KVC_ADMIN_DISCONNECT: printf("disconnected client %" PRIu64 "\n", conn); break;
  }
  return 0;
}

static int cmd_drop(kvc_client_t *c, const opts_t *o) {
  return admin_write(c, o, KVC_ADMIN_DROP_CACHE, "drop");
}
static int cmd_remove(kvc_client_t *c, const opts_t *o) {
  return admin_write(c, o, KVC_ADMIN_REMOVE_SEQ, "remove");
}
static int cmd_unpin(kvc_client_t *c, const opts_t *o) {
  return admin_write(c, o, KVC_ADMIN_UNPIN_SEQ, "unpin");
}
static int cmd_disconnect(kvc_client_t *c, const opts_t *o) {
  return admin_write(c, o, KVC_ADMIN_DISCONNECT, "disconnect");
}

/* A size with binary units, as the daemon's options read it: 8GiB, 512M. */
static bool parse_size(const char *s, uint64_t *out) {
  static const struct { const char *u; uint64_t mul; } units[] = {
      {"", 1}, {"B", 1}, {"K", 1ull << 10}, {"KiB", 1ull << 10}, {"M", 1ull << 20},
      {"MiB", 1ull << 20}, {"G", 1ull << 30}, {"GiB", 1ull << 30}, {"T", 1ull << 40},
      {"TiB", 1ull << 40}};
  if (!s || *s < '0' || *s > '9') return false;
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno) return false;
  for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
    if (strcmp(end, units[i].u) == 0 && v <= UINT64_MAX / units[i].mul) {
      *out = (uint64_t)v * units[i].mul;
      return true;
    }
  return false;
}

/* The pool's figures and one row an arena, from the stats. */
static int pool_show(kvc_client_t *c, const opts_t *o) {
  kvc_stat_t *st;
  size_t n;
  int rc = kvc_stats(c, &st, &n);
  if (rc) return fail(c, rc, "stats");
  uint64_t g[6] = {0};
  static const char *const gn[6] = {"pool_bytes", "segment_bytes", "segments", "segments_free",
                                    "arenas", "pool_revoked_bytes"};
  for (size_t i = 0; i < n; i++)
    for (int k = 0; k < 6; k++)
      if (!st[i].cache[0] && !st[i].nlabels && strcmp(st[i].name, gn[k]) == 0) g[k] = st[i].value;
  static const char *const an[6] = {"arena_segments", "arena_pages_used", "arena_pages_free",
                                    "arena_padding_bytes", "arena_segments_taken_total",
                                    "arena_segments_given_total"};
  if (o->json) {
    printf("{");
    for (int k = 0; k < 6; k++) /* the arenas' number: the array's length */
      if (k != 4) printf("%s\"%s\": %" PRIu64, k ? ", " : "", gn[k], g[k]);
    printf(", \"arenas\": [");
  } else {
    char a[32], b[32], r[32];
    printf("pool: %s in %" PRIu64 " segments of %s, %" PRIu64 " free; %" PRIu64
           " arenas; revoked segments still mapped: %s\n",
           human_bytes((double)g[0], a, sizeof a), g[2], human_bytes((double)g[1], b, sizeof b),
           g[3], g[4], human_bytes((double)g[5], r, sizeof r));
    printf("%-24s %12s %9s %11s %11s %12s %8s %8s\n", "TENANT", "PAGE_BYTES", "SEGMENTS",
           "PAGES_USED", "PAGES_FREE", "PADDING", "TAKEN", "GIVEN");
  }
  /* Rows: the samples of arena_segments, each joined with its other figures. */
  size_t rows = 0;
  for (size_t i = 0; i < n; i++) {
    if (strcmp(st[i].name, an[0]) != 0) continue;
    const char *t = kvc_stat_label(&st[i], "tenant"), *pb = kvc_stat_label(&st[i], "page_bytes");
    uint64_t v[6] = {st[i].value};
    for (size_t j = 0; j < n; j++)
      for (int k = 1; k < 6; k++)
        if (strcmp(st[j].name, an[k]) == 0 && t && pb && kvc_stat_label(&st[j], "tenant") &&
            kvc_stat_label(&st[j], "page_bytes") &&
            strcmp(kvc_stat_label(&st[j], "tenant"), t) == 0 &&
            strcmp(kvc_stat_label(&st[j], "page_bytes"), pb) == 0)
          v[k] = st[j].value;
    if (o->json) {
      printf("%s{\"tenant\": ", rows ? ", " : "");
      json_string(t ? t : "");
      printf(", \"page_bytes\": %s, \"segments\": %" PRIu64 ", \"pages_used\": %" PRIu64
             ", \"pages_free\": %" PRIu64 ", \"padding_bytes\": %" PRIu64
             ", \"segments_taken\": %" PRIu64 ", \"segments_given\": %" PRIu64 "}",
             pb ? pb : "0", v[0], v[1], v[2], v[3], v[4], v[5]);
    } else {
      char pbh[32], pad[32];
      printf("%-24s %12s %9" PRIu64 " %11" PRIu64 " %11" PRIu64 " %12s %8" PRIu64 " %8" PRIu64
             "\n", t ? t : "?", human_bytes(pb ? strtod(pb, NULL) : 0, pbh, sizeof pbh), v[0],
             v[1], v[2], human_bytes((double)v[3], pad, sizeof pad), v[4], v[5]);
    }
    rows++;
  }
  if (o->json) printf("]}\n");
  kvc_stats_free(st);
  return 0;
}

static int cmd_pool(kvc_client_t *c, const opts_t *o) {
  uint64_t bytes;
  if (o->npos == 0) return pool_show(c, o);
  if (strcmp(o->pos[0], "resize") != 0 || o->npos != 2) {
    fprintf(stderr, "%s: pool: unknown subcommand '%s'\n", prog, o->pos[0]);
    command_usage(stderr, find_command("pool"), false);
    return 2;
  }
  if (!parse_size(o->pos[1], &bytes)) {
    fprintf(stderr, "%s: pool resize: SIZE must be a size like 8GiB, got '%s'\n", prog,
            o->pos[1]);
    command_usage(stderr, find_command("pool"), false);
    return 2;
  }
  kvc_pool_resize_t r;
  int rc = kvc_pool_resize(c, bytes, &r);
  if (rc) return fail(c, rc, "pool resize");
  char size[32];
  printf("pool: %s in %u segment%s (moved %" PRIu64 " pages, evicted %" PRIu64
         ", %.1f ms, the daemon's loop held %.1f ms)\n", human_bytes((double)r.bytes, size,
         sizeof size), r.segments, r.segments == 1 ? "" : "s", r.moved_pages, r.evicted_pages,
         (double)r.elapsed_us / 1000, (double)r.loop_us / 1000);
  return 0;
}

/* ---- events ------------------------------------------------------------------- */

static void print_hash(const uint8_t *h, uint32_t len, bool whole) {
  if (!len) {
    fputc('-', stdout);
    return;
  }
  for (uint32_t i = 0; i < (whole ? len : 8u); i++) printf("%02x", h[i]);
}

static void print_event(const kvc_event_t *ev, bool raw) {
  static const char *const kinds[] = {"stored", "removed", "cleared", "dropped", "reset"};
  if (ev->missed) printf("missed %" PRIu64 " batches (not read fast enough)\n", ev->missed);
  if (ev->kind == KVC_EVENT_RESET) {
    printf("reset seq=%" PRIu64 " (events were lost: forget what came before)\n", ev->seq);
    return;
  }
  printf("%-7s cache=%s tenant=%s", kinds[ev->kind], ev->cache, ev->tenant);
  if (ev->kind == KVC_EVENT_STORED || ev->kind == KVC_EVENT_REMOVED) {
    printf(" hash=");
    print_hash(ev->hash, ev->hash_len, raw);
  }
  if (ev->kind == KVC_EVENT_STORED) {
    printf(" parent=");
    print_hash(ev->parent, ev->parent_len, raw);
    printf(" block=%u", ev->block_size);
  }
  if (ev->kind == KVC_EVENT_STORED || ev->kind == KVC_EVENT_REMOVED) printf(" medium=%s", ev->medium);
  printf(" seq=%" PRIu64, ev->seq);
  if (raw && ev->kind == KVC_EVENT_STORED) {
    printf(" tokens=");
    for (uint32_t i = 0; i < ev->ntokens; i++) printf("%s%u", i ? "," : "", ev->token_ids[i]);
  }
  putchar('\n');
}

static int cmd_events(kvc_client_t *c, const opts_t *o) {
  int rc = kvc_events_subscribe(c, o->cache, o->raw);
  if (rc) return fail(c, rc, "subscribe");
  /* The first line says the subscription holds: what happens from now on
   * is shown (a script may wait for it before acting). */
  printf("# subscribed to %s%s; Ctrl-C stops\n", o->cache ? "cache " : "every cache you may see",
         o->cache ? o->cache : "");
  fflush(stdout);
  for (long n = 0; !o->count || n < o->count; n++) {
    kvc_event_t ev;
    if ((rc = kvc_events_next(c, -1, &ev))) return fail(c, rc, "events");
    print_event(&ev, o->raw);
    fflush(stdout);
  }
  return 0;
}

/* ---- top --------------------------------------------------------------------- */

static volatile sig_atomic_t top_stop;
static struct termios top_saved;
static bool top_raw;

static void on_signal(int sig) {
  (void)sig;
  top_stop = 1;
}

static void term_restore(void) {
  if (!top_raw) return;
  /* Cursor back, the main screen back, the modes as they were. */
  fputs("\033[?25h\033[?1049l", stdout);
  fflush(stdout);
  tcsetattr(STDIN_FILENO, TCSAFLUSH, &top_saved);
  top_raw = false;
}

static double mono_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A figure's growth per second since prev (lifetime average without prev). */
static double rate_of(const figs_t *cur, const figs_t *prev, double dt, const char *name,
                      const char *cache, const char *key, const char *val) {
  const kvc_stat_t *a = fig(cur, name, cache, key, val);
  if (!a) return 0;
  if (!prev) {
    double up = figv(cur, "uptime_seconds");
    return up > 0 ? (double)a->value / up : 0;
  }
  const kvc_stat_t *b = fig(prev, name, cache, key, val);
  double d = (double)a->value - (b ? (double)b->value : 0);
  return dt > 0 && d > 0 ? d / dt : 0;
}

typedef struct ranked {
  double key;
  size_t idx;
} ranked_t;

static int by_key_desc(const void *a, const void *b) {
  double x = ((const ranked_t *)a)->key, y = ((const ranked_t *)b)->key;
  return x < y ? 1 : x > y ? -1 : 0;
}

static void top_frame(kvc_client_t *c, const figs_t *cur, const figs_t *prev, double dt,
                      kvc_client_entry_t *cl, size_t ncl, const kvc_client_entry_t *pcl,
                      size_t npcl, int cl_rc, double interval, bool tty) {
  char a[32], b[32], d[32], e[32], g[32];
  const char *eol = tty ? "\033[K\n" : "\n";
  const kvc_stat_t *bi = fig(cur, "build_info", NULL, NULL, NULL);
  double req = 0, err = 0;
  for (size_t i = 0; i < cur->n; i++) {
    const kvc_stat_t *s = &cur->st[i];
    if (strcmp(s->name, "requests_total") == 0)
      req += rate_of(cur, prev, dt, s->name, "", "op", kvc_stat_label(s, "op"));
  }
  for (size_t i = 0; i < cur->n; i++) {
    const kvc_stat_t *s = &cur->st[i];
    if (strcmp(s->name, "request_errors_total") != 0) continue;
    const kvc_stat_t *p = NULL;
    for (size_t j = 0; prev && j < prev->n && !p; j++) {
      const kvc_stat_t *t = &prev->st[j];
      if (strcmp(t->name, s->name) == 0 &&
          strcmp(kvc_stat_label(t, "op"), kvc_stat_label(s, "op")) == 0 &&
          strcmp(kvc_stat_label(t, "status"), kvc_stat_label(s, "status")) == 0)
        p = t;
    }
    double up = figv(cur, "uptime_seconds");
    err += prev ? (dt > 0 ? ((double)s->value - (p ? (double)p->value : 0)) / dt : 0)
                : (up > 0 ? (double)s->value / up : 0);
  }
  double q = rate_of(cur, prev, dt, "prefix_tokens_queried_total", "", NULL, NULL);
  double hit = rate_of(cur, prev, dt, "prefix_tokens_hit_total", "", NULL, NULL);
  double total = figv(cur, "pool_pages"), freep = figv(cur, "pages_free");
  if (tty) fputs("\033[H", stdout);
  printf("kvcached %s  up %s  %s clients  every %.1fs%s%s",
         bi && kvc_stat_label(bi, "version") ? kvc_stat_label(bi, "version") : "?",
         human_seconds(figv(cur, "uptime_seconds"), a, sizeof a),
         human_count(figv(cur, "connections_current"), b, sizeof b), interval,
         tty ? "  (q quits)" : "", eol);
  printf("%s", eol);
  printf("requests %10s/s   errors %8s/s   prefix hit rate %s%s",
         human_count(req, a, sizeof a), human_count(err, b, sizeof b),
         q > 0 ? (snprintf(d, sizeof d, "%.1f%%", 100.0 * hit / q), d) : "-", eol);
  printf("pages    %10s total  %s free (%.1f%%)  %s pinned  %s shared%s",
         human_count(total, a, sizeof a), human_count(freep, b, sizeof b),
         total > 0 ? 100.0 * freep / total : 0.0,
         human_count(figv(cur, "pages_pinned"), d, sizeof d),
         human_count(figv(cur, "pages_shared"), e, sizeof e), eol);
  printf("evictions %9s seqs/s %s pages/s   full %s/s   in %s/s  out %s/s%s",
         human_count(rate_of(cur, prev, dt, "evicted_sequences_total", "", NULL, NULL), a, sizeof a),
         human_count(rate_of(cur, prev, dt, "evicted_pages_total", "", NULL, NULL), b, sizeof b),
         human_count(rate_of(cur, prev, dt, "full_errors_total", "", NULL, NULL), d, sizeof d),
         human_bytes(rate_of(cur, prev, dt, "bytes_in_total", "", NULL, NULL), e, sizeof e),
         human_bytes(rate_of(cur, prev, dt, "bytes_out_total", "", NULL, NULL), g, sizeof g), eol);
  /* The busiest operations. */
  ranked_t r[256];
  size_t nr = 0;
  for (size_t i = 0; i < cur->n && nr < 256; i++)
    if (strcmp(cur->st[i].name, "requests_total") == 0)
      r[nr++] = (ranked_t){rate_of(cur, prev, dt, "requests_total", "", "op",
                                   kvc_stat_label(&cur->st[i], "op")), i};
  qsort(r, nr, sizeof *r, by_key_desc);
  printf("%s%-16s %10s %10s%s", eol, "OP", "REQ/S", "P99", eol);
  for (size_t i = 0; i < nr && i < 6; i++) {
    if (r[i].key <= 0 && i > 0) break;
    const char *op = kvc_stat_label(&cur->st[r[i].idx], "op");
    printf("%-16s %10s %10s%s", op, human_count(r[i].key, a, sizeof a),
           human_seconds(hist_quantile(fig(cur, "request_duration_seconds", "", "op", op), 0.99),
                         b, sizeof b), eol);
  }
  /* The busiest caches, by puts and gets per second. */
  nr = 0;
  for (size_t i = 0; i < cur->n && nr < 256; i++) {
    if (strcmp(cur->st[i].name, "cache_sequences") != 0) continue;
    const char *cn = cur->st[i].cache;
    r[nr++] = (ranked_t){rate_of(cur, prev, dt, "cache_puts_total", cn, NULL, NULL) +
                             rate_of(cur, prev, dt, "cache_gets_total", cn, NULL, NULL), i};
  }
  qsort(r, nr, sizeof *r, by_key_desc);
  printf("%s%-20s %9s %9s %9s %9s %9s%s", eol, "CACHE", "SEQS", "PAGES", "PUTS/S", "GETS/S",
         "EVICT/S", eol);
  for (size_t i = 0; i < nr && i < 6; i++) {
    const char *cn = cur->st[r[i].idx].cache;
    char f2[32];
    printf("%-20.20s %9s %9s %9s %9s %9s%s", cn,
           human_count((double)cur->st[r[i].idx].value, a, sizeof a),
           human_count(fam_sum(cur, "cache_pages", cn), b, sizeof b),
           human_count(rate_of(cur, prev, dt, "cache_puts_total", cn, NULL, NULL), d, sizeof d),
           human_count(rate_of(cur, prev, dt, "cache_gets_total", cn, NULL, NULL), e, sizeof e),
           human_count(rate_of(cur, prev, dt, "cache_evicted_sequences_total", cn, NULL, NULL),
                       f2, sizeof f2), eol);
  }
  /* The busiest clients (admins). */
  printf("%s%6s %8s %6s %-16s %9s %5s %6s%s", eol, "ID", "PID", "UID", "CLIENT", "REQ/S",
         "PINS", "LEASES", eol);
  if (cl_rc) {
    printf("(clients: %s)%s", cl_rc == KVC_E_PERM ? "for admins only" : kvc_strerror(cl_rc), eol);
  } else {
    nr = 0;
    for (size_t i = 0; i < ncl && nr < 256; i++) {
      double rr = 0;
      const kvc_client_entry_t *p = NULL;
      for (size_t j = 0; j < npcl && !p; j++)
        if (pcl[j].conn_id == cl[i].conn_id) p = &pcl[j];
      if (p && dt > 0) rr = (double)(cl[i].requests - p->requests) / dt;
      else if (cl[i].age_ms) rr = (double)cl[i].requests / ((double)cl[i].age_ms / 1e3);
      r[nr++] = (ranked_t){rr, i};
    }
    qsort(r, nr, sizeof *r, by_key_desc);
    for (size_t i = 0; i < nr && i < 8; i++) {
      const kvc_client_entry_t *x = &cl[r[i].idx];
      printf("%6" PRIu64 " %8d %6u %-16.16s %9s %5u %6u%s", x->conn_id, (int)x->pid, x->uid,
             x->name[0] ? x->name : "-", human_count(r[i].key, a, sizeof a), x->pins, x->leases,
             eol);
    }
  }
  (void)c;
  if (tty) fputs("\033[J", stdout);
  fflush(stdout);
}

/* The caches `top` ranks by their rates: those holding the most pages (the
 * most a reply may hold would be a large reply every frame). */
#define TOP_CACHES 100

static int cmd_top(kvc_client_t *c, const opts_t *o) {
  double interval = o->interval > 0 ? o->interval : 1.0;
  bool tty = isatty(STDOUT_FILENO) && isatty(STDIN_FILENO);
  long frames = o->count ? o->count : tty ? 0 : 1;
  if (tty) {
    if (tcgetattr(STDIN_FILENO, &top_saved) != 0) return die("top: %s", strerror(errno));
    struct termios raw = top_saved;
    raw.c_lflag &= ~(tcflag_t)(ICANON | ECHO);
    raw.c_cc[VMIN] = 0;
    raw.c_cc[VTIME] = 0;
    tcsetattr(STDIN_FILENO, TCSAFLUSH, &raw);
    top_raw = true;
    atexit(term_restore);
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    /* The alternate screen, cursor hidden, cleared. */
    fputs("\033[?1049h\033[?25l\033[2J", stdout);
  }
  figs_t prev = {0}, cur;
  kvc_client_entry_t *pcl = NULL, *cl = NULL;
  size_t npcl = 0, ncl = 0;
  double tprev = 0;
  int rc = 0;
  for (long k = 0; !top_stop && (frames == 0 || k < frames); k++) {
    if ((rc = kvc_stats_query(c, &(kvc_stats_opts_t){.top = TOP_CACHES}, &cur.st, &cur.n)) != 0)
      break;
    /* A non-admin is refused once: not asked again every frame. */
    static int cl_rc = 0;
    if (cl_rc != KVC_E_PERM) cl_rc = kvc_clients(c, &cl, &ncl);
    if (cl_rc) cl = NULL, ncl = 0;
    double t = mono_now();
    top_frame(c, &cur, prev.st ? &prev : NULL, t - tprev, cl, ncl, pcl, npcl, cl_rc, interval,
              tty);
    kvc_stats_free(prev.st);
    free(pcl);
    prev = cur;
    pcl = cl;
    npcl = ncl;
    tprev = t;
    if (frames && k + 1 >= frames) break;
    /* Wait for the interval, or q. */
    double until = t + interval;
    while (!top_stop) {
      double left = until - mono_now();
      if (left <= 0) break;
      struct pollfd p = {.fd = STDIN_FILENO, .events = POLLIN};
      int pr = poll(tty ? &p : NULL, tty ? 1 : 0, (int)(left * 1000) + 1);
      if (pr > 0 && (p.revents & POLLIN)) {
        char ch;
        if (read(STDIN_FILENO, &ch, 1) == 1 && (ch == 'q' || ch == 'Q' || ch == 3)) top_stop = 1;
      }
    }
  }
  kvc_stats_free(prev.st);
  free(pcl);
  term_restore();
  if (rc) return fail(c, rc, "top");
  return 0;
}

/* ---- main ----------------------------------------------------------------------- */

static const struct command *find_command(const char *name) {
  for (size_t i = 0; i < NCOMMANDS; i++)
    if (strcmp(commands[i].name, name) == 0) return &commands[i];
  return NULL;
}

int main(int argc, char **argv) {
  static const struct option global[] = {
      {"socket", required_argument, NULL, 's'},
      {"help", no_argument, NULL, 'h'},
      {"version", no_argument, NULL, 'V'},
      {0, 0, 0, 0},
  };
  opts_t o = {0};
  opterr = 0;
  int ch;
  /* "+": the first word that is not an option is the command. */
  while ((ch = getopt_long(argc, argv, "+:hVs:", global, NULL)) != -1) {
    switch (ch) {
    case 's': o.socket = optarg; break;
    case 'h': usage(stdout); return 0;
    case 'V': printf("kvcachectl %s (protocol %d)\n", KVC_VERSION_STRING, KVC_PROTOCOL_VERSION); return 0;
    case ':': return bad_usage(NULL, "%s needs a value", argv[optind - 1]);
    default: return bad_usage(NULL, "%s: unknown option before the command", argv[optind - 1]);
    }
  }
  if (optind >= argc) return bad_usage(NULL, "%s", "no command");
  const char *name = argv[optind];
  if (strcmp(name, "help") == 0) {
    if (optind + 1 >= argc) {
      usage(stdout);
      return 0;
    }
    const struct command *cmd = find_command(argv[optind + 1]);
    if (!cmd || optind + 2 < argc) return bad_usage(NULL, "help: no command '%s'", argv[optind + 1]);
    command_usage(stdout, cmd, true);
    return 0;
  }
  const struct command *cmd = find_command(name);
  if (!cmd) return bad_usage(NULL, "unknown command '%s'", name);
  int prc = parse_command(cmd, argc - optind, argv + optind, &o);
  if (prc) return prc;
  /* A small buffer: kvcachectl moves no tensor bytes. */
  kvc_client_opts_t copts = {.socket_path = o.socket, .shm_bytes = 1u << 20,
                             .timeout_ms = 10000, .client_name = "kvcachectl"};
  kvc_client_t *c;
  int rc = kvc_client_open(&copts, &c);
  if (rc) return fail(NULL, rc, "cannot connect");
  rc = cmd->fn(c, &o);
  kvc_client_close(c);
  return rc;
}
