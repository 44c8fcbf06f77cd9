/* Paged KV cache: block accounting, thread safety of alloc/free, kv_write (read back through
 * attention over one key, which returns that key's value row exactly), and bad input. */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "servd/ops.h"

static float *f(const servd_tensor *t) { return servd_tensor_data(t); }

static servd_tensor *tnew(servd_dtype t, int ndim, int64_t a, int64_t b) {
  int64_t shape[2] = {a, b};
  servd_tensor *x = servd_tensor_new(t, ndim, shape);
  assert_non_null(x);
  return x;
}

static void test_accounting(void **state) {
  (void)state;
  servd_kv_cache *c = NULL;
  assert_int_equal(servd_kv_cache_create(&c, 2, 3, 64, 16, 10, SERVD_F16), 0);
  assert_int_equal(servd_kv_cache_block_size(c), 16);
  assert_int_equal(servd_kv_cache_n_blocks(c), 10);
  assert_int_equal(servd_kv_cache_free_blocks(c), 10);
  int32_t a[10], b[10];
  assert_int_equal(servd_kv_cache_alloc(c, 4, a), 0);
  assert_int_equal(servd_kv_cache_alloc(c, 6, a + 4), 0);
  assert_int_equal(servd_kv_cache_free_blocks(c), 0);
  bool seen[10] = {0};
  for (int i = 0; i < 10; i++) {
    assert_true(a[i] >= 0 && a[i] < 10 && !seen[a[i]]);
    seen[a[i]] = true;
  }
  assert_int_equal(servd_kv_cache_alloc(c, 1, b), SERVD_EBUSY);
  assert_non_null(strstr(servd_last_error(), "kv_cache_alloc"));
  servd_kv_cache_free(c, 3, a);
  assert_int_equal(servd_kv_cache_alloc(c, 4, b), SERVD_EBUSY); /* takes none */
  assert_int_equal(servd_kv_cache_free_blocks(c), 3);
  servd_kv_cache_free(c, 3, a);               /* double free: ignored */
  const int32_t stray[3] = {-1, 10, 1 << 30}; /* not ours: ignored */
  servd_kv_cache_free(c, 3, stray);
  assert_int_equal(servd_kv_cache_free_blocks(c), 3);
  assert_int_equal(servd_kv_cache_alloc(c, 3, b), 0);
  for (int i = 0; i < 3; i++) assert_int_equal(b[i], a[i]); /* freed blocks come back in their order */
  assert_int_equal(servd_kv_cache_alloc(c, 0, NULL), 0);
  servd_kv_cache_destroy(c);
  servd_kv_cache_destroy(NULL);
}

/* Shared blocks: a block returns to the free list only when its last holder frees it. */
static void test_refcounts(void **state) {
  (void)state;
  servd_kv_cache *c = NULL;
  assert_int_equal(servd_kv_cache_create_blocks_only(&c, 2, 3, 64, 16, 4), 0);
  int32_t a[4], b[4];
  assert_int_equal(servd_kv_cache_alloc(c, 2, a), 0);
  assert_int_equal(servd_kv_cache_refcount(c, a[0]), 1);
  assert_int_equal(servd_kv_cache_ref(c, 2, a), 0); /* a second holder */
  assert_int_equal(servd_kv_cache_ref(c, 1, a), 0); /* a third on a[0] */
  assert_int_equal(servd_kv_cache_refcount(c, a[0]), 3);
  assert_int_equal(servd_kv_cache_refcount(c, a[1]), 2);
  servd_kv_cache_free(c, 2, a);
  assert_int_equal(servd_kv_cache_free_blocks(c), 2); /* still held */
  servd_kv_cache_free(c, 2, a);
  assert_int_equal(servd_kv_cache_free_blocks(c), 3); /* a[1] is back, a[0] still held once */
  assert_int_equal(servd_kv_cache_refcount(c, a[1]), 0);
  assert_int_equal(servd_kv_cache_refcount(c, a[0]), 1);
  /* Only held blocks can be shared; a failed ref adds nothing. */
  const int32_t mixed[2] = {a[0], a[1]};
  assert_int_equal(servd_kv_cache_ref(c, 2, mixed), SERVD_EINVAL);
  assert_int_equal(servd_kv_cache_refcount(c, a[0]), 1);
  const int32_t bad[1] = {7};
  assert_int_equal(servd_kv_cache_ref(c, 1, bad), SERVD_EINVAL);
  assert_int_equal(servd_kv_cache_refcount(c, 7), 0);
  assert_int_equal(servd_kv_cache_alloc(c, 3, b), 0);
  for (int i = 0; i < 3; i++) assert_int_not_equal(b[i], a[0]);
  servd_kv_cache_free(c, 1, a);
  servd_kv_cache_free(c, 3, b);
  assert_int_equal(servd_kv_cache_free_blocks(c), 4);
  servd_kv_cache_destroy(c);
}

