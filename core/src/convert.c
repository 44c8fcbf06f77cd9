/* Scalar f16/bf16 conversions and row conversion/quantization for every dtype (ggml reference
 * rounding: q8_0, q4_0, q4_1, q5_0, q5_1 match ggml's quantize_row_*_ref bit for bit; k-quants dequantize as
 * ggml does and quantize by plain rounding, see below). */
#include <math.h>
#include <string.h>

#include "convert-impl.h"
#include "servd/blocks.h"
#include "servd/tensor.h"

static inline uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
static inline float bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

float servd_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  if (exp == 0x1f) return bits_f32(sign | 0x7f800000u | (man << 13)); /* inf / nan */
  if (exp == 0) {
    /* zero or subnormal: man * 2^-24 is exact in f32 */
    float v = (float)man * 0x1p-24f;
    return sign ? -v : v;
  }
  return bits_f32(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t servd_f32_to_f16(float f) {
  uint32_t u = f32_bits(f);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
  uint32_t a = u & 0x7fffffffu;
  if (a >= 0x7f800000u) return sign | (a > 0x7f800000u ? 0x7e00 : 0x7c00); /* nan / inf */
  if (a >= 0x477ff000u) return sign | 0x7c00;                              /* rounds to >= 65536: inf */
  if (a < 0x38800000u) {
    /* Result is subnormal (or zero) in f16: add 0.5 as a magic number so the FPU rounds to
     * nearest even at the 2^-24 unit. */
    float v = bits_f32(a) + 0.5f;
    return sign | (uint16_t)(f32_bits(v) - 0x3f000000u);
  }
  uint32_t mant_odd = (a >> 13) & 1;
  a += 0xfffu + mant_odd; /* round to nearest even on the 13 dropped bits */
  return sign | (uint16_t)((a - 0x38000000u) >> 13);
}

uint16_t servd_f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* keep nan quiet */
  u += 0x7fffu + ((u >> 16) & 1);
  return (uint16_t)(u >> 16);
}

/* ---- GGUF blocks: reference quantization as in ggml -------------------------------------------- */

/* Float to int as ggml does (truncation or rounding happens before), except that NaN and infinities,
 * whose conversion C leaves undefined, become 0: garbage in, but no undefined behaviour. */
static inline int to_int(float v) { return v > -256.0f && v < 256.0f ? (int)v : 0; }

/* q4_0's and q5_0's grid of a block: d = the element of largest magnitude (the first of equals, sign
 * kept) over the grid's lowest level `low` (-8, -16). Stores d as f16 and returns 1/d (0 for zeros). */
static float symmetric_grid(const float *x, float low, uint16_t *d16) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < SERVD_QK; j++) {
    if (amax < fabsf(x[j])) {
      amax = fabsf(x[j]);
      max = x[j];
    }
  }
  const float d = max / low;
  *d16 = servd_f32_to_f16(d);
  return d ? 1.0f / d : 0.0f;
}

/* q4_1's and q5_1's grid of a block: nmax steps of d from its min to its max. Stores d and the min
 * as f16 and returns 1/d (0 for a constant block); *min is the min as f32. */
static float affine_grid(const float *x, float nmax, uint16_t *d16, uint16_t *m16, float *min) {
  float max = -INFINITY;
  *min = INFINITY;
  for (int j = 0; j < SERVD_QK; j++) {
    if (x[j] < *min) *min = x[j];
    if (x[j] > max) max = x[j];
  }
  const float d = (max - *min) / nmax;
  *d16 = servd_f32_to_f16(d);
  *m16 = servd_f32_to_f16(*min);
  return d ? 1.0f / d : 0.0f;
}

/* Elements j and j + 16 (0..31) of a q4 block, clamped to 15: the low and the high nibble of qs[j]. */
static void pack_q4(uint8_t *qs, int j, int8_t a, int8_t b) {
  const uint8_t qa = (uint8_t)(a < 15 ? a : 15), qb = (uint8_t)(b < 15 ? b : 15);
  qs[j] = (uint8_t)(qa | (qb << 4));
}

