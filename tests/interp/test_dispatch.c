/* The host table's op dispatch (interp/src/op_dispatch.c), in C without Python: host tensors reach the
 * CPU kernels, tensors on different devices are refused with a message naming the op and both devices,
 * and host-only ops refuse device tensors.
 *
 * "Device" tensors here are host tensors whose device field says cuda:N: enough for every refusal path,
 * which must fail before any kernel runs. They never reach a real device op: the one check that lets
 * all-device tensors through runs only when servd is built without CUDA (every device call then fails
 * with SERVD_EDEVICE and touches nothing). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "guest.h"
#include "op_dispatch.h"
#include "plan-impl.h"

const servd_host_api *servd_host_api__get(void); /* interp-impl.h, which needs Python headers */

static servd_tensor *mat(servd_dtype d, int64_t r, int64_t c, const float *v) {
  int64_t shape[2] = {r, c};
  servd_tensor *t = servd_tensor_new(d, 2, shape);
  assert_non_null(t);
  if (v)
    for (int64_t i = 0; i < r; i++)
      assert_int_equal(servd_row_from_f32(d, v + i * c, (char *)servd_tensor_data(t) + i * t->strides[0], c), 0);
  return t;
}

static void expect_fail(int rc, int code, const char *part) {
  if (rc != code || !strstr(servd_last_error(), part))
    fprintf(stderr, "rc %d, expected %d; message: %s; expected to contain: %s\n", rc, code, servd_last_error(), part);
  assert_int_equal(rc, code);
  assert_non_null(strstr(servd_last_error(), part));
}

/* All on the host: the CPU kernel runs (hand-computed result). */
static void test_host_runs_cpu_op(void **state) {
  (void)state;
  const float xv[] = {1, 2, 3, 4, 5, 6}, wv[] = {1, 0, 1, 0, 1, 1};
  servd_tensor *x = mat(SERVD_F32, 2, 3, xv), *w = mat(SERVD_F32, 2, 3, wv), *o = mat(SERVD_F32, 2, 2, NULL);
  assert_int_equal(servd_op__matmul(o, x, w), 0);
  const float *ov = servd_tensor_data(o);
  const float want[] = {4, 5, 10, 11}; /* [1+3, 2+3], [4+6, 5+6] */
  for (int i = 0; i < 4; i++) assert_true(ov[i] == want[i]);
  servd_tensor *y = mat(SERVD_F32, 2, 3, NULL);
  assert_int_equal(servd_op__add(y, x, x), 0);
  assert_true(((float *)servd_tensor_data(y))[5] == 12.0f);
  servd_tensor *am = servd_tensor_new(SERVD_I32, 1, (int64_t[]){2});
  assert_int_equal(servd_op__argmax(am, x), 0);
  assert_int_equal(((int32_t *)servd_tensor_data(am))[1], 2);
  servd_tensor_release(am);
  servd_tensor_release(y);
  servd_tensor_release(x);
  servd_tensor_release(w);
  servd_tensor_release(o);
}

/* Host and device mixed, or two devices: SERVD_EINVAL naming the op and both devices. */
static void test_mixed_devices_refused(void **state) {
  (void)state;
  servd_tensor *a = mat(SERVD_F32, 2, 4, NULL), *b = mat(SERVD_F32, 2, 4, NULL), *c = mat(SERVD_F32, 2, 4, NULL);
  b->device = 1;
  expect_fail(servd_op__matmul(a, b, c), SERVD_EINVAL, "matmul: out is on the cpu but x is on cuda:1");
  expect_fail(servd_op__matmul(a, c, b), SERVD_EINVAL, "matmul: out is on the cpu but w is on cuda:1");
  a->device = 0;
  c->device = 0;
  expect_fail(servd_op__matmul(a, c, b), SERVD_EINVAL, "matmul: out is on cuda:0 but w is on cuda:1");
  a->device = c->device = -1;
  expect_fail(servd_op__embedding(a, c, b, 0), SERVD_EINVAL, "embedding: out is on the cpu but ids is on cuda:1");
  expect_fail(servd_op__rmsnorm(a, b, c, 1e-5f), SERVD_EINVAL, "rmsnorm: out is on the cpu but x is on cuda:1");
  servd_rope_params p = {.layout = SERVD_ROPE_HALF, .head_dim = 4, .theta = 10000.0f, .scaling_factor = 1.0f};
  expect_fail(servd_op__rope(a, b, &p), SERVD_EINVAL, "rope: x is on the cpu but positions is on cuda:1");
  expect_fail(servd_op__swiglu(a, c, b), SERVD_EINVAL, "swiglu: out is on the cpu but up is on cuda:1");
  expect_fail(servd_op__add(b, a, c), SERVD_EINVAL, "add: out is on cuda:1 but a is on the cpu");
  expect_fail(servd_op__argmax(a, b), SERVD_EINVAL, "argmax: out is on the cpu but x is on cuda:1");
  expect_fail(servd_op__topk(a, c, b, 2), SERVD_EINVAL, "topk: values is on the cpu but x is on cuda:1");
  expect_fail(servd_op__matmul(a, NULL, c), SERVD_EINVAL, "matmul: x is NULL");
  b->device = -1; /* back to a host tensor before it is released (its storage is host memory) */
  servd_tensor_release(a);
  servd_tensor_release(b);
  servd_tensor_release(c);
}

