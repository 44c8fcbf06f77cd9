/* q2_k, q3_k, iq4_nl and iq4_xs weights: the reference decoder against gguf-py's, the lookups built
 * on it (embedding, dequantize), the plain-rounding quantizer, and matmul on every ISA.
 *
 * Tolerances:
 * - decoder vs gguf-py (lowbit_fixture.h, make_lowbit_fixture.py; random blocks and adversarial ones:
 *   largest, smallest and zero f16 scales, every byte value in the code and scale fields): the same
 *   f32 products, equal up to 1 ulp of the value.
 * - matmul scalar reference vs a float64 product of x and the dequantized weights: activation
 *   rounding errs by at most amax_b/254 per element of activation block b (256 values for q8_K, 32
 *   for iq4_nl's q8_0), so |err| <= sum_b amax_b/254 * sum_{i in b}|w_i|; allowed 1.01x plus 2^-20 of
 *   sum|x*w|.
 * - SIMD vs the scalar reference: same activations, exact integer dots per block; they differ by f32
 *   rounding relative to the terms' magnitude, per block at most sum|x| * wmax_b (wmax_b from the
 *   block header: q2_k d*15*3 + dmin*15, q3_k |d|*32*4, iq4_xs |d|*32*127, iq4_nl |d|*127); allowed
 *   (8 + 2*nb) * 2^-22 of it. A mis-unpacked bit moves a result by ~sqrt(k) weights, far above this.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define TEST_RNG_SEED 0x4c4f5742u
#include "test-util.h"

#include "lowbit_fixture.h"
#include "servd/blocks.h"

static const servd_dtype lbtypes[] = {SERVD_Q2_K, SERVD_Q3_K, SERVD_IQ4_NL, SERVD_IQ4_XS};
#define N_TYPES (sizeof lbtypes / sizeof *lbtypes)

static const uint8_t *fixture_bytes(servd_dtype t) {
  return t == SERVD_Q2_K     ? lb_q2_k_bytes
         : t == SERVD_Q3_K   ? lb_q3_k_bytes
         : t == SERVD_IQ4_NL ? lb_iq4_nl_bytes
                             : lb_iq4_xs_bytes;
}
static const float *fixture_values(servd_dtype t) {
  return t == SERVD_Q2_K     ? lb_q2_k_values
         : t == SERVD_Q3_K   ? lb_q3_k_values
         : t == SERVD_IQ4_NL ? lb_iq4_nl_values
                             : lb_iq4_xs_values;
}

static void test_decoder_vs_ggufpy(void **state) {
  (void)state;
  enum { NB = LB_FIXTURE_BLOCKS };
  for (size_t t = 0; t < N_TYPES; t++) {
    const servd_dtype dt = lbtypes[t];
    const int64_t K = (int64_t)servd_dtype_block_elems(dt);
    float *y = malloc((size_t)(NB * K) * sizeof(float));
    assert_int_equal(servd_row_to_f32(dt, fixture_bytes(dt), y, NB * K), 0);
    near_ggufpy(dt, "row", y, fixture_values(dt), NB * K);
    /* The same blocks as a (NB, K) table: embedding rows and the dequantize op. */
    check_table_lookups(dt, fixture_bytes(dt), fixture_values(dt), NB, K, (const int32_t[]){NB - 1, 0, 5, 2}, 4);
    /* A row that is not whole blocks is refused, as is a tensor of such rows. */
    assert_int_equal(servd_row_to_f32(dt, fixture_bytes(dt), y, K / 2), SERVD_EINVAL);
    assert_null(servd_tensor_new(dt, 2, (int64_t[]){2, K + K / 2}));
    free(y);
  }
}

/* Plain-rounding quantizer: the round trip's error is a fraction of the data's spread that grows with
 * fewer bits (measured: q2_k ~0.25, q3_k ~0.12, iq4 ~0.07 of the RMS); a value packed into the wrong
 * bits errs by the whole range instead. Zero rows come back zero. */
static void test_quantize_round_trip(void **state) {
  (void)state;
  enum { K = 2 * SERVD_QK_K };
  static const float max_rel[] = {0.40f, 0.20f, 0.12f, 0.12f};
  float x[K], y[K];
  uint8_t buf[K / SERVD_QK * 18 + K / SERVD_QK_K * 136]; /* room for either layout */
  for (size_t t = 0; t < N_TYPES; t++) {
    const servd_dtype dt = lbtypes[t];
    for (int trial = 0; trial < 4; trial++) {
      double se = 0, sx = 0;
      for (int i = 0; i < K; i++) x[i] = frand(-1.0f, 1.0f) * (float)(1 + (i / 32) % 5) + (trial == 3 ? 2.0f : 0.0f);
      assert_int_equal(servd_row_from_f32(dt, x, buf, K), 0);
      assert_int_equal(servd_row_to_f32(dt, buf, y, K), 0);
      for (int i = 0; i < K; i++) {
        se += (double)(y[i] - x[i]) * (y[i] - x[i]);
        sx += (double)x[i] * x[i];
      }
      if (!(sqrt(se / sx) <= max_rel[t]))
        fail_msg("%s trial %d: relative RMS error %g > %g", servd_dtype_name(dt), trial, sqrt(se / sx), max_rel[t]);
    }
    memset(x, 0, sizeof x);
    assert_int_equal(servd_row_from_f32(dt, x, buf, K), 0);
    assert_int_equal(servd_row_to_f32(dt, buf, y, K), 0);
    for (int i = 0; i < K; i++) assert_true(y[i] == 0.0f);
  }
}

