/* Tensors: dtype table, storage ownership and refcounts, views, narrow, reshape, error paths. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "servd/blocks.h"
#include "servd/dtype_traits.h"
#include "servd/tensor.h"

static void test_dtypes(void **state) {
  (void)state;
  static const struct {
    const char *name;
    size_t be, bb;
  } want[] = {{"f32", 1, 4},      {"f16", 1, 2},      {"bf16", 1, 2},     {"i32", 1, 4},
              {"q8_0", 32, 34},   {"q4_0", 32, 18},   {"q4_1", 32, 20},   {"q4_k", 256, 144},
              {"q6_k", 256, 210}, {"q5_k", 256, 176}, {"q5_0", 32, 22},   {"q5_1", 32, 24},
              {"q2_k", 256, 84},  {"q3_k", 256, 110}, {"iq4_nl", 32, 18}, {"iq4_xs", 256, 136}};
  _Static_assert(sizeof want / sizeof want[0] == SERVD_DTYPE_COUNT, "every dtype listed");
  for (int t = 0; t < SERVD_DTYPE_COUNT; t++) {
    servd_dtype d;
    assert_string_equal(servd_dtype_name((servd_dtype)t), want[t].name);
    assert_int_equal(servd_dtype_from_name(want[t].name, &d), 0);
    assert_int_equal(d, t);
    assert_int_equal(servd_dtype_block_elems((servd_dtype)t), want[t].be);
    assert_int_equal(servd_dtype_block_bytes((servd_dtype)t), want[t].bb);
    assert_int_equal(servd_dtype_is_quantized((servd_dtype)t), want[t].be > 1);
  }
  servd_dtype d;
  assert_int_equal(servd_dtype_from_name("iq2_xs", &d), SERVD_EINVAL);
  assert_non_null(strstr(servd_last_error(), "iq2_xs"));
  assert_int_equal(servd_dtype_row_bytes(SERVD_Q4_1, 64), 40);
  assert_int_equal(servd_dtype_row_bytes(SERVD_BF16, 7), 14);
  assert_int_equal(servd_dtype_row_bytes(SERVD_Q8_0, 33), 0);
}

/* servd/dtypes.def's rows as data: the stored values, the GGUF types kept, and the block scales at
 * the offsets of servd/blocks.h's fields. */
