/* codec.c: the codec both sides link (proto/codec.c, proto/frame.c) and the
 * transfer geometry (layout_xfer in src/layout.c).
 *
 * Each conversion goes public struct -> message -> packed bytes -> message ->
 * public struct and must come back equal, from a struct whose every field is
 * set; and the message in between must have every field of its descriptor
 * set, so a field added to kvcache.proto and not to the codec fails here. */
#include <string.h>

#include "codec.h"
#include "frame.h"
#include "layout.h"
#include "test.h"

/* Every field of m (scalars, strings, sub-messages) differs from its zero. */
static void all_fields_set(const ProtobufCMessage *m) {
  const ProtobufCMessageDescriptor *d = m->descriptor;
  for (unsigned i = 0; i < d->n_fields; i++) {
    const ProtobufCFieldDescriptor *f = &d->fields[i];
    const char *p = (const char *)m + f->offset;
    bool set;
    switch (f->type) {
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_DOUBLE: {
      uint64_t v;
      memcpy(&v, p, 8);
      set = v != 0;
      break;
    }
    case PROTOBUF_C_TYPE_STRING:
      set = *(char *const *)(const void *)p && **(char *const *)(const void *)p;
      break;
    case PROTOBUF_C_TYPE_MESSAGE:
      set = *(void *const *)(const void *)p != NULL;
      break;
    case PROTOBUF_C_TYPE_BYTES:
      set = ((const ProtobufCBinaryData *)(const void *)p)->len != 0;
      break;
    default: { /* 32-bit scalars, enums, bool, float */
      uint32_t v;
      memcpy(&v, p, 4);
      set = v != 0;
      break;
    }
    }
    if (!set) TEST_FAIL_("%s.%s is not set by the codec", d->name, f->name);
  }
}

/* Packs m and unpacks it again (free with protobuf_c_message_free_unpacked). */
static ProtobufCMessage *repack(const ProtobufCMessage *m) {
  static uint8_t buf[4096];
  size_t n = protobuf_c_message_get_packed_size(m);
  ASSERT(n <= sizeof buf);
  ASSERT_EQ(protobuf_c_message_pack(m, buf), n);
  ProtobufCMessage *back = protobuf_c_message_unpack(m->descriptor, NULL, n, buf);
  ASSERT(back != NULL);
  return back;
}

static kvc_layout_t full_layout(void) {
  kvc_layout_t l;
  memset(&l, 0, sizeof l);
  l = (kvc_layout_t){.num_layers = 3, .num_kv_heads = 5, .head_dim_k = 7, .head_dim_v = 11,
                     .dtype = KVC_DTYPE_BF16, .page_tokens = 32, .attn = KVC_ATTN_WINDOW,
                     .attn_window = 13, .attn_memory = 17, .attn_chunk = 19, .rope_dims = 6,
                     .rope_style = KVC_ROPE_GPTJ, .rope_theta = 500000.0f, .rope_scale = 2.5f,
                     .rope_scaling = KVC_ROPE_SCALE_LLAMA3, .rope_lo = 1.5f, .rope_hi = 4.5f,
                     .rope_orig_ctx = 8192};
  return l;
}

