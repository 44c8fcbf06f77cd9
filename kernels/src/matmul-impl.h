/* Private interface between the matmul driver (matmul.c) and its per-ISA kernels.
 *
 * out (m,n) f32 = x (m,k) f32 @ w (n,k)^T. A kernel computes all m rows for output columns [j0, j1);
 * the driver splits n over the thread pool. For block dtypes the driver first quantizes x once per
 * call into q8 activations (servd__q8x) that every kernel reads.
 */
#ifndef SERVD_MATMUL_IMPL_H
#define SERVD_MATMUL_IMPL_H

#include <math.h>
#include <string.h>

#include "cpu-impl.h"

/* x rows quantized to 8 bits per block of 32 (ggml's q8 activations, with an f32 scale):
 * row r block b holds 32 int8 q with x ~= q * d[r*lds + b], and s[r*lds + b] = d * sum(q).
 * Natural layout: block b of row r is qs[r*ldq + 32b .. +32].
 * Quad layout (the VNNI q4 and q5 kernels): blocks go in groups of 4; a group is 128 bytes, first the
 * elements 0..15 of its 4 blocks, then their elements 16..31, matching how a q4 block packs its
 * nibbles (low nibbles = elements 0..15). A last partial group is zero padded.
 * d and s are zero from nb up to lds. */
typedef struct servd__q8x {
  int8_t *qs;
  float *d, *s;
  /* The residual level (servd_cpu_activation_levels() == 2; NULL otherwise): what the first leaves,
   * x - q*d (one rounding, an FMA), quantized per block the same way with scale d2 = d/128
   * (|q2| <= 64), in qs's layout; s2 = d2 * sum(q2). x ~= q*d + q2*d2. */
  int8_t *qs2;
  float *d2, *s2;
  int64_t nb;  /* blocks per row */
  int64_t ldq; /* bytes between rows of qs */
  int64_t lds; /* floats between rows of d and s */
  bool quad;
} servd__q8x;

/* Byte offset in a q8x row of half h (0: elements 0..15, 1: elements 16..31) of block b, in either
 * layout: the one place that spells the quad layout out for the quantizers. */
static inline int64_t servd__q8x_off(const servd__q8x *q, int64_t b, int h) {
  return q->quad ? (b / 4) * 128 + h * 64 + (b % 4) * 16 : b * 32 + h * 16;
}

/* What every quantizer writes for row r besides its blocks: d and s zero from nb up to lds, and the
 * padding of a last partial quad zero. */
static inline void servd__q8x_clear_tail(const servd__q8x *q, int64_t r) {
  for (int64_t b = q->nb; b < q->lds; b++) q->d[r * q->lds + b] = q->s[r * q->lds + b] = 0.0f;
  if (q->quad && q->nb % 4) memset(q->qs + r * q->ldq + q->nb / 4 * 128, 0, 128);
  if (!q->qs2) return;
  for (int64_t b = q->nb; b < q->lds; b++) q->d2[r * q->lds + b] = q->s2[r * q->lds + b] = 0.0f;
  if (q->quad && q->nb % 4) memset(q->qs2 + r * q->ldq + q->nb / 4 * 128, 0, 128);
}

/* The residual level's scale: a power-of-two step below d, so q*d + q2*d2 is q*128 + q2 in units of d2. */
#define SERVD__RESIDUAL_SCALE (1.0f / 128.0f)

/* The residual quantum of one value given its first-level quantum qv (scalar reference; the SIMD
 * quantizers compute the same: the fused v - qv*d, times 1/d2 = 128/d, rounded half away). */
static inline int servd__residual_q(float v, int qv, float d, float id) {
  const float r = fmaf(-(float)qv, d, v);
  return (int)roundf(r * (id * 128.0f));
}

/* x rows quantized for k-quant weights, as ggml's block_q8_K: per 256 values int8 q with
 * x ~= q * d, and bsums[g] = sum of q over values 16g..16g+15 (the k-quant sub-block offsets, q4_k's
 * mins and q6_k's -32, multiply these instead of every element).
 * Row r super-block b: qs[r*ldq + 256b ..], d[r*nb + b], bsums[(r*nb + b)*16 ..]. */
typedef struct servd__q8k {
  int8_t *qs;
  float *d;
  int16_t *bsums;
  /* The residual level as servd__q8x's (NULL: one level): qs2 in qs's layout, d2 = d/128, bsums2
   * the 16-value sums of q2. */
  int8_t *qs2;
  float *d2;
  int16_t *bsums2;
  int64_t nb;  /* super-blocks per row */
  int64_t ldq; /* bytes between rows of qs */
  /* Set for the AVX-512 q4_k/q5_k kernel: each super-block's 16-value groups are stored in the
   * order of servd__q8k_group_off (bsums stay natural). */
  bool perm;
} servd__q8k;