typedef struct churn_arg {
  servd_kv_cache *c;
  atomic_int *owner; /* per block: 0 free, else thread id + 1 */
  int id;
  atomic_int *errors;
} churn_arg;

static void *churn(void *p) {
  churn_arg *a = p;
  int32_t ids[5];
  for (int it = 0; it < 20000; it++) {
    int n = 1 + (it + a->id) % 5;
    if (servd_kv_cache_alloc(a->c, n, ids) != 0) continue; /* EBUSY under contention is fine */
    for (int i = 0; i < n; i++) {
      int expect = 0;
      if (!atomic_compare_exchange_strong(&a->owner[ids[i]], &expect, a->id + 1)) atomic_fetch_add(a->errors, 1);
    }
    for (int i = 0; i < n; i++) atomic_store(&a->owner[ids[i]], 0);
    servd_kv_cache_free(a->c, n, ids);
  }
  return NULL;
}

static void test_threads(void **state) {
  (void)state;
  servd_kv_cache *c = NULL;
  assert_int_equal(servd_kv_cache_create(&c, 1, 1, 8, 4, 12, SERVD_F32), 0);
  atomic_int owner[12], errors = 0;
  for (int i = 0; i < 12; i++) atomic_init(&owner[i], 0);
  pthread_t th[4];
  churn_arg args[4];
  for (int t = 0; t < 4; t++) {
    args[t] = (churn_arg){c, owner, t, &errors};
    assert_int_equal(pthread_create(&th[t], NULL, churn, &args[t]), 0);
  }
  for (int t = 0; t < 4; t++) pthread_join(th[t], NULL);
  assert_int_equal(atomic_load(&errors), 0); /* no block was ever handed to two holders */
  assert_int_equal(servd_kv_cache_free_blocks(c), 12);
  servd_kv_cache_destroy(c);
}

/* What the cache gives back for value i of a row of n_kv head vectors of hd values: dt's rounding of
 * the value, and for q8_0 / q4_0 the reference quantizer's over the value's block of 32. */
static float stored(servd_dtype dt, const float *row, int i) {
  if (dt == SERVD_F16) return servd_f16_to_f32(servd_f32_to_f16(row[i]));
  if (dt == SERVD_BF16) return servd_bf16_to_f32(servd_f32_to_bf16(row[i]));
  if (dt != SERVD_Q8_0 && dt != SERVD_Q4_0) return row[i];
  char blk[34];
  float back[32];
  assert_int_equal(servd_row_from_f32(dt, row + i / 32 * 32, blk, 32), 0);
  assert_int_equal(servd_row_to_f32(dt, blk, back, 32), 0);
  return back[i % 32];
}