/* Elements j and j + 16 (0..31) of a q5 block: low nibbles in qs[j], bit 4 in bits j and j + 16 of
 * *qh. */
static void pack_q5(uint8_t *qs, uint32_t *qh, int j, uint8_t qa, uint8_t qb) {
  qs[j] = (uint8_t)((qa & 0xF) | (qb & 0xF) << 4);
  *qh |= (uint32_t)(qa >> 4) << j | (uint32_t)(qb >> 4) << (j + SERVD_QK / 2);
}

static void store_qh(uint8_t *dst, uint32_t qh) {
  for (int k = 0; k < 4; k++) dst[k] = (uint8_t)(qh >> (8 * k));
}

void servd__q8_0_from_f32(const float *x, void *dst, int64_t nb) {
  servd_block_q8_0 *y = dst;
  for (int64_t i = 0; i < nb; i++, x += SERVD_QK) {
    float amax = 0.0f;
    for (int j = 0; j < SERVD_QK; j++) amax = fmaxf(amax, fabsf(x[j]));
    const float d = amax / 127.0f;
    const float id = d ? 1.0f / d : 0.0f;
    y[i].d = servd_f32_to_f16(d);
    for (int j = 0; j < SERVD_QK; j++) y[i].qs[j] = (int8_t)to_int(roundf(x[j] * id));
  }
}

void servd__q4_0_from_f32(const float *x, void *dst, int64_t nb) {
  servd_block_q4_0 *y = dst;
  for (int64_t i = 0; i < nb; i++, x += SERVD_QK) {
    const float id = symmetric_grid(x, -8.0f, &y[i].d);
    for (int j = 0; j < SERVD_QK / 2; j++) {
      pack_q4(y[i].qs, j, (int8_t)to_int(x[j] * id + 8.5f), (int8_t)to_int(x[j + SERVD_QK / 2] * id + 8.5f));
    }
  }
}

void servd__q4_1_from_f32(const float *x, void *dst, int64_t nb) {
  servd_block_q4_1 *y = dst;
  for (int64_t i = 0; i < nb; i++, x += SERVD_QK) {
    float min;
    const float id = affine_grid(x, 15.0f, &y[i].d, &y[i].m, &min);
    for (int j = 0; j < SERVD_QK / 2; j++) {
      pack_q4(y[i].qs, j, (int8_t)to_int((x[j] - min) * id + 0.5f),
              (int8_t)to_int((x[j + SERVD_QK / 2] - min) * id + 0.5f));
    }
  }
}

/* q5_0 / q5_1: as q4_0 / q4_1 on 32 levels, bit 4 of element j in bit j of qh. */
void servd__q5_0_from_f32(const float *x, void *dst, int64_t nb) {
  servd_block_q5_0 *y = dst;
  for (int64_t i = 0; i < nb; i++, x += SERVD_QK) {
    const float id = symmetric_grid(x, -16.0f, &y[i].d);
    uint32_t qh = 0;
    for (int j = 0; j < SERVD_QK / 2; j++) {
      const int8_t a = (int8_t)to_int(x[j] * id + 16.5f), b = (int8_t)to_int(x[j + SERVD_QK / 2] * id + 16.5f);
      const uint8_t qa = (uint8_t)(a < 31 ? a : 31), qb = (uint8_t)(b < 31 ? b : 31);
      pack_q5(y[i].qs, &qh, j, qa, qb);
    }
    store_qh(y[i].qh, qh);
  }
}

void servd__q5_1_from_f32(const float *x, void *dst, int64_t nb) {
  servd_block_q5_1 *y = dst;
  for (int64_t i = 0; i < nb; i++, x += SERVD_QK) {
    float min;
    const float id = affine_grid(x, 31.0f, &y[i].d, &y[i].m, &min);
    uint32_t qh = 0;
    for (int j = 0; j < SERVD_QK / 2; j++) {
      /* ggml does not clamp here (the rounding cannot pass 31 for finite x); NaN/inf rows stay in range */
      const int a = to_int((x[j] - min) * id + 0.5f), b = to_int((x[j + SERVD_QK / 2] - min) * id + 0.5f);
      const uint8_t qa = (uint8_t)(a < 31 ? a : 31), qb = (uint8_t)(b < 31 ? b : 31);
      pack_q5(y[i].qs, &qh, j, qa, qb);
    }
    store_qh(y[i].qh, qh);
  }
}

