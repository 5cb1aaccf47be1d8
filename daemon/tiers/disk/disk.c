/* disk.c: the local disk tier (disk.h; doc/tiers.md).
 *
 * The loop keeps the tier's index: the pages on disk by chain hash, on one
 * LRU list (most recent at head), their bytes within disk_bytes. Files are
 * touched only by the tier's own I/O threads: the WORK_DISK class of the
 * daemon's one work queue (work.h: jobs taken from a list under a mutex and
 * handed back on a lock-free stack with an eventfd the loop polls while
 * jobs are in flight; threads of their own, because a job here waits on
 * the disk and must not hold up the copies of gets and puts).
 *
 *   dent (loop)   hash, tenant, sizes, state  WRITING -> READY
 *                 readers: reads in flight (kept on disk meanwhile)
 *                 gone: out of the index; unlinked and freed after its jobs
 *
 *   turn          spilled writes, oldest first; handed to the threads at the
 *                 turn's end, newest first (a chain's head first); the oldest
 *                 make way when the writes waiting would pass STAGING_MAX
 *   jobs          write   (spill)   encode the header, write tmp/<name>, rename
 *                 read    (fetch)   read header + data into the pool page, check
 *                 unlink  (LRU, discard)
 *                 scan    (start)   index the directory's files, drop bad ones
 *                 save    (registry) the tenant names, for stable numbers
 *
 * The engine's pages are only ever written by a read job into a pool page
 * that engine_tier_import_begin handed it (held by its job alone), and only
 * read here by the reclaimed hook, on the loop, in the engine's call. A
 * lookup's reads are a group, kept in the waiting request's walk
 * (tier_wait_t.held): when all are in, the request runs again and imports
 * them (engine_tier_import, each page's hash recomputed from its own
 * query); a request gone meanwhile leaves its group orphaned, its pages
 * given back as its reads end.
 */
#include "disk.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "diskfmt.h"
#include "engine_tier.h"
#include "log.h"
#include "server.h"
#include "testhook.h"
#include "tier.h"
#include "work.h"

#define DISK_THREADS 2u           /* at most */
#define STAGING_MAX (64ull << 20) /* spilled bytes waiting for a write thread */
#define FETCH_MAX 1024u           /* pages one request reads back at most */
#define REGISTRY "tenants"
#define REGISTRY_MAGIC "kvcached-tenants 1"

enum dstate { D_WRITING, D_READY };

typedef struct dent {
  uint8_t hash[32];
  uint32_t tenant;        /* the daemon's tenant number of the page */
  uint32_t header_bytes;
  uint64_t data_bytes;
  struct dent *prev, *next; /* LRU, most recent at d->head */
  struct dent *hnext;       /* the index's bucket chain */
  uint8_t state;          /* enum dstate */
  bool gone;              /* out of the index: unlink and free after its jobs */
  bool kept;              /* a clean stop wrote or touched it */
  bool untold;            /* spilled this turn: the event stream hears of it at its end */
  uint32_t readers;       /* read jobs in flight */
  int64_t mtime_ns;       /* the start-up scan's order */
  char cache[KVC_MAX_NAME + 1]; /* its cache's name (the event stream's scope) */
} dent_t;

typedef struct djob djob_t;
struct djob {
  work_job_t wj;                      /* first: class WORK_DISK */
  disk_t *d;
  void (*run)(disk_t *d, djob_t *j);  /* on an I/O thread */
  void (*done)(disk_t *d, djob_t *j); /* on the loop; frees the job */
};

struct disk {
  server_t *srv;
  int dirfd;              /* disk_dir, flock'ed */
  dent_t **buckets;       /* the index: first 8 bytes of the hash -> dents */
  size_t nbuckets, count;
  dent_t *head, *tail;    /* LRU */
  uint64_t bytes;         /* files' bytes (writes in flight included) */
  uint64_t bound;         /* disk_bytes */
  uint64_t cap;           /* the bound in force: lower after the disk was full */
  uint64_t staging;       /* bytes spilled, not yet written (this turn's included) */
  struct wjob *turn_head, *turn_tail; /* this turn's spilled pages, oldest first */
  uint64_t turn_bytes;    /* their bytes */
  uint32_t tenants_saved; /* registry entries written (or queued) */
  uint32_t importing;     /* pool pages held by reads in flight */
  bool closing;           /* disk_close: nothing new is queued */
  struct wjob *collect;   /* a write whose room trim makes: it unlinks the victims first */
  bool full_logged;
  _Atomic uint64_t scanned; /* files the start-up scan has looked at */
  log_limit_t limit_bad;
  uv_prepare_t turn;      /* active while this turn spilled: hands its writes over */
  bool polled;            /* turn is initialized (closed at the end) */
  uint64_t inflight;      /* jobs queued or running or done, not yet ended */
  tier_stats_t st;        /* as every tier's figures (tier_*{tier="disk"}): the
                             lookups here, the rest from tier_disk_* (disk_view) */
};

/* ---- the index and the LRU --------------------------------------------------- */

static size_t bucket(const disk_t *d, const uint8_t hash[32]) {
  uint64_t k;
  memcpy(&k, hash, 8);
  return (size_t)(k & (d->nbuckets - 1));
}

static dent_t *find(const disk_t *d, const uint8_t hash[32]) {
  if (!d->nbuckets) return NULL;
  for (dent_t *e = d->buckets[bucket(d, hash)]; e; e = e->hnext)
    if (memcmp(e->hash, hash, 32) == 0) return e;
  return NULL;
}

/* Room for one more entry: false out of memory. */
static bool index_room(disk_t *d) {
  if (d->count < d->nbuckets) return true;
  size_t nb = d->nbuckets ? d->nbuckets * 2 : 256;
  dent_t **b = calloc(nb, sizeof *b);
  if (!b) return false;
  dent_t **old = d->buckets;
  size_t onb = d->nbuckets;
  d->buckets = b;
  d->nbuckets = nb;
  for (size_t i = 0; i < onb; i++)
    for (dent_t *e = old[i], *next; e; e = next) {
      next = e->hnext;
      size_t k = bucket(d, e->hash);
      e->hnext = b[k];
      b[k] = e;
    }
  free(old);
  return true;
}

static void lru_front(disk_t *d, dent_t *e) {
  e->prev = NULL;
  e->next = d->head;
  if (d->head) d->head->prev = e;
  else d->tail = e;
  d->head = e;
}

static void lru_out(disk_t *d, dent_t *e) {
  if (e->prev) e->prev->next = e->next;
  else d->head = e->next;
  if (e->next) e->next->prev = e->prev;
  else d->tail = e->prev;
  e->prev = e->next = NULL;
}

static void gauges(disk_t *d) {
  d->srv->stats.tier_disk_bytes = d->bytes;
  d->srv->stats.tier_disk_pages = d->count;
  d->srv->stats.tier_disk_bound_bytes = d->cap;
}

