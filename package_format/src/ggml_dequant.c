/* Dequantization of ggml types to f32 at pack time (tensors converted to another dtype). Every block
 * type servd keeps (servd/dtypes.def) decodes through servd_row_to_f32 (ggml's reference arithmetic,
 * tested against gguf-py in tests/kernels/test_matmul_q5.c, test_matmul_k.c and
 * test_matmul_lowbit.c). */
#include "mpk-impl.h"
#include "mpk/gguf.h"
#include "servd/dtype_traits.h"
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
  default: {
    servd_dtype dt; /* the block types: as the dtype that keeps them (servd/dtypes.def) */
    if (servd_dtype_from_ggml(type, &dt) == 0) return servd_row_to_f32(dt, src, dst, n);
    return servd_fail(SERVD_EUNSUPPORTED, "dequantize: ggml type %s (%u) is not supported",
                      mpk_ggml_type_name(type) ? mpk_ggml_type_name(type) : "unknown", type);
  }
  }
}
