/* Tokenizer unit tests without Python: a hand-made byte-level vocabulary whose encodings are worked
 * out by hand, refusals of unsupported tokenizer.json constructs, incremental detokenization of
 * split UTF-8, invalid input, long inputs and concurrent use. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "servd/tokenizer.h"

/* GPT-2's byte -> code point map, written out independently of the library. */
static unsigned byte_cp(int b) {
  if ((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)) return (unsigned)b;
  int n = 0;
  for (int x = 0; x < b; x++)
    if (!((x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF))) n++;
  return 256u + (unsigned)n;
}

static void put_cp(char **p, unsigned cp) {
  if (cp == '"' || cp == '\\') {
    *(*p)++ = '\\';
    *(*p)++ = (char)cp;
  } else if (cp < 0x80) {
    *(*p)++ = (char)cp;
  } else if (cp < 0x800) {
    *(*p)++ = (char)(0xC0 | (cp >> 6));
    *(*p)++ = (char)(0x80 | (cp & 0x3F));
  } else {
    *(*p)++ = (char)(0xE0 | (cp >> 12));
    *(*p)++ = (char)(0x80 | ((cp >> 6) & 0x3F));
    *(*p)++ = (char)(0x80 | (cp & 0x3F));
  }
}

/* ids 0..255: the byte b has id b. Then merges (rank order):
 *   "h e" -> 256 "he", "l l" -> 257 "ll", "he ll" -> 258 "hell", "hell o" -> 259 "hello",
 *   "Ġ w" -> 260 "Ġw", "1 2" -> 261 "12"
 * added: 262 "<|end|>" special, 263 "[X]" not special.
 * pre and post are spliced in as JSON text; merges_pairs picks the [a, b] form. */
