/* Statistics, seeded randomness and prompts, against hand-computed values. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "bench.h"

/* cmocka 1.1 has no floating-point assertion */
#define assert_near(a, b, eps) assert_true(fabs((double)(a) - (double)(b)) <= (eps))

static void test_percentiles_match_numpy_linear(void **state) {
  (void)state;
  /* np.percentile(range(1, 11), [50, 90, 99]) == [5.5, 9.1, 9.91] */
  double v[10] = {10, 3, 7, 1, 9, 2, 8, 4, 6, 5};
  bench_summary s;
  bench_summarize(v, 10, &s);
  assert_int_equal(s.count, 10);
  assert_near(s.mean, 5.5, 1e-12);
  assert_near(s.median, 5.5, 1e-12);
  assert_near(s.p75, 7.75, 1e-12); /* np.percentile(range(1, 11), [75, 95]) == [7.75, 9.55] */
  assert_near(s.p90, 9.1, 1e-12);
  assert_near(s.p95, 9.55, 1e-12);
  assert_near(s.p99, 9.91, 1e-12);
  assert_near(s.min, 1, 0);
  assert_near(s.max, 10, 0);
  assert_near(s.stddev, sqrt(8.25), 1e-12); /* population variance of 1..10 */

  double one[1] = {4.25};
  bench_summarize(one, 1, &s);
  assert_near(s.p99, 4.25, 0);
  bench_summarize(NULL, 0, &s);
  assert_int_equal(s.count, 0);
  assert_near(s.p90, 0, 0);
}

static void test_rng_reproducible_and_exponential_mean(void **state) {
  (void)state;
  bench_rng a, b, c;
  bench_rng_seed(&a, 42);
  bench_rng_seed(&b, 42);
  bench_rng_seed(&c, 43);
  int same = 0;
  for (int i = 0; i < 100; i++) {
    uint64_t x = bench_rng_next(&a);
    assert_true(x == bench_rng_next(&b));
    same += x == bench_rng_next(&c);
  }
  assert_int_equal(same, 0);
  /* the mean of n exponential samples with rate 4 is 0.25 with standard error 0.25/sqrt(n):
   * for n = 200000 that is 0.00056, so 0.005 is a 9-sigma margin */
  double sum = 0;
  for (int i = 0; i < 200000; i++) {
    double x = bench_rng_exponential(&a, 4.0);
    assert_true(x >= 0 && isfinite(x));
    sum += x;
  }
  assert_near(sum / 200000, 0.25, 0.005);
}

static int count_words(const char *s) {
  int n = 0;
  for (const char *p = s; *p; p++)
    if (*p != ' ' && (p == s || p[-1] == ' ')) n++;
  return n;
}

static void test_random_prompts_by_seed_and_index(void **state) {
  (void)state;
  bench_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.input_len = 50;
  cfg.output_len = 7;
  cfg.seed = 1;
  bench_prompts *p = bench_prompts_create(&cfg);
  assert_non_null(p);
  int in, out;
  char *a = strdup(bench_prompts_get(p, 3, &in, &out));
  assert_int_equal(in, 50);
  assert_int_equal(out, 7);
  assert_int_equal(count_words(a), 50);
  char *b = strdup(bench_prompts_get(p, 4, &in, &out));
  assert_string_not_equal(a, b);
  assert_string_equal(bench_prompts_get(p, 3, &in, &out), a); /* a pure function of the index */
  bench_prompts_destroy(p);
  cfg.seed = 2;
  p = bench_prompts_create(&cfg);
  assert_string_not_equal(bench_prompts_get(p, 3, &in, &out), a);
  bench_prompts_destroy(p);
  bench_prompts_destroy(NULL);
  free(a);
  free(b);
}

static void test_goodput_objectives(void **state) {
  (void)state;
  char err[160];
  bench_slo g = {-1, -1, -1};
  assert_int_equal(bench_slo_parse("ttft:500", &g, err, sizeof err), 0);
  assert_int_equal(bench_slo_parse("tpot:50,e2el:2000.5", &g, err, sizeof err), 0);
  assert_near(g.ttft_ms, 500, 0);
  assert_near(g.tpot_ms, 50, 0);
  assert_near(g.e2el_ms, 2000.5, 0);
  /* every objective set must hold; a value equal to it meets it (vLLM: <=) */
  assert_true(bench_slo_met(&g, 500, 50, 2000.5));
  assert_false(bench_slo_met(&g, 500.1, 10, 10));
  assert_false(bench_slo_met(&g, 10, 50.1, 10));
  assert_false(bench_slo_met(&g, 10, 10, 2001));
  bench_slo only_ttft = {100, -1, -1};
  assert_true(bench_slo_met(&only_ttft, 99, 1e9, 1e9));
  const char *bad[] = {"", "ttft", "ttft:", "ttft:-1", "ttft:5x", "itl:5", "tpot:5;e2el:1", NULL};
  for (int i = 0; bad[i]; i++) {
    bench_slo x = {-1, -1, -1};
    assert_int_equal(bench_slo_parse(bad[i], &x, err, sizeof err), -1);
    assert_true(err[0] != '\0');
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_percentiles_match_numpy_linear),
      cmocka_unit_test(test_goodput_objectives),
      cmocka_unit_test(test_rng_reproducible_and_exponential_mean),
      cmocka_unit_test(test_random_prompts_by_seed_and_index),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
