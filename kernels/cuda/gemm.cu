// Launchers for the bf16 matmul: a GEMV kernel for m <= 8 (the variant chosen for the shape, see
// gemv_choice.h), cuBLAS (tensor cores, f32 compute) for larger batches.
#include <cublas_v2.h>

#include "cuda_common.cuh"
#include "gemv.cuh"
#include "gemv_choice.h"

cublasHandle_t servd__cuda_blas(servd_cuda_ctx *c);

#define BLAS_CHECK(call) \
  do { \
    cublasStatus_t st_ = (call); \
    if (st_ != CUBLAS_STATUS_SUCCESS) \
      return servd_fail(SERVD_EDEVICE, "%s:%d: %s: %s", __FILE__, __LINE__, #call, cublasGetStatusString(st_)); \
  } while (0)

template <typename OutT, int KS>
static void launch_split(cudaStream_t s, OutT *out, const __nv_bfloat16 *x, const __nv_bfloat16 *w, int m, int n,
                         int k) {
  dim3 grid(servd__div_up(n, 8 / KS));
  switch (m) {
#define CASE(M) \
  case M: gemv_bf16_split_kernel<M, OutT, KS><<<grid, 256, 0, s>>>(out, x, w, n, k); break;
    CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8)
#undef CASE
  }
}

template <typename OutT>
static int launch_gemv(cudaStream_t s, int variant, OutT *out, const __nv_bfloat16 *x, const __nv_bfloat16 *w, int m,
                       int n, int k) {
  if (m < 1 || m > 8) return servd_fail(SERVD_EINVAL, "cuda matmul: gemv m=%d outside 1..8", m);
  const int threads = 256, cols_per_block = threads / 32;
  switch (variant) {
  case SERVD_GEMV_WARP: {
    dim3 grid(servd__div_up(n, cols_per_block));
    switch (m) {
#define CASE(M) \
  case M: gemv_bf16_kernel<M, OutT><<<grid, threads, 0, s>>>(out, x, w, n, k); break;
      CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8)
#undef CASE
    }
    break;
  }
  case SERVD_GEMV_SPLIT1: launch_split<OutT, 1>(s, out, x, w, m, n, k); break;
  case SERVD_GEMV_SPLIT2: launch_split<OutT, 2>(s, out, x, w, m, n, k); break;
  case SERVD_GEMV_SPLIT4: launch_split<OutT, 4>(s, out, x, w, m, n, k); break;
  case SERVD_GEMV_SPLIT8: launch_split<OutT, 8>(s, out, x, w, m, n, k); break;
  default: return servd_fail(SERVD_EINVAL, "cuda matmul: gemv variant %d", variant);
  }
  SERVD_CUDA_LAUNCH_CHECK();
  return SERVD_OK;
}

int servd__gemv_launch_f32(cudaStream_t s, int variant, float *out, const __nv_bfloat16 *x, const __nv_bfloat16 *w,
                           int m, int n, int k) {
  return launch_gemv<float>(s, variant, out, x, w, m, n, k);
}

int servd__gemv_launch_bf16(cudaStream_t s, int variant, __nv_bfloat16 *out, const __nv_bfloat16 *x,
                            const __nv_bfloat16 *w, int m, int n, int k) {
  return launch_gemv<__nv_bfloat16>(s, variant, out, x, w, m, n, k);
}

template <int KS>
static void launch_many(cudaStream_t s, const gemv_segments<__nv_bfloat16> &sg, const __nv_bfloat16 *x, int m, int k) {
  dim3 grid(servd__div_up(sg.start[sg.count], 8 / KS));
  switch (m) {
#define CASE(M) \
  case M: gemv_bf16_many_kernel<M, __nv_bfloat16, KS><<<grid, 256, 0, s>>>(sg, x, k); break;
    CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8)
#undef CASE
  }
}

