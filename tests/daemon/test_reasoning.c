/* The thought/answer splitter (api/reasoning.c) against hand-written expectations: whole outputs,
 * the same outputs cut into pieces at every byte (markers split across stream chunks), no end
 * marker, no thought at all, a thought the prompt opened, and what is held back while streaming. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "api/reasoning.h"

typedef struct got {
  char think[256], answer[256];
  int pieces;
  bool order_ok; /* no thought after the answer began */
} got;

static void collect(void *ud, bool thinking, const char *s, size_t n) {
  got *g = ud;
  assert_true(n > 0);
  char *dst = thinking ? g->think : g->answer;
  size_t have = strlen(dst);
  assert_true(have + n < sizeof g->think);
  memcpy(dst + have, s, n);
  dst[have + n] = '\0';
  if (thinking && g->answer[0]) g->order_ok = false;
  g->pieces++;
}

/* Splits text fed in pieces of `step` bytes (0: whole) and returns what came out. */
static got split(const char *start, const char *end, bool opened, const char *text, size_t step) {
  got g;
  memset(&g, 0, sizeof g);
  g.order_ok = true;
  api_think t;
  assert_true(api_think_init(&t, start, end, opened));
  size_t n = strlen(text);
  if (step == 0) step = n ? n : 1;
  for (size_t at = 0; at < n; at += step)
    assert_int_equal(api_think_feed(&t, text + at, n - at < step ? n - at : step, false, collect, &g), 0);
  assert_int_equal(api_think_feed(&t, NULL, 0, true, collect, &g), 0);
  api_think_free(&t);
  return g;
}

static const struct {
  const char *name;
  bool opened;
  const char *text, *think, *answer;
} cases[] = {
    {"qwen3", false, "<think>\nThe user asks. Paris.\n</think>\n\nParis.", "The user asks. Paris.", "Paris."},
    {"no end marker", false, "<think>\nstill thinking about it  \n", "still thinking about it", ""},
    {"no thought", false, "Hello <think>there</think>", "", "Hello <think>there</think>"},
    {"no thought, leading space kept", false, "  Hi", "", "  Hi"},
    {"whitespace before the marker", false, "\n <think>a</think>b", "a", "b"},
    {"empty thought", false, "<think>\n\n</think>\n\nOK", "", "OK"},
    {"a start marker cut short", false, "<thin", "", "<thin"},
    {"not the marker after all", false, "<thing>", "", "<thing>"},
    {"only whitespace", false, " \n", "", " \n"},
    {"empty output", false, "", "", ""},
    {"the prompt opened it", true, "\nstep 1\nstep 2\n</think>\n\nDone.", "step 1\nstep 2", "Done."},
    {"opened, no end", true, "abc </thi", "abc </thi", ""},
    {"opened, answer only", true, "</think>Answer", "", "Answer"},
    {"a second end marker is answer", false, "<think>x</think>y</think>z", "x", "y</think>z"},
    {"tool call after the thought", false, "<think>call f</think>\n<tool_call>\n{\"name\": \"f\"}\n</tool_call>",
     "call f", "<tool_call>\n{\"name\": \"f\"}\n</tool_call>"},
    {"UTF-8", false, "<think>d\xc3\xa9j\xc3\xa0 vu</think>\xe2\x9c\x93", "d\xc3\xa9j\xc3\xa0 vu", "\xe2\x9c\x93"},
};

static void test_cases(void **st) {
  (void)st;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    size_t n = strlen(cases[i].text);
    for (size_t step = 0; step <= (n ? n : 1); step++) {
      got g = split("<think>", "</think>", cases[i].opened, cases[i].text, step);
      if (strcmp(g.think, cases[i].think) || strcmp(g.answer, cases[i].answer) || !g.order_ok)
        fail_msg("%s (pieces of %zu): thought '%s' answer '%s', want '%s' and '%s'", cases[i].name, step, g.think,
                 g.answer, cases[i].think, cases[i].answer);
    }
  }
}

/* Other markers (Magistral's), and markers the splitter cannot take. */
static void test_markers(void **st) {
  (void)st;
  got g = split("[THINK]", "[/THINK]", false, "[THINK]plan[/THINK]result", 3);
  assert_string_equal(g.think, "plan");
  assert_string_equal(g.answer, "result");
  api_think t;
  assert_false(api_think_init(&t, "<think>", "", false));
  api_think_free(&t);
  assert_false(api_think_init(&t, "", "</think>", false)); /* no start marker and not opened */
  api_think_free(&t);
  char long_marker[64];
  memset(long_marker, 'x', sizeof long_marker - 1);
  long_marker[sizeof long_marker - 1] = '\0';
  assert_false(api_think_init(&t, "<think>", long_marker, false));
  api_think_free(&t);
}

/* Streaming: what is out after each piece, before the end. A marker's beginning and whitespace that
 * may precede the end marker are held; the rest goes out at once. */
static void test_holdback(void **st) {
  (void)st;
  static const struct {
    const char *piece, *think, *answer; /* everything out after the piece */
  } steps[] = {
      {"<th", "", ""},                 /* may be the start marker */
      {"ink>\n", "", ""},              /* the marker and the whitespace after it are dropped */
      {"Let me", "Let me", ""},        /* thought goes out as it comes */
      {" see", "Let me see", ""},      /* ... with the space it starts with */
      {".\n", "Let me see.", ""},      /* whitespace may precede the end marker: held */
      {"</", "Let me see.", ""},       /* may be the end marker */
      {"b>", "Let me see.\n</b>", ""}, /* it was not: out, whitespace included */
      {"\n</think>", "Let me see.\n</b>", ""},
      {"\n\n", "Let me see.\n</b>", ""}, /* whitespace after the end marker is dropped */
      {"Yes", "Let me see.\n</b>", "Yes"},
      {" ", "Let me see.\n</b>", "Yes "}, /* the answer's own whitespace is kept */
  };
  got g;
  memset(&g, 0, sizeof g);
  g.order_ok = true;
  api_think t;
  assert_true(api_think_init(&t, "<think>", "</think>", false));
  for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
    assert_int_equal(api_think_feed(&t, steps[i].piece, strlen(steps[i].piece), false, collect, &g), 0);
    if (strcmp(g.think, steps[i].think) || strcmp(g.answer, steps[i].answer))
      fail_msg("after piece %zu '%s': thought '%s' answer '%s', want '%s' and '%s'", i, steps[i].piece, g.think,
               g.answer, steps[i].think, steps[i].answer);
    assert_int_equal(api_think_thinking(&t), i >= 1 && i <= 6);
  }
  assert_int_equal(api_think_feed(&t, NULL, 0, true, collect, &g), 0);
  assert_false(api_think_thinking(&t));
  /* After the end, text passes through as answer. */
  assert_int_equal(api_think_feed(&t, "<think>", 7, false, collect, &g), 0);
  assert_string_equal(g.answer, "Yes <think>");
  api_think_free(&t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cases),
      cmocka_unit_test(test_markers),
      cmocka_unit_test(test_holdback),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
