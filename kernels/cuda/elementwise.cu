#include "elementwise.cuh"

#define BF(p) reinterpret_cast<__nv_bfloat16 *>(p)
#define CBF(p) reinterpret_cast<const __nv_bfloat16 *>(p)

extern "C" int servd_cuda_swiglu(servd_cuda_ctx *c, servd_bf16_t *out, const servd_bf16_t *gate, const servd_bf16_t *up,
                                 int64_t n) {
  if (n <= 0) return n == 0 ? SERVD_OK : servd_fail(SERVD_EINVAL, "cuda swiglu: n=%lld", (long long)n);
  SERVD_CUDA_DEVICE_SCOPE(c);
  swiglu_kernel<<<servd__div_up(n, 256), 256, 0, servd__stream(c)>>>(BF(out), CBF(gate), CBF(up), n);
  SERVD_CUDA_LAUNCH_CHECK();
  return SERVD_OK;
}

extern "C" int servd_cuda_add(servd_cuda_ctx *c, servd_bf16_t *out, const servd_bf16_t *a, const servd_bf16_t *b,
                              int64_t n) {
  if (n <= 0) return n == 0 ? SERVD_OK : servd_fail(SERVD_EINVAL, "cuda add: n=%lld", (long long)n);
  SERVD_CUDA_DEVICE_SCOPE(c);
  add_kernel<<<servd__div_up(n, 256), 256, 0, servd__stream(c)>>>(BF(out), CBF(a), CBF(b), n);
  SERVD_CUDA_LAUNCH_CHECK();
  return SERVD_OK;
}

extern "C" int servd_cuda_fill_random_bf16(servd_cuda_ctx *c, servd_bf16_t *x, size_t n, uint64_t seed, float scale) {
  if (n == 0) return SERVD_OK;
  SERVD_CUDA_DEVICE_SCOPE(c);
  fill_random_kernel<<<servd__div_up((long long)n, 256), 256, 0, servd__stream(c)>>>(BF(x), (long long)n, seed, scale);
  SERVD_CUDA_LAUNCH_CHECK();
  return SERVD_OK;
}

extern "C" int servd_cuda_f32_to_bf16(servd_cuda_ctx *c, servd_bf16_t *dst, const float *src, size_t n) {
  if (n == 0) return SERVD_OK;
  SERVD_CUDA_DEVICE_SCOPE(c);
  f32_to_bf16_kernel<<<servd__div_up((long long)n, 256), 256, 0, servd__stream(c)>>>(BF(dst), src, (long long)n);
  SERVD_CUDA_LAUNCH_CHECK();
  return SERVD_OK;
}

extern "C" int servd_cuda_bf16_to_f32(servd_cuda_ctx *c, float *dst, const servd_bf16_t *src, size_t n) {
  if (n == 0) return SERVD_OK;
  SERVD_CUDA_DEVICE_SCOPE(c);
  bf16_to_f32_kernel<<<servd__div_up((long long)n, 256), 256, 0, servd__stream(c)>>>(dst, CBF(src), (long long)n);
  SERVD_CUDA_LAUNCH_CHECK();
  return SERVD_OK;
}
