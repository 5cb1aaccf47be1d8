/* poolresize.c: one online resize of the pool at a time (poolresize.h). */
#include "poolresize.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dispatch.h"
#include "engine_resize.h"
#include "log.h"
#include "optable.h"
#include "quotas.h"
#include "units.h"

#define RETRY_MS 10u
#define RETRY_FOR_NS (2000ull * 1000 * 1000) /* a shrink waits this long for copies and leases */

typedef struct resize {
  server_t *srv;
  uv_async_t grown;       /* the thread is done (a grow's segment, a shrink's release) */
  uv_timer_t retry;       /* the shrink, run (again) from the loop */
  bool running;
  bool thread_live;       /* joined in on_grown or at the stop */
  int open;               /* handles not yet through their close callback */
  pthread_t thread;
  conn_t *c;              /* the asking connection (offloaded meanwhile), or NULL */
  uint64_t request_id, t0_ns, start_ns, until_ns;
  uint64_t from, bytes;   /* the pool before, and asked */
  poolseg_t made[POOLMAP_SEGMENTS_MAX]; /* what the grow thread made */
  uint32_t nmade;
  int rc;                 /* its result */
  poolseg_t gone[POOLMAP_SEGMENTS_MAX]; /* a shrink: segments the thread releases */
  uint32_t ngone;
  engine_shrink_t shrunk; /* what the engine did for it */
  uint64_t loop_ns;       /* the loop's part: the engine's grow or shrink */
  char err[256];
} resize_t;

/* The figures that follow the pool: segments, reserve, huge pages. */
static void gauges(server_t *srv) {
  srv->stats.pool_segments = srv->pool.nseg;
  srv->stats.pool_reserve_bytes = srv->pool.reserve;
  srv->stats.pool_huge_pages = (uint64_t)poolmap_huge(&srv->pool);
}

/* Ends the resize: counts, logs, and answers the connection that asked. */
static void finish(resize_t *z, int rc, const char *msg, const engine_shrink_t *sh) {
  server_t *srv = z->srv;
  conn_t *c = z->c;
  uint64_t us = (uv_hrtime() - z->start_ns) / 1000u;
  engine_shrink_t none = {0, 0};
  if (!sh) sh = &none;
  z->running = false;
  z->c = NULL;
  srv->cfg.pool_bytes = srv->pool.bytes; /* the configuration in force says what is */
  gauges(srv);
  if (rc == 0) {
    srv->stats.pool_resizes++;
    srv->stats.pool_resize_moved_pages += sh->moved_pages;
    srv->stats.pool_resize_evicted_pages += sh->evicted_pages;
    LOG_INFO("pool_resized", "from=%llu bytes=%llu segments=%u moved_pages=%llu "
             "evicted_pages=%llu us=%llu loop_us=%llu by=%s", (unsigned long long)z->from,
             (unsigned long long)srv->pool.bytes, srv->pool.nseg,
             (unsigned long long)sh->moved_pages, (unsigned long long)sh->evicted_pages,
             (unsigned long long)us, (unsigned long long)(z->loop_ns / 1000u),
             c ? "request" : "reload");
  } else {
    srv->stats.pool_resize_failures++;
    LOG_WARN("pool_resize_refused", "bytes=%llu asked=%llu status=%s error=\"%s\"",
             (unsigned long long)srv->pool.bytes, (unsigned long long)z->bytes,
             kvc_err_name(rc), msg);
  }
  if (!c) return;
  metrics_record(&srv->stats, OP_POOL_RESIZE, uv_hrtime() - z->t0_ns, rc);
  if (!conn_offload_end(c)) return; /* closed meanwhile: freed */
  Kvcache__V1__Response resp = KVCACHE__V1__RESPONSE__INIT;
  Kvcache__V1__PoolResizeReply pr = KVCACHE__V1__POOL_RESIZE_REPLY__INIT;
  resp.id = z->request_id;
  resp.status = dispatch_status(rc);
  resp.error = (char *)(rc ? msg : "");
  if (rc == 0) {
    pr.bytes = srv->pool.bytes;
    pr.segments = srv->pool.nseg;
    pr.evicted_pages = sh->evicted_pages;
    pr.moved_pages = sh->moved_pages;
    pr.elapsed_us = us;
    pr.loop_us = z->loop_ns / 1000u;
    resp.body_case = KVCACHE__V1__RESPONSE__BODY_POOL_RESIZE;
    resp.pool_resize = &pr;
  }
  if (conn_send(c, &resp) != 0) return; /* conn_send closed it */
  conn_resume(c);
}

