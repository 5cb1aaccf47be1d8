/* promtext.h: the one renderer of Prometheus text exposition format 0.0.4,
 * linked by the daemon (its metrics_listen endpoint) and by libkvcache
 * (kvc_stats_prometheus, which kvcachectl stats --prometheus prints). */
#ifndef KVC_PROMTEXT_H
#define KVC_PROMTEXT_H

#include <stddef.h>

#include "kvcache/kvcache.h"

#define PROMTEXT_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

/* Families in the order they first appear; HELP and TYPE once per family;
 * names prefixed "kvcached_" (process_* keep their standard names); labels cache first, then the stat's own; a
 * histogram as _bucket (le, cumulative, +Inf last), _sum and _count.
 * Returns 0 with new *out (malloc, NUL-terminated) and *len, or
 * KVC_E_NOMEM. */
int promtext_render(const kvc_stat_t *st, size_t n, char **out, size_t *len);

#endif