/* kv_write into scattered slots of both layers, read back through attention. */
static void check_write(servd_dtype dt) {
  const bool quant = dt == SERVD_Q8_0 || dt == SERVD_Q4_0;
  const int n_kv = 3, hd = quant ? 32 : 20, bs = 4, nb = 6; /* quantized: blocks of 32 dims */
  servd_kv_cache *c = NULL;
  assert_int_equal(servd_kv_cache_create(&c, 2, n_kv, hd, bs, nb, dt), 0);
  int32_t all[6];
  assert_int_equal(servd_kv_cache_alloc(c, nb, all), 0);
  const int t = 5;
  const int32_t slots_v[5] = {0, 23, 9, 14, 5};
  servd_tensor *k = tnew(SERVD_F32, 2, t, n_kv * hd), *v = tnew(SERVD_F32, 2, t, n_kv * hd);
  servd_tensor *slots = tnew(SERVD_I32, 1, t, 0);
  memcpy(servd_tensor_data(slots), slots_v, sizeof slots_v);
  for (int layer = 0; layer < 2; layer++) {
    for (int i = 0; i < t * n_kv * hd; i++) {
      f(k)[i] = (float)(i % 7) * 0.1f;
      f(v)[i] = (float)i * 0.01f + (float)layer * 100.0f + 1.0f / 3.0f;
    }
    assert_int_equal(servd_kv_write(c, layer, k, v, slots), 0);
  }
  servd_tensor *q = tnew(SERVD_F32, 2, 1, n_kv * hd), *o = tnew(SERVD_F32, 2, 1, n_kv * hd);
  { /* slot 0 is offset 0 of its block: a one-key sequence reads it directly, in layer 0 */
    int32_t table[1] = {0};
    const int32_t *tables[1] = {table};
    int32_t qs = 0, ql = 1, kl = 1;
    servd_attn_batch b = {1, &qs, &ql, &kl, tables};
    for (int i = 0; i < n_kv * hd; i++) f(q)[i] = 0.3f;
    assert_int_equal(servd_attention(o, q, c, 0, &b, n_kv, 0.125f), 0);
    for (int i = 0; i < n_kv * hd; i++) {
      float row0[96];
      for (int e = 0; e < n_kv * hd; e++) row0[e] = (float)e * 0.01f + 1.0f / 3.0f; /* what layer 0 got */
      float want = stored(dt, row0, i);
      assert_float_equal(f(o)[i], want, 1e-6 * fabsf(want)); /* the one weight is exactly 1 */
    }
  }
  /* Read back through attention: fill every slot of the row's block up to its offset with that
   * row, so whatever the softmax weights, the visible values all equal it. Layer 0 keeps the first
   * write, so layer 1 also shows the layers do not share storage. */
  for (int r = 0; r < t; r++) {
    int32_t blk = slots_v[r] / bs, off = slots_v[r] % bs;
    servd_tensor *k1 = tnew(SERVD_F32, 2, bs, n_kv * hd), *v1 = tnew(SERVD_F32, 2, bs, n_kv * hd);
    servd_tensor *s1 = tnew(SERVD_I32, 1, bs, 0);
    for (int j = 0; j < bs; j++) {
      memcpy(f(k1) + j * n_kv * hd, f(k) + r * n_kv * hd, (size_t)n_kv * hd * sizeof(float));
      memcpy(f(v1) + j * n_kv * hd, f(v) + r * n_kv * hd, (size_t)n_kv * hd * sizeof(float));
      ((int32_t *)servd_tensor_data(s1))[j] = blk * bs + j;
    }
    assert_int_equal(servd_kv_write(c, 1, k1, v1, s1), 0);
    int32_t table[1] = {blk};
    const int32_t *tables[1] = {table};
    int32_t qs = 0, ql = 1, kl = off + 1;
    servd_attn_batch b = {1, &qs, &ql, &kl, tables};
    for (int i = 0; i < n_kv * hd; i++) f(q)[i] = 0.05f * (float)(i % 5);
    assert_int_equal(servd_attention(o, q, c, 1, &b, n_kv, 0.125f), 0);
    for (int i = 0; i < n_kv * hd; i++) {
      float want = stored(dt, f(v) + r * n_kv * hd, i);
      /* identical value rows averaged with weights summing to 1 in f32: a few ulp */
      assert_float_equal(f(o)[i], want, 4e-6 * fabsf(want));
    }
    servd_tensor_release(k1);
    servd_tensor_release(v1);
    servd_tensor_release(s1);
  }
  servd_tensor_release(k);
  servd_tensor_release(v);
  servd_tensor_release(slots);
  servd_tensor_release(q);
  servd_tensor_release(o);
  servd_kv_cache_destroy(c);
}

static void test_write_f32(void **state) {
  (void)state;
  check_write(SERVD_F32);
}
static void test_write_f16(void **state) {
  (void)state;
  check_write(SERVD_F16);
}

static void test_write_bf16(void **state) {
  (void)state;
  check_write(SERVD_BF16);
}
static void test_write_q8_0(void **state) {
  (void)state;
  check_write(SERVD_Q8_0);
}
static void test_write_q4_0(void **state) {
  (void)state;
  check_write(SERVD_Q4_0);
}

/* The pool's bytes per block: what the engine sizes its pool by. The default model's geometry (30
 * layers, 3 kv heads of 64 dims, blocks of 16): f16 2 KiB per run, q8_0 1088 bytes (64 codes and a
 * 2-byte scale per 32 dims, per token), q4_0 576; a quantized cache needs head_dim % 32 == 0. */
