#include "rmsnorm.cuh"

extern "C" int servd_cuda_rmsnorm(servd_cuda_ctx *c, servd_bf16_t *out, const servd_bf16_t *x, const servd_bf16_t *w,
                                  int m, int d, float eps) {
  if (m < 0 || d <= 0) return servd_fail(SERVD_EINVAL, "cuda rmsnorm: bad shape (%d,%d)", m, d);
  if (m == 0) return SERVD_OK;
  SERVD_CUDA_DEVICE_SCOPE(c);
  rmsnorm_kernel<<<m, 256, 0, servd__stream(c)>>>(reinterpret_cast<__nv_bfloat16 *>(out),
                                                  reinterpret_cast<const __nv_bfloat16 *>(x),
                                                  reinterpret_cast<const __nv_bfloat16 *>(w), d, eps);
  SERVD_CUDA_LAUNCH_CHECK();
  return SERVD_OK;
}
