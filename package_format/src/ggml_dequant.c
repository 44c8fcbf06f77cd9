/* Dequantization of ggml block types to f32, following ggml's reference (ggml-quants.c). Used only
 * at pack time, for GGUF types servd does not run natively (Q5_0 Q5_1); the k-quants, kept since
 * they run natively, decode through servd_row_to_f32 like the other kept types. */
#include "mpk-impl.h"
#include "mpk/gguf.h"
#include "servd/tensor.h"

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

int mpk_ggml_row_to_f32(uint32_t type, const void *src, float *dst, int64_t n) {
  const uint8_t *s = src;
  switch (type) {
  case MPK_GGML_F32: memcpy(dst, src, (size_t)n * 4); return 0;
  case MPK_GGML_F16: for (int64_t i = 0; i < n; i++) dst[i] = h2f(s + 2 * i); return 0;
  case MPK_GGML_BF16: for (int64_t i = 0; i < n; i++) dst[i] = servd_bf16_to_f32(rd16(s + 2 * i)); return 0;
  case MPK_GGML_Q4_0: return servd_row_to_f32(SERVD_Q4_0, src, dst, n);
  case MPK_GGML_Q4_1: return servd_row_to_f32(SERVD_Q4_1, src, dst, n);
  case MPK_GGML_Q8_0: return servd_row_to_f32(SERVD_Q8_0, src, dst, n);
  case MPK_GGML_Q4_K: return servd_row_to_f32(SERVD_Q4_K, src, dst, n);
  case MPK_GGML_Q5_K: return servd_row_to_f32(SERVD_Q5_K, src, dst, n);
  case MPK_GGML_Q6_K: return servd_row_to_f32(SERVD_Q6_K, src, dst, n);
  default: break;
  }
  if (n % 32) return servd_fail(SERVD_EINVAL, "dequantize %s: %lld elements, expected a multiple of 32",
                                mpk_ggml_type_name(type) ? mpk_ggml_type_name(type) : "?", (long long)n);
  switch (type) {
  case MPK_GGML_Q5_0: q5_0(s, dst, n / 32); return 0;
  case MPK_GGML_Q5_1: q5_1(s, dst, n / 32); return 0;
  default:
    return servd_fail(SERVD_EUNSUPPORTED, "dequantize: ggml type %s (%u) is not supported",
                      mpk_ggml_type_name(type) ? mpk_ggml_type_name(type) : "unknown", type);
  }
}
