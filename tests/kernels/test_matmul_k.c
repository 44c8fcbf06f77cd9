/* k-quant weights (q4_k q6_k q5_k): the reference decoder against gguf-py's, the lookups built on it
 * (embedding, dequantize), the plain-rounding quantizer, and matmul on every ISA.
 *
 * Tolerances:
 * - decoder vs gguf-py (kquant_fixture.h, make_kquant_fixture.py): the same f32 operations in the
 *   same order, so equal up to 1 ulp of the value.
 * - matmul scalar reference vs f32 over the dequantized weights: activation rounding errs by at most
 *   d_x/2 = amax_b/254 per element, so |err| <= sum_b amax_b/254 * sum_{i in b}|w_i|; allowed 1.01x
 *   plus 2^-20 of sum|x*w|.
 * - SIMD vs the scalar reference: same q8_K activations, exact integer sub-block dots; they differ by
 *   f32 rounding of the weights' products (reference) and of the block terms (SIMD), each relative
 *   to the terms' magnitude, which per super-block is at most sum|x| * wmax_b (wmax_b from the block
 *   header: d*63*31 + dmin*63 for q4_k/q5_k, |d|*128*95 for q6_k); allowed (8 + 2*nb) * 2^-22 of it.
 *   A mis-unpacked bit changes a result by ~sqrt(k) weights, orders of magnitude above this.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define TEST_RNG_SEED 0x4b515541u
#include "test-util.h"

#include "kquant_fixture.h"
#include "servd/blocks.h"

static const servd_dtype kdtypes[] = {SERVD_Q4_K, SERVD_Q6_K, SERVD_Q5_K};

static const uint8_t *fixture_bytes(servd_dtype t) {
  return t == SERVD_Q4_K ? kq_q4_k_bytes : t == SERVD_Q6_K ? kq_q6_k_bytes : kq_q5_k_bytes;
}
static const float *fixture_values(servd_dtype t) {
  return t == SERVD_Q4_K ? kq_q4_k_values : t == SERVD_Q6_K ? kq_q6_k_values : kq_q5_k_values;
}

static void test_decoder_vs_ggufpy(void **state) {
  (void)state;
  enum { NB = KQ_FIXTURE_BLOCKS, K = SERVD_QK_K };
  float y[NB * K];
  for (size_t t = 0; t < sizeof kdtypes / sizeof *kdtypes; t++) {
    const servd_dtype dt = kdtypes[t];
    assert_int_equal(servd_row_to_f32(dt, fixture_bytes(dt), y, NB * K), 0);
    near_ggufpy(dt, "row", y, fixture_values(dt), NB * K);
    /* The same blocks as a (NB, 256) table: embedding rows and the dequantize op. */
    check_table_lookups(dt, fixture_bytes(dt), fixture_values(dt), NB, K, (const int32_t[]){2, 0, 1, 2}, 4);
    /* A row that is not whole super-blocks is refused. */
    assert_int_equal(servd_row_to_f32(dt, fixture_bytes(dt), y, 128), SERVD_EINVAL);
  }
}

/* Plain-rounding quantizer: every element within one grid step of its sub-block plus the scale
 * rounding (6-bit multiples of d: at most max step / 2 * levels / 63; q6_k 8-bit). A value in the
 * wrong nibble or high bits errs by a good part of the range instead. */
static void test_quantize_round_trip(void **state) {
  (void)state;
  enum { K = 2 * SERVD_QK_K };
  float x[K], y[K];
  uint8_t buf[2 * 210];
  for (size_t t = 0; t < sizeof kdtypes / sizeof *kdtypes; t++) {
    const servd_dtype dt = kdtypes[t];
    for (int trial = 0; trial < 4; trial++) {
      for (int i = 0; i < K; i++) x[i] = frand(-1.0f, 1.0f) * (float)(1 + (i / 32) % 5) + (trial == 3 ? 2.0f : 0.0f);
      assert_int_equal(servd_row_from_f32(dt, x, buf, K), 0);
      assert_int_equal(servd_row_to_f32(dt, buf, y, K), 0);
      const int g = dt == SERVD_Q6_K ? 16 : 32;
      const float levels = dt == SERVD_Q4_K ? 15.0f : dt == SERVD_Q5_K ? 31.0f : 31.0f;
      for (int b = 0; b < K / SERVD_QK_K; b++) {
        float max_step = 0.0f, max_min = 0.0f;
        for (int s = 0; s < SERVD_QK_K / g; s++) {
          float mn = dt == SERVD_Q6_K ? 0.0f : 0.0f, mx = 0.0f, am = 0.0f;
          for (int i = 0; i < g; i++) {
            const float v = x[b * SERVD_QK_K + s * g + i];
            mn = fminf(mn, v);
            mx = fmaxf(mx, v);
            am = fmaxf(am, fabsf(v));
          }
          max_step = fmaxf(max_step, dt == SERVD_Q6_K ? am / levels : (mx - mn) / levels);
          max_min = fmaxf(max_min, -mn);
        }
        for (int i = 0; i < SERVD_QK_K; i++) {
          const int e = b * SERVD_QK_K + i;
          const float bound = max_step * (0.5f + 0.51f * levels / (dt == SERVD_Q6_K ? 127.0f : 63.0f)) +
                              (dt == SERVD_Q6_K ? 0.0f : max_min / 126.0f) + 1e-3f * max_step;
          if (fabsf(y[e] - x[e]) > bound)
            fail_msg("%s trial %d: x[%d] = %g came back %g (bound %g)", servd_dtype_name(dt), trial, e, x[e], y[e],
                     bound);
        }
      }
    }
  }
}