TEST(codec_from_wire_of_nothing_is_zero) {
  kvc_layout_t l;
  kvc_xfer_t x;
  kvc_seq_info_t s;
  kvc_cache_info_t ci;
  kvc_match_t m;
  kvc_stat_t st;
  kvc_hist_span_t sp;
  memset(&l, 0xff, sizeof l);
  memset(&x, 0xff, sizeof x);
  memset(&s, 0xff, sizeof s);
  memset(&ci, 0xff, sizeof ci);
  memset(&m, 0xff, sizeof m);
  memset(&st, 0xff, sizeof st);
  memset(&sp, 0xff, sizeof sp);
  codec_layout_from_wire(NULL, &l);
  codec_xfer_from_wire(NULL, &x);
  codec_seq_info_from_wire(NULL, &s);
  codec_cache_info_from_wire(NULL, &ci);
  codec_match_from_wire(NULL, &m);
  codec_stat_from_wire(NULL, &st, NULL);
  codec_hist_span_from_wire(NULL, &sp);
  ASSERT_EQ(l.num_layers + l.num_kv_heads + l.page_tokens + (uint32_t)l.dtype, 0);
  ASSERT_EQ(x.layer_end + x.head_end + (uint32_t)x.dtype, 0);
  ASSERT_U64_EQ(s.seq_id + s.length + s.last_use_ms, 0);
  ASSERT_STR_EQ(ci.name, "");
  ASSERT_U64_EQ(ci.layout.num_layers + ci.pages, 0);
  ASSERT_U64_EQ(m.tokens + m.pages + m.ineligible, 0);
  ASSERT(st.name == NULL && st.value == 0);
  ASSERT_U64_EQ(sp.seq_id + sp.n, 0);
  /* A NULL xfer goes out as every layer and head, the natural dtype. */
  Kvcache__V1__Xfer wx;
  codec_xfer_to_wire(NULL, &wx);
  ASSERT_EQ(wx.layer_begin + wx.layer_end + wx.head_begin + wx.head_end + (uint32_t)wx.dtype, 0);
}

TEST(codec_round_trips_every_field) {
  kvc_layout_t l = full_layout(), l2;
  Kvcache__V1__Layout wl;
  codec_layout_to_wire(&l, &wl);
  all_fields_set(&wl.base);
  ProtobufCMessage *back = repack(&wl.base);
  codec_layout_from_wire((Kvcache__V1__Layout *)back, &l2);
  ASSERT_MEM_EQ(&l2, &l, sizeof l);
  protobuf_c_message_free_unpacked(back, NULL);

  kvc_xfer_t x = {1, 2, 3, 4, KVC_DTYPE_INT8, 0.5f, 2.0f}, x2;
  Kvcache__V1__Xfer wx;
  codec_xfer_to_wire(&x, &wx);
  all_fields_set(&wx.base);
  back = repack(&wx.base);
  codec_xfer_from_wire((Kvcache__V1__Xfer *)back, &x2);
  ASSERT_MEM_EQ(&x2, &x, sizeof x);
  protobuf_c_message_free_unpacked(back, NULL);

  kvc_seq_info_t s, s2;
  memset(&s, 0, sizeof s);
  s = (kvc_seq_info_t){.seq_id = 1ull << 60, .start = 2, .length = 3, .extent = 4, .pages = 5,
                       .shared_pages = 6, .pins = 7, .last_use_ms = 8};
  Kvcache__V1__SeqInfo ws;
  codec_seq_info_to_wire(&s, &ws);
  all_fields_set(&ws.base);
  back = repack(&ws.base);
  codec_seq_info_from_wire((Kvcache__V1__SeqInfo *)back, &s2);
  ASSERT_MEM_EQ(&s2, &s, sizeof s);
  protobuf_c_message_free_unpacked(back, NULL);

  kvc_cache_info_t ci, ci2;
  memset(&ci, 0, sizeof ci);
  strcpy(ci.name, "llama-70b");
  ci.cache_id = 9;
  ci.layout = full_layout();
  ci.page_bytes = 1u << 21;
  ci.sequences = 10;
  ci.tokens = 11;
  ci.pages = 12;
  strcpy(ci.tenant, "fleet-a");
  Kvcache__V1__CacheInfo wc;
  Kvcache__V1__Layout wcl;
  codec_cache_info_to_wire(&ci, &wc, &wcl);
  all_fields_set(&wc.base);
  ASSERT(wc.layout == &wcl);
  back = repack(&wc.base);
  codec_cache_info_from_wire((Kvcache__V1__CacheInfo *)back, &ci2);
  ASSERT_MEM_EQ(&ci2, &ci, sizeof ci);
  protobuf_c_message_free_unpacked(back, NULL);

  kvc_match_t m = {100, 6, 4}, m2;
  Kvcache__V1__MatchReply wm;
  codec_match_to_wire(&m, &wm);
  all_fields_set(&wm.base);
  back = repack(&wm.base);
  codec_match_from_wire((Kvcache__V1__MatchReply *)back, &m2);
  ASSERT_MEM_EQ(&m2, &m, sizeof m);
  protobuf_c_message_free_unpacked(back, NULL);

  double le[2] = {0.5, 1.5};
  uint64_t cnt[2] = {3, 4};
  kvc_stat_t st = {.name = "d_seconds", .value = 42, .gauge = true, .help = "free pages",
                   .cache = "c1", .kind = KVC_STAT_HISTOGRAM, .unit = "seconds",
                   .nbuckets = 2, .bucket_le = le, .bucket_count = cnt, .sum = 2.5}, st2;
  Kvcache__V1__Stat wst;
  codec_stat_to_wire(&st, &wst);
  /* Labels are the daemon's to build (metrics.c); one here for the check. */
  Kvcache__V1__Label wlab = KVCACHE__V1__LABEL__INIT, *wlabs[1] = {&wlab};
  wlab.key = (char *)"op";
  wlab.value = (char *)"put";
  wst.n_labels = 1;
  wst.labels = wlabs;
  all_fields_set(&wst.base);
  back = repack(&wst.base);
  kvc_label_t lab[1];
  codec_stat_from_wire((Kvcache__V1__Stat *)back, &st2, lab);
  ASSERT_STR_EQ(st2.name, st.name);
  ASSERT_STR_EQ(st2.help, st.help);
  ASSERT_STR_EQ(st2.cache, st.cache);
  ASSERT_STR_EQ(st2.unit, "seconds");
  ASSERT_U64_EQ(st2.value, 42);
  ASSERT(st2.gauge);
  ASSERT_EQ(st2.kind, KVC_STAT_HISTOGRAM);
  ASSERT_EQ(st2.nbuckets, 2);
  ASSERT(st2.bucket_le[1] == 1.5 && st2.bucket_count[1] == 4 && st2.sum == 2.5);
  ASSERT_EQ(st2.nlabels, 1);
  ASSERT_STR_EQ(st2.labels[0].key, "op");
  ASSERT_STR_EQ(st2.labels[0].value, "put");
  protobuf_c_message_free_unpacked(back, NULL);

  kvc_hist_span_t sp = {1, 2, 3, 4}, sp2;
  Kvcache__V1__HistorySpan wsp;
  codec_hist_span_to_wire(&sp, &wsp);
  all_fields_set(&wsp.base);
  back = repack(&wsp.base);
  codec_hist_span_from_wire((Kvcache__V1__HistorySpan *)back, &sp2);
  ASSERT_MEM_EQ(&sp2, &sp, sizeof sp);
  protobuf_c_message_free_unpacked(back, NULL);
}

