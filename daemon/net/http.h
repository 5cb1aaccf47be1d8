/* http.h: the metrics_listen scrape endpoint (GET /metrics), see http.c. */
#ifndef KVCD_HTTP_H
#define KVCD_HTTP_H

#include <stddef.h>

#include "server.h"

/* Listens on cfg.metrics_listen ("" : not at all). 0, or -1 with err. */
int http_start(server_t *srv, char *err, size_t errlen);
/* Closes the listener and the scrapes still open. Idempotent. */
void http_stop(server_t *srv);

#endif
