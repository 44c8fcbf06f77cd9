#include "embedding.cuh"

// Out-of-range ids give zero rows on the device (never a read out of bounds); callers validate ids
// on the host before upload, so no flag readback stalls the stream.
extern "C" int servd_cuda_embedding(servd_cuda_ctx *c, servd_bf16_t *out, const servd_bf16_t *table, const int32_t *ids,
                                    int m, int d, int64_t vocab) {
  if (m < 0 || d <= 0 || vocab <= 0)
    return servd_fail(SERVD_EINVAL, "cuda embedding: bad shape m=%d d=%d vocab=%lld", m, d, (long long)vocab);
  if (m == 0) return SERVD_OK;
  SERVD_CUDA_DEVICE_SCOPE(c);
  embedding_kernel<<<m, 128, 0, servd__stream(c)>>>(reinterpret_cast<__nv_bfloat16 *>(out),
                                                    reinterpret_cast<const __nv_bfloat16 *>(table), ids, d,
                                                    (long long)vocab, 0ll);
  SERVD_CUDA_LAUNCH_CHECK();
  return SERVD_OK;
}

extern "C" int servd_cuda_embedding_rows(servd_cuda_ctx *c, servd_bf16_t *out, const servd_bf16_t *table,
                                         const int32_t *ids, int m, int d, int64_t rows, int64_t row_offset) {
  if (m < 0 || d <= 0 || rows <= 0)
    return servd_fail(SERVD_EINVAL, "cuda embedding: bad shape m=%d d=%d rows=%lld", m, d, (long long)rows);
  if (m == 0) return SERVD_OK;
  SERVD_CUDA_DEVICE_SCOPE(c);
  embedding_kernel<<<m, 128, 0, servd__stream(c)>>>(reinterpret_cast<__nv_bfloat16 *>(out),
                                                    reinterpret_cast<const __nv_bfloat16 *>(table), ids, d,
                                                    (long long)rows, (long long)row_offset);
  SERVD_CUDA_LAUNCH_CHECK();
  return SERVD_OK;
}
