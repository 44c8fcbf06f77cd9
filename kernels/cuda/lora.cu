// lora: out (m,n) += scale * (x (m,k) @ A^T) @ B^T with ab (r, k+n) = [A_j | B column j] per row j;
// out, x bf16 (device activations) or f32, ab f32 or f16, computed in f32; contiguous on the
// context's device. One block per row of x: its warps compute the r dot products of x·A into shared
// memory, then every thread adds its columns of ·B. The scalar reference is kernels/src/lora.c.
#include <cuda_fp16.h>

#include "cuda_common.cuh"

template <typename T> __device__ __forceinline__ float ld(const T *p, long long i);
template <> __device__ __forceinline__ float ld(const float *p, long long i) { return p[i]; }
template <> __device__ __forceinline__ float ld(const __nv_bfloat16 *p, long long i) { return __bfloat162float(p[i]); }
template <> __device__ __forceinline__ float ld(const __half *p, long long i) { return __half2float(p[i]); }
__device__ __forceinline__ void st(float *p, long long i, float v) { p[i] = v; }
__device__ __forceinline__ void st(__nv_bfloat16 *p, long long i, float v) { p[i] = __float2bfloat16(v); }

template <typename T, typename W>
__global__ void lora_kernel(T *out, const T *x, const W *ab, int k, int n, int r, float scale) {
  __shared__ float t[64];
  const long long row = blockIdx.x;
  const T *xr = x + row * k;
  T *orow = out + row * n;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const long long ldab = (long long)k + n;
  for (int j = warp; j < r; j += warps) {
    float s = 0.0f;
    for (int i = lane; i < k; i += 32) s = fmaf(ld(xr, i), ld(ab, j * ldab + i), s);
    s = warp_sum(s);
    if (lane == 0) t[j] = scale * s;
  }
  __syncthreads();
  for (int c = threadIdx.x; c < n; c += blockDim.x) {
    float acc = ld(orow, c);
    for (int j = 0; j < r; j++) acc = fmaf(t[j], ld(ab, j * ldab + k + c), acc);
    st(orow, c, acc);
  }
}

template <typename T>
static void launch(servd_cuda_ctx *c, servd_tensor *out, const servd_tensor *x, const servd_tensor *ab, float scale,
                   unsigned rows, int k, int n, int r) {
  T *o = (T *)servd_tensor_data(out);
  const T *xi = (const T *)servd_tensor_data(x);
  if (ab->dtype == SERVD_F16)
    lora_kernel<<<rows, 256, 0, servd__stream(c)>>>(o, xi, (const __half *)servd_tensor_data(ab), k, n, r, scale);
  else lora_kernel<<<rows, 256, 0, servd__stream(c)>>>(o, xi, (const float *)servd_tensor_data(ab), k, n, r, scale);
}

// Called by servd_device_lora after the checks (servd__check_lora, one device, contiguous).
extern "C" int servd_cuda_lora(servd_cuda_ctx *c, servd_tensor *out, const servd_tensor *x, const servd_tensor *ab,
                               float scale) {
  const long long m = out->shape[0];
  const int n = (int)out->shape[1], k = (int)x->shape[1], r = (int)ab->shape[0];
  if (m == 0 || n == 0) return SERVD_OK;
  if (m > 0x7fffffffLL) return servd_fail(SERVD_ERANGE, "cuda lora: %lld rows", m);
  SERVD_CUDA_DEVICE_SCOPE(c);
  if (out->dtype == SERVD_BF16) launch<__nv_bfloat16>(c, out, x, ab, scale, (unsigned)m, k, n, r);
  else launch<float>(c, out, x, ab, scale, (unsigned)m, k, n, r);
  SERVD_CUDA_LAUNCH_CHECK();
  return SERVD_OK;
}