int servd__gemv_many_launch(cudaStream_t s, int variant, int count, __nv_bfloat16 *const *outs, const __nv_bfloat16 *x,
                            const __nv_bfloat16 *const *ws, const int *ns, int m, int k) {
  if (count < 1 || count > SERVD_GEMV_MAX_SEGMENTS || m < 1 || m > 8)
    return servd_fail(SERVD_EINVAL, "cuda matmul_many: %d weights, m=%d (1..%d weights, m 1..8)", count, m,
                      SERVD_GEMV_MAX_SEGMENTS);
  gemv_segments<__nv_bfloat16> sg = {};
  sg.count = count;
  for (int i = 0; i < count; i++) {
    sg.w[i] = ws[i];
    sg.out[i] = outs[i];
    sg.n[i] = ns[i];
    sg.start[i + 1] = sg.start[i] + ns[i];
  }
  if (sg.start[count] == 0) return SERVD_OK;
  switch (variant) { /* the warp-per-column choice runs the split kernel with one warp per column */
  case SERVD_GEMV_WARP:
  case SERVD_GEMV_SPLIT1: launch_many<1>(s, sg, x, m, k); break;
  case SERVD_GEMV_SPLIT2: launch_many<2>(s, sg, x, m, k); break;
  case SERVD_GEMV_SPLIT4: launch_many<4>(s, sg, x, m, k); break;
  case SERVD_GEMV_SPLIT8: launch_many<8>(s, sg, x, m, k); break;
  default: return servd_fail(SERVD_EINVAL, "cuda matmul_many: gemv variant %d", variant);
  }
  SERVD_CUDA_LAUNCH_CHECK();
  return SERVD_OK;
}

template <typename OutT>
static int matmul_any(servd_cuda_ctx *c, OutT *out, const servd_bf16_t *x, const servd_bf16_t *w, int m, int n, int k,
                      cudaDataType_t out_type) {
  if (m < 0 || n < 0 || k < 0)
    return servd_fail(SERVD_EINVAL, "cuda matmul: negative shape x(%d,%d) w(%d,%d)", m, k, n, k);
  if (m == 0 || n == 0) return SERVD_OK;
  if (k % 8 != 0) return servd_fail(SERVD_EINVAL, "cuda matmul: k=%d is not a multiple of 8", k);
  SERVD_CUDA_DEVICE_SCOPE(c);
  const __nv_bfloat16 *xb = reinterpret_cast<const __nv_bfloat16 *>(x);
  const __nv_bfloat16 *wb = reinterpret_cast<const __nv_bfloat16 *>(w);
  if (m <= 8)
    return launch_gemv<OutT>(servd__stream(c), servd__gemv_choice(servd_cuda_ctx_device(c), n, k), out, xb, wb, m, n,
                             k);
  // Row-major out (m,n) = x (m,k) w (n,k)^T is column-major out^T (n,m) = w^T' (n,k) x^T (k,m).
  const float alpha = 1.f, beta = 0.f;
  BLAS_CHECK(cublasGemmEx(servd__cuda_blas(c), CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, wb, CUDA_R_16BF, k, xb,
                          CUDA_R_16BF, k, &beta, out, out_type, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return SERVD_OK;
}

extern "C" int servd_cuda_matmul(servd_cuda_ctx *c, servd_bf16_t *out, const servd_bf16_t *x, const servd_bf16_t *w,
                                 int m, int n, int k) {
  return matmul_any<__nv_bfloat16>(c, reinterpret_cast<__nv_bfloat16 *>(out), x, w, m, n, k, CUDA_R_16BF);
}

extern "C" int servd_cuda_matmul_f32out(servd_cuda_ctx *c, float *out, const servd_bf16_t *x, const servd_bf16_t *w,
                                        int m, int n, int k) {
  return matmul_any<float>(c, out, x, w, m, n, k, CUDA_R_32F);
}

extern "C" int servd_cuda_matmul_many(servd_cuda_ctx *c, int count, servd_bf16_t *const *outs, const servd_bf16_t *x,
                                      const servd_bf16_t *const *ws, const int *ns, int m, int k) {
  if (count < 1 || count > SERVD_GEMV_MAX_SEGMENTS)
    return servd_fail(SERVD_EINVAL, "cuda matmul_many: %d weights (1..%d)", count, SERVD_GEMV_MAX_SEGMENTS);
  int total = 0;
  for (int i = 0; i < count; i++) {
    if (ns[i] < 0 || ns[i] > INT32_MAX - total)
      return servd_fail(SERVD_EINVAL, "cuda matmul_many: weight %d has %d rows", i, ns[i]);
    total += ns[i];
  }
  const int device = servd_cuda_ctx_device(c);
  if (m >= 1 && m <= 8 && k > 0 && k % 8 == 0 && servd__fused_ok(device)) {
    SERVD_CUDA_DEVICE_SCOPE(c);
    return servd__gemv_many_launch(
        servd__stream(c), servd__gemv_choice(device, total, k), count, reinterpret_cast<__nv_bfloat16 *const *>(outs),
        reinterpret_cast<const __nv_bfloat16 *>(x), reinterpret_cast<const __nv_bfloat16 *const *>(ws), ns, m, k);
  }
  for (int i = 0; i < count; i++) { /* the parts: one matmul per weight */
    int rc = servd_cuda_matmul(c, outs[i], x, ws[i], m, ns[i], k);
    if (rc) return rc;
  }
  return SERVD_OK;
}
