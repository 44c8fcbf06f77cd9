/* Helpers shared by the kernel op tests: a deterministic input generator, tensor shorthands and the checks
 * every quantized type gets (decoder lookups against gguf-py, matmul against float64 and across ISAs).
 * Define TEST_RNG_SEED before including: each test keeps its own input sequence. */
#ifndef SERVD_TEST_KERNELS_UTIL_H
#define SERVD_TEST_KERNELS_UTIL_H

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "servd/ops.h"

#ifndef TEST_RNG_SEED
#error "define TEST_RNG_SEED before including test-util.h"
#endif

static uint32_t rng = TEST_RNG_SEED;

/* Uniform in [lo, hi) from xorshift32: the same inputs on every run and machine. */
static inline float frand(float lo, float hi) {
  rng ^= rng << 13;
  rng ^= rng >> 17;
  rng ^= rng << 5;
  return lo + (hi - lo) * (float)(rng >> 8) / (float)(1u << 24);
}

/* A new tensor of shape (a,) when ndim is 1, else (a, b); fails the test when allocation fails.
 * The caller releases it. */
static inline servd_tensor *tnew(servd_dtype t, int ndim, int64_t a, int64_t b) {
  int64_t shape[2] = {a, b};
  servd_tensor *x = servd_tensor_new(t, ndim, shape);
  assert_non_null(x);
  return x;
}

/* The f32 data of t (borrowed). */
static inline float *f(const servd_tensor *t) { return servd_tensor_data(t); }

/* got[0..n) equal to gguf-py's want up to 1 ulp of the value: the decoders do the same f32
 * operations as gguf-py's. */
static inline void near_ggufpy(servd_dtype dt, const char *what, const float *got, const float *want, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    if (!(fabsf(got[i] - want[i]) <= fabsf(want[i]) * 0x1p-23f))
      fail_msg("%s %s[%lld]: %a, gguf-py %a", servd_dtype_name(dt), what, (long long)i, got[i], want[i]);
  }
}

/* The lookups built on a quantized type's decoder, shared by the quantized kernel tests: a fixture's
 * blocks as a (rows, cols) table, servd_embedding of nids rows idv and servd_dequantize of the whole
 * table equal gguf-py's values (rows * cols floats) up to 1 ulp. */
static inline void check_table_lookups(servd_dtype dt, const uint8_t *bytes, const float *values, int64_t rows,
                                       int64_t cols, const int32_t *idv, int nids) {
  servd_tensor *tab = tnew(dt, 2, rows, cols);
  memcpy(servd_tensor_data(tab), bytes, servd_tensor_nbytes(tab));
  servd_tensor *ids = tnew(SERVD_I32, 1, nids, 0), *out = tnew(SERVD_F32, 2, nids, cols);
  servd_tensor *dq = tnew(SERVD_F32, 2, rows, cols);
  memcpy(servd_tensor_data(ids), idv, (size_t)nids * sizeof *idv);
  assert_int_equal(servd_embedding(out, tab, ids, 0), 0);
  for (int i = 0; i < nids; i++) near_ggufpy(dt, "embedding", f(out) + i * cols, values + idv[i] * cols, cols);
  memset(servd_tensor_data(dq), 0xff, servd_tensor_nbytes(dq)); /* NaN: an element left unwritten shows */
  assert_int_equal(servd_dequantize(dq, tab), 0);
  near_ggufpy(dt, "dequantize", f(dq), values, rows * cols);
  servd_tensor_release(tab);
  servd_tensor_release(ids);
  servd_tensor_release(out);
  servd_tensor_release(dq);
}

/* Bound on |term| per weight of block b of row j of w, read from the block header: each quantized
 * type's own formula. */
typedef double (*block_term_bound)(servd_dtype dt, const servd_tensor *w, int64_t j, int64_t b);

/* A random weight of n rows by k columns of a quantized type. */
typedef servd_tensor *(*rand_weight)(servd_dtype dt, int64_t n, int64_t k);

/* The rows of the block-quantized weight w (n, k) as floats, malloc'd: the float64 references'
 * weights. */