static char *make_json(const char *pre, const char *post, bool merges_pairs, const char *extra_model) {
  char *buf = malloc(1 << 16), *p = buf;
  p += sprintf(p,
               "{\"version\":\"1.0\",\"added_tokens\":[{\"id\":262,\"content\":\"<|end|>\",\"special\":true},"
               "{\"id\":263,\"content\":\"[X]\",\"special\":false}],\"normalizer\":null,"
               "\"pre_tokenizer\":%s,\"post_processor\":%s,\"decoder\":{\"type\":\"ByteLevel\"},"
               "\"model\":{\"type\":\"BPE\",%s\"vocab\":{",
               pre, post, extra_model ? extra_model : "");
  for (int b = 0; b < 256; b++) {
    *p++ = '"';
    put_cp(&p, byte_cp(b));
    p += sprintf(p, "\":%d,", b);
  }
  unsigned G = byte_cp(' ');
  p += sprintf(p, "\"he\":256,\"ll\":257,\"hell\":258,\"hello\":259,\"");
  put_cp(&p, G);
  p += sprintf(p, "w\":260,\"12\":261,\"<|end|>\":262},\"merges\":[");
  const char *m[6][2] = {{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {NULL, "w"}, {"1", "2"}};
  for (int i = 0; i < 6; i++) {
    char a[8], *q = a;
    if (m[i][0]) {
      strcpy(a, m[i][0]);
    } else {
      put_cp(&q, G);
      *q = 0;
    }
    if (merges_pairs) p += sprintf(p, "%s[\"%s\",\"%s\"]", i ? "," : "", a, m[i][1]);
    else p += sprintf(p, "%s\"%s %s\"", i ? "," : "", a, m[i][1]);
  }
  p += sprintf(p, "]}}");
  return buf;
}

static const char *BYTELEVEL = "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true}";

static servd_tokenizer *load(const char *pre, const char *post, bool pairs) {
  char *j = make_json(pre, post, pairs, NULL);
  servd_tokenizer *t;
  int rc = servd_tokenizer_load(j, strlen(j), &t);
  if (rc) fail_msg("load: %s", servd_last_error());
  free(j);
  return t;
}

static void expect_ids(servd_tokenizer *t, const char *text, size_t len, bool add, const int32_t *want, int n_want) {
  int32_t *ids;
  int n;
  assert_int_equal(servd_tokenizer_encode(t, text, len, add, &ids, &n), 0);
  if (n != n_want || memcmp(ids, want, (size_t)n * sizeof *ids)) {
    fprintf(stderr, "encode \"%.*s\": got", (int)len, text);
    for (int i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, "\n");
    fail();
  }
  free(ids);
}

static void test_hand_vocab(void **st) {
  (void)st;
  for (int pairs = 0; pairs < 2; pairs++) { /* both merges formats give the same tokenizer */
    servd_tokenizer *t = load(BYTELEVEL, "null", pairs);
    assert_int_equal(servd_tokenizer_vocab_size(t), 264);
    /* "hello" -> h e l l o -> he l l o -> he ll o -> hell o -> hello */
    expect_ids(t, "hello", 5, false, (int32_t[]){259}, 1);
    /* " world": GPT-2 split keeps " world" together; Ġ w -> Ġw, then o r l d bytes */
    expect_ids(t, " world", 6, false, (int32_t[]){260, 'o', 'r', 'l', 'd'}, 5);
    /* "hell<|end|>[X]x": added tokens split first; "hell" -> he ll -> hell */
    expect_ids(t, "hell<|end|>[X]x", 15, false, (int32_t[]){258, 262, 263, 'x'}, 4);
    /* "123": the GPT-2 pattern keeps digits together: 1 2 -> 12, then 3 */
    expect_ids(t, "123", 3, false, (int32_t[]){261, '3'}, 2);
    /* "a  b": ["a", " ", " b"] (\s+(?!\S) leaves the last space to " b") */
    expect_ids(t, "a  b", 4, false, (int32_t[]){'a', ' ', ' ', 'b'}, 4);
    /* invalid UTF-8 -> U+FFFD (EF BF BD) per maximal subpart: E2 82 is one subpart, FF another */
    expect_ids(t, "\xE2\x82z\xFF", 4, false, (int32_t[]){0xEF, 0xBF, 0xBD, 'z', 0xEF, 0xBF, 0xBD}, 7);
    servd_tokenizer_free(t);
  }
  /* Digits(individual) then ByteLevel: "123" -> 1, 2, 3 never merge */
  servd_tokenizer *t =
      load("{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Digits\",\"individual_digits\":true},"
           "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true}]}",
           "null", false);
  expect_ids(t, "123", 3, false, (int32_t[]){'1', '2', '3'}, 3);
  servd_tokenizer_free(t);
  /* the smollm hint does the same */
  char *j = make_json(BYTELEVEL, "null", false, "\"pre\":\"smollm\",");
  assert_int_equal(servd_tokenizer_load(j, strlen(j), &t), 0);
  free(j);
  expect_ids(t, "123", 3, false, (int32_t[]){'1', '2', '3'}, 3);
  servd_tokenizer_free(t);
  /* TemplateProcessing: "<|end|> $A <|end|>" */
  t = load(BYTELEVEL,
           "{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<|end|>\",\"type_id\":0}},"
           "{\"Sequence\":{\"id\":\"A\",\"type_id\":0}},{\"SpecialToken\":{\"id\":\"<|end|>\",\"type_id\":0}}],"
           "\"pair\":[],\"special_tokens\":{\"<|end|>\":{\"id\":\"<|end|>\",\"ids\":[262],\"tokens\":[\"<|end|>\"]}}}",
           false);
  expect_ids(t, "hello", 5, true, (int32_t[]){262, 259, 262}, 3);
  const int32_t *pre, *suf;
  int npre, nsuf;
  servd_tokenizer_special_affixes(t, &pre, &npre, &suf, &nsuf);
  assert_int_equal(npre, 1);
  assert_int_equal(nsuf, 1);
  assert_int_equal(pre[0], 262);
  assert_int_equal(suf[0], 262);
  expect_ids(t, "hello", 5, false, (int32_t[]){259}, 1);
  servd_tokenizer_free(t);
}

static void test_lookups_and_decode(void **st) {
  (void)st;
  servd_tokenizer *t = load(BYTELEVEL, "null", false);
  assert_int_equal(servd_tokenizer_token_id(t, "<|end|>"), 262);
  assert_int_equal(servd_tokenizer_token_id(t, "hello"), 259);
  assert_int_equal(servd_tokenizer_token_id(t, "nope"), -1);
  assert_true(servd_tokenizer_is_special(t, 262));
  assert_false(servd_tokenizer_is_special(t, 263));
  assert_false(servd_tokenizer_is_special(t, 9999));
  size_t l;
  const char *pc = servd_tokenizer_token_to_piece(t, 260, &l);
  assert_int_equal(l, 2);
  assert_memory_equal(pc, " w", 2);
  assert_null(servd_tokenizer_token_to_piece(t, 264, &l));
  char *txt;
  int32_t ids[] = {259, 262, 260, 263};
  assert_int_equal(servd_tokenizer_decode(t, ids, 4, false, &txt, &l), 0);
  assert_string_equal(txt, "hello<|end|> w[X]");
  free(txt);
  assert_int_equal(servd_tokenizer_decode(t, ids, 4, true, &txt, &l), 0);
  assert_string_equal(txt, "hello w[X]"); /* only special tokens are skipped */
  free(txt);
  int32_t bad[] = {1, 264};
  assert_int_equal(servd_tokenizer_decode(t, bad, 2, false, &txt, &l), SERVD_ERANGE);
  /* bytes of "€" (E2 82 AC) as three tokens, then an invalid continuation */
  int32_t euro[] = {0xE2, 0x82, 0xAC, 0xE2, 'a', 0xF0, 0x9F};
  assert_int_equal(servd_tokenizer_decode(t, euro, 7, false, &txt, &l), 0);
  assert_string_equal(txt, "\xE2\x82\xAC\xEF\xBF\xBD"
                           "a\xEF\xBF\xBD");
  free(txt);
  servd_detok *d;
  assert_int_equal(servd_detok_create(t, false, &d), 0);
  const char *want[] = {"",
                        "",
                        "\xE2\x82\xAC",
                        "",
                        ("\xEF\xBF\xBD"
                         "a"),
                        "",
                        ""};
  for (int i = 0; i < 7; i++) {
    const char *delta;
    size_t dl;
    assert_int_equal(servd_detok_push(d, euro[i], &delta, &dl), 0);
    assert_int_equal(dl, strlen(want[i]));
    assert_memory_equal(delta, want[i], dl);
  }
  const char *delta;
  size_t dl;
  servd_detok_flush(d, &delta, &dl);
  assert_int_equal(dl, 3); /* the incomplete F0 9F becomes one U+FFFD */
  assert_int_equal(servd_detok_push(d, -1, &delta, &dl), SERVD_ERANGE);
  servd_detok_free(d);
  servd_detok_free(NULL);
  servd_tokenizer_free(t);
  servd_tokenizer_free(NULL);
}

static void expect_refused(const char *json, int code, const char *needle) {
  servd_tokenizer *t = (servd_tokenizer *)1;
  int rc = servd_tokenizer_load(json, strlen(json), &t);
  if (rc != code || !strstr(servd_last_error(), needle))
    fail_msg("expected %d mentioning \"%s\", got %d: %s", code, needle, rc, servd_last_error());
  assert_null(t);
}

static void test_refusals(void **st) {
  (void)st;
  expect_refused("{\"model\":", SERVD_EFORMAT, "not valid JSON");
  expect_refused("[]", SERVD_EFORMAT, "model");
  expect_refused("{\"model\":{\"type\":\"Unigram\",\"vocab\":[]}}", SERVD_EUNSUPPORTED, "model.type");
  expect_refused("{\"model\":{\"type\":\"WordPiece\",\"vocab\":{}}}", SERVD_EFORMAT, "model.unk_token");
  expect_refused("{\"normalizer\":{\"type\":\"NFC\"},\"model\":{\"type\":\"WordPiece\",\"vocab\":{\"[UNK]\":0}}}",
                 SERVD_EUNSUPPORTED, "normalizer.type");
  expect_refused(
      "{\"pre_tokenizer\":{\"type\":\"Whitespace\"},\"model\":{\"type\":\"WordPiece\",\"vocab\":{\"[UNK]\":0}}}",
      SERVD_EUNSUPPORTED, "pre_tokenizer.type");
  /* a template adding an id that has no token (1 here) could not be decoded */
  expect_refused("{\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\"}},"
                 "{\"Sequence\":{\"id\":\"A\"}}],\"special_tokens\":{\"<s>\":{\"id\":\"<s>\",\"ids\":[1]}}},"
                 "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":2},\"merges\":[]}}",
                 SERVD_EFORMAT, "without a token");
  /* byte_fallback (SentencePiece-style) with the byte-level alphabet makes no sense */
  char *bf = make_json(BYTELEVEL, "null", false, "\"byte_fallback\":true,");
  expect_refused(bf, SERVD_EUNSUPPORTED, "ByteLevel cannot be combined");
  free(bf);
  expect_refused("{\"decoder\":{\"type\":\"Strip\",\"content\":\" \",\"start\":1,\"stop\":1},"
                 "\"model\":{\"type\":\"BPE\",\"vocab\":{},\"merges\":[]}}",
                 SERVD_EUNSUPPORTED, "decoder: Strip");
  expect_refused("{\"normalizer\":{\"type\":\"Replace\",\"pattern\":{\"Regex\":\" \"},\"content\":\"x\"},"
                 "\"model\":{\"type\":\"BPE\",\"vocab\":{},\"merges\":[]}}",
                 SERVD_EUNSUPPORTED, "normalizer: Replace");
  expect_refused(
      "{\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Metaspace\","
      "\"replacement\":\"_\"},{\"type\":\"Digits\"}]},\"model\":{\"type\":\"BPE\",\"vocab\":{},\"merges\":[]}}",
      SERVD_EUNSUPPORTED, "pre_tokenizer.pretokenizers[1]");
  expect_refused("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":-1},\"merges\":[]}}", SERVD_EFORMAT, "model.vocab");
  expect_refused("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":16000000},\"merges\":[]}}", SERVD_EFORMAT,
                 "largest id");
  expect_refused("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[\"a b\"]}}", SERVD_EFORMAT,
                 "model.merges[0]");
  expect_refused("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[\"a\"]}}", SERVD_EFORMAT,
                 "model.merges[0]");
  expect_refused("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[[\"a\"]]}}", SERVD_EFORMAT,
                 "model.merges[0]");
  expect_refused("{\"added_tokens\":[{\"id\":1}],\"model\":{\"type\":\"BPE\",\"vocab\":{},\"merges\":[]}}",
                 SERVD_EFORMAT, "added_tokens[0]");
  char *j = make_json("{\"type\":\"Whitespace\"}", "null", false, NULL);
  expect_refused(j, SERVD_EUNSUPPORTED, "pre_tokenizer.type");
  free(j);
  j = make_json("{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":\"a\"},"
                "\"behavior\":\"Sideways\"}]}",
                "null", false, NULL);
  expect_refused(j, SERVD_EUNSUPPORTED, "pre_tokenizer.pretokenizers[0].behavior");
  free(j);
  j = make_json("{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(\"},\"behavior\":\"Isolated\"}", "null", false, NULL);
  expect_refused(j, SERVD_EUNSUPPORTED, "pre_tokenizer.pattern");
  free(j);
  j = make_json(BYTELEVEL, "{\"type\":\"RobertaProcessing\"}", false, NULL);
  expect_refused(j, SERVD_EUNSUPPORTED, "post_processor.type");
  free(j);
  j = make_json(BYTELEVEL, "{\"type\":\"BertProcessing\"}", false, NULL);
  expect_refused(j, SERVD_EFORMAT, "post_processor.cls");
  free(j);
  j = make_json(BYTELEVEL, "null", false, "\"pre\":\"qwen2\",");
  expect_refused(j, SERVD_EUNSUPPORTED, "model.pre");
  free(j);
  j = make_json(BYTELEVEL, "null", false, "\"continuing_subword_prefix\":\"##\",");
  expect_refused(j, SERVD_EUNSUPPORTED, "model.continuing_subword_prefix");
  free(j);
  /* a normalizer, written over make_json's "normalizer":null */
  j = make_json(BYTELEVEL, "null", false, NULL);
  char *k = malloc(strlen(j) + 64);
  strcpy(k, j);
  char *nn = strstr(k, "\"normalizer\":null");
  assert_non_null(nn);
  memmove(nn + 30, nn + 17, strlen(nn + 17) + 1);
  memcpy(nn, "\"normalizer\":{\"type\":\"NFC\"}   ", 30);
  expect_refused(k, SERVD_EUNSUPPORTED, "normalizer");
  free(k);
  free(j);
  assert_int_equal(servd_tokenizer_load_file("/nonexistent/tokenizer.json", &(servd_tokenizer *){NULL}), SERVD_EIO);
}

