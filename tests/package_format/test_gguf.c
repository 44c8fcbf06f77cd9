/* GGUF reader: a valid file, and the bad-input checklist (truncation, counts and lengths beyond the
 * file, overflow in counts/shapes/sizes/offsets as in CVE-2024-21802, CVE-2024-23605,
 * CVE-2025-53630, CVE-2026-33298, overlaps, n_dims, unknown types, duplicates, alignment abuse). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "mpk/gguf.h"

typedef struct buf {
  unsigned char *b;
  size_t n, cap;
} buf;

static void put(buf *b, const void *p, size_t n) {
  if (b->n + n > b->cap) {
    b->cap = (b->n + n) * 2 + 64;
    b->b = realloc(b->b, b->cap);
  }
  memcpy(b->b + b->n, p, n);
  b->n += n;
}
static void u32(buf *b, uint32_t v) { put(b, &v, 4); } /* little-endian host (x86-64, aarch64) */
static void u64(buf *b, uint64_t v) { put(b, &v, 8); }
static void str(buf *b, const char *s) {
  u64(b, strlen(s));
  put(b, s, strlen(s));
}
static void header(buf *b, uint32_t version, uint64_t nt, uint64_t nkv) {
  put(b, "GGUF", 4);
  u32(b, version);
  u64(b, nt);
  u64(b, nkv);
}
static void kv_u32(buf *b, const char *k, uint32_t v) {
  str(b, k);
  u32(b, MPK_GGUF_UINT32);
  u32(b, v);
}
static void kv_str(buf *b, const char *k, const char *v) {
  str(b, k);
  u32(b, MPK_GGUF_STRING);
  str(b, v);
}
static void tinfo(buf *b, const char *name, uint32_t nd, const uint64_t *ne, uint32_t type, uint64_t off) {
  str(b, name);
  u32(b, nd);
  for (uint32_t i = 0; i < nd; i++) u64(b, ne[i]);
  u32(b, type);
  u64(b, off);
}
static void pad_to(buf *b, size_t a) {
  static const unsigned char z[64] = {0};
  while (b->n % a) put(b, z, 1);
}
static void zeros(buf *b, size_t n) {
  unsigned char *z = calloc(1, n);
  put(b, z, n);
  free(z);
}

static int parse(buf *b) {
  mpk_gguf *g = NULL;
  int rc = mpk_gguf_parse("t.gguf", b->b, b->n, &g);
  if (rc) assert_null(g);
  mpk_gguf_free(g);
  free(b->b);
  memset(b, 0, sizeof *b);
  return rc;
}

static buf valid_file(void) {
  buf b = {0};
  header(&b, 3, 2, 4);
  kv_str(&b, "general.architecture", "llama");
  kv_u32(&b, "llama.block_count", 2);
  str(&b, "tokenizer.ggml.tokens");
  u32(&b, MPK_GGUF_ARRAY);
  u32(&b, MPK_GGUF_STRING);
  u64(&b, 3);
  str(&b, "a");
  str(&b, "bc");
  str(&b, "");
  str(&b, "llama.rope.freq_base");
  u32(&b, MPK_GGUF_FLOAT32);
  float f = 10000.0f;
  put(&b, &f, 4);
  uint64_t ne1[1] = {4}, ne2[2] = {32, 2};
  tinfo(&b, "norm.weight", 1, ne1, MPK_GGML_F32, 0);
  tinfo(&b, "w", 2, ne2, MPK_GGML_Q8_0, 32);
  pad_to(&b, 32);
  zeros(&b, 32 + 68);
  return b;
}

static void valid(void **state) {
  (void)state;
  buf b = valid_file();
  mpk_gguf *g;
  assert_int_equal(mpk_gguf_parse("t", b.b, b.n, &g), 0);
  assert_int_equal(g->n_kv, 4);
  assert_int_equal(g->n_tensors, 2);
  assert_int_equal(g->data_offset % 32, 0);
  assert_int_equal(g->tensors[1].nbytes, 68);
  assert_int_equal(g->tensors[1].ne[1], 2);
  uint64_t v;
  assert_int_equal(mpk_gguf_get_u64(g, "llama.block_count", &v), 0);
  assert_int_equal(v, 2);
  double d;
  assert_int_equal(mpk_gguf_get_f64(g, "llama.rope.freq_base", &d), 0);
  assert_true(d == 10000.0);
  assert_int_equal(mpk_gguf_get_u64(g, "absent", &v), SERVD_EINVAL);
  assert_int_equal(mpk_gguf_get_u64(g, "general.architecture", &v), SERVD_EFORMAT);
  const mpk_gguf_kv *kv = mpk_gguf_find(g, "tokenizer.ggml.tokens");
  const char *s;
  size_t n;
  mpk_gguf_arr_str(g, kv, 1, &s, &n);
  assert_int_equal(n, 2);
  assert_memory_equal(s, "bc", 2);
  mpk_gguf_arr_str(g, kv, 2, &s, &n);
  assert_int_equal(n, 0);
  mpk_gguf_free(g);
  free(b.b);
}