static void test_block_bytes(void **state) {
  (void)state;
  size_t f16 = servd_kv_cache_block_bytes(30, 3, 64, 16, SERVD_F16);
  size_t q8 = servd_kv_cache_block_bytes(30, 3, 64, 16, SERVD_Q8_0);
  size_t q4 = servd_kv_cache_block_bytes(30, 3, 64, 16, SERVD_Q4_0);
  assert_int_equal(f16, (size_t)30 * 3 * 2 * 2048);
  assert_int_equal(q8, (size_t)30 * 3 * 2 * 1088);
  assert_int_equal(q4, (size_t)30 * 3 * 2 * 576);
  assert_true((double)f16 / (double)q8 > 1.85);
  assert_int_equal(servd_kv_cache_block_bytes(30, 3, 64, 16, SERVD_BF16), f16);
  assert_int_equal(servd_kv_cache_block_bytes(30, 3, 48, 16, SERVD_Q8_0), 0);
  assert_int_equal(servd_kv_cache_block_bytes(30, 3, 64, 16, SERVD_Q4_1), 0);
  servd_kv_cache *c = NULL;
  assert_int_equal(servd_kv_cache_create(&c, 1, 1, 64, 16, 2, SERVD_Q8_0), 0);
  assert_int_equal(servd_kv_cache_dtype(c), SERVD_Q8_0);
  servd_kv_cache_destroy(c);
}

/* A block's bytes out of one cache and into a block of another make attention there read the same
 * keys and values: the same output, bit for bit. */
static void test_block_read_write(void **state) {
  (void)state;
  const int n_kv = 2, hd = 64, bs = 16, w = n_kv * hd;
  servd_kv_cache *a = NULL, *b = NULL;
  assert_int_equal(servd_kv_cache_create(&a, 3, n_kv, hd, bs, 4, SERVD_Q8_0), 0);
  assert_int_equal(servd_kv_cache_create(&b, 3, n_kv, hd, bs, 4, SERVD_Q8_0), 0);
  int32_t ids[4];
  assert_int_equal(servd_kv_cache_alloc(a, 4, ids), 0);
  assert_int_equal(servd_kv_cache_alloc(b, 4, ids), 0);
  servd_tensor *k = tnew(SERVD_F32, 2, bs, w), *v = tnew(SERVD_F32, 2, bs, w), *sl = tnew(SERVD_I32, 1, bs, 0);
  for (int i = 0; i < bs * w; i++) {
    f(k)[i] = sinf((float)i);
    f(v)[i] = cosf((float)i * 0.7f);
  }
  for (int j = 0; j < bs; j++) ((int32_t *)servd_tensor_data(sl))[j] = 1 * bs + j; /* block 1 of a */
  for (int l = 0; l < 3; l++) assert_int_equal(servd_kv_write(a, l, k, v, sl), 0);
  size_t n = servd_kv_cache_block_bytes(3, n_kv, hd, bs, SERVD_Q8_0);
  char *buf = test_malloc(n);
  assert_int_equal(servd_kv_cache_block_read(a, 1, buf), 0);
  assert_int_equal(servd_kv_cache_block_write(b, 3, buf), 0); /* block 3 of b */
  servd_tensor *q = tnew(SERVD_F32, 2, 1, w), *oa = tnew(SERVD_F32, 2, 1, w), *ob = tnew(SERVD_F32, 2, 1, w);
  for (int i = 0; i < w; i++) f(q)[i] = 0.1f * (float)(i % 9);
  int32_t ta[1] = {1}, tb[1] = {3}, qs = 0, ql = 1, kl = bs;
  const int32_t *tables_a[1] = {ta}, *tables_b[1] = {tb};
  servd_attn_batch ba = {1, &qs, &ql, &kl, tables_a}, bb = {1, &qs, &ql, &kl, tables_b};
  for (int l = 0; l < 3; l++) {
    assert_int_equal(servd_attention(oa, q, a, l, &ba, n_kv, 0.125f), 0);
    assert_int_equal(servd_attention(ob, q, b, l, &bb, n_kv, 0.125f), 0);
    assert_memory_equal(f(oa), f(ob), (size_t)w * sizeof(float));
  }
  assert_int_equal(servd_kv_cache_block_read(a, 4, buf), SERVD_EINVAL);
  assert_non_null(strstr(servd_last_error(), "block 4 outside [0, 4)"));
  servd_kv_cache *only = NULL;
  assert_int_equal(servd_kv_cache_create_blocks_only(&only, 3, n_kv, hd, bs, 4), 0);
  assert_int_equal(servd_kv_cache_block_write(only, 0, buf), SERVD_EINVAL);
  servd_kv_cache_destroy(only);
  test_free(buf);
  servd_tensor_release(k);
  servd_tensor_release(v);
  servd_tensor_release(sl);
  servd_tensor_release(q);
  servd_tensor_release(oa);
  servd_tensor_release(ob);
  servd_kv_cache_destroy(a);
  servd_kv_cache_destroy(b);
}

