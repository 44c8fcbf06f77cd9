// geglu: out = gelu_tanh(gate) * up, element-wise, bf16 (device activations) or f32, computed in f32;
// contiguous on the context's device. The scalar reference is kernels/src/geglu.c.
#include "cuda_common.cuh"

template <typename T> __device__ __forceinline__ float load(const T *p, long long i);
template <> __device__ __forceinline__ float load(const float *p, long long i) { return p[i]; }
template <> __device__ __forceinline__ float load(const __nv_bfloat16 *p, long long i) {
  return __bfloat162float(p[i]);
}
__device__ __forceinline__ void store(float *p, long long i, float v) { p[i] = v; }
__device__ __forceinline__ void store(__nv_bfloat16 *p, long long i, float v) { p[i] = __float2bfloat16(v); }

template <typename T> __global__ void geglu_kernel(T *out, const T *gate, const T *up, long long n) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float x = load(gate, i);
  const float k = 0.7978845608028654f; // sqrt(2/pi)
  store(out, i, 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x))) * load(up, i));
}

// Called by servd_device_geglu after the checks (servd__check_geglu, one device, contiguous).
extern "C" int servd_cuda_geglu(servd_cuda_ctx *c, servd_tensor *out, const servd_tensor *gate,
                                const servd_tensor *up) {
  const long long n = (long long)servd_tensor_numel(out);
  if (n == 0) return SERVD_OK;
  SERVD_CUDA_DEVICE_SCOPE(c);
  const int threads = 256;
  const long long grid = (n + threads - 1) / threads;
  if (grid > 0x7fffffffLL) return servd_fail(SERVD_ERANGE, "cuda geglu: %lld elements", n);
  if (out->dtype == SERVD_BF16)
    geglu_kernel<<<(unsigned)grid, threads, 0, servd__stream(c)>>>((__nv_bfloat16 *)servd_tensor_data(out),
                                                                   (const __nv_bfloat16 *)servd_tensor_data(gate),
                                                                   (const __nv_bfloat16 *)servd_tensor_data(up), n);
  else
    geglu_kernel<<<(unsigned)grid, threads, 0, servd__stream(c)>>>((float *)servd_tensor_data(out),
                                                                   (const float *)servd_tensor_data(gate),
                                                                   (const float *)servd_tensor_data(up), n);
  SERVD_CUDA_LAUNCH_CHECK();
  return SERVD_OK;
}