static void truncated_everywhere(void **state) {
  (void)state;
  buf b = valid_file();
  for (size_t n = 0; n < b.n; n++) {
    unsigned char *c = malloc(n ? n : 1);
    memcpy(c, b.b, n);
    mpk_gguf *g = NULL;
    assert_int_not_equal(mpk_gguf_parse("t", c, n, &g), 0);
    assert_non_null(strstr(servd_last_error(), "t: "));
    free(c);
  }
  free(b.b);
}

static void header_and_counts(void **state) {
  (void)state;
  buf b = {0};
  header(&b, 1, 0, 0);
  assert_int_equal(parse(&b), SERVD_EUNSUPPORTED);
  header(&b, 0x03000000, 0, 0);
  assert_int_equal(parse(&b), SERVD_EUNSUPPORTED);
  put(&b, "GGML", 4);
  u32(&b, 3);
  u64(&b, 0);
  u64(&b, 0);
  assert_int_equal(parse(&b), SERVD_EFORMAT);
  header(&b, 3, 0, 0);
  assert_int_equal(parse(&b), 0); /* empty but valid */
  /* counts far beyond the file: rejected before any allocation */
  header(&b, 3, 0, UINT64_MAX);
  assert_int_equal(parse(&b), SERVD_EFORMAT);
  header(&b, 3, UINT64_MAX / 8, 0);
  assert_int_equal(parse(&b), SERVD_EFORMAT);
  header(&b, 3, (1ull << 62) + 1, 0);
  zeros(&b, 64);
  assert_int_equal(parse(&b), SERVD_EFORMAT);
  /* string lengths larger than the file, incl. values that wrap when added to the position */
  header(&b, 3, 0, 1);
  u64(&b, 1000);
  put(&b, "abc", 3);
  assert_int_equal(parse(&b), SERVD_EFORMAT);
  header(&b, 3, 0, 1);
  u64(&b, UINT64_MAX);
  put(&b, "abc", 3);
  assert_int_equal(parse(&b), SERVD_EFORMAT);
  header(&b, 3, 0, 1);
  str(&b, "k");
  u32(&b, MPK_GGUF_STRING);
  u64(&b, UINT64_MAX - 2);
  assert_int_equal(parse(&b), SERVD_EFORMAT);
  header(&b, 3, 0, 1);
  u64(&b, 0);
  u32(&b, MPK_GGUF_UINT8);
  put(&b, "x", 1);
  assert_int_equal(parse(&b), SERVD_EFORMAT); /* empty key */
}

static void arrays(void **state) {
  (void)state;
  buf b = {0};
  /* element count x size overflows 64 bits */
  header(&b, 3, 0, 1);
  str(&b, "k");
  u32(&b, MPK_GGUF_ARRAY);
  u32(&b, MPK_GGUF_UINT64);
  u64(&b, (1ull << 61) + 1);
  zeros(&b, 16);
  assert_int_equal(parse(&b), SERVD_EFORMAT);
  header(&b, 3, 0, 1);
  str(&b, "k");
  u32(&b, MPK_GGUF_ARRAY);
  u32(&b, MPK_GGUF_UINT32);
  u64(&b, 5);
  zeros(&b, 16);
  assert_int_equal(parse(&b), SERVD_EFORMAT);
  /* string array count beyond the bytes left */
  header(&b, 3, 0, 1);
  str(&b, "k");
  u32(&b, MPK_GGUF_ARRAY);
  u32(&b, MPK_GGUF_STRING);
  u64(&b, UINT64_MAX);
  zeros(&b, 16);
  assert_int_equal(parse(&b), SERVD_EFORMAT);
  /* nested arrays, unknown types */
  header(&b, 3, 0, 1);
  str(&b, "k");
  u32(&b, MPK_GGUF_ARRAY);
  u32(&b, MPK_GGUF_ARRAY);
  u64(&b, 1);
  zeros(&b, 16);
  assert_int_equal(parse(&b), SERVD_EFORMAT);
  header(&b, 3, 0, 1);
  str(&b, "k");
  u32(&b, MPK_GGUF_ARRAY);
  u32(&b, 13);
  u64(&b, 1);
  zeros(&b, 16);
  assert_int_equal(parse(&b), SERVD_EFORMAT);
  header(&b, 3, 0, 1);
  str(&b, "k");
  u32(&b, 13);
  zeros(&b, 16);
  assert_int_equal(parse(&b), SERVD_EFORMAT);
  header(&b, 3, 0, 1);
  str(&b, "k");
  u32(&b, MPK_GGUF_BOOL);
  put(&b, "\x02", 1);
  assert_int_equal(parse(&b), SERVD_EFORMAT);
  /* duplicate keys */
  header(&b, 3, 0, 2);
  kv_u32(&b, "k", 1);
  kv_u32(&b, "k", 2);
  assert_int_equal(parse(&b), SERVD_EFORMAT);
  assert_non_null(strstr(servd_last_error(), "duplicate key"));
}