/* ---- k-quants: reference dequantization as in ggml (dequantize_row_q*_K); quantization by plain
 * rounding (ggml's quantize_row_q*_K_ref searches each sub-block's scale and min; ours does not, so
 * rows quantized here err a little more, but GGUF k-quant tensors arrive quantized and are kept). */

/* q4_k and q5_k (qh NULL for q4_k): per sub-block pair c, its two 6-bit scales and mins applied to the
 * low and high nibbles of qs[32c ..], bit 2c and 2c+1 of qh[l] the fifth bits. */
static void dequant_k4(uint16_t dh, uint16_t dminh, const uint8_t *scales, const uint8_t *qs, const uint8_t *qh,
                       float *y) {
  const float d = servd_f16_to_f32(dh), dmin = servd_f16_to_f32(dminh);
  for (int c = 0; c < 4; c++) {
    uint8_t sc0, m0, sc1, m1;
    servd_k4_scale_min(2 * c, scales, &sc0, &m0);
    servd_k4_scale_min(2 * c + 1, scales, &sc1, &m1);
    const float d0 = d * sc0, c0 = dmin * m0, d1 = d * sc1, c1 = dmin * m1;
    for (int l = 0; l < 32; l++) {
      const int h0 = qh ? (qh[l] >> (2 * c)) & 1 : 0, h1 = qh ? (qh[l] >> (2 * c + 1)) & 1 : 0;
      y[64 * c + l] = d0 * (float)((qs[32 * c + l] & 0xF) | h0 << 4) - c0;
      y[64 * c + 32 + l] = d1 * (float)((qs[32 * c + l] >> 4) | h1 << 4) - c1;
    }
  }
}

void servd__q4_k_to_f32(const void *src, float *y, int64_t nb) {
  const servd_block_q4_k *b = src;
  for (int64_t i = 0; i < nb; i++, b++, y += SERVD_QK_K) dequant_k4(b->d, b->dmin, b->scales, b->qs, NULL, y);
}

void servd__q5_k_to_f32(const void *src, float *y, int64_t nb) {
  const servd_block_q5_k *b = src;
  for (int64_t i = 0; i < nb; i++, b++, y += SERVD_QK_K) dequant_k4(b->d, b->dmin, b->scales, b->qs, b->qh, y);
}

void servd__q6_k_to_f32(const void *src, float *y, int64_t nb) {
  const servd_block_q6_k *b = src;
  for (int64_t i = 0; i < nb; i++, b++) {
    const float d = servd_f16_to_f32(b->d);
    for (int h = 0; h < 2; h++) {
      const uint8_t *ql = b->ql + 64 * h, *qh = b->qh + 32 * h;
      for (int t = 0; t < 4; t++) {
        for (int l = 0; l < 32; l++) {
          const int lo = t < 2 ? ql[l + 32 * (t & 1)] & 0xF : ql[l + 32 * (t & 1)] >> 4;
          const int q = (lo | ((qh[l] >> (2 * t)) & 3) << 4) - 32;
          const int e = 128 * h + 32 * t + l;
          y[e] = d * (float)b->scales[e / 16] * (float)q;
        }
      }
    }
    y += SERVD_QK_K;
  }
}

static inline int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* q4_k (nmax 15) and q5_k (nmax 31): per sub-block of 32 an affine grid from min(0, min x) to max x,
 * its scale and min stored as 6-bit multiples of the super-block's d and dmin. */
