/* safetensors header parser: a valid file and every class of malformed header. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "mpk/safetensors.h"

/* Builds u64 length + header + `data_len` zero bytes. */
static unsigned char *make(const char *hdr, size_t data_len, size_t *len) {
  size_t h = strlen(hdr);
  *len = 8 + h + data_len;
  unsigned char *b = calloc(1, *len);
  for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)h >> (8 * i));
  memcpy(b + 8, hdr, h);
  return b;
}

static int parse(const char *hdr, size_t data_len) {
  size_t len;
  unsigned char *b = make(hdr, data_len, &len);
  mpk_st_header *h = NULL;
  int rc = mpk_st_parse("t.safetensors", b, len, &h);
  if (rc == 0) assert_non_null(h);
  else assert_null(h);
  mpk_st_free(h);
  free(b);
  return rc;
}

static void valid(void **state) {
  (void)state;
  const char *hdr =
      "{\"__metadata__\":{\"format\":\"pt\"},\"b\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[16,28]},"
      "\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}   ";
  size_t len;
  unsigned char *b = make(hdr, 28, &len);
  mpk_st_header *h;
  assert_int_equal(mpk_st_parse("t", b, len, &h), 0);
  assert_int_equal(h->n, 2);
  assert_int_equal(h->data_start, 8 + strlen(hdr));
  assert_string_equal(h->tensors[0].name, "a"); /* sorted by offset */
  int i = mpk_st_find(h, "b");
  assert_true(i >= 0);
  assert_string_equal(h->tensors[i].dtype, "BF16");
  assert_int_equal(h->tensors[i].shape[1], 3);
  assert_int_equal(mpk_st_find(h, "zz"), -1);
  assert_non_null(h->metadata);
  mpk_st_free(h);
  free(b);
  /* scalars and empty tensors are legal safetensors */
  assert_int_equal(parse("{\"s\":{\"dtype\":\"F64\",\"shape\":[],\"data_offsets\":[0,8]},\"e\":{\"dtype\":\"F32\","
                         "\"shape\":[0,5],\"data_offsets\":[8,8]}}",
                         8),
                   0);
}

static void malformed(void **state) {
  (void)state;
  /* length larger than the file, and truncated */
  unsigned char b[16] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, '{', '}'};
  mpk_st_header *h = NULL;
  assert_int_equal(mpk_st_parse("t", b, 10, &h), SERVD_EFORMAT);
  assert_int_equal(mpk_st_parse("t", b, 7, &h), SERVD_EFORMAT);
  assert_non_null(strstr(servd_last_error(), "t: "));
  b[0] = 2;
  b[1] = b[2] = b[3] = b[4] = b[5] = b[6] = b[7] = 0;
  assert_int_equal(mpk_st_parse("t", b, 10, &h), 0); /* "{}" with no tensors is valid */
  mpk_st_free(h);
  assert_int_equal(parse("[]", 0), SERVD_EFORMAT);
  assert_int_equal(parse("{\"a\":", 0), SERVD_EFORMAT);
  /* duplicate names */
  assert_int_equal(parse("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},\"a\":{\"dtype\":\"F32\","
                         "\"shape\":[1],\"data_offsets\":[4,8]}}",
                         8),
                   SERVD_EFORMAT);
  /* dtype x shape disagrees with the byte span */
  assert_int_equal(parse("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8), SERVD_EFORMAT);
  assert_non_null(strstr(servd_last_error(), "expected 12"));
  /* unknown dtype, bad shape entries, bad offsets */
  assert_int_equal(parse("{\"a\":{\"dtype\":\"Q9\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1), SERVD_EFORMAT);
  assert_int_equal(parse("{\"a\":{\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,1]}}", 1), SERVD_EFORMAT);
  assert_int_equal(parse("{\"a\":{\"dtype\":\"U8\",\"shape\":[1.5],\"data_offsets\":[0,1]}}", 1), SERVD_EFORMAT);
  assert_int_equal(parse("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,0]}}", 1), SERVD_EFORMAT);
  assert_int_equal(parse("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0]}}", 1), SERVD_EFORMAT);
  assert_int_equal(parse("{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1),
                   SERVD_EFORMAT);
  /* shape product overflow: 2^32 * 2^32 elements */
  assert_int_equal(parse("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,0]}}", 0),
                   SERVD_ERANGE);
  /* byte size overflow: 2^62 elements of 4 bytes */
  assert_int_equal(parse("{\"a\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904],\"data_offsets\":[0,0]}}", 0),
                   SERVD_ERANGE);
  /* integers beyond int64 */
  assert_int_equal(parse("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,18446744073709551615]}}", 1),
                   SERVD_EFORMAT);
  /* overlap, hole, past the end, short of the end */
  assert_int_equal(parse("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},\"b\":{\"dtype\":\"U8\","
                         "\"shape\":[4],\"data_offsets\":[2,6]}}",
                         6),
                   SERVD_EFORMAT);
  assert_non_null(strstr(servd_last_error(), "overlap"));
  assert_int_equal(parse("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},\"b\":{\"dtype\":\"U8\","
                         "\"shape\":[4],\"data_offsets\":[6,10]}}",
                         10),
                   SERVD_EFORMAT);
  assert_non_null(strstr(servd_last_error(), "hole"));
  assert_int_equal(parse("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}", 3), SERVD_EFORMAT);
  assert_int_equal(parse("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}", 5), SERVD_EFORMAT);
  /* metadata must be strings */
  assert_int_equal(parse("{\"__metadata__\":{\"x\":1}}", 0), SERVD_EFORMAT);
  /* NUL inside a name */
  size_t len;
  unsigned char *nb = make("{\"a\\u0000b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, &len);
  assert_int_not_equal(mpk_st_parse("t", nb, len, &h), 0);
  free(nb);
}

static void truncations(void **state) {
  (void)state;
  const char *hdr = "{\"a\":{\"dtype\":\"F16\",\"shape\":[2,2],\"data_offsets\":[0,8]}}";
  size_t len;
  unsigned char *b = make(hdr, 8, &len);
  for (size_t n = 0; n < len; n++) {
    unsigned char *c = malloc(n ? n : 1); /* exact-size copies let ASan catch any over-read */
    memcpy(c, b, n);
    mpk_st_header *h = NULL;
    assert_int_not_equal(mpk_st_parse("t", c, n, &h), 0);
    free(c);
  }
  free(b);
}

static void build_roundtrip(void **state) {
  (void)state;
  int64_t shape[2] = {3, 5};
  char *out;
  size_t len;
  assert_int_equal(mpk_st_build_single("w.x", "BF16", 2, shape, 30, NULL, 64, &out, &len), 0);
  assert_int_equal(len % 64, 0);
  unsigned char *file = calloc(1, len + 30);
  memcpy(file, out, len);
  mpk_st_header *h;
  assert_int_equal(mpk_st_parse("t", file, len + 30, &h), 0);
  assert_int_equal(h->data_start, len);
  assert_int_equal(h->tensors[0].shape[0], 3);
  mpk_st_free(h);
  free(file);
  free(out);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(valid), cmocka_unit_test(malformed),
                                     cmocka_unit_test(truncations), cmocka_unit_test(build_roundtrip)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