static void tensor_infos(void **state) {
  (void)state;
  buf b = {0};
  uint64_t ne[5] = {4, 1, 1, 1, 1};
  /* n_dims out of range */
  header(&b, 3, 1, 0);
  tinfo(&b, "t", 5, ne, 0, 0);
  pad_to(&b, 32);
  zeros(&b, 16);
  assert_int_equal(parse(&b), SERVD_EFORMAT);
  header(&b, 3, 1, 0);
  tinfo(&b, "t", 0, ne, 0, 0);
  pad_to(&b, 32);
  zeros(&b, 64);
  assert_int_equal(parse(&b), SERVD_EFORMAT);
  /* unknown and removed types */
  header(&b, 3, 1, 0);
  tinfo(&b, "t", 1, ne, 99, 0);
  pad_to(&b, 32);
  zeros(&b, 16);
  assert_int_equal(parse(&b), SERVD_EFORMAT);
  header(&b, 3, 1, 0);
  tinfo(&b, "t", 1, ne, 4, 0);
  pad_to(&b, 32);
  zeros(&b, 16);
  assert_int_equal(parse(&b), SERVD_EFORMAT);
  /* zero and huge dimensions, products that overflow */
  uint64_t z[2] = {0, 4};
  header(&b, 3, 1, 0);
  tinfo(&b, "t", 2, z, 0, 0);
  pad_to(&b, 32);
  zeros(&b, 16);
  assert_int_equal(parse(&b), SERVD_EFORMAT);
  uint64_t big[3] = {1ull << 32, 1ull << 32, 1ull << 32};
  header(&b, 3, 1, 0);
  tinfo(&b, "t", 3, big, 0, 0);
  pad_to(&b, 32);
  zeros(&b, 16);
  assert_int_equal(parse(&b), SERVD_ERANGE);
  uint64_t big2[2] = {1ull << 62, 2};
  header(&b, 3, 1, 0);
  tinfo(&b, "t", 2, big2, 0, 0);
  pad_to(&b, 32);
  zeros(&b, 16);
  assert_int_equal(parse(&b), SERVD_ERANGE);
  uint64_t neg[1] = {UINT64_MAX};
  header(&b, 3, 1, 0);
  tinfo(&b, "t", 1, neg, 0, 0);
  pad_to(&b, 32);
  zeros(&b, 16);
  assert_int_equal(parse(&b), SERVD_EFORMAT);
  /* block types: ne[0] must be a whole number of blocks */
  uint64_t q[1] = {33};
  header(&b, 3, 1, 0);
  tinfo(&b, "t", 1, q, MPK_GGML_Q8_0, 0);
  pad_to(&b, 32);
  zeros(&b, 64);
  assert_int_equal(parse(&b), SERVD_EFORMAT);
  /* offsets: unaligned, past the end, wrapping past 2^64, overlapping */
  header(&b, 3, 1, 0);
  tinfo(&b, "t", 1, ne, 0, 1);
  pad_to(&b, 32);
  zeros(&b, 64);
  assert_int_equal(parse(&b), SERVD_EFORMAT);
  header(&b, 3, 1, 0);
  tinfo(&b, "t", 1, ne, 0, 64);
  pad_to(&b, 32);
  zeros(&b, 64);
  assert_int_equal(parse(&b), SERVD_EFORMAT);
  header(&b, 3, 1, 0);
  tinfo(&b, "t", 1, ne, 0, UINT64_MAX - 31);
  pad_to(&b, 32);
  zeros(&b, 64);
  assert_int_equal(parse(&b), SERVD_EFORMAT);
  uint64_t ne8[1] = {8};
  header(&b, 3, 2, 0);
  tinfo(&b, "a", 1, ne8, 0, 0);
  tinfo(&b, "b", 1, ne, 0, 0);
  pad_to(&b, 32);
  zeros(&b, 64);
  assert_int_equal(parse(&b), SERVD_EFORMAT);
  assert_non_null(strstr(servd_last_error(), "overlaps"));
  /* duplicate tensor names */
  header(&b, 3, 2, 0);
  tinfo(&b, "a", 1, ne, 0, 0);
  tinfo(&b, "a", 1, ne, 0, 32);
  pad_to(&b, 32);
  zeros(&b, 64);
  assert_int_equal(parse(&b), SERVD_EFORMAT);
  /* names with NUL */
  header(&b, 3, 1, 0);
  u64(&b, 3);
  put(&b, "a\0b", 3);
  u32(&b, 1);
  u64(&b, 4);
  u32(&b, 0);
  u64(&b, 0);
  pad_to(&b, 32);
  zeros(&b, 16);
  assert_int_equal(parse(&b), SERVD_EFORMAT);
}

