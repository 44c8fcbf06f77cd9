/* Scalar f16/bf16 conversions and row conversion/quantization for every dtype (ggml reference
 * rounding: q8_0, q4_0, q4_1 match ggml's quantize_row_*_ref bit for bit). */
#include <math.h>
#include <string.h>

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
  if (a >= 0x477ff000u) return sign | 0x7c00; /* rounds to >= 65536: inf */
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

static void quantize_q8_0(const float *x, servd_block_q8_0 *y, int64_t nb) {
  for (int64_t i = 0; i < nb; i++, x += SERVD_QK) {
    float amax = 0.0f;
    for (int j = 0; j < SERVD_QK; j++) amax = fmaxf(amax, fabsf(x[j]));
    const float d = amax / 127.0f;
    const float id = d ? 1.0f / d : 0.0f;
    y[i].d = servd_f32_to_f16(d);
    for (int j = 0; j < SERVD_QK; j++) y[i].qs[j] = (int8_t)to_int(roundf(x[j] * id));
  }
}

static void quantize_q4_0(const float *x, servd_block_q4_0 *y, int64_t nb) {
  for (int64_t i = 0; i < nb; i++, x += SERVD_QK) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < SERVD_QK; j++) {
      if (amax < fabsf(x[j])) {
        amax = fabsf(x[j]);
        max = x[j];
      }
    }
    const float d = max / -8.0f;
    const float id = d ? 1.0f / d : 0.0f;
    y[i].d = servd_f32_to_f16(d);
    for (int j = 0; j < SERVD_QK / 2; j++) {
      const int8_t a = (int8_t)to_int(x[j] * id + 8.5f), b = (int8_t)to_int(x[j + SERVD_QK / 2] * id + 8.5f);
      const uint8_t qa = (uint8_t)(a < 15 ? a : 15), qb = (uint8_t)(b < 15 ? b : 15);
      y[i].qs[j] = (uint8_t)(qa | (qb << 4));
    }
  }
}

static void quantize_q4_1(const float *x, servd_block_q4_1 *y, int64_t nb) {
  for (int64_t i = 0; i < nb; i++, x += SERVD_QK) {
    float min = INFINITY, max = -INFINITY;
    for (int j = 0; j < SERVD_QK; j++) {
      if (x[j] < min) min = x[j];
      if (x[j] > max) max = x[j];
    }
    const float d = (max - min) / 15.0f;
    const float id = d ? 1.0f / d : 0.0f;
    y[i].d = servd_f32_to_f16(d);
    y[i].m = servd_f32_to_f16(min);
    for (int j = 0; j < SERVD_QK / 2; j++) {
      const int8_t a = (int8_t)to_int((x[j] - min) * id + 0.5f);
      const int8_t b = (int8_t)to_int((x[j + SERVD_QK / 2] - min) * id + 0.5f);
      const uint8_t qa = (uint8_t)(a < 15 ? a : 15), qb = (uint8_t)(b < 15 ? b : 15);
      y[i].qs[j] = (uint8_t)(qa | (qb << 4));
    }
  }
}

static int check_row(const char *op, servd_dtype t, const void *a, const void *b, int64_t n) {
  if ((unsigned)t >= SERVD_DTYPE_COUNT)
    return servd_fail(SERVD_EINVAL, "%s: invalid dtype %d", op, (int)t);
  if (n < 0 || n % (int64_t)servd_dtype_block_elems(t) != 0)
    return servd_fail(SERVD_EINVAL, "%s: %lld elements is not a whole number of %s blocks", op, (long long)n,
                      servd_dtype_name(t));
  if (n > 0 && (!a || !b)) return servd_fail(SERVD_EINVAL, "%s: NULL buffer", op);
  return 0;
}

int servd_row_to_f32(servd_dtype t, const void *src, float *dst, int64_t n) {
  int rc = check_row("row_to_f32", t, src, dst, n);
  if (rc) return rc;
  const int64_t nb = n / SERVD_QK;
  switch (t) {
  case SERVD_F32: memmove(dst, src, (size_t)n * 4); break;
  case SERVD_F16:
    for (int64_t i = 0; i < n; i++) dst[i] = servd_f16_to_f32(((const uint16_t *)src)[i]);
    break;
  case SERVD_BF16:
    for (int64_t i = 0; i < n; i++) dst[i] = servd_bf16_to_f32(((const uint16_t *)src)[i]);
    break;
  case SERVD_I32:
    for (int64_t i = 0; i < n; i++) dst[i] = (float)((const int32_t *)src)[i];
    break;
  case SERVD_Q8_0:
    for (int64_t i = 0; i < nb; i++) {
      const servd_block_q8_0 *b = (const servd_block_q8_0 *)src + i;
      const float d = servd_f16_to_f32(b->d);
      for (int j = 0; j < SERVD_QK; j++) dst[i * SERVD_QK + j] = d * (float)b->qs[j];
    }
    break;
  case SERVD_Q4_0:
    for (int64_t i = 0; i < nb; i++) {
      const servd_block_q4_0 *b = (const servd_block_q4_0 *)src + i;
      const float d = servd_f16_to_f32(b->d);
      for (int j = 0; j < SERVD_QK / 2; j++) {
        dst[i * SERVD_QK + j] = d * (float)((b->qs[j] & 0x0f) - 8);
        dst[i * SERVD_QK + j + SERVD_QK / 2] = d * (float)((b->qs[j] >> 4) - 8);
      }
    }
    break;
  case SERVD_Q4_1:
    for (int64_t i = 0; i < nb; i++) {
      const servd_block_q4_1 *b = (const servd_block_q4_1 *)src + i;
      const float d = servd_f16_to_f32(b->d), m = servd_f16_to_f32(b->m);
      for (int j = 0; j < SERVD_QK / 2; j++) {
        dst[i * SERVD_QK + j] = d * (float)(b->qs[j] & 0x0f) + m;
        dst[i * SERVD_QK + j + SERVD_QK / 2] = d * (float)(b->qs[j] >> 4) + m;
      }
    }
    break;
  default: return servd_fail(SERVD_EINVAL, "row_to_f32: invalid dtype %d", (int)t);
  }
  return 0;
}

int servd_row_from_f32(servd_dtype t, const float *src, void *dst, int64_t n) {
  int rc = check_row("row_from_f32", t, src, dst, n);
  if (rc) return rc;
  const int64_t nb = n / SERVD_QK;
  switch (t) {
  case SERVD_F32: memmove(dst, src, (size_t)n * 4); break;
  case SERVD_F16:
    for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = servd_f32_to_f16(src[i]);
    break;
  case SERVD_BF16:
    for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = servd_f32_to_bf16(src[i]);
    break;
  case SERVD_I32:
    for (int64_t i = 0; i < n; i++) {
      float v = rintf(src[i]);
      if (!(v >= -2147483648.0f && v < 2147483648.0f))
        return servd_fail(SERVD_ERANGE, "row_from_f32: element %lld (%g) does not fit i32", (long long)i,
                          (double)src[i]);
      ((int32_t *)dst)[i] = (int32_t)v;
    }
    break;
  case SERVD_Q8_0: quantize_q8_0(src, dst, nb); break;
  case SERVD_Q4_0: quantize_q4_0(src, dst, nb); break;
  case SERVD_Q4_1: quantize_q4_1(src, dst, nb); break;
  default: return servd_fail(SERVD_EINVAL, "row_from_f32: invalid dtype %d", (int)t);
  }
  return 0;
}