TEST(frame_header_round_trips_and_bounds_the_length) {
  uint8_t buf[16] = {0};
  uint32_t len = 7;
  ASSERT_EQ(frame_parse(buf, 0, 100, &len), FRAME_NEED_MORE);
  ASSERT_EQ(frame_parse(buf, 3, 100, &len), FRAME_NEED_MORE);
  ASSERT_EQ(len, 7); /* not touched before the header is whole */
  frame_put_header(buf, 0x0a0b0c0du);
  ASSERT_EQ(buf[0], 0x0d); /* little-endian */
  ASSERT_EQ(buf[3], 0x0a);
  ASSERT_EQ(frame_parse(buf, 4, UINT32_MAX, &len), FRAME_NEED_MORE);
  ASSERT_EQ(len, 0x0a0b0c0du);
  ASSERT_EQ(frame_parse(buf, 4, 0x0a0b0c0cu, &len), FRAME_TOO_BIG);
  frame_put_header(buf, 12);
  ASSERT_EQ(frame_parse(buf, 15, 12, &len), FRAME_NEED_MORE);
  ASSERT_EQ(frame_parse(buf, 16, 12, &len), FRAME_OK); /* exactly the max */
  ASSERT_EQ(len, 12);
  frame_put_header(buf, 0);
  ASSERT_EQ(frame_parse(buf, 4, 0, &len), FRAME_OK); /* an empty payload */
  ASSERT_EQ(len, 0);
}