static inline float *dequantized_rows(servd_dtype dt, const servd_tensor *w) {
  const int64_t n = w->shape[0], k = w->shape[1];
  float *wd = malloc((size_t)(n * k) * sizeof(float));
  assert_non_null(wd);
  for (int64_t j = 0; j < n; j++)
    assert_int_equal(servd_row_to_f32(dt, (const char *)servd_tensor_data(w) + j * w->strides[0], wd + j * k, k), 0);
  return wd;
}

/* m rows of random x times the quantized w (n x k), checked the same way by every quantized matmul
 * test: the scalar reference against a float64 product of x and the dequantized weights (activation
 * rounding of amax_b/254 per element of each act_block-element block, 1.01x plus 2^-20 of sum|x*w|),
 * then each SIMD ISA against the scalar reference within (8 + 2*nb) * 2^-22 of sum_b sum|x_b| *
 * wmax_b over the nb weight blocks. Takes w. */
static inline void check_quant_matmul(servd_dtype dt, servd_tensor *w, int64_t m, int64_t act_block,
                                      block_term_bound wmax) {
  const int64_t n = w->shape[0], k = w->shape[1], wb = (int64_t)servd_dtype_block_elems(dt), nb = k / wb;
  servd_tensor *x = tnew(SERVD_F32, 2, m, k);
  for (int64_t i = 0; i < m * k; i++) f(x)[i] = frand(-1.0f, 1.0f) * (i % 7 == 0 ? 4.0f : 1.0f);
  float *wd = dequantized_rows(dt, w);
  servd_tensor *ref = tnew(SERVD_F32, 2, m, n), *out = tnew(SERVD_F32, 2, m, n);

  assert_int_equal(servd_cpu_force_isa(SERVD_ISA_SCALAR), 0);
  assert_int_equal(servd_matmul(ref, x, w), 0);
  for (int64_t i = 0; i < m; i++) {
    const float *xr = f(x) + i * k;
    for (int64_t j = 0; j < n; j++) {
      double exact = 0, bound = 0, mag = 0;
      for (int64_t b = 0; b < k / act_block; b++) {
        double amax = 0, wsum = 0;
        for (int64_t l = 0; l < act_block; l++) {
          const int64_t e = b * act_block + l;
          exact += (double)xr[e] * wd[j * k + e];
          mag += fabs((double)xr[e] * wd[j * k + e]);
          amax = fmax(amax, fabs(xr[e]));
          wsum += fabs(wd[j * k + e]);
        }
        bound += amax / 254.0 * wsum;
      }
      const double got = f(ref)[i * n + j];
      if (!(fabs(got - exact) <= 1.01 * bound + 0x1p-20 * mag + 1e-6))
        fail_msg("%s scalar (%lld,%lld,%lld) [%lld,%lld]: %g vs float64 %g (bound %g)", servd_dtype_name(dt),
                 (long long)m, (long long)n, (long long)k, (long long)i, (long long)j, got, exact, bound);
    }
  }
  for (int isa = SERVD_ISA_AVX2; isa <= (int)servd_cpu_best_isa(); isa++) {
    assert_int_equal(servd_cpu_force_isa((servd_isa)isa), 0);
    memset(servd_tensor_data(out), 0xff, servd_tensor_nbytes(out));
    assert_int_equal(servd_matmul(out, x, w), 0);
    for (int64_t i = 0; i < m; i++) {
      for (int64_t j = 0; j < n; j++) {
        double terms = 0;
        for (int64_t b = 0; b < nb; b++) {
          double xs = 0;
          for (int64_t l = 0; l < wb; l++) xs += fabs(f(x)[i * k + b * wb + l]);
          terms += xs * wmax(dt, w, j, b);
        }
        const double got = f(out)[i * n + j], want = f(ref)[i * n + j], tol = (8 + 2 * nb) * 0x1p-22 * terms;
        if (!(fabs(got - want) <= tol))
          fail_msg("%s %s (%lld,%lld,%lld) [%lld,%lld]: %.9g vs scalar %.9g (tol %g)", servd_dtype_name(dt),
                   servd_isa_name((servd_isa)isa), (long long)m, (long long)n, (long long)k, (long long)i, (long long)j,
                   got, want, tol);
      }
    }
  }
  servd_cpu_force_isa(SERVD_ISA_COUNT);
  free(wd);
  servd_tensor_release(x);
  servd_tensor_release(w);
  servd_tensor_release(ref);
  servd_tensor_release(out);
}

