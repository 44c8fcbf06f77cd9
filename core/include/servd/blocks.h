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

#endif