static void quantize_k4(const float *x, uint8_t *dh, uint8_t *dminh, uint8_t *scales, uint8_t *q, int nmax) {
  float scale[8], min[8], max_scale = 0.0f, max_min = 0.0f;
  for (int j = 0; j < 8; j++) {
    float mn = 0.0f, mx = -INFINITY;
    for (int l = 0; l < 32; l++) {
      mn = fminf(mn, x[32 * j + l]);
      mx = fmaxf(mx, x[32 * j + l]);
    }
    scale[j] = (mx - mn) / (float)nmax;
    min[j] = -mn;
    max_scale = fmaxf(max_scale, scale[j]);
    max_min = fmaxf(max_min, min[j]);
  }
  const uint16_t d16 = servd_f32_to_f16(max_scale / 63.0f), m16 = servd_f32_to_f16(max_min / 63.0f);
  memcpy(dh, &d16, 2);
  memcpy(dminh, &m16, 2);
  const float d = servd_f16_to_f32(d16), dmin = servd_f16_to_f32(m16);
  memset(scales, 0, 12);
  for (int j = 0; j < 8; j++) {
    const int ls = d > 0 ? clampi(to_int(roundf(scale[j] / d)), 0, 63) : 0;
    const int lm = dmin > 0 ? clampi(to_int(roundf(min[j] / dmin)), 0, 63) : 0;
    if (j < 4) {
      scales[j] |= (uint8_t)ls;
      scales[j + 4] |= (uint8_t)lm;
    } else {
      scales[j + 4] = (uint8_t)((ls & 0xF) | (lm & 0xF) << 4);
      scales[j - 4] |= (uint8_t)((ls >> 4) << 6);
      scales[j] |= (uint8_t)((lm >> 4) << 6);
    }
    const float dl = d * (float)ls, ml = dmin * (float)lm;
    for (int l = 0; l < 32; l++)
      q[32 * j + l] = (uint8_t)(dl > 0 ? clampi(to_int(roundf((x[32 * j + l] + ml) / dl)), 0, nmax) : 0);
  }
}

void servd__q4_k_from_f32(const float *x, void *dst, int64_t nb) {
  servd_block_q4_k *y = dst;
  uint8_t q[SERVD_QK_K];
  for (int64_t i = 0; i < nb; i++, x += SERVD_QK_K, y++) {
    quantize_k4(x, (uint8_t *)&y->d, (uint8_t *)&y->dmin, y->scales, q, 15);
    for (int c = 0; c < 4; c++)
      for (int l = 0; l < 32; l++) y->qs[32 * c + l] = (uint8_t)(q[64 * c + l] | q[64 * c + 32 + l] << 4);
  }
}

void servd__q5_k_from_f32(const float *x, void *dst, int64_t nb) {
  servd_block_q5_k *y = dst;
  uint8_t q[SERVD_QK_K];
  for (int64_t i = 0; i < nb; i++, x += SERVD_QK_K, y++) {
    quantize_k4(x, (uint8_t *)&y->d, (uint8_t *)&y->dmin, y->scales, q, 31);
    memset(y->qh, 0, sizeof y->qh);
    for (int c = 0; c < 4; c++) {
      for (int l = 0; l < 32; l++) {
        const int a = q[64 * c + l], b = q[64 * c + 32 + l];
        y->qs[32 * c + l] = (uint8_t)((a & 0xF) | (b & 0xF) << 4);
        y->qh[l] |= (uint8_t)((a >> 4) << (2 * c) | (b >> 4) << (2 * c + 1));
      }
    }
  }
}

