// Attention over the paged KV cache (per layer: (n_blocks, block_size, kv_dim) bf16 for K and V).
//
// kv_write_kernel:   K/V rows of new tokens into their slots.
// decode_split_kernel + decode_reduce_kernel: one query row per sequence (decode), flash-decoding.
//   The launch fixes the number of splits per (sequence, head) from the grid size alone (enough
//   blocks to fill the GPU a few times over; see launch_decode), never from the context length the
//   host does not know at capture time. Each block reads its sequence's real kv_len on the device
//   and takes split `split` of ceil(kv_len / n_splits) tokens rounded up to whole cache blocks; it
//   writes a partial softmax (max, sum, weighted V). Splits past the end are empty and write
//   (m = -FLT_MAX, l = 0, acc = 0), which the reduce kernel skips (it merges only l > 0), so a
//   short context in a wide grid costs one cheap empty block per unused split.
// prefill_tile_kernel: BQ query rows of one sequence and one head per block; K/V tiles of 32
//   tokens are staged in shared memory and each warp keeps an online softmax per row
//   (flash-attention tiling on CUDA cores). Lane j scores token j of the tile.
#pragma once
#include <float.h>
#include "cuda_common.cuh"

#define SERVD_ATTN_SPLIT_WAVES 4  /* split-K grid: about this many blocks per SM */
#define SERVD_ATTN_MAX_SPLITS 128 /* bounds the reduce loop and the scratch per (sequence, head) */
#define SERVD_ATTN_BQ 16
#define SERVD_ATTN_BK 32

__global__ void kv_write_kernel(__nv_bfloat16 *kc, __nv_bfloat16 *vc, const __nv_bfloat16 *k, const __nv_bfloat16 *v,
                                const int32_t *slots, int t, int kv_dim, long long n_slots) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (long long)t * kv_dim) return;
  const int row = (int)(i / kv_dim), e = (int)(i % kv_dim);
  const int32_t slot = slots[row];
  // Negative slots are padding rows of a graph bucket; slots past the cache are never written.
  if (slot < 0 || slot >= n_slots) return;
  const long long dst = (long long)slot * kv_dim + e;
  kc[dst] = k[i];
  vc[dst] = v[i];
}

__device__ __forceinline__ long long kv_row_offset(const int32_t *table, int pos, int block_size, int kv_dim,
                                                   int kv_head, int head_dim) {
  const int32_t blk = table[pos / block_size];
  return ((long long)blk * block_size + pos % block_size) * kv_dim + (long long)kv_head * head_dim;
}

