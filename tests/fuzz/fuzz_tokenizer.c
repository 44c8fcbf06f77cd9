/* libFuzzer target for the tokenizer.
 *   Input byte 0 even: the rest is text for a fixed byte-level tokenizer: encode must succeed,
 *     decode(encode(x)) == x for valid UTF-8, and the incremental detokenizer must add up to decode
 *     with every delta valid UTF-8 on its own.
 *   Input byte 0 odd: the rest is a tokenizer.json: loading may fail but must not crash or leak;
 *     when it loads, encode and decode the input through it.
 * Build: clang -fsanitize=fuzzer,address,undefined with servd_tokenizer (and servd_kernels). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "servd/tokenizer.h"

static servd_tokenizer *fixed;

static void put_cp(char **p, unsigned cp) {
  if (cp == '"' || cp == '\\') {
    *(*p)++ = '\\';
    *(*p)++ = (char)cp;
  } else if (cp < 0x80) {
    *(*p)++ = (char)cp;
  } else {
    *(*p)++ = (char)(0xC0 | (cp >> 6));
    *(*p)++ = (char)(0x80 | (cp & 0x3F));
  }
}

/* All 256 byte tokens, a few merges, two added tokens, the SmolLM2 pipeline. */
static servd_tokenizer *build_fixed(void) {
  char *buf = malloc(1 << 16), *p = buf;
  p += sprintf(p, "{\"added_tokens\":[{\"id\":262,\"content\":\"<|end|>\",\"special\":true},"
                  "{\"id\":263,\"content\":\"[X]\",\"special\":false,\"lstrip\":true,\"rstrip\":true},"
                  "{\"id\":264,\"content\":\"w\",\"special\":false,\"single_word\":true}],"
                  "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Digits\","
                  "\"individual_digits\":true},{\"type\":\"ByteLevel\",\"add_prefix_space\":false}]},"
                  "\"decoder\":{\"type\":\"ByteLevel\"},\"model\":{\"type\":\"BPE\",\"vocab\":{");
  int n = 0;
  for (int b = 0; b < 256; b++) {
    bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    unsigned cp = printable ? (unsigned)b : 256u + (unsigned)n++;
    *p++ = '"';
    put_cp(&p, cp);
    p += sprintf(p, "\":%d,", b);
  }
  p += sprintf(p, "\"he\":256,\"ll\":257,\"hell\":258,\"hello\":259,\"lo\":260,\"el\":261},"
                  "\"merges\":[\"h e\",\"l l\",\"he ll\",\"hell o\",[\"l\",\"o\"],\"e l\"]}}");
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
    if (c == 0xE0 && s[i + 1] < 0xA0) return 0;
    if (c == 0xED && s[i + 1] > 0x9F) return 0;
    if (c == 0xF0 && s[i + 1] < 0x90) return 0;
    if (c == 0xF4 && s[i + 1] > 0x8F) return 0;
    i += l;
  }
  return 1;
}

static void exercise(servd_tokenizer *t, const char *text, size_t len, int check_roundtrip) {
  int32_t *ids;
  int n;
  if (servd_tokenizer_encode(t, text, len, (len & 1) != 0, &ids, &n)) abort();
  char *out;
  size_t ol;
  if (servd_tokenizer_decode(t, ids, n, false, &out, &ol)) abort();
  if (!valid_utf8((const uint8_t *)out, ol)) abort();
  if (check_roundtrip && valid_utf8((const uint8_t *)text, len) && (ol != len || memcmp(out, text, len))) abort();
  servd_detok *d;
  if (servd_detok_create(t, false, &d)) abort();
  size_t o = 0;
  for (int i = 0; i <= n; i++) {
    const char *delta;
    size_t dl;
    if (i < n ? servd_detok_push(d, ids[i], &delta, &dl) : servd_detok_flush(d, &delta, &dl)) abort();
    if (!valid_utf8((const uint8_t *)delta, dl) || o + dl > ol || memcmp(out + o, delta, dl)) abort();
    o += dl;
  }
  if (o != ol) abort();
  servd_detok_free(d);
  free(out);
  free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!fixed) fixed = build_fixed();
  if (!size) return 0;
  const char *rest = (const char *)data + 1;
  size_t n = size - 1;
  if (!(data[0] & 1)) {
    /* the fixed tokenizer's [X] strips spaces around it: no round trip then */
    exercise(fixed, rest, n, !memmem(rest, n, "[X]", 3));
    return 0;
  }
  servd_tokenizer *t;
  if (servd_tokenizer_load(rest, n, &t) == 0) {
    exercise(t, rest, n < 4096 ? n : 4096, 0);
    servd_tokenizer_free(t);
  }
  return 0;
}