/* q6_k: per group of 16 a symmetric grid with q in -32..31, its scale an int8 multiple of d. */
void servd__q6_k_from_f32(const float *x, void *dst, int64_t nb) {
  servd_block_q6_k *y = dst;
  uint8_t q[SERVD_QK_K];
  for (int64_t i = 0; i < nb; i++, x += SERVD_QK_K, y++) {
    float scale[16], max_scale = 0.0f;
    for (int g = 0; g < 16; g++) {
      float amax = 0.0f;
      for (int l = 0; l < 16; l++) amax = fmaxf(amax, fabsf(x[16 * g + l]));
      scale[g] = amax / 31.0f;
      max_scale = fmaxf(max_scale, scale[g]);
    }
    y->d = servd_f32_to_f16(max_scale / 127.0f);
    const float d = servd_f16_to_f32(y->d);
    for (int g = 0; g < 16; g++) {
      const int ls = d > 0 ? clampi(to_int(roundf(scale[g] / d)), 0, 127) : 0;
      y->scales[g] = (int8_t)ls;
      const float dl = d * (float)ls;
      for (int l = 0; l < 16; l++)
        q[16 * g + l] = (uint8_t)(dl > 0 ? clampi(to_int(roundf(x[16 * g + l] / dl)), -32, 31) + 32 : 32);
    }
    for (int h = 0; h < 2; h++) {
      const uint8_t *v = q + 128 * h;
      for (int l = 0; l < 32; l++) {
        y->ql[64 * h + l] = (uint8_t)((v[l] & 0xF) | (v[l + 64] & 0xF) << 4);
        y->ql[64 * h + l + 32] = (uint8_t)((v[l + 32] & 0xF) | (v[l + 96] & 0xF) << 4);
        y->qh[32 * h + l] =
            (uint8_t)(v[l] >> 4 | (v[l + 32] >> 4) << 2 | (v[l + 64] >> 4) << 4 | (v[l + 96] >> 4) << 6);
      }
    }
  }
}

/* ---- plain dtypes and the blocks of 32: to f32 (nb blocks; elements for plain dtypes) ---------- */

void servd__f32_to_f32(const void *src, float *dst, int64_t n) { memmove(dst, src, (size_t)n * 4); }

void servd__f16_to_f32(const void *src, float *dst, int64_t n) {
  for (int64_t i = 0; i < n; i++) dst[i] = servd_f16_to_f32(((const uint16_t *)src)[i]);
}

void servd__bf16_to_f32(const void *src, float *dst, int64_t n) {
  for (int64_t i = 0; i < n; i++) dst[i] = servd_bf16_to_f32(((const uint16_t *)src)[i]);
}

void servd__i32_to_f32(const void *src, float *dst, int64_t n) {
  for (int64_t i = 0; i < n; i++) dst[i] = (float)((const int32_t *)src)[i];
}

void servd__q8_0_to_f32(const void *src, float *dst, int64_t nb) {
  for (int64_t i = 0; i < nb; i++) {
    const servd_block_q8_0 *b = (const servd_block_q8_0 *)src + i;
    const float d = servd_f16_to_f32(b->d);
    for (int j = 0; j < SERVD_QK; j++) dst[i * SERVD_QK + j] = d * (float)b->qs[j];
  }
}

void servd__q4_0_to_f32(const void *src, float *dst, int64_t nb) {
  for (int64_t i = 0; i < nb; i++) {
    const servd_block_q4_0 *b = (const servd_block_q4_0 *)src + i;
    const float d = servd_f16_to_f32(b->d);
    for (int j = 0; j < SERVD_QK / 2; j++) {
      dst[i * SERVD_QK + j] = d * (float)((b->qs[j] & 0x0f) - 8);
      dst[i * SERVD_QK + j + SERVD_QK / 2] = d * (float)((b->qs[j] >> 4) - 8);
    }
  }
}

void servd__q4_1_to_f32(const void *src, float *dst, int64_t nb) {
  for (int64_t i = 0; i < nb; i++) {
    const servd_block_q4_1 *b = (const servd_block_q4_1 *)src + i;
    const float d = servd_f16_to_f32(b->d), m = servd_f16_to_f32(b->m);
    for (int j = 0; j < SERVD_QK / 2; j++) {
      dst[i * SERVD_QK + j] = d * (float)(b->qs[j] & 0x0f) + m;
      dst[i * SERVD_QK + j + SERVD_QK / 2] = d * (float)(b->qs[j] >> 4) + m;
    }
  }
}

