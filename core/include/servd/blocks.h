/* GGUF quantized block layouts, as stored in packages and GGUF files (ggml's block_q8_0, block_q4_0,
 * block_q4_1, block_q5_0, block_q5_1). Every block holds SERVD_QK elements; d and m are f16 bit patterns.
 *   q8_0: x[i] = d * qs[i]                                                       (34 bytes)
 *   q4_0: x[i] = d * (nibble(i) - 8), nibble(i < 16) = qs[i] & 15, else qs[i-16] >> 4 (18 bytes)
 *   q4_1: x[i] = d * nibble(i) + m, nibbles as q4_0                              (20 bytes)
 *   q5_0: x[i] = d * (q(i) - 16), q(i) = nibble(i) | (bit i of qh, little-endian u32) << 4 (22 bytes)
 *   q5_1: x[i] = d * q(i) + m, q(i) as q5_0                                      (24 bytes)
 *
 * k-quants (ggml's block_q4_K, block_q6_K, block_q5_K): SERVD_QK_K = 256 elements per super-block.
 *   q4_k: d, dmin (f16); scales[12]: eight 6-bit scales sc[j] and mins m[j] (servd_k4_scale_min);
 *         qs[128]: element 64c + l (l < 32) is the low nibble of qs[32c + l], 64c + 32 + l its high
 *         nibble; element i is in sub-block j = i / 32 and x = d*sc[j]*q - dmin*m[j].
 *   q5_k: as q4_k plus qh[32]: bit 2c of qh[l] is bit 4 of element 64c + l, bit 2c+1 that of
 *         64c + 32 + l; q in 0..31.
 *   q6_k: ql[128], qh[64], scales[16] (int8), d (f16, last). For half h (elements 128h..128h+127)
 *         and l < 32, with L = ql + 64h and H = qh + 32h: element 128h + l + 32t takes its low 4 bits
 *         from L[l + 32(t&1)] (low nibble for t < 2, high for t >= 2) and its high 2 bits from
 *         H[l] >> 2t; x = d * scales[i / 16] * (q - 32).
 * Shared by the conversions here (servd_row_to_f32/from_f32) and the kernels that compute on blocks.
 */
#ifndef SERVD_BLOCKS_H
#define SERVD_BLOCKS_H

#include <stdint.h>

#include "servd/tensor.h"

typedef struct servd_block_q8_0 {
  uint16_t d;
  int8_t qs[SERVD_QK];
} servd_block_q8_0;
typedef struct servd_block_q4_0 {
  uint16_t d;
  uint8_t qs[SERVD_QK / 2];
} servd_block_q4_0;
typedef struct servd_block_q4_1 {
  uint16_t d, m;
  uint8_t qs[SERVD_QK / 2];
} servd_block_q4_1;
_Static_assert(sizeof(servd_block_q8_0) == 34, "q8_0 block");
_Static_assert(sizeof(servd_block_q4_0) == 18, "q4_0 block");
_Static_assert(sizeof(servd_block_q4_1) == 20, "q4_1 block");
typedef struct servd_block_q5_0 {
  uint16_t d;
  uint8_t qh[4], qs[SERVD_QK / 2];
} servd_block_q5_0;
typedef struct servd_block_q5_1 {
  uint16_t d, m;
  uint8_t qh[4], qs[SERVD_QK / 2];
} servd_block_q5_1;
_Static_assert(sizeof(servd_block_q5_0) == 22, "q5_0 block");
_Static_assert(sizeof(servd_block_q5_1) == 24, "q5_1 block");

/* The 5-bit value of element i (0..31) of a q5_0/q5_1 block. */
static inline int servd_q5_at(const uint8_t *qh, const uint8_t *qs, int i) {
  const int lo = i < SERVD_QK / 2 ? qs[i] & 0xF : qs[i - SERVD_QK / 2] >> 4;
  return lo | ((qh[i / 8] >> (i % 8)) & 1) << 4;
}