/* What is set in pages follows the pool's new size: the pin limit and the
 * tenants' shares and floors. */
static void limits_follow(server_t *srv) {
  (void)engine_set_pin_limit(srv->eng, srv->cfg.pin_limit_pct);
  if (quotas_apply(srv) != 0)
    LOG_ERROR("pool_resize", "error=\"out of memory\" action=\"kept the previous tenant limits\"");
}

static void *grow_thread(void *arg) {
  resize_t *z = arg;
  z->rc = poolmap_make_run(&z->srv->pool, z->from, z->bytes - z->from, z->made, &z->nmade,
                           z->err, sizeof z->err);
  uv_async_send(&z->grown);
  return NULL;
}

/* A shrink's segments are unmapped and closed here, off the loop: tearing
 * down the mapping and freeing a memfd's memory cost more than the copies
 * (about 130 and 250 ms a GiB here). The map no longer names them, and the
 * next resize waits for this one to end. */
static void *release_thread(void *arg) {
  resize_t *z = arg;
  for (uint32_t i = 0; i < z->ngone; i++) poolmap_discard(&z->srv->pool, &z->gone[i]);
  uv_async_send(&z->grown);
  return NULL;
}

static void on_grown(uv_async_t *a) {
  resize_t *z = a->data;
  server_t *srv = z->srv;
  if (!z->thread_live) return;
  pthread_join(z->thread, NULL);
  z->thread_live = false;
  if (z->ngone) { /* a shrink's release */
    z->ngone = 0;
    finish(z, 0, "", &z->shrunk);
    return;
  }
  if (z->rc != 0) {
    finish(z, KVC_E_NOMEM, z->err, NULL);
    return;
  }
  uint64_t t0 = uv_hrtime();
  uint64_t grown = 0;
  for (uint32_t i = 0; i < z->nmade; i++) grown += z->made[i].bytes;
  int rc = engine_pool_grow(srv->eng, srv->pool.bytes + grown);
  z->loop_ns = uv_hrtime() - t0;
  if (rc != 0) {
    for (uint32_t i = 0; i < z->nmade; i++) poolmap_discard(&srv->pool, &z->made[i]);
    z->nmade = 0;
    finish(z, rc, engine_last_error(srv->eng)->msg, NULL);
    return;
  }
  for (uint32_t i = 0; i < z->nmade; i++) poolmap_add(&srv->pool, &z->made[i]);
  z->nmade = 0;
  limits_follow(srv);
  finish(z, 0, "", NULL);
}

/* The shrink, on the loop: evicting and moving pages takes the loop for
 * the time of their copies. A put or get copying, or a lease, in the part
 * to release is waited for a little (they end by themselves), then the
 * refusal says what holds it. */
static void on_retry(uv_timer_t *t) {
  resize_t *z = t->data;
  server_t *srv = z->srv;
  engine_shrink_t sh = {0, 0};
  if (z->bytes == srv->pool.bytes) { /* asked for the size it has */
    finish(z, 0, "", NULL);
    return;
  }
  engine_set_now(srv->eng, uv_now(srv->loop));
  uint64_t t0 = uv_hrtime();
  int rc = engine_pool_shrink(srv->eng, z->bytes, &sh);
  z->loop_ns += uv_hrtime() - t0; /* every try held the loop */
  if (rc == KVC_E_BUSY && uv_hrtime() < z->until_ns) {
    uv_timer_start(&z->retry, on_retry, RETRY_MS, 0);
    return;
  }
  if (rc != 0) {
    finish(z, rc, engine_last_error(srv->eng)->msg, &sh);
    return;
  }
  poolmap_detach_to(&srv->pool, z->bytes, z->gone, &z->ngone);
  limits_follow(srv);
  z->shrunk = sh;
  z->thread_live = true;
  if (pthread_create(&z->thread, NULL, release_thread, z) != 0) { /* here, then */
    z->thread_live = false;
    for (uint32_t i = 0; i < z->ngone; i++) poolmap_discard(&srv->pool, &z->gone[i]);
    z->ngone = 0;
    finish(z, 0, "", &sh);
  }
}

void pool_resize_init(server_t *srv) {
  resize_t *z = calloc(1, sizeof *z);
  if (!z) return; /* resize is then refused: out of memory */
  z->srv = srv;
  uv_async_init(srv->loop, &z->grown, on_grown);
  uv_timer_init(srv->loop, &z->retry);
  z->grown.data = z->retry.data = z;
  srv->resize = z;
  gauges(srv);
}