void servd__q5_0_to_f32(const void *src, float *dst, int64_t nb) {
  for (int64_t i = 0; i < nb; i++) {
    const servd_block_q5_0 *b = (const servd_block_q5_0 *)src + i;
    const float d = servd_f16_to_f32(b->d);
    for (int j = 0; j < SERVD_QK; j++) dst[i * SERVD_QK + j] = d * (float)(servd_q5_at(b->qh, b->qs, j) - 16);
  }
}

void servd__q5_1_to_f32(const void *src, float *dst, int64_t nb) {
  for (int64_t i = 0; i < nb; i++) {
    const servd_block_q5_1 *b = (const servd_block_q5_1 *)src + i;
    const float d = servd_f16_to_f32(b->d), m = servd_f16_to_f32(b->m);
    for (int j = 0; j < SERVD_QK; j++) dst[i * SERVD_QK + j] = d * (float)servd_q5_at(b->qh, b->qs, j) + m;
  }
}

/* ---- plain dtypes: from f32 ------------------------------------------------------------------- */

void servd__f32_from_f32(const float *src, void *dst, int64_t n) { memmove(dst, src, (size_t)n * 4); }

void servd__f16_from_f32(const float *src, void *dst, int64_t n) {
  for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = servd_f32_to_f16(src[i]);
}

void servd__bf16_from_f32(const float *src, void *dst, int64_t n) {
  for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = servd_f32_to_bf16(src[i]);
}

/* Values rounded to the nearest integer; each fits (checked by fits_i32 first). */
void servd__i32_from_f32(const float *src, void *dst, int64_t n) {
  for (int64_t i = 0; i < n; i++) ((int32_t *)dst)[i] = (int32_t)rintf(src[i]);
}

/* i32 is the one dtype a value may not fit: servd_row_from_f32 refuses such a row before writing it. */
static int fits_i32(const float *src, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    const float v = rintf(src[i]);
    if (!(v >= -2147483648.0f && v < 2147483648.0f))
      return servd_fail(SERVD_ERANGE, "row_from_f32: element %lld (%g) does not fit i32", (long long)i, (double)src[i]);
  }
  return 0;
}

/* ---- the rows of servd/dtypes.def ------------------------------------------------------------- */

static const struct {
  void (*to_f32)(const void *src, float *dst, int64_t nb);
  void (*from_f32)(const float *src, void *dst, int64_t nb);
} conversions[] = {
#define SERVD_DTYPE(ID, value, name, ...) [SERVD_##ID] = {servd__##name##_to_f32, servd__##name##_from_f32},
#include "servd/dtypes.def"
};
_Static_assert(sizeof conversions / sizeof conversions[0] == SERVD_DTYPE_COUNT, "one conversion row per dtype");

static int check_row(const char *op, servd_dtype t, const void *a, const void *b, int64_t n) {
  if ((unsigned)t >= SERVD_DTYPE_COUNT) return servd_fail(SERVD_EINVAL, "%s: invalid dtype %d", op, (int)t);
  if (n < 0 || n % (int64_t)servd_dtype_block_elems(t) != 0)
    return servd_fail(SERVD_EINVAL, "%s: %lld elements is not a whole number of %s blocks", op, (long long)n,
                      servd_dtype_name(t));
  if (n > 0 && (!a || !b)) return servd_fail(SERVD_EINVAL, "%s: NULL buffer", op);
  return 0;
}

int servd_row_to_f32(servd_dtype t, const void *src, float *dst, int64_t n) {
  int rc = check_row("row_to_f32", t, src, dst, n);
  if (rc) return rc;
  conversions[t].to_f32(src, dst, n / (int64_t)servd_dtype_block_elems(t));
  return 0;
}

int servd_row_from_f32(servd_dtype t, const float *src, void *dst, int64_t n) {
  int rc = check_row("row_from_f32", t, src, dst, n);
  if (!rc && t == SERVD_I32) rc = fits_i32(src, n);
  if (rc) return rc;
  conversions[t].from_f32(src, dst, n / (int64_t)servd_dtype_block_elems(t));
  return 0;
}
