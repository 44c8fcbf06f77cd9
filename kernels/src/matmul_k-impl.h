/* Helpers shared by the SIMD k-quant kernels (matmul_k_avx2.c, matmul_k_avx512vnni.c); include only
 * from files compiled for AVX2 or later. */
#ifndef SERVD_MATMUL_K_IMPL_H
#define SERVD_MATMUL_K_IMPL_H

#include <immintrin.h>

/* q4_k/q5_k 12-byte scales -> bytes 0..7: the eight 6-bit scales, 8..15: the eight mins (as
 * servd_k4_scale_min), with two byte shuffles and masks instead of per-scale bit fiddling.
 * Reads 16 bytes: in a block the scales are followed by qs. */
static inline __m128i servd__k4_scales_mins(const uint8_t *scales) {
  const __m128i q = _mm_loadu_si128((const __m128i *)scales);
  /* low parts: sc[0..3] = q[0..3]&63, sc[4..7] = q[8..11]&15, m[0..3] = q[4..7]&63, m[4..7] = q[8..11]>>4 */
  const __m128i a = _mm_shuffle_epi8(q, _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11));
  const __m128i lo = _mm_or_si128(
      _mm_and_si128(a, _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 0, 0, 0, 0)),
      _mm_and_si128(_mm_srli_epi16(a, 4), _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 15, 15, 15, 15)));
  /* top 2 bits of sc[4..7] from q[0..3] >> 6, of m[4..7] from q[4..7] >> 6 */
  const __m128i b = _mm_shuffle_epi8(q, _mm_setr_epi8(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1, 4, 5, 6, 7));
  return _mm_or_si128(lo, _mm_and_si128(_mm_srli_epi16(b, 2), _mm_set1_epi8(0x30)));
}

#endif
