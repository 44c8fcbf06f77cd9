/* mpk_pack_generic: a code folder and safetensors files written here byte by byte (independent of
 * the library's safetensors builder) round-trip through mpk_open with the same bytes, dtypes and
 * shapes; bad entry points, code folders, dtypes, duplicate names and configs fail with a message
 * naming the cause and leave no output. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "mpk/import.h"
#include "mpk/package.h"

#define TEST_DIR_TEMPLATE "/tmp/mpk-generic-XXXXXX"
#include "test-util.h"

static const char *at(const char *rel) { /* a path in the test folder; valid for the next 7 calls */
  static char buf[8][512];
  static int k;
  char *p = buf[k++ % 8];
  snprintf(p, 512, "%s/%s", dir, rel);
  return p;
}

static void put(const char *rel, const void *data, size_t len) {
  FILE *f = fopen(at(rel), "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(data, 1, len, f), len);
  fclose(f);
}

/* A safetensors file: 8-byte little-endian header length, the header text as given, the buffer. */
static void put_st(const char *rel, const char *header, const void *buf, size_t len) {
  size_t n = strlen(header);
  unsigned char *b = malloc(8 + n + len);
  assert_non_null(b);
  for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)n >> (8 * i));
  memcpy(b + 8, header, n);
  if (len) memcpy(b + 8 + n, buf, len);
  put(rel, b, 8 + n + len);
  free(b);
}

static float w1[2][3] = {{1, -2, 3.5f}, {0.25f, 0, -1}};
static uint16_t h2[4] = {0x3c00, 0xc000, 0x3555, 0x0001}; /* f16: 1, -2, ~1/3, smallest subnormal */
static float scalar = 0.5f;

static void make_inputs(void) {
  char p[600];
  snprintf(p, sizeof p, "mkdir -p %s/net/sub %s/empty_code", dir, dir);
  assert_int_equal(system(p), 0);
  put("net/__init__.py", "", 0);
  put("net/model.py", "class Net:\n    pass\n", 20);
  put("net/sub/deep.py", "X = 1\n", 6);
  unsigned char buf[28];
  memcpy(buf, w1, 24);
  memcpy(buf + 24, &scalar, 4);
  put_st("a.safetensors",
         "{\"w1\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
         "\"s\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[24,28]}}",
         buf, sizeof buf);
  put_st("b.safetensors",
         "{\"__metadata__\":{\"k\":\"v\"},\"h.2\":{\"dtype\":\"F16\",\"shape\":[1,4],\"data_offsets\":[0,8]}}", h2,
         sizeof h2);
  put("config.json", "{\"d\": 3, \"labels\": [\"x\"]}", 25);
}

static mpk_import_options opts(const char *code, const char *ep) {
  mpk_import_options o;
  mpk_import_options_init(&o);
  o.code_dir = code;
  o.entry_point = ep;
  return o;
}

static void roundtrip(void **state) {
  (void)state;
  make_inputs();
  const char *w[2] = {at("b.safetensors"), at("a.safetensors")};
  mpk_import_options o = opts(at("net"), "net.model:Net");
  o.model_version = "2";
  const char *out = at("net.mpk");
  assert_int_equal(mpk_pack_generic(w, 2, at("config.json"), out, &o), 0);

  mpk_package *p;
  assert_int_equal(mpk_open(out, &p), 0);
  assert_int_equal(mpk_verify(p), 0);
  assert_string_equal(mpk_kind(p), "generic");
  assert_string_equal(mpk_entry_point(p), "net.model:Net");
  assert_string_equal(mpk_name(p), "net");
  assert_string_equal(mpk_model_version(p), "2");
  assert_int_equal(json_integer_value(json_object_get(mpk_config(p), "d")), 3);
  assert_int_equal(mpk_tensor_count(p), 3);

  servd_tensor *t;
  assert_int_equal(mpk_tensor(p, "w1", &t), 0);
  assert_int_equal(t->dtype, SERVD_F32);
  assert_int_equal(t->ndim, 2);
  assert_int_equal(t->shape[0], 2);
  assert_int_equal(t->shape[1], 3);
  assert_memory_equal(servd_tensor_data(t), w1, sizeof w1);
  assert_int_equal((uintptr_t)servd_tensor_data(t) % 64, 0);
  servd_tensor_release(t);
  assert_int_equal(mpk_tensor(p, "h.2", &t), 0);
  assert_int_equal(t->dtype, SERVD_F16);
  assert_int_equal(t->shape[1], 4);
  assert_memory_equal(servd_tensor_data(t), h2, sizeof h2);
  servd_tensor_release(t);
  assert_int_equal(mpk_tensor(p, "s", &t), 0); /* scalar -> (1,) */
  assert_int_equal(t->ndim, 1);
  assert_int_equal(t->shape[0], 1);
  assert_memory_equal(servd_tensor_data(t), &scalar, 4);
  servd_tensor_release(t);

  const void *data;
  size_t len;
  assert_int_equal(mpk_file(p, "code/net/sub/deep.py", &data, &len), 0);
  assert_int_equal(len, 6);
  assert_memory_equal(data, "X = 1\n", 6);
  assert_int_equal(mpk_file(p, "code/net/model.py", &data, &len), 0);
  mpk_close(p);

  /* No weights, no config: {} and no tensors. */
  assert_int_equal(mpk_pack_generic(NULL, 0, NULL, out, &o), 0);
  assert_int_equal(mpk_open(out, &p), 0);
  assert_int_equal(mpk_tensor_count(p), 0);
  assert_int_equal(json_object_size(mpk_config(p)), 0);
  mpk_close(p);
}

