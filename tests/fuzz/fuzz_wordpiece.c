/* libFuzzer target for the WordPiece tokenizer (BertNormalizer, BertPreTokenizer, pair template).
 * Input byte 0: the pair's max_len (0: no truncation) and, with byte 1, where the rest splits into
 * the pair's two texts. Encode of the whole rest must succeed with every id in the vocabulary;
 * decode must be valid UTF-8 and equal the incremental detokenizer's deltas; the pair must fit
 * max_len and carry type ids 0 then 1.
 * Build: clang -fsanitize=fuzzer,address,undefined with servd_tokenizer. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "servd/tokenizer.h"

static servd_tokenizer *fixed;

/* Specials, ASCII letters and their ## forms, a few words, accented and CJK entries. */
static servd_tokenizer *build_fixed(void) {
  static const char *words[] = {"the", "##s", "##ing", "hello", "world", "un", "##aff", "##able", "中", "日",
                                "é",   "ß",   "##é",   ".",     ",",     "!",  "##ü",   "σ",      "ω",  "##ω"};
  char *buf = malloc(1 << 16), *p = buf;
  int id = 0;
  p += sprintf(p,
               "{\"added_tokens\":[{\"id\":1,\"content\":\"[UNK]\",\"special\":true},"
               "{\"id\":2,\"content\":\"[CLS]\",\"special\":true},{\"id\":3,\"content\":\"[SEP]\",\"special\":true}],"
               "\"normalizer\":{\"type\":\"BertNormalizer\",\"clean_text\":true,\"handle_chinese_chars\":true,"
               "\"strip_accents\":null,\"lowercase\":true},\"pre_tokenizer\":{\"type\":\"BertPreTokenizer\"},"
               "\"decoder\":{\"type\":\"WordPiece\",\"prefix\":\"##\",\"cleanup\":true},"
               "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"[CLS]\","
               "\"type_id\":0}},{\"Sequence\":{\"id\":\"A\",\"type_id\":0}},{\"SpecialToken\":{\"id\":\"[SEP]\","
               "\"type_id\":0}}],\"pair\":[{\"SpecialToken\":{\"id\":\"[CLS]\",\"type_id\":0}},{\"Sequence\":{\"id\":"
               "\"A\",\"type_id\":0}},{\"SpecialToken\":{\"id\":\"[SEP]\",\"type_id\":0}},{\"Sequence\":{\"id\":\"B\","
               "\"type_id\":1}},{\"SpecialToken\":{\"id\":\"[SEP]\",\"type_id\":1}}],\"special_tokens\":{\"[CLS]\":"
               "{\"id\":\"[CLS]\",\"ids\":[2],\"tokens\":[\"[CLS]\"]},\"[SEP]\":{\"id\":\"[SEP]\",\"ids\":[3],"
               "\"tokens\":[\"[SEP]\"]}}},\"model\":{\"type\":\"WordPiece\",\"unk_token\":\"[UNK]\","
               "\"continuing_subword_prefix\":\"##\",\"max_input_chars_per_word\":20,\"vocab\":{"
               "\"[PAD]\":0,\"[UNK]\":1,\"[CLS]\":2,\"[SEP]\":3");
  id = 4;
  for (char c = 'a'; c <= 'z'; c++) p += sprintf(p, ",\"%c\":%d,\"##%c\":%d", c, id, c, id + 1), id += 2;
  for (size_t i = 0; i < sizeof words / sizeof words[0]; i++) p += sprintf(p, ",\"%s\":%d", words[i], id++);
  p += sprintf(p, "}}}");
  servd_tokenizer *t = NULL;
  if (servd_tokenizer_load(buf, (size_t)(p - buf), &t)) abort();
  free(buf);
  return t;
}

static int valid_utf8(const uint8_t *s, size_t n) {
  for (size_t i = 0; i < n;) {
    uint8_t c = s[i];
    size_t l = c < 0x80                   ? 1
               : (c >= 0xC2 && c <= 0xDF) ? 2
               : (c >= 0xE0 && c <= 0xEF) ? 3
               : (c >= 0xF0 && c <= 0xF4) ? 4
                                          : 0;
    if (!l || i + l > n) return 0;
    for (size_t k = 1; k < l; k++)
      if ((s[i + k] & 0xC0) != 0x80) return 0;
    i += l;
  }
  return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!fixed) fixed = build_fixed();
  if (size < 2) return 0;
  const char *text = (const char *)data + 2;
  size_t n = size - 2, cut = n ? data[1] % (n + 1) : 0;
  int vocab = servd_tokenizer_vocab_size(fixed);
  int32_t *ids, *types;
  int nid;
  if (servd_tokenizer_encode(fixed, text, n, true, &ids, &nid)) abort();
  for (int i = 0; i < nid; i++)
    if (ids[i] < 0 || ids[i] >= vocab) abort();
  char *out;
  size_t ol;
  if (servd_tokenizer_decode(fixed, ids, nid, false, &out, &ol) || !valid_utf8((const uint8_t *)out, ol)) abort();
  servd_detok *d;
  if (servd_detok_create(fixed, false, &d)) abort();
  size_t o = 0;
  for (int i = 0; i <= nid; i++) {
    const char *delta;
    size_t dl;
    if (i < nid ? servd_detok_push(d, ids[i], &delta, &dl) : servd_detok_flush(d, &delta, &dl)) abort();
    if (o + dl > ol || memcmp(out + o, delta, dl)) abort();
    o += dl;
  }
  if (o != ol) abort();
  servd_detok_free(d);
  free(out);
  free(ids);

  int max_len = data[0] % 64;
  int rc = servd_tokenizer_encode_pair(fixed, text, cut, text + cut, n - cut, max_len, &ids, &types, &nid);
  if (rc) {
    if (max_len >= 5) abort(); /* only a max_len under the three specials plus one token each is refused */
    return 0;
  }
  if (max_len && nid > max_len) abort();
  for (int i = 0; i < nid; i++)
    if (ids[i] < 0 || ids[i] >= vocab || types[i] < 0 || types[i] > 1 || (i && types[i] < types[i - 1])) abort();
  free(ids);
  free(types);
  return 0;
}
