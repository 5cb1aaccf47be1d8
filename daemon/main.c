/* main.c: kvcached's entry point: the command line, startup in order (pool,
 * engine, signals, socket, then READY=1), the loop, and the exit. */
#include <errno.h>
#include <libgen.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "config.h"
#include "dispatch.h"
#include "http.h"
#include "conn.h"
#include "events.h"
#include "kvcache/kvcache.h"
#include "log.h"
#include "poolown.h"
#include "offload.h"
#include "poolresize.h"
#include "quotas.h"
#include "ring.h"
#include "tier.h"
#include "work.h"
#include "server.h"
#include "testhook.h"

#define EXPIRE_INTERVAL_MS 1000u

/* Soft (TTL) pins lapse here, so a lapse is seen within a second of its
 * deadline even when no request arrives; unused prefix keys are freed and
 * idle connections closed here too. */
static void on_expire(uv_timer_t *t) {
  server_t *srv = t->data;
  engine_set_now(srv->eng, uv_now(srv->loop));
  size_t n = engine_expire(srv->eng);
  if (n) LOG_DEBUG("pins_lapsed", "count=%zu", n);
  if ((n = engine_keys_collect(srv->eng))) LOG_DEBUG("keys_freed", "count=%zu", n);
  conn_idle_sweep(srv);
  tiers_tick(srv);
}

/* Everything that can fail at start, in order; READY=1 comes after. */
static int start(server_t *srv, char *err, size_t errlen) {
  if (notify_open(&srv->notify, err, errlen) != 0) return -1;
  uint64_t reserve = srv->cfg.pool_reserve_bytes ? srv->cfg.pool_reserve_bytes
                                                 : poolmap_default_reserve(srv->cfg.pool_bytes);
  poolmap_prefault_expect(srv->cfg.pool_bytes); /* poolmap_open says when it starts */
  if (poolmap_open(&srv->pool, srv->cfg.pool_bytes, reserve,
                   srv->cfg.pool_huge_pages ? POOL_HUGE_AUTO : POOL_HUGE_OFF,
                   srv->cfg.page_bytes ? 0 : config_segment_bytes(&srv->cfg), err, errlen) != 0)
    return -1;
  /* Every tenant's bytes live in this process: no process of our uid may
   * ptrace it, read its memory or reopen its descriptors through /proc. */
  if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0) {
    snprintf(err, errlen, "prctl(PR_SET_DUMPABLE, 0): %s", strerror(errno));
    return -1;
  }
  engine_config_t ec = {.base = srv->pool.base,
                        .pool_bytes = srv->pool.bytes,
                        .page_bytes = config_grain_bytes(&srv->cfg),
                        .segment_bytes = config_segment_bytes(&srv->cfg),
                        .page_align = srv->cfg.page_bytes ? 0 : 4096,
                        .max_caches = srv->cfg.max_caches,
                        .max_seqs = srv->cfg.max_seqs,
                        .hash = (kvc_hash_t)srv->cfg.prefix_hash,
                        .pin_limit_pct = srv->cfg.pin_limit_pct};
  int rc = engine_new(&ec, &srv->eng);
  if (rc != 0) {
    snprintf(err, errlen, "engine: %s", kvc_strerror(rc));
    return -1;
  }
  poolown_init(srv);
  /* The shared caches' identity, then the registry the disk tier kept
   * (it gives each tenant back its number, and server_tenant its identity),
   * before quotas_apply registers any tenant. */
  if ((rc = server_tenant_shared(srv)) != 0) {
    snprintf(err, errlen, "engine: %s", kvc_strerror(rc));
    return -1;
  }
  if (!(srv->work = work_new(srv->loop, err, errlen))) return -1;
  if (tiers_open(srv, err, errlen) != 0) return -1; /* the disk's registry comes first */
  if ((rc = quotas_apply(srv)) != 0) {
    snprintf(err, errlen, "engine quotas: %s", kvc_strerror(rc));
    return -1;
  }
  if (offload_start(srv, srv->cfg.offload_threads, err, errlen) != 0) return -1;
  pool_resize_init(srv);
  /* Signals before the socket: a SIGTERM sent once the socket accepts (a
   * supervisor, a test) drains; it must not find the default action. They
   * are handled from the loop, so not before the start is done. */
  signals_start(srv);
  if (poolmap_stop_asked) raise(SIGTERM); /* asked before the loop took the signals: now */
  if (ring_poller_start(srv, conn_run_ring) != 0) {
    snprintf(err, errlen, "ring poller: out of memory");
    return -1;
  }
  if (server_listen(srv, err, errlen) != 0) return -1;
  if (http_start(srv, err, errlen) != 0) return -1;
  if (events_init(srv, err, errlen) != 0) return -1;
  uv_timer_init(srv->loop, &srv->status_timer);
  uv_timer_init(srv->loop, &srv->drain_timer);
  srv->drain_timer.data = srv;
  status_start(srv);
  uv_timer_init(srv->loop, &srv->expire_timer);
  srv->expire_timer.data = srv;
  uv_timer_init(srv->loop, &srv->bg_timer); /* conn.c starts it */
  srv->bg_timer.data = srv;
  uv_timer_start(&srv->expire_timer, on_expire, EXPIRE_INTERVAL_MS, EXPIRE_INTERVAL_MS);
  fdbudget_adjust(srv); /* every descriptor of an idle daemon is open now */
  return 0;
}