/* Expects failure with `needle` in the message and no output file. */
static void expect_fail(const char *const *w, size_t nw, const char *cfg, const mpk_import_options *o,
                        const char *needle) {
  const char *out = at("bad.mpk");
  unlink(out);
  assert_true(mpk_pack_generic(w, nw, cfg, out, o) < 0);
  if (!strstr(servd_last_error(), needle)) fail_msg("\"%s\" lacks \"%s\"", servd_last_error(), needle);
  struct stat st;
  assert_int_not_equal(stat(out, &st), 0);
}

static void bad_inputs(void **state) {
  (void)state;
  make_inputs();
  char a[512], b[512], net[512], cfg_arr[512], cfg_trunc[512];
  snprintf(a, sizeof a, "%s", at("a.safetensors"));
  snprintf(b, sizeof b, "%s", at("b.safetensors"));
  snprintf(net, sizeof net, "%s", at("net"));
  const char *w[2] = {a, b};
  mpk_import_options o = opts(net, "net.model:Net");
  expect_fail(w, 2, NULL, NULL, "required");
  static const char *const syntax[] = {"net.model",  "net.model:",     ":Net", "net..model:Net", "net.model:A:B",
                                       "net.2x:Net", "net.model:Net.", "",     "net model:Net"};
  for (size_t i = 0; i < sizeof syntax / sizeof *syntax; i++) {
    o.entry_point = syntax[i];
    expect_fail(w, 2, NULL, &o, "expected \"module:callable\"");
  }
  o.entry_point = "net.missing:Net";
  expect_fail(w, 2, NULL, &o, "net/missing.py");
  o.entry_point = "net.sub:X"; /* a folder without __init__.py */
  expect_fail(w, 2, NULL, &o, "not found");
  o.entry_point = "other.model:Net";
  expect_fail(w, 2, NULL, &o, "package \"net\"");
  o.entry_point = "netx:Net";
  expect_fail(w, 2, NULL, &o, "package \"net\"");
  o.entry_point = "empty_code:X"; /* the package itself needs __init__.py */
  o.code_dir = at("empty_code");
  expect_fail(w, 2, NULL, &o, "__init__.py");
  o.code_dir = at("absent");
  o.entry_point = "absent.m:X";
  expect_fail(w, 2, NULL, &o, "does not exist");

  o = opts(net, "net.model:Net");
  char inside[600];
  snprintf(inside, sizeof inside, "%s/sub/out.mpk", net);
  assert_true(mpk_pack_generic(w, 2, NULL, inside, &o) < 0);
  assert_non_null(strstr(servd_last_error(), "must not be inside the code folder"));
  assert_int_not_equal(access(inside, F_OK), 0);
  const char *dup[2] = {a, a};
  expect_fail(dup, 2, NULL, &o, "is in both");
  put_st("i32.safetensors", "{\"ids\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[0,4]}}", "\0\0\0\0", 4);
  const char *i32[1] = {at("i32.safetensors")};
  expect_fail(i32, 1, NULL, &o, "dtype I32 is not supported");
  put_st("f64.safetensors", "{\"d\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}", "\0\0\0\0\0\0\0\0", 8);
  const char *f64[1] = {at("f64.safetensors")};
  expect_fail(f64, 1, NULL, &o, "dtype F64 is not supported");
  put_st("hole.safetensors", "{\"d\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", "\0\0\0\0\0\0\0\0", 8);
  const char *hole[1] = {at("hole.safetensors")};
  expect_fail(hole, 1, NULL, &o, "hole.safetensors");
  put("short.safetensors", "\x10\0\0", 3);
  const char *shrt[1] = {at("short.safetensors")};
  expect_fail(shrt, 1, NULL, &o, "short.safetensors");
  const char *none[1] = {at("none.safetensors")};
  expect_fail(none, 1, NULL, &o, "none.safetensors");
  put("arr.json", "[1]", 3);
  snprintf(cfg_arr, sizeof cfg_arr, "%s", at("arr.json"));
  expect_fail(w, 2, cfg_arr, &o, "expected a JSON object");
  put("trunc.json", "{\"a\":", 5);
  snprintf(cfg_trunc, sizeof cfg_trunc, "%s", at("trunc.json"));
  expect_fail(w, 2, cfg_trunc, &o, "trunc.json");
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(roundtrip), cmocka_unit_test(bad_inputs)};
  return cmocka_run_group_tests(tests, setup, teardown);
}
