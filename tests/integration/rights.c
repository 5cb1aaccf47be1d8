/* rights.c: the right each operation needs, from the one operation table
 * (daemon/ops/optable.h), tested for every row of it (doc/security.md): a
 * reader of a shared cache (r) runs every operation on it (a READ one is
 * served or refused for its empty body, never for rights; a WRITE one is
 * PERM), a tenant without a right and another tenant get NOCACHE for every
 * operation naming the cache, and afterwards nothing of the owner's changed:
 * bytes, lengths, positions, pins. Each request is built from the table and
 * the protocol's descriptors (the body of its case, with cache_id and seq_id
 * set where the body has them), so a new operation is tested with no new
 * test. Also: a reader cannot create a declared shared cache, and an rw
 * tenant clears and drops its shared cache. Children drop to unused uids. */
#include <grp.h>

#include "../../daemon/ops/optable.h"
#include "raw.h"

#define UID_W 64301u /* rw on the shared caches, owner of its private one */
#define UID_R 64302u /* r on the shared caches */
#define UID_O 64303u /* no right */
#define LEN 40u

static kvc_layout_t lay(void);

static void drop_to(uid_t uid) {
  if (setgroups(0, NULL) != 0 || setresgid(uid, uid, uid) != 0 || setresuid(uid, uid, uid) != 0)
    _exit(90);
  prctl(PR_SET_DUMPABLE, 1, 0, 0, 0);
}

static const struct {
  const char *name;
  int body_case;
  enum op_right right;
} ops[] = {
#define OP_ROW_(name, CASE, RIGHT) {#name, KVCACHE__V1__REQUEST__BODY_##CASE, OPR_##RIGHT},
    DAEMON_OPS(OP_ROW_)
#undef OP_ROW_
};
#define NOPS (sizeof ops / sizeof ops[0])

/* Sets the integer field `name` of body to v when the body has one. */
static void set_field(ProtobufCMessage *body, const char *name, int64_t v) {
  const ProtobufCFieldDescriptor *f =
      protobuf_c_message_descriptor_get_field_by_name(body->descriptor, name);
  if (!f || f->label == PROTOBUF_C_LABEL_REPEATED) return;
  void *at = (char *)body + f->offset;
  switch (f->type) {
  case PROTOBUF_C_TYPE_UINT32: *(uint32_t *)at = (uint32_t)v; break;
  case PROTOBUF_C_TYPE_UINT64: *(uint64_t *)at = (uint64_t)v; break;
  case PROTOBUF_C_TYPE_SINT64: case PROTOBUF_C_TYPE_INT64: *(int64_t *)at = v; break;
  case PROTOBUF_C_TYPE_SINT32: case PROTOBUF_C_TYPE_INT32: *(int32_t *)at = (int32_t)v; break;
  default: break;
  }
}

/* Values that make a request of most operations do something to sequence 1
 * of the cache (a body has the fields it has): so an operation the table
 * called a read but that writes would change the owner's sequence, which
 * the owner then finds. */
static const struct {
  const char *name;
  int64_t v;
} fills[] = {{"seq_id", 1},  {"begin", 0},   {"end", LEN}, {"pos", 0},     {"ntokens", 1},
             {"p0", 0},      {"p1", -1},     {"d", 2},     {"delta", 5},   {"priority", 99},
             {"ttl_ms", 50}, {"dst_id", 2},  {"n", LEN},   {"count", 8},   {"src_id", 1}};

/* Sends operation i with a body naming cache_id (and seq_id 1); its status. */
static int run_op(int fd, size_t i, uint32_t cache_id, uint64_t id) {
  Kvcache__V1__Request req = KVCACHE__V1__REQUEST__INIT;
  const ProtobufCFieldDescriptor *f = protobuf_c_message_descriptor_get_field(
      &kvcache__v1__request__descriptor, (unsigned)ops[i].body_case);
  if (!f || f->type != PROTOBUF_C_TYPE_MESSAGE) return -1000;
  const ProtobufCMessageDescriptor *md = f->descriptor;
  ProtobufCMessage *body = calloc(1, md->sizeof_message);
  protobuf_c_message_init(md, body);
  set_field(body, "cache_id", cache_id);
  for (size_t k = 0; k < sizeof fills / sizeof fills[0]; k++)
    set_field(body, fills[k].name, fills[k].v);
  req.id = id;
  req.body_case = ops[i].body_case;
  *(ProtobufCMessage **)(void *)((char *)&req + f->offset) = body;
  raw_send_request(fd, &req);
  free(body);
  Kvcache__V1__Response *r = raw_reply(fd);
  if (!r) return -2000; /* the connection closed: never for a well-formed request */
  int st = r->status;
  kvcache__v1__response__free_unpacked(r, NULL);
  return st;
}

