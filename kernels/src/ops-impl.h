/* Private to the layer ops (rmsnorm, rope, swiglu/add, softmax, attention): the per-ISA row kernels
 * the dispatchers choose between, shape helpers for error messages, and the vector exp shared by
 * the SIMD files. Not part of the API. */
#ifndef SERVD_OPS_IMPL_H
#define SERVD_OPS_IMPL_H

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "cpu-impl.h"
#include "servd/ops.h"

/* ---- row kernels, one set per ISA (scalar ones live in the op's own .c file) ---------------------- */
#define OPS__DECLARE_ROW_KERNELS(isa) \
  void servd__add_##isa(float *out, const float *a, const float *b, int64_t n); \
  void servd__swiglu_##isa(float *out, const float *g, const float *u, int64_t n); \
  /* returns sum(x^2) in f32 accumulators */ \
  float servd__sumsq_##isa(const float *x, int64_t n); \
  /* out = x * r * w, w f32 / f16 / bf16 */ \
  void servd__scale_mul_##isa(float *out, const float *x, float r, const void *w, servd_dtype wt, int64_t n); \
  /* x[i] = exp(x[i]*scale - max), returns the sum */ \
  float servd__exp_shift_sum_##isa(float *x, int64_t n, float scale, float max); \
  float servd__max_##isa(const float *x, int64_t n); \
  void servd__mul_scalar_##isa(float *x, int64_t n, float s); \
  /* rotate n_heads heads of one row with per-pair tables cs/sn (head_dim/2 each) */ \
  void servd__rope_row_##isa(float *x, int64_t n_heads, int head_dim, servd_rope_layout layout, const float *cs, \
                             const float *sn); \
  /* out[i*ld + j] = scale * dot(q[i], k_j) for nq queries and n keys; k is transposed: dim d of key j \
   * at k[d*kstride + j], f32 or f16. pf (NULL: none) is prefetched at the offsets read from k, spread \
   * over the loop: the caller points it at a later block, so the misses in flight stay steady. */ \
  void servd__attn_scores_##isa(float *out, int ld, const float *const *q, int nq, const void *k, servd_dtype kt, \
                                int n, int hd, int64_t kstride, float scale, const void *pf); \
  /* acc[i*acc_ld + d] += sum_j p[i*ld + j] * v_j[d] for nq queries, n value rows vstride elements apart; \
   * pf as for scores, mirroring the reads from v */ \
  void servd__attn_accum_##isa(float *acc, int acc_ld, const float *p, int ld, int nq, const void *v, servd_dtype vt, \
                               int n, int hd, int64_t vstride, const void *pf);

/* The same two kernels over a quantized cache (q8_0, q4_0; run layout below): keys or value rows
 * [off, off+n) of one run of block_size bs, read in place; pf (NULL: none) is another run of the same
 * layout, prefetched at the offsets read. */
#define OPS__DECLARE_KVQ_KERNELS(isa) \
  void servd__attn_scores_q_##isa(float *out, int ld, const float *const *q, int nq, const char *run, servd_dtype kt, \
                                  int off, int n, int hd, int bs, float scale, const char *pf); \
  void servd__attn_accum_q_##isa(float *acc, int acc_ld, const float *p, int ld, int nq, const char *run, \
                                 servd_dtype vt, int off, int n, int hd, const char *pf); \
  /* keys [off, off+n) of a K run as f32, transposed: out[d*ld + j]; value rows as f32: out[j*hd + d] \
   * (what many queries at once, a prefill, read from a tile in L1 instead of converting per query) */ \
  void servd__kvq_dequant_k_##isa(float *out, int ld, const char *run, servd_dtype kt, int off, int n, int hd, \
                                  int bs); \
  void servd__kvq_dequant_v_##isa(float *out, const char *run, servd_dtype vt, int off, int n, int hd);

OPS__DECLARE_ROW_KERNELS(scalar)
OPS__DECLARE_ROW_KERNELS(avx2)
OPS__DECLARE_ROW_KERNELS(avx512)
OPS__DECLARE_KVQ_KERNELS(scalar)
OPS__DECLARE_KVQ_KERNELS(avx2)

