/* flow.c: a client that pipelines thousands of requests without reading its
 * replies is bounded (reading pauses under write backpressure, at most
 * frames_per_turn requests per loop turn) and cannot starve another client;
 * every reply still arrives, in order. */
#include "harness.h"
#include "raw.h"

#define NREQ 3000

TEST(flow_pipelined_flood_is_bounded_and_fair) {
  daemon_t d;
  daemon_start(&d);
  kvc_client_t *c = client_open(&d);
  int fd = it_connect_raw(d.sock);
  raw_hello(fd, KVC_PROTOCOL_VERSION);
  Kvcache__V1__Response *r = raw_reply(fd);
  ASSERT(r && r->status == KVCACHE__V1__STATUS__OK);
  kvcache__v1__response__free_unpacked(r, NULL);

  /* 3000 stats requests in one write: ~10 KiB of reply each, far more than
   * the socket and write_queue_bytes (4 MiB) hold. */
  Kvcache__V1__Request req = KVCACHE__V1__REQUEST__INIT;
  Kvcache__V1__StatsRequest sr = KVCACHE__V1__STATS_REQUEST__INIT;
  req.body_case = KVCACHE__V1__REQUEST__BODY_STATS;
  req.stats = &sr;
  uint8_t *burst = malloc(NREQ * 16), *p = burst;
  for (uint64_t i = 0; i < NREQ; i++) {
    req.id = 1000 + i;
    size_t n = kvcache__v1__request__get_packed_size(&req);
    p[0] = (uint8_t)n, p[1] = p[2] = p[3] = 0;
    kvcache__v1__request__pack(&req, p + 4);
    p += 4 + n;
  }
  raw_send(fd, burst, (size_t)(p - burst));
  free(burst);

  /* Another client is served while the flood is parked. */
  for (int i = 0; i < 20; i++) ASSERT_OK(kvc_ping(c));
  uint64_t pauses = 0;
  for (int i = 0; i < 1000 && pauses == 0; i++) {
    pauses = stat_get(c, "write_pauses_total", NULL);
    if (!pauses) it_sleep_ms(10);
  }
  ASSERT(pauses >= 1);
  ASSERT(stat_get(c, "deferred_turns_total", NULL) >= 1);
  ASSERT(stat_get(c, "requests_total{op=stats}", NULL) < NREQ); /* not all run yet */

  /* Every reply arrives, in order. */
  for (uint64_t i = 0; i < NREQ; i++) {
    r = raw_reply(fd);
    ASSERT(r != NULL);
    ASSERT_U64_EQ(r->id, 1000 + i);
    ASSERT_EQ(r->status, KVCACHE__V1__STATUS__OK);
    ASSERT(r->body_case == KVCACHE__V1__RESPONSE__BODY_STATS && r->stats->n_stats > 50);
    kvcache__v1__response__free_unpacked(r, NULL);
  }
  close(fd);
  ASSERT(stat_get(c, "requests_total{op=stats}", NULL) >= NREQ);
  ASSERT_U64_EQ(stat_get(c, "connections_dropped_total", NULL), 0);
  kvc_client_close(c);
  daemon_stop(&d);
}

#define NHALF 2000u /* pings sent before the half-close: frames_per_turn is 32 */
TEST(flow_half_closed_client_gets_its_replies) {
  daemon_t d;
  daemon_start(&d);
  int fd = it_connect_raw(d.sock);
  raw_hello(fd, KVC_PROTOCOL_VERSION);
  Kvcache__V1__Response *r = raw_reply(fd);
  ASSERT(r && r->status == KVCACHE__V1__STATUS__OK);
  kvcache__v1__response__free_unpacked(r, NULL);
  Kvcache__V1__Request req = KVCACHE__V1__REQUEST__INIT;
  Kvcache__V1__Ping ping = KVCACHE__V1__PING__INIT;
  req.body_case = KVCACHE__V1__REQUEST__BODY_PING;
  req.ping = &ping;
  for (uint64_t i = 0; i < NHALF; i++) { /* many turns' worth, answered after EOF */
    req.id = 40 + i;
    raw_send_request(fd, &req);
  }
  ASSERT_EQ(shutdown(fd, SHUT_WR), 0);
  for (uint64_t i = 0; i < NHALF; i++) {
    r = raw_reply(fd);
    ASSERT(r != NULL);
    ASSERT_U64_EQ(r->id, 40 + i);
    kvcache__v1__response__free_unpacked(r, NULL);
  }
  ASSERT(raw_closed(fd));
  close(fd);
  kvc_client_t *c = client_open(&d);
  ASSERT_U64_EQ(stat_get(c, "requests_total{op=ping}", NULL), NHALF);
  kvc_client_close(c);
  daemon_stop(&d);
}
