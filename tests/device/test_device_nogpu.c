/* servd/device.h where no GPU is usable (no CUDA backend, or no driver/device): discovery says why,
 * every call that needs a device fails with SERVD_EDEVICE naming the call (and never crashes), and
 * bad arguments fail with SERVD_EINVAL before any CUDA call, the same way in both builds. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "servd/device.h"

static bool have_device(void) {
  int n = 0;
  char why[256];
  servd_device_count(&n, why, sizeof why);
  return n > 0;
}

#define SKIP_IF_DEVICE() \
  do { \
    if (have_device()) skip(); \
  } while (0)

/* rc is `code` and the last error mentions `needle`. */
#define assert_fails(call, code, needle) \
  do { \
    int rc_ = (call); \
    if (rc_ != (code) || !strstr(servd_last_error(), (needle))) \
      fail_msg("%s: rc %d (want %d), message '%s' (want '%s')", #call, rc_, (code), servd_last_error(), (needle)); \
  } while (0)

/* A host tensor labelled as on `device`: lets shape checks run without a GPU. Device code must
 * reject it on shapes before it could touch the memory. */
static servd_tensor *fake(servd_dtype t, int device, int64_t r, int64_t c) {
  int64_t shape[2] = {r, c};
  servd_tensor *x = servd_tensor_new(t, c < 0 ? 1 : 2, shape);
  assert_non_null(x);
  x->device = device;
  return x;
}

static void test_count_and_built(void **state) {
  (void)state;
  assert_int_equal(servd_device_built(), SERVD_TEST_BUILT_CUDA ? true : false);
  int n = -1;
  char why[256] = "unset";
  assert_int_equal(servd_device_count(&n, why, sizeof why), SERVD_OK);
  assert_true(n >= 0);
  if (n > 0) skip();
  assert_true(strlen(why) > 0);
  if (!SERVD_TEST_BUILT_CUDA) assert_non_null(strstr(why, "built without CUDA"));
  else assert_non_null(strstr(why, "CUDA"));
  assert_int_equal(servd_device_count(&n, NULL, 0), SERVD_OK); /* why may be NULL */
  assert_int_equal(n, 0);
}

static void test_calls_fail_with_edevice(void **state) {
  (void)state;
  SKIP_IF_DEVICE();
  int64_t shape[2] = {4, 8};
  servd_tensor *t = (servd_tensor *)0x1;
  assert_fails(servd_device_tensor_new(0, SERVD_BF16, 2, shape, &t), SERVD_EDEVICE, "device_tensor_new");
  assert_null(t);

  servd_tensor *host = servd_tensor_new(SERVD_F32, 2, shape);
  assert_non_null(host);
  t = (servd_tensor *)0x1;
  assert_fails(servd_device_upload(0, host, SERVD_BF16, &t), SERVD_EDEVICE, "device_upload");
  assert_null(t);
  t = (servd_tensor *)0x1;
  assert_fails(servd_device_weight(0, host, &t), SERVD_EDEVICE, "device_weight");
  assert_null(t);
  assert_int_equal(servd_device_weights_bytes(0), 0);

  servd_device_kv *kv = (servd_device_kv *)0x1;
  assert_fails(servd_device_kv_create(0, 2, 64, 16, 8, &kv), SERVD_EDEVICE, "device_kv_create");
  assert_null(kv);
  servd_device_batch *db = (servd_device_batch *)0x1;
  assert_fails(servd_device_batch_create(0, 64, 8, 16, &db), SERVD_EDEVICE, "device_batch_create");
  assert_null(db);
  int devs[2] = {0, 1};
  servd_device_comm *comm = (servd_device_comm *)0x1;
  assert_fails(servd_device_comm_create(2, devs, &comm), SERVD_EDEVICE, "device_comm_create");
  assert_null(comm);
  assert_fails(servd_device_graph_begin(0), SERVD_EDEVICE, "device_graph_begin");
  servd_device_graph *g = (servd_device_graph *)0x1;
  assert_int_not_equal(servd_device_graph_end(0, &g), SERVD_OK); /* nothing is being captured */
  assert_null(g);
  assert_fails(servd_device_sync(0), SERVD_EDEVICE, "device_sync");
  servd_device_thread_release(); /* nothing to release: a no-op */
  char buf[64];
  assert_fails(servd_device_matmul_tune(0, 64, 64, buf, sizeof buf), SERVD_EDEVICE, "matmul tune");
  assert_fails(servd_device_describe(0, buf, sizeof buf), SERVD_EDEVICE, "device_describe");
  size_t fr = 1, tot = 1;
  assert_fails(servd_device_mem_info(0, &fr, &tot), SERVD_EDEVICE, "device_mem_info");
  assert_int_equal(fr, 0);
  assert_int_equal(tot, 0);

  /* Well-formed "device" tensors: the op gets past its checks and fails on the missing device,
   * without touching the (host) memory behind them. */
  servd_tensor *x = fake(SERVD_BF16, 0, 2, 8), *w = fake(SERVD_BF16, 0, 3, 8), *o = fake(SERVD_F32, 0, 2, 3);
  assert_fails(servd_device_matmul(o, x, w), SERVD_EDEVICE, "matmul");
  servd_tensor *dst = servd_tensor_new(SERVD_BF16, 2, (int64_t[]){2, 8});
  assert_fails(servd_device_copy(dst, x), SERVD_EDEVICE, "device_copy");
  servd_tensor_release(dst);
  servd_tensor_release(x);
  servd_tensor_release(w);
  servd_tensor_release(o);
  servd_tensor_release(host);
}

static void test_null_and_queries(void **state) {
  (void)state;
  servd_device_kv_destroy(NULL);
  servd_device_batch_destroy(NULL);
  servd_device_comm_destroy(NULL);
  servd_device_graph_destroy(NULL);
  servd_device_comm_abort(NULL);
  servd_device_weights_trim();
  (void)servd_device_generation(0);
  assert_int_equal(servd_device_kv_device(NULL), -1);
  /* 2 layers x (K and V) x 8 dims x 16 slots x 10 blocks x 2 bytes. */
  assert_int_equal(servd_device_kv_bytes(2, 8, 16, 10), 2 * 2 * 8 * 16 * 10 * 2);
  assert_null(servd_device_batch_tensor(NULL, SERVD_DB_TOKENS));
  int mt = -1, ms = -1;
  assert_int_not_equal(servd_device_batch_capacity(NULL, &mt, &ms), SERVD_OK);
  assert_int_equal(mt, 0);
  assert_int_equal(ms, 0);
}

static void test_tensor_new_arguments(void **state) {
  (void)state;
  int64_t shape[5] = {2, 3, 4, 5, 6}, neg[2] = {2, -3};
  servd_tensor *t = (servd_tensor *)0x1;
  assert_fails(servd_device_tensor_new(0, SERVD_BF16, -1, shape, &t), SERVD_EINVAL, "ndim -1");
  assert_null(t);
  assert_fails(servd_device_tensor_new(0, SERVD_BF16, 5, shape, &t), SERVD_EINVAL, "ndim 5");
  assert_fails(servd_device_tensor_new(0, SERVD_Q4_0, 2, shape, &t), SERVD_EINVAL, "q4_0");
  assert_fails(servd_device_tensor_new(0, SERVD_F16, 2, shape, &t), SERVD_EINVAL, "not a device dtype");
  assert_fails(servd_device_tensor_new(0, (servd_dtype)99, 2, shape, &t), SERVD_EINVAL, "device_tensor_new");
  assert_fails(servd_device_tensor_new(0, SERVD_F32, 2, neg, &t), SERVD_EINVAL, "negative");
  assert_fails(servd_device_tensor_new(0, SERVD_F32, 2, NULL, &t), SERVD_EINVAL, "device_tensor_new");
  assert_null(t);
}

static void test_upload_arguments(void **state) {
  (void)state;
  servd_tensor *t = (servd_tensor *)0x1;
  assert_fails(servd_device_upload(0, NULL, SERVD_BF16, &t), SERVD_EINVAL, "NULL host");
  assert_null(t);
  servd_tensor *ids = servd_tensor_new(SERVD_I32, 1, (int64_t[]){4});
  servd_tensor *f = servd_tensor_new(SERVD_F32, 1, (int64_t[]){4});
  assert_fails(servd_device_upload(0, ids, SERVD_BF16, &t), SERVD_EINVAL, "cannot convert i32[4]");
  assert_fails(servd_device_upload(0, f, SERVD_I32, &t), SERVD_EINVAL, "cannot convert f32[4]");
  /* block dtypes go to a device only as they are (dequantize reads them there) */
  assert_fails(servd_device_upload(0, f, SERVD_Q8_0, &t), SERVD_EINVAL, "cannot convert f32[4] on the host to q8_0");
  assert_fails(servd_device_weight(0, ids, &t), SERVD_EINVAL, "device_weight: cannot convert");
  f->device = 0; /* a device tensor is no upload source */
  assert_fails(servd_device_upload(0, f, SERVD_BF16, &t), SERVD_EINVAL, "not on the host");
  assert_null(t);
  servd_tensor_release(ids);
  servd_tensor_release(f);
}

static void test_object_arguments(void **state) {
  (void)state;
  servd_device_kv *kv = (servd_device_kv *)0x1;
  assert_fails(servd_device_kv_create(0, 0, 64, 16, 8, &kv), SERVD_EINVAL, "device_kv_create: n_layers 0");
  assert_fails(servd_device_kv_create(0, 2, 64, -1, 8, &kv), SERVD_EINVAL, "block_size -1");
  assert_null(kv);
  servd_device_batch *db = (servd_device_batch *)0x1;
  assert_fails(servd_device_batch_create(0, 0, 8, 16, &db), SERVD_EINVAL, "device_batch_create: max_tokens 0");
  assert_null(db);
  servd_device_comm *c = (servd_device_comm *)0x1;
  assert_fails(servd_device_comm_create(2, (int[]){0, 0}, &c), SERVD_EINVAL, "both on device 0");
  assert_fails(servd_device_comm_create(0, (int[]){0}, &c), SERVD_EINVAL, "world_size 0");
  assert_fails(servd_device_comm_create(1, NULL, &c), SERVD_EINVAL, "NULL devices");
  assert_null(c);
}

static void test_op_arguments(void **state) {
  (void)state;
  servd_tensor *x = fake(SERVD_BF16, 0, 2, 8), *w = fake(SERVD_BF16, 0, 3, 16), *o = fake(SERVD_BF16, 0, 2, 3);
  /* k of x (8) and w (16) differ: the message names the op and every shape. */
  assert_fails(servd_device_matmul(o, x, w), SERVD_EINVAL, "device matmul");
  assert_non_null(strstr(servd_last_error(), "bf16[2,8] on cuda:0"));
  assert_non_null(strstr(servd_last_error(), "bf16[3,16] on cuda:0"));
  servd_tensor *w1 = fake(SERVD_BF16, 1, 3, 8);
  assert_fails(servd_device_matmul(o, x, w1), SERVD_EINVAL, "different devices");
  servd_tensor *hw = fake(SERVD_BF16, -1, 3, 8);
  assert_fails(servd_device_matmul(o, x, hw), SERVD_EINVAL, "is not a device tensor");
  servd_tensor *xf = fake(SERVD_F32, 0, 2, 8), *w8 = fake(SERVD_BF16, 0, 3, 8);
  assert_fails(servd_device_matmul(o, xf, w8), SERVD_EINVAL, "must be bf16");
  servd_tensor *oi = fake(SERVD_I32, 0, 2, 3);
  assert_fails(servd_device_matmul(oi, x, w8), SERVD_EINVAL, "bf16 or f32");

  servd_tensor *a = fake(SERVD_BF16, 0, 2, 8), *b = fake(SERVD_BF16, 0, 2, 4);
  assert_fails(servd_device_add(a, a, b), SERVD_EINVAL, "device add");
  assert_fails(servd_device_swiglu(a, b, a), SERVD_EINVAL, "same shape");
  servd_tensor *rw = fake(SERVD_BF16, 0, 4, -1);
  assert_fails(servd_device_rmsnorm(a, a, rw, 1e-5f), SERVD_EINVAL, "weight bf16[4]");

  servd_tensor *logits = fake(SERVD_F32, 0, 2, 10), *am = fake(SERVD_I32, 0, 3, -1);
  assert_fails(servd_device_argmax(am, logits), SERVD_EINVAL, "device argmax");
  servd_tensor *vals = fake(SERVD_F32, 0, 2, 65), *idx = fake(SERVD_I32, 0, 2, 65);
  assert_fails(servd_device_topk(vals, idx, logits, 65), SERVD_EINVAL, "k 65");

  servd_tensor *table = fake(SERVD_BF16, 0, 10, 8), *ids = fake(SERVD_I32, 0, 3, -1);
  assert_fails(servd_device_embedding(a, table, ids, 0), SERVD_EINVAL, "device embedding");

  servd_tensor *pos = fake(SERVD_I32, 0, 2, -1);
  servd_rope_params rp = {.layout = SERVD_ROPE_HALF, .head_dim = 3, .theta = 10000.f};
  assert_fails(servd_device_rope(a, pos, &rp), SERVD_EINVAL, "head_dim 3");
  rp.head_dim = 16; /* width 8 is no multiple of 16 */
  assert_fails(servd_device_rope(a, pos, &rp), SERVD_EINVAL, "device rope");

  servd_tensor *h = servd_tensor_new(SERVD_BF16, 2, (int64_t[]){2, 8});
  assert_fails(servd_device_copy(h, h), SERVD_EINVAL, "both");
  assert_fails(servd_device_copy(h, b), SERVD_EINVAL, "same dtype and shape");
  assert_fails(servd_device_copy(NULL, b), SERVD_EINVAL, "NULL");

  servd_tensor *ts[] = {x, w, o, w1, hw, xf, w8, oi, a, b, rw, logits, am, vals, idx, table, ids, pos, h};
  for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) servd_tensor_release(ts[i]);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_count_and_built),  cmocka_unit_test(test_calls_fail_with_edevice),
      cmocka_unit_test(test_null_and_queries), cmocka_unit_test(test_tensor_new_arguments),
      cmocka_unit_test(test_upload_arguments), cmocka_unit_test(test_object_arguments),
      cmocka_unit_test(test_op_arguments),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
