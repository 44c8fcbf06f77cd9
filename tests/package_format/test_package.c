/* Package writer and reader: round trip, zero-copy views that outlive the package, alignment,
 * atomic writes, and rejection of malformed archives, manifests and tensor indexes. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "mpk-impl.h"
#include "mpk/package.h"
#include "mpk/safetensors.h"
#include "mpk/writer.h"

#define TEST_DIR_TEMPLATE "/tmp/mpk-test-XXXXXX"
#include "test-util.h"

static float wq[3][64];
static unsigned char q4[2 * 20]; /* q4_1 (2, 32) */

static void common_fields(mpk_writer *w) {
  assert_int_equal(mpk_writer_set(w, "name", json_string("t")), 0);
  assert_int_equal(mpk_writer_set(w, "model_version", json_string("7")), 0);
  assert_int_equal(mpk_writer_set(w, "kind", json_string("causal-lm")), 0);
  assert_int_equal(mpk_writer_set(w, "entry_point", json_string("llama.model:LlamaModel")), 0);
  assert_int_equal(mpk_writer_set(w, "config", json_pack("{s:i}", "hidden_size", 64)), 0);
  assert_int_equal(mpk_writer_set(w, "rope_layout", json_string("half")), 0);
  assert_int_equal(mpk_writer_set(w, "tokenizer", json_pack("{s:s}", "file", "tokenizer.json")), 0);
}

/* A good package; `mutate` may change the writer before finish. Returns the path (static). */
static const char *write_pkg(const char *name, void (*mutate)(mpk_writer *)) {
  static char path[512];
  snprintf(path, sizeof path, "%s/%s.mpk", dir, name);
  for (int r = 0; r < 3; r++)
    for (int i = 0; i < 64; i++) wq[r][i] = (float)(r * 64 + i) * 0.25f;
  for (size_t i = 0; i < sizeof q4; i++) q4[i] = (unsigned char)(i * 7);
  mpk_writer *w;
  assert_int_equal(mpk_writer_create(path, &w), 0);
  common_fields(w);
  assert_int_equal(mpk_writer_add_file(w, "code/llama/model.py", "x = 1\n", 6), 0);
  assert_int_equal(mpk_writer_add_file(w, "tokenizer.json", "{}", 2), 0);
  int64_t s1[2] = {3, 64}, s2[2] = {2, 32};
  assert_int_equal(mpk_writer_add_tensor(w, "model.layers.0.self_attn.q_proj.weight", SERVD_F32, 2, s1, wq, sizeof wq),
                   0);
  assert_int_equal(mpk_writer_begin_tensor(w, "q", SERVD_Q4_1, 2, s2), 0);
  assert_int_equal(mpk_writer_write(w, q4, 7), 0);
  assert_int_equal(mpk_writer_write(w, q4 + 7, sizeof q4 - 7), 0);
  assert_int_equal(mpk_writer_end_tensor(w), 0);
  if (mutate) mutate(w);
  int rc = mpk_writer_finish(w);
  mpk_writer_destroy(w);
  assert_int_equal(rc, 0);
  return path;
}