/* Adds e (room reserved by index_room) as the most recent. */
static void add(disk_t *d, dent_t *e) {
  size_t k = bucket(d, e->hash);
  e->hnext = d->buckets[k];
  d->buckets[k] = e;
  d->count++;
  d->bytes += e->header_bytes + e->data_bytes;
  lru_front(d, e);
  gauges(d);
}

static void unindex(disk_t *d, dent_t *e) {
  /* The event stream: the page left the disk tier (doc/events.md). */
  if (!e->untold)
    engine_events_tier(d->srv->eng, ENGINE_EV_REMOVED, ENGINE_MEDIUM_DISK, e->tenant, e->cache,
                       0, e->hash, NULL, NULL);
  for (dent_t **p = &d->buckets[bucket(d, e->hash)]; *p; p = &(*p)->hnext)
    if (*p == e) {
      *p = e->hnext;
      break;
    }
  d->count--;
  d->bytes -= e->header_bytes + e->data_bytes;
  lru_out(d, e);
  e->gone = true;
  gauges(d);
}

/* ---- the I/O threads: the work queue's WORK_DISK class ----------------------------- */

static void job_run(work_job_t *w, unsigned part, unsigned nparts) {
  (void)part, (void)nparts;
  djob_t *j = (djob_t *)(void *)w;
  j->run(j->d, j);
}

static void job_done(work_job_t *w) {
  djob_t *j = (djob_t *)(void *)w;
  j->d->inflight--;
  j->done(j->d, j);
}

static void queue(disk_t *d, djob_t *j) {
  j->d = d;
  j->wj = (work_job_t){.run = job_run, .done = job_done, .cls = WORK_DISK};
  d->inflight++;
  work_submit(d->srv->work, &j->wj);
}

/* ---- files ------------------------------------------------------------------------- */

