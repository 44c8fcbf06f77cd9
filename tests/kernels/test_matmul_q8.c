/* q8_0 weights as a GGUF may hold them, beyond what servd's own quantizer writes: every quantum
 * -128..127 (the quantizer never writes -128), scales from zero and f16 subnormals to 65504, at every
 * block count modulo the SIMD kernels' 4- and 16-block steps and at batch sizes 1..13 (the VNNI
 * kernel's matvec and row-tile paths, prefill's once-decoded block scales).
 *
 * References: the scalar path against a float64 product of x and the dequantized weights (the
 * activation-rounding bound), each SIMD ISA against the scalar path (check_quant_matmul, per-weight
 * terms up to 128 |d|). A second test holds every path to exact block dots: all-positive x over
 * blocks whose quanta cancel, where a kernel that multiplied w + 128 and took 128 * d * s off in f32
 * (one form the VNNI kernel had: TP=1 and TP=3 logits of the reference model then differed by 7e-3)
 * leaves a remainder of the offset's size; exact dots leave the f32 rounding of the block terms.
 */
#define TEST_RNG_SEED 0x51ab08u
#include "test-util.h"

#include "servd/blocks.h"

static const float scales[] = {0.0f, 0x1p-24f /* f16 subnormal */, 0x1p-14f /* smallest normal */, 1.0f, 65504.0f};

/* An n x k q8_0 weight: block b of row j has quanta (j*37 + b*32 + l) mod 256 as int8 (all 256 values
 * over eight blocks) or, in odd rows, random ones; the scale cycles through `scales` every fourth
 * block and is random in [1e-3, 1) otherwise. */
static servd_tensor *raw_q8_0(int64_t n, int64_t k) {
  servd_tensor *w = tnew(SERVD_Q8_0, 2, n, k);
  for (int64_t j = 0; j < n; j++) {
    servd_block_q8_0 *blk = (servd_block_q8_0 *)((char *)servd_tensor_data(w) + j * w->strides[0]);
    for (int64_t b = 0; b < k / 32; b++) {
      const float d = b % 4 == 3 ? scales[(j + b / 4) % 5] : frand(1e-3f, 1.0f);
      blk[b].d = servd_f32_to_f16(d);
      for (int l = 0; l < 32; l++)
        blk[b].qs[l] = j % 2 ? (int8_t)(int)frand(-128.0f, 128.0f) : (int8_t)(uint8_t)((j * 37 + b * 32 + l) & 255);
    }
  }
  return w;
}

/* |term| per weight of block b: 128 |d| (see above). */
static double q8_term_bound(servd_dtype dt, const servd_tensor *w, int64_t j, int64_t b) {
  (void)dt;
  const servd_block_q8_0 *blk = (const servd_block_q8_0 *)((const char *)servd_tensor_data(w) + j * w->strides[0]);
  return 128.0 * fabs((double)servd_f16_to_f32(blk[b].d));
}

static void test_raw_blocks(void **state) {
  (void)state;
  /* blocks: 1, 3, 4, 5 (partial quads), 17, 18 (a group of 16 and a tail), 48 (three groups) */
  static const int64_t ks[] = {32, 96, 128, 160, 544, 576, 1536};
  static const int64_t ms[] = {1, 2, 4, 5, 8, 13};
  static const int64_t ns[] = {1, 5, 9, 33};
  for (size_t a = 0; a < sizeof ks / sizeof *ks; a++)
    for (size_t b = 0; b < sizeof ms / sizeof *ms; b++)
      for (size_t c = 0; c < sizeof ns / sizeof *ns; c++)
        check_quant_matmul(SERVD_Q8_0, raw_q8_0(ns[c], ks[a]), ms[b], 32, q8_term_bound);
}

static void test_offset_cancellation(void **state) {
  (void)state;
  enum { M = 9, N = 11, K = 576 };
  servd_tensor *w = tnew(SERVD_Q8_0, 2, N, K), *x = tnew(SERVD_F32, 2, M, K);
  /* quanta in +-v pairs (v up to 128): a block's dot with a constant x is exactly zero */
  for (int64_t j = 0; j < N; j++) {
    servd_block_q8_0 *blk = (servd_block_q8_0 *)((char *)servd_tensor_data(w) + j * w->strides[0]);
    for (int64_t b = 0; b < K / 32; b++) {
      blk[b].d = servd_f32_to_f16(frand(0.5f, 1.0f));
      for (int l = 0; l < 32; l += 2) {
        const int v = 120 + (int)((j + b + l) % 9); /* 120..128 */
        blk[b].qs[l] = (int8_t)(v == 128 ? -128 : v);
        blk[b].qs[l + 1] = (int8_t)(v == 128 ? 127 : -v); /* -128 pairs with 127: dot -x */
      }
    }
  }
  /* even rows constant (x quantizes exactly), odd rows positive and varied */
  for (int64_t i = 0; i < M; i++)
    for (int64_t l = 0; l < K; l++) f(x)[i * K + l] = i % 2 ? frand(0.9f, 1.0f) : 0.75f;
  float *wd = dequantized_rows(SERVD_Q8_0, w);
  servd_tensor *ref = tnew(SERVD_F32, 2, M, N), *out = tnew(SERVD_F32, 2, M, N);
  assert_int_equal(servd_cpu_force_isa(SERVD_ISA_SCALAR), 0);
  assert_int_equal(servd_matmul(ref, x, w), 0);
  for (int isa = SERVD_ISA_AVX2; isa <= (int)servd_cpu_best_isa(); isa++) {
    assert_int_equal(servd_cpu_force_isa((servd_isa)isa), 0);
    assert_int_equal(servd_matmul(out, x, w), 0);
    for (int64_t i = 0; i < M; i++)
      for (int64_t j = 0; j < N; j++) {
        /* sum over blocks of |d_w d_x dot|, bounded through the float64 block dots plus their
         * activation rounding (amax/254 per element) */
        double terms = 0;
        for (int64_t b = 0; b < K / 32; b++) {
          double dot = 0, amax = 0, wsum = 0;
          for (int64_t l = b * 32; l < b * 32 + 32; l++) {
            dot += (double)f(x)[i * K + l] * wd[j * K + l];
            amax = fmax(amax, fabs(f(x)[i * K + l]));
            wsum += fabs(wd[j * K + l]);
          }
          terms += fabs(dot) + (i % 2 ? amax / 254.0 * wsum : 0.0);
        }
        const double got = f(out)[i * N + j], want = f(ref)[i * N + j];
        const double tol = 4.0 * (double)(K / 32 + 8) * 0x1p-24 * terms + 1e-30;
        if (!(fabs(got - want) <= tol))
          fail_msg("q8_0 %s [%lld,%lld]: %.9g vs scalar %.9g (tol %g)", servd_isa_name((servd_isa)isa), (long long)i,
                   (long long)j, got, want, tol);
      }
  }
  servd_cpu_force_isa(SERVD_ISA_COUNT);
  free(wd);
  servd_tensor_release(w);
  servd_tensor_release(x);
  servd_tensor_release(ref);
  servd_tensor_release(out);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_raw_blocks),
      cmocka_unit_test(test_offset_cancellation),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
