/* config.c: the option table of kvcached, and every way a value goes in
 * (config_set) or out (--print-config, --help, the example file, a reload). */
#include "config.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <arpa/inet.h>
#include <unistd.h>

#include "engine.h"
#include "kvcache/kvcache.h"
#include "log.h"
#include "sockpath.h"
#include "units.h"

enum opt_type {
  OPT_PATH,  /* socket path; "auto" picks the per-user default */
  OPT_MODE,  /* octal permission bits */
  OPT_SIZE,  /* bytes, with units */
  OPT_U32,
  OPT_U64,
  OPT_UIDS,  /* comma list of uids, "self", "root" */
  OPT_GIDS,  /* comma list of gids, "self", "root"; empty allowed */
  OPT_TENANTS, /* tenant rules: NAME=uid:N,gid:N; ... (tenant.h) */
  OPT_SHARED,  /* shared caches: CACHE=TENANT:r|rw,...; ... */
  OPT_FLOORS,  /* tenant floors: NAME=PCT,NAME2=PCT */
  OPT_TENANT,  /* one tenant name, or empty */
  OPT_LEVEL, /* log level name */
  OPT_HASH,  /* sha256 or xxh3 */
  OPT_BOOL,  /* true/false, yes/no, on/off, 1/0 */
  OPT_LISTEN,/* HOST:PORT, [V6]:PORT, :PORT (loopback); empty: off */
  OPT_DIR,   /* an absolute directory path; empty: off */
  OPT_TEXT,  /* text of at most max - 1 bytes, no quote or newline */
  OPT_ENUM,  /* one of the option's names; stored as its index (u32) */
  OPT_ENDPOINT, /* a ZeroMQ endpoint: tcp://HOST:PORT or ipc://PATH; empty: off */
  OPT_EVTENANT, /* a tenant name, "*" (every tenant) or empty */
  OPT_NODES, /* HOST:PORT,HOST:PORT,...; empty allowed */
  OPT_FILE,  /* a file path; empty allowed */
};

typedef struct option {
  const char *name;
  enum opt_type type;
  const char *def;   /* default, as text: parsed like any other value */
  uint64_t min, max; /* bounds for numbers and sizes */
  bool reloadable;   /* may change at run time (SIGHUP) */
  size_t off;        /* field in config_t */
  const char *help;
  const char *const *names; /* OPT_ENUM: its values, by index; NULL-terminated */
} option_t;

static const char *const events_formats[] = {"array", "map", NULL};
static const char *const cluster_writes[] = {"indexed", "evicted", "off", NULL};
static const char *const events_hashes[] = {"chain", "vllm", NULL};

#define KiB 1024ull
#define MiB (1024ull * KiB)
#define GiB (1024ull * MiB)
#define TiB (1024ull * GiB)
#define F(field) offsetof(config_t, field)

