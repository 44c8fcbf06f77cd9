// Launchers for the KV write and attention. Decode-only batches (every q_len == 1) take the
// split-K path, which needs no host-side planning and so can be captured in a CUDA graph; batches
// with prefill chunks are planned into tiles on the host.
#include <stdlib.h>
#include <string.h>

#include "attention.cuh"

#define BF(p) reinterpret_cast<__nv_bfloat16 *>(p)
#define CBF(p) reinterpret_cast<const __nv_bfloat16 *>(p)

extern "C" int servd_cuda_kv_write(servd_cuda_ctx *c, servd_bf16_t *k_cache, servd_bf16_t *v_cache,
                                   const servd_bf16_t *k, const servd_bf16_t *v, const int32_t *slots, int t,
                                   int kv_dim, int64_t n_slots) {
  if (t < 0 || kv_dim <= 0 || n_slots <= 0)
    return servd_fail(SERVD_EINVAL, "cuda kv_write: bad shape t=%d kv_dim=%d slots=%lld", t, kv_dim,
                      (long long)n_slots);
  if (t == 0) return SERVD_OK;
  SERVD_CUDA_DEVICE_SCOPE(c);
  long long n = (long long)t * kv_dim;
  kv_write_kernel<<<servd__div_up(n, 256), 256, 0, servd__stream(c)>>>(BF(k_cache), BF(v_cache), CBF(k), CBF(v), slots,
                                                                       t, kv_dim, (long long)n_slots);
  SERVD_CUDA_LAUNCH_CHECK();
  return SERVD_OK;
}

/* Splits per (sequence, head) for a decode launch: enough (sequence, head, split) blocks to cover the
 * GPU SERVD_ATTN_SPLIT_WAVES times, at least 1, at most one per cache block of the longest possible
 * context and at most SERVD_ATTN_MAX_SPLITS. It depends only on the grid shape and the batch's block
 * capacity, never on the real kv_len (unknown to the host when the step is captured in a graph):
 * the kernel divides the real context among the splits on the device. */
static int decode_splits(int n_sms, int n_seqs, int n_heads, int max_blocks) {
  const long long rows = (long long)n_seqs * n_heads;
  long long n = ((long long)SERVD_ATTN_SPLIT_WAVES * n_sms + rows - 1) / rows;
  if (n > max_blocks) n = max_blocks;
  if (n > SERVD_ATTN_MAX_SPLITS) n = SERVD_ATTN_MAX_SPLITS;
  return n < 1 ? 1 : (int)n;
}

/* Grow-only scratch of the context (servd__cuda_scratch): fixed addresses once warmed up, as graph
 * replay needs; growing it bumps the device's generation. The request has a floor of
 * 2 * SERVD_ATTN_SPLIT_WAVES * n_SMs partials, which every grid with n_seqs * n_heads up to that
 * many rows fits (partials = rows * ceil(W / rows) < W + rows), so the graph buckets of a server
 * share one scratch size instead of growing it (and dropping their graphs) bucket by bucket. */
template <int DPL>
static int launch_decode(servd_cuda_ctx *c, servd_bf16_t *out, const servd_bf16_t *q, const servd_bf16_t *kc,
                         const servd_bf16_t *vc, const servd_cuda_attn_batch *b, int n_heads, int group, int block_size,
                         float scale, int window) {
  constexpr int HD = DPL * 32;
  const int n_sms = servd__cuda_sm_count(c);
  const int n_splits = decode_splits(n_sms, b->n_seqs, n_heads, b->max_blocks);
  const size_t parts = (size_t)b->n_seqs * n_heads * n_splits;
  const size_t floor_parts = (size_t)2 * SERVD_ATTN_SPLIT_WAVES * n_sms;
  const size_t reserve = parts > floor_parts ? parts : floor_parts;
  float *ws = (float *)servd__cuda_scratch(c, reserve * (HD + 2) * sizeof(float));
  if (!ws) return SERVD_ENOMEM;
  float *part_acc = ws, *part_ml = ws + parts * HD;
  dim3 grid(b->n_seqs, n_heads, n_splits);
  decode_split_kernel<DPL><<<grid, 128, 0, servd__stream(c)>>>(part_acc, part_ml, CBF(q), CBF(kc), CBF(vc), b->q_start,
                                                               b->kv_len, b->block_tables, b->max_blocks, n_heads,
                                                               group, block_size, scale, window);
  SERVD_CUDA_LAUNCH_CHECK();
  decode_reduce_kernel<<<dim3(b->n_seqs, n_heads), HD, 0, servd__stream(c)>>>(BF(out), part_acc, part_ml, b->q_start,
                                                                              n_heads, n_splits, HD);
  SERVD_CUDA_LAUNCH_CHECK();
  return SERVD_OK;
}

