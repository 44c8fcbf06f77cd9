/* The encoder (BERT) ops against float64 references: add_bias, bias_gelu (erf GELU), layernorm and
 * encoder_attention over packed sequences of different lengths (including length 1), every ISA
 * path against float64 and against the scalar path, in place where the contract allows it, and the
 * refused arguments. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "servd/ops.h"

static servd_tensor *f32(int64_t r, int64_t c) {
  const int64_t s[2] = {r, c};
  servd_tensor *t = servd_tensor_new(SERVD_F32, 2, s);
  assert_non_null(t);
  return t;
}

static servd_tensor *vec(int64_t n) {
  servd_tensor *t = servd_tensor_new(SERVD_F32, 1, &n);
  assert_non_null(t);
  return t;
}

static float frand(float lo, float hi) { return lo + (hi - lo) * (float)rand() / (float)RAND_MAX; }

static void fill(servd_tensor *t, float lo, float hi) {
  float *p = servd_tensor_data(t);
  for (int64_t i = 0; i < (int64_t)servd_tensor_numel(t); i++) p[i] = frand(lo, hi);
}

static double gelu64(double z) { return 0.5 * z * erfc(-z / sqrt(2.0)); } /* erfc: no cancellation */

static void test_add_bias_and_gelu(void **state) {
  (void)state;
  enum { R = 13, C = 1541 }; /* not a multiple of 8: the tails run */
  servd_tensor *x = f32(R, C), *b = vec(C), *out = f32(R, C), *scalar = f32(R, C);
  srand(3);
  fill(x, -9.0f, 9.0f);
  fill(b, -1.0f, 1.0f);
  float *px = servd_tensor_data(x), *pb = servd_tensor_data(b), *po = servd_tensor_data(out);
  px[0] = 0.0f, px[1] = -30.0f, px[2] = 30.0f, pb[0] = pb[1] = pb[2] = 0.0f;
  assert_int_equal(servd_add_bias(out, x, b), 0);
  for (int i = 0; i < R * C; i++) assert_true(po[i] == px[i] + pb[i % C]);
  assert_int_equal(servd_cpu_force_isa(SERVD_ISA_SCALAR), 0);
  assert_int_equal(servd_bias_gelu(scalar, x, b), 0);
  float *ps = servd_tensor_data(scalar);
  for (int isa = 0; isa < SERVD_ISA_COUNT; isa++) {
    if (servd_cpu_force_isa((servd_isa)isa) != 0) continue;
    assert_int_equal(servd_bias_gelu(out, x, b), 0);
    double worst = 0;
    for (int i = 0; i < R * C; i++) {
      double z = (double)(px[i] + pb[i % C]), want = gelu64(z);
      /* erf's A&S form: 1.5e-7 absolute on erf, i.e. |z| * 1e-7 on gelu; plus rounding */
      double bound = 2e-7 * fabs(z) + 4 * ldexp(1.0, -23) * fabs(want) + 1e-30;
      if (!isfinite(po[i]) || fabs(po[i] - want) > bound)
        fail_msg("bias_gelu isa %d: z %.9g -> %.9g, float64 %.9g", isa, z, po[i], want);
      if (fabsf(po[i] - ps[i]) > 4e-7f * fabsf((float)z) + 1e-30f)
        fail_msg("bias_gelu isa %d: z %.9g -> %.9g, scalar %.9g", isa, z, po[i], ps[i]);
      worst = fmax(worst, fabs(po[i] - want));
    }
    print_message("bias_gelu isa %d: worst absolute error %.3g\n", isa, worst);
  }
  servd_cpu_force_isa(SERVD_ISA_COUNT);
  /* by hand: gelu(0) = 0, gelu(1) = 0.8413447460..., in place */
  px[C] = 1.0f, pb[0] = 0.0f;
  assert_int_equal(servd_bias_gelu(x, x, b), 0);
  assert_true(px[0] == 0.0f && fabsf(px[C] - 0.841344746f) < 1e-6f);
  /* refusals: b of the wrong width, a dtype other than f32 */
  servd_tensor *b2 = vec(C + 1);
  const int64_t s[2] = {R, C};
  servd_tensor *h = servd_tensor_new(SERVD_F16, 2, s);
  assert_int_equal(servd_add_bias(out, x, b2), SERVD_EINVAL);
  assert_int_equal(servd_bias_gelu(out, h, b), SERVD_EINVAL);
  servd_tensor_release(h);
  servd_tensor_release(b2);
  servd_tensor_release(x);
  servd_tensor_release(b);
  servd_tensor_release(out);
  servd_tensor_release(scalar);
}

static void test_layernorm(void **state) {
  (void)state;
  enum { R = 9, C = 384 };
  servd_tensor *x = f32(R, C), *w = vec(C), *b = vec(C), *out = f32(R, C);
  srand(5);
  fill(x, -3.0f, 5.0f);
  fill(w, 0.5f, 1.5f);
  fill(b, -0.5f, 0.5f);
  float *px = servd_tensor_data(x), *pw = servd_tensor_data(w), *pb = servd_tensor_data(b),
        *po = servd_tensor_data(out);
  for (int c = 0; c < C; c++) px[C + c] = 1000.0f + (float)(c % 3); /* a large mean: var stays exact */
  for (int c = 0; c < C; c++) px[2 * C + c] = 7.0f;                 /* constant row: var 0, out = bias */
  const float eps = 1e-12f;
  assert_int_equal(servd_layernorm(out, x, w, b, eps), 0);
  for (int r = 0; r < R; r++) {
    double m = 0, v = 0;
    for (int c = 0; c < C; c++) m += px[r * C + c];
    m /= C;
    for (int c = 0; c < C; c++) v += (px[r * C + c] - m) * (px[r * C + c] - m);
    v /= C;
    for (int c = 0; c < C; c++) {
      double want = (px[r * C + c] - m) / sqrt(v + eps) * pw[c] + pb[c];
      if (fabs(po[r * C + c] - want) > 2e-6 * (1 + fabs(want)))
        fail_msg("layernorm row %d col %d: %.9g, float64 %.9g", r, c, po[r * C + c], want);
    }
  }
  /* in place gives the same */
  assert_int_equal(servd_layernorm(x, x, w, b, eps), 0);
  for (int i = 0; i < R * C; i++) assert_true(px[i] == po[i]);
  assert_int_equal(servd_layernorm(out, x, w, b, 0.0f), SERVD_EINVAL);
  assert_int_equal(servd_layernorm(out, x, b, NULL, eps), SERVD_EINVAL);
  servd_tensor_release(x);
  servd_tensor_release(w);
  servd_tensor_release(b);
  servd_tensor_release(out);
}