static void test_bad_input(void **state) {
  (void)state;
  servd_kv_cache *c = NULL;
  assert_int_equal(servd_kv_cache_create(&c, 1, 2, 8, 4, 3, SERVD_Q4_1), SERVD_EINVAL);
  assert_non_null(strstr(servd_last_error(), "q4_1"));
  assert_int_equal(servd_kv_cache_create(&c, 1, 2, 48, 4, 3, SERVD_Q8_0), SERVD_EINVAL);
  assert_non_null(strstr(servd_last_error(), "head_dim 48"));
  assert_int_equal(servd_kv_cache_create(&c, 1, 0, 8, 4, 3, SERVD_F32), SERVD_EINVAL);
  assert_int_equal(servd_kv_cache_create(&c, 1 << 20, 64, 1024, 1024, 1 << 20, SERVD_F32), SERVD_ERANGE);
  assert_int_equal(servd_kv_cache_create(&c, 2, 2, 8, 4, 3, SERVD_F32), 0);
  servd_tensor *k = tnew(SERVD_F32, 2, 2, 16), *v = tnew(SERVD_F32, 2, 2, 16), *bad = tnew(SERVD_F32, 2, 2, 15);
  servd_tensor *kh = tnew(SERVD_F16, 2, 2, 16), *slots = tnew(SERVD_I32, 1, 2, 0), *s3 = tnew(SERVD_I32, 1, 3, 0);
  int32_t *sl = servd_tensor_data(slots);
  sl[0] = 0;
  sl[1] = 11;
  assert_int_equal(servd_kv_write(c, 0, k, v, slots), 0);
  assert_int_equal(servd_kv_write(c, 2, k, v, slots), SERVD_EINVAL);
  assert_non_null(strstr(servd_last_error(), "kv_write"));
  assert_non_null(strstr(servd_last_error(), "layer"));
  assert_int_equal(servd_kv_write(c, 0, k, bad, slots), SERVD_EINVAL);
  assert_non_null(strstr(servd_last_error(), "f32[2,15]"));
  assert_int_equal(servd_kv_write(c, 0, kh, v, slots), SERVD_EINVAL);
  assert_non_null(strstr(servd_last_error(), "f16[2,16]"));
  assert_int_equal(servd_kv_write(c, 0, k, v, s3), SERVD_EINVAL);
  assert_non_null(strstr(servd_last_error(), "i32[3]"));
  sl[1] = 12; /* 3 blocks of 4: slots [0, 12) */
  assert_int_equal(servd_kv_write(c, 0, k, v, slots), SERVD_EINVAL);
  assert_non_null(strstr(servd_last_error(), "slots[1] = 12"));
  sl[1] = -1;
  assert_int_equal(servd_kv_write(c, 0, k, v, slots), SERVD_EINVAL);
  servd_tensor_release(k);
  servd_tensor_release(v);
  servd_tensor_release(bad);
  servd_tensor_release(kh);
  servd_tensor_release(slots);
  servd_tensor_release(s3);
  servd_kv_cache_destroy(c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_accounting),       cmocka_unit_test(test_refcounts),  cmocka_unit_test(test_threads),
      cmocka_unit_test(test_write_f32),        cmocka_unit_test(test_write_f16),  cmocka_unit_test(test_write_bf16),
      cmocka_unit_test(test_write_q8_0),       cmocka_unit_test(test_write_q4_0), cmocka_unit_test(test_block_bytes),
      cmocka_unit_test(test_block_read_write), cmocka_unit_test(test_bad_input),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