/* add_bias.c: out and x f32 of one shape (..., n), b f32 (n); `op` names the caller in the message. */
int servd__check_rows_bias(const char *op, servd_tensor *out, const servd_tensor *x, const servd_tensor *b);
/* bias_gelu.c: out[i] = gelu_erf(x[i] + b[i]) over n, per ISA (bias_gelu_avx2.c). */
void servd__bias_gelu_scalar(float *out, const float *x, const float *b, int64_t n);
void servd__bias_gelu_avx2(float *out, const float *x, const float *b, int64_t n);
/* encoder_attention.c: one query row's head: o (hd) = softmax(scale q.k_j) v_j over the n keys and values
 * of its sequence, k_j at k + j*stride (v likewise); p: scratch of n floats. Per ISA
 * (encoder_attention_avx2.c). */
void servd__enc_attn_head_scalar(float *o, const float *q, const float *k, const float *v, int n, int hd,
                                 int64_t stride, float scale, float *p);
void servd__enc_attn_head_avx2(float *o, const float *q, const float *k, const float *v, int n, int hd, int64_t stride,
                               float scale, float *p);

/* The active ISA (forced or best), indexes the kernel tables above. */
static inline servd_isa ops__isa(void) {
  servd_isa isa = servd__isa();
  return isa >= SERVD_ISA_COUNT ? SERVD_ISA_SCALAR : isa;
}

/* A tensor seen as rows over its last dim (servd__as_matrix); -1 when outer dims cannot be merged. */
typedef struct ops__rows {
  char *data;
  int64_t rows, cols, stride; /* stride in bytes */
} ops__rows;

static inline int ops__as_rows(const servd_tensor *t, ops__rows *r) {
  servd__mat m;
  if (!t || t->ndim < 1 || !servd__as_matrix(t, &m)) return -1;
  r->data = m.base;
  r->rows = m.rows;
  r->cols = m.cols;
  r->stride = m.row_stride;
  return 0;
}

/* "f32[2,3]" or "(null)" for messages. */
static inline const char *ops__desc(const servd_tensor *t, char *buf, size_t cap) {
  if (!t) {
    snprintf(buf, cap, "(null)");
    return buf;
  }
  return servd_tensor_describe(t, buf, cap);
}

/* ---- paged KV cache layout (kv_cache.c), read by attention.c ------------------------------------
 * One anonymous mapping holds runs of block_size tokens: [layer][kv head][block][K|V]. A run of V is
 * token-major, [token][dim], so a value row is contiguous for the weighted sum. A run of K is
 * transposed, [dim][token]: the scores of 16 keys are then 16 lanes of one register, accumulated
 * with one broadcast FMA per dim and per query head, with no horizontal sums, and every query head
 * of the group reuses each loaded K vector. A block's K and V runs of one kv head are adjacent, and
 * so are those of consecutive blocks, so a sequence whose blocks have consecutive ids (the usual
 * case right after its prefill) is read as one sequential stream per kv head. (With K and V in
 * separate regions, their distance was a power of two for common shapes and the two streams
 * collided in the caches and DRAM banks: 5 instead of 28 GB/s.) head_bytes is rounded up to 64 so
 * every run starts on a cache line.
 *
 * Quantized caches (q8_0, q4_0) keep each token's head vector in blocks of 32 dims (head_dim a
 * multiple of 32), one f16 scale per token and block, quantized as written (kv_write, with the
 * reference quantizer of core's dtype row): a slot is rewritten whole, so truncated drafts and reused
 * blocks never mix scales. A run of V is [token][block] of ggml's own blocks (servd/blocks.h); a run
 * of K stays transposed: the scales [block][token] (f16) first, then the codes [dim][token], int8 for
 * q8_0, and for q4_0 two tokens per byte (even token in the low nibble, value nibble - 8), a dim's
 * row (block_size+1)/2 bytes. Scores then load 16 keys' codes of one dim as one vector, as f16 does,
 * and scale each key's partial dot product once per block of 32 dims. */