static void roundtrip(void **state) {
  (void)state;
  const char *path = write_pkg("good", NULL);
  mpk_package *p;
  assert_int_equal(mpk_open(path, &p), 0);
  assert_int_equal(mpk_verify(p), 0);
  assert_string_equal(mpk_name(p), "t");
  assert_string_equal(mpk_model_version(p), "7");
  assert_string_equal(mpk_kind(p), "causal-lm");
  assert_string_equal(mpk_rope_layout(p), "half");
  assert_int_equal(json_integer_value(json_object_get(mpk_config(p), "hidden_size")), 64);
  assert_int_equal(mpk_tensor_count(p), 2);
  servd_tensor *t, *q;
  assert_int_equal(mpk_tensor(p, "model.layers.0.self_attn.q_proj.weight", &t), 0);
  assert_int_equal(mpk_tensor(p, "q", &q), 0);
  assert_int_equal(mpk_tensor(p, "absent", &(servd_tensor *){NULL}), SERVD_EINVAL);
  const void *d;
  size_t n;
  assert_int_equal(mpk_file(p, "code/llama/model.py", &d, &n), 0);
  assert_int_equal(n, 6);
  assert_memory_equal(d, "x = 1\n", 6);
  for (int i = 0; i < mpk_tensor_count(p); i++) {
    mpk_tensor_info ti;
    assert_int_equal(mpk_tensor_info_at(p, i, &ti), 0);
    assert_int_equal(ti.offset % 64, 0); /* the alignment promise, from the index */
  }
  /* zero copy: the tensor points into the file mapping, 64-byte aligned in memory too */
  assert_int_equal(servd_storage_get_kind(t->storage), SERVD_STORAGE_BORROWED);
  assert_int_equal((uintptr_t)servd_tensor_data(t) % 64, 0);
  mpk_close(p); /* the views keep the mapping */
  assert_int_equal(t->shape[0], 3);
  assert_int_equal(t->dtype, SERVD_F32);
  assert_memory_equal(servd_tensor_data(t), wq, sizeof wq);
  assert_int_equal(q->dtype, SERVD_Q4_1);
  assert_int_equal(q->shape[1], 32);
  assert_memory_equal(servd_tensor_data(q), q4, sizeof q4);
  servd_tensor_release(t);
  servd_tensor_release(q);
  mpk_close(NULL);
}

static void atomic_write(void **state) {
  (void)state;
  char path[512];
  snprintf(path, sizeof path, "%s/atomic.mpk", dir);
  mpk_writer *w;
  assert_int_equal(mpk_writer_create(path, &w), 0);
  common_fields(w);
  assert_int_equal(mpk_writer_add_file(w, "tokenizer.json", "{}", 2), 0);
  struct stat st;
  assert_int_not_equal(stat(path, &st), 0); /* nothing under the final name while writing */
  int64_t s[1] = {4};
  float x[3] = {0};
  assert_int_not_equal(mpk_writer_add_tensor(w, "short", SERVD_F32, 1, s, x, sizeof x), 0); /* wrong size */
  assert_int_not_equal(mpk_writer_finish(w), 0); /* a failed writer cannot finish */
  mpk_writer_destroy(w);
  assert_int_not_equal(stat(path, &st), 0);
  char cmd[600];
  snprintf(cmd, sizeof cmd, "ls %s | grep -q atomic.mpk.tmp", dir);
  assert_int_not_equal(system(cmd), 0); /* and the temporary file is gone */
  /* bad names are refused by the writer */
  assert_int_equal(mpk_writer_create(path, &w), 0);
  assert_int_not_equal(mpk_writer_add_file(w, "../evil", "x", 1), 0);
  mpk_writer_destroy(w);
  assert_int_equal(mpk_writer_create(path, &w), 0);
  assert_int_not_equal(mpk_writer_add_file(w, "manifest.json", "{}", 2), 0); /* the writer's own */
  mpk_writer_destroy(w);
  assert_int_equal(mpk_writer_create(path, &w), 0);
  assert_int_equal(mpk_writer_add_file(w, "a.txt", "x", 1), 0);
  assert_int_not_equal(mpk_writer_add_file(w, "a.txt", "y", 1), 0); /* duplicate */
  mpk_writer_destroy(w);
  assert_int_equal(mpk_writer_create(path, &w), 0);
  assert_int_not_equal(mpk_writer_add_tensor(w, "a/b", SERVD_F32, 1, s, x, 16), 0);
  mpk_writer_destroy(w);
  mpk_writer_destroy(NULL);
}

static unsigned char *slurp(const char *path, size_t *len) {
  char *b;
  assert_int_equal(mpk__read_file(path, 1 << 30, &b, len), 0);
  return (unsigned char *)b;
}

static int open_bytes(const unsigned char *b, size_t len, bool verify) {
  char path[512];
  snprintf(path, sizeof path, "%s/mut.mpk", dir);
  assert_int_equal(mpk__write_file(path, b, len), 0);
  mpk_package *p = NULL;
  int rc = mpk_open(path, &p);
  if (rc == 0 && verify) rc = mpk_verify(p);
  if (rc) assert_non_null(strstr(servd_last_error(), "mut.mpk"));
  mpk_close(p);
  return rc;
}