static const option_t options[] = {
  {"socket", OPT_PATH, "auto", 0, 0, false, F(socket_path),
   "Unix socket path (auto: $KVCACHED_SOCKET if set, the variable clients read too, else "
   "$RUNTIME_DIRECTORY/kvcached.sock under systemd, /run/kvcached/kvcached.sock as root, "
   "else $XDG_RUNTIME_DIR/kvcached.sock, else /tmp/kvcached-UID/kvcached.sock); ignored "
   "when systemd passes the socket"},
  {"socket_mode", OPT_MODE, "0660", 0, 0777, false, F(socket_mode),
   "permission bits of the socket file (set through the umask at bind)"},
  {"pool_bytes", OPT_SIZE, "1GiB", 1 * MiB, 64 * TiB, true, F(pool_bytes),
   "bytes of the shared page pool, backed at start; a reload resizes it online (a grow adds "
   "a segment, a shrink releases whole segments from the end: doc/tiers.md)"},
  {"page_bytes", OPT_SIZE, "0", 0, 1 * GiB, false, F(page_bytes),
   "deprecated: the pool of one page size (a multiple of 64): every cache page takes one "
   "page of it, padded (segment_bytes replaces it: pages of each cache's own size)"},
  {"segment_bytes", OPT_SIZE, "0", 0, 1 * GiB, false, F(segment_bytes),
   "bytes of one pool segment, the unit an arena (a tenant's caches of one page size) owns, "
   "and the largest cache page accepted; a multiple of 4KiB (0: 32MiB, at most a quarter "
   "of the pool, at least 2MiB)"},
  {"pool_reserve_bytes", OPT_SIZE, "0", 0, 64 * TiB, false, F(pool_reserve_bytes),
   "address space reserved for the pool: the most it may grow to online (0: the machine's "
   "memory)"},
  {"pool_huge_pages", OPT_BOOL, "true", 0, 0, false, F(pool_huge_pages),
   "back the pool with huge pages where the host offers them: hugetlbfs pages if reserved "
   "(vm.nr_hugepages), else transparent huge pages if shmem takes them; the figure "
   "pool_huge_pages says which"},
  {"max_caches", OPT_U32, "64", 1, 65536, false, F(max_caches),
   "caches the daemon may hold"},
  {"max_seqs", OPT_U64, "0", 0, UINT64_MAX, false, F(max_seqs),
   "sequences the daemon may hold (0: unlimited)"},
  {"shm_default_bytes", OPT_SIZE, "64MiB", 1 * MiB, 64 * GiB, true, F(shm_default_bytes),
   "shared buffer of a client that asks for the default"},
  {"shm_max_bytes", OPT_SIZE, "256MiB", 1 * MiB, 64 * GiB, true, F(shm_max_bytes),
   "largest shared buffer one client may get"},
  {"max_frame_bytes", OPT_SIZE, "64KiB", 1 * KiB, 64 * MiB, false, F(max_frame_bytes),
   "largest request frame; a larger one closes the connection"},
  {"max_decode_bytes", OPT_SIZE, "2MiB", 4 * KiB, 1 * GiB, true, F(max_decode_bytes),
   "heap one request may use when decoded; more closes the connection"},
  {"max_entries", OPT_U32, "4096", 1, 1u << 20, true, F(max_entries),
   "entries one put or get request may carry"},
  {"max_connections", OPT_U32, "256", 1, 1u << 20, true, F(max_connections),
   "concurrent clients; one more is refused with CONNLIMIT"},
  {"frames_per_turn", OPT_U32, "32", 1, 1u << 16, true, F(frames_per_turn),
   "requests one connection may run per event-loop turn"},
  {"turn_bytes", OPT_SIZE, "1MiB", 4 * KiB, 1 * GiB, true, F(turn_bytes),
   "bytes one connection may move per event-loop turn (frames read, tensor bytes copied "
   "on the loop, token ids matched); at least one request runs"},
  {"turn_us", OPT_U32, "200", 0, 1000000, true, F(turn_us),
   "microseconds one connection may run requests per event-loop turn before the others; "
   "at least one request runs; 0: no time bound"},
  {"write_queue_bytes", OPT_SIZE, "4MiB", 64 * KiB, 1 * GiB, true, F(write_queue_bytes),
   "pending reply bytes of one connection (frames and their write requests) that pause "
   "reading from it"},
  {"background_quiet_us", OPT_U32, "10000", 0, 1000000, true, F(background_quiet_us),
   "a client that has not read its replies runs one request every 10 ms while a client that "
   "reads its own made a request within this many microseconds, all of them once none has; "
   "0: never waits"},
  {"offload_bytes", OPT_SIZE, "512KiB", 0, 64 * GiB, true, F(offload_bytes),
   "a get or put of this many bytes or more is copied on a copy thread while other "
   "clients are connected; 0: never"},
  {"offload_quiet_us", OPT_U32, "10000", 0, 60000000, true, F(offload_quiet_us),
   "beside other clients a large get or put goes to the copy threads; while no request "
   "that was not one came within this long (no client it would stall), the loop takes "
   "queued shares of them itself too; 0: never"},
  {"offload_threads", OPT_U32, "0", 0, 256, false, F(offload_threads),
   "threads that copy large gets and puts; 0: as many as the CPUs the daemon may use "
   "(its affinity, capped by a cgroup cpu.max quota)"},
  {"rings", OPT_BOOL, "true", 0, 0, true, F(rings),
   "grant a client that asks shared-memory rings in its buffer for requests and replies "
   "(the socket stays for the handshake and as the fallback); new connections only"},
  {"ring_poll_us", OPT_U32, "100", 0, 100000, true, F(ring_poll_us),
   "most microseconds the event loop polls a connection's submission ring after a reply "
   "before it sleeps (each connection's time adapts below it: longer when its client "
   "came just after, shorter when it came much later or the loop was preempted); 0: never "
   "poll, clients wake the loop through their doorbell"},
  {"frame_timeout_ms", OPT_U32, "5000", 0, 3600000, true, F(frame_timeout_ms),
   "ms for a started request frame (or the Hello) to arrive whole; 0: no deadline"},
  {"allow_uids", OPT_UIDS, "self,root", 0, 0, true, F(allow_uids),
   "peer uids allowed to connect (comma list; self, root or numbers)"},
  {"allow_gids", OPT_GIDS, "", 0, 0, true, F(allow_gids),
   "peer gids allowed to connect, primary or supplementary (comma list; self, root or "
   "numbers; empty: none; under systemd, self is group kvcached)"},
  {"admin_uids", OPT_UIDS, "root", 0, 0, false, F(admin_uids),
   "peer uids that are admins: they see and may act on every tenant's caches and map the "
   "whole pool (root always is one)"},
  {"admin_gids", OPT_GIDS, "", 0, 0, false, F(admin_gids),
   "peer gids (primary or supplementary) whose members are admins; empty: none"},
  {"tenants", OPT_TENANTS, "", 0, 0, false, F(tenants_text),
   "named tenants: NAME=uid:N,gid:N,...; NAME2=... (a peer not named is the tenant uid:N "
   "of its uid; a uid rule wins over a group rule, else the first group rule)"},
  {"shared_caches", OPT_SHARED, "", 0, 0, false, F(shared_text),
   "caches several tenants share: CACHE=TENANT:r,TENANT2:rw; ... (r reads, rw writes too; "
   "a tenant without a grant opening that name gets its own cache)"},
  {"zero_copy_tenant", OPT_TENANT, "", 0, 0, false, F(zero_copy_tenant),
   "the one tenant of a single-tenant node: its clients map the pool for zero-copy reads "
   "and no other tenant may open a cache; empty: only admins map the pool"},
  {"drain_timeout_ms", OPT_U32, "10000", 100, 3600000, true, F(drain_timeout_ms),
   "longest graceful shutdown (ms); clients still connected then are closed"},
  {"status_interval_ms", OPT_U32, "5000", 100, 3600000, true, F(status_interval_ms),
   "period (ms) of the STATUS= line sent to systemd and of the eviction summary in the log"},
  {"log_level", OPT_LEVEL, "info", 0, 0, true, F(log_level),
   "error, warn, info or debug"},
  {"prefix_hash", OPT_HASH, "sha256", 0, 0, false, F(prefix_hash),
   "prefix index hash: sha256, or xxh3 (needs prefix_single_tenant = true)"},
  {"prefix_single_tenant", OPT_BOOL, "false", 0, 0, false, F(prefix_single_tenant),
   "declare that every client is one trusted tenant (allows prefix_hash = xxh3)"},
  {"pin_limit_pct", OPT_U32, "50", 1, 100, true, F(pin_limit_pct),
   "pinned pages (hard and TTL pins) at most this percent of the pool; lowered, the pins "
   "held stay and new ones are refused"},
  {"metrics_listen", OPT_LISTEN, "", 0, 0, false, F(metrics_listen),
   "serve GET /metrics (Prometheus text) over HTTP on HOST:PORT, e.g. 127.0.0.1:9464 "
   "(:PORT is loopback; port 0 picks one, logged); empty: off. Anyone who can reach it "
   "reads every figure: keep it on loopback or a trusted network"},
  {"tenant_max_pages_pct", OPT_U32, "75", 1, 100, true, F(tenant_max_pages_pct),
   "pool pages one tenant may hold, percent of the pool: a put of a tenant at its share "
   "evicts its own least recent data first (QUOTA_PAGES if it has none to give)"},
  {"tenant_max_pinned_pct", OPT_U32, "0", 0, 100, true, F(tenant_max_pinned_pct),
   "pages one tenant may hold pinned plus leased, percent of the pool (QUOTA_PINS), checked "
   "as pinned sequences grow too; 0: fair, a tenant pins at most the pin limit divided by "
   "the tenants with caches plus one (room for the next tenant), pinned plus leased within "
   "pin_limit_pct"},
  {"tenant_max_seqs", OPT_U64, "65536", 0, UINT64_MAX, true, F(tenant_max_seqs),
   "sequences of one tenant, empty ones included (QUOTA_SEQS; 0: unlimited)"},
  {"tenant_max_caches", OPT_U32, "16", 0, 65536, true, F(tenant_max_caches),
   "caches of one tenant (QUOTA_CACHES; 0: unlimited)"},
  {"tenant_max_keys", OPT_U32, "1024", 0, UINT32_MAX, true, F(tenant_max_keys),
   "distinct prefix salts and extra keys one tenant may have in use; unused ones are freed "
   "(QUOTA_KEYS; 0: unlimited)"},
  {"tenant_floors", OPT_FLOORS, "", 0, 0, true, F(floors_text),
   "pool pages guaranteed to named tenants, percent of the pool: NAME=PCT,NAME2=PCT; "
   "eviction for another tenant never takes a tenant below its floor (the floors sum to "
   "at most 100, each at most tenant_max_pages_pct); empty: none"},
  {"max_connections_per_uid", OPT_U32, "64", 0, 1u << 20, true, F(max_connections_per_uid),
   "concurrent clients of one uid, admins exempt (QUOTA_CONNS; 0: unlimited)"},
  {"idle_timeout_ms", OPT_U32, "0", 0, 604800000, true, F(idle_timeout_ms),
   "a connection that sends no request for this long is closed (its pins and leases go "
   "with it); 0: never"},
  {"shm_bytes_per_uid", OPT_SIZE, "1GiB", 1 * MiB, 64 * TiB, true, F(shm_bytes_per_uid),
   "shared-buffer bytes the connections of one uid may hold together (QUOTA_SHM)"},
  {"shm_bytes_total", OPT_SIZE, "8GiB", 1 * MiB, 64 * TiB, true, F(shm_bytes_total),
   "shared-buffer bytes all connections may hold together (QUOTA_SHM)"},
  {"disk_dir", OPT_DIR, "", 0, 0, false, F(disk_dir),
   "directory of the disk tier: prefix pages evicted from memory are written here and read "
   "back by a match, and a clean stop keeps the prefix index here for the next start "
   "(created mode 0700; it must be the daemon's own); empty: no disk tier"},
  {"disk_bytes", OPT_SIZE, "4GiB", 1 * MiB, 64 * TiB, true, F(disk_bytes),
   "bytes of page files the disk tier keeps, least recently used out first (a reload also "
   "lifts the lower bound a full file system set)"},
  {"tier_lookup_timeout_ms", OPT_U32, "1000", 1, 600000, true, F(tier_lookup_timeout_ms),
   "the longest a match or attach waits on any one tier below memory (the disk, the "
   "cluster): a lookup not over by then is let go (tier_errors_total{kind=\"timeout\"}) and "
   "the request runs with what the tiers before it brought back"},
  {"events_endpoint", OPT_ENDPOINT, "", 0, 0, false, F(events_endpoint),
   "publish every change of the prefix index as vLLM's KV events (ZeroMQ PUB, msgpack; "
   "doc/events.md) on this endpoint, bound: tcp://127.0.0.1:5557 or ipc:///run/kvcached/"
   "events; anyone who can connect reads the stream: keep it on loopback or a private "
   "directory; empty: off"},
  {"events_replay_endpoint", OPT_ENDPOINT, "", 0, 0, false, F(events_replay_endpoint),
   "the ZeroMQ ROUTER endpoint where subscribers ask for missed batches by sequence number, "
   "as vLLM's replay socket; empty: none"},
  {"events_topic", OPT_TEXT, "", 0, CONFIG_EVENTS_TEXT, false, F(events_topic),
   "the topic frame of every event message (vLLM's kv_events topic)"},
  {"events_tenant", OPT_EVTENANT, "", 0, 0, false, F(events_tenant),
   "whose caches the stream shows: one tenant's name (uid:N or a name of the tenants "
   "option; the shared caches it may read included), or * for every tenant's; required "
   "with events_endpoint"},
  {"events_cache", OPT_TEXT, "", 0, CONFIG_EVENTS_TEXT, false, F(events_cache),
   "only the caches of this name (one model's stream); empty: every cache of the tenant"},
  {"events_buffer", OPT_U32, "10000", 0, 1000000, false, F(events_buffer),
   "batches kept for replay (at most 64 MiB of them; older ones go first)"},
  {"events_hwm", OPT_U32, "10000", 1, 10000000, false, F(events_hwm),
   "messages queued for one subscriber before it misses batches (it sees the gap in the "
   "sequence numbers; counted in events_slow_drops)"},
  {"events_token_ids", OPT_BOOL, "true", 0, 0, false, F(events_token_ids),
   "stored events carry their pages' token ids (a prompt, in effect); false: empty lists"},
  {"events_format", OPT_ENUM, "array", 0, 0, false, F(events_format),
   "the events' msgpack form: array (tagged positional arrays, vLLM before its map "
   "encoding) or map (tagged maps, vLLM since); the batch is a positional array either way",
   events_formats},
  {"events_hash", OPT_ENUM, "chain", 0, 0, false, F(events_hash),
   "the block hashes published: chain (kvcached's chain hash, SHA-256) or vllm (vLLM's "
   "sha256_cbor block hash of the token ids from events_hash_seed: what a router computes "
   "from the prompt alone)", events_hashes},
  {"events_hash_int", OPT_BOOL, "false", 0, 0, false, F(events_hash_int),
   "publish block hashes as 64-bit ints (the hash's last 8 bytes, big-endian: vLLM's "
   "VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES) instead of bytes"},
  {"events_hash_seed", OPT_TEXT, "", 0, CONFIG_EVENTS_TEXT, false, F(events_hash_seed),
   "events_hash = vllm: the seed of every chain, as vLLM's PYTHONHASHSEED"},
  {"events_log_bytes", OPT_SIZE, "4MiB", 4 * KiB, 1 * GiB, false, F(events_log_bytes),
   "the engine's log of changes between two loop turns; changes past it are lost and the "
   "stream says so (AllBlocksCleared)"},
  {"cluster_nodes", OPT_NODES, "", 0, 0, false, F(cluster_nodes),
   "the cluster tier (doc/cluster.md): seed nodes of a Redis Cluster, HOST:PORT,HOST:PORT "
   "(the others are learned from CLUSTER SLOTS); empty: no cluster tier"},
  {"cluster_write", OPT_ENUM, "indexed", 0, 0, false, F(cluster_write),
   "when a page of the prefix index is written to the cluster: indexed (as soon as it is "
   "indexed), evicted (when the pool reclaims it) or off (read only)", cluster_writes},
  {"cluster_auth_file", OPT_FILE, "", 0, 0, false, F(cluster_auth_file),
   "a file holding the cluster's ACL user and password (\"USER PASSWORD\", or a password "
   "alone for the default user), owned by the daemon's user and readable by nobody else; "
   "empty: no AUTH"},
  {"cluster_secret_file", OPT_FILE, "", 0, 0, false, F(cluster_secret_file),
   "a file holding the secret every node of the fleet shares (16 bytes or more), owned by "
   "the daemon's user and readable by nobody else: values are authenticated with it, so a "
   "value planted by someone without it never verifies; empty: values are only "
   "checksummed (logged as a warning)"},
  {"cluster_tls", OPT_BOOL, "false", 0, 0, false, F(cluster_tls),
   "TLS to the cluster: not available (Debian 12's hiredis 0.14 has none); keep the cluster "
   "on a private network or behind a TLS tunnel"},
  {"cluster_read_replicas", OPT_BOOL, "false", 0, 0, false, F(cluster_read_replicas),
   "lookups read from a replica of the slot when one is up (READONLY), else from its master"},
  {"cluster_lookup_timeout_ms", OPT_U32, "200", 1, 60000, false, F(cluster_lookup_timeout_ms),
   "the longest a match or attach waits for the cluster; what has arrived by then is used "
   "and the request runs with it; a node that has left commands unanswered this long gets no "
   "more lookups until it answers"},
  {"cluster_lookup_max_pages", OPT_U32, "4096", 1, 65536, false, F(cluster_lookup_max_pages),
   "pages one match or attach looks up in the cluster past what the pool holds"},
  {"cluster_lookup_bytes", OPT_SIZE, "256MiB", 1 * MiB, 64 * GiB, false, F(cluster_lookup_bytes),
   "value bytes the lookups in flight may hold at once (what came, until it is imported); a "
   "lookup past it asks for fewer pages, or none"},
  {"cluster_connect_timeout_ms", OPT_U32, "1000", 1, 60000, false,
   F(cluster_connect_timeout_ms), "ms for a connection to a node to be made"},
  {"cluster_command_timeout_ms", OPT_U32, "2000", 1, 600000, false,
   F(cluster_command_timeout_ms),
   "a node that leaves a command unanswered this long is dropped (its breaker counts it)"},
  {"cluster_refresh_ms", OPT_U32, "10000", 100, 3600000, false, F(cluster_refresh_ms),
   "the slot map is read again this often (and at once after a redirection or a failure)"},
  {"cluster_breaker_failures", OPT_U32, "3", 1, 1000, false, F(cluster_breaker_failures),
   "failures in a row (refused, lost, silent) that open a node's circuit breaker: nothing is "
   "sent to it until it has been open cluster_breaker_ms"},
  {"cluster_breaker_ms", OPT_U32, "1000", 10, 600000, false, F(cluster_breaker_ms),
   "how long a node's breaker stays open the first time; doubling while the node fails, to "
   "64 times"},
  {"cluster_queue_pages", OPT_U32, "4096", 1, 1u << 20, false, F(cluster_queue_pages),
   "pages the write-behind queue holds (with cluster_write = evicted each holds a copy of "
   "its page); more are dropped and counted"},
  {"cluster_inflight_bytes", OPT_SIZE, "16MiB", 64 * KiB, 1 * GiB, false,
   F(cluster_inflight_bytes), "value bytes being written to the cluster at once (at most a "
   "sixteenth of pool_bytes: the pages being written are held in the pool meanwhile)"},
  {"cluster_retries", OPT_U32, "3", 0, 16, false, F(cluster_retries),
   "times a failed write is tried again before it is dropped"},
  {"cluster_backoff_ms", OPT_U32, "100", 1, 600000, false, F(cluster_backoff_ms),
   "wait before the first retry of a write, doubling for each"},
  {"cluster_ttl_s", OPT_U32, "86400", 0, 315360000, false, F(cluster_ttl_s),
   "values expire from the cluster this many seconds after they are written; 0: never "
   "(then only the cluster's maxmemory-policy removes them)"},
};
#define NOPTIONS (sizeof options / sizeof options[0])