/* Byte offset in a q8k super-block of the 16-value group g (0..15). perm: the 64-byte step
 * t = 2*(j%2) + g%2 of sub-block j = g/2 holds it in its 16-byte lane c = j/2: the values
 * that a q4_k block's 16-byte runs qs[32c + 16P ..] give as low (even j = 2c) or high (odd j = 2c+1)
 * nibbles, so each step's 4 lanes hold 4 sub-blocks of one parity, in the same lanes every time. */
static inline int servd__q8k_group_off(const servd__q8k *q, int g) {
  if (!q->perm) return 16 * g;
  const int j = g / 2, t = 2 * (j % 2) + g % 2;
  return 64 * t + 16 * (j / 2);
}

/* *amax = the largest |v[j]| of n values; false when one is NaN or infinite (the scalar quantizers then
 * mark the block's outputs NaN rather than cast undefined values). */
static inline bool servd__block_absmax(const float *v, int n, float *amax) {
  float a = 0.0f;
  bool finite = true;
  for (int j = 0; j < n; j++) {
    a = fmaxf(a, fabsf(v[j]));
    finite &= isfinite(v[j]) != 0;
  }
  *amax = a;
  return finite;
}

typedef struct servd__mm {
  const char *x, *w;
  char *out;
  int64_t ldx, ldw, ldo; /* bytes between rows */
  int64_t m, n, k;
  servd_dtype wt;
  servd__q8x xq; /* q8_0 q4_0 q4_1 q5_0 q5_1 only */
  servd__q8k xk; /* k-quants only */
  /* bf16 weights on AVX-512: x with each run of 32 values stored as its 16 even then 16 odd
   * elements (the order in which a 32-bit load splits bf16 pairs); whole runs only. */
  const float *xeo;
  int64_t ldxeo; /* floats between rows */
  /* VNNI q8_0/q4_0/q4_1/iq4_nl kernel in prefill: its weight tile's block scales, decoded once for
   * every x row tile (matmul_avx512vnni.c); NULL: decoded per tile. */
  const float *hdr;
  /* The kernel adds xq's residual level inside its dots (dtype_cpu.c's vnni_fuses_residual): dot =
   * (dot of q << 7) + dot of q2, an exact integer in units of d2, times d2. */
  bool residual_fused;
} servd__mm;

typedef void (*servd__mm_fn)(const servd__mm *p, int64_t j0, int64_t j1);

/* fn over columns [j0, j1) of p, with the residual activation level added where p has one: how the
 * drivers (matmul.c, fused_gate_up.c) call every kernel. */
void servd__mm_run(servd__mm_fn fn, const servd__mm *p, int64_t j0, int64_t j1);

/* dst reads the x that prepare() made for src (same x, same dtype): its activations and forms. */
static inline void servd__mm_share_x(servd__mm *dst, const servd__mm *src) {
  dst->xq = src->xq;
  dst->xk = src->xk;
  dst->xeo = src->xeo;
  dst->ldxeo = src->ldxeo;
  dst->residual_fused = src->residual_fused;
}

/* q's view from row r0 on (every level's arrays moved; a NULL array stays NULL). */
static inline void servd__q8x_rows_from(servd__q8x *q, int64_t r0) {
  if (!q->qs) return;
  q->qs += r0 * q->ldq;
  q->d += r0 * q->lds;
  q->s += r0 * q->lds;
  if (!q->qs2) return;
  q->qs2 += r0 * q->ldq;
  q->d2 += r0 * q->lds;
  q->s2 += r0 * q->lds;
}
static inline void servd__q8k_rows_from(servd__q8k *q, int64_t r0) {
  if (!q->qs) return;
  q->qs += r0 * q->ldq;
  q->d += r0 * q->nb;
  q->bsums += r0 * q->nb * 16;
  if (!q->qs2) return;
  q->qs2 += r0 * q->ldq;
  q->d2 += r0 * q->nb;
  q->bsums2 += r0 * q->nb * 16;
}

/* What a weight dtype's kernels read of x, prepared once per call by matmul.c's prepare(). */
typedef enum servd__act {
  SERVD__ACT_F32,          /* x as it is (f32 f16 bf16 weights) */
  SERVD__ACT_F32_EVEN_ODD, /* as F32; on AVX-512 also xeo, x's runs of 32 split even/odd (bf16) */
  SERVD__ACT_Q8,           /* servd__q8x: q8 per 32 (the quad layout for the VNNI kernels) */
  SERVD__ACT_Q8K,          /* servd__q8k: q8_K per 256 (the k-quants and iq4_xs) */
} servd__act;

