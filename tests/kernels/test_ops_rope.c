/* RoPE: both layouts, Llama 3.1 scaling, per-pair inverse-frequency tables, every ISA path. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "servd/ops.h"

#define TEST_RNG_SEED 99u
#include "test-util.h"

static servd_tensor *positions(int64_t m, const int32_t *p) {
  servd_tensor *t = servd_tensor_new(SERVD_I32, 1, &m);
  assert_non_null(t);
  memcpy(servd_tensor_data(t), p, (size_t)m * sizeof(int32_t));
  return t;
}

static servd_rope_params params(servd_rope_layout l, int d, float theta) {
  servd_rope_params p = {.layout = l, .head_dim = d, .theta = theta, .scaling_factor = 1.0f};
  return p;
}

/* Expected values from an independent model of transformers' rotary embedding in numpy (f32
 * inv_freq, f32 angle = inv_freq * position, cos/sin of that angle), for x = all ones in the half
 * layout: out[i] = cos_i - sin_i, out[i + d/2] = cos_i + sin_i. */
typedef struct np_case {
  int pos;
  float lo[7], hi[7];
} np_case;
static const int llama31_idx[7] = {0, 1, 17, 30, 33, 40, 63}; /* 30, 33: the smoothed band */
static const np_case llama31[] = {
    {1,
     {-3.01168679e-01f, -4.13161018e-02f, 9.68901071e-01f, 9.98627166e-01f, 9.99687257e-01f, 9.99965718e-01f,
      9.99999693e-01f},
     {1.38177329e+00f, 1.41360991e+00f, 1.03016053e+00f, 1.00137095e+00f, 1.00031264e+00f, 1.00003428e+00f,
      1.00000031e+00f}},
    {1000,
     {-2.64500464e-01f, 2.24321517e-01f, 1.41420229e+00f, -7.82690224e-01f, 6.43885608e-01f, 9.65138154e-01f,
      9.99693060e-01f},
     {1.38925862e+00f, -1.39630937e+00f, 5.64709796e-03f, 1.17787776e+00f, 1.25913118e+00f, 1.03368677e+00f,
      1.00030685e+00f}},
    {5000,
     {1.14263484e+00f, -1.01124211e+00f, -1.41393170e+00f, 2.93582634e-01f, -9.92645106e-01f, 8.14779024e-01f,
      9.98464360e-01f},
     {-8.33298033e-01f, 9.88630064e-01f, -2.82336890e-02f, 1.38340494e+00f, 1.00730119e+00f, 1.15591312e+00f,
      1.00153329e+00f}},
};
static const int plain_idx[5] = {0, 1, 17, 25, 31};
static const np_case plain[] = {
    {1,
     {-3.01168679e-01f, 5.01996362e-02f, 9.92473011e-01f, 9.99249825e-01f, 9.99866639e-01f},
     {1.38177329e+00f, 1.41332233e+00f, 1.00747076e+00f, 1.00074961e+00f, 1.00013334e+00f}},
    {1000,
     {-2.64500464e-01f, -1.39591968e+00f, -5.90005666e-01f, 5.01996362e-02f, 8.58164503e-01f},
     {1.38925862e+00f, 2.26733883e-01f, 1.28526002e+00f, 1.41332233e+00f, 1.12407904e+00f}},
    {5000,
     {1.14263484e+00f, 9.79918821e-01f, 1.18216187e+00f, -2.49734506e-01f, 1.67385350e-01f},
     {-8.33298033e-01f, -1.01968579e+00f, 7.76204428e-01f, -1.39198875e+00f, 1.40427282e+00f}},
};