static void roundtrip(servd_tokenizer *t, const char *s, size_t n) {
  int32_t *ids;
  int k;
  assert_int_equal(servd_tokenizer_encode(t, s, n, false, &ids, &k), 0);
  char *txt;
  size_t l;
  assert_int_equal(servd_tokenizer_decode(t, ids, k, false, &txt, &l), 0);
  assert_int_equal(l, n);
  assert_memory_equal(txt, s, n);
  free(txt);
  free(ids);
}

static void test_long_inputs(void **st) {
  (void)st;
  servd_tokenizer *t = load(BYTELEVEL, "null", false);
  size_t n = 1 << 20;
  char *s = malloc(n * 4);
  memset(s, 'a', n);
  roundtrip(t, s, n); /* one pre-token of a million bytes */
  memset(s, ' ', n);
  roundtrip(t, s, n); /* a million spaces */
  for (size_t i = 0; i < n; i++) s[i] = "hello\n\t 1"[i % 9];
  roundtrip(t, s, n);
  for (size_t i = 0; i < n; i++) memcpy(s + 4 * i, "\xF0\x9F\x98\x80", 4);
  roundtrip(t, s, 4 * n);
  roundtrip(t, "", 0);
  free(s);
  servd_tokenizer_free(t);
}

typedef struct job {
  servd_tokenizer *t;
  int ok;
} job;