/* A random but valid weight: random quanta and scales, d and dmin from f16 of small positive values
 * (q6_k: either sign). */
static servd_tensor *rand_kw(servd_dtype dt, int64_t n, int64_t k) {
  servd_tensor *w = tnew(dt, 2, n, k);
  const size_t bb = servd_dtype_block_bytes(dt);
  uint8_t *p = servd_tensor_data(w);
  for (int64_t b = 0; b < n * k / SERVD_QK_K; b++, p += bb) {
    for (size_t i = 0; i < bb; i++) p[i] = (uint8_t)(frand(0.0f, 256.0f));
    if (dt == SERVD_Q6_K) {
      const uint16_t d = servd_f32_to_f16(frand(-0.01f, 0.01f));
      memcpy(p + 208, &d, 2);
    } else {
      const uint16_t d = servd_f32_to_f16(frand(0.0005f, 0.01f)), dmin = servd_f32_to_f16(frand(0.0005f, 0.01f));
      memcpy(p, &d, 2);
      memcpy(p + 2, &dmin, 2);
    }
  }
  return w;
}

/* Bound on |term| per weight of super-block b of row j (see the tolerances above). */
static double wmax(servd_dtype dt, const servd_tensor *w, int64_t j, int64_t b) {
  const uint8_t *p = (const uint8_t *)servd_tensor_data(w) + j * w->strides[0] + b * servd_dtype_block_bytes(dt);
  uint16_t d, dmin;
  if (dt == SERVD_Q6_K) {
    memcpy(&d, p + 208, 2);
    return fabs(servd_f16_to_f32(d)) * 128 * 95;
  }
  memcpy(&d, p, 2);
  memcpy(&dmin, p + 2, 2);
  return servd_f16_to_f32(d) * 63 * 31 + servd_f16_to_f32(dmin) * 63;
}

typedef struct shape {
  int64_t m, n, k;
} shape;

static void check_case(servd_dtype dt, shape s) {
  check_quant_matmul(dt, rand_kw(dt, s.n, s.k), s.m, SERVD_QK_K, wmax);
}

static void test_matmul_kquant(void **state) {
  (void)state;
  /* decode (m = 1), odd row counts around the 4-row tile, more than one 128-row block (prefill),
   * column counts off the 32-column item size; batches of 2..12 rows end in each row count of the
   * 8-row batch kernel (7, 9 = 8 + 1, 12 = 8 + 4). */
  static const shape shapes[] = {{1, 37, 256}, {1, 64, 1536}, {3, 33, 512}, {5, 70, 1024}, {130, 9, 256},
                                 {8, 1, 2048}, {2, 6, 768},   {7, 5, 768},  {9, 11, 512},  {12, 3, 256}};
  for (size_t t = 0; t < sizeof kdtypes / sizeof *kdtypes; t++)
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) check_case(kdtypes[t], shapes[i]);
}

/* Several k-quant weights sharing one x (the q/k/v and gate/up projections) match one by one. */
static void test_matmul_many_kquant(void **state) {
  (void)state;
  check_matmul_many_same(SERVD_Q4_K, 512, rand_kw);
}

/* A NaN or inf in x makes its row's outputs NaN on every ISA (the q8_K quantizers mark the block),
 * and leaves the other rows as the scalar reference computes them. */
static void test_nonfinite_x(void **state) {
  (void)state;
  for (size_t t = 0; t < sizeof kdtypes / sizeof *kdtypes; t++)
    check_nonfinite_rows(kdtypes[t], rand_kw(kdtypes[t], 9, 512), 300);
}

/* k not a whole number of super-blocks is refused. */
static void test_refused(void **state) {
  (void)state;
  servd_tensor *x = tnew(SERVD_F32, 2, 1, 256), *w = tnew(SERVD_Q4_K, 2, 2, 256), *o = tnew(SERVD_F32, 2, 1, 2);
  servd_tensor *x2 = tnew(SERVD_F32, 2, 1, 128);
  assert_int_equal(servd_matmul(o, x2, w), SERVD_EINVAL);
  servd_tensor *bad = servd_tensor_new(SERVD_Q6_K, 2, (int64_t[]){2, 128});
  assert_null(bad);
  servd_tensor_release(x);
  servd_tensor_release(w);
  servd_tensor_release(o);
  servd_tensor_release(x2);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_decoder_vs_ggufpy), cmocka_unit_test(test_quantize_round_trip),
      cmocka_unit_test(test_matmul_kquant),     cmocka_unit_test(test_matmul_many_kquant),
      cmocka_unit_test(test_nonfinite_x),       cmocka_unit_test(test_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
