/* Dequantization of ggml block types to f32, following ggml's reference (ggml-quants.c). Used only
 * at pack time, for GGUF types servd does not run natively (Q5_0 Q5_1 Q4_K Q5_K Q6_K). */
#include "mpk-impl.h"
#include "mpk/gguf.h"
#include "servd/tensor.h"

#define QK_K 256

static float h2f(const uint8_t *p) { return servd_f16_to_f32(rd16(p)); }

static void q5_0(const uint8_t *b, float *y, int64_t nb) {
  for (int64_t i = 0; i < nb; i++, b += 22, y += 32) { /* d, qh[4], qs[16] */
    float d = h2f(b);
    uint32_t qh = rd32(b + 2);
    const uint8_t *qs = b + 6;
    for (int j = 0; j < 16; j++) {
      uint8_t xh0 = (uint8_t)(((qh >> (j + 0)) << 4) & 0x10), xh1 = (uint8_t)((qh >> (j + 12)) & 0x10);
      int x0 = ((qs[j] & 0x0F) | xh0) - 16, x1 = ((qs[j] >> 4) | xh1) - 16;
      y[j] = (float)x0 * d;
      y[j + 16] = (float)x1 * d;
    }
  }
}

static void q5_1(const uint8_t *b, float *y, int64_t nb) {
  for (int64_t i = 0; i < nb; i++, b += 24, y += 32) { /* d, m, qh[4], qs[16] */
    float d = h2f(b), m = h2f(b + 2);
    uint32_t qh = rd32(b + 4);
    const uint8_t *qs = b + 8;
    for (int j = 0; j < 16; j++) {
      uint8_t xh0 = (uint8_t)(((qh >> (j + 0)) << 4) & 0x10), xh1 = (uint8_t)((qh >> (j + 12)) & 0x10);
      int x0 = (qs[j] & 0x0F) | xh0, x1 = (qs[j] >> 4) | xh1;
      y[j] = (float)x0 * d + m;
      y[j + 16] = (float)x1 * d + m;
    }
  }
}

static void scale_min_k4(int j, const uint8_t *q, uint8_t *d, uint8_t *m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *m = (uint8_t)((q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4));
  }
}

static void q4_k(const uint8_t *b, float *y, int64_t nb) {
  for (int64_t i = 0; i < nb; i++, b += 144) { /* d, dmin, scales[12], qs[128] */
    float d = h2f(b), min = h2f(b + 2);
    const uint8_t *scales = b + 4, *q = b + 16;
    int is = 0;
    for (int j = 0; j < QK_K; j += 64) {
      uint8_t sc, m;
      scale_min_k4(is + 0, scales, &sc, &m);
      float d1 = d * sc, m1 = min * m;
      scale_min_k4(is + 1, scales, &sc, &m);
      float d2 = d * sc, m2 = min * m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * (float)(q[l] & 0xF) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * (float)(q[l] >> 4) - m2;
      q += 32;
      is += 2;
    }
  }
}

static void q5_k(const uint8_t *b, float *y, int64_t nb) {
  for (int64_t i = 0; i < nb; i++, b += 176) { /* d, dmin, scales[12], qh[32], qs[128] */
    float d = h2f(b), min = h2f(b + 2);
    const uint8_t *scales = b + 4, *qh = b + 16, *ql = b + 48;
    int is = 0;
    uint8_t u1 = 1, u2 = 2;
    for (int j = 0; j < QK_K; j += 64) {
      uint8_t sc, m;
      scale_min_k4(is + 0, scales, &sc, &m);
      float d1 = d * sc, m1 = min * m;
      scale_min_k4(is + 1, scales, &sc, &m);
      float d2 = d * sc, m2 = min * m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * (float)((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * (float)((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
      ql += 32;
      is += 2;
      u1 = (uint8_t)(u1 << 2);
      u2 = (uint8_t)(u2 << 2);
    }
  }
}

static void q6_k(const uint8_t *b, float *y, int64_t nb) {
  for (int64_t i = 0; i < nb; i++, b += 210) { /* ql[128], qh[64], scales[16] (int8), d */
    float d = h2f(b + 208);
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    for (int n = 0; n < QK_K; n += 128) {
      for (int l = 0; l < 32; ++l) {
        int is = l / 16;
        int q1 = (int8_t)((ql[l + 0] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        int q2 = (int8_t)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        int q3 = (int8_t)((ql[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        int q4 = (int8_t)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l + 0] = d * sc[is + 0] * q1;
        y[l + 32] = d * sc[is + 2] * q2;
        y[l + 64] = d * sc[is + 4] * q3;
        y[l + 96] = d * sc[is + 6] * q4;
      }
      y += 128;
      ql += 64;
      qh += 32;
      sc += 8;
    }
  }
}

int mpk_ggml_row_to_f32(uint32_t type, const void *src, float *dst, int64_t n) {
  const uint8_t *s = src;
  switch (type) {
  case MPK_GGML_F32: memcpy(dst, src, (size_t)n * 4); return 0;
  case MPK_GGML_F16: for (int64_t i = 0; i < n; i++) dst[i] = h2f(s + 2 * i); return 0;
  case MPK_GGML_BF16: for (int64_t i = 0; i < n; i++) dst[i] = servd_bf16_to_f32(rd16(s + 2 * i)); return 0;
  case MPK_GGML_Q4_0: return servd_row_to_f32(SERVD_Q4_0, src, dst, n);
  case MPK_GGML_Q4_1: return servd_row_to_f32(SERVD_Q4_1, src, dst, n);
  case MPK_GGML_Q8_0: return servd_row_to_f32(SERVD_Q8_0, src, dst, n);
  default: break;
  }
  int64_t blk = (type == MPK_GGML_Q5_0 || type == MPK_GGML_Q5_1) ? 32 : QK_K;
  if (n % blk) return servd_fail(SERVD_EINVAL, "dequantize %s: %lld elements, expected a multiple of %lld",
                                 mpk_ggml_type_name(type) ? mpk_ggml_type_name(type) : "?", (long long)n, (long long)blk);
  switch (type) {
  case MPK_GGML_Q5_0: q5_0(s, dst, n / 32); return 0;
  case MPK_GGML_Q5_1: q5_1(s, dst, n / 32); return 0;
  case MPK_GGML_Q4_K: q4_k(s, dst, n / QK_K); return 0;
  case MPK_GGML_Q5_K: q5_k(s, dst, n / QK_K); return 0;
  case MPK_GGML_Q6_K: q6_k(s, dst, n / QK_K); return 0;
  default:
    return servd_fail(SERVD_EUNSUPPORTED, "dequantize: ggml type %s (%u) is not supported",
                      mpk_ggml_type_name(type) ? mpk_ggml_type_name(type) : "unknown", type);
  }
}