/* float64 reference of one (row, head) */
static void attn_ref(double *o, const float *q, const float *k, const float *v, int first, int n, int r, int heads,
                     int hd, int h) {
  double p[256], mx = -INFINITY, sum = 0;
  int row = heads * hd;
  for (int j = 0; j < n; j++) {
    double s = 0;
    for (int d = 0; d < hd; d++) s += (double)q[r * row + h * hd + d] * k[(first + j) * row + h * hd + d];
    p[j] = s / sqrt((double)hd);
    mx = fmax(mx, p[j]);
  }
  for (int j = 0; j < n; j++) sum += p[j] = exp(p[j] - mx);
  for (int d = 0; d < hd; d++) {
    o[d] = 0;
    for (int j = 0; j < n; j++) o[d] += p[j] / sum * v[(first + j) * row + h * hd + d];
  }
}

static void test_encoder_attention(void **state) {
  (void)state;
  enum { HEADS = 3, HD = 36 }; /* head_dim not a multiple of 8: the masked tails run */
  const int32_t lens[] = {5, 1, 40, 17, 0, 9};
  enum { NS = sizeof lens / sizeof lens[0] };
  int32_t offs[NS + 1] = {0};
  for (int s = 0; s < NS; s++) offs[s + 1] = offs[s] + lens[s];
  const int T = offs[NS];
  const int64_t s3[3] = {T, HEADS, HD}, sn = NS + 1;
  servd_tensor *q = servd_tensor_new(SERVD_F32, 3, s3), *k = servd_tensor_new(SERVD_F32, 3, s3),
               *v = servd_tensor_new(SERVD_F32, 3, s3), *off = servd_tensor_new(SERVD_I32, 1, &sn);
  servd_tensor *out = f32(T, HEADS * HD), *scalar = f32(T, HEADS * HD);
  srand(9);
  fill(q, -2.0f, 2.0f);
  fill(k, -2.0f, 2.0f);
  fill(v, -1.0f, 1.0f);
  memcpy(servd_tensor_data(off), offs, sizeof offs);
  float *pq = servd_tensor_data(q), *pk = servd_tensor_data(k), *pv = servd_tensor_data(v);
  assert_int_equal(servd_cpu_force_isa(SERVD_ISA_SCALAR), 0);
  assert_int_equal(servd_encoder_attention(scalar, q, k, v, off), 0);
  for (int isa = 0; isa < SERVD_ISA_COUNT; isa++) {
    if (servd_cpu_force_isa((servd_isa)isa) != 0) continue;
    assert_int_equal(servd_encoder_attention(out, q, k, v, off), 0);
    float *po = servd_tensor_data(out), *ps = servd_tensor_data(scalar);
    for (int s = 0; s < NS; s++)
      for (int r = offs[s]; r < offs[s + 1]; r++)
        for (int h = 0; h < HEADS; h++) {
          double want[HD];
          attn_ref(want, pq, pk, pv, offs[s], lens[s], r, HEADS, HD, h);
          for (int d = 0; d < HD; d++) {
            float got = po[r * HEADS * HD + h * HD + d];
            if (fabs(got - want[d]) > 2e-6 || fabsf(got - ps[r * HEADS * HD + h * HD + d]) > 2e-6f)
              fail_msg("encoder_attention isa %d seq %d row %d head %d dim %d: %.9g, float64 %.9g", isa, s, r, h, d,
                       got, want[d]);
          }
        }
  }
  servd_cpu_force_isa(SERVD_ISA_COUNT);
  /* a one-token sequence attends to itself alone: out = its v */
  for (int d = 0; d < HEADS * HD; d++)
    assert_true(fabsf(((float *)servd_tensor_data(out))[5 * HEADS * HD + d] - pv[5 * HEADS * HD + d]) < 1e-6f);
  /* refusals: offsets that do not end at t, that descend, q of another shape */
  int32_t *po = servd_tensor_data(off);
  po[NS] = T - 1;
  assert_int_equal(servd_encoder_attention(out, q, k, v, off), SERVD_EINVAL);
  po[NS] = T, po[2] = 1;
  assert_int_equal(servd_encoder_attention(out, q, k, v, off), SERVD_EINVAL);
  po[2] = offs[2];
  assert_int_equal(servd_encoder_attention(out, q, k, v, off), 0);
  servd_tensor *flat = f32(T, HEADS * HD);
  assert_int_equal(servd_encoder_attention(out, flat, k, v, off), SERVD_EINVAL);
  servd_tensor_release(flat);
  servd_tensor_release(q);
  servd_tensor_release(k);
  servd_tensor_release(v);
  servd_tensor_release(off);
  servd_tensor_release(out);
  servd_tensor_release(scalar);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_add_bias_and_gelu), cmocka_unit_test(test_layernorm),
                                     cmocka_unit_test(test_encoder_attention)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
