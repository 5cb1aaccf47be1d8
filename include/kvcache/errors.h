/* kvcache/errors.h: every error code of kvcached, its name and its message.
 *
 * A fallible kvc_* call returns 0 or one of these negative codes. The list is
 * the single source of truth: the enum, kvc_strerror(), kvc_err_name() and the
 * wire's status mapping are all generated from KVC_ERRNO_MAP. Codes are stable:
 * append new ones, never renumber.
 */
#ifndef KVCACHE_ERRORS_H
#define KVCACHE_ERRORS_H

#define KVC_ERRNO_MAP(XX)                                                      \
  XX(INVAL,      -1, "invalid argument")                                       \
  XX(NOMEM,      -2, "out of memory")                                          \
  XX(FULL,       -3, "pool full: the write needs more pages than can be freed")\
  XX(NOCACHE,    -4, "no such cache")                                          \
  XX(NOSEQ,      -5, "no such sequence")                                       \
  XX(LAYOUT,     -6, "cache exists with a different layout")                   \
  XX(RANGE,      -7, "token position or range out of bounds")                  \
  XX(LAYER,      -8, "layer range out of bounds")                              \
  XX(HEAD,       -9, "head range out of bounds")                               \
  XX(DTYPE,     -10, "unsupported dtype or dtype conversion")                  \
  XX(SIZE,      -11, "buffer size does not match the layout")                  \
  XX(OVERFLOW,  -12, "integer overflow in a size or position")                 \
  XX(NOROPE,    -13, "removing a middle range needs a RoPE description")       \
  XX(PAGESIZE,  -14, "a page of this layout does not fit in a pool page")      \
  XX(NLAYERS,   -15, "num_layers is zero or too large")                        \
  XX(NHEADS,    -16, "num_kv_heads is zero or too large")                      \
  XX(HEADDIM,   -17, "head_dim is zero or too large")                          \
  XX(PAGETOKENS,-18, "page_tokens is zero, not a power of two or too large")   \
  XX(NAME,      -19, "cache name is empty, too long or not printable")         \
  XX(TOOMANY,   -20, "too many caches, sequences or entries")                  \
  XX(SAMESEQ,   -21, "source and destination are the same sequence")         \
  XX(DUPSEQ,    -22, "a sequence appears twice in one batch")                  \
  XX(NOTPINNED, -23, "sequence is not pinned by this owner")                   \
  XX(NONFINITE, -24, "value is NaN or infinite and cannot be quantized")       \
  XX(OFFSET,    -25, "offset or length outside the shared buffer")            \
  XX(PROTO,     -26, "protocol error")                                         \
  XX(VERSION,   -27, "protocol version mismatch")                              \
  XX(IO,        -28, "connection error")                                       \
  XX(PERM,      -29, "permission denied")                                      \
  XX(CONNLIMIT, -30, "connection limit reached")                               \
  XX(SHUTDOWN,  -31, "daemon is shutting down")                                \
  XX(NOTRUNNING,-32, "daemon not running (no socket)")                         \
  XX(TIMEOUT,   -33, "timed out")                                              \
  XX(INTERNAL,  -34, "internal error")                                       \
  XX(PINLIMIT,  -35, "pinning this would exceed the pool's pin limit")        \
  XX(ATTN,      -36, "unknown attention kind")                                 \
  XX(WINDOW,    -37, "window or memory size invalid for this attention kind")  \
  XX(CHUNK,     -38, "chunk size invalid for this attention kind")             \
  XX(ROPE,      -39, "RoPE description invalid (dims, style, theta or scale)") \
  XX(KIND,      -40, "operation does not apply to this cache's attention kind")\
  XX(POSORDER,  -41, "a sequence's positions in a batch are not consecutive") \
  XX(NOLEASE,   -42, "no such lease held by this connection")                  \
  XX(PEER,      -43, "the socket is served by an unexpected uid (not kvcached)")\
  XX(QUOTA_PAGES,  -44, "the tenant's pool page quota is reached")          \
  XX(QUOTA_PINS,   -45, "the tenant's pinned and leased page quota is reached") \
  XX(QUOTA_SEQS,   -46, "the tenant's sequence quota is reached")           \
  XX(QUOTA_CACHES, -47, "the tenant's cache quota is reached")              \
  XX(QUOTA_KEYS,   -48, "the tenant's interned key quota is reached")       \
  XX(QUOTA_CONNS,  -49, "the uid's connection quota is reached")            \
  XX(QUOTA_SHM,    -50, "the shared-buffer byte quota is reached")       \
  XX(BUSY,         -51, "a put to the sequence is in flight; retry")        \
  XX(EXISTS,       -52, "the sequence exists: the call would replace it")

typedef enum {
#define KVC_ERR_ENUM_(name, code, msg) KVC_E_##name = (code),
  KVC_ERRNO_MAP(KVC_ERR_ENUM_)
#undef KVC_ERR_ENUM_
  KVC_E_MIN_ = -53 /* one below the lowest code; not an error */
} kvc_errno_t;

#ifdef __cplusplus
extern "C" {
#endif

/* Message for a code ("unknown error" for one not in the list). Returns a
 * static string: never free it. */
const char *kvc_strerror(int err);
/* Name of a code without the prefix ("FULL"), or "UNKNOWN". Static string. */
const char *kvc_err_name(int err);

#ifdef __cplusplus
}
#endif
#endif
