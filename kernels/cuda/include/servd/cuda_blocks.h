/* Decoding of quantized weight rows for the GPU GEMV (kernels/cuda/gemv_quant.cu), written once for
 * the device and the host: the CUDA stand-in (tests/device/fake_cuda.c) runs these same functions, so
 * the bit unpacking the GPU kernel does is tested on the CPU against servd_row_to_f32.
 *
 * A row is n_values / block_elems blocks of servd/blocks.h's layouts (ggml's), byte for byte as the
 * package holds them. servd_qb_decode8 gives 8 consecutive values; 8 divides every sub-block of the
 * types here (q8_0: blocks of 32; q4_k: sub-blocks of 32 with one scale and min; q6_k: groups of 16
 * with one scale), so each call needs one scale.
 *
 * Byte offsets instead of the C structs: nvcc compiles this as C++, where servd/blocks.h's static
 * assertions do not parse (the layouts are restated below and checked against blocks.h in C).
 */
#ifndef SERVD_CUDA_BLOCKS_H
#define SERVD_CUDA_BLOCKS_H

#include <stdint.h>

#include "servd/tensor.h"

#ifdef __CUDACC__
#define SERVD_QB_FN static __host__ __device__ __forceinline__
#else
#include <string.h>
#define SERVD_QB_FN static inline
#endif

/* Bytes per block and values per block of the dtypes the GEMV reads. */
enum { SERVD_QB_Q8_0_BYTES = 34, SERVD_QB_Q4_K_BYTES = 144, SERVD_QB_Q6_K_BYTES = 210 };

SERVD_QB_FN bool servd_qb_supported(int dtype) {
  return dtype == SERVD_Q8_0 || dtype == SERVD_Q4_K || dtype == SERVD_Q6_K;
}

SERVD_QB_FN float servd_qb_bits(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
#endif
}

/* IEEE half to float, exact (subnormals, infinities and NaN included). */
SERVD_QB_FN float servd_qb_f16(const unsigned char *p) {
  const uint32_t h = (uint32_t)p[0] | (uint32_t)p[1] << 8;
  const uint32_t s = (h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) {
    const float v = (float)m * 5.9604644775390625e-8f; /* m * 2^-24 */
    return s ? -v : v;
  }
  if (e == 31) return servd_qb_bits(s | 0x7f800000u | m << 13);
  return servd_qb_bits(s | (e + 112) << 23 | m << 13);
}

/* Values v0 .. v0+7 (v0 % 8 == 0) of a row of q8_0, q4_k or q6_k blocks, computed as
 * servd_row_to_f32 computes them. */
SERVD_QB_FN void servd_qb_decode8(int dtype, const unsigned char *row, int64_t v0, float *y) {
  if (dtype == SERVD_Q8_0) {
    const unsigned char *blk = row + (v0 / 32) * SERVD_QB_Q8_0_BYTES;
    const float d = servd_qb_f16(blk);
    const signed char *qs = (const signed char *)blk + 2 + v0 % 32;
    for (int i = 0; i < 8; i++) y[i] = d * (float)qs[i];
  } else if (dtype == SERVD_Q4_K) {
    /* d, dmin (f16), scales[12] (6-bit scale and min per sub-block of 32), qs[128]: sub-blocks 2c and
     * 2c+1 are the low and high nibbles of qs[32c ..] */
    const unsigned char *blk = row + (v0 / 256) * SERVD_QB_Q4_K_BYTES, *sc = blk + 4;
    const int e = (int)(v0 % 256), j = e / 32, l = e % 32;
    int scale, min;
    if (j < 4) {
      scale = sc[j] & 63;
      min = sc[j + 4] & 63;
    } else {
      scale = (sc[j + 4] & 0xF) | (sc[j - 4] >> 6) << 4;
      min = (sc[j + 4] >> 4) | (sc[j] >> 6) << 4;
    }
    const float d = servd_qb_f16(blk) * (float)scale, c = servd_qb_f16(blk + 2) * (float)min;
    const unsigned char *qs = blk + 16 + 32 * (j / 2) + l;
    for (int i = 0; i < 8; i++) y[i] = d * (float)(j % 2 ? qs[i] >> 4 : qs[i] & 0xF) - c;
  } else { /* SERVD_Q6_K: ql[128], qh[64], scales[16] (int8, one per 16 values), d (f16) */
    const unsigned char *blk = row + (v0 / 256) * SERVD_QB_Q6_K_BYTES;
    const int e = (int)(v0 % 256), h = e / 128, t = (e % 128) / 32, l = e % 32;
    const unsigned char *ql = blk + 64 * h + 32 * (t & 1) + l, *qh = blk + 128 + 32 * h + l;
    const float d = servd_qb_f16(blk + 208), s = (float)((const signed char *)blk)[192 + e / 16];
    for (int i = 0; i < 8; i++) {
      const int lo = t < 2 ? ql[i] & 0xF : ql[i] >> 4;
      y[i] = d * s * (float)((lo | ((qh[i] >> (2 * t)) & 3) << 4) - 32);
    }
  }
}

/* Bytes of one row of k values. */
SERVD_QB_FN int64_t servd_qb_row_bytes(int dtype, int64_t k) {
  return dtype == SERVD_Q8_0 ? k / 32 * SERVD_QB_Q8_0_BYTES
                             : k / 256 * (dtype == SERVD_Q4_K ? SERVD_QB_Q4_K_BYTES : SERVD_QB_Q6_K_BYTES);
}

#endif