/* Replaces every occurrence of `from` by `to` (same length). */
static int replace_all(unsigned char *b, size_t len, const char *from, const char *to) {
  size_t n = strlen(from);
  int k = 0;
  for (size_t i = 0; i + n <= len; i++)
    if (!memcmp(b + i, from, n)) {
      memcpy(b + i, to, n);
      k++;
    }
  return k;
}

static void bad_archives(void **state) {
  (void)state;
  const char *path = write_pkg("base", NULL);
  size_t len;
  unsigned char *good = slurp(path, &len), *b = malloc(len);
  assert_int_equal(open_bytes(good, len, true), 0);
  /* truncation anywhere */
  for (size_t n = 0; n < len; n += (n < 256 || n > len - 256) ? 1 : 61)
    assert_int_not_equal(open_bytes(good, n, false), 0);
  /* ".." and absolute entry names (local header and central directory agree) */
  memcpy(b, good, len);
  assert_true(replace_all(b, len, "code/llama/model.py", "code/../../model.py") >= 2);
  assert_int_equal(open_bytes(b, len, false), SERVD_EFORMAT);
  assert_non_null(strstr(servd_last_error(), ".."));
  memcpy(b, good, len);
  assert_true(replace_all(b, len, "code/llama/model.py", "/ode/llama/model.py") >= 2);
  assert_int_equal(open_bytes(b, len, false), SERVD_EFORMAT);
  /* a flipped data byte: open succeeds (no hashing), verify fails naming the entry */
  memcpy(b, good, len);
  size_t at = (size_t)((unsigned char *)memmem(b, len, "x = 1\n", 6) - b);
  b[at] = 'y';
  assert_int_equal(open_bytes(b, len, false), 0);
  assert_int_equal(open_bytes(b, len, true), SERVD_EFORMAT);
  assert_non_null(strstr(servd_last_error(), "code/llama/model.py"));
  /* local header offset in the central directory moved: bad signature / overlap */
  memcpy(b, good, len);
  unsigned char *cd = memmem(b, len, "PK\x01\x02", 4);
  assert_non_null(cd);
  cd[42] += 1;
  assert_int_equal(open_bytes(b, len, false), SERVD_EFORMAT);
  /* sizes that disagree between local header and central directory */
  memcpy(b, good, len);
  cd = memmem(b, len, "PK\x01\x02", 4);
  cd[20] += 1;
  assert_int_equal(open_bytes(b, len, false), SERVD_EFORMAT);
  /* encrypted flag, unknown method */
  memcpy(b, good, len);
  cd = memmem(b, len, "PK\x01\x02", 4);
  cd[8] |= 1;
  assert_int_equal(open_bytes(b, len, false), SERVD_EFORMAT);
  memcpy(b, good, len);
  cd = memmem(b, len, "PK\x01\x02", 4);
  cd[10] = 12;
  assert_int_equal(open_bytes(b, len, false), SERVD_EFORMAT);
  /* end record: entry count and central directory size beyond the file */
  memcpy(b, good, len);
  b[len - 22 + 10] = 0xff;
  b[len - 22 + 11] = 0x7f;
  b[len - 22 + 8] = 0xff;
  b[len - 22 + 9] = 0x7f;
  assert_int_equal(open_bytes(b, len, false), SERVD_EFORMAT);
  memcpy(b, good, len);
  b[len - 22 + 16] += 1; /* central directory offset */
  assert_int_equal(open_bytes(b, len, false), SERVD_EFORMAT);
  /* garbage appended after the end record */
  unsigned char *c = malloc(len + 5);
  memcpy(c, good, len);
  memcpy(c + len, "junk!", 5);
  assert_int_equal(open_bytes(c, len + 5, false), SERVD_EFORMAT);
  free(c);
  /* random single-byte corruption never crashes (exhaustive over the central directory) */
  size_t cdo = (size_t)((unsigned char *)memmem(good, len, "PK\x01\x02", 4) - good);
  for (size_t i = cdo; i < len; i++) {
    memcpy(b, good, len);
    b[i] ^= 0x5a;
    (void)open_bytes(b, len, true);
  }
  free(b);
  free(good);
}

