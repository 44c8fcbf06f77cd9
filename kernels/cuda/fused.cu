// Fused kernels of the decode chain, each computing what its parts compute: the residual add with
// the RMSNorm that follows it (here), and one launch over several weights against the same x
// (gemm.cu: Q, K and V; gate and up). servd_cuda_fused_check runs them against their parts on the
// device; until that passed there, the fused entry points run the parts, so an unverified kernel
// never computes a served token.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_common.cuh"
#include "gemv_choice.h"
#include "rms.cuh"

namespace {
constexpr int MAX_DEVICES = 64;
int fused_ok_flags[MAX_DEVICES];

// x += o (bf16, as add_kernel rounds it); out = x / rms(x) * w (as rmsnorm_kernel computes it: the
// same per-thread sums and block_rms_inv, so the two agree to the bit). One block of 256 per row; each
// thread reads back only the x elements it wrote. out may be o: every o element is read before the
// barrier, and out is written after it.
__global__ void add_rmsnorm_kernel(__nv_bfloat16 *__restrict__ x, const __nv_bfloat16 *o, __nv_bfloat16 *out,
                                   const __nv_bfloat16 *__restrict__ w, int d, float eps) {
  __nv_bfloat16 *xr = x + (size_t)blockIdx.x * d;
  const __nv_bfloat16 *orow = o + (size_t)blockIdx.x * d;
  __nv_bfloat16 *outr = out + (size_t)blockIdx.x * d;
  float ss = 0.f;
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    const __nv_bfloat16 s = __float2bfloat16(__bfloat162float(xr[i]) + __bfloat162float(orow[i]));
    xr[i] = s;
    const float v = __bfloat162float(s);
    ss += v * v;
  }
  const float inv = block_rms_inv(ss, d, eps);
  for (int i = threadIdx.x; i < d; i += blockDim.x)
    outr[i] = __float2bfloat16(__bfloat162float(xr[i]) * inv * __bfloat162float(w[i]));
}

int launch_add_rmsnorm(cudaStream_t s, servd_bf16_t *x, const servd_bf16_t *o, servd_bf16_t *out, const servd_bf16_t *w,
                       int m, int d, float eps) {
  add_rmsnorm_kernel<<<m, 256, 0, s>>>(reinterpret_cast<__nv_bfloat16 *>(x), reinterpret_cast<const __nv_bfloat16 *>(o),
                                       reinterpret_cast<__nv_bfloat16 *>(out),
                                       reinterpret_cast<const __nv_bfloat16 *>(w), d, eps);
  SERVD_CUDA_LAUNCH_CHECK();
  return SERVD_OK;
}
} // namespace

bool servd__fused_ok(int device) {
  return device >= 0 && device < MAX_DEVICES && __atomic_load_n(&fused_ok_flags[device], __ATOMIC_ACQUIRE);
}

extern "C" int servd_cuda_add_rmsnorm(servd_cuda_ctx *c, servd_bf16_t *x, const servd_bf16_t *o, servd_bf16_t *out,
                                      const servd_bf16_t *w, int m, int d, float eps) {
  if (m < 0 || d <= 0) return servd_fail(SERVD_EINVAL, "cuda add_rmsnorm: bad shape (%d,%d)", m, d);
  if (m == 0) return SERVD_OK;
  if (out == x) return servd_fail(SERVD_EINVAL, "cuda add_rmsnorm: out must not be x (x keeps the sum)");
  if (!servd__fused_ok(servd_cuda_ctx_device(c))) { /* the parts */
    int rc = servd_cuda_add(c, x, x, o, (int64_t)m * d);
    return rc ? rc : servd_cuda_rmsnorm(c, out, x, w, m, d, eps);
  }
  SERVD_CUDA_DEVICE_SCOPE(c);
  return launch_add_rmsnorm(servd__stream(c), x, o, out, w, m, d, eps);
}