static int connect_raw(const char *sock) {
  int fd = it_connect_raw(sock);
  if (fd < 0) _exit(80);
  raw_hello(fd, KVC_PROTOCOL_VERSION);
  Kvcache__V1__Response *r = raw_reply(fd);
  if (!r || r->status != KVCACHE__V1__STATUS__OK) _exit(81);
  kvcache__v1__response__free_unpacked(r, NULL);
  return fd;
}

/* Every operation of the table naming cache_id: as a reader (READ served
 * or refused for its body, WRITE PERM), or as one who may not see it (every
 * one NOCACHE). Prints each mismatch; returns how many. */
static int run_table(const char *sock, uint32_t cache_id, bool reader, const char *who) {
  int fd = connect_raw(sock), bad = 0;
  for (size_t i = 0; i < NOPS; i++) {
    if (ops[i].right != OPR_READ && ops[i].right != OPR_WRITE) continue;
    int st = run_op(fd, i, cache_id, 100 + i);
    bool ok;
    if (!reader) ok = st == KVCACHE__V1__STATUS__NOCACHE;
    else if (ops[i].right == OPR_WRITE) ok = st == KVCACHE__V1__STATUS__PERM;
    else ok = st >= 0 && st != KVCACHE__V1__STATUS__PERM && st != KVCACHE__V1__STATUS__NOCACHE;
    if (!ok) {
      fprintf(stderr, "%s: %s (%s) on cache %u answered status %d\n", who, ops[i].name,
              ops[i].right == OPR_WRITE ? "WRITE" : "READ", cache_id, st);
      bad++;
    }
  }
  close(fd);
  return bad;
}

typedef struct snap {
  kvc_seq_info_t si;
  int64_t pmin, pmax;
  float *k, *v;
} snap_t;

static snap_t take(kvc_cache_t *h) {
  snap_t s = {0};
  const kvc_layout_t *l = kvc_cache_layout(h);
  s.k = calloc(it_tok_floats(l, false) * LEN, 4);
  s.v = calloc(it_tok_floats(l, true) * LEN, 4);
  if (!s.k || !s.v || kvc_seq_info(h, 1, &s.si) || kvc_seq_pos_range(h, 1, &s.pmin, &s.pmax) ||
      kvc_get(h, 1, 0, LEN, s.k, s.v))
    _exit(70);
  return s;
}

static bool same(const snap_t *a, const snap_t *b, size_t kn, size_t vn) {
  return a->si.length == b->si.length && a->si.start == b->si.start &&
         a->si.extent == b->si.extent && a->si.pins == b->si.pins && a->pmin == b->pmin &&
         a->pmax == b->pmax && !memcmp(a->k, b->k, kn * 4) && !memcmp(a->v, b->v, vn * 4);
}

/* The writer: fills and pins its shared and private caches, says their ids,
 * waits while the others try everything, then finds every figure as it
 * left it; then, rw, clears and drops the shared cache. */
static int writer(const char *sock, int ready, int go) {
  kvc_client_opts_t o = {.socket_path = sock, .timeout_ms = 20000, .client_name = "writer"};
  kvc_client_t *c;
  if (kvc_client_open(&o, &c)) return 10;
  kvc_layout_t l = lay();
  kvc_cache_t *sh, *pv;
  if (kvc_cache_open(c, "shared1", &l, &sh) || kvc_cache_open(c, "priv", &l, &pv)) return 11;
  size_t kn = it_tok_floats(&l, false) * LEN, vn = it_tok_floats(&l, true) * LEN;
  float *k = malloc(kn * 4), *v = malloc(vn * 4);
  uint32_t ids[LEN];
  for (uint32_t i = 0; i < LEN; i++) ids[i] = 7 + i;
  it_fill_f32(k, v, &l, 1, 0, LEN, 0);
  if (kvc_put_tokens(sh, 1, 0, LEN, k, v, ids) || kvc_put_tokens(pv, 1, 0, LEN, k, v, ids) ||
      kvc_seq_pin(sh, 1) || kvc_seq_pin(pv, 1))
    return 12;
  snap_t s0 = take(sh), p0 = take(pv);
  uint32_t idv[2] = {kvc_cache_id(sh), kvc_cache_id(pv)};
  char x;
  if (write(ready, idv, sizeof idv) != sizeof idv || read(go, &x, 1) != 1) return 13;
  snap_t s1 = take(sh), p1 = take(pv);
  if (!same(&s0, &s1, kn, vn)) return 14;
  if (!same(&p0, &p1, kn, vn)) return 15;
  /* rw is everything a tenant can do with its own cache: clear and drop. */
  int rc = kvc_cache_clear(sh);
  if (rc) {
    fprintf(stderr, "rw clear: %s: %s\n", kvc_err_name(rc), kvc_client_last_error(c));
    return 16;
  }
  if ((rc = kvc_cache_drop(sh)) != 0) {
    fprintf(stderr, "rw drop: %s: %s\n", kvc_err_name(rc), kvc_client_last_error(c));
    return 17;
  }
  kvc_client_close(c);
  return 0;
}

