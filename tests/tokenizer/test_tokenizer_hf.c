/* servd's tokenizer against Hugging Face `tokenizers`: the expected ids and texts were produced by
 * gen_fixtures.py with the tokenizers library on the same tokenizer.json files.
 *   test_tokenizer_hf DIR NAME...   (DIR/NAME.expect.json for each NAME) */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "servd/tokenizer.h"

static const char *g_dir;
static char **g_names;
static int g_n_names;

static size_t unhex(const char *h, char *out) {
  size_t n = strlen(h) / 2;
  for (size_t i = 0; i < n; i++) {
    unsigned v;
    sscanf(h + 2 * i, "%2x", &v);
    out[i] = (char)v;
  }
  return n;
}

static void print_ids(const char *label, const int32_t *ids, size_t n) {
  fprintf(stderr, "  %s (%zu):", label, n);
  for (size_t i = 0; i < n && i < 64; i++) fprintf(stderr, " %d", ids[i]);
  fprintf(stderr, "\n");
}

static void check_one(const char *name) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s.expect.json", g_dir, name);
  json_error_t err;
  json_t *exp = json_load_file(path, 0, &err);
  if (!exp) fail_msg("cannot read %s: %s", path, err.text);
  snprintf(path, sizeof path, "%s/%s", g_dir, json_string_value(json_object_get(exp, "tokenizer")));
  servd_tokenizer *t;
  int rc = servd_tokenizer_load_file(path, &t);
  if (rc) fail_msg("load %s: %s", path, servd_last_error());
  assert_int_equal(servd_tokenizer_vocab_size(t), json_integer_value(json_object_get(exp, "vocab_size")));

  servd_detok *d;
  assert_int_equal(servd_detok_create(t, false, &d), 0);
  json_t *enc = json_object_get(exp, "encode");
  int mismatches = 0, checked = 0;
  char *buf = malloc(1 << 20);
  for (size_t i = 0; i < json_array_size(enc); i++) {
    json_t *c = json_array_get(enc, i), *want = json_object_get(c, "ids");
    size_t len = unhex(json_string_value(json_object_get(c, "text_hex")), buf);
    bool add = json_is_true(json_object_get(c, "add_special"));
    int32_t *ids;
    int n;
    assert_int_equal(servd_tokenizer_encode(t, buf, len, add, &ids, &n), 0);
    bool same = (size_t)n == json_array_size(want);
    for (int k = 0; same && k < n; k++) same = ids[k] == json_integer_value(json_array_get(want, (size_t)k));
    if (!same) {
      if (mismatches++ < 5) {
        fprintf(stderr, "%s: encode mismatch for \"%.*s\" (add_special %d)\n", name, (int)len, buf, add);
        print_ids("servd", ids, (size_t)n);
        int32_t w[4096];
        size_t nw = json_array_size(want);
        for (size_t k = 0; k < nw && k < 4096; k++) w[k] = (int32_t)json_integer_value(json_array_get(want, k));
        print_ids("hf   ", w, nw);
      }
    }
    checked++;
    /* round trip for valid UTF-8, wherever Hugging Face's holds too (not across an added token that
     * strips the spaces around it, nor with the template's BOS) */
    {
      char *txt;
      size_t tl;
      bool roundtrip = json_is_true(json_object_get(c, "roundtrip"));
      assert_int_equal(servd_tokenizer_decode(t, ids, n, false, &txt, &tl), 0);
      if (roundtrip && (tl != len || memcmp(txt, buf, len))) {
        if (mismatches++ < 5)
          fprintf(stderr, "%s: round trip failed for \"%.*s\" -> \"%s\"\n", name, (int)len, buf, txt);
      }
      /* incremental detokenization concatenates to the same text */
      servd_detok_reset(d);
      size_t o = 0;
      char *inc = malloc(tl + 1);
      for (int k = 0; k < n; k++) {
        const char *delta;
        size_t dl;
        assert_int_equal(servd_detok_push(d, ids[k], &delta, &dl), 0);
        assert_true(o + dl <= tl);
        memcpy(inc + o, delta, dl);
        o += dl;
      }
      const char *delta;
      size_t dl;
      servd_detok_flush(d, &delta, &dl);
      assert_int_equal(dl, 0);
      if (o != tl || memcmp(inc, txt, tl)) {
        if (mismatches++ < 5) fprintf(stderr, "%s: incremental decode differs for \"%.*s\"\n", name, (int)len, buf);
      }
      free(inc);
      free(txt);
    }
    free(ids);
  }

  json_t *dec = json_object_get(exp, "decode");
  char *got = malloc(1 << 20);
  for (size_t i = 0; i < json_array_size(dec); i++) {
    json_t *c = json_array_get(dec, i), *jids = json_object_get(c, "ids");
    bool skip = json_is_true(json_object_get(c, "skip_special"));
    int32_t ids[64];
    int n = (int)json_array_size(jids);
    for (int k = 0; k < n; k++) ids[k] = (int32_t)json_integer_value(json_array_get(jids, (size_t)k));
    size_t wl = unhex(json_string_value(json_object_get(c, "text_hex")), buf);
    char *txt;
    size_t tl;
    assert_int_equal(servd_tokenizer_decode(t, ids, n, skip, &txt, &tl), 0);
    if (tl != wl || memcmp(txt, buf, wl)) {
      if (mismatches++ < 5) {
        fprintf(stderr, "%s: decode mismatch (skip %d): servd \"%s\" hf \"%.*s\"\n", name, skip, txt, (int)wl, buf);
        print_ids("ids", ids, (size_t)n);
      }
    }
    /* incremental with any split: deltas never end inside a UTF-8 sequence and add up to decode */
    servd_detok *di;
    assert_int_equal(servd_detok_create(t, skip, &di), 0);
    size_t o = 0;
    for (int k = 0; k <= n; k++) {
      const char *delta;
      size_t dl;
      if (k < n) assert_int_equal(servd_detok_push(di, ids[k], &delta, &dl), 0);
      else servd_detok_flush(di, &delta, &dl);
      /* each delta is valid UTF-8 on its own (the decoder's output is; here: no cut sequence) */
      for (size_t q = 0; q < dl;) {
        unsigned char ch = (unsigned char)delta[q];
        size_t cl = ch < 0x80 ? 1 : ch < 0xE0 ? 2 : ch < 0xF0 ? 3 : 4;
        assert_true(q + cl <= dl);
        q += cl;
      }
      memcpy(got + o, delta, dl);
      o += dl;
    }
    servd_detok_free(di);
    if (o != wl || memcmp(got, buf, wl)) {
      if (mismatches++ < 5) fprintf(stderr, "%s: incremental decode differs from hf for %d ids\n", name, n);
    }
    free(txt);
    checked++;
  }
  /* pairs through the pair template (cross-encoders), with their token type ids */
  json_t *pairs = json_object_get(exp, "pairs");
  for (size_t i = 0; i < json_array_size(pairs); i++) {
    json_t *c = json_array_get(pairs, i), *want = json_object_get(c, "ids"), *wtypes = json_object_get(c, "type_ids");
    size_t la = unhex(json_string_value(json_object_get(c, "a_hex")), buf);
    size_t lb = unhex(json_string_value(json_object_get(c, "b_hex")), got);
    int32_t *ids, *types;
    int n;
    assert_int_equal(servd_tokenizer_encode_pair(
                         t, buf, la, got, lb, (int)json_integer_value(json_object_get(c, "max_len")), &ids, &types, &n),
                     0);
    bool same = (size_t)n == json_array_size(want);
    for (int k = 0; same && k < n; k++)
      same = ids[k] == json_integer_value(json_array_get(want, (size_t)k)) &&
             types[k] == json_integer_value(json_array_get(wtypes, (size_t)k));
    if (!same && mismatches++ < 5) {
      fprintf(stderr, "%s: pair %zu mismatch (\"%.*s\", \"%.*s\")\n", name, i, (int)la, buf, (int)lb, got);
      print_ids("servd", ids, (size_t)n);
    }
    free(ids);
    free(types);
    checked++;
  }
  fprintf(stderr, "%s: %d cases, %d mismatches\n", name, checked, mismatches);
  free(got);
  free(buf);
  servd_detok_free(d);
  servd_tokenizer_free(t);
  json_decref(exp);
  assert_int_equal(mismatches, 0);
}

static void test_against_hf(void **state) {
  (void)state;
  for (int i = 0; i < g_n_names; i++) check_one(g_names[i]);
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s FIXTURE_DIR NAME...\n", argv[0]);
    return 2;
  }
  g_dir = argv[1];
  g_names = argv + 2;
  g_n_names = argc - 2;
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_against_hf)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