static void fail(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void fail(char *err, size_t errlen, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
}

/* Options that were renamed: the old name is still read (a file or a
 * command line of before), logged once as such; --print-config and the
 * example file give the new one. "tier" names every tier below memory, so
 * the disk tier's own options say "disk". */
static const struct { const char *old, *now; } renamed[] = {
    {"tier_dir", "disk_dir"},
    {"tier_bytes", "disk_bytes"},
};

/* "pool-bytes" and "pool_bytes" name the same option. */
static const option_t *find_option(const char *name) {
  char norm[64];
  size_t n = strlen(name);
  if (n >= sizeof norm) return NULL;
  for (size_t i = 0; i <= n; i++) norm[i] = name[i] == '-' ? '_' : name[i];
  for (size_t r = 0; r < sizeof renamed / sizeof renamed[0]; r++)
    if (strcmp(norm, renamed[r].old) == 0) {
      static bool told[sizeof renamed / sizeof renamed[0]];
      if (!told[r]) LOG_WARN("config_renamed", "option=%s now=%s", renamed[r].old, renamed[r].now);
      told[r] = true;
      snprintf(norm, sizeof norm, "%s", renamed[r].now);
    }
  for (size_t i = 0; i < NOPTIONS; i++)
    if (strcmp(options[i].name, norm) == 0) return &options[i];
  return NULL;
}

size_t config_option_count(void) { return NOPTIONS; }

int config_option_index(const char *name) {
  const option_t *o = find_option(name);
  return o ? (int)(o - options) : -1;
}

const char *config_option_name(size_t i) { return i < NOPTIONS ? options[i].name : NULL; }

static int parse_u64(const char *s, uint64_t *out);

/* Binary units only. A decimal-looking unit (KB, MB, GB, TB) is refused
 * rather than guessed: 2GB is 2*10^9 to a disk vendor and 2*2^30 to many
 * configs. */
int config_parse_size(const char *s, uint64_t *out) {
  static const struct { const char *unit; uint64_t mul; } units[] = {
      {"", 1},      {"B", 1},     {"K", KiB},   {"KiB", KiB}, {"M", MiB}, {"MiB", MiB},
      {"G", GiB},   {"GiB", GiB}, {"T", TiB},   {"TiB", TiB},
  };
  if (*s < '0' || *s > '9') return -1;
  errno = 0;
  char *end;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno) return -1;
  for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
    /* K, M, G, T and B in either case (2g, 512m); KiB... as written. */
    bool letter = strlen(units[i].unit) == 1;
    if (letter ? strcasecmp(end, units[i].unit) != 0 : strcmp(end, units[i].unit) != 0)
      continue;
    if (v > UINT64_MAX / units[i].mul) return -1;
    *out = (uint64_t)v * units[i].mul;
    return 0;
  }
  if (strlen(end) == 2 && strchr("kKmMgGtT", end[0]) && (end[1] == 'B' || end[1] == 'b'))
    return -2;
  return -1;
}