static void bad_kind(mpk_writer *w) { mpk_writer_set(w, "kind", json_string("classifier")); }
static void bad_entry(mpk_writer *w) { mpk_writer_set(w, "entry_point", json_string("llama.model")); }
static void bad_rope(mpk_writer *w) { mpk_writer_set(w, "rope_layout", json_string("neox")); }
static void bad_tok(mpk_writer *w) { mpk_writer_set(w, "tokenizer", json_pack("{s:s}", "file", "missing.json")); }
static void bad_cfg(mpk_writer *w) { mpk_writer_set(w, "config", json_string("x")); }
/* KServe tensor metadata: a datatype KServe does not have, a shape of strings, a nameless tensor. */
static void bad_inputs_dt(mpk_writer *w) {
  mpk_writer_set(w, "inputs", json_pack("[{s:s,s:s,s:[i]}]", "name", "x", "datatype", "f32", "shape", 4));
}
static void bad_inputs_shape(mpk_writer *w) {
  mpk_writer_set(w, "inputs", json_pack("[{s:s,s:s,s:[s]}]", "name", "x", "datatype", "FP32", "shape", "batch"));
}
static void bad_outputs_name(mpk_writer *w) {
  mpk_writer_set(w, "outputs", json_pack("[{s:s,s:[i,i]}]", "datatype", "FP32", "shape", -1, 10));
}
static void bad_caps_unknown(mpk_writer *w) { mpk_writer_set(w, "capabilities", json_pack("[s]", "network")); }
static void bad_caps_twice(mpk_writer *w) { mpk_writer_set(w, "capabilities", json_pack("[s,s]", "fd", "fd")); }
static void bad_caps_string(mpk_writer *w) { mpk_writer_set(w, "capabilities", json_string("native")); }
static void good_specs(mpk_writer *w) {
  mpk_writer_set(w, "capabilities", json_pack("[s,s]", "native", "fd"));
  mpk_writer_set(w, "inputs", json_pack("[{s:s,s:s,s:[i,i]}]", "name", "x", "datatype", "FP32", "shape", -1, 64));
  mpk_writer_set(w, "outputs", json_pack("[{s:s,s:s,s:[i]}]", "name", "label", "datatype", "INT32", "shape", -1));
}

static json_t *base_index(void) {
  return json_pack("[{s:s,s:s,s:[i,i],s:s,s:i,s:i},{s:s,s:s,s:[i,i],s:s,s:i,s:i}]", "name",
                   "model.layers.0.self_attn.q_proj.weight", "dtype", "f32", "shape", 3, 64, "file",
                   "weights/model.layers.0.self_attn.q_proj.weight.safetensors", "offset", 128, "nbytes", 768, "name",
                   "q", "dtype", "q4_1", "shape", 2, 32, "file", "weights/q.safetensors", "offset", 128, "nbytes", 40);
}
static int idx_case;
static void bad_index(mpk_writer *w) {
  json_t *ix = base_index(), *t0 = json_array_get(ix, 0), *t1 = json_array_get(ix, 1);
  switch (idx_case) {
  case 0: json_object_set_new(t0, "nbytes", json_integer(764)); break;  /* size disagrees with dtype x shape */
  case 1: json_object_set_new(t0, "dtype", json_string("bf16")); break; /* dtype disagrees */
  case 2:
    json_object_set_new(t0, "offset", json_integer(64));
    json_object_set_new(t0, "nbytes", json_integer(768));
    break;                                                                /* not where the header says */
  case 3: json_object_set_new(t0, "offset", json_integer(100000)); break; /* past the entry */
  case 4: json_object_set_new(t0, "offset", json_integer(136)); break;    /* misaligned */
  case 5: json_object_set_new(t1, "name", json_string("model.layers.0.self_attn.q_proj.weight")); break; /* duplicate */
  case 6: json_object_set_new(t0, "file", json_string("weights/none.safetensors")); break;
  case 7:
    json_object_set_new(t0, "shape", json_pack("[I,I]", (json_int_t)1 << 40, (json_int_t)1 << 40));
    break; /* overflow */
  case 8: json_object_set_new(t0, "shape", json_pack("[i,i,i,i,i]", 1, 1, 1, 3, 64)); break;
  case 9: json_object_set_new(t1, "shape", json_pack("[i,i]", 4, 16)); break; /* q4_1 row not whole blocks */
  case 10: json_object_set_new(t0, "dtype", json_string("q9_9")); break;
  case 11: json_array_remove(ix, 1); break; /* a weight file's tensor not indexed */
  case 12:
    json_object_set_new(t1, "file", json_string("tokenizer.json"));
    json_object_set_new(t1, "offset", json_integer(0));
    break;
  case 13: json_object_set_new(t0, "offset", json_integer(-64)); break;
  case 14: json_object_set_new(t0, "name", json_string("../x")); break;
  }
  mpk__writer_replace_index(w, ix);
}
static void good_index(mpk_writer *w) { mpk__writer_replace_index(w, base_index()); }

