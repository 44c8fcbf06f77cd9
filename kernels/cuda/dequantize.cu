// dequantize: out f32 (m, n) = the values of x (m, n) q8_0 / q4_0 / q4_1 / q5_0 / q5_1 (servd/blocks.h), both
// contiguous on the context's device. One thread per pair of values (a byte of nibbles, or two int8)
// of a block, so a warp reads whole blocks; the scalar reference is kernels/src/dequantize.c.
#include "cuda_common.cuh"

#include <cuda_fp16.h>

// Block sizes of servd/blocks.h (a C header: its static assertions are not C++).
enum { Q8_0_BYTES = 34, Q4_0_BYTES = 18, Q4_1_BYTES = 20, Q5_0_BYTES = 22, Q5_1_BYTES = 24 };

__device__ __forceinline__ float f16_at(const unsigned char *p) {
  return __half2float(__ushort_as_half((unsigned short)(p[0] | (p[1] << 8))));
}

// Thread t of block b handles values j = t and j + 16 of that block (j < 16), for every dtype: the
// nibble pair of one byte (q4; q5 adds bits j and j + 16 of qh as bit 4), or the two int8 at j and
// j + 16 (q8_0).
template <int DTYPE>
__global__ void dequantize_kernel(float *__restrict__ out, const unsigned char *__restrict__ x, long long n_blocks) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  const long long b = i / (SERVD_QK / 2);
  const int j = (int)(i % (SERVD_QK / 2));
  if (b >= n_blocks) return;
  float *y = out + b * SERVD_QK;
  if (DTYPE == SERVD_Q8_0) {
    const unsigned char *blk = x + b * Q8_0_BYTES;
    const float d = f16_at(blk);
    const signed char *qs = (const signed char *)(blk + 2);
    y[j] = d * (float)qs[j];
    y[j + SERVD_QK / 2] = d * (float)qs[j + SERVD_QK / 2];
  } else if (DTYPE == SERVD_Q4_0) {
    const unsigned char *blk = x + b * Q4_0_BYTES;
    const float d = f16_at(blk);
    const unsigned char q = blk[2 + j];
    y[j] = d * (float)((q & 15) - 8);
    y[j + SERVD_QK / 2] = d * (float)((q >> 4) - 8);
  } else if (DTYPE == SERVD_Q5_0 || DTYPE == SERVD_Q5_1) {
    const int hoff = DTYPE == SERVD_Q5_0 ? 2 : 4;
    const unsigned char *blk = x + b * (DTYPE == SERVD_Q5_0 ? Q5_0_BYTES : Q5_1_BYTES);
    const float d = f16_at(blk), m = DTYPE == SERVD_Q5_0 ? 0.0f : f16_at(blk + 2);
    const unsigned int qh = blk[hoff] | blk[hoff + 1] << 8 | blk[hoff + 2] << 16 | (unsigned int)blk[hoff + 3] << 24;
    const unsigned char q = blk[hoff + 4 + j];
    const int q0 = (q & 15) | ((qh >> j) & 1) << 4, q1 = (q >> 4) | ((qh >> (j + 16)) & 1) << 4;
    if (DTYPE == SERVD_Q5_0) { // d * (q - 16), in the reference's order
      y[j] = d * (float)(q0 - 16);
      y[j + SERVD_QK / 2] = d * (float)(q1 - 16);
    } else {
      y[j] = d * (float)q0 + m;
      y[j + SERVD_QK / 2] = d * (float)q1 + m;
    }
  } else {
    const unsigned char *blk = x + b * Q4_1_BYTES;
    const float d = f16_at(blk), m = f16_at(blk + 2);
    const unsigned char q = blk[4 + j];
    y[j] = d * (float)(q & 15) + m;
    y[j + SERVD_QK / 2] = d * (float)(q >> 4) + m;
  }
}

// Called by servd_device_dequantize after the checks (servd__check_dequantize, one device, contiguous).
extern "C" int servd_cuda_dequantize(servd_cuda_ctx *c, servd_tensor *out, const servd_tensor *x) {
  const long long n_blocks = (long long)(servd_tensor_numel(x) / SERVD_QK);
  if (n_blocks == 0) return SERVD_OK;
  SERVD_CUDA_DEVICE_SCOPE(c);
  const int threads = 256;
  const long long grid = (n_blocks * (SERVD_QK / 2) + threads - 1) / threads;
  if (grid > 0x7fffffffLL) return servd_fail(SERVD_ERANGE, "cuda dequantize: %lld blocks", n_blocks);
  float *o = (float *)servd_tensor_data(out);
  const unsigned char *q = (const unsigned char *)servd_tensor_data(x);
  switch (x->dtype) {
  case SERVD_Q8_0:
    dequantize_kernel<SERVD_Q8_0><<<(unsigned)grid, threads, 0, servd__stream(c)>>>(o, q, n_blocks);
    break;
  case SERVD_Q4_0:
    dequantize_kernel<SERVD_Q4_0><<<(unsigned)grid, threads, 0, servd__stream(c)>>>(o, q, n_blocks);
    break;
  case SERVD_Q4_1:
    dequantize_kernel<SERVD_Q4_1><<<(unsigned)grid, threads, 0, servd__stream(c)>>>(o, q, n_blocks);
    break;
  case SERVD_Q5_0:
    dequantize_kernel<SERVD_Q5_0><<<(unsigned)grid, threads, 0, servd__stream(c)>>>(o, q, n_blocks);
    break;
  case SERVD_Q5_1:
    dequantize_kernel<SERVD_Q5_1><<<(unsigned)grid, threads, 0, servd__stream(c)>>>(o, q, n_blocks);
    break;
  default: return servd_fail(SERVD_EINVAL, "cuda dequantize: x is %s", servd_dtype_name(x->dtype));
  }
  SERVD_CUDA_LAUNCH_CHECK();
  return SERVD_OK;
}
