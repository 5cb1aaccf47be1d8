/* kvcache/types.h: the value types shared by the client API and the engine.
 *
 * Tensor layout, everywhere in kvcached: a K (or V) buffer of a transfer is
 * contiguous in the order [layer][token][head][dim], covering the request's
 * layer range, token range and head range in that order. K rows have
 * head_dim_k elements, V rows head_dim_v. For int8 caches read raw, the scales
 * are f32 in the order [layer][token][head].
 */
#ifndef KVCACHE_TYPES_H
#define KVCACHE_TYPES_H

#include <stdint.h>

typedef enum {
  KVC_DTYPE_F32 = 1,
  KVC_DTYPE_F64 = 2,
  KVC_DTYPE_F16 = 3,  /* IEEE binary16 */
  KVC_DTYPE_BF16 = 4, /* bfloat16 */
  KVC_DTYPE_INT8 = 5, /* symmetric absmax, one f32 scale per token/head/layer */
  KVC_DTYPE_FP8_E4M3 = 6, /* OCP FP8 E4M3 (torch float8_e4m3fn): bias 7, max 448, no inf;
                             scales per transfer (kvc_xfer_t, doc/design.md) */
  KVC_DTYPE_FP8_E5M2 = 7, /* OCP FP8 E5M2 (torch float8_e5m2): bias 15, max 57344, inf, NaN */
  KVC_DTYPE_Q8_0 = 8,     /* ggml block_q8_0 along the head dim: {f16 d; int8 qs[32]}, 34 bytes
                             a 32 values; head dims multiples of 32 */
  KVC_DTYPE_Q4_0 = 9      /* ggml block_q4_0: {f16 d; uint8 qs[16]}, 18 bytes a 32 values
                             (low nibbles elements 0..15, high 16..31) */
} kvc_dtype_t;

#define KVC_DEFAULT_PAGE_TOKENS 16u
#define KVC_MAX_LAYERS 1024u
#define KVC_MAX_HEADS 1024u
#define KVC_MAX_HEAD_DIM 16384u
#define KVC_MAX_PAGE_TOKENS 65536u
#define KVC_MAX_NAME 64u            /* bytes of a cache name, without NUL */
#define KVC_MAX_SEQ_TOKENS (1ull << 31) /* positions are below this */
#define KVC_MAX_KEY_BYTES 64u       /* bytes of a tenant salt or of an extra key */
#define KVC_MAX_SPAN_KEYS 256u      /* span keys of one put entry or one query */
#define KVC_MAX_PRIORITY 100u       /* retention priorities are 0..100 */
#define KVC_DEFAULT_PRIORITY 35u    /* a sequence's priority until it is set */
#define KVC_MAX_TTL_MS (365ull * 24 * 3600 * 1000) /* longest soft pin: a year */

/* An extra key of the tokens at positions [begin, end) of a sequence (or
 * of a query): a multimodal input's content hash over the placeholder tokens
 * it fills, a LoRA adapter's id over the tokens it computed, ... Each page
 * holding such tokens is hashed with the key (as vLLM folds its extra keys
 * into its block hashes), so two prompts with the same token ids and
 * different keys never match. key_len is 1..KVC_MAX_KEY_BYTES; span keys
 * of one list are in increasing order of begin and do not overlap. */
typedef struct kvc_span_key {
  uint64_t begin, end;
  const void *key;
  size_t key_len;
} kvc_span_key_t;

/* What a token of a cache attends to (doc/attention.md). */
typedef enum {
  KVC_ATTN_CAUSAL = 0,  /* every earlier position of its sequence */
  KVC_ATTN_WINDOW = 1,  /* positions [p - window, p]; keeps `memory` positions */
  KVC_ATTN_CHUNKED = 2, /* positions of its chunk up to p: [p - p % chunk, p] */
  KVC_ATTN_ENCODER = 3  /* every entry of its sequence, position-independent */
} kvc_attn_t;

/* How rotary embeddings (RoPE) were applied to the keys. */
typedef enum {
  KVC_ROPE_NEOX = 0, /* pairs (i, i + dims/2): the half-split style */
  KVC_ROPE_GPTJ = 1, /* pairs (2i, 2i + 1): the interleaved style */
  KVC_ROPE_NONE = 2  /* with rope_dims 0: the keys carry no position (NoPE,
                        ALiBi): tokens move with no re-rotation */
} kvc_rope_style_t;

/* How the RoPE frequencies were scaled for a longer context (the keys'
 * rotation at position p uses these frequencies; re-rotating by a delta
 * must use the same). */
typedef enum {
  KVC_ROPE_SCALE_LINEAR = 0, /* angle = p / rope_scale * theta^(-2i/d) */
  KVC_ROPE_SCALE_LLAMA3 = 1, /* Llama 3.1: rope_scale the factor, rope_lo/rope_hi the low and
                                high frequency factors, rope_orig_ctx the original context */
  KVC_ROPE_SCALE_YARN = 2    /* YaRN: rope_scale the factor, rope_lo/rope_hi beta_slow and
                                beta_fast, rope_orig_ctx the original context */
} kvc_rope_scaling_t;

