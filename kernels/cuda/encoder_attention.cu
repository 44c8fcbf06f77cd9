// encoder_attention: bidirectional attention within packed sequences, f32, contiguous on the
// context's device. One thread per (query row, head) with an online softmax over its sequence's keys
// (BERT-family sequences are at most a few hundred tokens and head_dim at most 128 here). The scalar
// reference is kernels/src/encoder_attention.c.
#include "cuda_common.cuh"

__global__ void encoder_attention_kernel(float *out, const float *q, const float *k, const float *v, const int *offsets,
                                         int n_seqs, long long t, int heads, int hd, float scale) {
  const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= t * heads) return;
  const long long r = idx / heads;
  const int h = (int)(idx % heads);
  int lo = 0, hi = n_seqs; // the sequence s with offsets[s] <= r < offsets[s+1]
  while (hi - lo > 1) {
    int mid = (lo + hi) / 2;
    if (offsets[mid] <= r) lo = mid;
    else hi = mid;
  }
  const long long row = (long long)heads * hd;
  const float *qr = q + r * row + (long long)h * hd;
  float acc[128];
  for (int d = 0; d < hd; d++) acc[d] = 0;
  float mx = -INFINITY, sum = 0;
  for (int j = offsets[lo]; j < offsets[lo + 1]; j++) {
    const float *kj = k + (long long)j * row + (long long)h * hd, *vj = v + (long long)j * row + (long long)h * hd;
    float s = 0;
    for (int d = 0; d < hd; d++) s += qr[d] * kj[d];
    s *= scale;
    const float m = fmaxf(mx, s), corr = __expf(mx - m), p = __expf(s - m);
    sum = sum * corr + p;
    for (int d = 0; d < hd; d++) acc[d] = acc[d] * corr + p * vj[d];
    mx = m;
  }
  float *o = out + r * row + (long long)h * hd;
  for (int d = 0; d < hd; d++) o[d] = acc[d] / sum;
}

// Called by servd_device_encoder_attention after the checks (servd__check_encoder_attention, one
// device, contiguous).
extern "C" int servd_cuda_encoder_attention(servd_cuda_ctx *c, servd_tensor *out, const servd_tensor *q,
                                            const servd_tensor *k, const servd_tensor *v, const servd_tensor *offsets) {
  const long long t = q->shape[0];
  const int heads = (int)q->shape[1], hd = (int)q->shape[2], n_seqs = (int)offsets->shape[0] - 1;
  if (hd > 128) return servd_fail(SERVD_EUNSUPPORTED, "cuda encoder_attention: head_dim %d over 128", hd);
  if (t == 0 || n_seqs < 1) return SERVD_OK;
  SERVD_CUDA_DEVICE_SCOPE(c);
  const int threads = 128;
  const long long grid = (t * heads + threads - 1) / threads;
  if (grid > 0x7fffffffLL) return servd_fail(SERVD_ERANGE, "cuda encoder_attention: %lld rows", t);
  encoder_attention_kernel<<<(unsigned)grid, threads, 0, servd__stream(c)>>>(
      (float *)servd_tensor_data(out), (const float *)servd_tensor_data(q), (const float *)servd_tensor_data(k),
      (const float *)servd_tensor_data(v), (const int *)servd_tensor_data(offsets), n_seqs, t, heads, hd,
      1.0f / sqrtf((float)hd));
  SERVD_CUDA_LAUNCH_CHECK();
  return SERVD_OK;
}