struct servd_kv_cache {
  int n_layers, n_kv_heads, head_dim, block_size, n_blocks;
  servd_dtype dtype; /* f32, f16, bf16, q8_0 or q4_0 */
  size_t elem;       /* bytes per value of a plain dtype; 0 for q8_0 / q4_0 */
  size_t head_bytes; /* one run: block_size tokens of one kv head */
  char *pool;
  size_t pool_bytes;
  pthread_mutex_t mu; /* guards the free list */
  int32_t *free_ids;  /* stack of free block ids */
  int n_free;
  int32_t *refs; /* per block: holders (sequences, the prefix cache); 0 = free, so a stray or
                       * extra free is ignored */
};

/* Start of kv head g's run in block blk; kv 0 = K (transposed), 1 = V. */
static inline char *ops__kv_run(const struct servd_kv_cache *c, int layer, int kv, int32_t blk, int g) {
  size_t r = (((size_t)layer * (size_t)c->n_kv_heads + (size_t)g) * (size_t)c->n_blocks + (size_t)blk) * 2 + (size_t)kv;
  return c->pool + r * c->head_bytes;
}

/* A quantized cache: K/V in blocks of 32 dims (the layout above). */
static inline bool ops__kv_quantized(servd_dtype t) { return t == SERVD_Q8_0 || t == SERVD_Q4_0; }
/* Bytes of one K run of a quantized cache before its codes (the scales), and of one dim's codes. */
static inline size_t ops__kvq_scale_bytes(int hd, int bs) { return (size_t)(hd / 32) * (size_t)bs * 2; }
static inline size_t ops__kvq_krow(servd_dtype t, int bs) {
  return t == SERVD_Q8_0 ? (size_t)bs : (size_t)(bs + 1) / 2;
}

/* Quantizes one token's head vectors k, v (head_dim f32 each) into slot off of the runs krun, vrun. */
void ops__kvq_write(const struct servd_kv_cache *c, char *krun, char *vrun, int off, const float *k, const float *v);

/* How far ahead attention prefetches, in blocks (at least 1). On shuffled block tables the hardware
 * prefetchers cannot guess the next block's address, so the kernels prefetch the block this many
 * later at the offsets they are reading, one line per line read: the misses in flight stay about
 * constant instead of coming in bursts (prefetching a whole block or tile at once reached only half
 * the rate). About 6 KiB of each of K and V ahead covers the memory latency at one core's share of
 * the bandwidth; 2 to 3 times more measured no better. */
#define OPS__ATTN_PF_BYTES 6144
static inline int ops__attn_pf_blocks(const struct servd_kv_cache *c) {
  size_t nb = (OPS__ATTN_PF_BYTES + c->head_bytes / 2) / c->head_bytes;
  return nb < 1 ? 1 : (int)nb;
}

/* ---- vector exp -----------------------------------------------------------------------------------
 * Cephes expf: n = round(x*log2e), r = x - n*ln2 (two-part ln2), degree-6 polynomial, times 2^n.
 * About 1-2 ulp against libm expf over the clamped range. */
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
static inline __m256 ops__exp256(__m256 x) {
  /* 88.0 keeps 2^n a normal float for the exponent trick; exp(x<-87) is flushed to 0 (true value
   * < 1.7e-38, far below anything our consumers can see). */
  const __m256 hi = _mm256_set1_ps(88.0f), lo = _mm256_set1_ps(-87.0f);
  __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
  __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500E-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507E-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073E-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894E-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459E-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201E-1f));
  __m256 r2 = _mm256_mul_ps(r, r);
  __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, r2, r), _mm256_set1_ps(1.0f));
  __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  y = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
  return _mm256_andnot_ps(under, y);
}
static inline float ops__hsum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
static inline float ops__hmax256(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
/* n (< 8) lanes mask for tails */
static inline __m256i ops__tailmask256(int64_t n) {
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), idx);
}
#endif

#if defined(__AVX512F__)
static inline __m512 ops__exp512(__m512 x) {
  /* scalef computes p*2^n with correct overflow/underflow, so only NaN-safe clamping is needed. */
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-104.0f)), _mm512_set1_ps(89.0f));
  __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500E-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507E-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073E-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894E-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459E-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201E-1f));
  __m512 r2 = _mm512_mul_ps(r, r);
  __m512 y = _mm512_add_ps(_mm512_fmadd_ps(p, r2, r), _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(y, n);
}
#endif

#endif