static void check_numpy(const servd_rope_params *p, const np_case *cases, int n_cases, const int *idx, int n_idx) {
  int d = p->head_dim;
  for (int isa = 0; isa < SERVD_ISA_COUNT; isa++) {
    if (servd_cpu_force_isa((servd_isa)isa) != 0) continue;
    for (int c = 0; c < n_cases; c++) {
      int64_t shape[2] = {1, d};
      servd_tensor *x = servd_tensor_new(SERVD_F32, 2, shape);
      for (int i = 0; i < d; i++) f(x)[i] = 1.0f;
      servd_tensor *pos = positions(1, &cases[c].pos);
      assert_int_equal(servd_rope(x, pos, p), 0);
      /* numpy's f32 pow may differ from libm's powf by an ulp of inv_freq (6e-8 relative), which
       * moves the angle by pos * 6e-8 * inv_freq <= pos * 1.2e-7 rad; cos/sin move as much. */
      double tol = 2.0 * cases[c].pos * 1.2e-7 + 2e-6;
      for (int k = 0; k < n_idx; k++) {
        int i = idx[k];
        if (fabs(f(x)[i] - cases[c].lo[k]) > tol || fabs(f(x)[i + d / 2] - cases[c].hi[k]) > tol)
          fail_msg("rope isa %d pos %d i %d: (%.8g, %.8g) vs numpy (%.8g, %.8g)", isa, cases[c].pos, i, (double)f(x)[i],
                   (double)f(x)[i + d / 2], (double)cases[c].lo[k], (double)cases[c].hi[k]);
      }
      servd_tensor_release(x);
      servd_tensor_release(pos);
    }
  }
  servd_cpu_force_isa(SERVD_ISA_COUNT);
}

static void test_numpy_plain(void **state) {
  (void)state;
  servd_rope_params p = params(SERVD_ROPE_HALF, 64, 10000.0f);
  check_numpy(&p, plain, 3, plain_idx, 5);
}

static void test_numpy_llama31(void **state) {
  (void)state;
  servd_rope_params p = params(SERVD_ROPE_HALF, 128, 500000.0f);
  p.scaling_factor = 8.0f;
  p.low_freq_factor = 1.0f;
  p.high_freq_factor = 4.0f;
  p.original_max_positions = 8192;
  check_numpy(&p, llama31, 3, llama31_idx, 7);
}

static void test_hand_values(void **state) {
  (void)state;
  /* head_dim 2: the only frequency is 1, so position p rotates (1, 0) to (cos p, sin p) */
  int64_t shape[2] = {3, 2};
  servd_tensor *x = servd_tensor_new(SERVD_F32, 2, shape);
  const int32_t ps[3] = {0, 1, 2};
  servd_tensor *pos = positions(3, ps);
  for (int r = 0; r < 3; r++) {
    f(x)[2 * r] = 1.0f;
    f(x)[2 * r + 1] = 0.0f;
  }
  servd_rope_params p = params(SERVD_ROPE_INTERLEAVED, 2, 10000.0f);
  assert_int_equal(servd_rope(x, pos, &p), 0);
  assert_true(f(x)[0] == 1.0f && f(x)[1] == 0.0f); /* position 0 is the identity */
  assert_float_equal(f(x)[2], 0.54030231f, 1e-7);
  assert_float_equal(f(x)[3], 0.84147098f, 1e-7);
  assert_float_equal(f(x)[4], -0.41614684f, 1e-7);
  assert_float_equal(f(x)[5], 0.90929743f, 1e-7);
  servd_tensor_release(x);
  servd_tensor_release(pos);
}

/* Reference: transformers' f32 frequencies and angles, rotation in double. */
static void ref_rope(double *out, const float *x, int n_heads, int d, int pos, servd_rope_layout l, float theta) {
  int h = d / 2;
  for (int hd = 0; hd < n_heads; hd++) {
    const float *xi = x + hd * d;
    double *o = out + hd * d;
    for (int i = 0; i < h; i++) {
      float inv = 1.0f / powf(theta, (float)(2 * i) / (float)d);
      float a = inv * (float)pos;
      double c = cos((double)a), s = sin((double)a);
      int i0 = l == SERVD_ROPE_HALF ? i : 2 * i, i1 = l == SERVD_ROPE_HALF ? i + h : 2 * i + 1;
      o[i0] = xi[i0] * c - xi[i1] * s;
      o[i1] = xi[i1] * c + xi[i0] * s;
    }
  }
}

