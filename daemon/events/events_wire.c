/* events_wire.c: packing a batch of prefix-index events as vLLM's KV events
 * (events_wire.h has the layout). msgpack-c packs integers in their
 * smallest form and doubles as float64, as msgspec does. */
#include "events_wire.h"

#include <string.h>

const char *wire_medium(uint32_t medium) {
  /* The memory pool is host memory: vLLM's CPU offloading says "CPU" for
   * it; the disk tier is "DISK", the cluster tier "REMOTE" (doc/events.md). */
  return medium == ENGINE_MEDIUM_POOL   ? "CPU"
         : medium == ENGINE_MEDIUM_DISK ? "DISK"
         : medium == ENGINE_MEDIUM_REMOTE ? "REMOTE"
                                          : "UNKNOWN";
}

/* How many events of evs[i..n) one published event covers. */
static size_t run_len(const wire_ev_t *evs, size_t i, size_t n, size_t hash_len) {
  const engine_event_t *a = evs[i].ev;
  if (!a) return 1;
  size_t j = i + 1;
  for (; j < n; j++) {
    const engine_event_t *b = evs[j].ev;
    if (!b || b->kind != a->kind || b->cache_id != a->cache_id || b->medium != a->medium) break;
    /* A stored run is one chain: each page continues the one before. */
    if (a->kind == ENGINE_EV_STORED &&
        (!evs[j].parent || memcmp(evs[j].parent, evs[j - 1].hash, hash_len) != 0))
      break;
  }
  return j - i;
}

static void pack_str(msgpack_packer *pk, const char *s) {
  msgpack_pack_str_with_body(pk, s, strlen(s));
}

/* Token ids, packed as msgpack_pack_uint32 would but a page at a time into
 * one write of the packer (per id a call through the packer's callback
 * costs more than the encoding itself). */
static void pack_ids(msgpack_packer *pk, const uint32_t *v, uint32_t n) {
  uint8_t buf[5 * 64];
  size_t k = 0;
  for (uint32_t i = 0; i < n; i++) {
    uint32_t x = v[i];
    if (k > sizeof buf - 5) {
      pk->callback(pk->data, (const char *)buf, k);
      k = 0;
    }
    if (x < 0x80) {
      buf[k++] = (uint8_t)x;
    } else if (x < 0x100) {
      buf[k++] = 0xcc, buf[k++] = (uint8_t)x;
    } else if (x < 0x10000) {
      buf[k++] = 0xcd, buf[k++] = (uint8_t)(x >> 8), buf[k++] = (uint8_t)x;
    } else {
      buf[k++] = 0xce;
      for (int s = 24; s >= 0; s -= 8) buf[k++] = (uint8_t)(x >> s);
    }
  }
  if (k) pk->callback(pk->data, (const char *)buf, k);
}

/* A packer writing into a caller's buffer that is large enough. */
typedef struct into {
  uint8_t *p;
  size_t n;
} into_t;

static int into_write(void *data, const char *buf, size_t len) {
  into_t *in = data;
  memcpy(in->p + in->n, buf, len);
  in->n += len;
  return 0;
}

/* One hash into out (at most 34 bytes) as msgspec packs ExternalBlockHash:
 * bin (bytes), or a uint64, vLLM's int form: int.from_bytes(hash, "big") &
 * (2**64 - 1), the last 8 bytes. Returns the bytes written. */
static size_t put_hash(uint8_t *out, const uint8_t *h, const wire_opts_t *o) {
  if (!o->hash_int) {
    out[0] = 0xc4; /* bin 8 */
    out[1] = (uint8_t)o->hash_len;
    memcpy(out + 2, h, o->hash_len);
    return 2 + o->hash_len;
  }
  uint64_t v = 0;
  for (size_t k = o->hash_len - 8; k < o->hash_len; k++) v = v << 8 | h[k];
  into_t in = {out, 0};
  msgpack_packer pk;
  msgpack_packer_init(&pk, &in, into_write);
  msgpack_pack_uint64(&pk, v); /* 9 bytes at most */
  return in.n;
}

static void pack_hash(msgpack_packer *pk, const uint8_t *h, const wire_opts_t *o) {
  uint8_t buf[34];
  pk->callback(pk->data, (const char *)buf, put_hash(buf, h, o));
}