typedef struct servd_block_q4_k {
  uint16_t d, dmin;
  uint8_t scales[12], qs[SERVD_QK_K / 2];
} servd_block_q4_k;
typedef struct servd_block_q5_k {
  uint16_t d, dmin;
  uint8_t scales[12], qh[SERVD_QK_K / 8], qs[SERVD_QK_K / 2];
} servd_block_q5_k;
typedef struct servd_block_q6_k {
  uint8_t ql[SERVD_QK_K / 2], qh[SERVD_QK_K / 4];
  int8_t scales[SERVD_QK_K / 16];
  uint16_t d;
} servd_block_q6_k;
_Static_assert(sizeof(servd_block_q4_k) == 144, "q4_k block");
_Static_assert(sizeof(servd_block_q5_k) == 176, "q5_k block");
_Static_assert(sizeof(servd_block_q6_k) == 210, "q6_k block");

/* Scale and min of sub-block j (0..7) of a q4_k/q5_k super-block: 6 bits each, j < 4 in the low
 * bits of bytes j and j+4, j >= 4 in the nibbles of byte j+4 with their top 2 bits in bytes j-4 / j. */
static inline void servd_k4_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

/* Low-bit k-quants and the IQ4 codebook types (ggml's block_q2_K, block_q3_K, block_iq4_nl,
 * block_iq4_xs). Element e of a q2_k/q3_k super-block lies in half n = e / 128, step j = (e % 128) / 32
 * and l = e % 32: its 2 low bits are (qs[32n + l] >> 2j) & 3 and its 16-value group is e / 16.
 *   q2_k: scales[g] = sc | m << 4; x = d*sc*q - dmin*m                          (84 bytes)
 *   q3_k: bit (4n + j) of hmask[l] set: q = low bits, clear: q = low bits - 4; the sixteen 6-bit scales
 *         in scales[12] (servd_k3_scales); x = d*(sc - 32)*q                    (110 bytes)
 *   iq4_nl: blocks of 32, x = d*servd_iq4_values[code], codes as q4_0's nibbles (18 bytes)
 *   iq4_xs: 8 sub-blocks of 32, codes as iq4_nl's per sub-block (qs + 16*ib); 6-bit scale ls of
 *           sub-block ib: low 4 bits in scales_l[ib/2] >> 4*(ib%2), high 2 in scales_h >> 2*ib;
 *           x = d*(ls - 32)*servd_iq4_values[code]                             (136 bytes) */
typedef struct servd_block_q2_k {
  uint8_t scales[SERVD_QK_K / 16], qs[SERVD_QK_K / 4];
  uint16_t d, dmin;
} servd_block_q2_k;
typedef struct servd_block_q3_k {
  uint8_t hmask[SERVD_QK_K / 8], qs[SERVD_QK_K / 4], scales[12];
  uint16_t d;
} servd_block_q3_k;
typedef struct servd_block_iq4_nl {
  uint16_t d;
  uint8_t qs[SERVD_QK / 2];
} servd_block_iq4_nl;
typedef struct servd_block_iq4_xs {
  uint16_t d, scales_h;
  uint8_t scales_l[SERVD_QK_K / 64], qs[SERVD_QK_K / 2];
} servd_block_iq4_xs;
_Static_assert(sizeof(servd_block_q2_k) == 84, "q2_k block");
_Static_assert(sizeof(servd_block_q3_k) == 110, "q3_k block");
_Static_assert(sizeof(servd_block_iq4_nl) == 18, "iq4_nl block");
_Static_assert(sizeof(servd_block_iq4_xs) == 136, "iq4_xs block");

/* ggml's kvalues_iq4nl: the non-linear grid of IQ4_NL and IQ4_XS. */
static const int8_t servd_iq4_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

/* The sixteen 6-bit scales of a q3_k super-block (0..63, to be offset by -32): scale g has its low 4
 * bits in the nibble g / 8 of byte g % 8 and its high 2 bits at 2*(g / 4) of byte 8 + g % 4. */
static inline int servd_k3_scale(const uint8_t *s, int g) {
  const int lo = (s[g % 8] >> (4 * (g / 8))) & 0xF;
  return lo | ((s[8 + g % 4] >> (2 * (g / 4))) & 3) << 4;
}

/* The 6-bit scale of sub-block ib (0..7) of an iq4_xs super-block. */
static inline int servd_iq4xs_scale(const servd_block_iq4_xs *b, int ib) {
  return ((b->scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF) | ((b->scales_h >> (2 * ib)) & 3) << 4;
}

#endif
