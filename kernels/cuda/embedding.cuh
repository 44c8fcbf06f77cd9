// out (m,d) = table[ids[i] - row_offset] (zeros outside [0, rows)): one block per token, 16-byte
// copies when d % 8 == 0.
#pragma once
#include "cuda_common.cuh"

__global__ void embedding_kernel(__nv_bfloat16 *__restrict__ out, const __nv_bfloat16 *__restrict__ table,
                                 const int32_t *__restrict__ ids, int d, long long vocab, long long row_offset) {
  const long long id = (long long)ids[blockIdx.x] - row_offset;
  __nv_bfloat16 *dst = out + (size_t)blockIdx.x * d;
  if (id < 0 || id >= vocab) {
    for (int i = threadIdx.x; i < d; i += blockDim.x) dst[i] = __float2bfloat16(0.f);
    return;
  }
  const __nv_bfloat16 *src = table + (size_t)id * d;
  if (d % 8 == 0) {
    const uint4 *s4 = reinterpret_cast<const uint4 *>(src);
    uint4 *d4 = reinterpret_cast<uint4 *>(dst);
    for (int i = threadIdx.x; i < d / 8; i += blockDim.x) d4[i] = s4[i];
  } else {
    for (int i = threadIdx.x; i < d; i += blockDim.x) dst[i] = src[i];
  }
}