static void on_closed(uv_handle_t *h) {
  resize_t *z = h->data;
  if (--z->open == 0) free(z); /* both handles are closed */
}

void pool_resize_stop(server_t *srv) {
  resize_t *z = srv->resize;
  if (!z) return;
  srv->resize = NULL;
  if (z->thread_live) { /* a grow in flight (its segment is not wanted now), or a release */
    pthread_join(z->thread, NULL);
    if (!z->ngone && z->rc == 0)
      for (uint32_t i = 0; i < z->nmade; i++) poolmap_discard(&srv->pool, &z->made[i]);
  }
  z->open = 2;
  uv_close((uv_handle_t *)&z->grown, on_closed);
  uv_close((uv_handle_t *)&z->retry, on_closed);
}

static uint64_t gcd(uint64_t a, uint64_t b) {
  while (b) {
    uint64_t t = a % b;
    a = b;
    b = t;
  }
  return a;
}

int pool_resize_start(server_t *srv, conn_t *c, uint64_t bytes, uint64_t request_id,
                      uint64_t t0_ns, char *err, size_t errlen) {
  resize_t *z = srv->resize;
  poolmap_t *pm = &srv->pool;
  uint64_t pb = config_segment_bytes(&srv->cfg), unit = pb / gcd(pb, 4096) * 4096;
  if (!z) { /* pool_resize_init ran out of memory at start */
    snprintf(err, errlen, "this daemon cannot resize its pool: out of memory at start");
    return KVC_E_NOMEM;
  }
  if (!pm->nseg) { /* a pool not mapped in segments (only a test harness's) */
    snprintf(err, errlen, "this pool is not mapped in segments: it cannot be resized");
    return KVC_E_INVAL;
  }
  if (z->running) {
    snprintf(err, errlen, "a resize of the pool is running; ask again when it is done");
    return KVC_E_BUSY;
  }
  char a[UNITS_LEN], b[UNITS_LEN];
  if (bytes % unit || bytes < 4 * pb) {
    snprintf(err, errlen, "a pool is a multiple of %s (segment_bytes and the system page) of "
             "at least 4 segments, not %s", units_bytes(unit, a, sizeof a),
             units_bytes(bytes, b, sizeof b));
    return KVC_E_INVAL;
  }
  uint64_t adds = !pm->seg_bytes ? 1 : bytes > pm->bytes ? (bytes - pm->bytes) / pm->seg_bytes : 0;
  if (bytes > pm->bytes && bytes > pm->reserve) {
    snprintf(err, errlen, "the pool may grow to %s at most (the address space it reserved at "
             "start: pool_reserve_bytes)", units_bytes(pm->reserve, a, sizeof a));
    return KVC_E_INVAL;
  }
  if (bytes > pm->bytes && pm->nseg + adds > POOLMAP_SEGMENTS_MAX) {
    snprintf(err, errlen, "the pool may have %u segments at most", (unsigned)POOLMAP_SEGMENTS_MAX);
    return KVC_E_INVAL;
  }
  if (bytes < pm->bytes && !poolmap_is_boundary(pm, bytes)) {
    char sizes[512];
    poolmap_boundaries(pm, sizes, sizeof sizes);
    snprintf(err, errlen, "the pool shrinks by whole segments, and each grow added one: it can "
             "shrink to %s", sizes[0] ? sizes : "nothing smaller (it is one segment)");
    return KVC_E_INVAL;
  }
  z->c = c;
  z->request_id = request_id;
  z->t0_ns = t0_ns;
  z->start_ns = uv_hrtime();
  z->from = pm->bytes;
  z->bytes = bytes;
  z->running = true;
  z->loop_ns = 0;
  if (c) conn_offload_begin(c);
  if (bytes == pm->bytes) {
    uv_timer_start(&z->retry, on_retry, 0, 0); /* nothing to do: answered from the loop */
    z->until_ns = 0;
    return 0;
  }
  if (bytes < pm->bytes) {
    z->until_ns = z->start_ns + RETRY_FOR_NS;
    uv_timer_start(&z->retry, on_retry, 0, 0);
    return 0;
  }
  z->thread_live = true;
  int rc = pthread_create(&z->thread, NULL, grow_thread, z);
  if (rc != 0) {
    z->thread_live = false;
    finish(z, KVC_E_NOMEM, "cannot start the thread that backs a new segment", NULL);
  }
  return 0;
}