static void announce(server_t *srv, const char *argv0) {
  char opts[32768], self[4096], line[256];
  config_format(&srv->cfg, opts, sizeof opts);
  LOG_INFO("start", "version=%s pid=%d config_file=\"%s\"", KVC_VERSION_STRING,
           (int)getpid(), srv->config_file);
  LOG_INFO("config", "%s", opts);
  static const char *const huge[] = {"none", "transparent", "hugetlb"};
  uint64_t seg = config_segment_bytes(&srv->cfg);
  if (srv->cfg.zero_copy_tenant[0] && !srv->cfg.page_bytes)
    LOG_WARN("config", "option=zero_copy_tenant state=ignored action=\"every tenant reads its "
             "own pages in place (arenas: doc/security.md); it limits nothing but who opens "
             "caches\"");
  if (srv->cfg.page_bytes)
    LOG_WARN("config", "option=page_bytes state=deprecated action=\"one page size: segment "
             "and grain of %llu bytes; segment_bytes replaces it (pages of each cache's own "
             "size)\"", (unsigned long long)srv->cfg.page_bytes);
  LOG_INFO("pool", "bytes=%llu segment_bytes=%llu segments=%llu grain_bytes=%llu "
           "prefaulted=yes sealed=yes reserve_bytes=%llu huge_pages=%s",
           (unsigned long long)srv->pool.bytes, (unsigned long long)seg,
           (unsigned long long)(srv->pool.bytes / seg),
           (unsigned long long)config_grain_bytes(&srv->cfg),
           (unsigned long long)srv->pool.reserve, huge[poolmap_huge(&srv->pool)]);
  if (srv->activated)
    LOG_INFO("listen", "socket=%s source=systemd", srv->listen_path);
  else
    LOG_INFO("listen", "socket=%s source=config mode=%04o", srv->listen_path,
             srv->cfg.socket_mode);
  status_line(srv, line, sizeof line);
  if (notify_send(&srv->notify, "READY=1\nSTATUS=%s", line) != 0)
    LOG_WARN("notify", "state=READY error=\"send to NOTIFY_SOCKET failed\"");
  else if (notify_enabled(&srv->notify))
    LOG_DEBUG("notify", "state=READY");
  snprintf(self, sizeof self, "%s", argv0);
  printf("kvcached %s listening on %s\n", KVC_VERSION_STRING, srv->listen_path);
  printf("try: %s/kvcachectl stats --socket %s\n", dirname(self), srv->listen_path);
  fflush(stdout);
}