int config_parse_listen(const char *s, char *host, size_t hostlen, unsigned *port) {
  const char *colon = strrchr(s, ':');
  if (!colon) return -1;
  size_t hlen = (size_t)(colon - s);
  const char *h = s;
  if (hlen >= 2 && s[0] == '[' && s[hlen - 1] == ']') {
    h = s + 1;
    hlen -= 2;
  } else if (memchr(s, ':', hlen)) {
    return -1; /* an IPv6 address needs its brackets */
  }
  if (hlen == 0) {
    h = "127.0.0.1";
    hlen = strlen(h);
  }
  if (hlen >= hostlen) return -1;
  memcpy(host, h, hlen);
  host[hlen] = '\0';
  uint64_t p;
  if (parse_u64(colon + 1, &p) != 0 || p > 65535) return -1;
  unsigned char tmp[16];
  if (inet_pton(strchr(host, ':') ? AF_INET6 : AF_INET, host, tmp) != 1) return -1;
  *port = (unsigned)p;
  return 0;
}

int config_parse_nodes(const char *s, size_t *n) {
  size_t count = 0;
  for (const char *p = s; *p;) {
    size_t len = strcspn(p, ","), hl = 0;
    for (size_t i = 0; i < len; i++) /* the last ':' ends the host ([v6]:port) */
      if (p[i] == ':') hl = i;
    size_t pl = hl ? len - hl - 1 : 0;
    unsigned long port = 0;
    for (size_t i = 0; i < pl && port <= 65535; i++)
      port = p[hl + 1 + i] >= '0' && p[hl + 1 + i] <= '9'
                 ? port * 10 + (unsigned long)(p[hl + 1 + i] - '0') : 65536;
    if (hl == 0 || hl > 63 || pl == 0 || port == 0 || port > 65535 || memchr(p, ' ', len))
      return -1;
    count++;
    p += len;
    if (*p == ',') p++;
  }
  if (n) *n = count;
  return 0;
}

