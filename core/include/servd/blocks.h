/* GGUF quantized block layouts, as stored in packages and GGUF files (ggml's block_q8_0, block_q4_0,
 * block_q4_1). Every block holds SERVD_QK elements; d and m are f16 bit patterns.
 *   q8_0: x[i] = d * qs[i]                                                       (34 bytes)
 *   q4_0: x[i] = d * (nibble(i) - 8), nibble(i < 16) = qs[i] & 15, else qs[i-16] >> 4 (18 bytes)
 *   q4_1: x[i] = d * nibble(i) + m, nibbles as q4_0                              (20 bytes)
 * Shared by the conversions here (servd_row_to_f32/from_f32) and the kernels that compute on blocks.
 */
#ifndef SERVD_BLOCKS_H
#define SERVD_BLOCKS_H

#include <stdint.h>

#include "servd/tensor.h"

typedef struct servd_block_q8_0 { uint16_t d; int8_t qs[SERVD_QK]; } servd_block_q8_0;
typedef struct servd_block_q4_0 { uint16_t d; uint8_t qs[SERVD_QK / 2]; } servd_block_q4_0;
typedef struct servd_block_q4_1 { uint16_t d, m; uint8_t qs[SERVD_QK / 2]; } servd_block_q4_1;
_Static_assert(sizeof(servd_block_q8_0) == 34, "q8_0 block");
_Static_assert(sizeof(servd_block_q4_0) == 18, "q4_0 block");
_Static_assert(sizeof(servd_block_q4_1) == 20, "q4_1 block");

#endif