static void test_isa_paths(void **state) {
  (void)state;
  const int dims[] = {2, 6, 10, 34, 64, 128};
  const int heads[] = {1, 3, 9};
  const int rows[] = {1, 3, 7};
  for (int isa = 0; isa < SERVD_ISA_COUNT; isa++) {
    if (servd_cpu_force_isa((servd_isa)isa) != 0) continue;
    for (int l = 0; l < 2; l++)
      for (int di = 0; di < 6; di++)
        for (int hi = 0; hi < 3; hi++)
          for (int ri = 0; ri < 3; ri++) {
            int d = dims[di], nh = heads[hi], m = rows[ri];
            int64_t shape3[3] = {m, nh, d};
            servd_tensor *x =
                servd_tensor_new(SERVD_F32, (ri & 1) ? 3 : 2, (ri & 1) ? shape3 : (int64_t[]){m, (int64_t)nh * d});
            assert_non_null(x);
            int32_t ps[7];
            for (int r = 0; r < m; r++) ps[r] = (int32_t)(frand(0, 3000));
            servd_tensor *pos = positions(m, ps);
            float *in = test_malloc((size_t)m * nh * d * sizeof(float));
            double *ref = test_malloc((size_t)m * nh * d * sizeof(double));
            for (int i = 0; i < m * nh * d; i++) in[i] = f(x)[i] = frand(-2, 2);
            servd_rope_params p = params((servd_rope_layout)l, d, 10000.0f);
            assert_int_equal(servd_rope(x, pos, &p), 0);
            for (int r = 0; r < m; r++)
              ref_rope(ref + r * nh * d, in + r * nh * d, nh, d, ps[r], (servd_rope_layout)l, 10000.0f);
            for (int i = 0; i < m * nh * d; i++)
              /* same f32 angles; libm cosf/sinf (<1 ulp) and two f32 roundings per output on |x| <= 2 */
              if (fabs(f(x)[i] - ref[i]) > 1e-6)
                fail_msg("rope isa %d layout %d d %d heads %d rows %d i %d: %.9g vs %.9g", isa, l, d, nh, m, i,
                         (double)f(x)[i], ref[i]);
            test_free(in);
            test_free(ref);
            servd_tensor_release(x);
            servd_tensor_release(pos);
          }
  }
  servd_cpu_force_isa(SERVD_ISA_COUNT);
}

/* Tables (YaRN, LongRoPE): the given inverse frequencies instead of theta's, cos and sin times
 * attn_factor, and the long table for the whole call once any position reaches long_from. The
 * reference rotates in double with the same f32 angle inv[i] * position. */
static void test_tables(void **state) {
  (void)state;
  enum { D = 96, H = D / 2, NH = 3 }; /* Phi-3's head_dim */
  float inv[H], inv_long[H];
  for (int i = 0; i < H; i++) {
    inv[i] = (float)(1.0 / (pow(10000.0, 2.0 * i / D) * (1.0 + 0.05 * i)));
    inv_long[i] = (float)(1.0 / (pow(10000.0, 2.0 * i / D) * (1.0 + 0.9 * i)));
  }
  const float attn = 1.19f;
  static const struct {
    int m;
    int32_t pos[3];
    bool want_long;
  } calls[] = {{3, {0, 5, 63}, false}, {3, {0, 5, 64}, true}, {1, {2000}, true}, {2, {7, 1}, false}};
  for (int isa = 0; isa < SERVD_ISA_COUNT; isa++) {
    if (servd_cpu_force_isa((servd_isa)isa) != 0) continue;
    for (int l = 0; l < 2; l++)
      for (size_t c = 0; c < sizeof calls / sizeof *calls; c++) {
        int m = calls[c].m;
        int64_t shape[2] = {m, NH * D};
        servd_tensor *x = servd_tensor_new(SERVD_F32, 2, shape), *pos = positions(m, calls[c].pos);
        float in[3 * NH * D];
        for (int i = 0; i < m * NH * D; i++) in[i] = f(x)[i] = frand(-2, 2);
        servd_rope_params p = params((servd_rope_layout)l, D, 10000.0f);
        p.inv_freq = inv, p.inv_freq_long = inv_long, p.long_from = 64, p.attn_factor = attn;
        assert_int_equal(servd_rope(x, pos, &p), 0);
        const float *tab = calls[c].want_long ? inv_long : inv;
        for (int r = 0; r < m; r++)
          for (int hd = 0; hd < NH; hd++)
            for (int i = 0; i < H; i++) {
              int base = (r * NH + hd) * D;
              int i0 = base + (l == SERVD_ROPE_HALF ? i : 2 * i),
                  i1 = base + (l == SERVD_ROPE_HALF ? i + H : 2 * i + 1);
              float a = tab[i] * (float)calls[c].pos[r];
              double co = attn * cos((double)a), si = attn * sin((double)a);
              double r0 = in[i0] * co - in[i1] * si, r1 = in[i1] * co + in[i0] * si;
              if (fabs(f(x)[i0] - r0) > 2e-6 || fabs(f(x)[i1] - r1) > 2e-6)
                fail_msg("rope table isa %d layout %d call %zu row %d pair %d: (%.9g, %.9g) vs (%.9g, %.9g)", isa, l, c,
                         r, i, (double)f(x)[i0], (double)f(x)[i1], r0, r1);
            }
        servd_tensor_release(x);
        servd_tensor_release(pos);
      }
  }
  servd_cpu_force_isa(SERVD_ISA_COUNT);
}