/* Host-only ops (softmax, the host KV cache, the host communicator) refuse device tensors; device-only
 * ops refuse host tensors and missing device objects. All fail before touching the cache/comm. */
static void test_host_and_device_only(void **state) {
  (void)state;
  servd_tensor *h = mat(SERVD_F32, 2, 8, NULL), *d = mat(SERVD_F32, 2, 8, NULL);
  d->device = 2;
  expect_fail(servd_op__softmax(d, 1.0f), SERVD_EINVAL, "softmax: x is on cuda:2 but softmax runs on the host only");
  expect_fail(servd_op__kv_write(NULL, 0, d, d, d), SERVD_EINVAL,
              "kv_write: k is on cuda:2 but the KV cache is on the cpu");
  expect_fail(servd_op__kv_write(NULL, 0, h, d, h), SERVD_EINVAL, "kv_write: k is on the cpu but v is on cuda:2");
  expect_fail(servd_op__attention(d, d, NULL, 0, NULL, 2, 1.0f), SERVD_EINVAL,
              "attention: out is on cuda:2 but the KV cache is on the cpu");
  expect_fail(servd_op__allreduce_sum(NULL, 0, d), SERVD_EINVAL,
              "allreduce: x is on cuda:2 but the communicator is for host tensors");
  expect_fail(servd_op__allgather_cols(NULL, 0, h, d), SERVD_EINVAL,
              "allgather_cols: out is on the cpu but x is on cuda:2");
  expect_fail(servd_op__device_kv_write(NULL, 0, d, d, d), SERVD_EINVAL, "kv_write: no device KV cache");
  expect_fail(servd_op__device_attention(d, d, NULL, 0, NULL, 2, 1.0f), SERVD_EINVAL,
              "attention: the step has no device KV cache");
  expect_fail(servd_op__device_allreduce_sum(NULL, 0, h), SERVD_EINVAL,
              "allreduce: x is on the cpu but the communicator is for device tensors");
  expect_fail(servd_op__device_allgather_cols(NULL, 0, d, h), SERVD_EINVAL,
              "allgather_cols: out is on cuda:2 but x is on the cpu");
  d->device = -1;
  servd_tensor_release(h);
  servd_tensor_release(d);
}

/* Without the CUDA backend, all-device arguments reach servd_device_* and fail there, saying why. */
static void test_device_op_without_cuda(void **state) {
  (void)state;
  if (servd_device_built()) {
    skip(); /* a fake device tensor must never reach a real device op */
    return;
  }
  servd_tensor *a = mat(SERVD_BF16, 2, 4, NULL), *b = mat(SERVD_BF16, 2, 4, NULL);
  a->device = b->device = 0;
  expect_fail(servd_op__add(a, b, b), SERVD_EDEVICE, "built without CUDA");
  expect_fail(servd_op__copy(a, b), SERVD_EDEVICE, "built without CUDA");
  a->device = b->device = -1;
  servd_tensor_release(a);
  servd_tensor_release(b);
}