template <int DPL>
static int launch_prefill(servd_cuda_ctx *c, servd_bf16_t *out, const servd_bf16_t *q, const servd_bf16_t *kc,
                          const servd_bf16_t *vc, const servd_cuda_attn_batch *b, int n_heads, int group,
                          int block_size, float scale, int window) {
  constexpr int HD = DPL * 32;
  int n_tiles = 0;
  for (int s = 0; s < b->n_seqs; s++) n_tiles += (int)servd__div_up(b->h_q_len[s], SERVD_ATTN_BQ);
  if (n_tiles == 0) return SERVD_OK;
  int32_t *plan = (int32_t *)malloc(sizeof(int32_t) * 2 * n_tiles);
  if (!plan) return servd_fail(SERVD_ENOMEM, "cuda attention: tile plan");
  int t = 0;
  for (int s = 0; s < b->n_seqs; s++)
    for (int q0 = 0; q0 < b->h_q_len[s]; q0 += SERVD_ATTN_BQ) {
      plan[t] = s;
      plan[n_tiles + t] = q0;
      t++;
    }
  // The plan is rebuilt and uploaded on every call, so once per layer of a prefill step although the
  // layout is the same for every layer: a few hundred bytes per layer, and prefill steps are never
  // captured in graphs; caching it per step would need a step identity this launcher lacks.
  int32_t *dplan = (int32_t *)servd__cuda_scratch(c, sizeof(int32_t) * 2 * n_tiles);
  int rc = dplan ? servd_cuda_upload(c, dplan, plan, sizeof(int32_t) * 2 * n_tiles) : SERVD_ENOMEM;
  // The copy from pageable memory is staged before cudaMemcpyAsync returns, so plan can go.
  free(plan);
  if (rc) return rc;
  const size_t smem = SERVD_ATTN_BQ * HD * sizeof(float) + SERVD_ATTN_BK * (2 * HD + 2) * sizeof(__nv_bfloat16);
  SERVD_CUDA_CHECK(
      cudaFuncSetAttribute(prefill_tile_kernel<DPL>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  prefill_tile_kernel<DPL><<<dim3(n_tiles, n_heads), 128, smem, servd__stream(c)>>>(
      BF(out), CBF(q), CBF(kc), CBF(vc), dplan, dplan + n_tiles, b->q_start, b->q_len, b->kv_len, b->block_tables,
      b->max_blocks, n_heads, group, block_size, scale, window);
  SERVD_CUDA_LAUNCH_CHECK();
  return SERVD_OK;
}

template <int DPL>
static int dispatch(servd_cuda_ctx *c, servd_bf16_t *out, const servd_bf16_t *q, const servd_bf16_t *kc,
                    const servd_bf16_t *vc, const servd_cuda_attn_batch *b, int n_heads, int group, int block_size,
                    float scale, int window) {
  bool decode_only = true;
  for (int s = 0; s < b->n_seqs; s++) decode_only &= b->h_q_len[s] == 1;
  if (decode_only) return launch_decode<DPL>(c, out, q, kc, vc, b, n_heads, group, block_size, scale, window);
  return launch_prefill<DPL>(c, out, q, kc, vc, b, n_heads, group, block_size, scale, window);
}

extern "C" int servd_cuda_attention(servd_cuda_ctx *c, servd_bf16_t *out, const servd_bf16_t *q,
                                    const servd_bf16_t *k_cache, const servd_bf16_t *v_cache,
                                    const servd_cuda_attn_batch *b, int n_heads, int n_kv_heads, int head_dim,
                                    int block_size, float scale) {
  return servd_cuda_attention_window(c, out, q, k_cache, v_cache, b, n_heads, n_kv_heads, head_dim, block_size, scale,
                                     0);
}

extern "C" int servd_cuda_attention_window(servd_cuda_ctx *c, servd_bf16_t *out, const servd_bf16_t *q,
                                           const servd_bf16_t *k_cache, const servd_bf16_t *v_cache,
                                           const servd_cuda_attn_batch *b, int n_heads, int n_kv_heads, int head_dim,
                                           int block_size, float scale, int window) {
  if (window < 0) return servd_fail(SERVD_EINVAL, "cuda attention: window %d (0: none)", window);
  if (n_heads <= 0 || n_kv_heads <= 0 || n_heads % n_kv_heads || block_size <= 0 || b->n_seqs < 0 || b->max_blocks <= 0)
    return servd_fail(SERVD_EINVAL, "cuda attention: bad heads %d/%d, block_size %d, seqs %d, max_blocks %d", n_heads,
                      n_kv_heads, block_size, b->n_seqs, b->max_blocks);
  for (int s = 0; s < b->n_seqs; s++)
    if (b->h_q_len[s] < 0 || b->h_kv_len[s] < b->h_q_len[s] || b->h_kv_len[s] > (long long)b->max_blocks * block_size)
      return servd_fail(SERVD_EINVAL, "cuda attention: sequence %d has q_len %d, kv_len %d (max %d)", s, b->h_q_len[s],
                        b->h_kv_len[s], b->max_blocks * block_size);
  if (b->n_seqs == 0) return SERVD_OK;
  SERVD_CUDA_DEVICE_SCOPE(c);
  const int group = n_heads / n_kv_heads;
  switch (head_dim) {
  case 64: return dispatch<2>(c, out, q, k_cache, v_cache, b, n_heads, group, block_size, scale, window);
  case 96: return dispatch<3>(c, out, q, k_cache, v_cache, b, n_heads, group, block_size, scale, window);
  case 128: return dispatch<4>(c, out, q, k_cache, v_cache, b, n_heads, group, block_size, scale, window);
  case 256: return dispatch<8>(c, out, q, k_cache, v_cache, b, n_heads, group, block_size, scale, window);
  default: return servd_fail(SERVD_EUNSUPPORTED, "cuda attention: head_dim %d (supported: 64, 96, 128, 256)", head_dim);
  }
}
