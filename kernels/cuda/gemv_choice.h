// The GEMV variants (m <= 8 rows) and which one each weight shape uses (gemv_tune.cu): the
// warp-per-column kernel unless servd_cuda_gemv_tune found, on this device, a faster variant that
// computes the same products.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

enum servd__gemv_variant {
  SERVD_GEMV_WARP = 0, /* gemv_bf16_kernel: one warp per column, two loads in flight per lane */
  SERVD_GEMV_SPLIT1,   /* gemv_bf16_split_kernel, KS = 1, 2, 4, 8 warps per column */
  SERVD_GEMV_SPLIT2,
  SERVD_GEMV_SPLIT4,
  SERVD_GEMV_SPLIT8,
  SERVD_GEMV_VARIANTS
};

int servd__gemv_choice(int device, int n, int k);
const char *servd__gemv_name(int variant);
// Enqueues out (m, n) f32 = x (m, k) w (n, k)^T with the given variant (gemm.cu); 0 or SERVD_E*.
int servd__gemv_launch_f32(cudaStream_t s, int variant, float *out, const __nv_bfloat16 *x, const __nv_bfloat16 *w,
                           int m, int n, int k);
int servd__gemv_launch_bf16(cudaStream_t s, int variant, __nv_bfloat16 *out, const __nv_bfloat16 *x,
                            const __nv_bfloat16 *w, int m, int n, int k);
// One launch over several weights against the same x (gemv_bf16_many_kernel), KS from the variant.
int servd__gemv_many_launch(cudaStream_t s, int variant, int count, __nv_bfloat16 *const *outs, const __nv_bfloat16 *x,
                            const __nv_bfloat16 *const *ws, const int *ns, int m, int k);

// Whether the fused kernels (fused.cu) passed their check on this device: until then the fused entry
// points run their parts.
bool servd__fused_ok(int device);