template <int DPL>
__global__ void decode_split_kernel(float *part_acc, float *part_ml, const __nv_bfloat16 *__restrict__ q,
                                    const __nv_bfloat16 *__restrict__ kc, const __nv_bfloat16 *__restrict__ vc,
                                    const int32_t *__restrict__ q_start, const int32_t *__restrict__ kv_len,
                                    const int32_t *__restrict__ tables, int max_blocks, int n_heads, int group,
                                    int block_size, float scale, int window) {
  constexpr int HD = DPL * 32;
  const int seq = blockIdx.x, head = blockIdx.y, split = blockIdx.z, n_splits = gridDim.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, n_warps = blockDim.x / 32;
  const int len = max(kv_len[seq], 0);
  // A sliding window (> 0) leaves keys [lo, len) to the one query row at len - 1.
  const int lo = window > 0 && len > window ? len - window : 0;
  // This split's share of the real context, in whole cache blocks: chunk * n_splits >= len - lo, and
  // every split starting at or past len is empty. No int overflow: chunk <= len / n_splits + 1 +
  // block_size, so split * chunk <= len + n_splits * (1 + block_size).
  const int per = (len - lo + n_splits - 1) / n_splits;
  const int chunk = (per + block_size - 1) / block_size * block_size;
  const int begin = min(len, lo + split * chunk);
  const int end = min(len, begin + chunk);
  const long long part = ((long long)seq * n_heads + head) * n_splits + split;
  if (begin >= end) { /* the same for the whole block: an empty split, skipped by the reduce */
    for (int d = threadIdx.x; d < HD; d += blockDim.x) part_acc[part * HD + d] = 0.f;
    if (threadIdx.x == 0) {
      part_ml[2 * part] = -FLT_MAX;
      part_ml[2 * part + 1] = 0.f;
    }
    return;
  }
  const int kv_head = head / group, kv_dim = (n_heads / group) * HD;
  const int32_t *table = tables + (long long)seq * max_blocks;
  const __nv_bfloat16 *qr = q + ((long long)q_start[seq] * n_heads + head) * HD;

  float qv[DPL], acc[DPL];
#pragma unroll
  for (int j = 0; j < DPL; j++) {
    qv[j] = __bfloat162float(qr[lane + 32 * j]) * scale;
    acc[j] = 0.f;
  }
  float m = -FLT_MAX, l = 0.f;
  for (int pos = begin + warp; pos < end; pos += n_warps) {
    const long long off = kv_row_offset(table, pos, block_size, kv_dim, kv_head, HD);
    float s = 0.f;
#pragma unroll
    for (int j = 0; j < DPL; j++) s += qv[j] * __bfloat162float(kc[off + lane + 32 * j]);
    s = warp_sum(s);
    const float m_new = fmaxf(m, s);
    const float corr = __expf(m - m_new), p = __expf(s - m_new);
    l = l * corr + p;
#pragma unroll
    for (int j = 0; j < DPL; j++) acc[j] = acc[j] * corr + p * __bfloat162float(vc[off + lane + 32 * j]);
    m = m_new;
  }
  // Merge the warps of this block.
  __shared__ float sm_m[8], sm_l[8];
  __shared__ float sm_acc[8][HD];
  if (lane == 0) {
    sm_m[warp] = m;
    sm_l[warp] = l;
  }
#pragma unroll
  for (int j = 0; j < DPL; j++) sm_acc[warp][lane + 32 * j] = acc[j];
  __syncthreads();
  for (int d = threadIdx.x; d < HD; d += blockDim.x) {
    float M = -FLT_MAX;
    for (int w = 0; w < n_warps; w++) M = fmaxf(M, sm_m[w]);
    float L = 0.f, A = 0.f;
    for (int w = 0; w < n_warps; w++) {
      const float e = sm_l[w] > 0.f ? __expf(sm_m[w] - M) : 0.f;
      L += sm_l[w] * e;
      A += sm_acc[w][d] * e;
    }
    part_acc[part * HD + d] = A;
    if (d == 0) {
      part_ml[2 * part] = M;
      part_ml[2 * part + 1] = L;
    }
  }
}

__global__ void decode_reduce_kernel(__nv_bfloat16 *out, const float *part_acc, const float *part_ml,
                                     const int32_t *q_start, int n_heads, int n_splits, int head_dim) {
  const int seq = blockIdx.x, head = blockIdx.y;
  const long long base = ((long long)seq * n_heads + head) * n_splits;
  float M = -FLT_MAX;
  for (int s = 0; s < n_splits; s++)
    if (part_ml[2 * (base + s) + 1] > 0.f) M = fmaxf(M, part_ml[2 * (base + s)]);
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float L = 0.f, A = 0.f;
    for (int s = 0; s < n_splits; s++) {
      const float l = part_ml[2 * (base + s) + 1];
      if (l <= 0.f) continue; /* split past the end of this sequence */
      const float e = __expf(part_ml[2 * (base + s)] - M);
      L += l * e;
      A += part_acc[(base + s) * head_dim + d] * e;
    }
    out[((long long)q_start[seq] * n_heads + head) * head_dim + d] = __float2bfloat16(L > 0.f ? A / L : 0.f);
  }
}

