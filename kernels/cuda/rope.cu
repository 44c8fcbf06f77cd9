#include "rope.cuh"

#include <string.h>

extern "C" int servd_cuda_rope(servd_cuda_ctx *c, servd_bf16_t *x, const int32_t *positions, int m, int n_heads,
                               const servd_rope_params *p) {
  if (m < 0 || n_heads <= 0 || p->head_dim <= 0 || p->head_dim % 2)
    return servd_fail(SERVD_EINVAL, "cuda rope: bad shape m=%d heads=%d head_dim=%d", m, n_heads, p->head_dim);
  if (m == 0) return SERVD_OK;
  if (p->inv_freq && p->head_dim > 2 * SERVD_ROPE_TABLE_MAX)
    return servd_fail(SERVD_EINVAL, "cuda rope: head_dim %d: at most %d with an inverse-frequency table", p->head_dim,
                      2 * SERVD_ROPE_TABLE_MAX);
  rope_args a = {};
  a.layout = (int)p->layout, a.head_dim = p->head_dim, a.theta = p->theta, a.factor = p->scaling_factor;
  a.low_freq_factor = p->low_freq_factor, a.high_freq_factor = p->high_freq_factor;
  a.original_max_positions = p->original_max_positions;
  a.attn = p->attn_factor > 0.0f ? p->attn_factor : 1.0f;
  if (p->inv_freq) { /* copied into the launch: the caller's table need not outlive it */
    a.has_table = 1;
    memcpy(a.inv, p->inv_freq, sizeof(float) * (size_t)(p->head_dim / 2));
    if (p->inv_freq_long) {
      a.has_long = 1, a.long_from = p->long_from;
      memcpy(a.inv_long, p->inv_freq_long, sizeof(float) * (size_t)(p->head_dim / 2));
    }
  }
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