static int reader(const char *sock, const uint32_t idv[2]) {
  kvc_client_opts_t o = {.socket_path = sock, .timeout_ms = 20000, .client_name = "reader"};
  kvc_client_t *c;
  if (kvc_client_open(&o, &c)) return 20;
  kvc_layout_t l = lay(), l8 = l;
  l8.page_tokens = 8;
  kvc_cache_t *sh;
  if (kvc_cache_open(c, "shared1", &l, &sh) || kvc_cache_id(sh) != idv[0]) return 21;
  /* Creating a declared shared cache is a write: refused, nothing made. */
  kvc_cache_t *s2;
  int rc = kvc_cache_open(c, "shared2", &l8, &s2);
  if (rc != KVC_E_PERM) {
    fprintf(stderr, "reader created shared2: %s\n", kvc_err_name(rc));
    return 22;
  }
  kvc_client_close(c);
  int bad = run_table(sock, idv[0], true, "reader of shared1");
  bad += run_table(sock, idv[1], false, "reader on the writer's private cache");
  return bad ? 23 : 0;
}

static int other(const char *sock, const uint32_t idv[2]) {
  int bad = run_table(sock, idv[0], false, "tenant without a right on shared1");
  bad += run_table(sock, idv[1], false, "another tenant on the writer's private cache");
  return bad ? 30 : 0;
}

/* it_layout with RoPE: every position operation (shift, seq_div, punch)
 * may run on it. */
static kvc_layout_t lay(void) {
  kvc_layout_t l = it_layout(KVC_DTYPE_F32);
  l.rope_dims = l.head_dim_k;
  l.rope_theta = 10000.0f;
  return l;
}

static int wait_child(pid_t p) {
  int st;
  if (waitpid(p, &st, 0) != p) return -1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

TEST(rights_every_operation_against_a_reader_a_stranger_and_another_tenant) {
  /* The table says every operation's right (no default: a row without one
   * does not compile); the ones that name a cache are at least these. */
  size_t gated = 0;
  for (size_t i = 0; i < NOPS; i++) gated += ops[i].right == OPR_READ || ops[i].right == OPR_WRITE;
  ASSERT_EQ(NOPS, (size_t)OP_COUNT_);
  ASSERT(gated >= 28); /* 28 when this was written */
  daemon_t d;
  /* Arenas (no page_bytes): every tenant may lease, so a READ is never
   * refused for the pool mapping, only for rights. */
  const char *args[] = {"--page-bytes", "0", "--allow-uids", "self,root,64301,64302,64303",
                        "--socket-mode", "0666",
                        "--shared-caches",
                        "shared1=uid:64301:rw,uid:64302:r;shared2=uid:64301:rw,uid:64302:r",
                        NULL};
  daemon_start_args(&d, args);
  ASSERT_EQ(chmod(d.dir, 0755), 0);
  int rp[2], gp[2];
  ASSERT_EQ(pipe(rp), 0);
  ASSERT_EQ(pipe(gp), 0);
  fflush(NULL);
  pid_t w = fork();
  ASSERT(w >= 0);
  if (w == 0) {
    drop_to(UID_W);
    _exit(writer(d.sock, rp[1], gp[0]));
  }
  uint32_t idv[2];
  ASSERT_EQ(read(rp[0], idv, sizeof idv), (long long)sizeof idv);
  pid_t r = fork();
  ASSERT(r >= 0);
  if (r == 0) {
    drop_to(UID_R);
    _exit(reader(d.sock, idv));
  }
  int sr = wait_child(r);
  pid_t o = fork();
  ASSERT(o >= 0);
  if (o == 0) {
    drop_to(UID_O);
    _exit(other(d.sock, idv));
  }
  int so = wait_child(o);
  char x = 1;
  ASSERT_EQ(write(gp[1], &x, 1), 1);
  int sw = wait_child(w);
  if (sr || so || sw) it_dump_log(&d);
  ASSERT_EQ(sr, 0);
  ASSERT_EQ(so, 0);
  ASSERT_EQ(sw, 0);
  daemon_stop(&d);
}