static int parse_u64(const char *s, uint64_t *out) {
  if (*s < '0' || *s > '9') return -1;
  errno = 0;
  char *end;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || *end) return -1;
  *out = v;
  return 0;
}

/* Parses a comma list of ids into ids[]; "self" is our uid (or gid), blanks
 * around an id are allowed ("self, 1000"). -1 with bad[badlen] the id that
 * is none, -2 for too many. */
static int parse_ids(const char *s, bool gids, uint32_t *ids, uint32_t *n, char *bad,
                     size_t badlen) {
  uint32_t count = 0;
  const char *p = s;
  bad[0] = '\0';
  while (*p) {
    const char *comma = strchr(p, ',');
    size_t len = comma ? (size_t)(comma - p) : strlen(p);
    char tok[32];
    uint64_t v;
    snprintf(bad, badlen, "%.*s", (int)len, p);
    while (len && (*p == ' ' || *p == '\t')) p++, len--;
    while (len && (p[len - 1] == ' ' || p[len - 1] == '\t')) len--;
    if (count == CONFIG_MAX_IDS) return -2;
    if (len == 0 || len >= sizeof tok) return -1;
    memcpy(tok, p, len);
    tok[len] = '\0';
    if (strcmp(tok, "self") == 0)
      v = gids ? getegid() : geteuid();
    else if (strcmp(tok, "root") == 0)
      v = 0;
    else if (parse_u64(tok, &v) != 0 || v > UINT32_MAX)
      return -1;
    bool dup = false;
    for (uint32_t i = 0; i < count; i++) dup |= ids[i] == (uint32_t)v;
    if (!dup) ids[count++] = (uint32_t)v;
    p = comma ? comma + 1 : p + len;
  }
  *n = count;
  return 0;
}

