// layernorm: out = (x - mean) / sqrt(var + eps) * weight + bias per row, f32, contiguous on the
// context's device; one block of 256 threads per row, sums reduced in shared memory. The scalar
// reference is kernels/src/layernorm.c.
#include "cuda_common.cuh"

__device__ float block_sum(float v, float *sh) {
  sh[threadIdx.x] = v;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if ((int)threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];
    __syncthreads();
  }
  float r = sh[0];
  __syncthreads();
  return r;
}

__global__ void layernorm_kernel(float *out, const float *x, const float *w, const float *b, long long cols,
                                 float eps) {
  __shared__ float sh[256];
  const float *xr = x + blockIdx.x * cols;
  float *orow = out + blockIdx.x * cols;
  float s = 0;
  for (long long i = threadIdx.x; i < cols; i += blockDim.x) s += xr[i];
  const float mean = block_sum(s, sh) / (float)cols;
  float ss = 0;
  for (long long i = threadIdx.x; i < cols; i += blockDim.x) ss += (xr[i] - mean) * (xr[i] - mean);
  const float inv = rsqrtf(block_sum(ss, sh) / (float)cols + eps);
  for (long long i = threadIdx.x; i < cols; i += blockDim.x) orow[i] = (xr[i] - mean) * inv * w[i] + b[i];
}

// Called by servd_device_layernorm after the checks (servd__check_layernorm, one device, contiguous).
extern "C" int servd_cuda_layernorm(servd_cuda_ctx *c, servd_tensor *out, const servd_tensor *x,
                                    const servd_tensor *weight, const servd_tensor *bias, float eps) {
  const long long cols = out->shape[out->ndim - 1], rows = (long long)servd_tensor_numel(out) / (cols ? cols : 1);
  if (rows == 0 || cols == 0) return SERVD_OK;
  if (rows > 0x7fffffffLL) return servd_fail(SERVD_ERANGE, "cuda layernorm: %lld rows", rows);
  SERVD_CUDA_DEVICE_SCOPE(c);
  layernorm_kernel<<<(unsigned)rows, 256, 0, servd__stream(c)>>>(
      (float *)servd_tensor_data(out), (const float *)servd_tensor_data(x), (const float *)servd_tensor_data(weight),
      (const float *)servd_tensor_data(bias), cols, eps);
  SERVD_CUDA_LAUNCH_CHECK();
  return SERVD_OK;
}