// One tile: BQ query rows [q0, q0+BQ) of sequence seq. tile_seq/tile_q0 list the tiles.
template <int DPL>
__global__ void prefill_tile_kernel(__nv_bfloat16 *out, const __nv_bfloat16 *__restrict__ q,
                                    const __nv_bfloat16 *__restrict__ kc, const __nv_bfloat16 *__restrict__ vc,
                                    const int32_t *tile_seq, const int32_t *tile_q0, const int32_t *q_start,
                                    const int32_t *q_len, const int32_t *kv_len, const int32_t *tables, int max_blocks,
                                    int n_heads, int group, int block_size, float scale, int window) {
  constexpr int HD = DPL * 32, KS = HD + 2; /* padded K rows: conflict-free bf16x2 reads */
  constexpr int ROWS_PER_WARP = SERVD_ATTN_BQ / 4;
  extern __shared__ unsigned char smem_raw[];
  float *qs = reinterpret_cast<float *>(smem_raw);                                /* [BQ][HD] */
  __nv_bfloat16 *ks = reinterpret_cast<__nv_bfloat16 *>(qs + SERVD_ATTN_BQ * HD); /* [BK][KS] */
  __nv_bfloat16 *vs = ks + SERVD_ATTN_BK * KS;                                    /* [BK][HD] */

  const int seq = tile_seq[blockIdx.x], q0 = tile_q0[blockIdx.x], head = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int ql = q_len[seq], len = kv_len[seq], first_pos = len - ql;
  const int rows = min(SERVD_ATTN_BQ, ql - q0);
  const int kv_head = head / group, kv_dim = (n_heads / group) * HD;
  const int32_t *table = tables + (long long)seq * max_blocks;

  for (int i = threadIdx.x; i < SERVD_ATTN_BQ * HD; i += blockDim.x) {
    const int r = i / HD, d = i % HD;
    qs[i] =
        r < rows ? __bfloat162float(q[((long long)(q_start[seq] + q0 + r) * n_heads + head) * HD + d]) * scale : 0.f;
  }
  float m[ROWS_PER_WARP], l[ROWS_PER_WARP], acc[ROWS_PER_WARP][DPL];
#pragma unroll
  for (int r = 0; r < ROWS_PER_WARP; r++) {
    m[r] = -FLT_MAX;
    l[r] = 0.f;
#pragma unroll
    for (int j = 0; j < DPL; j++) acc[r][j] = 0.f;
  }
  const int kv_end = first_pos + q0 + rows; /* causal limit of the tile's last row */
  /* a sliding window (> 0): row p sees keys (p - window, p]; the tile's first row sees the oldest */
  const int kv_begin = window > 0 && first_pos + q0 + 1 > window ? first_pos + q0 + 1 - window : 0;
  for (int t0 = kv_begin; t0 < kv_end; t0 += SERVD_ATTN_BK) {
    __syncthreads();
    for (int i = threadIdx.x; i < SERVD_ATTN_BK * HD; i += blockDim.x) {
      const int j = i / HD, d = i % HD, pos = t0 + j;
      __nv_bfloat16 kv = __float2bfloat16(0.f), vv = kv;
      if (pos < kv_end) {
        const long long off = kv_row_offset(table, pos, block_size, kv_dim, kv_head, HD);
        kv = kc[off + d];
        vv = vc[off + d];
      }
      ks[j * KS + d] = kv;
      vs[j * HD + d] = vv;
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < ROWS_PER_WARP; r++) {
      const int row = warp * ROWS_PER_WARP + r;
      if (row >= rows) break;
      const int row_pos = first_pos + q0 + row, pos = t0 + lane;
      const bool seen = pos <= row_pos && (window <= 0 || pos > row_pos - window);
      float s = -FLT_MAX;
      if (seen) {
        s = 0.f;
        const __nv_bfloat162 *k2 = reinterpret_cast<const __nv_bfloat162 *>(ks + lane * KS);
        const float2 *q2 = reinterpret_cast<const float2 *>(qs + row * HD);
#pragma unroll 8
        for (int d = 0; d < HD / 2; d++) {
          const float2 kk = __bfloat1622float2(k2[d]);
          const float2 qq = q2[d];
          s += qq.x * kk.x + qq.y * kk.y;
        }
      }
      const float m_new = fmaxf(m[r], warp_max(s));
      const float p = seen ? __expf(s - m_new) : 0.f;
      const float corr = __expf(m[r] - m_new);
      l[r] = l[r] * corr + warp_sum(p);
      m[r] = m_new;
#pragma unroll
      for (int j = 0; j < DPL; j++) acc[r][j] *= corr;
      for (int jj = 0; jj < SERVD_ATTN_BK; jj++) {
        const float pj = __shfl_sync(0xffffffffu, p, jj);
        if (pj == 0.f) continue;
#pragma unroll
        for (int j = 0; j < DPL; j++) acc[r][j] += pj * __bfloat162float(vs[jj * HD + lane + 32 * j]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < ROWS_PER_WARP; r++) {
    const int row = warp * ROWS_PER_WARP + r;
    if (row >= rows) break;
    __nv_bfloat16 *o = out + ((long long)(q_start[seq] + q0 + row) * n_heads + head) * HD;
#pragma unroll
    for (int j = 0; j < DPL; j++) o[lane + 32 * j] = __float2bfloat16(acc[r][j] / l[r]);
  }
}
