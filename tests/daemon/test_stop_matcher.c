/* Stop-string matcher tests: stop strings across token boundaries, the earliest occurrence, held
 * text released once it can no longer start a stop string, multi-byte stop strings, the matcher's
 * own output fed back, no stop strings. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "engine/stop_matcher.h"

/* Feeds the deltas; returns the released text and whether it stopped. */
static bool feed(const char *const *stops, int n_stops, const char *const *deltas, int n, char *out) {
  servd_stop_matcher *m;
  assert_int_equal(servd_stop_matcher_create(stops, n_stops, &m), 0);
  bool stopped = false;
  out[0] = 0;
  for (int i = 0; i < n && !stopped; i++) {
    const char *t;
    size_t l;
    assert_int_equal(servd_stop_matcher_push(m, deltas[i], strlen(deltas[i]), &t, &l, &stopped), 0);
    strncat(out, t, l);
  }
  if (!stopped) {
    const char *t;
    size_t l;
    servd_stop_matcher_flush(m, &t, &l);
    strncat(out, t, l);
  }
  servd_stop_matcher_free(m);
  return stopped;
}

static void test_stop_strings(void **st) {
  (void)st;
  char out[256];
  const char *stops[] = {"END", "\n\n", ""};
  const char *d1[] = {"Hello E", "N", "D more"};
  assert_true(feed(stops, 3, d1, 3, out));
  assert_string_equal(out, "Hello ");
  const char *d2[] = {"a\n", "\nb"};
  assert_true(feed(stops, 3, d2, 2, out));
  assert_string_equal(out, "a");
  const char *d3[] = {"EN", "x", "E"}; /* prefix that does not complete, and one left at the end */
  assert_false(feed(stops, 3, d3, 3, out));
  assert_string_equal(out, "ENxE");
  /* earliest occurrence wins even when another stop string completes first in the stream */
  const char *s2[] = {"xyz", "yq"};
  const char *d4[] = {"x", "y", "q"};
  assert_true(feed(s2, 2, d4, 3, out));
  assert_string_equal(out, "x");
  const char *s3[] = {"abcd", "bc"};
  const char *d5[] = {"ab", "c"};
  assert_true(feed(s3, 2, d5, 2, out));
  assert_string_equal(out, "a");
  /* held text is released as soon as it can no longer start a stop string */
  servd_stop_matcher *m;
  const char *s4[] = {"<|end|>"};
  assert_int_equal(servd_stop_matcher_create(s4, 1, &m), 0);
  const char *t;
  size_t l;
  bool stopped;
  servd_stop_matcher_push(m, "ok <|e", 6, &t, &l, &stopped);
  assert_int_equal(l, 3);
  assert_memory_equal(t, "ok ", 3);
  servd_stop_matcher_push(m, "x", 1, &t, &l, &stopped);
  assert_int_equal(l, 4);
  assert_memory_equal(t, "<|ex", 4);
  assert_false(stopped);
  /* multi-byte: a stop string made of one emoji split across deltas */
  servd_stop_matcher_free(m);
  const char *s5[] = {"\xF0\x9F\x98\x80"};
  const char *d6[] = {"smile \xF0\x9F", "\x98\x80 after"};
  assert_true(feed(s5, 1, d6, 2, out));
  assert_string_equal(out, "smile ");
  /* the matcher's own output fed back in (a caller chaining calls) is read before it is overwritten */
  {
    const char *s6[] = {"zz"};
    servd_stop_matcher *m6;
    assert_int_equal(servd_stop_matcher_create(s6, 1, &m6), 0);
    char big[1000];
    memset(big, 'a', sizeof big);
    bool st6;
    servd_stop_matcher_push(m6, "abc", 3, &t, &l, &st6);
    assert_int_equal(l, 3);
    servd_stop_matcher_push(m6, t, l, &t, &l, &st6); /* "abc" again, from its own buffer */
    assert_int_equal(l, 3);
    assert_memory_equal(t, "abc", 3);
    servd_stop_matcher_push(m6, big, sizeof big, &t, &l, &st6); /* grows the buffers */
    assert_int_equal(l, sizeof big);
    servd_stop_matcher_free(m6);
  }
  /* no stop strings: pass through */
  const char *d7[] = {"a", "b"};
  assert_false(feed(NULL, 0, d7, 2, out));
  assert_string_equal(out, "ab");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_stop_strings),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