static int write_all(int fd, const void *p, size_t n, off_t off) {
  const uint8_t *b = p;
  while (n) {
    ssize_t w = pwrite(fd, b, n, off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return w < 0 ? errno : EIO;
    b += w, n -= (size_t)w, off += w;
  }
  return 0;
}

static int read_all(int fd, void *p, size_t n, off_t off) {
  uint8_t *b = p;
  while (n) {
    ssize_t r = pread(fd, b, n, off);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return r < 0 ? errno : EIO; /* a short file */
    b += r, n -= (size_t)r, off += r;
  }
  return 0;
}

/* Writes tmp/<name>, then renames it into place: a file by its final name
 * is whole (after a crash its checksums say whether its bytes reached the
 * disk). 0 or an errno. */
static int write_file(int dirfd, const char *name, const void *hdr, size_t hb, const void *data,
                      size_t db) {
  char tmp[DISKFMT_NAME_MAX + 8];
  snprintf(tmp, sizeof tmp, "tmp/%s", name);
  int fd = openat(dirfd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return errno;
  int err = write_all(fd, hdr, hb, 0);
  if (!err) err = write_all(fd, data, db, (off_t)hb);
  if (close(fd) != 0 && !err) err = errno;
  if (!err && renameat(dirfd, tmp, dirfd, name) != 0) err = errno;
  if (err) unlinkat(dirfd, tmp, 0);
  return err;
}

/* ---- unlink ------------------------------------------------------------------------ */

typedef struct ujob {
  djob_t j;
  char name[DISKFMT_NAME_MAX];
} ujob_t;

static void unlink_run(disk_t *d, djob_t *j) {
  (void)unlinkat(d->dirfd, ((ujob_t *)(void *)j)->name, 0);
}

static void unlink_done(disk_t *d, djob_t *j) {
  (void)d;
  free(j);
}

static bool victim_add(struct wjob *w, const char *name);

/* The file of e goes: by the write that needs its room (so that the room is
 * there when it writes), by a job of its own, or now when closing. */
static void unlink_later(disk_t *d, const dent_t *e) {
  char name[DISKFMT_NAME_MAX];
  diskfmt_name(e->hash, name);
  if (d->collect && !d->closing && victim_add(d->collect, name)) return;
  ujob_t *u = malloc(sizeof *u);
  if (!u || d->closing) {
    free(u);
    (void)unlinkat(d->dirfd, name, 0); /* closing (or no memory): at once */
    return;
  }
  memcpy(u->name, name, sizeof name);
  u->j.run = unlink_run;
  u->j.done = unlink_done;
  queue(d, &u->j);
}

/* e leaves the tier: its file goes once no read holds it. */
static void drop(disk_t *d, dent_t *e, bool bad) {
  if (!e->gone) {
    unindex(d, e);
    if (bad) d->srv->stats.tier_disk_discarded++;
    else d->srv->stats.tier_disk_evicted++;
  }
  if (e->readers || e->state == D_WRITING) return; /* its job ends it */
  unlink_later(d, e);
  free(e);
}

/* Least recent out until the files fit within limit (writes in flight
 * stay, and so do files being read back: a read-back holds what it reads). */
static void trim_to(disk_t *d, uint64_t limit) {
  for (dent_t *e = d->tail, *prev; e && d->bytes > limit; e = prev) {
    prev = e->prev;
    if (e->state == D_READY && !e->readers) drop(d, e, false);
  }
}

static void trim(disk_t *d) { trim_to(d, d->cap); }

/* ---- the tenant registry ---------------------------------------------------------- */

typedef struct sjob {
  djob_t j;
  size_t len;
  char text[];
} sjob_t;

/* The registry as text: a line of magic, then "id name" per tenant. */
static sjob_t *registry_text(const tenants_t *t) {
  size_t cap = sizeof REGISTRY_MAGIC + 1 + (size_t)t->n * (12 + TENANT_NAME_MAX);
  sjob_t *s = malloc(sizeof *s + cap);
  if (!s) return NULL;
  size_t n = (size_t)snprintf(s->text, cap, "%s\n", REGISTRY_MAGIC);
  for (uint32_t i = 0; i < t->n; i++)
    n += (size_t)snprintf(s->text + n, cap - n, "%u %s\n", i + 1, t->names[i]);
  s->len = n;
  return s;
}

static int registry_write(int dirfd, const sjob_t *s) {
  return write_file(dirfd, REGISTRY, s->text, s->len, NULL, 0);
}

static void save_run(disk_t *d, djob_t *j) {
  int err = registry_write(d->dirfd, (sjob_t *)(void *)j);
  if (err) LOG_WARN("tier_disk", "op=save_tenants error=\"%s\"", strerror(err));
}

static void save_done(disk_t *d, djob_t *j) {
  (void)d;
  free(j);
}

/* Queues a save when tenants were registered since the last one. */
static void registry_queue(disk_t *d) {
  const tenants_t *t = &d->srv->tenants;
  if (t->n <= d->tenants_saved) return;
  sjob_t *s = registry_text(t);
  if (!s) return;
  d->tenants_saved = t->n;
  s->j.run = save_run;
  s->j.done = save_done;
  queue(d, &s->j);
}

/* Registers the saved names in their order, so that each tenant gets the
 * number its pages' chains were seeded with. A line that does not read, or
 * a name that would get another number, ends the restore there (the pages
 * of the tenants after it are then refused at import: their name and
 * number disagree). */
static void registry_restore(disk_t *d) {
  int fd = openat(d->dirfd, REGISTRY, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return;
  FILE *f = fdopen(fd, "r");
  if (!f) {
    close(fd);
    return;
  }
  char line[128];
  uint32_t n = 0;
  bool ok = fgets(line, sizeof line, f) && strcmp(line, REGISTRY_MAGIC "\n") == 0;
  while (ok && fgets(line, sizeof line, f)) {
    unsigned id;
    char name[TENANT_NAME_MAX];
    ok = sscanf(line, "%u %47s", &id, name) == 2 && id == n + 1 && tenant_name_valid(name) &&
         server_tenant(d->srv, name) == id; /* with its identity (tenantid.c) */
    n += ok;
  }
  fclose(f);
  d->tenants_saved = n;
  LOG_INFO("tier_disk", "op=restore_tenants tenants=%u%s", n, ok ? "" : " complete=no");
}

/* ---- writes: a spilled page --------------------------------------------------------- */

typedef struct wjob {
  djob_t j;
  struct wjob *tnext;      /* this turn's list, until handed over */
  dent_t *e;
  engine_page_t m;         /* m.tokens -> ids below; m.bytes NULL */
  char tenant[DISKFMT_TENANT_MAX];
  char name[DISKFMT_NAME_MAX];
  int err;
  uint8_t *data;           /* data_bytes, then the header, then the ids */
  uint32_t *ids;
  char (*victims)[DISKFMT_NAME_MAX]; /* files to remove before writing */
  size_t nvictims, vcap;
} wjob_t;

static bool victim_add(wjob_t *w, const char *name) {
  if (w->nvictims == w->vcap) {
    size_t cap = w->vcap ? w->vcap * 2 : 4;
    void *v = realloc(w->victims, cap * sizeof *w->victims);
    if (!v) return false;
    w->victims = v;
    w->vcap = cap;
  }
  memcpy(w->victims[w->nvictims++], name, DISKFMT_NAME_MAX);
  return true;
}

static void write_run(disk_t *d, djob_t *j) {
  wjob_t *w = (wjob_t *)(void *)j;
  uint32_t hb = diskfmt_header_bytes(w->m.page_tokens);
  uint8_t *hdr = w->data + w->m.data_bytes;
  for (size_t i = 0; i < w->nvictims; i++) (void)unlinkat(d->dirfd, w->victims[i], 0);
  diskfmt_encode(&w->m, w->tenant, w->data, hdr); /* the checksum, off the loop */
  w->err = write_file(d->dirfd, w->name, hdr, hb, w->data, w->m.data_bytes);
}

static void write_done(disk_t *d, djob_t *j) {
  wjob_t *w = (wjob_t *)(void *)j;
  dent_t *e = w->e;
  server_t *srv = d->srv;
  uint64_t bytes = e->header_bytes + e->data_bytes;
  d->staging -= bytes;
  e->state = D_READY;
  if (!w->err) {
    srv->stats.tier_disk_writes++;
    srv->stats.tier_disk_write_bytes += bytes;
    /* After a full file system: what is written fits (the bound learned
     * at an error leaves out the writes then in flight; those that
     * succeed raise it again, up to disk_bytes). */
    uint64_t held = d->bytes > d->staging ? d->bytes - d->staging : 0;
    if (d->full_logged && held > d->cap) {
      d->cap = held < d->bound ? held : d->bound;
      gauges(d);
    }
    if (e->gone) drop(d, e, false);
  } else {
    srv->stats.tier_disk_write_errors++;
    if (!e->gone) unindex(d, e);
    free(e); /* write_file removed its tmp file: nothing to unlink */
    if (w->err == ENOSPC || w->err == EDQUOT) {
      /* The file system holds less than disk_bytes: the tier keeps to what
       * it holds now (until a reload), least recent out, and puts go on.
       * What it holds is its written files: the writes still in flight
       * (staging) may fail as this one did (the first error of a burst saw
       * 29 pages counted on a 12-page file system, and the bound stayed
       * above what fits); those that succeed raise it (above). */
      d->cap = d->bytes > d->staging ? d->bytes - d->staging : 0;
      gauges(d);
      if (!d->full_logged)
        LOG_WARN("tier_disk_full", "bytes=%llu disk_bytes=%llu action=\"keeping the tier "
                 "within what the file system holds\"", (unsigned long long)d->bytes,
                 (unsigned long long)d->bound);
      d->full_logged = true;
    } else {
      LOG_LIMITED(&d->limit_bad, uv_now(srv->loop), LOG_LEVEL_WARN, "tier_disk",
                  "op=write file=%s error=\"%s\"", w->name, strerror(w->err));
    }
  }
  free(w->victims);
  free(w->data);
  free(w);
}

/* The oldest write of this turn is dropped: its page is not written. */
static void turn_drop_oldest(disk_t *d) {
  wjob_t *w = d->turn_head;
  d->turn_head = w->tnext;
  if (!d->turn_head) d->turn_tail = NULL;
  uint64_t bytes = w->e->header_bytes + w->e->data_bytes;
  d->staging -= bytes;
  d->turn_bytes -= bytes;
  if (!w->e->gone) unindex(d, w->e);
  free(w->e);
  free(w->victims);
  free(w->data);
  free(w);
  d->srv->stats.tier_disk_spill_dropped++;
}

/* The turn's end (before the loop waits): this turn's writes go to the
 * threads, the newest first (a chain's head before its tail), the event
 * stream hears of their pages in that order (a parent before its
 * children; of a page dropped, nothing), and the tier's bound is kept for
 * them: each write removes the files that make its own room before it
 * writes (the threads run writes side by side: room made by another write
 * may not be made yet, and a full file system would refuse this one). */
static void turn_flush(disk_t *d) {
  wjob_t *rev = NULL;
  for (wjob_t *w = d->turn_head, *next; w; w = next) {
    next = w->tnext;
    w->tnext = rev;
    rev = w;
  }
  d->turn_head = d->turn_tail = NULL;
  d->turn_bytes = 0;
  if (!rev) return;
  uint64_t later = 0; /* bytes of the writes after the one collecting */
  for (wjob_t *w = rev; w; w = w->tnext) later += w->e->header_bytes + w->e->data_bytes;
  for (wjob_t *w = rev; w; w = w->tnext) {
    later -= w->e->header_bytes + w->e->data_bytes;
    d->collect = w;
    trim_to(d, d->cap > UINT64_MAX - later ? UINT64_MAX : d->cap + later);
  }
  d->collect = NULL;
  for (wjob_t *w = rev, *next; w; w = next) {
    next = w->tnext;
    const engine_page_t *m = &w->m;
    w->e->untold = false;
    engine_events_tier(d->srv->eng, ENGINE_EV_STORED, ENGINE_MEDIUM_DISK, m->tenant, m->cache,
                       m->page_tokens, m->hash, m->head ? NULL : m->parent, m->tokens);
    queue(d, &w->j);
  }
}

static void on_turn(uv_prepare_t *h) {
  disk_t *d = h->data;
  uv_prepare_stop(h);
  turn_flush(d);
}

/* The engine's reclaimed hook: a cached page leaves memory. The bytes are
 * copied here (the pool page is reused as soon as this returns); the
 * header, its checksums and the file are the thread's. A page that is not
 * portable (a span key's id means nothing after a restart) stays
 * memory-only. */
static void disk_reclaimed(server_t *srv, const engine_page_t *m) {
  disk_t *d = srv->disk;
  if (d->closing || !m->portable) return;
  const void *bytes = m->bytes;
  uint32_t hb = diskfmt_header_bytes(m->page_tokens);
  uint64_t need = hb + m->data_bytes;
  dent_t *e = find(d, m->hash);
  if (e && e->tenant == m->tenant) { /* on disk already (or being written) */
    lru_out(d, e);
    lru_front(d, e);
    return;
  }
  if (e) {
    if (e->state != D_READY) return;
    drop(d, e, true); /* another tenant's number: a stale file */
  }
  /* Writes waiting hold STAGING_MAX at most. This turn's spills make way,
   * the oldest first: eviction spills a chain's tail before its head, so
   * what goes is a tail and what is kept stays reachable from its head.
   * Writes handed to the threads already stay (they are being written in
   * turn); past them the page is dropped, and a page dropped here is the
   * deepest of its chain that this turn spilled. A page the rest of its
   * eviction would make go (m->more pages to come fill the room) is
   * dropped now, uncopied: a shrink of gigabytes copies the 64 MiB it
   * keeps, not every page it evicts. */
  wjob_t *w = NULL;
  uint64_t room = STAGING_MAX - (d->staging - d->turn_bytes);
  if (need > d->cap || need > room || m->more >= room / need || !index_room(d) ||
      !(w = calloc(1, sizeof *w)) || !(e = calloc(1, sizeof *e)) ||
      !(w->data = malloc(need + 4ull * m->page_tokens))) {
    if (w) free(e);
    free(w);
    srv->stats.tier_disk_spill_dropped++;
    return;
  }
  while (d->staging + need > STAGING_MAX) turn_drop_oldest(d);
  registry_queue(d); /* before the page: its tenant's number must be known */
  memcpy(w->data, bytes, m->data_bytes);
  w->ids = (uint32_t *)(void *)(w->data + need);
  memcpy(w->ids, m->tokens, 4ull * m->page_tokens);
  w->m = *m;
  w->m.tokens = w->ids;
  w->m.bytes = NULL;
  snprintf(w->tenant, sizeof w->tenant, "%s", tenants_name(&srv->tenants, m->tenant));
  diskfmt_name(m->hash, w->name);
  memcpy(e->hash, m->hash, 32);
  e->tenant = m->tenant;
  snprintf(e->cache, sizeof e->cache, "%s", m->cache);
  e->header_bytes = hb;
  e->data_bytes = m->data_bytes;
  e->state = D_WRITING;
  e->untold = true; /* its removal from the pool was recorded as the engine reclaimed it */
  w->e = e;
  d->staging += need;
  add(d, e);
  w->j.run = write_run;
  w->j.done = write_done;
  if (d->turn_tail) d->turn_tail->tnext = w;
  else d->turn_head = w;
  d->turn_tail = w;
  d->turn_bytes += need;
  if (!uv_is_active((uv_handle_t *)&d->turn)) uv_prepare_start(&d->turn, on_turn);
}

/* ---- reads: a match reaching pages on disk ---------------------------------------------- */

typedef struct rgroup rgroup_t;
typedef struct rjob {
  djob_t j;
  rgroup_t *g;
  dent_t *e;
  engine_tier_job_t *ej;   /* the pool page it is read into (given back unless imported) */
  uint8_t *dst;            /* that page's bytes */
  uint8_t hash[32];
  uint32_t hb;
  uint64_t db;
  bool ok;                 /* read whole, header and data checked */
  bool bad;                /* the file is not a good page: discard it */
  const char *why;
  diskfmt_info_t info;     /* info.m.tokens points into hdr */
  uint8_t hdr[];
} rjob_t;

struct rgroup {
  tier_wait_t *w;          /* the waiting request's walk; NULL: orphaned (it is gone) */
  unsigned idx;            /* this tier's place in the chain (tiers_done) */
  uint32_t cache_id;
  uint64_t first;          /* the query's pages the pool held: jobs[0] is page first */
  uint64_t t0_ns;          /* when its reads began (the lookup's latency) */
  uint32_t n, ndone;
  bool ended;              /* every read is in */
  rjob_t *jobs[];          /* in chain order */
};

/* Reads the data in pieces, each summed while it is still in the CPU's
 * cache: one pass over memory instead of two. */
#define READ_PIECE (256u * 1024)
static bool read_summed(int fd, uint8_t *dst, uint64_t n, off_t off, const diskfmt_info_t *info) {
  diskfmt_sum_t sum;
  diskfmt_sum_init(&sum);
  for (uint64_t done = 0; done < n;) {
    size_t piece = n - done < READ_PIECE ? (size_t)(n - done) : READ_PIECE;
    if (read_all(fd, dst + done, piece, off + (off_t)done)) return false;
    diskfmt_sum_update(&sum, dst + done, piece);
    done += piece;
  }
  return diskfmt_sum_ok(&sum, info);
}

static void read_run(disk_t *d, djob_t *j) {
  rjob_t *r = (rjob_t *)(void *)j;
  TESTHOOK(disk, NULL);
  char name[DISKFMT_NAME_MAX];
  struct stat st;
  diskfmt_name(r->hash, name);
  int fd = openat(d->dirfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  r->bad = true;
  if (fd < 0) {
    r->why = "cannot open";
    return;
  }
  if (fstat(fd, &st) != 0 || (uint64_t)st.st_size != r->hb + r->db)
    r->why = "file size";
  else if (read_all(fd, r->hdr, r->hb, 0))
    r->why = "read error";
  else if (diskfmt_decode(r->hdr, r->hb, &r->info, &r->why) != 0)
    ; /* why is set */
  else if (memcmp(r->info.m.hash, r->hash, 32) != 0 || r->info.m.data_bytes != r->db)
    r->why = "header of another page";
  else if (!read_summed(fd, r->dst, r->db, (off_t)r->hb, &r->info))
    r->why = "data checksum or read error";
  else
    r->ok = true, r->bad = false;
  close(fd);
}

/* Lets go of the group: every page not imported goes back to the pool,
 * every file read is let go (dropped if it was bad, or out of the index). */
static void group_free(disk_t *d, rgroup_t *g) {
  server_t *srv = d->srv;
  for (uint32_t i = 0; i < g->n; i++) {
    rjob_t *r = g->jobs[i];
    dent_t *e = r->e;
    engine_tier_import_abort(srv->eng, r->ej);
    d->importing--;
    if (r->bad) {
      LOG_LIMITED(&d->limit_bad, uv_now(srv->loop), LOG_LEVEL_WARN, "tier_disk_discard",
                  "reason=\"%s\"", r->why ? r->why : "?");
      drop(d, e, true);
    }
    e->readers--;
    if (e->gone && !e->readers) drop(d, e, false);
    free(r);
  }
  free(g);
}

/* Every read of the group is in: the request runs again (and imports them,
 * disk_import), or, gone, its pages go back. */
static void group_end(disk_t *d, rgroup_t *g) {
  server_t *srv = d->srv;
  for (uint32_t i = 0; i < g->n; i++) {
    rjob_t *r = g->jobs[i];
    if (r->ok) {
      srv->stats.tier_disk_reads++;
      srv->stats.tier_disk_read_bytes += r->hb + r->db;
    }
    /* A page names its tenant: its number must be that name's here, or the
     * registry moved and the page is another tenant's. */
    if (r->ok && strcmp(r->info.tenant, tenants_name(&srv->tenants, r->info.m.tenant)) != 0)
      r->ok = false, r->bad = true, r->why = "its tenant's name and number disagree";
  }
  uint64_t ns = uv_hrtime() - g->t0_ns;
  d->st.lookup_hist[metrics_bucket(ns)]++;
  d->st.lookup_ns += ns;
  g->ended = true;
  if (!g->w) {
    group_free(d, g);
    return;
  }
  tiers_done(srv, g->w->conn_id, g->idx); /* the request runs again */
}

static void read_done(disk_t *d, djob_t *j) {
  rgroup_t *g = ((rjob_t *)(void *)j)->g;
  if (++g->ndone == g->n) group_end(d, g);
}

/* The tier's lookup (tier.h): if pages of the query past those in the pool
 * are on disk, starts reading them into pool pages and the request waits
 * (TIER_WAIT) until all are in (tiers_done), then imports them
 * (disk_import). */
static int disk_lookup(server_t *srv, tier_wait_t *w, unsigned idx, const tier_query_t *q) {
  disk_t *d = srv->disk;
  uint32_t cache_id = q->cache_id;
  const uint32_t *tokens = q->tokens;
  uint64_t n = q->n;
  const engine_pkey_t *key = q->key;
  if (!d || d->closing || !d->count) return TIER_RUN;
  uint32_t tenant;
  engine_stats_t es;
  engine_stats(srv->eng, &es);
  /* Reads in flight hold pool pages: at most half the pool between them. */
  uint64_t room = es.pool_pages / 2 > d->importing ? es.pool_pages / 2 - d->importing : 0;
  size_t cap = room < FETCH_MAX ? (size_t)room : FETCH_MAX;
  if (!cap || engine_cache_tenant(srv->eng, cache_id, &tenant) != 0) return TIER_RUN;
  uint8_t(*h)[32] = malloc(cap * 32);
  uint64_t local, nbytes = 0;
  size_t nh = 0, k = 0;
  if (!h || engine_tier_probe(srv->eng, cache_id, tokens, n, key, &local, NULL, h, cap, &nh) != 0)
    nh = 0;
  dent_t **ents = nh ? malloc(nh * sizeof *ents) : NULL;
  for (dent_t *e; ents && k < nh && (e = find(d, h[k])) && e->state == D_READY &&
                  e->tenant == tenant;)
    ents[k++] = e;
  /* What this request reads is held (readers) and made the most recent,
   * the head of the chain first, before a pool page is taken: taking one
   * evicts, the page evicted spills, and the spill makes room in the tier
   * from its least recent files, which at the bound are these. A file held
   * stays on disk, index or not, until its read is done. */
  for (size_t i = k; i-- > 0;) {
    ents[i]->readers++;
    lru_out(d, ents[i]);
    lru_front(d, ents[i]);
  }
  rgroup_t *g = k ? malloc(sizeof *g + k * sizeof g->jobs[0]) : NULL;
  uint32_t got = 0;
  for (; g && got < k; got++) {
    dent_t *e = ents[got];
    rjob_t *r = calloc(1, sizeof *r + e->header_bytes);
    engine_tier_job_t *ej;
    void *dst;
    if (!r || engine_tier_import_begin(srv->eng, cache_id, &ej, &dst, &nbytes) != 0) {
      free(r); /* no room (or memory): what was begun is read */
      break;
    }
    if (e->data_bytes != nbytes) { /* not a page of this cache's size: never read in */
      engine_tier_import_abort(srv->eng, ej);
      free(r);
      break;
    }
    r->ej = ej;
    r->g = g;
    r->e = e;
    r->dst = dst;
    memcpy(r->hash, e->hash, 32);
    r->hb = e->header_bytes;
    r->db = e->data_bytes;
    r->j.run = read_run;
    r->j.done = read_done;
    g->jobs[got] = r;
    d->importing++;
  }
  for (uint32_t i = got; i < k; i++) { /* not begun: let go */
    dent_t *e = ents[i];
    if (--e->readers == 0 && e->gone) drop(d, e, false);
  }
  free(ents);
  free(h);
  if (!got) {
    free(g);
    return TIER_RUN;
  }
  g->w = w;
  g->idx = idx;
  g->cache_id = cache_id;
  g->first = local;
  g->ended = false;
  g->t0_ns = uv_hrtime();
  d->st.lookups++;
  d->st.lookup_pages += got;
  g->n = got;
  g->ndone = 0;
  w->held[idx] = g;
  for (uint32_t i = 0; i < got; i++) queue(d, &g->jobs[i]->j);
  return TIER_WAIT;
}

/* The request runs again, its reads in: the run of pages read whole, whose
 * files name the query's own ids, goes into the index (the engine
 * recomputes each hash from the query under the page before it); what is
 * not taken goes back to the pool. */
static void disk_import(server_t *srv, tier_wait_t *w, unsigned idx, const tier_query_t *q) {
  disk_t *d = srv->disk;
  rgroup_t *g = w->held[idx];
  w->held[idx] = NULL;
  if (!g) return;
  if (!g->ended) { /* not over (cannot be: the request waited for it): orphaned */
    g->w = NULL;
    return;
  }
  engine_page_in_t *in = g->cache_id == q->cache_id ? calloc(g->n, sizeof *in) : NULL;
  size_t k = 0, got = 0;
  for (; in && k < g->n; k++) {
    rjob_t *r = g->jobs[k];
    uint64_t T = r->info.m.page_tokens, at = (g->first + k) * T;
    if (!r->ok) break;
    if (at + T > q->n || memcmp(r->info.m.tokens, q->tokens + at, T * 4) != 0) {
      r->bad = true; /* its header names other ids under this page's hash */
      r->why = "ids of another page";
      break;
    }
    in[k] = (engine_page_in_t){.hash = r->hash, .job = r->ej};
  }
  if (k && engine_tier_import(srv->eng, q->cache_id, q->tokens, q->n, q->key, g->first, in, k,
                              &got) != 0)
    got = 0;
  for (size_t i = 0; i < got; i++) {
    g->jobs[i]->ej = NULL; /* the engine's now */
    srv->stats.tier_disk_hits++;
    d->st.hit_tokens += g->jobs[i]->info.m.page_tokens;
  }
  free(in);
  group_free(d, g);
}

/* The request is answered or gone: its group is let go, now or (reads in
 * flight) as they end. */
static void disk_forget(server_t *srv, tier_wait_t *w, unsigned idx) {
  rgroup_t *g = w->held[idx];
  w->held[idx] = NULL;
  if (!g) return;
  if (g->ended) group_free(srv->disk, g);
  else g->w = NULL;
}

/* ---- the start-up scan -------------------------------------------------------------- */

typedef struct found {
  uint8_t hash[32];
  uint32_t tenant, hb;
  uint64_t db;
  int64_t mtime_ns;
  char cache[KVC_MAX_NAME + 1];
  uint32_t *ev;            /* with events: parent hash (8 words), head, page_tokens, ids */
} found_t;

typedef struct scanjob {
  djob_t j;
  found_t *f;
  size_t n, cap;
  uint64_t discarded;
  uint64_t t0_ns;
  bool events;             /* keep what the event stream says of each page */
} scanjob_t;

/* Whether the file at fd is a whole page file named hash; fills *f. */
static bool scan_one(int fd, const uint8_t hash[32], uint8_t **buf, size_t *bufcap, found_t *f,
                     bool events) {
  struct stat st;
  uint8_t fixed[DISKFMT_FIXED];
  diskfmt_info_t info;
  const char *why;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || read_all(fd, fixed, sizeof fixed, 0))
    return false;
  uint32_t hb = diskfmt_need(fixed);
  if (!hb) return false;
  if (*bufcap < hb) {
    uint8_t *b = realloc(*buf, hb);
    if (!b) return false;
    *buf = b;
    *bufcap = hb;
  }
  if (read_all(fd, *buf, hb, 0) || diskfmt_decode(*buf, hb, &info, &why) != 0 ||
      memcmp(info.m.hash, hash, 32) != 0 || (uint64_t)st.st_size != hb + info.m.data_bytes)
    return false;
  memcpy(f->hash, hash, 32);
  f->tenant = info.m.tenant;
  f->hb = hb;
  f->db = info.m.data_bytes;
  f->mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
  snprintf(f->cache, sizeof f->cache, "%s", info.m.cache);
  f->ev = NULL;
  if (events && (f->ev = malloc((10 + (size_t)info.m.page_tokens) * sizeof *f->ev))) {
    memcpy(f->ev, info.m.parent, 32);
    f->ev[8] = info.m.head;
    f->ev[9] = info.m.page_tokens;
    memcpy(f->ev + 10, info.m.tokens, 4ull * info.m.page_tokens);
  }
  return true;
}

static int by_mtime(const void *a, const void *b) {
  int64_t x = ((const found_t *)a)->mtime_ns, y = ((const found_t *)b)->mtime_ns;
  return (x > y) - (x < y);
}

/* Headers only (data is checked when a page is read back): a torn, cut or
 * foreign file, or one of another format version, goes now. */
static void scan_run(disk_t *d, djob_t *j) {
  scanjob_t *s = (scanjob_t *)(void *)j;
  int fd = openat(d->dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  DIR *dir = fd >= 0 ? fdopendir(fd) : NULL;
  if (!dir) {
    if (fd >= 0) close(fd);
    return;
  }
  uint8_t *buf = NULL;
  size_t bufcap = 0;
  struct dirent *de;
  while ((de = readdir(dir))) {
    uint8_t hash[32];
    if (!diskfmt_parse_name(de->d_name, hash)) continue; /* not a page file */
    atomic_fetch_add(&d->scanned, 1);
    if (s->n == s->cap) {
      size_t cap = s->cap ? s->cap * 2 : 1024;
      found_t *f = realloc(s->f, cap * sizeof *f);
      if (!f) break;
      s->f = f;
      s->cap = cap;
    }
    int pf = openat(d->dirfd, de->d_name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    bool good = pf >= 0 && scan_one(pf, hash, &buf, &bufcap, &s->f[s->n], s->events);
    if (pf >= 0) close(pf);
    if (good) {
      s->n++;
    } else {
      (void)unlinkat(d->dirfd, de->d_name, 0);
      s->discarded++;
    }
  }
  free(buf);
  closedir(dir);
  if (s->n) qsort(s->f, s->n, sizeof *s->f, by_mtime);
}

static void lru_back(disk_t *d, dent_t *e) {
  e->next = NULL;
  e->prev = d->tail;
  if (d->tail) d->tail->next = e;
  else d->head = e;
  d->tail = e;
}

/* The event stream after a warm restart (AllBlocksCleared went first): the
 * pages kept on disk, each after its parent (loaded[] is in no chain
 * order: a parent is emitted before its children by a walk from the pages
 * whose parent is not among them). */
static size_t hslot(const uint8_t hash[32], size_t cap) {
  uint64_t k;
  memcpy(&k, hash, 8);
  return (size_t)(k & (cap - 1));
}

static void scan_events(disk_t *d, found_t **loaded, size_t n) {
  engine_t *eng = d->srv->eng;
  if (!n || !engine_events_on(eng)) return;
  size_t cap = 1;
  while (cap < 2 * n) cap *= 2;
  size_t *slot = malloc(cap * sizeof *slot), *child = malloc(n * sizeof *child),
         *sib = malloc(n * sizeof *sib), *stack = malloc(n * sizeof *stack);
  if (!slot || !child || !sib || !stack) goto out;
  for (size_t i = 0; i < cap; i++) slot[i] = SIZE_MAX;
  for (size_t i = 0; i < n; i++) { /* hash -> index, linear probing */
    size_t k = hslot(loaded[i]->hash, cap);
    while (slot[k] != SIZE_MAX) k = (k + 1) & (cap - 1);
    slot[k] = i;
    child[i] = sib[i] = SIZE_MAX;
  }
  size_t top = 0;
  for (size_t i = 0; i < n; i++) {
    const uint32_t *ev = loaded[i]->ev;
    size_t p = SIZE_MAX;
    if (!ev[8])
      for (size_t k = hslot((const uint8_t *)ev, cap);
           slot[k] != SIZE_MAX; k = (k + 1) & (cap - 1))
        if (memcmp(loaded[slot[k]]->hash, ev, 32) == 0) {
          p = slot[k];
          break;
        }
    if (p == SIZE_MAX || p == i) {
      stack[top++] = i; /* a head, or its parent is elsewhere (resident, or gone) */
    } else {
      sib[i] = child[p];
      child[p] = i;
    }
  }
  while (top) {
    size_t i = stack[--top];
    const found_t *f = loaded[i];
    engine_events_tier(eng, ENGINE_EV_STORED, ENGINE_MEDIUM_DISK, f->tenant, f->cache, f->ev[9],
                       f->hash, f->ev[8] ? NULL : (const uint8_t *)f->ev, f->ev + 10);
    for (size_t c = child[i]; c != SIZE_MAX; c = sib[c]) stack[top++] = c;
  }
out:
  free(slot), free(child), free(sib), free(stack);
}

static void scan_done(disk_t *d, djob_t *j) {
  scanjob_t *s = (scanjob_t *)(void *)j;
  server_t *srv = d->srv;
  uint64_t loaded = 0;
  found_t **kept = s->events ? malloc((s->n ? s->n : 1) * sizeof *kept) : NULL;
  size_t nkept = 0;
  /* Newest first, each behind the last: the oldest end up least recent,
   * and pages spilled since the start stay ahead of them all. */
  for (size_t i = s->n; i-- > 0;) {
    const found_t *f = &s->f[i];
    if (find(d, f->hash)) continue; /* spilled again since the start */
    dent_t *e = index_room(d) ? calloc(1, sizeof *e) : NULL;
    if (!e) break;
    memcpy(e->hash, f->hash, 32);
    e->tenant = f->tenant;
    snprintf(e->cache, sizeof e->cache, "%s", f->cache);
    e->header_bytes = f->hb;
    e->data_bytes = f->db;
    e->state = D_READY;
    e->mtime_ns = f->mtime_ns;
    add(d, e);
    lru_out(d, e);
    lru_back(d, e);
    if (kept && f->ev) kept[nkept++] = (found_t *)f;
    else if (kept) { /* no memory for its event: nothing of the stream then */
      free(kept);
      kept = NULL;
    }
    loaded++;
  }
  if (kept) scan_events(d, kept, nkept);
  free(kept);
  for (size_t i = 0; i < s->n; i++) free(s->f[i].ev);
  srv->stats.tier_disk_discarded += s->discarded;
  srv->stats.tier_disk_loaded = loaded;
  srv->stats.tier_disk_scanned = atomic_load(&d->scanned);
  srv->stats.tier_disk_loading = 0;
  trim(d);
  LOG_INFO("tier_disk_loaded", "pages=%llu bytes=%llu discarded=%llu ms=%llu",
           (unsigned long long)loaded, (unsigned long long)d->bytes,
           (unsigned long long)s->discarded,
           (unsigned long long)((uv_hrtime() - s->t0_ns) / 1000000u));
  free(s->f);
  free(s);
}

/* ---- start and stop ------------------------------------------------------------------ */

/* Removes what tmp/ holds: writes a crash cut short. */
static void tmp_clear(int top) {
  int fd = openat(top, "tmp", O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
  DIR *dir = fd >= 0 ? fdopendir(fd) : NULL;
  if (!dir) {
    if (fd >= 0) close(fd);
    return;
  }
  struct dirent *de;
  while ((de = readdir(dir)))
    if (de->d_name[0] != '.') (void)unlinkat(dirfd(dir), de->d_name, 0);
  closedir(dir);
}

static void on_turn_closed(uv_handle_t *h) { free(h->data); }

int disk_open(server_t *srv, char *err, size_t errlen) {
  const char *path = srv->cfg.disk_dir;
  if (!path[0]) return 0;
  disk_t *d = calloc(1, sizeof *d);
  if (!d) {
    snprintf(err, errlen, "disk_dir: out of memory");
    return -1;
  }
  d->srv = srv;
  d->dirfd = -1;
  d->bound = d->cap = srv->cfg.disk_bytes;
  atomic_init(&d->scanned, 0);
  srv->disk = d;
  struct stat st;
  if (mkdir(path, 0700) != 0 && errno != EEXIST) {
    snprintf(err, errlen, "disk_dir %s: %s", path, strerror(errno));
    return -1;
  }
  d->dirfd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (d->dirfd < 0 || fstat(d->dirfd, &st) != 0) {
    snprintf(err, errlen, "disk_dir %s: %s", path, strerror(errno));
    return -1;
  }
  /* Whoever may write here could plant pages: only this daemon's user. */
  if (st.st_uid != geteuid() || (st.st_mode & 022)) {
    snprintf(err, errlen, "disk_dir %s: must be owned by uid %u and not writable by group or "
             "others (it is uid %u, mode %04o)", path, (unsigned)geteuid(), (unsigned)st.st_uid,
             (unsigned)(st.st_mode & 07777));
    return -1;
  }
  if (flock(d->dirfd, LOCK_EX | LOCK_NB) != 0) {
    snprintf(err, errlen, "disk_dir %s: %s", path,
             errno == EWOULDBLOCK ? "in use by another kvcached" : strerror(errno));
    return -1;
  }
  if (mkdirat(d->dirfd, "tmp", 0700) != 0 && errno != EEXIST) {
    snprintf(err, errlen, "disk_dir %s/tmp: %s", path, strerror(errno));
    return -1;
  }
  tmp_clear(d->dirfd);
  registry_restore(d);
  uv_prepare_init(srv->loop, &d->turn);
  d->polled = true;
  d->turn.data = d;
  /* One a CPU the daemon may use, up to two: the reads are copies out of
   * the page cache and checksums, threads beyond the CPUs only wait. */
  unsigned want = work_cpus() < DISK_THREADS ? work_cpus() : DISK_THREADS;
  char why[256];
  if (work_threads(srv->work, WORK_DISK, want, why, sizeof why) != 0) {
    snprintf(err, errlen, "disk_dir: %s", why);
    return -1;
  }
  scanjob_t *s = calloc(1, sizeof *s);
  if (!s) {
    snprintf(err, errlen, "disk_dir: out of memory");
    return -1;
  }
  s->t0_ns = uv_hrtime();
  s->events = srv->cfg.events_endpoint[0] != '\0'; /* a stream from the start */
  s->j.run = scan_run;
  s->j.done = scan_done;
  srv->stats.tier_disk_loading = 1;
  gauges(d);
  queue(d, &s->j);
  LOG_INFO("tier_disk", "op=open dir=\"%s\" disk_bytes=%llu", path,
           (unsigned long long)d->bound);
  return 0;
}

/* A clean stop: every indexed page goes to disk unless it is there. */
typedef struct persist {
  disk_t *d;
  uint64_t written, touched, skipped;
  uint64_t told_ns; /* when systemd was last told the stop goes on */
} persist_t;

/* A clean stop of a large pool writes for longer than a unit's
 * TimeoutStopSec: tell systemd (Type=notify) that it makes progress, each
 * second, so it waits 30 s more from then instead of killing it (and a
 * daemon that stops making progress is still killed 30 s later). */
#define PERSIST_EXTEND_USEC 30000000ull
static void persist_tell(persist_t *p, uint64_t now_ns) {
  p->told_ns = now_ns;
  notify_send(&p->d->srv->notify,
              "EXTEND_TIMEOUT_USEC=%llu\nSTATUS=stopping: writing the disk tier, %llu pages "
              "written, %llu kept", PERSIST_EXTEND_USEC, (unsigned long long)p->written,
              (unsigned long long)p->touched);
}

static void persist_one(void *ctx, const engine_page_t *m) {
  persist_t *p = ctx;
  disk_t *d = p->d;
  const void *bytes = m->bytes;
  if (!m->portable) return; /* memory-only */
  if (((p->written + p->touched + p->skipped) & 63) == 63) {
    uint64_t now = uv_hrtime();
    if (now - p->told_ns >= 1000000000ull) persist_tell(p, now);
  }
  char name[DISKFMT_NAME_MAX];
  diskfmt_name(m->hash, name);
  dent_t *e = find(d, m->hash);
  if (e && e->tenant == m->tenant) {
    if (!e->kept) (void)utimensat(d->dirfd, name, NULL, 0); /* recent at the next start */
    e->kept = true;
    lru_out(d, e);
    lru_front(d, e);
    p->touched++;
    return;
  }
  if (e) drop(d, e, true);
  uint32_t hb = diskfmt_header_bytes(m->page_tokens);
  uint64_t need = hb + m->data_bytes;
  while (d->bytes + need > d->cap && d->tail && !d->tail->kept) drop(d, d->tail, false);
  uint8_t *hdr = d->bytes + need <= d->cap && index_room(d) ? malloc(hb) : NULL;
  e = hdr ? calloc(1, sizeof *e) : NULL;
  if (!e) {
    free(hdr);
    p->skipped++;
    return;
  }
  diskfmt_encode(m, tenants_name(&d->srv->tenants, m->tenant), bytes, hdr);
  int err = write_file(d->dirfd, name, hdr, hb, bytes, m->data_bytes);
  free(hdr);
  if (err) {
    free(e);
    p->skipped++;
    if (err == ENOSPC || err == EDQUOT) d->cap = d->bytes;
    return;
  }
  memcpy(e->hash, m->hash, 32);
  e->tenant = m->tenant;
  e->header_bytes = hb;
  e->data_bytes = m->data_bytes;
  e->state = D_READY;
  e->kept = true;
  add(d, e);
  p->written++;
}

static void persist(disk_t *d) {
  uint64_t t0 = uv_hrtime();
  persist_t p = {d, 0, 0, 0, 0};
  persist_tell(&p, t0);
  engine_tier_each(d->srv->eng, persist_one, &p);
  sjob_t *s = registry_text(&d->srv->tenants);
  int err = s ? registry_write(d->dirfd, s) : ENOMEM;
  free(s);
  if (syncfs(d->dirfd) != 0 && !err) err = errno;
  LOG_INFO("tier_persisted", "pages_written=%llu pages_kept=%llu pages_skipped=%llu bytes=%llu "
           "ms=%llu%s%s", (unsigned long long)p.written, (unsigned long long)p.touched,
           (unsigned long long)p.skipped, (unsigned long long)d->bytes,
           (unsigned long long)((uv_hrtime() - t0) / 1000000u), err ? " error=" : "",
           err ? strerror(err) : "");
}

void disk_close(server_t *srv, bool clean) {
  disk_t *d = srv->disk;
  if (!d) return;
  turn_flush(d); /* the last turn's writes: the threads write them before they end */
  work_stop(srv->work, WORK_DISK, true, NULL); /* the queue runs dry before they end */
  d->closing = true;     /* from here on files are removed at once, nothing is queued */
  work_reap(srv->work);  /* what the threads ran last */
  if (clean && d->dirfd >= 0) persist(d);
  for (dent_t *e = d->head, *next; e; e = next) {
    next = e->next;
    free(e);
  }
  free(d->buckets);
  if (d->dirfd >= 0) close(d->dirfd); /* and its lock */
  srv->disk = NULL;
  if (d->polled) { /* d is freed once it is closed */
    uv_close((uv_handle_t *)&d->turn, on_turn_closed);
  } else {
    free(d);
  }
}

void disk_reload(server_t *srv) {
  disk_t *d = srv->disk;
  if (!d) return;
  d->bound = d->cap = srv->cfg.disk_bytes;
  d->full_logged = false;
  trim(d);
  gauges(d);
}

void disk_tick(server_t *srv) {
  if (srv->disk) srv->stats.tier_disk_scanned = atomic_load(&srv->disk->scanned);
}

static bool disk_on(const server_t *srv) { return srv->disk != NULL; }

/* The disk's figures as every tier's (tier_*{tier="disk"}); its own, finer
 * ones are the tier_disk_* of daemon_stats_t. */
static const tier_view_t *disk_view(server_t *srv, arena_t *a) {
  disk_t *d = srv->disk;
  tier_view_t *v = arena_alloc(a, sizeof *v);
  if (!v) return NULL;
  const daemon_stats_t *s = &srv->stats;
  d->st.hit_pages = s->tier_disk_hits;
  d->st.read_bytes = s->tier_disk_read_bytes;
  d->st.writes = s->tier_disk_writes;
  d->st.written_bytes = s->tier_disk_write_bytes;
  d->st.queue_drops = s->tier_disk_spill_dropped;
  d->st.up = 1; /* open: it serves, its start-up scan too (tier_disk_loading) */
  *v = (tier_view_t){"disk", &d->st, NULL, 0, NULL, 0};
  return v;
}

const tier_ops_t tier_disk = {
    .name = "disk",
    .open = disk_open,
    .on = disk_on,
    .close = disk_close,
    .reload = disk_reload,
    .tick = disk_tick,
    .reclaimed = disk_reclaimed,
    .lookup = disk_lookup,
    .import = disk_import,
    .forget = disk_forget,
    .view = disk_view,
};