/* Byte offsets of the f16 scales in a block. */
static int scale_offset(servd_dtype dt) { return dt == SERVD_Q2_K ? 80 : dt == SERVD_Q3_K ? 108 : 0; }

/* A random but valid weight: random quanta and scales, f16 scales from small values (q2_k's d and
 * dmin positive, the others either sign). */
static servd_tensor *rand_w(servd_dtype dt, int64_t n, int64_t k) {
  servd_tensor *w = tnew(dt, 2, n, k);
  const size_t bb = servd_dtype_block_bytes(dt);
  uint8_t *p = servd_tensor_data(w);
  for (int64_t b = 0; b < n * k / (int64_t)servd_dtype_block_elems(dt); b++, p += bb) {
    for (size_t i = 0; i < bb; i++) p[i] = (uint8_t)(frand(0.0f, 256.0f));
    const uint16_t d = servd_f32_to_f16(dt == SERVD_Q2_K ? frand(0.0005f, 0.01f) : frand(-0.01f, 0.01f));
    memcpy(p + scale_offset(dt), &d, 2);
    if (dt == SERVD_Q2_K) {
      const uint16_t dmin = servd_f32_to_f16(frand(0.0005f, 0.01f));
      memcpy(p + 82, &dmin, 2);
    }
  }
  return w;
}

/* Bound on |term| per weight of block b of row j (see the tolerances above). */
static double wmax(servd_dtype dt, const servd_tensor *w, int64_t j, int64_t b) {
  const uint8_t *p = (const uint8_t *)servd_tensor_data(w) + j * w->strides[0] + b * servd_dtype_block_bytes(dt);
  uint16_t d, dmin;
  memcpy(&d, p + scale_offset(dt), 2);
  const double dd = fabs(servd_f16_to_f32(d));
  switch (dt) {
  case SERVD_Q2_K: memcpy(&dmin, p + 82, 2); return dd * 15 * 3 + servd_f16_to_f32(dmin) * 15;
  case SERVD_Q3_K: return dd * 32 * 4;
  case SERVD_IQ4_XS: return dd * 32 * 127;
  default: return dd * 127;
  }
}

typedef struct shape {
  int64_t m, n, k;
} shape;

static void check_case(servd_dtype dt, shape s) {
  check_quant_matmul(dt, rand_w(dt, s.n, s.k), s.m, dt == SERVD_IQ4_NL ? SERVD_QK : SERVD_QK_K /* activation block */,
                     wmax);
}

static void test_matmul_lowbit(void **state) {
  (void)state;
  /* decode (m = 1), small batches, more than one 128-row block (prefill), column counts off the
   * 32-column item size. */
  static const shape shapes[] = {{1, 37, 256}, {1, 64, 1536}, {3, 33, 512}, {5, 70, 1024}, {130, 9, 256}, {8, 1, 2048}};
  for (size_t t = 0; t < N_TYPES; t++)
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) check_case(lbtypes[t], shapes[i]);
}

/* Several weights sharing one x (the q/k/v and gate/up projections) match one by one. */
static void test_matmul_many_lowbit(void **state) {
  (void)state;
  for (size_t t = 0; t < N_TYPES; t++) check_matmul_many_same(lbtypes[t], 512, rand_w);
}

/* A NaN or inf in x makes its row's outputs NaN on every ISA and leaves the other rows as the scalar
 * reference computes them. */
static void test_nonfinite_x(void **state) {
  (void)state;
  for (size_t t = 0; t < N_TYPES; t++) check_nonfinite_rows(lbtypes[t], rand_w(lbtypes[t], 9, 512), 300);
}

/* k not a whole number of weight blocks is refused. */
static void test_refused(void **state) {
  (void)state;
  for (size_t t = 0; t < N_TYPES; t++) {
    const int64_t be = (int64_t)servd_dtype_block_elems(lbtypes[t]);
    servd_tensor *w = tnew(lbtypes[t], 2, 2, be), *o = tnew(SERVD_F32, 2, 1, 2), *x2 = tnew(SERVD_F32, 2, 1, be / 2);
    assert_int_equal(servd_matmul(o, x2, w), SERVD_EINVAL);
    servd_tensor_release(w);
    servd_tensor_release(o);
    servd_tensor_release(x2);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_decoder_vs_ggufpy), cmocka_unit_test(test_quantize_round_trip),
      cmocka_unit_test(test_matmul_lowbit),     cmocka_unit_test(test_matmul_many_lowbit),
      cmocka_unit_test(test_nonfinite_x),       cmocka_unit_test(test_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
