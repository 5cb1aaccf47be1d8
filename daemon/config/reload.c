/* reload.c: SIGHUP. The file and the command-line flags are read again into
 * a fresh configuration, as at start; the reloadable options that differ are
 * swapped in, the others are logged as needing a restart. A file that does
 * not read or validate changes nothing: the error is logged and counted
 * (config_reload_failures). systemd hears RELOADING=1 before and READY=1
 * after, either way. */
#include <stdio.h>
#include <time.h>

#include "tier.h"
#include "log.h"
#include "poolresize.h"
#include "quotas.h"
#include "server.h"

static unsigned long long monotonic_usec(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (unsigned long long)ts.tv_sec * 1000000ull + (unsigned long long)ts.tv_nsec / 1000u;
}

int server_reload(server_t *srv) {
  notify_send(&srv->notify, "RELOADING=1\nMONOTONIC_USEC=%llu\nSTATUS=reloading",
              monotonic_usec());
  config_t fresh, merged;
  char path[sizeof srv->config_file], err[512], line[256];
  int changed = -1;
  if (config_load(&srv->cmdline, &fresh, path, sizeof path, err, sizeof err) == 0)
    changed = config_reload_merge(&srv->cfg, &fresh, &merged, err, sizeof err);
  if (changed < 0) {
    srv->stats.config_reload_failures++;
    LOG_ERROR("reload_failed", "error=\"%s\" action=\"kept the running configuration\"", err);
    notify_send(&srv->notify, "READY=1\nSTATUS=reload failed (configuration kept): %s", err);
    return -1;
  }
  srv->cfg = merged;
  snprintf(srv->config_file, sizeof srv->config_file, "%s", path);
  if (srv->cfg.pool_bytes != srv->pool.bytes) { /* an online resize: logged when done */
    char why[256];
    uint64_t want = srv->cfg.pool_bytes;
    int rc = pool_resize_start(srv, NULL, want, 0, uv_hrtime(), why, sizeof why);
    if (rc != 0) {
      srv->cfg.pool_bytes = srv->pool.bytes; /* the configuration in force says what is */
      LOG_ERROR("reload_pool", "pool_bytes=%llu status=%s error=\"%s\" action=\"kept %llu\"",
                (unsigned long long)want, kvc_err_name(rc), why,
                (unsigned long long)srv->pool.bytes);
    }
  }
  log_level = srv->cfg.log_level;
  tiers_reload(srv);
  if (quotas_apply(srv) != 0)
    LOG_ERROR("reload_quotas", "error=\"out of memory\" action=\"kept the previous tenant limits\"");
  status_reschedule(srv);
  fdbudget_adjust(srv);
  srv->stats.config_reloads++;
  LOG_INFO("reloaded", "file=\"%s\" options_changed=%d", path, changed);
  status_line(srv, line, sizeof line);
  notify_send(&srv->notify, "READY=1\nSTATUS=%s", line);
  return 0;
}