static void test_dtype_traits(void **state) {
  (void)state;
  assert_int_equal(SERVD_Q8_0, 4);
  assert_int_equal(SERVD_Q4_1, 6);
  assert_int_equal(SERVD_IQ4_XS, 15);
#define SCALE(t, blk, field) \
  { t, offsetof(blk, field), #field }
  static const struct {
    servd_dtype t;
    size_t offset;
    const char *name;
  } scales[] = {SCALE(SERVD_Q8_0, servd_block_q8_0, d),    SCALE(SERVD_Q4_0, servd_block_q4_0, d),
                SCALE(SERVD_Q4_1, servd_block_q4_1, d),    SCALE(SERVD_Q4_1, servd_block_q4_1, m),
                SCALE(SERVD_Q4_K, servd_block_q4_k, d),    SCALE(SERVD_Q4_K, servd_block_q4_k, dmin),
                SCALE(SERVD_Q6_K, servd_block_q6_k, d),    SCALE(SERVD_Q5_K, servd_block_q5_k, d),
                SCALE(SERVD_Q5_K, servd_block_q5_k, dmin), SCALE(SERVD_Q5_0, servd_block_q5_0, d),
                SCALE(SERVD_Q5_1, servd_block_q5_1, d),    SCALE(SERVD_Q5_1, servd_block_q5_1, m),
                SCALE(SERVD_Q2_K, servd_block_q2_k, d),    SCALE(SERVD_Q2_K, servd_block_q2_k, dmin),
                SCALE(SERVD_Q3_K, servd_block_q3_k, d),    SCALE(SERVD_IQ4_NL, servd_block_iq4_nl, d),
                SCALE(SERVD_IQ4_XS, servd_block_iq4_xs, d)};
#undef SCALE
  int seen[SERVD_DTYPE_COUNT] = {0};
  for (size_t i = 0; i < sizeof scales / sizeof scales[0]; i++) {
    const servd_dtype_traits *tr = servd_dtype_get_traits(scales[i].t);
    const int k = seen[scales[i].t]++;
    assert_true(k < tr->n_scales);
    assert_int_equal(tr->scales[k].offset, scales[i].offset);
    assert_string_equal(tr->scales[k].name, scales[i].name);
  }
  /* ggml's type ids (gguf-py's GGMLQuantizationType); I32 and Q8_1 are not kept. */
  static const int ggml[SERVD_DTYPE_COUNT] = {0, 1, 30, -1, 8, 2, 3, 12, 14, 13, 6, 7, 10, 11, 20, 23};
  for (int t = 0; t < SERVD_DTYPE_COUNT; t++) {
    const servd_dtype_traits *tr = servd_dtype_get_traits((servd_dtype)t);
    assert_int_equal(seen[t], tr->n_scales);
    assert_int_equal(tr->n_scales > 0, servd_dtype_is_quantized((servd_dtype)t));
    assert_string_equal(tr->name, servd_dtype_name((servd_dtype)t));
    assert_int_equal(tr->ggml_type, ggml[t]);
    servd_dtype d;
    if (ggml[t] >= 0) {
      assert_int_equal(servd_dtype_from_ggml((uint32_t)ggml[t], &d), 0);
      assert_int_equal(d, t);
    }
  }
  servd_dtype d;
  assert_int_equal(servd_dtype_from_ggml(26, &d), SERVD_EUNSUPPORTED);
  assert_int_equal(servd_dtype_from_ggml(9, &d), SERVD_EUNSUPPORTED);
  assert_int_equal(servd_dtype_from_ggml(UINT32_MAX, &d), SERVD_EUNSUPPORTED);
  assert_null(servd_dtype_get_traits(SERVD_DTYPE_COUNT));
  char buf[160];
  assert_string_equal(servd_dtype_list(buf, sizeof buf, servd_dtype_quantized_name, "/", " or "),
                      "q8_0/q4_0/q4_1/q4_k/q6_k/q5_k/q5_0/q5_1/q2_k/q3_k/iq4_nl or iq4_xs");
  assert_string_equal(servd_dtype_list(buf, 12, NULL, " ", " "), "f32 f16 bf1"); /* truncated */
  assert_int_equal(servd_dtype_from_name("q9", &d), SERVD_EINVAL);
  assert_non_null(strstr(servd_last_error(), "(expected f32 f16 bf16 i32 q8_0"));
}

static void test_new_and_strides(void **state) {
  (void)state;
  servd_tensor *t = servd_tensor_new(SERVD_F32, 3, (int64_t[]){2, 3, 5});
  assert_non_null(t);
  assert_int_equal(t->strides[2], 4);
  assert_int_equal(t->strides[1], 20);
  assert_int_equal(t->strides[0], 60);
  assert_int_equal(servd_tensor_numel(t), 30);
  assert_int_equal(servd_tensor_nbytes(t), 120);
  assert_true(servd_tensor_is_contiguous(t));
  assert_int_equal((uintptr_t)servd_tensor_data(t) % SERVD_ALIGN, 0);
  for (int i = 0; i < 30; i++) assert_true(((float *)servd_tensor_data(t))[i] == 0.0f);
  char buf[64];
  assert_string_equal(servd_tensor_describe(t, buf, sizeof buf), "f32[2,3,5]");
  servd_tensor_release(t);

  servd_tensor *q = servd_tensor_new(SERVD_Q4_0, 2, (int64_t[]){3, 64});
  assert_non_null(q);
  assert_int_equal(q->strides[1], 0);
  assert_int_equal(q->strides[0], 36);
  assert_int_equal(servd_tensor_nbytes(q), 108);
  servd_tensor_release(q);

  assert_null(servd_tensor_new(SERVD_Q8_0, 2, (int64_t[]){3, 48}));
  assert_non_null(strstr(servd_last_error(), "q8_0"));
  assert_null(servd_tensor_new(SERVD_F32, 2, (int64_t[]){-1, 4}));
  assert_null(servd_tensor_new(SERVD_F32, 5, (int64_t[]){1, 1, 1, 1, 1}));
  assert_null(servd_tensor_new(SERVD_F32, 2, (int64_t[]){INT64_MAX / 2, 4}));
  servd_tensor_release(NULL);
  servd_storage_release(NULL);
}

static int released;
static void on_release(void *ctx) { released += *(int *)ctx; }

static void test_wrap_and_refcounts(void **state) {
  (void)state;
  static float data[64];
  int one = 1;
  released = 0;
  servd_storage *s = servd_storage_wrap(data, sizeof data, on_release, &one);
  assert_int_equal(servd_storage_get_kind(s), SERVD_STORAGE_BORROWED);
  servd_tensor *t = servd_tensor_from_storage(s, 16, SERVD_F32, 2, (int64_t[]){4, 12});
  assert_non_null(t);
  assert_ptr_equal(servd_tensor_data(t), (char *)data + 16);
  /* 16 + 4*12*4 = 208 <= 256; 6 rows (304 bytes) would run past the end. */
  assert_null(servd_tensor_from_storage(s, 16, SERVD_F32, 2, (int64_t[]){6, 12}));
  assert_null(servd_tensor_from_storage(s, 2, SERVD_F32, 1, (int64_t[]){4}));
  assert_non_null(strstr(servd_last_error(), "misaligned"));
  servd_storage_release(s);
  assert_int_equal(released, 0); /* the tensor still holds the storage */
  servd_tensor *v = servd_tensor_narrow(t, 0, 1, 2);
  servd_tensor_release(t);
  assert_int_equal(released, 0);
  servd_tensor_release(v);
  assert_int_equal(released, 1);
}

static void *hammer(void *arg) {
  servd_tensor *t = arg;
  for (int i = 0; i < 100000; i++) {
    servd_tensor_retain(t);
    servd_storage_retain(t->storage);
    servd_storage_release(t->storage);
    servd_tensor_release(t);
  }
  return NULL;
}

static void test_atomic_refcounts(void **state) {
  (void)state;
  servd_tensor *t = servd_tensor_new(SERVD_F32, 1, (int64_t[]){8});
  pthread_t th[4];
  for (int i = 0; i < 4; i++) pthread_create(&th[i], NULL, hammer, t);
  for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
  assert_int_equal(t->refcount, 1);
  servd_tensor_release(t); /* ASan reports a leak or double free if counts went wrong */
}

static void test_views(void **state) {
  (void)state;
  servd_tensor *t = servd_tensor_new(SERVD_F32, 2, (int64_t[]){4, 6});
  float *d = servd_tensor_data(t);
  for (int i = 0; i < 24; i++) d[i] = (float)i;
  /* Columns 2..5 of rows 1..3: a strided view. */
  servd_tensor *v = servd_tensor_view(t, 6 * 4 + 2 * 4, 2, (int64_t[]){3, 4}, (int64_t[]){24, 4});
  assert_non_null(v);
  assert_false(servd_tensor_is_contiguous(v));
  assert_true(((float *)servd_tensor_data(v))[0] == 8.0f);
  /* One more row would run past the storage. */
  assert_null(servd_tensor_view(t, 6 * 4 + 2 * 4, 2, (int64_t[]){4, 4}, (int64_t[]){24, 4}));
  /* Innermost must be contiguous. */
  assert_null(servd_tensor_view(t, 0, 2, (int64_t[]){2, 2}, (int64_t[]){24, 8}));
  servd_tensor *n = servd_tensor_narrow(v, 1, 1, 2);
  assert_true(((float *)servd_tensor_data(n))[0] == 9.0f);
  assert_null(servd_tensor_reshape(v, 1, (int64_t[]){12}));
  servd_tensor *r = servd_tensor_reshape(t, 3, (int64_t[]){2, 2, 6});
  assert_non_null(r);
  assert_int_equal(r->strides[0], 48);
  assert_null(servd_tensor_reshape(t, 1, (int64_t[]){25}));
  assert_null(servd_tensor_narrow(t, 0, 3, 2));
  assert_null(servd_tensor_narrow(t, 2, 0, 1));
  servd_tensor_release(r);
  servd_tensor_release(n);
  servd_tensor_release(v);

  servd_tensor *q = servd_tensor_new(SERVD_Q4_1, 2, (int64_t[]){2, 128});
  servd_tensor *qc = servd_tensor_narrow(q, 1, 32, 64);
  assert_non_null(qc);
  assert_int_equal((char *)servd_tensor_data(qc) - (char *)servd_tensor_data(q), 20);
  assert_null(servd_tensor_narrow(q, 1, 16, 32)); /* not whole blocks */
  servd_tensor_release(qc);
  servd_tensor_release(q);
  servd_tensor_release(t);
}

/* A message that wraps the previous one (servd_last_error() as an argument) keeps both parts. */
static void test_fail_wraps_last_error(void **state) {
  (void)state;
  assert_int_equal(servd_fail(SERVD_EIO, "inner cause %d", 7), SERVD_EIO);
  assert_int_equal(servd_fail(SERVD_EFORMAT, "model.mpk: %s", servd_last_error()), SERVD_EFORMAT);
  assert_string_equal(servd_last_error(), "model.mpk: inner cause 7");
  assert_int_equal(servd_fail(SERVD_EIO, "%s / %s", servd_last_error(), servd_last_error()), SERVD_EIO);
  assert_string_equal(servd_last_error(), "model.mpk: inner cause 7 / model.mpk: inner cause 7");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fail_wraps_last_error),
      cmocka_unit_test(test_dtypes),
      cmocka_unit_test(test_dtype_traits),
      cmocka_unit_test(test_new_and_strides),
      cmocka_unit_test(test_wrap_and_refcounts),
      cmocka_unit_test(test_atomic_refcounts),
      cmocka_unit_test(test_views),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
