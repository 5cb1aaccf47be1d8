/* rope.h: re-rotates stored keys by a position delta (rotary embeddings).
 *
 * A key computed at position p has each rotary pair (x, y) turned by the
 * angle (p / scale) * theta^(-2i / dims), i the pair's index. Rotations add
 * up, so turning it once more by delta's angle gives the key computed at
 * p + delta: that is how a shift moves keys without the model.
 *
 *   NeoX (half split):   pair i = (x[i], x[i + dims/2])
 *   GPT-J (interleaved): pair i = (x[2i], x[2i + 1])
 *
 * Dims past rope_dims are not rotated. Arithmetic is in double; f16, bf16
 * and f32 round once on the way back; int8 rows are dequantized, rotated and
 * quantized again with a new scale.
 */
#ifndef KVC_ROPE_H
#define KVC_ROPE_H

#include <stdbool.h>
#include <stdint.h>

#include "layout.h"

typedef struct rope {
  uint32_t dims;  /* rotary dims per head (even) */
  bool gptj;
  double *cs;     /* cos/sin per pair for the current delta: 2 * dims/2 */
  double *x;      /* one head's K in double: head_dim_k */
  float *f;       /* one head's K in f32 (int8 path): head_dim_k */
} rope_t;

/* Sets up r for layout l and a delta (the caller allocated cs, x, f). */
void rope_init(rope_t *r, const kvc_layout_t *l, int64_t delta);
/* The rotation frequency of pair i under the layout's RoPE scaling. */
double rope_freq(const kvc_layout_t *l, uint32_t i);
/* Rotates one token's K row of one layer in place: H heads of dk elements
 * stored in dtype dt at row; ks are its int8 scales (H floats) or NULL. */
void rope_rotate_row(const rope_t *r, const geom_t *g, kvc_dtype_t dt, unsigned char *row,
                     unsigned char *ks);

#endif
