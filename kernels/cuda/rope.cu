#include "rope.cuh"

extern "C" int servd_cuda_rope(servd_cuda_ctx *c, servd_bf16_t *x, const int32_t *positions, int m, int n_heads,
                               const servd_rope_params *p) {
  if (m < 0 || n_heads <= 0 || p->head_dim <= 0 || p->head_dim % 2)
    return servd_fail(SERVD_EINVAL, "cuda rope: bad shape m=%d heads=%d head_dim=%d", m, n_heads, p->head_dim);
  if (m == 0) return SERVD_OK;
  rope_args a = {(int)p->layout, p->head_dim, p->theta, p->scaling_factor, p->low_freq_factor, p->high_freq_factor,
                 p->original_max_positions};
  long long total = (long long)m * n_heads * (p->head_dim / 2);
  rope_kernel<<<servd__div_up(total, 256), 256, 0, servd__stream(c)>>>(reinterpret_cast<__nv_bfloat16 *>(x),
                                                                       positions, m, n_heads, a);
  SERVD_CUDA_LAUNCH_CHECK();
  return SERVD_OK;
}