/* The actions that only read the configuration. Returns the exit status. */
static int act(const config_cmdline_t *cmd) {
  config_t cfg;
  char path[4096], err[1024];
  if (cmd->action == CONFIG_HELP) {
    config_print_help(stdout);
    return 0;
  }
  if (cmd->action == CONFIG_VERSION) {
    printf("kvcached %s (protocol %d)\n", KVC_VERSION_STRING, KVC_PROTOCOL_VERSION);
    return 0;
  }
  if (cmd->action == CONFIG_EXAMPLE) {
    config_print_example(stdout);
    return 0;
  }
  if (config_load(cmd, &cfg, path, sizeof path, err, sizeof err) != 0) {
    fprintf(stderr, "kvcached: %s\n", err);
    return 2;
  }
  if (cmd->action == CONFIG_PRINT) {
    config_print(&cfg, stdout);
  } else {
    /* Say where every value came from: the file, and each flag. */
    printf("kvcached: configuration OK (file %s", path[0] ? path : "none");
    if (cmd->nflags) {
      printf("; %d flag%s:", cmd->nflags, cmd->nflags == 1 ? "" : "s");
      for (int i = 0; i < cmd->nflags; i++)
        printf(" --%s=%s", cmd->flags[i].name, cmd->flags[i].value);
    }
    printf("%s)\n", !path[0] && !cmd->nflags ? "; defaults" : "");
  }
  return 0;
}

/* A SIGTERM or SIGINT before the loop handles them (the pool is backed
 * first): the start stops and the daemon exits 0, as a drain of nothing. */
static void on_early_stop(int sig) {
  (void)sig;
  poolmap_stop_asked = 1;
}

int main(int argc, char **argv) {
  static server_t srv;
  static uv_loop_t loop;
  char err[1024];
  if (config_cmdline_parse(argc, argv, &srv.cmdline, err, sizeof err) != 0) {
    fprintf(stderr, "kvcached: %s\n", err);
    return 2;
  }
  if (srv.cmdline.action != CONFIG_RUN) return act(&srv.cmdline);
  if (config_load(&srv.cmdline, &srv.cfg, srv.config_file, sizeof srv.config_file, err,
                  sizeof err) != 0) {
    fprintf(stderr, "kvcached: %s\n", err);
    return 2;
  }
  log_level = srv.cfg.log_level;
  signal(SIGPIPE, SIG_IGN);
  struct sigaction early = {.sa_handler = on_early_stop};
  sigemptyset(&early.sa_mask);
  sigaction(SIGTERM, &early, NULL);
  sigaction(SIGINT, &early, NULL);
  uv_loop_init(&loop);
  srv.loop = &loop;
  /* The calls up from the layers below (server.h): none of them names a
   * file above it. */
  srv.up = (server_up_t){.frame = dispatch_frame,
                         .fast = dispatch_fast,
                         .closing = events_unsubscribe,
                         .gone = server_conn_gone,
                         .resume = conn_tier_done,
                         .copied = conn_copied,
                         .seqs_free = conn_unpark_all};
  srv.next_conn_id = 1;
  srv.notify.fd = -1;
  srv.listen_spare = -1;
  arena_init(&srv.arena);
  metrics_init(&srv.stats, uv_hrtime());
  int status = 0;
  if (start(&srv, err, sizeof err) != 0) {
    if (poolmap_stop_asked) { /* asked to stop while starting: a clean stop */
      LOG_INFO("exit", "status=0 reason=\"stopped while starting: %s\"", err);
      notify_send(&srv.notify, "STOPPING=1\nSTATUS=stopped while starting");
    } else {
      LOG_ERROR("start_failed", "reason=\"%s\"", err);
      notify_send(&srv.notify, "STATUS=start failed: %s", err);
      fprintf(stderr, "kvcached: %s\n", err);
      status = 1;
    }
    server_unlisten(&srv);
    http_stop(&srv);
    tiers_stop(&srv);
    events_stop(&srv);
    signals_stop(&srv);
  } else {
    announce(&srv, argv[0]);
    testhook_init();
    uv_run(&loop, UV_RUN_DEFAULT);
    LOG_INFO("exit", "status=0 connections_total=%llu",
             (unsigned long long)srv.stats.connections_total);
  }
  tiers_close(&srv, status == 0 && srv.draining); /* a clean stop persists the index */
  offload_stop(&srv); /* every copy ended: the loop ran out of work */
  work_free(srv.work);
  srv.work = NULL;
  ring_poller_stop(&srv);
  uv_run(&loop, UV_RUN_NOWAIT); /* let closed handles finish */
  uv_loop_close(&loop);
  events_free(&srv);
  engine_free(srv.eng);
  poolmap_close(&srv.pool);
  notify_close(&srv.notify);
  arena_deinit(&srv.arena);
  tenants_free(&srv.tenants);
  return status;
}