TEST(layout_xfer_resolves_checks_and_sizes) {
  kvc_layout_t l = {.num_layers = 4, .num_kv_heads = 2, .head_dim_k = 8, .head_dim_v = 4,
                    .dtype = KVC_DTYPE_F16};
  layout_xfer_t r;
  char why[128];
  kvc_xfer_t bad = {.layer_begin = 2, .layer_end = 5};
  ASSERT_ERR(layout_xfer(&l, &bad, false, &r, why, sizeof why), KVC_E_LAYER);
  ASSERT_STR_EQ(why, "layer range [2, 5) outside 0..4");
  bad = (kvc_xfer_t){.layer_begin = 3, .layer_end = 3};
  ASSERT_ERR(layout_xfer(&l, &bad, false, &r, NULL, 0), KVC_E_LAYER);
  bad = (kvc_xfer_t){.head_begin = 1, .head_end = 3};
  ASSERT_ERR(layout_xfer(&l, &bad, false, &r, why, sizeof why), KVC_E_HEAD);
  bad = (kvc_xfer_t){.head_begin = 1};
  ASSERT_ERR(layout_xfer(&l, &bad, true, &r, why, sizeof why), KVC_E_HEAD);
  ASSERT_STR_EQ(why, "a put writes every head");
  bad = (kvc_xfer_t){.dtype = KVC_DTYPE_BF16};
  ASSERT_ERR(layout_xfer(&l, &bad, true, &r, why, sizeof why), KVC_E_DTYPE);
  ASSERT_STR_EQ(why, "cannot put dtype 4 for a cache of dtype 3");
  bad = (kvc_xfer_t){.dtype = KVC_DTYPE_INT8};
  ASSERT_ERR(layout_xfer(&l, &bad, false, &r, why, sizeof why), KVC_E_DTYPE);

  /* All of it, natural dtype (f16): K 2 heads x 8 x 2 bytes a layer-token. */
  uint64_t kb = 1, vb = 1, sb = 1;
  ASSERT_OK(layout_xfer(&l, NULL, true, &r, why, sizeof why));
  ASSERT(r.l0 == 0 && r.l1 == 4 && r.h0 == 0 && r.h1 == 2 && r.bt == KVC_DTYPE_F16 && !r.raw);
  ASSERT_OK(layout_xfer_bytes(&r, 10, &kb, &vb, &sb));
  ASSERT_U64_EQ(kb, 4 * 10 * 2 * 8 * 2);
  ASSERT_U64_EQ(vb, 4 * 10 * 2 * 4 * 2);
  ASSERT_U64_EQ(sb, 0);
  ASSERT_OK(layout_xfer_bytes(&r, 10, NULL, NULL, NULL));
  kb = 5;
  ASSERT_ERR(layout_xfer_bytes(&r, UINT64_MAX / 8, &kb, NULL, NULL), KVC_E_OVERFLOW);
  ASSERT_U64_EQ(kb, 5); /* nothing written */

  /* One head of one layer of an int8 cache, raw: scales of 4 bytes a row. */
  l.dtype = KVC_DTYPE_INT8;
  kvc_xfer_t one = {.layer_begin = 1, .layer_end = 2, .head_begin = 1, .head_end = 2,
                    .dtype = KVC_DTYPE_INT8};
  ASSERT_OK(layout_xfer(&l, &one, false, &r, why, sizeof why));
  ASSERT(r.raw && r.k_row == 8 && r.v_row == 4 && r.s_row == 4);
  ASSERT_OK(layout_xfer_bytes(&r, 3, &kb, &vb, &sb));
  ASSERT_U64_EQ(kb, 3 * 8);
  ASSERT_U64_EQ(vb, 3 * 4);
  ASSERT_U64_EQ(sb, 3 * 4);
  ASSERT_EQ(layout_natural_dtype(&l), KVC_DTYPE_F32);
}