static int set_value(config_t *cfg, const option_t *o, const char *value, char *err,
                     size_t errlen) {
  char *field = (char *)cfg + o->off;
  uint64_t v = 0;
  switch (o->type) {
  case OPT_PATH:
    if (strcmp(value, "auto") == 0) {
      if (sockpath_daemon(field, sizeof cfg->socket_path) == 0) return 0;
      fail(err, errlen, "socket: default path too long");
      return -1;
    }
    if (*value == '\0' || strlen(value) >= sizeof cfg->socket_path) {
      fail(err, errlen, "socket: path empty or longer than %zu bytes",
           sizeof cfg->socket_path - 1);
      return -1;
    }
    if (strpbrk(value, "\"\n")) { /* a config file could not say it */
      fail(err, errlen, "socket: a path may not hold '\"' or a newline");
      return -1;
    }
    strcpy(field, value);
    return 0;
  case OPT_MODE: {
    char *end;
    errno = 0;
    unsigned long m = strtoul(value, &end, 8);
    if (errno || *end || *value == '\0' || m > o->max) {
      fail(err, errlen, "%s: expected octal bits like 0660, got '%s'", o->name, value);
      return -1;
    }
    *(uint32_t *)(void *)field = (uint32_t)m;
    return 0;
  }
  case OPT_SIZE:
  case OPT_U32:
  case OPT_U64:
  {
    int prc = o->type == OPT_SIZE ? config_parse_size(value, &v) : parse_u64(value, &v);
    if (prc == -2) {
      fail(err, errlen, "%s: '%s' is ambiguous (powers of 1000 or 1024?): write %.*sGiB-style "
           "binary units (KiB, MiB, GiB, TiB) or a single letter (K, M, G, T)", o->name, value,
           (int)strspn(value, "0123456789"), value);
      return -1;
    }
    if (prc != 0) {
      fail(err, errlen, "%s: expected %s, got '%s'", o->name,
           o->type == OPT_SIZE ? "a size like 512MiB (B, K/KiB, M/MiB, G/GiB, T/TiB)"
                               : "a number", value);
      return -1;
    }
  }
    if (v < o->min || v > o->max) {
      char lo[UNITS_LEN], hi[UNITS_LEN];
      if (o->type == OPT_SIZE) {
        units_bytes(o->min, lo, sizeof lo);
        units_bytes(o->max, hi, sizeof hi);
      } else {
        snprintf(lo, sizeof lo, "%llu", (unsigned long long)o->min);
        snprintf(hi, sizeof hi, "%llu", (unsigned long long)o->max);
      }
      fail(err, errlen, "%s: %s out of bounds [%s, %s]", o->name, value, lo, hi);
      return -1;
    }
    if (o->type == OPT_U32)
      *(uint32_t *)(void *)field = (uint32_t)v;
    else
      *(uint64_t *)(void *)field = v;
    return 0;
  case OPT_UIDS:
  case OPT_GIDS: {
    uint32_t ids[CONFIG_MAX_IDS], n;
    bool gids = o->type == OPT_GIDS;
    char bad[64];
    int prc = parse_ids(value, gids, ids, &n, bad, sizeof bad);
    if (prc != 0) {
      if (prc == -1)
        fail(err, errlen, "%s: '%s' is no %s (a number, self or root) in '%s'", o->name, bad,
             gids ? "gid" : "uid", value);
      else
        fail(err, errlen, "%s: expected up to %d comma-separated ids, got '%s'", o->name,
             CONFIG_MAX_IDS, value);
      return -1;
    }
    id_list_t *l = (id_list_t *)(void *)field;
    for (uint32_t i = 0; i < n; i++) l->ids[i] = ids[i];
    l->n = n;
    return 0;
  }
  case OPT_TENANTS:
  case OPT_SHARED: {
    char why[200];
    int rc = o->type == OPT_TENANTS
                 ? tenant_rules_parse(value, cfg->tenant_rules, TENANT_RULES_MAX,
                                      &cfg->n_tenant_rules, why, sizeof why)
                 : shared_rules_parse(value, cfg->shared_rules, TENANT_RULES_MAX,
                                      &cfg->n_shared_rules, why, sizeof why);
    if (rc != 0 || strlen(value) >= sizeof cfg->tenants_text) {
      fail(err, errlen, "%s: %s", o->name, rc ? why : "longer than 1023 bytes");
      return -1;
    }
    strcpy(field, value);
    return 0;
  }
  case OPT_FLOORS: {
    char buf[sizeof cfg->floors_text];
    if (strlen(value) >= sizeof buf) {
      fail(err, errlen, "%s: longer than %zu bytes", o->name, sizeof buf - 1);
      return -1;
    }
    strcpy(buf, value);
    uint32_t n = 0;
    for (char *save = NULL, *item = strtok_r(buf, ",", &save); item;
         item = strtok_r(NULL, ",", &save)) {
      char *eq = strchr(item, '='), *end;
      unsigned long pct = eq ? strtoul(eq + 1, &end, 10) : 0;
      if (eq) *eq = '\0';
      if (!eq || !tenant_name_valid(item) || end == eq + 1 || (*end && strcmp(end, "%") != 0) ||
          pct < 1 || pct > 100) {
        fail(err, errlen, "%s: expected NAME=PCT,... (a tenant name, a percent 1-100), "
             "got '%s'", o->name, value);
        return -1;
      }
      for (uint32_t i = 0; i < n; i++)
        if (strcmp(cfg->floors[i].tenant, item) == 0) {
          fail(err, errlen, "%s: tenant %s named twice", o->name, item);
          return -1;
        }
      if (n == TENANT_RULES_MAX) {
        fail(err, errlen, "%s: more than %u tenants", o->name, TENANT_RULES_MAX);
        return -1;
      }
      snprintf(cfg->floors[n].tenant, TENANT_NAME_MAX, "%s", item);
      cfg->floors[n++].pct = (uint32_t)pct;
    }
    cfg->n_floors = n;
    strcpy(field, value);
    return 0;
  }
  case OPT_TENANT:
    if (*value && !tenant_name_valid(value)) {
      fail(err, errlen, "%s: '%s' is not a tenant name (a name of the tenants option, or "
           "uid:N)", o->name, value);
      return -1;
    }
    snprintf(field, TENANT_NAME_MAX, "%s", value);
    return 0;
  case OPT_LISTEN: {
    char host[64];
    unsigned port;
    if (*value && (strlen(value) >= sizeof cfg->metrics_listen ||
                   config_parse_listen(value, host, sizeof host, &port) != 0)) {
      fail(err, errlen, "%s: expected HOST:PORT like 127.0.0.1:9464, [::1]:9464 or :9464 "
           "(or empty: off), got '%s'", o->name, value);
      return -1;
    }
    snprintf(field, sizeof cfg->metrics_listen, "%s", value);
    return 0;
  }
  case OPT_NODES:
    if (strlen(value) >= sizeof cfg->cluster_nodes || config_parse_nodes(value, NULL) != 0) {
      fail(err, errlen, "%s: expected HOST:PORT,HOST:PORT (or empty: off), got '%s'", o->name,
           value);
      return -1;
    }
    snprintf(field, sizeof cfg->cluster_nodes, "%s", value);
    return 0;
  case OPT_FILE:
    if (strlen(value) >= sizeof cfg->cluster_auth_file || strpbrk(value, "\"\n")) {
      fail(err, errlen, "%s: a path of at most %zu bytes without '\"' or a newline", o->name,
           sizeof cfg->cluster_auth_file - 1);
      return -1;
    }
    snprintf(field, sizeof cfg->cluster_auth_file, "%s", value);
    return 0;
  case OPT_DIR:
    if (*value && (*value != '/' || strlen(value) >= sizeof cfg->disk_dir ||
                   strpbrk(value, "\"\n"))) {
      fail(err, errlen, "%s: expected an absolute path of at most %zu bytes without '\"' or "
           "a newline (or empty: off), got '%s'", o->name, sizeof cfg->disk_dir - 1, value);
      return -1;
    }
    snprintf(field, sizeof cfg->disk_dir, "%s", value);
    return 0;
  case OPT_TEXT:
    if (strlen(value) >= o->max || strpbrk(value, "\"\n")) {
      fail(err, errlen, "%s: at most %llu bytes, without '\"' or a newline", o->name,
           (unsigned long long)o->max - 1);
      return -1;
    }
    snprintf(field, o->max, "%s", value);
    return 0;
  case OPT_ENUM:
    for (uint32_t i = 0; o->names[i]; i++)
      if (strcmp(value, o->names[i]) == 0) {
        *(uint32_t *)(void *)field = i;
        return 0;
      }
  {
    char all[160] = "";
    for (uint32_t i = 0; o->names[i]; i++) /* "a, b or c" */
      snprintf(all + strlen(all), sizeof all - strlen(all), "%s%s",
               !i ? "" : o->names[i + 1] ? ", " : " or ", o->names[i]);
    fail(err, errlen, "%s: expected %s, got '%s'", o->name, all, value);
    return -1;
  }
  case OPT_ENDPOINT:
    if (*value && (strlen(value) >= CONFIG_EVENTS_TEXT || strpbrk(value, "\" \n") ||
                   (strncmp(value, "tcp://", 6) != 0 && strncmp(value, "ipc://", 6) != 0) ||
                   !value[6])) {
      fail(err, errlen, "%s: expected tcp://HOST:PORT or ipc://PATH (at most %d bytes), or "
           "empty, got '%s'", o->name, CONFIG_EVENTS_TEXT - 1, value);
      return -1;
    }
    snprintf(field, CONFIG_EVENTS_TEXT, "%s", value);
    return 0;
  case OPT_EVTENANT:
    if (*value && strcmp(value, "*") != 0 && !tenant_name_valid(value)) {
      fail(err, errlen, "%s: '%s' is not a tenant name (a name of the tenants option, "
           "uid:N, or * for every tenant)", o->name, value);
      return -1;
    }
    snprintf(field, TENANT_NAME_MAX, "%s", value);
    return 0;
  case OPT_HASH:
    if (strcmp(value, "sha256") == 0) v = KVC_HASH_SHA256;
    else if (strcmp(value, "xxh3") == 0) v = KVC_HASH_XXH3;
    else {
      fail(err, errlen, "%s: expected sha256 or xxh3, got '%s'", o->name, value);
      return -1;
    }
    *(uint32_t *)(void *)field = (uint32_t)v;
    return 0;
  case OPT_BOOL: {
    static const char *const yes[] = {"true", "yes", "on", "1"};
    static const char *const no[] = {"false", "no", "off", "0"};
    for (size_t i = 0; i < 4; i++) {
      if (strcmp(value, yes[i]) == 0 || strcmp(value, no[i]) == 0) {
        *(bool *)(void *)field = strcmp(value, yes[i]) == 0;
        return 0;
      }
    }
    fail(err, errlen, "%s: expected true or false, got '%s'", o->name, value);
    return -1;
  }
  case OPT_LEVEL: {
    int l = log_level_parse(value);
    if (l < 0) {
      fail(err, errlen, "%s: expected error, warn, info or debug, got '%s'", o->name,
           value);
      return -1;
    }
    *(int *)(void *)field = l;
    return 0;
  }
  }
  return -1;
}

int config_set(config_t *cfg, const char *name, const char *value, char *err,
               size_t errlen) {
  const option_t *o = find_option(name);
  if (!o) {
    fail(err, errlen, "unknown option '%s' (see --help)", name);
    return -1;
  }
  config_t tmp = *cfg;
  if (set_value(&tmp, o, value, err, errlen) != 0) return -1;
  *cfg = tmp;
  return 0;
}

void config_defaults(config_t *cfg) {
  char err[256];
  memset(cfg, 0, sizeof *cfg);
  for (size_t i = 0; i < NOPTIONS; i++)
    if (set_value(cfg, &options[i], options[i].def, err, sizeof err) != 0) abort();
}

#define SEGMENT_DEFAULT (32ull << 20)
#define SEGMENT_MIN_AUTO (2ull << 20)
#define GRAIN_BYTES 4096ull

