/* q5_0 / q5_1 weights: the reference decoder and quantizer against gguf-py's (q5_fixture.h,
 * make_q5_fixture.py), the lookups built on the decoder (embedding, dequantize), and matmul on every
 * ISA.
 *
 * Tolerances:
 * - decoder vs gguf-py: the same f32 operations (d * (q - 16), d * q + m), so equal up to 1 ulp.
 * - quantizer vs gguf-py: ggml's reference rounding on both sides, so the same bytes.
 * - matmul scalar reference vs f32 over the dequantized weights: activation rounding errs by at most
 *   d_x/2 = amax_b/254 per element, so |err| <= sum_b amax_b/254 * sum_{i in b}|w_i|; allowed 1.01x
 *   plus 2^-20 of sum|x*w|.
 * - SIMD vs the scalar reference: same q8 activations, exact integer block dots; they differ by f32
 *   rounding of the block terms, each at most sum|x_b| * wmax_b (|d|*(31 + 16) for q5_0, |d|*31 + |m|
 *   for q5_1); allowed (8 + 2*nb) * 2^-22 of their sum. A mis-placed high bit changes a result by
 *   16*d*|x| somewhere, orders of magnitude above this.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define TEST_RNG_SEED 0x51354b31u
#include "test-util.h"

#include "q5_fixture.h"
#include "servd/blocks.h"

static const servd_dtype q5dtypes[] = {SERVD_Q5_0, SERVD_Q5_1};

static const uint8_t *fixture_bytes(servd_dtype t) { return t == SERVD_Q5_0 ? q5_q5_0_bytes : q5_q5_1_bytes; }
static const float *fixture_values(servd_dtype t) { return t == SERVD_Q5_0 ? q5_q5_0_values : q5_q5_1_values; }
static const uint8_t *fixture_quantized(servd_dtype t) {
  return t == SERVD_Q5_0 ? q5_q5_0_quantized : q5_q5_1_quantized;
}

static void test_decoder_vs_ggufpy(void **state) {
  (void)state;
  enum { NB = Q5_FIXTURE_BLOCKS, K = SERVD_QK, ROWS = NB / 2 };
  float y[NB * K];
  for (size_t t = 0; t < sizeof q5dtypes / sizeof *q5dtypes; t++) {
    const servd_dtype dt = q5dtypes[t];
    assert_int_equal(servd_row_to_f32(dt, fixture_bytes(dt), y, NB * K), 0);
    near_ggufpy(dt, "row", y, fixture_values(dt), NB * K);
    /* The same blocks as a (ROWS, 64) table: embedding rows and the dequantize op. */
    check_table_lookups(dt, fixture_bytes(dt), fixture_values(dt), ROWS, 2 * K, (const int32_t[]){3, 0, 1, 3, 2}, 5);
    /* A row that is not whole blocks is refused. */
    assert_int_equal(servd_row_to_f32(dt, fixture_bytes(dt), y, 48), SERVD_EINVAL);
  }
}

static void test_quantizer_vs_ggufpy(void **state) {
  (void)state;
  enum { NB = Q5_FIXTURE_BLOCKS };
  uint8_t buf[NB * 24];
  float y[NB * SERVD_QK];
  for (size_t t = 0; t < sizeof q5dtypes / sizeof *q5dtypes; t++) {
    const servd_dtype dt = q5dtypes[t];
    const size_t bb = servd_dtype_block_bytes(dt);
    assert_int_equal(servd_row_from_f32(dt, q5_x, buf, NB * SERVD_QK), 0);
    for (size_t i = 0; i < NB * bb; i++)
      if (buf[i] != fixture_quantized(dt)[i])
        fail_msg("%s: byte %zu (block %zu) is %u, gguf-py %u", servd_dtype_name(dt), i, i / bb, buf[i],
                 fixture_quantized(dt)[i]);
    /* and back within half a step (31 levels over the block's range) plus the f16 scale */
    assert_int_equal(servd_row_to_f32(dt, buf, y, NB * SERVD_QK), 0);
    for (int b = 0; b < NB; b++) {
      float mn = INFINITY, mx = -INFINITY, am = 0.0f;
      for (int i = 0; i < SERVD_QK; i++) {
        mn = fminf(mn, q5_x[b * 32 + i]);
        mx = fmaxf(mx, q5_x[b * 32 + i]);
        am = fmaxf(am, fabsf(q5_x[b * 32 + i]));
      }
      const float step = dt == SERVD_Q5_0 ? am / 16.0f : (mx - mn) / 31.0f;
      for (int i = 0; i < SERVD_QK; i++) {
        const float e = fabsf(y[b * 32 + i] - q5_x[b * 32 + i]);
        if (e > step * 0.5f + am * 0x1p-9f + 1e-6f)
          fail_msg("%s: x[%d] = %g came back %g", servd_dtype_name(dt), b * 32 + i, q5_x[b * 32 + i], y[b * 32 + i]);
      }
    }
  }
}

/* A random but valid weight: random quanta and high bits, d (q5_1: and m) from f16 of small values. */
static servd_tensor *rand_w(servd_dtype dt, int64_t n, int64_t k) {
  servd_tensor *w = tnew(dt, 2, n, k);
  const size_t bb = servd_dtype_block_bytes(dt);
  uint8_t *p = servd_tensor_data(w);
  for (int64_t b = 0; b < n * k / SERVD_QK; b++, p += bb) {
    for (size_t i = 0; i < bb; i++) p[i] = (uint8_t)(frand(0.0f, 256.0f));
    const uint16_t d = servd_f32_to_f16(frand(-0.02f, 0.02f)), m = servd_f32_to_f16(frand(-0.3f, 0.3f));
    memcpy(p, &d, 2);
    if (dt == SERVD_Q5_1) memcpy(p + 2, &m, 2);
  }
  return w;
}