#define KVC_MAX_ATTN_SPAN (1u << 30) /* largest window, memory or chunk */
#define KVC_ATTN_KEEP_ALL 0xFFFFFFFFu /* a chunked cache's memory: never free history */

/* The layout of a cache. Every field is validated when the cache is opened.
 * The fields after page_tokens are all optional: zero means a causal cache
 * without a RoPE description (removing a middle range or shifting then fails
 * with KVC_E_NOROPE, unless rope_style is KVC_ROPE_NONE: keys without a
 * rotary position move as they are). */
typedef struct kvc_layout {
  uint32_t num_layers;   /* transformer layers, 1..KVC_MAX_LAYERS */
  uint32_t num_kv_heads; /* KV heads per layer, 1..KVC_MAX_HEADS */
  uint32_t head_dim_k;   /* elements per K head, 1..KVC_MAX_HEAD_DIM */
  uint32_t head_dim_v;   /* elements per V head, 1..KVC_MAX_HEAD_DIM */
  kvc_dtype_t dtype;     /* storage dtype */
  uint32_t page_tokens;  /* tokens per page, power of two; 0 means 16 */
  kvc_attn_t attn;       /* attention kind */
  uint32_t attn_window;  /* WINDOW: W >= 1 positions before p (0 otherwise) */
  uint32_t attn_memory;  /* WINDOW: positions kept, M >= W; 0 means W.
                            CHUNKED: positions kept before the one to
                            compute besides its chunk (0: the chunk alone;
                            KVC_ATTN_KEEP_ALL: everything, so the sequence
                            can resume or branch below its chunk) */
  uint32_t attn_chunk;   /* CHUNKED: chunk size C >= 1 (0 otherwise) */
  uint32_t rope_dims;    /* rotary dims of each K head: even, <= head_dim_k; 0: no RoPE */
  kvc_rope_style_t rope_style;
  float rope_theta;      /* base, > 1 and finite (10000 is usual) */
  float rope_scale;      /* linear scaling factor: angle uses pos / scale; 0 means 1
                            (LLAMA3, YARN: their factor, >= 1) */
  kvc_rope_scaling_t rope_scaling; /* 0: linear */
  float rope_lo, rope_hi;  /* LLAMA3: low/high frequency factors (0 < lo < hi);
                              YARN: beta_slow/beta_fast (0 < lo < hi); else 0 */
  uint32_t rope_orig_ctx;  /* LLAMA3, YARN: original context length (> 0); else 0 */
} kvc_layout_t;

/* What a sequence holds. */
typedef struct kvc_seq_info {
  uint64_t seq_id;
  uint64_t start;        /* first position still held (trim_front moves it) */
  uint64_t length;       /* tokens written for every layer */
  uint64_t extent;       /* highest written length of any layer (>= length) */
  uint32_t pages;        /* pool pages its block table holds (a page whose
                            slots are all holes holds none: doc/attention.md) */
  uint32_t shared_pages; /* of those, pages also referenced elsewhere */
  uint32_t pins;         /* owners pinning it; 0 means evictable */
  uint32_t pad_;
  uint64_t last_use_ms;  /* engine clock at the last read or write */
} kvc_seq_info_t;

/* What a cache is. */
typedef struct kvc_cache_info {
  char name[KVC_MAX_NAME + 1];
  uint32_t cache_id;
  kvc_layout_t layout;
  uint64_t page_bytes;   /* bytes of one page of this layout (<= pool page) */
  uint64_t sequences;
  uint64_t tokens;       /* sum of sequence lengths */
  uint64_t pages;        /* pool pages its block tables hold (shared pages
                            counted per use; pages of holes hold none) */
  char tenant[48];       /* whose it is: a tenant name, or "shared" */
} kvc_cache_info_t;

/* Which part of each token a transfer moves. All zero (or a NULL pointer)
 * means every layer, every head, the natural dtype: the cache's dtype, or f32
 * for an int8 cache. layer_end/head_end 0 mean "to the last". Puts move every
 * head. dtype: puts take the cache dtype or f32 (int8 caches: f32, f16,
 * bf16); gets return the cache dtype or f32 (int8: f32 dequantized, or
 * KVC_DTYPE_INT8 for raw bytes plus scales). fp8, q8_0 and q4_0 caches take
 * and return their own bytes as given, or f32, f16 and bf16 converted on the
 * way. A q8_0 / q4_0 buffer holds head_dim / 32 blocks a head row. */
typedef struct kvc_xfer {
  uint32_t layer_begin, layer_end;
  uint32_t head_begin, head_end;
  kvc_dtype_t dtype; /* 0: natural */
  float k_scale, v_scale; /* fp8 caches, converting transfers only: vLLM's k_scale and
                             v_scale of the layers moved (a put encodes x / scale, a get
                             decodes code x scale); 0 means 1 */
} kvc_xfer_t;

#endif