// ---- the check ------------------------------------------------------------------------------------
namespace {
struct dev_buf {
  void *p = nullptr;
  ~dev_buf() { cudaFree(p); }
};

// Largest |a - b| / (1 + |a|) over n bf16 pairs (host).
float bf16_diff(const uint16_t *a, const uint16_t *b, size_t n) {
  float worst = 0.f;
  for (size_t i = 0; i < n; i++) {
    const float fa = servd_bf16_to_f32(a[i]), fb = servd_bf16_to_f32(b[i]);
    float d = fabsf(fa - fb) / (1.f + fabsf(fa));
    if (!(d <= worst)) worst = isnan(d) ? INFINITY : d;
  }
  return worst;
}

constexpr float TOLERANCE = 1e-2f; /* the kernels are meant to agree to the bit; one bf16 step is 0.4% */

int alloc(dev_buf &b, size_t bytes) {
  SERVD_CUDA_CHECK(cudaMalloc(&b.p, bytes));
  return SERVD_OK;
}

int download(cudaStream_t s, void *host, const void *dev, size_t bytes) {
  SERVD_CUDA_CHECK(cudaStreamSynchronize(s));
  SERVD_CUDA_CHECK(cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost));
  return SERVD_OK;
}

// Fused add + RMSNorm against add_kernel then rmsnorm_kernel: *diff gets the worst difference (x
// must agree to the bit: it is an add either way).
int check_add_rmsnorm(servd_cuda_ctx *c, float *diff) {
  const int m = 5, d = 4160; /* not a multiple of the block: the tail is covered */
  const size_t n = (size_t)m * d, bytes = n * 2;
  cudaStream_t s = servd__stream(c);
  dev_buf x1, x2, o, w, out1, out2;
  int rc;
  if ((rc = alloc(x1, bytes)) || (rc = alloc(x2, bytes)) || (rc = alloc(o, bytes)) || (rc = alloc(w, (size_t)d * 2)) ||
      (rc = alloc(out1, bytes)) || (rc = alloc(out2, bytes)))
    return rc;
  servd_bf16_t *X1 = (servd_bf16_t *)x1.p, *X2 = (servd_bf16_t *)x2.p, *O = (servd_bf16_t *)o.p,
               *W = (servd_bf16_t *)w.p, *OUT1 = (servd_bf16_t *)out1.p, *OUT2 = (servd_bf16_t *)out2.p;
  if ((rc = servd_cuda_fill_random_bf16(c, X1, n, 11, 2.f)) || (rc = servd_cuda_fill_random_bf16(c, O, n, 12, 2.f)) ||
      (rc = servd_cuda_fill_random_bf16(c, W, d, 13, 1.5f)) || (rc = servd_cuda_copy(c, X2, X1, bytes)) ||
      (rc = launch_add_rmsnorm(s, X1, O, OUT1, W, m, d, 1e-5f)) || (rc = servd_cuda_add(c, X2, X2, O, (int64_t)n)) ||
      (rc = servd_cuda_rmsnorm(c, OUT2, X2, W, m, d, 1e-5f)))
    return rc;
  uint16_t *h = (uint16_t *)malloc(4 * bytes);
  if (!h) return servd_fail(SERVD_ENOMEM, "cuda fused check: host buffers");
  if (!(rc = download(s, h, X1, bytes)) && !(rc = download(s, h + n, X2, bytes)) &&
      !(rc = download(s, h + 2 * n, OUT1, bytes)) && !(rc = download(s, h + 3 * n, OUT2, bytes))) {
    float dx = memcmp(h, h + n, bytes) == 0 ? 0.f : INFINITY;
    float dout = bf16_diff(h + 3 * n, h + 2 * n, n);
    *diff = dx > dout ? dx : dout;
  }
  free(h);
  return rc;
}