/* A dtype's CPU traits as a weight (dtype_cpu.c, one row per row of servd/dtypes.def). */
typedef struct servd__dtype_cpu {
  servd__act act;
  bool q8k_perm; /* its VNNI kernel reads q8_K groups in servd__q8k_group_off's permuted order */
  /* its VNNI kernel reads the residual activation level itself (one pass over the weights, with
   * servd__mm.residual_fused); other kernels get it from servd__mm_run as a second pass */
  bool vnni_fuses_residual;
  /* Its kernel per ISA; NULL falls back to the next lower ISA's, a NULL scalar: not a weight dtype. */
  servd__mm_fn scalar, avx2, avx512, avx512vnni;
  bool avx2_fuses_residual; /* as vnni_fuses_residual, for its AVX2 kernel */
} servd__dtype_cpu;

extern const servd__dtype_cpu servd__dtype_cpu_traits[SERVD_DTYPE_COUNT];
/* c's kernel on the active ISA (vnni: servd__cpu_has_vnni()). */
servd__mm_fn servd__dtype_cpu_kernel(const servd__dtype_cpu *c, servd_isa isa, bool vnni);

/* A matmul's descriptor from its tensors (checked as servd_matmul checks them), and its prepared x
 * (in the calling thread's scratch slot 0; m, k > 0) and kernel: for fused kernels (fused_*.c). */
int servd__mm_setup(servd__mm *p, servd_tensor *out, const servd_tensor *x, const servd_tensor *w);
int servd__mm_prepare(servd__mm *p, servd__mm_fn *fn);

/* Quantizes m rows of x (k a multiple of 32) into q (sized by the caller). */
void servd__quantize_q8x(const char *x, int64_t ldx, int64_t m, int64_t k, const servd__q8x *q);
void servd__quantize_q8x_avx512(const char *x, int64_t ldx, int64_t m, int64_t k, const servd__q8x *q);

/* Quantizes m rows of x (k a multiple of 256) into q (matmul_k.c). */
void servd__quantize_q8k(const char *x, int64_t ldx, int64_t m, int64_t k, const servd__q8k *q);
void servd__quantize_q8k_avx512(const char *x, int64_t ldx, int64_t m, int64_t k, const servd__q8k *q); /* VNNI CPUs */

/* Scalar reference kernels (matmul.c). */
void servd__mm_float_scalar(const servd__mm *p, int64_t j0, int64_t j1);  /* f32 f16 bf16 */
void servd__mm_quant_scalar(const servd__mm *p, int64_t j0, int64_t j1);  /* q8_0 q4_0 q4_1 */
void servd__mm_kquant_scalar(const servd__mm *p, int64_t j0, int64_t j1); /* q4_k q5_k q6_k (matmul_k.c) */
void servd__mm_q5_scalar(const servd__mm *p, int64_t j0, int64_t j1);     /* q5_0 q5_1 (matmul_q5.c) */

/* SIMD kernels; NULL-free: each covers every shape for its dtypes. */
void servd__mm_float_avx2(const servd__mm *p, int64_t j0, int64_t j1);
void servd__mm_float_avx512(const servd__mm *p, int64_t j0, int64_t j1);
/* Fills xeo (m x k rounded down to 32) for the AVX-512 bf16 kernel. */
void servd__split_even_odd_avx512(const char *x, int64_t ldx, int64_t m, int64_t k, float *xeo, int64_t ldxeo);
void servd__mm_quant_avx2(const servd__mm *p, int64_t j0, int64_t j1);
void servd__mm_quant_avx512vnni(const servd__mm *p, int64_t j0, int64_t j1);
void servd__mm_kquant_avx2(const servd__mm *p, int64_t j0, int64_t j1);       /* matmul_k_avx2.c */
void servd__mm_kquant_avx512vnni(const servd__mm *p, int64_t j0, int64_t j1); /* matmul_k_avx512vnni.c */
/* q5_0 q5_1 (matmul_q5_avx2.c: natural q8 activations, matmul_q5_avx512vnni.c: quad layout) */
void servd__mm_q5_avx2(const servd__mm *p, int64_t j0, int64_t j1);
void servd__mm_q5_avx512vnni(const servd__mm *p, int64_t j0, int64_t j1);

#endif