uint64_t config_segment_bytes(const config_t *cfg) {
  if (cfg->segment_bytes) return cfg->segment_bytes;
  if (cfg->page_bytes) return cfg->page_bytes;
  uint64_t s = SEGMENT_DEFAULT;
  while (s > SEGMENT_MIN_AUTO && s > cfg->pool_bytes / 4) s /= 2;
  return s;
}

uint64_t config_grain_bytes(const config_t *cfg) {
  return cfg->page_bytes ? cfg->page_bytes : GRAIN_BYTES;
}

int config_validate(const config_t *cfg, char *err, size_t errlen) {
  if (cfg->page_bytes % 64 != 0) {
    fail(err, errlen, "page_bytes: %llu is not a multiple of 64",
         (unsigned long long)cfg->page_bytes);
    return -1;
  }
  uint64_t seg = config_segment_bytes(cfg), grain = config_grain_bytes(cfg);
  if (seg % grain) {
    fail(err, errlen, "segment_bytes: %llu is not a multiple of %llu (%s)",
         (unsigned long long)seg, (unsigned long long)grain,
         cfg->page_bytes ? "page_bytes" : "4KiB");
    return -1;
  }
  char a[UNITS_LEN], b[UNITS_LEN];
  units_bytes(cfg->pool_bytes, b, sizeof b);
  if (!cfg->page_bytes && cfg->pool_bytes / seg > 4096) {
    fail(err, errlen, "segment_bytes: %s makes more than 4096 segments of pool_bytes %s "
         "(each its own memfd): raise it", units_bytes(seg, a, sizeof a), b);
    return -1;
  }
  if (seg > cfg->pool_bytes / 4) {
    fail(err, errlen, "%s: %s leaves fewer than 4 segments in pool_bytes %s",
         cfg->segment_bytes ? "segment_bytes" : "page_bytes", units_bytes(seg, a, sizeof a), b);
    return -1;
  }
  if (cfg->pool_reserve_bytes && cfg->pool_reserve_bytes < cfg->pool_bytes) {
    fail(err, errlen, "pool_reserve_bytes: %s is less than pool_bytes %s",
         units_bytes(cfg->pool_reserve_bytes, a, sizeof a), b);
    return -1;
  }
  if (cfg->shm_default_bytes > cfg->shm_max_bytes) {
    fail(err, errlen, "shm_default_bytes exceeds shm_max_bytes");
    return -1;
  }
  if (cfg->shm_max_bytes > cfg->shm_bytes_per_uid ||
      cfg->shm_bytes_per_uid > cfg->shm_bytes_total) {
    fail(err, errlen, "shm_max_bytes, shm_bytes_per_uid and shm_bytes_total must not "
         "decrease in that order");
    return -1;
  }
  if (cfg->allow_uids.n == 0 && cfg->allow_gids.n == 0) {
    fail(err, errlen, "allow_uids and allow_gids are both empty: nobody could connect");
    return -1;
  }
  if (cfg->write_queue_bytes < cfg->max_frame_bytes) {
    fail(err, errlen, "write_queue_bytes is smaller than max_frame_bytes");
    return -1;
  }
  uint32_t floors = 0;
  for (uint32_t i = 0; i < cfg->n_floors; i++) {
    floors += cfg->floors[i].pct;
    if (cfg->floors[i].pct > cfg->tenant_max_pages_pct) {
      fail(err, errlen, "tenant_floors: %s's floor of %u%% is over tenant_max_pages_pct (%u%%)",
           cfg->floors[i].tenant, cfg->floors[i].pct, cfg->tenant_max_pages_pct);
      return -1;
    }
  }
  if (floors > 100) {
    fail(err, errlen, "tenant_floors: the floors add up to %u%% of the pool", floors);
    return -1;
  }
  if (cfg->zero_copy_tenant[0] && cfg->n_shared_rules) {
    fail(err, errlen, "zero_copy_tenant makes a single-tenant node: it has no shared_caches");
    return -1;
  }
  if (cfg->cluster_tls) {
    fail(err, errlen, "cluster_tls: TLS to the cluster is not available: Debian 12's hiredis "
         "0.14 has no TLS; keep the cluster on a private network or behind a TLS tunnel "
         "(doc/cluster.md)");
    return -1;
  }
  if (cfg->events_endpoint[0] && !cfg->events_tenant[0]) {
    fail(err, errlen, "events_endpoint: say whose caches the stream shows with events_tenant "
         "(a tenant's name, or * for every tenant's): the stream carries prompts");
    return -1;
  }
  if (strlen(cfg->events_cache) > KVC_MAX_NAME) {
    fail(err, errlen, "events_cache: a cache name is at most %u bytes", KVC_MAX_NAME);
    return -1;
  }
  if (cfg->events_replay_endpoint[0] && !cfg->events_endpoint[0]) {
    fail(err, errlen, "events_replay_endpoint needs events_endpoint");
    return -1;
  }
  if (cfg->events_endpoint[0] && strcmp(cfg->events_endpoint, cfg->events_replay_endpoint) == 0) {
    fail(err, errlen, "events_endpoint and events_replay_endpoint must differ");
    return -1;
  }
  if (cfg->prefix_hash == KVC_HASH_XXH3 && !cfg->prefix_single_tenant) {
    fail(err, errlen,
         "prefix_hash = xxh3 is not collision-resistant: a tenant could craft prompts "
         "that collide with another's; use it only on a node with one trusted tenant "
         "and say so with prefix_single_tenant = true");
    return -1;
  }
  return 0;
}

/* A size in the largest binary unit that divides it: 1GiB, 64KiB, 100. */
static void print_size(uint64_t v, char *buf, size_t len) {
  static const struct { const char *unit; uint64_t mul; } units[] = {
      {"TiB", TiB}, {"GiB", GiB}, {"MiB", MiB}, {"KiB", KiB}};
  for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
    if (v && v % units[i].mul == 0) {
      snprintf(buf, len, "%llu%s", (unsigned long long)(v / units[i].mul), units[i].unit);
      return;
    }
  snprintf(buf, len, "%llu", (unsigned long long)v);
}

/* The value as text that config_set reads back to the same value. */
static void print_value(const config_t *cfg, const option_t *o, char *buf, size_t len) {
  const char *field = (const char *)cfg + o->off;
  size_t used = 0;
  switch (o->type) {
  case OPT_PATH:
  case OPT_NODES:
  case OPT_FILE:
  case OPT_DIR:
  case OPT_LISTEN: snprintf(buf, len, "%s", field); return;
  case OPT_MODE: snprintf(buf, len, "%04o", *(const uint32_t *)(const void *)field); return;
  case OPT_U32: snprintf(buf, len, "%u", *(const uint32_t *)(const void *)field); return;
  case OPT_SIZE: print_size(*(const uint64_t *)(const void *)field, buf, len); return;
  case OPT_U64:
    snprintf(buf, len, "%llu", (unsigned long long)*(const uint64_t *)(const void *)field);
    return;
  case OPT_LEVEL: snprintf(buf, len, "%s", log_level_name(cfg->log_level)); return;
  case OPT_HASH:
    snprintf(buf, len, "%s", *(const uint32_t *)(const void *)field == KVC_HASH_XXH3 ? "xxh3" : "sha256");
    return;
  case OPT_BOOL: snprintf(buf, len, "%s", *(const bool *)(const void *)field ? "true" : "false"); return;
  case OPT_TENANTS:
  case OPT_SHARED:
  case OPT_FLOORS:
  case OPT_TENANT:
  case OPT_TEXT:
  case OPT_ENDPOINT:
  case OPT_EVTENANT: snprintf(buf, len, "%s", field); return;
  case OPT_ENUM: snprintf(buf, len, "%s", o->names[*(const uint32_t *)(const void *)field]); return;
  case OPT_UIDS:
  case OPT_GIDS: {
    const id_list_t *l = (const id_list_t *)(const void *)field;
    buf[0] = '\0';
    for (uint32_t i = 0; i < l->n && used < len; i++) {
      int w = snprintf(buf + used, len - used, "%s%u", i ? "," : "", (unsigned)l->ids[i]);
      if (w < 0) break;
      used += (size_t)w;
    }
    return;
  }
  }
}

