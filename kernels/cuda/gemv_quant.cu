// out (m,n) = x (m,k) bf16 @ w^T for w (n,k) kept on the device as its q8_0, q4_k or q6_k blocks.
// Decode (m <= 8): bandwidth is the point, so the GEMV reads the blocks themselves (q4_k: 4.5 bits a
// weight against bf16's 16) and decodes them in registers: one warp per output column, each lane 8
// consecutive values of every 256 (servd_qb_decode8, shared with the CUDA stand-in), the M activation
// rows dotted in f32. Prefill (m > 8): the weight is dequantized to bf16 in the context's scratch and
// multiplied by the bf16 matmul (cuBLAS), whose tensor cores need a dense operand.
#include "cuda_common.cuh"
#include "servd/cuda_blocks.h"

template <int DT, int M, typename OutT>
__global__ void gemv_quant_kernel(OutT *__restrict__ out, const __nv_bfloat16 *__restrict__ x,
                                  const unsigned char *__restrict__ w, long long row_bytes, int n, int k) {
  const int warps = blockDim.x / 32;
  const int col = blockIdx.x * warps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (col >= n) return;
  const unsigned char *wrow = w + (size_t)col * row_bytes;
  float acc[M];
#pragma unroll
  for (int r = 0; r < M; r++) acc[r] = 0.f;
  for (int v0 = lane * 8; v0 < k; v0 += 256) {
    float y[8];
    servd_qb_decode8(DT, wrow, v0, y);
#pragma unroll
    for (int r = 0; r < M; r++) {
      float xa[8];
      bf16x8_to_f32(__ldg(reinterpret_cast<const uint4 *>(x + (size_t)r * k + v0)), xa);
#pragma unroll
      for (int j = 0; j < 8; j++) acc[r] += y[j] * xa[j];
    }
  }
#pragma unroll
  for (int r = 0; r < M; r++) {
    const float v = warp_sum(acc[r]);
    if (lane == 0) {
      if constexpr (sizeof(OutT) == 4) out[(size_t)r * n + col] = v;
      else out[(size_t)r * n + col] = __float2bfloat16(v);
    }
  }
}

// w (n,k) blocks -> out (n,k) bf16: one thread per 8 values.
template <int DT>
__global__ void dequantize_bf16_kernel(__nv_bfloat16 *__restrict__ out, const unsigned char *__restrict__ w,
                                       long long row_bytes, int n, int k) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x, per_row = k / 8;
  if (i >= (long long)n * per_row) return;
  const long long row = i / per_row, v0 = (i % per_row) * 8;
  float y[8];
  servd_qb_decode8(DT, w + row * row_bytes, v0, y);
#pragma unroll
  for (int j = 0; j < 8; j++) out[row * k + v0 + j] = __float2bfloat16(y[j]);
}

template <int DT, typename OutT>
static void launch_gemv(cudaStream_t s, OutT *out, const __nv_bfloat16 *x, const unsigned char *w, long long rb, int m,
                        int n, int k) {
  const int threads = 256;
  const dim3 grid(servd__div_up(n, threads / 32));
  switch (m) {
#define CASE(M) \
  case M: gemv_quant_kernel<DT, M, OutT><<<grid, threads, 0, s>>>(out, x, w, rb, n, k); break;
    CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8)
#undef CASE
  }
}

template <typename OutT>
static int gemv_for(cudaStream_t s, int dtype, OutT *out, const __nv_bfloat16 *x, const unsigned char *w, int m, int n,
                    int k) {
  const long long rb = (long long)servd_qb_row_bytes(dtype, k);
  switch (dtype) {
  case SERVD_Q8_0: launch_gemv<SERVD_Q8_0>(s, out, x, w, rb, m, n, k); break;
  case SERVD_Q4_K: launch_gemv<SERVD_Q4_K>(s, out, x, w, rb, m, n, k); break;
  default: launch_gemv<SERVD_Q6_K>(s, out, x, w, rb, m, n, k); break;
  }
  SERVD_CUDA_LAUNCH_CHECK();
  return SERVD_OK;
}

extern "C" int servd_cuda_matmul_quant(servd_cuda_ctx *c, void *out, int out_f32, const servd_bf16_t *x, const void *w,
                                       int dtype, int m, int n, int k) {
  if (!servd_qb_supported(dtype))
    return servd_fail(SERVD_EINVAL, "cuda matmul: weight dtype %s has no quantized kernel (q8_0, q4_k, q6_k)",
                      servd_dtype_name((servd_dtype)dtype));
  if (m < 0 || n < 0 || k < 0 || k % (int)servd_dtype_block_elems((servd_dtype)dtype))
    return servd_fail(SERVD_EINVAL, "cuda matmul: x (%d,%d), w %s (%d,%d): k must be whole blocks", m, k,
                      servd_dtype_name((servd_dtype)dtype), n, k);
  if (m == 0 || n == 0) return SERVD_OK;
  SERVD_CUDA_DEVICE_SCOPE(c);
  const __nv_bfloat16 *xb = reinterpret_cast<const __nv_bfloat16 *>(x);
  const unsigned char *wq = static_cast<const unsigned char *>(w);
  if (m <= 8)
    return out_f32
               ? gemv_for<float>(servd__stream(c), dtype, static_cast<float *>(out), xb, wq, m, n, k)
               : gemv_for<__nv_bfloat16>(servd__stream(c), dtype, static_cast<__nv_bfloat16 *>(out), xb, wq, m, n, k);
  __nv_bfloat16 *wb = static_cast<__nv_bfloat16 *>(servd__cuda_scratch(c, (size_t)n * k * sizeof(__nv_bfloat16)));
  if (!wb) return servd_fail(SERVD_ENOMEM, "cuda matmul: no scratch for a bf16 copy of a (%d,%d) weight", n, k);
  const long long rb = (long long)servd_qb_row_bytes(dtype, k), items = (long long)n * (k / 8);
  const int threads = 256;
  const long long grid = (items + threads - 1) / threads;
  if (grid > 0x7fffffffLL) return servd_fail(SERVD_ERANGE, "cuda matmul: weight (%d,%d) too large", n, k);
  switch (dtype) {
  case SERVD_Q8_0:
    dequantize_bf16_kernel<SERVD_Q8_0><<<(unsigned)grid, threads, 0, servd__stream(c)>>>(wb, wq, rb, n, k);
    break;
  case SERVD_Q4_K:
    dequantize_bf16_kernel<SERVD_Q4_K><<<(unsigned)grid, threads, 0, servd__stream(c)>>>(wb, wq, rb, n, k);
    break;
  default: dequantize_bf16_kernel<SERVD_Q6_K><<<(unsigned)grid, threads, 0, servd__stream(c)>>>(wb, wq, rb, n, k);
  }
  SERVD_CUDA_LAUNCH_CHECK();
  const servd_bf16_t *wbf = reinterpret_cast<const servd_bf16_t *>(wb);
  return out_f32 ? servd_cuda_matmul_f32out(c, static_cast<float *>(out), x, wbf, m, n, k)
                 : servd_cuda_matmul(c, static_cast<servd_bf16_t *>(out), x, wbf, m, n, k);
}
