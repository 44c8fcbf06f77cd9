/* Llama 3 rope scaling recovered from a GGUF's rope_freqs tensor (see rope_fit.c). */
#ifndef MPK_ROPE_FIT_H
#define MPK_ROPE_FIT_H

#include <stdint.h>

typedef struct mpk_llama3_rope {
  double factor; /* 1: the factors are all 1, no scaling */
  double low_freq_factor, high_freq_factor;
  uint32_t original_max_positions; /* original_max_position_embeddings */
} mpk_llama3_rope;

/* The factors llama.cpp's converter writes for a Llama 3 rope scaling (divisors of the inverse
 * frequencies of dimension pairs 0..n-1 of a head of 2n dims), computed in f32 as it does. */
void mpk__llama3_rope_factors(const mpk_llama3_rope *r, double theta, int n, float *out);

/* Finds the Llama 3 rope scaling whose factors equal ff[0..n) within 1e-6 relative: factor is the
 * largest value, then original context hint_orig (0: none) first, then 8192 2048 4096 16384 32768,
 * low_freq_factor 1 0.5 2, high_freq_factor 4 2 8; the first match wins. 0 and *out on a match;
 * SERVD_EUNSUPPORTED naming `what` (file) and `tensor` when none matches. */
int mpk__rope_fit_llama3(const char *what, const char *tensor, const float *ff, int n, double theta, uint32_t hint_orig,
                         mpk_llama3_rope *out);

#endif