static void alignment_key(void **state) {
  (void)state;
  buf b = {0};
  uint64_t ne[1] = {4};
  header(&b, 3, 1, 1);
  kv_u32(&b, "general.alignment", 0);
  tinfo(&b, "t", 1, ne, 0, 0);
  zeros(&b, 64);
  assert_int_equal(parse(&b), SERVD_EFORMAT);
  header(&b, 3, 1, 1);
  kv_u32(&b, "general.alignment", 48);
  tinfo(&b, "t", 1, ne, 0, 0);
  zeros(&b, 64);
  assert_int_equal(parse(&b), SERVD_EFORMAT);
  header(&b, 3, 1, 1);
  kv_u32(&b, "general.alignment", 1u << 31);
  tinfo(&b, "t", 1, ne, 0, 0);
  zeros(&b, 64);
  assert_int_equal(parse(&b), SERVD_EFORMAT);
  header(&b, 3, 1, 1);
  str(&b, "general.alignment");
  u32(&b, MPK_GGUF_UINT64);
  u64(&b, 64);
  tinfo(&b, "t", 1, ne, 0, 0);
  zeros(&b, 64);
  assert_int_equal(parse(&b), SERVD_EFORMAT);
  /* a valid non-default alignment moves the data section */
  header(&b, 3, 1, 1);
  kv_u32(&b, "general.alignment", 256);
  tinfo(&b, "t", 1, ne, 0, 0);
  pad_to(&b, 256);
  zeros(&b, 16);
  mpk_gguf *g;
  assert_int_equal(mpk_gguf_parse("t", b.b, b.n, &g), 0);
  assert_int_equal(g->data_offset, 256);
  mpk_gguf_free(g);
  free(b.b);
}

/* Hand-computed dequantization of one Q5_0 and one Q6_K block (ggml reference formulas). */
static void dequant(void **state) {
  (void)state;
  unsigned char q5[22] = {0};
  q5[0] = 0x00;
  q5[1] = 0x3c; /* d = 1.0 (f16) */
  q5[2] = 0x01; /* qh bit 0: element 0 gets +16 */
  q5[6] = 0x21; /* qs[0]: low nibble 1 (element 0), high nibble 2 (element 16) */
  float y[256];
  assert_int_equal(mpk_ggml_row_to_f32(MPK_GGML_Q5_0, q5, y, 32), 0);
  assert_true(y[0] == 1.0f);    /* (1 | 16) - 16 */
  assert_true(y[16] == -14.0f); /* 2 - 16 */
  assert_true(y[1] == -16.0f);
  unsigned char q6[210] = {0};
  q6[208] = 0x00;
  q6[209] = 0x38;                               /* d = 0.5 */
  for (int i = 0; i < 16; i++) q6[192 + i] = 2; /* scales 2 */
  q6[0] = 0x05;                                 /* ql[0] low nibble 5 -> element 0: (5 | 0) - 32 = -27 */
  q6[128] = 0x02;                               /* qh[0] bits 0-1 = 2 -> element 0 gets +32: 37 - 32 = 5 */
  assert_int_equal(mpk_ggml_row_to_f32(MPK_GGML_Q6_K, q6, y, 256), 0);
  assert_true(y[0] == 0.5f * 2 * 5);
  assert_true(y[1] == 0.5f * 2 * -32);
  assert_int_equal(mpk_ggml_row_to_f32(MPK_GGML_Q6_K, q6, y, 255), SERVD_EINVAL);
  assert_int_equal(mpk_ggml_row_to_f32(MPK_GGML_IQ2_XXS, q6, y, 256), SERVD_EUNSUPPORTED);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(valid),  cmocka_unit_test(truncated_everywhere), cmocka_unit_test(header_and_counts),
      cmocka_unit_test(arrays), cmocka_unit_test(tensor_infos),         cmocka_unit_test(alignment_key),
      cmocka_unit_test(dequant)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
