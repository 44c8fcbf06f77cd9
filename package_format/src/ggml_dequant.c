/* Dequantization of ggml types to f32 at pack time (tensors converted to another dtype). Every block
 * type servd knows decodes through servd_row_to_f32 (ggml's reference arithmetic, tested against
 * gguf-py in tests/kernels/test_matmul_q5.c, test_matmul_k.c and test_matmul_lowbit.c). */
#include "mpk-impl.h"
#include "mpk/gguf.h"
#include "servd/tensor.h"

static float h2f(const uint8_t *p) { return servd_f16_to_f32(rd16(p)); }

int mpk_ggml_row_to_f32(uint32_t type, const void *src, float *dst, int64_t n) {
  const uint8_t *s = src;
  switch (type) {
  case MPK_GGML_F32: memcpy(dst, src, (size_t)n * 4); return 0;
  case MPK_GGML_F16:
    for (int64_t i = 0; i < n; i++) dst[i] = h2f(s + 2 * i);
    return 0;
  case MPK_GGML_BF16:
    for (int64_t i = 0; i < n; i++) dst[i] = servd_bf16_to_f32(rd16(s + 2 * i));
    return 0;
  case MPK_GGML_Q4_0: return servd_row_to_f32(SERVD_Q4_0, src, dst, n);
  case MPK_GGML_Q4_1: return servd_row_to_f32(SERVD_Q4_1, src, dst, n);
  case MPK_GGML_Q5_0: return servd_row_to_f32(SERVD_Q5_0, src, dst, n);
  case MPK_GGML_Q5_1: return servd_row_to_f32(SERVD_Q5_1, src, dst, n);
  case MPK_GGML_Q8_0: return servd_row_to_f32(SERVD_Q8_0, src, dst, n);
  case MPK_GGML_Q4_K: return servd_row_to_f32(SERVD_Q4_K, src, dst, n);
  case MPK_GGML_Q5_K: return servd_row_to_f32(SERVD_Q5_K, src, dst, n);
  case MPK_GGML_Q6_K: return servd_row_to_f32(SERVD_Q6_K, src, dst, n);
  case MPK_GGML_Q2_K: return servd_row_to_f32(SERVD_Q2_K, src, dst, n);
  case MPK_GGML_Q3_K: return servd_row_to_f32(SERVD_Q3_K, src, dst, n);
  case MPK_GGML_IQ4_NL: return servd_row_to_f32(SERVD_IQ4_NL, src, dst, n);
  case MPK_GGML_IQ4_XS: return servd_row_to_f32(SERVD_IQ4_XS, src, dst, n);
  default:
    return servd_fail(SERVD_EUNSUPPORTED, "dequantize: ggml type %s (%u) is not supported",
                      mpk_ggml_type_name(type) ? mpk_ggml_type_name(type) : "unknown", type);
  }
}
