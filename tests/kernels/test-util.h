/* Helpers shared by the kernel op tests: a deterministic input generator and tensor shorthands.
 * Define TEST_RNG_SEED before including: each test keeps its own input sequence. */
#ifndef SERVD_TEST_KERNELS_UTIL_H
#define SERVD_TEST_KERNELS_UTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

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

#endif