static void test_bad_input(void **state) {
  (void)state;
  int64_t shape[2] = {2, 12};
  servd_tensor *x = servd_tensor_new(SERVD_F32, 2, shape);
  const int32_t ps[3] = {0, 1, -1};
  servd_tensor *pos2 = positions(2, ps), *pos3 = positions(3, ps), *neg = positions(2, ps + 1);
  servd_rope_params p = params(SERVD_ROPE_HALF, 5, 10000.0f);
  assert_int_equal(servd_rope(x, pos2, &p), SERVD_EINVAL); /* odd head_dim */
  assert_non_null(strstr(servd_last_error(), "rope"));
  assert_non_null(strstr(servd_last_error(), "head_dim 5"));
  p.head_dim = 8; /* 12 columns are not whole heads */
  assert_int_equal(servd_rope(x, pos2, &p), SERVD_EINVAL);
  assert_non_null(strstr(servd_last_error(), "f32[2,12]"));
  p.head_dim = 6;
  assert_int_equal(servd_rope(x, pos3, &p), SERVD_EINVAL);
  assert_non_null(strstr(servd_last_error(), "i32[3]"));
  assert_int_equal(servd_rope(x, neg, &p), SERVD_EINVAL);
  p.scaling_factor = 8.0f; /* scaling without its band */
  assert_int_equal(servd_rope(x, pos2, &p), SERVD_EINVAL);
  p.scaling_factor = 1.0f;
  p.layout = (servd_rope_layout)7;
  assert_int_equal(servd_rope(x, pos2, &p), SERVD_EINVAL);
  p.layout = SERVD_ROPE_HALF;
  float tab[3] = {1.0f, 0.5f, 0.25f};
  p.inv_freq_long = tab; /* a long table without the short one */
  assert_int_equal(servd_rope(x, pos2, &p), SERVD_EINVAL);
  assert_non_null(strstr(servd_last_error(), "inv_freq"));
  p.inv_freq = tab, p.long_from = -1;
  assert_int_equal(servd_rope(x, pos2, &p), SERVD_EINVAL);
  p.long_from = 0, p.attn_factor = NAN;
  assert_int_equal(servd_rope(x, pos2, &p), SERVD_EINVAL);
  assert_non_null(strstr(servd_last_error(), "attn_factor"));
  p.attn_factor = 0.0f, p.inv_freq = p.inv_freq_long = NULL;
  assert_int_equal(servd_rope(x, pos2, &p), 0);
  assert_int_equal(servd_rope(x, pos2, NULL), SERVD_EINVAL);
  int64_t empty_shape[2] = {0, 12};
  servd_tensor *empty = servd_tensor_new(SERVD_F32, 2, empty_shape), *pos0 = positions(0, ps);
  assert_int_equal(servd_rope(empty, pos0, &p), 0); /* zero rows: nothing to do */
  servd_tensor_release(empty);
  servd_tensor_release(pos0);
  servd_tensor_release(x);
  servd_tensor_release(pos2);
  servd_tensor_release(pos3);
  servd_tensor_release(neg);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_hand_values), cmocka_unit_test(test_numpy_plain), cmocka_unit_test(test_numpy_llama31),
      cmocka_unit_test(test_isa_paths),   cmocka_unit_test(test_tables),      cmocka_unit_test(test_bad_input),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
