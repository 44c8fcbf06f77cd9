#include "rope.cuh"

extern "C" int servd_cuda_rope(servd_cuda_ctx *c, servd_bf16_t *x, const int32_t *positions, int m, int n_heads,
                               const servd_rope_params *p) {
  if (m < 0 || n_heads <= 0 || p->head_dim <= 0 || p->head_dim % 2)
    return servd_fail(SERVD_EINVAL, "cuda rope: bad shape m=%d heads=%d head_dim=%d", m, n_heads, p->head_dim);
  if (m == 0) return SERVD_OK;
  rope_args a = {(int)p->layout,           p->head_dim,        p->theta,
                 p->scaling_factor,        p->low_freq_factor, p->high_freq_factor,
                 p->original_max_positions};
  const long long pairs = (long long)m * (p->head_dim / 2);
  const dim3 grid(servd__div_up(pairs, 256), servd__div_up(n_heads, SERVD_ROPE_HEADS_PER_THREAD));
  if (pairs > (long long)INT32_MAX * 256 || grid.y > 65535)
    return servd_fail(SERVD_ERANGE, "cuda rope: %d rows x %d heads x head_dim %d is too large for one launch", m,
                      n_heads, p->head_dim);
  SERVD_CUDA_DEVICE_SCOPE(c);
  rope_kernel<<<grid, 256, 0, servd__stream(c)>>>(reinterpret_cast<__nv_bfloat16 *>(x), positions, m, n_heads, a);
  SERVD_CUDA_LAUNCH_CHECK();
  return SERVD_OK;
}
