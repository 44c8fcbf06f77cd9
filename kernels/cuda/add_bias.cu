// add_bias: out = x + b on every row, f32, contiguous on the context's device. The scalar reference
// is kernels/src/add_bias.c.
#include "cuda_common.cuh"

__global__ void add_bias_kernel(float *out, const float *x, const float *b, long long n, long long cols) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = x[i] + b[i % cols];
}

// Called by servd_device_add_bias after the checks (servd__check_add_bias, one device, contiguous).
extern "C" int servd_cuda_add_bias(servd_cuda_ctx *c, servd_tensor *out, const servd_tensor *x, const servd_tensor *b) {
  const long long n = (long long)servd_tensor_numel(out), cols = out->shape[out->ndim - 1];
  if (n == 0) return SERVD_OK;
  SERVD_CUDA_DEVICE_SCOPE(c);
  const int threads = 256;
  const long long grid = (n + threads - 1) / threads;
  if (grid > 0x7fffffffLL) return servd_fail(SERVD_ERANGE, "cuda add_bias: %lld elements", n);
  add_bias_kernel<<<(unsigned)grid, threads, 0, servd__stream(c)>>>((float *)servd_tensor_data(out),
                                                                    (const float *)servd_tensor_data(x),
                                                                    (const float *)servd_tensor_data(b), n, cols);
  SERVD_CUDA_LAUNCH_CHECK();
  return SERVD_OK;
}
