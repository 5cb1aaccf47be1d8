/* optable.h: the table of request operations, shared by dispatch and the
 * metrics (not the engine's ops.c, which is put and get).
 *
 * DAEMON_OPS(X) expands X(name, CASE, RIGHT) for each request of the
 * protocol; CASE is the suffix of the Request oneof case
 * (KVCACHE__V1__REQUEST__BODY_<CASE>); RIGHT is what the operation needs on
 * the cache its body names (doc/security.md), one of:
 *   NONE   it names no cache (or answers for what the caller may see alone:
 *          listings, stats, its own leases; admin operations check admin)
 *   READ   a read right (the owner, an admin, a shared cache's r or rw)
 *   WRITE  a write right (the owner, an admin, a shared cache's rw): it
 *          changes the cache, its sequences, their retention or lifetime
 *   OPEN   opens by name: a read right to open a cache that exists, a write
 *          right to create one (a declared shared cache nobody opened yet)
 * There is no default: a row without its right does not compile, and the
 * rights test (tests/integration/rights.c) runs every row against a reader,
 * a tenant without rights and another tenant. dispatch.c builds its handler
 * table from it and metrics.c its per-operation counters, so an operation
 * added here is dispatched, gated and counted.
 */
#ifndef KVCD_OPTABLE_H
#define KVCD_OPTABLE_H

#define DAEMON_OPS(X)                                                          \
  X(hello, HELLO, NONE)                                                        \
  X(ping, PING, NONE)                                                          \
  X(cache_open, CACHE_OPEN, OPEN)                                              \
  X(cache_list, CACHE_LIST, NONE)                                              \
  X(cache_clear, CACHE_CLEAR, WRITE)                                           \
  X(cache_drop, CACHE_DROP, WRITE)                                             \
  X(put, PUT, WRITE)                                                           \
  X(get, GET, READ)                                                            \
  X(remove, REMOVE, WRITE)                                                     \
  X(copy_prefix, COPY_PREFIX, WRITE)                                           \
  X(can_resume, CAN_RESUME, READ)                                              \
  X(trim_front, TRIM_FRONT, WRITE)                                             \
  X(pin, PIN, WRITE)                                                           \
  X(unpin, UNPIN, WRITE)                                                       \
  X(seq_info, SEQ_INFO, READ)                                                  \
  X(seq_list, SEQ_LIST, READ)                                                  \
  X(stats, STATS, NONE)                                                        \
  X(match, MATCH, READ)                                                        \
  X(attach, ATTACH, WRITE)                                                     \
  X(set_priority, SET_PRIORITY, WRITE)                                         \
  X(pin_ttl, PIN_TTL, WRITE)                                                   \
  X(prefix_top, PREFIX_TOP, READ)                                              \
  X(reserve, RESERVE, WRITE)                                                   \
  X(history, HISTORY, READ)                                                    \
  X(shift, SHIFT, WRITE)                                                       \
  X(punch, PUNCH, WRITE)                                                       \
  X(keep, KEEP, WRITE)                                                         \
  X(pos_range, POS_RANGE, READ)                                                \
  X(lease, LEASE, READ)                                                        \
  X(lease_release, LEASE_RELEASE, NONE)                                        \
  X(step, STEP, WRITE)                                                         \
  X(lease_batch, LEASE_BATCH, READ)                                            \
  X(seq_create, SEQ_CREATE, WRITE)                                             \
  X(seq_div, SEQ_DIV, WRITE)                                                   \
  X(tenants, TENANTS, NONE)                                                    \
  X(clients, CLIENTS, NONE)                                                    \
  X(config, CONFIG, NONE)                                                      \
  X(admin, ADMIN, NONE)                                                        \
  X(pool_map, POOL_MAP, NONE)                                                  \
  X(pool_resize, POOL_RESIZE, NONE)                                            \
  X(subscribe, SUBSCRIBE, NONE)

enum op {
#define OP_ENUM_(name, CASE, RIGHT) OP_##CASE,
  DAEMON_OPS(OP_ENUM_)
#undef OP_ENUM_
  OP_COUNT_
};

enum op_right { OPR_NONE = 1, OPR_READ, OPR_WRITE, OPR_OPEN };

/* The right operation op needs on the cache it names. */
static inline enum op_right op_right(enum op op) {
  static const enum op_right rights[OP_COUNT_] = {
#define OP_RIGHT_(name, CASE, RIGHT) OPR_##RIGHT,
      DAEMON_OPS(OP_RIGHT_)
#undef OP_RIGHT_
  };
  return rights[op];
}

#endif