/* Bound on |term| per weight of block b of row j (see the tolerances above). */
static double wmax(servd_dtype dt, const servd_tensor *w, int64_t j, int64_t b) {
  const uint8_t *p = (const uint8_t *)servd_tensor_data(w) + j * w->strides[0] + b * servd_dtype_block_bytes(dt);
  uint16_t d, m;
  memcpy(&d, p, 2);
  if (dt == SERVD_Q5_0) return fabs(servd_f16_to_f32(d)) * 47;
  memcpy(&m, p + 2, 2);
  return fabs(servd_f16_to_f32(d)) * 31 + fabs(servd_f16_to_f32(m));
}

/* rand_w with adversarial blocks mixed in: qh all set or all clear, nibbles all 15 or all 0, so that
 * every element takes the extreme 5-bit values 0 and 31 somewhere (a dropped or doubled bit 4 shows). */
static servd_tensor *extreme_w(servd_dtype dt, int64_t n, int64_t k) {
  servd_tensor *w = rand_w(dt, n, k);
  const size_t bb = servd_dtype_block_bytes(dt), hoff = dt == SERVD_Q5_0 ? 2 : 4;
  uint8_t *p = servd_tensor_data(w);
  for (int64_t b = 0; b < n * k / SERVD_QK; b++, p += bb) {
    const int kind = (int)frand(0.0f, 4.0f);
    if (kind == 3) continue; /* random */
    memset(p + hoff, kind == 0 ? 0x00 : 0xff, 4);
    memset(p + hoff + 4, kind == 1 ? 0x00 : 0xff, 16);
  }
  return w;
}

typedef struct shape {
  int64_t m, n, k;
} shape;

static void check_case(servd_dtype dt, shape s) { check_quant_matmul(dt, rand_w(dt, s.n, s.k), s.m, SERVD_QK, wmax); }

static void test_matmul_q5(void **state) {
  (void)state;
  /* test_matmul.c's quantized shapes: one block, odd block counts (the VNNI kernel's half-filled
   * last pair), decode (m = 1) and batched rows around the 4-row tile, the 576-wide rows of
   * SmolLM2, more than one 128-row block, column counts off the 32-column item and 4-column tile. */
  static const shape shapes[] = {{1, 1, 32},     {1, 3, 96},   {1, 33, 160}, {2, 17, 224}, {3, 70, 32},
                                 {4, 9, 288},    {5, 37, 576}, {8, 16, 64},  {9, 41, 352}, {17, 23, 96},
                                 {1, 130, 2080}, {130, 5, 64}, {2, 7, 128},  {1, 9, 640}};
  for (size_t t = 0; t < sizeof q5dtypes / sizeof *q5dtypes; t++)
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) check_case(q5dtypes[t], shapes[i]);
}

/* The VNNI kernel's 16-block groups: exactly one group, a group plus 5..15 blocks (partial quads
 * inside a group), the model's k = 1536 (three groups) at decode and prefill-sized m, and extreme
 * blocks at both. */
static void test_matmul_q5_groups(void **state) {
  (void)state;
  static const shape shapes[] = {{1, 5, 512},   {3, 11, 512},  {2, 6, 672},  {6, 19, 960}, {1, 7, 1024},
                                 {1, 64, 1536}, {64, 9, 1536}, {5, 13, 736}, {1, 4, 1184}, {7, 3, 1056}};
  for (size_t t = 0; t < sizeof q5dtypes / sizeof *q5dtypes; t++)
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
      const shape s = shapes[i];
      check_case(q5dtypes[t], s);
      check_quant_matmul(q5dtypes[t], extreme_w(q5dtypes[t], s.n, s.k), s.m, SERVD_QK, wmax);
    }
}

/* The VNNI kernel has a build for CPUs with GFNI and VBMI and one for those without (Cascade Lake);
 * this one turns the first off (an internal switch of the kernels library) so that the second is
 * checked here too, on the same shapes. */
void servd__q5_use_gfni(bool on);

static void test_matmul_q5_without_gfni(void **state) {
  servd__q5_use_gfni(false);
  test_matmul_q5(state);
  test_matmul_q5_groups(state);
  servd__q5_use_gfni(true);
}

/* Several q5 weights sharing one x (the q/k/v and gate/up projections) match one by one. */
static void test_matmul_many_q5(void **state) {
  (void)state;
  check_matmul_many_same(SERVD_Q5_0, 576, rand_w);
}

/* A NaN or inf in x makes its row's outputs NaN on every ISA (the q8 quantizers mark the block), and
 * leaves the other rows as the scalar reference computes them. */
static void test_nonfinite_x(void **state) {
  (void)state;
  for (size_t t = 0; t < sizeof q5dtypes / sizeof *q5dtypes; t++)
    check_nonfinite_rows(q5dtypes[t], rand_w(q5dtypes[t], 9, 96), 70);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_decoder_vs_ggufpy),
      cmocka_unit_test(test_quantizer_vs_ggufpy),
      cmocka_unit_test(test_matmul_q5),
      cmocka_unit_test(test_matmul_q5_groups),
      cmocka_unit_test(test_matmul_q5_without_gfni),
      cmocka_unit_test(test_matmul_many_q5),
      cmocka_unit_test(test_nonfinite_x),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