/* Three weights of type dt sharing one 3 x k x (the q/k/v and gate/up projections): servd_matmul_many
 * gives the same bytes as one servd_matmul per weight. */
static inline void check_matmul_many_same(servd_dtype dt, int64_t k, rand_weight make_w) {
  servd_tensor *x = tnew(SERVD_F32, 2, 3, k);
  for (int64_t i = 0; i < 3 * k; i++) f(x)[i] = frand(-1.0f, 1.0f);
  servd_tensor *ws[3] = {make_w(dt, 40, k), make_w(dt, 7, k), make_w(dt, 33, k)};
  servd_tensor *outs[3], *one[3];
  for (int i = 0; i < 3; i++) {
    outs[i] = tnew(SERVD_F32, 2, 3, ws[i]->shape[0]);
    one[i] = tnew(SERVD_F32, 2, 3, ws[i]->shape[0]);
    assert_int_equal(servd_matmul(one[i], x, ws[i]), 0);
  }
  assert_int_equal(servd_matmul_many(3, outs, x, (const servd_tensor *const *)ws), 0);
  for (int i = 0; i < 3; i++) {
    assert_memory_equal(servd_tensor_data(outs[i]), servd_tensor_data(one[i]), servd_tensor_nbytes(one[i]));
    servd_tensor_release(ws[i]);
    servd_tensor_release(outs[i]);
    servd_tensor_release(one[i]);
  }
  servd_tensor_release(x);
}

/* A NaN at x[0][nan_at] and an inf at x[2][7] (3 x k x times the 9-row w) make rows 0 and 2 NaN on
 * every ISA and leave row 1 within 1e-4 of the scalar reference. Takes w. */
static inline void check_nonfinite_rows(servd_dtype dt, servd_tensor *w, int64_t nan_at) {
  const int64_t k = w->shape[1];
  servd_tensor *x = tnew(SERVD_F32, 2, 3, k);
  servd_tensor *ref = tnew(SERVD_F32, 2, 3, 9), *out = tnew(SERVD_F32, 2, 3, 9);
  for (int64_t i = 0; i < 3 * k; i++) f(x)[i] = frand(-1.0f, 1.0f);
  f(x)[nan_at] = NAN;
  f(x)[2 * k + 7] = INFINITY;
  assert_int_equal(servd_cpu_force_isa(SERVD_ISA_SCALAR), 0);
  assert_int_equal(servd_matmul(ref, x, w), 0);
  for (int isa = SERVD_ISA_SCALAR; isa <= (int)servd_cpu_best_isa(); isa++) {
    assert_int_equal(servd_cpu_force_isa((servd_isa)isa), 0);
    assert_int_equal(servd_matmul(out, x, w), 0);
    for (int j = 0; j < 9; j++) {
      if (!isnan(f(out)[j]) || !isnan(f(out)[2 * 9 + j]))
        fail_msg("%s %s: column %d not NaN", servd_dtype_name(dt), servd_isa_name((servd_isa)isa), j);
      const float got = f(out)[9 + j], want = f(ref)[9 + j];
      if (!(fabsf(got - want) <= 1e-4f * (1.0f + fabsf(want))))
        fail_msg("%s %s: row 1 column %d: %g vs scalar %g", servd_dtype_name(dt), servd_isa_name((servd_isa)isa), j,
                 got, want);
    }
  }
  servd_cpu_force_isa(SERVD_ISA_COUNT);
  servd_tensor_release(x);
  servd_tensor_release(w);
  servd_tensor_release(ref);
  servd_tensor_release(out);
}

#endif