// One launch over three weights against each weight's own split-kernel launch, for every split
// variant and 1, 3 and 8 rows.
int check_matmul_many(servd_cuda_ctx *c, float *diff) {
  const int k = 1032, ns[3] = {200, 72, 72}, total = 344; /* k/8 = 129 chunks: every tail path */
  cudaStream_t s = servd__stream(c);
  dev_buf x, w[3], a[3], b[3];
  int rc;
  if ((rc = alloc(x, (size_t)8 * k * 2))) return rc;
  for (int i = 0; i < 3; i++)
    if ((rc = alloc(w[i], (size_t)ns[i] * k * 2)) || (rc = alloc(a[i], (size_t)8 * ns[i] * 2)) ||
        (rc = alloc(b[i], (size_t)8 * ns[i] * 2)) ||
        (rc = servd_cuda_fill_random_bf16(c, (servd_bf16_t *)w[i].p, (size_t)ns[i] * k, 21 + i, 1.f)))
      return rc;
  if ((rc = servd_cuda_fill_random_bf16(c, (servd_bf16_t *)x.p, (size_t)8 * k, 20, 1.f))) return rc;
  __nv_bfloat16 *outs[3] = {(__nv_bfloat16 *)a[0].p, (__nv_bfloat16 *)a[1].p, (__nv_bfloat16 *)a[2].p};
  const __nv_bfloat16 *ws[3] = {(const __nv_bfloat16 *)w[0].p, (const __nv_bfloat16 *)w[1].p,
                                (const __nv_bfloat16 *)w[2].p};
  uint16_t *ha = (uint16_t *)malloc((size_t)8 * total * 2 * 2), *hb = ha ? ha + (size_t)8 * total : nullptr;
  if (!ha) return servd_fail(SERVD_ENOMEM, "cuda fused check: host buffers");
  const int rows[3] = {1, 3, 8};
  *diff = 0.f;
  for (int v = SERVD_GEMV_SPLIT1; v < SERVD_GEMV_VARIANTS && !rc; v++)
    for (int r = 0; r < 3 && !rc; r++) {
      const int m = rows[r];
      rc = servd__gemv_many_launch(s, v, 3, outs, (const __nv_bfloat16 *)x.p, ws, ns, m, k);
      for (int i = 0; i < 3 && !rc; i++)
        rc = servd__gemv_launch_bf16(s, v, (__nv_bfloat16 *)b[i].p, (const __nv_bfloat16 *)x.p, ws[i], m, ns[i], k);
      size_t off = 0;
      for (int i = 0; i < 3 && !rc; i++) {
        const size_t cnt = (size_t)m * ns[i];
        if (!(rc = download(s, ha + off, a[i].p, cnt * 2))) rc = download(s, hb + off, b[i].p, cnt * 2);
        off += cnt;
      }
      if (!rc) {
        float dv = bf16_diff(hb, ha, off);
        if (!(dv <= *diff)) *diff = dv;
      }
    }
  free(ha);
  return rc;
}
} // namespace

extern "C" int servd_cuda_fused_check(servd_cuda_ctx *c, char *report, size_t cap) {
  char none[1];
  if (!report || !cap) report = none, cap = sizeof none;
  report[0] = 0;
  const int device = servd_cuda_ctx_device(c);
  if (device < 0 || device >= MAX_DEVICES) return servd_fail(SERVD_EINVAL, "cuda fused check: device %d", device);
  const char *env = getenv("SERVD_FUSED");
  if (env && strcmp(env, "0") == 0) {
    snprintf(report, cap, "off (SERVD_FUSED=0): the parts run");
    return SERVD_OK;
  }
  SERVD_CUDA_DEVICE_SCOPE(c);
  float d_norm = INFINITY, d_many = INFINITY;
  int rc = check_add_rmsnorm(c, &d_norm);
  if (!rc) rc = check_matmul_many(c, &d_many);
  cudaStreamSynchronize(servd__stream(c));
  cudaGetLastError();
  if (rc) return rc;
  const bool ok = d_norm <= TOLERANCE && d_many <= TOLERANCE;
  __atomic_store_n(&fused_ok_flags[device], ok ? 1 : 0, __ATOMIC_RELEASE);
  snprintf(report, cap, "%s: add+rmsnorm differs from its parts by %.2g, matmul of several weights by %.2g%s",
           ok ? "on" : "OFF (the parts run)", d_norm, d_many, ok ? "" : " (above the 1e-2 tolerance)");
  return SERVD_OK;
}