static void bad_manifests(void **state) {
  (void)state;
  void (*cases[])(mpk_writer *) = {bad_kind,         bad_entry,      bad_rope,         bad_tok,
                                   bad_cfg,          bad_inputs_dt,  bad_inputs_shape, bad_outputs_name,
                                   bad_caps_unknown, bad_caps_twice, bad_caps_string};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    mpk_package *p = NULL;
    assert_int_equal(mpk_open(write_pkg("m", cases[i]), &p), SERVD_EFORMAT);
    assert_non_null(strstr(servd_last_error(), "manifest.json"));
  }
  mpk_package *p = NULL;
  assert_int_equal(mpk_open(write_pkg("g", good_index), &p), 0); /* the hand-written index is right */
  mpk_close(p);
  p = NULL;
  assert_int_equal(mpk_open(write_pkg("s", good_specs), &p), 0);
  json_t *in = json_object_get(mpk_manifest(p), "inputs");
  assert_string_equal(json_string_value(json_object_get(json_array_get(in, 0), "datatype")), "FP32");
  assert_int_equal(json_integer_value(json_array_get(json_object_get(json_array_get(in, 0), "shape"), 0)), -1);
  mpk_close(p);
  for (idx_case = 0; idx_case <= 14; idx_case++) {
    p = NULL;
    int rc = mpk_open(write_pkg("i", bad_index), &p);
    if (rc == 0) fail_msg("index case %d accepted", idx_case);
    assert_null(p);
  }
}

static void force64(mpk_writer *w) { mpk__writer_force_zip64(w); }

/* The zip64 forms (used for packages over 4 GiB), read back by our reader and by Python's zipfile
 * (an independent reader) when python3 is there. */
static void zip64(void **state) {
  (void)state;
  const char *path = write_pkg("z64", force64);
  size_t len;
  unsigned char *b = slurp(path, &len);
  assert_non_null(memmem(b, len, "PK\x06\x06", 4)); /* zip64 end record */
  assert_non_null(memmem(b, len, "PK\x06\x07", 4)); /* and its locator */
  free(b);
  mpk_package *p;
  assert_int_equal(mpk_open(path, &p), 0);
  assert_int_equal(mpk_verify(p), 0);
  servd_tensor *t;
  assert_int_equal(mpk_tensor(p, "q", &t), 0);
  assert_memory_equal(servd_tensor_data(t), q4, sizeof q4);
  servd_tensor_release(t);
  mpk_close(p);
  char cmd[700];
  snprintf(cmd, sizeof cmd,
           "command -v python3 >/dev/null || exit 0; python3 -c \"import zipfile,sys; z=zipfile.ZipFile(sys.argv[1]); "
           "assert z.testzip() is None; assert z.read('code/llama/model.py') == b'x = 1\\n'\" %s",
           path);
  assert_int_equal(system(cmd), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(roundtrip), cmocka_unit_test(zip64),
                                     cmocka_unit_test(atomic_write), cmocka_unit_test(bad_archives),
                                     cmocka_unit_test(bad_manifests)};
  return cmocka_run_group_tests(tests, setup, teardown);
}