static void *worker(void *arg) {
  job *j = arg;
  const char *text = "hello world, hello <|end|> 12 123 hell [X] héllo 日本";
  int32_t *ref;
  int nref;
  servd_tokenizer_encode(j->t, text, strlen(text), false, &ref, &nref);
  j->ok = 1;
  for (int r = 0; r < 300; r++) {
    int32_t *ids;
    int n;
    if (servd_tokenizer_encode(j->t, text, strlen(text), false, &ids, &n) || n != nref ||
        memcmp(ids, ref, (size_t)n * sizeof *ids))
      j->ok = 0;
    free(ids);
  }
  free(ref);
  return NULL;
}

/* SentencePiece-style BPE, hand-computed. Vocabulary: 0 <unk>, 1 <s>, 2 </s>, 3 + b: <0xBB>,
 * 259 "▁", 260 "h", 261 "i", 262 "▁h", 263 "▁hi", 264 "é"; merges "▁ h", "▁h i". */
static servd_tokenizer *spm_load(bool byte_fallback, bool fuse_unk, const char *pre_norm) {
  char *buf = malloc(1 << 16), *p = buf;
  p += sprintf(p,
               "{\"added_tokens\":[{\"id\":0,\"content\":\"<unk>\",\"special\":true},"
               "{\"id\":1,\"content\":\"<s>\",\"special\":true},{\"id\":2,\"content\":\"</s>\",\"special\":true}],"
               "%s,\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\"}},"
               "{\"Sequence\":{\"id\":\"A\"}}],\"special_tokens\":{\"<s>\":{\"id\":\"<s>\",\"ids\":[1]}}},"
               "\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":{\"String\":"
               "\"\u2581\"},\"content\":\" \"},{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"},{\"type\":\"Strip\","
               "\"content\":\" \",\"start\":1,\"stop\":0}]},"
               "\"model\":{\"type\":\"BPE\",\"unk_token\":\"<unk>\",\"fuse_unk\":%s,\"byte_fallback\":%s,\"vocab\":{"
               "\"<unk>\":0,\"<s>\":1,\"</s>\":2,",
               pre_norm, fuse_unk ? "true" : "false", byte_fallback ? "true" : "false");
  for (int b = 0; b < 256; b++) p += sprintf(p, "\"<0x%02X>\":%d,", b, 3 + b);
  p += sprintf(p, "\"\u2581\":259,\"h\":260,\"i\":261,\"\u2581h\":262,\"\u2581hi\":263,\"\u00e9\":264},"
                  "\"merges\":[\"\u2581 h\",\"\u2581h i\"]}}");
  servd_tokenizer *t;
  if (servd_tokenizer_load(buf, strlen(buf), &t)) fail_msg("load: %s", servd_last_error());
  free(buf);
  return t;
}

static void spm_ids(servd_tokenizer *t, const char *text, bool add, const int32_t *want, int n_want) {
  int32_t *ids;
  int n;
  assert_int_equal(servd_tokenizer_encode(t, text, strlen(text), add, &ids, &n), 0);
  if (n != n_want || (n && memcmp(ids, want, (size_t)n * sizeof *ids))) {
    fprintf(stderr, "\"%s\":", text);
    for (int i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
    fail_msg("ids differ from the hand-computed ones");
  }
  free(ids);
}

static void expect_text(servd_tokenizer *t, const int32_t *ids, int n, bool skip, const char *want) {
  char *txt;
  size_t len;
  assert_int_equal(servd_tokenizer_decode(t, ids, n, skip, &txt, &len), 0);
  assert_string_equal(txt, want);
  /* streamed: the same text */
  servd_detok *d;
  assert_int_equal(servd_detok_create(t, skip, &d), 0);
  char got[256] = "";
  for (int i = 0; i <= n; i++) {
    const char *delta;
    size_t dl;
    if (i < n) assert_int_equal(servd_detok_push(d, ids[i], &delta, &dl), 0);
    else servd_detok_flush(d, &delta, &dl);
    strncat(got, delta, dl);
  }
  assert_string_equal(got, want);
  servd_detok_free(d);
  free(txt);
}

static void test_sentencepiece(void **st) {
  (void)st;
  static const char *forms[] = {
      /* legacy: a metaspace before every text segment, also after <s> */
      "\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Prepend\",\"prepend\":\"\u2581\"},"
      "{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"\u2581\"}]},\"pre_tokenizer\":null",
      /* prepend_scheme "first": only where the input starts, and not before a leading space */
      "\"normalizer\":null,\"pre_tokenizer\":{\"type\":\"Metaspace\",\"replacement\":\"\u2581\","
      "\"prepend_scheme\":\"first\",\"split\":false}"};
  for (int f = 0; f < 2; f++) {
    servd_tokenizer *t = spm_load(true, true, forms[f]);
    spm_ids(t, "", false, NULL, 0);
    spm_ids(t, "hi", false, (int32_t[]){263}, 1);
    spm_ids(t, "hi", true, (int32_t[]){1, 263}, 2);
    if (f == 0) {
      spm_ids(t, " hi", false, (int32_t[]){259, 263}, 2); /* "▁▁hi": ▁h first, then ▁hi */
      spm_ids(t, "<s>hi", false, (int32_t[]){1, 263}, 2);
    } else {
      spm_ids(t, " hi", false, (int32_t[]){263}, 1);
      spm_ids(t, "<s>hi", false, (int32_t[]){1, 260, 261}, 3);
    }
    spm_ids(t, "h\u00e9", false, (int32_t[]){262, 264}, 2);
    spm_ids(t, "h\u20ac", false, (int32_t[]){262, 3 + 0xE2, 3 + 0x82, 3 + 0xAC}, 4); /* € as bytes */
    servd_tokenizer_free(t);
  }
  servd_tokenizer *t = spm_load(true, true, forms[0]);
  expect_text(t, (int32_t[]){263}, 1, false, "hi");
  expect_text(t, (int32_t[]){259, 263}, 2, false, " hi"); /* one leading space stripped */
  expect_text(t, (int32_t[]){1, 263}, 2, false, "<s> hi");
  expect_text(t, (int32_t[]){1, 263}, 2, true, "hi");
  expect_text(t, (int32_t[]){263, 3 + 0xE2, 3 + 0x82, 3 + 0xAC, 263}, 5, false, "hi\u20ac hi");
  expect_text(t, (int32_t[]){3 + 0xE2, 3 + 0x82}, 2, false, "\xEF\xBF\xBD"); /* incomplete at the end */
  expect_text(t, (int32_t[]){3 + ' ', 263}, 2, false, " hi");                /* <0x20> is the stripped space */
  size_t pl;
  const char *piece = servd_tokenizer_token_to_piece(t, 3 + 0xE2, &pl);
  assert_int_equal(pl, 1);
  assert_int_equal((unsigned char)piece[0], 0xE2);
  servd_tokenizer_free(t);
  /* without byte_fallback: unknown characters are <unk>, fused or not */
  t = spm_load(false, true, forms[0]);
  spm_ids(t, "\u20ac\u20ach", false, (int32_t[]){259, 0, 260}, 3);
  servd_tokenizer_free(t);
  t = spm_load(false, false, forms[0]);
  spm_ids(t, "\u20ac\u20ach", false, (int32_t[]){259, 0, 0, 260}, 4);
  servd_tokenizer_free(t);
}

static void test_threads(void **st) {
  (void)st;
  servd_tokenizer *t = load(BYTELEVEL, "null", false);
  pthread_t th[4];
  job jobs[4];
  for (int i = 0; i < 4; i++) {
    jobs[i] = (job){t, 0};
    pthread_create(&th[i], NULL, worker, &jobs[i]);
  }
  for (int i = 0; i < 4; i++) {
    pthread_join(th[i], NULL);
    assert_true(jobs[i].ok);
  }
  servd_tokenizer_free(t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_hand_vocab), cmocka_unit_test(test_lookups_and_decode),
      cmocka_unit_test(test_refusals),   cmocka_unit_test(test_long_inputs),
      cmocka_unit_test(test_threads),    cmocka_unit_test(test_sentencepiece),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
