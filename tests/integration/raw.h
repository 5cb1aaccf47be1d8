/* raw.h: a client that speaks the protocol by hand over a plain socket, for
 * tests of framing, pipelining and refusals that libkvcache never produces. */
#ifndef KVC_IT_RAW_H
#define KVC_IT_RAW_H

#include <sys/time.h>

#include "harness.h"
#include "kvcache.pb-c.h"

IT_UNUSED static void raw_send(int fd, const void *p, size_t n) {
  ASSERT_EQ(send(fd, p, n, MSG_NOSIGNAL), (long long)n);
}

IT_UNUSED static void raw_send_request(int fd, Kvcache__V1__Request *req) {
  size_t n = kvcache__v1__request__get_packed_size(req);
  uint8_t *buf = malloc(4 + n);
  buf[0] = (uint8_t)n, buf[1] = (uint8_t)(n >> 8), buf[2] = (uint8_t)(n >> 16), buf[3] = 0;
  kvcache__v1__request__pack(req, buf + 4);
  raw_send(fd, buf, 4 + n);
  free(buf);
}

/* Reads one reply (closing any fd that comes with it); NULL at EOF. */
IT_UNUSED static Kvcache__V1__Response *raw_reply(int fd) {
  uint8_t buf[65536];
  size_t have = 0, need = 4;
  while (have < need) {
    char ctl[CMSG_SPACE(2 * sizeof(int))]; /* the buffer and the read-only pool */
    struct iovec iov = {.iov_base = buf + have, .iov_len = need - have};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl,
                         .msg_controllen = sizeof ctl};
    ssize_t n = recvmsg(fd, &msg, 0);
    if (n <= 0) return NULL;
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm))
      if (cm->cmsg_type == SCM_RIGHTS) {
        int passed[2];
        size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        if (k > 2) k = 2;
        memcpy(passed, CMSG_DATA(cm), k * sizeof(int));
        for (size_t i = 0; i < k; i++) close(passed[i]);
      }
    have += (size_t)n;
    if (need == 4 && have >= 4) need = 4 + (buf[0] | buf[1] << 8 | buf[2] << 16);
    ASSERT(need <= sizeof buf);
  }
  return kvcache__v1__response__unpack(NULL, need - 4, buf + 4);
}

/* True once the daemon has closed fd (EOF or reset within 5 s). */
IT_UNUSED static bool raw_closed(int fd) {
  struct timeval tv = {5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  char b[256];
  for (;;) {
    ssize_t n = recv(fd, b, sizeof b, 0);
    if (n == 0 || (n < 0 && errno == ECONNRESET)) return true;
    if (n < 0) return false;
  }
}

IT_UNUSED static void raw_hello(int fd, uint32_t version) {
  Kvcache__V1__Request req = KVCACHE__V1__REQUEST__INIT;
  Kvcache__V1__Hello hello = KVCACHE__V1__HELLO__INIT;
  hello.protocol_version = version;
  hello.shm_bytes = 1 << 20;
  req.body_case = KVCACHE__V1__REQUEST__BODY_HELLO;
  req.hello = &hello;
  req.id = 1;
  raw_send_request(fd, &req);
}

/* raw_hello on a connection the daemon may already have refused or dropped
 * (closed): false when the send finds it closed (EPIPE, ECONNRESET). */
IT_UNUSED static bool raw_try_hello(int fd, uint32_t version) {
  Kvcache__V1__Request req = KVCACHE__V1__REQUEST__INIT;
  Kvcache__V1__Hello hello = KVCACHE__V1__HELLO__INIT;
  hello.protocol_version = version;
  hello.shm_bytes = 1 << 20;
  req.body_case = KVCACHE__V1__REQUEST__BODY_HELLO;
  req.hello = &hello;
  req.id = 1;
  uint8_t buf[256];
  size_t n = kvcache__v1__request__get_packed_size(&req);
  ASSERT(n + 4 <= sizeof buf);
  buf[0] = (uint8_t)n, buf[1] = (uint8_t)(n >> 8), buf[2] = (uint8_t)(n >> 16), buf[3] = 0;
  kvcache__v1__request__pack(&req, buf + 4);
  ssize_t sent = send(fd, buf, 4 + n, MSG_NOSIGNAL);
  if (sent < 0 && (errno == EPIPE || errno == ECONNRESET)) return false;
  ASSERT_EQ(sent, (long long)(4 + n));
  return true;
}

#endif
