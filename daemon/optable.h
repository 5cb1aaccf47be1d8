/* optable.h: the table of request operations, shared by dispatch and the
 * metrics (not the engine's ops.c, which is put and get).
 *
 * DAEMON_OPS(X) expands X(name, CASE) for each request of the protocol; CASE
 * is the suffix of the Request oneof case (KVCACHE__V1__REQUEST__BODY_<CASE>).
 * dispatch.c builds its handler table from it and metrics.c its per-operation
 * counters, so an operation added here is dispatched and counted.
 */
#ifndef KVCD_OPTABLE_H
#define KVCD_OPTABLE_H

#define DAEMON_OPS(X)                                                          \
  X(hello, HELLO)                                                              \
  X(ping, PING)                                                                \
  X(cache_open, CACHE_OPEN)                                                    \
  X(cache_list, CACHE_LIST)                                                    \
  X(cache_clear, CACHE_CLEAR)                                                  \
  X(cache_drop, CACHE_DROP)                                                    \
  X(put, PUT)                                                                  \
  X(get, GET)                                                                  \
  X(remove, REMOVE)                                                            \
  X(copy_prefix, COPY_PREFIX)                                                  \
  X(can_resume, CAN_RESUME)                                                    \
  X(trim_front, TRIM_FRONT)                                                    \
  X(pin, PIN)                                                                  \
  X(unpin, UNPIN)                                                              \
  X(seq_info, SEQ_INFO)                                                        \
  X(seq_list, SEQ_LIST)                                                        \
  X(stats, STATS)                                                              \
  X(match, MATCH)                                                              \
  X(attach, ATTACH)                                                            \
  X(set_priority, SET_PRIORITY)                                                \
  X(pin_ttl, PIN_TTL)                                                          \
  X(prefix_top, PREFIX_TOP)                                                    \
  X(reserve, RESERVE)                                                          \
  X(history, HISTORY)                                                          \
  X(shift, SHIFT)                                                              \
  X(punch, PUNCH)                                                              \
  X(keep, KEEP)                                                                \
  X(pos_range, POS_RANGE)                                                      \
  X(lease, LEASE)                                                              \
  X(lease_release, LEASE_RELEASE)                                              \
  X(step, STEP)                                                                \
  X(lease_batch, LEASE_BATCH)                                                  \
  X(seq_create, SEQ_CREATE)                                                    \
  X(seq_div, SEQ_DIV)                                                          \
  X(tenants, TENANTS)                                                          \
  X(clients, CLIENTS)                                                          \
  X(config, CONFIG)                                                            \
  X(admin, ADMIN)                                                              \
  X(pool_map, POOL_MAP)                                                        \
  X(pool_resize, POOL_RESIZE)                                                  \
  X(subscribe, SUBSCRIBE)

enum op {
#define OP_ENUM_(name, CASE) OP_##CASE,
  DAEMON_OPS(OP_ENUM_)
#undef OP_ENUM_
  OP_COUNT_
};

#endif