void config_value(const config_t *cfg, size_t i, char *buf, size_t len) {
  if (i < NOPTIONS) print_value(cfg, &options[i], buf, len);
  else if (len) buf[0] = '\0';
}

void config_format(const config_t *cfg, char *buf, size_t len) {
  size_t used = 0;
  buf[0] = '\0';
  for (size_t i = 0; i < NOPTIONS && used < len; i++) {
    char v[256];
    print_value(cfg, &options[i], v, sizeof v);
    int w = snprintf(buf + used, len - used, "%s%s=%s", i ? " " : "", options[i].name,
                     v[0] ? v : "\"\"");
    if (w < 0) break;
    used += (size_t)w;
  }
}

/* An empty value or one with spaces or '#' is quoted, as the file reads it. */
static void print_line(FILE *f, const char *prefix, const char *name, const char *v) {
  bool quote = v[0] == '\0' || strpbrk(v, " \t#\"") != NULL;
  fprintf(f, "%s%s = %s%s%s\n", prefix, name, quote ? "\"" : "", v, quote ? "\"" : "");
}

void config_print(const config_t *cfg, FILE *f) {
  fprintf(f, "# kvcached %s: the configuration in force (kvcached --print-config)\n",
          KVC_VERSION_STRING);
  for (size_t i = 0; i < NOPTIONS; i++) {
    char v[1024];
    print_value(cfg, &options[i], v, sizeof v);
    print_line(f, "", options[i].name, v);
  }
}

/* Bounds and flags of an option as one phrase: "1MiB..64TiB, reloadable". */
static void describe(const option_t *o, char *buf, size_t len) {
  char lo[32], hi[32];
  buf[0] = '\0';
  if (o->type == OPT_SIZE) {
    print_size(o->min, lo, sizeof lo);
    print_size(o->max, hi, sizeof hi);
  } else {
    snprintf(lo, sizeof lo, "%llu", (unsigned long long)o->min);
    snprintf(hi, sizeof hi, "%llu", (unsigned long long)o->max);
  }
  bool ranged = o->type == OPT_SIZE || o->type == OPT_U32 || o->type == OPT_U64;
  snprintf(buf, len, "%s%s%s%s%s", ranged ? lo : "", ranged ? ".." : "", ranged ? hi : "",
           ranged ? ", " : "", o->reloadable ? "reloadable" : "needs a restart");
}

/* Writes text in lines of at most 78 columns, the first after `first`, the
 * others after `rest` (prefixes of one width). */
static void print_wrapped(FILE *f, const char *first, const char *rest, const char *text) {
  const char *p = text, *prefix = first;
  size_t width = 78 - strlen(first);
  while (*p) {
    size_t take = strlen(p);
    if (take > width) {
      take = width;
      while (take > 0 && p[take] != ' ') take--;
      if (take == 0) take = strcspn(p, " ");
    }
    fprintf(f, "%s%.*s\n", prefix, (int)take, p);
    p += take;
    while (*p == ' ') p++;
    prefix = rest;
  }
}

void config_print_example(FILE *f) {
  fputs("# kvcached.conf: the configuration file of kvcached, with every option at\n"
        "# its default (commented out). Generated by `kvcached --example-config`.\n"
        "#\n"
        "# One `name = value` per line; `#` starts a comment; quote a value that is\n"
        "# empty or holds spaces (\"\"). Sizes are binary: B, K or KiB, M or MiB, G or\n"
        "# GiB, T or TiB (2G = 2GiB = 2147483648); KB, MB, GB, TB are refused as ambiguous.\n"
        "# Command-line flags (--name VALUE) override this file. A reloadable option\n"
        "# changes on SIGHUP (systemctl reload kvcached); the others need a restart.\n"
        "# Check a file with `kvcached --check-config --config FILE`; see the\n"
        "# configuration in force with `kvcached --print-config`.\n", f);
  for (size_t i = 0; i < NOPTIONS; i++) {
    const option_t *o = &options[i];
    char d[128];
    describe(o, d, sizeof d);
    fputc('\n', f);
    print_wrapped(f, "# ", "# ", o->help);
    fprintf(f, "# (%s)\n", d);
    print_line(f, "#", o->name, o->def);
  }
}

void config_print_options_help(FILE *f) {
  for (size_t i = 0; i < NOPTIONS; i++) {
    const option_t *o = &options[i];
    char flag[64], d[128];
    snprintf(flag, sizeof flag, "--%s", o->name);
    for (char *p = flag + 2; *p; p++)
      if (*p == '_') *p = '-';
    describe(o, d, sizeof d);
    char first[80], more[512];
    snprintf(first, sizeof first, "  %-22s ", flag);
    snprintf(more, sizeof more, "%s. Default %s; %s.", o->help, o->def[0] ? o->def : "empty", d);
    print_wrapped(f, first, "                         ", more);
  }
}

int config_reload_merge(const config_t *cur, const config_t *fresh, config_t *out,
                        char *err, size_t errlen) {
  config_t next = *cur;
  char was[1024], now[1024];
  for (size_t i = 0; i < NOPTIONS; i++) {
    const option_t *o = &options[i];
    print_value(cur, o, was, sizeof was);
    print_value(fresh, o, now, sizeof now);
    /* Printed values read back exactly (--print-config round-trips). */
    if (o->reloadable && strcmp(was, now) != 0 && set_value(&next, o, now, err, errlen) != 0)
      return -1;
  }
  if (config_validate(&next, err, errlen) != 0) return -1;
  int changed = 0;
  for (size_t i = 0; i < NOPTIONS; i++) {
    const option_t *o = &options[i];
    print_value(cur, o, was, sizeof was);
    print_value(fresh, o, now, sizeof now);
    if (strcmp(was, now) == 0) continue;
    if (o->reloadable) {
      LOG_INFO("reload_set", "option=%s old=\"%s\" new=\"%s\"", o->name, was, now);
      changed++;
    } else {
      LOG_WARN("reload_skipped", "option=%s running=\"%s\" configured=\"%s\" "
               "reason=\"needs a restart\"", o->name, was, now);
    }
  }
  *out = next;
  return changed;
}
