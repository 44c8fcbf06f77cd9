/* Llama 3 rope scaling recovered from rope_freqs factors (rope_fit.c). The expected factors were
 * computed with tests/package_format/rope_freqs_ref.py (a numpy transcription of llama.cpp's
 * converter) and checked by hand for one smoothed entry: head_dim 16, theta 10000, original 64,
 * pair 1: wavelength 2*pi*10000^(1/8) = 19.87, smooth = (64/19.87 - 1)/3 = 0.7403,
 * 1/((1 - 0.7403)/8 + 0.7403) = 1.2940. Tolerance 1e-6 relative: f32 rounding of a few operations
 * (about 3e-7 against float64 for the head sizes of Llama 3.1/3.2). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>
#include <cmocka.h>

#include "rope_fit.h"
#include "servd/status.h"

/* Llama 3.2 1B/3B: head_dim 64, theta 500000, (factor 32, low 1, high 4, original 8192). */
static const float L32[32] = {1,           1,           1,  1,  1,  1,  1,  1,  1,  1,  1,  1,  1,  1,  1,  1.65132928f,
                              3.29226279f, 9.66673088f, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32};
/* head_dim 16, theta 10000, (8, 1, 4, 64): an original context only metadata can name. */
static const float SMALL[8] = {1, 1.29397583f, 7.6673851f, 8, 8, 8, 8, 8};

static void test_factors_match_reference(void **state) {
  (void)state;
  float out[32];
  mpk_llama3_rope r = {.factor = 32, .low_freq_factor = 1, .high_freq_factor = 4, .original_max_positions = 8192};
  mpk__llama3_rope_factors(&r, 500000.0, 32, out);
  for (int i = 0; i < 32; i++) assert_true(fabsf(out[i] - L32[i]) <= 1e-6f * L32[i]);
  r = (mpk_llama3_rope){.factor = 8, .low_freq_factor = 1, .high_freq_factor = 4, .original_max_positions = 64};
  mpk__llama3_rope_factors(&r, 10000.0, 8, out);
  for (int i = 0; i < 8; i++) assert_true(fabsf(out[i] - SMALL[i]) <= 1e-6f * SMALL[i]);
}

static void test_fit_llama32(void **state) {
  (void)state;
  mpk_llama3_rope r;
  assert_int_equal(mpk__rope_fit_llama3("m.gguf", "rope_freqs.weight", L32, 32, 500000.0, 0, &r), 0);
  assert_true(r.factor == 32.0 && r.low_freq_factor == 1.0 && r.high_freq_factor == 4.0);
  assert_int_equal(r.original_max_positions, 8192);
}

static void test_fit_with_hint(void **state) {
  (void)state;
  mpk_llama3_rope r;
  /* 64 is not among the searched contexts: refused without the hint, found with it. */
  assert_int_equal(mpk__rope_fit_llama3("m.gguf", "rope_freqs.weight", SMALL, 8, 10000.0, 0, &r), SERVD_EUNSUPPORTED);
  assert_int_equal(mpk__rope_fit_llama3("m.gguf", "rope_freqs.weight", SMALL, 8, 10000.0, 64, &r), 0);
  assert_true(r.factor == 8.0 && r.low_freq_factor == 1.0 && r.high_freq_factor == 4.0);
  assert_int_equal(r.original_max_positions, 64);
}

static void test_all_ones(void **state) {
  (void)state;
  float ones[32];
  for (int i = 0; i < 32; i++) ones[i] = 1;
  mpk_llama3_rope r;
  assert_int_equal(mpk__rope_fit_llama3("m.gguf", "rope_freqs.weight", ones, 32, 500000.0, 0, &r), 0);
  assert_true(r.factor == 1.0);
}

static void test_refusals(void **state) {
  (void)state;
  float f[32];
  mpk_llama3_rope r;
  /* 2e-6 relative off in the smoothed entry: beyond the tolerance. */
  memcpy(f, L32, sizeof f);
  f[16] *= 1.000002f;
  assert_int_equal(mpk__rope_fit_llama3("m.gguf", "rope_freqs.weight", f, 32, 500000.0, 0, &r), SERVD_EUNSUPPORTED);
  const char *e = servd_last_error();
  assert_non_null(strstr(e, "m.gguf"));
  assert_non_null(strstr(e, "rope_freqs.weight: 32 per-dimension factors"));
  assert_non_null(strstr(e, "max 32"));
  assert_non_null(strstr(e, "not supported"));
  /* Right shape of curve, wrong base frequency. */
  assert_int_equal(mpk__rope_fit_llama3("m.gguf", "rope_freqs.weight", L32, 32, 10000.0, 0, &r), SERVD_EUNSUPPORTED);
  /* Not positive or not finite. */
  memcpy(f, L32, sizeof f);
  f[3] = 0;
  assert_int_equal(mpk__rope_fit_llama3("m.gguf", "rope_freqs.weight", f, 32, 500000.0, 0, &r), SERVD_EUNSUPPORTED);
  f[3] = INFINITY;
  assert_int_equal(mpk__rope_fit_llama3("m.gguf", "rope_freqs.weight", f, 32, 500000.0, 0, &r), SERVD_EUNSUPPORTED);
  f[3] = NAN;
  assert_int_equal(mpk__rope_fit_llama3("m.gguf", "rope_freqs.weight", f, 32, 500000.0, 0, &r), SERVD_EUNSUPPORTED);
  /* All below 1: not a Llama 3 scaling. */
  for (int i = 0; i < 32; i++) f[i] = 0.5f;
  assert_int_equal(mpk__rope_fit_llama3("m.gguf", "rope_freqs.weight", f, 32, 500000.0, 0, &r), SERVD_EUNSUPPORTED);
  assert_int_equal(mpk__rope_fit_llama3("m.gguf", "rope_freqs.weight", f, 0, 500000.0, 0, &r), SERVD_EFORMAT);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_factors_match_reference), cmocka_unit_test(test_fit_llama32),
                                     cmocka_unit_test(test_fit_with_hint), cmocka_unit_test(test_all_ones),
                                     cmocka_unit_test(test_refusals)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
