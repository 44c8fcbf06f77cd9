/* Helpers shared by the kernels compiled for AVX-512 (files *_avx512*.c only). */
#ifndef SERVD_AVX512_IMPL_H
#define SERVD_AVX512_IMPL_H

#ifndef __AVX512F__
#error "avx512-impl.h is for files compiled with AVX-512 enabled"
#endif

#include <immintrin.h>

/* A load-time constructor of a file compiled for AVX-512 runs on every CPU, before any dispatch:
 * SERVD__AVX512_CONSTRUCTOR(name) { ... } runs its body only where AVX-512 (with VNNI) exists, from a
 * function the compiler cannot inline into the check (a body built for AVX-512 is an illegal
 * instruction on an AVX2-only CPU, e.g. AMD Zen 2/3). */
#define SERVD__AVX512_CONSTRUCTOR(name) \
  static void name##_body(void) __attribute__((noinline)); \
  __attribute__((constructor)) static void name(void) { \
    __builtin_cpu_init(); \
    if (__builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni")) name##_body(); \
  } \
  static void name##_body(void)

/* Lanes of a 16-float step with `left` elements left: all 16 when left >= 16, none when left <= 0. */
static inline __mmask16 tail16(int64_t left) {
  return left >= 16 ? (__mmask16)0xffff : left <= 0 ? (__mmask16)0 : (__mmask16)((1u << left) - 1);
}

/* roundf of each lane, as the scalar quantizers round (half away from zero), exact for |v| <= 127.5:
 * truncate(|v| + 0.5) with the sign put back, stepping back one where the addition rounded up
 * across a half (|v| just below one), which roundf would not do. */
static inline __m512 round_half_away(__m512 v) {
  const __m512 sign = _mm512_set1_ps(-0.0f), half = _mm512_set1_ps(0.5f);
  const __m512 a = _mm512_andnot_ps(sign, v);
  __m512 t = _mm512_roundscale_ps(_mm512_add_ps(a, half), _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  t = _mm512_mask_sub_ps(t, _mm512_cmp_ps_mask(_mm512_sub_ps(t, a), half, _CMP_GT_OQ), t, _mm512_set1_ps(1.0f));
  return _mm512_or_ps(t, _mm512_and_ps(sign, v));
}

/* The residual quanta of 16 values v whose first-level quanta are t (as floats): round((v - t*d) * id2),
 * the difference fused as servd__residual_q's fmaf, id2 = 128/d. */
static inline __m512i residual_q16(__m512 v, __m512 t, __m512 d, __m512 id2) {
  return _mm512_cvttps_epi32(round_half_away(_mm512_mul_ps(_mm512_fnmadd_ps(t, d, v), id2)));
}

/* Sum of a's 16 lanes in one fixed order: lanes 8 apart added, then 4, then 2, then 1 (the order of
 * GCC's _mm512_reduce_add_ps, spelled out so no compiler chooses another). reduce4 sums each of its
 * vectors in this same order, so an output column's value does not depend on whether its kernel
 * reduced it alone or with three others: a row's numbers do not depend on the batch around it. */
static inline float hsum16(__m512 a) {
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
  const __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  const __m128 p = _mm_add_ps(q, _mm_permute_ps(q, _MM_SHUFFLE(1, 0, 3, 2)));
  return _mm_cvtss_f32(_mm_add_ss(p, _mm_movehdup_ps(p)));
}

/* [sum a, sum b, sum c, sum d], each summed in hsum16's order. */
static inline __m128 reduce4(__m512 a, __m512 b, __m512 c, __m512 d) {
  __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                            _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
  __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, _MM_SHUFFLE(1, 0, 1, 0)),
                            _mm512_shuffle_f32x4(c, d, _MM_SHUFFLE(3, 2, 3, 2)));
  __m512 t = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(2, 0, 2, 0)),
                           _mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(3, 1, 3, 1)));
  t = _mm512_add_ps(t, _mm512_permute_ps(t, _MM_SHUFFLE(1, 0, 3, 2)));
  t = _mm512_add_ps(t, _mm512_permute_ps(t, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm512_castps512_ps128(
      _mm512_permutexvar_ps(_mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 12, 8, 4, 0), t));
}

#endif
