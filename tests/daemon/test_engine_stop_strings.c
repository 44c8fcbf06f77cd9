/* Stop strings over streamed text deltas: held-back prefixes, matches across deltas, earliest match,
 * pass-through without stops; expected outputs written out by hand. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine/stop_strings.h"

/* Feeds deltas, collecting released text; returns whether a stop string was hit. */
static bool feed(servd_stopper *s, const char *const *deltas, int n, char *out, size_t cap) {
  size_t used = 0;
  out[0] = 0;
  bool stopped = false;
  for (int i = 0; i < n && !stopped; i++) {
    const char *t;
    size_t l;
    assert_int_equal(servd_stopper_push(s, deltas[i], strlen(deltas[i]), &t, &l, &stopped), 0);
    assert_true(used + l < cap);
    memcpy(out + used, t, l);
    used += l;
    out[used] = 0;
  }
  if (!stopped) {
    const char *t;
    size_t l;
    assert_int_equal(servd_stopper_flush(s, &t, &l), 0);
    memcpy(out + used, t, l);
    out[used + l] = 0;
  }
  return stopped;
}

static void test_split_across_deltas(void **state) {
  (void)state;
  const char *stops[] = {"</end>"};
  servd_stopper s;
  assert_int_equal(servd_stopper_init(&s, stops, 1), 0);
  const char *d[] = {"Hello </", "e", "nd> more"};
  char out[64];
  assert_true(feed(&s, d, 3, out, sizeof out));
  assert_string_equal(out, "Hello ");
  servd_stopper_free(&s);
}

static void test_held_prefix_released(void **state) {
  (void)state;
  const char *stops[] = {"STOP"};
  servd_stopper s;
  assert_int_equal(servd_stopper_init(&s, stops, 1), 0);
  const char *t;
  size_t l;
  bool stopped;
  assert_int_equal(servd_stopper_push(&s, "abcST", 5, &t, &l, &stopped), 0);
  assert_false(stopped);
  assert_int_equal(l, 3); /* "ST" could begin "STOP": held */
  assert_memory_equal(t, "abc", 3);
  assert_int_equal(servd_stopper_push(&s, "x", 1, &t, &l, &stopped), 0);
  assert_int_equal(l, 3);
  assert_memory_equal(t, "STx", 3);
  servd_stopper_free(&s);
}

static void test_earliest_of_several(void **state) {
  (void)state;
  const char *stops[] = {"world", "lo w", ""};
  servd_stopper s;
  assert_int_equal(servd_stopper_init(&s, stops, 3), 0);
  const char *d[] = {"hello world"};
  char out[64];
  assert_true(feed(&s, d, 1, out, sizeof out));
  assert_string_equal(out, "hel");
  servd_stopper_free(&s);
}

static void test_no_match_flushes_all(void **state) {
  (void)state;
  const char *stops[] = {"\n\n"};
  servd_stopper s;
  assert_int_equal(servd_stopper_init(&s, stops, 1), 0);
  const char *d[] = {"a\n", "b\n"};
  char out[64];
  assert_false(feed(&s, d, 2, out, sizeof out));
  assert_string_equal(out, "a\nb\n");
  servd_stopper_free(&s);
}

static void test_passthrough(void **state) {
  (void)state;
  servd_stopper s;
  assert_int_equal(servd_stopper_init(&s, NULL, 0), 0);
  const char *d[] = {"x", "yz"};
  char out[64];
  assert_false(feed(&s, d, 2, out, sizeof out));
  assert_string_equal(out, "xyz");
  servd_stopper_free(&s);
  servd_stopper_free(NULL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_split_across_deltas), cmocka_unit_test(test_held_prefix_released),
      cmocka_unit_test(test_earliest_of_several), cmocka_unit_test(test_no_match_flushes_all),
      cmocka_unit_test(test_passthrough),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