/* Host to host copy: strided rows of plain and block dtypes; mismatches and read-only dst refused. */
static void test_host_copy(void **state) {
  (void)state;
  const float v[] = {1, 2, 3, 4, 5, 6};
  servd_tensor *src = mat(SERVD_F32, 2, 3, v), *wide = mat(SERVD_F32, 2, 5, NULL);
  servd_tensor *dst = servd_tensor_narrow(wide, 1, 1, 3); /* columns 1..3 of each row: strided rows */
  assert_non_null(dst);
  assert_int_equal(servd_op__copy(dst, src), 0);
  const float *w = servd_tensor_data(wide);
  const float want[] = {0, 1, 2, 3, 0, 0, 4, 5, 6, 0};
  for (int i = 0; i < 10; i++) assert_true(w[i] == want[i]);

  /* q4_1: two rows of two blocks, byte-identical after the copy */
  float q[128];
  for (int i = 0; i < 128; i++) q[i] = (float)((i * 37) % 23) - 11.0f;
  servd_tensor *qs = mat(SERVD_Q4_1, 2, 64, q), *qd = mat(SERVD_Q4_1, 2, 64, NULL);
  assert_int_equal(servd_op__copy(qd, qs), 0);
  assert_memory_equal(servd_tensor_data(qd), servd_tensor_data(qs), servd_tensor_nbytes(qs));

  expect_fail(servd_op__copy(qd, src), SERVD_EINVAL, "copy: dst q4_1[2,64] and src f32[2,3] differ");
  static float ro[6];
  servd_storage *st = servd_storage_wrap(ro, sizeof ro, NULL, NULL);
  servd_tensor *borrowed = servd_tensor_from_storage(st, 0, SERVD_F32, 2, (int64_t[]){2, 3});
  servd_storage_release(st);
  expect_fail(servd_op__copy(borrowed, src), SERVD_EINVAL, "copy: dst is read-only");
  assert_true(ro[0] == 0.0f);
  servd_tensor_release(borrowed);
  servd_tensor_release(qs);
  servd_tensor_release(qd);
  servd_tensor_release(dst);
  servd_tensor_release(wide);
  servd_tensor_release(src);
}

/* The registry reaches the host table: one member per row, in order, each the row's dispatcher as
 * step plans record it (servd_plan__<name>, which runs servd_op__<name>). */
static void test_registry_table(void **state) {
  (void)state;
  const servd_host_api *api = servd_host_api__get();
  assert_int_equal(api->abi, SERVD_GUEST_ABI);
  assert_int_equal(api->size, sizeof(servd_host_api));
  int rows = 0;
#define SERVD_OP(name, dispatch, py, sig, names) \
  assert_true(api->name == servd_plan__##name); \
  assert_int_equal(SERVD_OP_##name, rows++);
#include "servd/ops.def"
#undef SERVD_OP
  assert_int_equal(rows, SERVD_OP_COUNT);
}

/* dequantize, an op added through the registry alone: host tensors reach the CPU kernel (one q8_0
 * block, by hand), mixed devices are refused by the generated dispatch, all-device tensors without
 * CUDA reach the generated stub, which checks the arguments first. */
static void test_dequantize_dispatch(void **state) {
  (void)state;
  servd_tensor *q = servd_tensor_new(SERVD_Q8_0, 2, (int64_t[]){1, 32}), *o = mat(SERVD_F32, 1, 32, NULL);
  assert_non_null(q);
  unsigned char *b = servd_tensor_data(q);
  b[0] = 0x00, b[1] = 0x40; /* d = 2.0 (f16 0x4000) */
  for (int i = 0; i < 32; i++) b[2 + i] = (unsigned char)(int8_t)(i - 3);
  assert_int_equal(servd_op__dequantize(o, q), 0);
  const float *ov = servd_tensor_data(o);
  for (int i = 0; i < 32; i++) assert_true(ov[i] == 2.0f * (float)(i - 3));
  q->device = 1;
  expect_fail(servd_op__dequantize(o, q), SERVD_EINVAL, "dequantize: out is on the cpu but x is on cuda:1");
  if (!servd_device_built()) {
    o->device = 1;
    expect_fail(servd_op__dequantize(o, q), SERVD_EDEVICE, "device dequantize: servd was built without CUDA");
    servd_tensor *wide = mat(SERVD_F32, 1, 64, NULL); /* the op's own contract, before any CUDA */
    wide->device = 1;
    expect_fail(servd_op__dequantize(wide, q), SERVD_EINVAL, "dequantize: expected x (..., n) q8_0/q4_0/q4_1");
    wide->device = -1;
    servd_tensor_release(wide);
  }
  q->device = o->device = -1;
  servd_tensor_release(q);
  servd_tensor_release(o);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_host_runs_cpu_op),
      cmocka_unit_test(test_mixed_devices_refused),
      cmocka_unit_test(test_host_and_device_only),
      cmocka_unit_test(test_device_op_without_cuda),
      cmocka_unit_test(test_host_copy),
      cmocka_unit_test(test_registry_table),
      cmocka_unit_test(test_dequantize_dispatch),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