/* The hashes of a run, a few writes of the packer for all of them. */
static void pack_hashes(msgpack_packer *pk, const wire_ev_t *run, size_t len,
                        const wire_opts_t *o) {
  uint8_t buf[34 * 32];
  size_t k = 0;
  msgpack_pack_array(pk, len);
  for (size_t i = 0; i < len; i++) {
    if (k > sizeof buf - 34) {
      pk->callback(pk->data, (const char *)buf, k);
      k = 0;
    }
    k += put_hash(buf + k, run[i].hash, o);
  }
  if (k) pk->callback(pk->data, (const char *)buf, k);
}

/* A field of an event: its name first in the map form. */
static void key(msgpack_packer *pk, const wire_opts_t *o, const char *name) {
  if (o->map) pack_str(pk, name);
}

static void pack_stored(msgpack_packer *pk, const wire_ev_t *run, size_t len,
                        const wire_opts_t *o) {
  const engine_event_t *first = run[0].ev;
  if (o->map) msgpack_pack_map(pk, 8);
  else msgpack_pack_array(pk, 8);
  key(pk, o, "type");
  pack_str(pk, "BlockStored");
  key(pk, o, "block_hashes");
  pack_hashes(pk, run, len, o);
  key(pk, o, "parent_block_hash");
  if (run[0].parent) pack_hash(pk, run[0].parent, o);
  else msgpack_pack_nil(pk);
  key(pk, o, "token_ids");
  msgpack_pack_array(pk, o->token_ids ? len * first->ntokens : 0);
  for (size_t i = 0; o->token_ids && i < len; i++) pack_ids(pk, run[i].ev->tokens, run[i].ev->ntokens);
  key(pk, o, "block_size");
  msgpack_pack_uint32(pk, first->page_tokens);
  key(pk, o, "lora_id");
  msgpack_pack_nil(pk);
  key(pk, o, "medium");
  pack_str(pk, wire_medium(first->medium));
  key(pk, o, "lora_name");
  msgpack_pack_nil(pk);
}

static void pack_removed(msgpack_packer *pk, const wire_ev_t *run, size_t len,
                         const wire_opts_t *o) {
  if (o->map) msgpack_pack_map(pk, 3);
  else msgpack_pack_array(pk, 3);
  key(pk, o, "type");
  pack_str(pk, "BlockRemoved");
  key(pk, o, "block_hashes");
  pack_hashes(pk, run, len, o);
  key(pk, o, "medium");
  pack_str(pk, wire_medium(run[0].ev->medium));
}

/* The packer's sink: the buffer, and whether a write failed (out of memory)
 * so that one check at the end covers every pack call. */
typedef struct sink {
  msgpack_sbuffer *sb;
  bool failed;
} sink_t;

static int sink_write(void *data, const char *buf, size_t len) {
  sink_t *s = data;
  if (!s->failed && msgpack_sbuffer_write(s->sb, buf, len) != 0) s->failed = true;
  return s->failed ? -1 : 0;
}

long wire_batch(msgpack_sbuffer *sb, double ts, const wire_ev_t *evs, size_t n,
                const wire_opts_t *o) {
  size_t nout = 0;
  for (size_t i = 0; i < n; i += run_len(evs, i, n, o->hash_len)) nout++;
  msgpack_sbuffer_clear(sb);
  sink_t sink = {sb, false};
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sink, sink_write);
  msgpack_pack_array(&pk, 3);
  msgpack_pack_double(&pk, ts);
  msgpack_pack_array(&pk, nout);
  for (size_t i = 0; i < n;) {
    size_t len = run_len(evs, i, n, o->hash_len);
    if (!evs[i].ev) {
      if (o->map) msgpack_pack_map(&pk, 1);
      else msgpack_pack_array(&pk, 1);
      key(&pk, o, "type");
      pack_str(&pk, "AllBlocksCleared");
    } else if (evs[i].ev->kind == ENGINE_EV_STORED) {
      pack_stored(&pk, evs + i, len, o);
    } else {
      pack_removed(&pk, evs + i, len, o);
    }
    i += len;
  }
  msgpack_pack_int64(&pk, o->dp_rank);
  return sink.failed ? -1 : (long)nout;
}
