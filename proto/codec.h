/* codec.h: the conversions between the public types (kvcache/kvcache.h) and
 * the wire messages (kvcache.proto), written once for the client library and
 * the daemon alike. The frame format is its neighbour, frame.h.
 *
 *   client (libkvcache)                         daemon
 *   kvc_layout_t  --codec_layout_to_wire-->    Layout  --codec_layout_from_wire--> kvc_layout_t
 *   kvc_xfer_t    --codec_xfer_to_wire---->    Xfer    --codec_xfer_from_wire----> kvc_xfer_t
 *   kvc_seq_info_t <-codec_seq_info_from_wire- SeqInfo <-codec_seq_info_to_wire-- kvc_seq_info_t
 *   (and the same pairs for CacheInfo, MatchReply, Stat, HistorySpan)
 *
 * Every function fills a struct the caller provides and allocates nothing,
 * so the codec depends on neither side's allocator (the daemon's arena, the
 * client's malloc). A to_wire function initializes its message; strings and
 * bytes it sets borrow the source's (protobuf-c never writes through them
 * when packing). A from_wire function accepts a NULL message as all zero.
 * The functions copy fields; they validate nothing (the engine does).
 */
#ifndef KVC_PROTO_CODEC_H
#define KVC_PROTO_CODEC_H

#include "kvcache.pb-c.h"
#include "kvcache/kvcache.h"

void codec_layout_to_wire(const kvc_layout_t *l, Kvcache__V1__Layout *w);
void codec_layout_from_wire(const Kvcache__V1__Layout *w, kvc_layout_t *l);

/* x NULL is all zero: every layer and head, the natural dtype. */
void codec_xfer_to_wire(const kvc_xfer_t *x, Kvcache__V1__Xfer *w);
void codec_xfer_from_wire(const Kvcache__V1__Xfer *w, kvc_xfer_t *x);

void codec_seq_info_to_wire(const kvc_seq_info_t *s, Kvcache__V1__SeqInfo *w);
void codec_seq_info_from_wire(const Kvcache__V1__SeqInfo *w, kvc_seq_info_t *s);

/* The layout goes to wl, which w->layout then points at. */
void codec_cache_info_to_wire(const kvc_cache_info_t *i, Kvcache__V1__CacheInfo *w,
                              Kvcache__V1__Layout *wl);
/* The name is copied (truncated to KVC_MAX_NAME). */
void codec_cache_info_from_wire(const Kvcache__V1__CacheInfo *w, kvc_cache_info_t *i);

void codec_match_to_wire(const kvc_match_t *m, Kvcache__V1__MatchReply *w);
void codec_match_from_wire(const Kvcache__V1__MatchReply *w, kvc_match_t *m);

/* The strings stay borrowed both ways (from_wire: until the message is
 * freed). A NULL string reads as "". */
void codec_stat_to_wire(const kvc_stat_t *s, Kvcache__V1__Stat *w);
/* labels: room for w->n_labels entries (NULL: none are read); the strings
 * stay w's. */
void codec_stat_from_wire(const Kvcache__V1__Stat *w, kvc_stat_t *s, kvc_label_t *labels);

/* Span keys: the key bytes stay borrowed both ways. */
void codec_span_key_to_wire(const kvc_span_key_t *s, Kvcache__V1__SpanKey *w);
void codec_span_key_from_wire(const Kvcache__V1__SpanKey *w, kvc_span_key_t *s);

void codec_hist_span_to_wire(const kvc_hist_span_t *s, Kvcache__V1__HistorySpan *w);
void codec_hist_span_from_wire(const Kvcache__V1__HistorySpan *w, kvc_hist_span_t *s);

#endif
