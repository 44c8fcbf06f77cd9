#include "sampling.cuh"

// Every index returned is in [0, n), also for rows of -inf or NaN (the order is in sampling.cuh).

extern "C" int servd_cuda_argmax(servd_cuda_ctx *c, int32_t *out, const float *logits, int m, int n) {
  if (m < 0 || n <= 0) return servd_fail(SERVD_EINVAL, "cuda argmax: bad shape (%d,%d)", m, n);
  if (m == 0) return SERVD_OK;
  SERVD_CUDA_DEVICE_SCOPE(c);
  argmax_kernel<<<m, 1024, 0, servd__stream(c)>>>(out, logits, n);
  SERVD_CUDA_LAUNCH_CHECK();
  return SERVD_OK;
}

extern "C" int servd_cuda_topk(servd_cuda_ctx *c, float *values, int32_t *indices, const float *logits, int m, int n,
                               int k) {
  if (m < 0 || n <= 0 || k <= 0 || k > 64 || k > n)
    return servd_fail(SERVD_EINVAL, "cuda topk: bad shape (%d,%d) k=%d (1..min(64,n))", m, n, k);
  if (m == 0) return SERVD_OK;
  SERVD_CUDA_DEVICE_SCOPE(c);
  topk_kernel<<<m, 1024, 0, servd__stream(c)>>>(values, indices, logits, n, k);
  SERVD_CUDA_LAUNCH_CHECK();
  return SERVD_OK;
}

extern "C" int servd_cuda_sample(servd_cuda_ctx *c, int32_t *out, const float *logits, int m, int n, float temperature,
                                 const uint64_t *seeds, uint64_t step) {
  if (m < 0 || n <= 0) return servd_fail(SERVD_EINVAL, "cuda sample: bad shape (%d,%d)", m, n);
  if (m == 0) return SERVD_OK;
  if (!(temperature > 0.f)) return servd_cuda_argmax(c, out, logits, m, n);
  SERVD_CUDA_DEVICE_SCOPE(c);
  sample_kernel<<<m, 1024, 0, servd__stream(c)>>>(out, logits, n, 1.0f / temperature, seeds, step);
  SERVD_CUDA_LAUNCH_CHECK();
  return SERVD_OK;
}
