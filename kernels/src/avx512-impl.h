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

/* [sum a, sum b, sum c, sum d] */
static inline __m128 reduce4(__m512 a, __m512 b, __m512 c, __m512 d) {
  __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                            _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
  __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, _MM_SHUFFLE(1, 0, 1, 0)),
                            _mm512_shuffle_f32x4(c, d, _MM_SHUFFLE(3, 2, 3, 2)));
  __m512 t = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(2, 0, 2, 0)),
                           _mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(3, 1, 3, 1)));
  t = _mm512_add_ps(t, _mm512_permute_ps(t, _MM_SHUFFLE(2, 3, 0, 1)));
  t = _mm512_add_ps(t, _mm512_permute_ps(t, _MM_SHUFFLE(1, 0, 3, 2)));
  return _mm512_castps512_ps128(
      _mm512_permutexvar_ps(_mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 12, 8, 4, 0), t));
}

#endif
