/* The example generic packages (models/examples) served by a pool, checked against a scalar C
 * reference computed from the package's own weights. */
#include "support.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const float *weight(mpk_package *pkg, const char *name, servd_tensor **hold) {
  assert_int_equal(mpk_tensor(pkg, name, hold), 0);
  assert_int_equal((*hold)->dtype, SERVD_F32);
  return servd_tensor_data(*hold);
}

/* y (n) = W (n,k) x (k), in double */
static void ref_matvec(const float *w, const double *x, double *y, int n, int k) {
  for (int i = 0; i < n; i++) {
    double s = 0;
    for (int j = 0; j < k; j++) s += (double)w[(size_t)i * k + j] * x[j];
    y[i] = s;
  }
}

static void ref_rmsnorm(const double *x, const float *g, double *y, int d, double eps) {
  double ss = 0;
  for (int j = 0; j < d; j++) ss += x[j] * x[j];
  double r = 1.0 / sqrt(ss / d + eps);
  for (int j = 0; j < d; j++) y[j] = x[j] * r * g[j];
}

static double silu(double v) { return v / (1.0 + exp(-v)); }

/* The hidden layer both examples share: g (f) = silu(Wg h) * (Wu h) with h (d) = rmsnorm(x) * norm;
 * h and u (f) are scratch. */
static void ref_gated_mlp(const double *x, const float *norm, const float *wg, const float *wu, int d, int f, double *h,
                          double *u, double *g) {
  ref_rmsnorm(x, norm, h, d, 1e-5);
  ref_matvec(wg, h, g, f, d);
  ref_matvec(wu, h, u, f, d);
  for (int j = 0; j < f; j++) g[j] = silu(g[j]) * u[j];
}

static servd_tensor *input(int m, int d, int salt) {
  int64_t shape[2] = {m, d};
  servd_tensor *x = servd_tensor_new(SERVD_F32, 2, shape);
  float *v = servd_tensor_data(x);
  for (int i = 0; i < m * d; i++) v[i] = (float)sin(0.37 * i + salt) * 2.0f;
  return x;
}

static servd_tensor *find(int n, char **names, servd_tensor **ts, const char *name) {
  for (int i = 0; i < n; i++)
    if (!strcmp(names[i], name)) return ts[i];
  fail_msg("output %s missing", name);
  return NULL;
}

static void free_outputs(int n, char **names, servd_tensor **ts) {
  for (int i = 0; i < n; i++) {
    free(names[i]);
    servd_tensor_release(ts[i]);
  }
  free(names);
  free(ts);
}

/* Opens the example package `file` (built into EXAMPLES_BUILD_DIR) into *pkg and a pool of n
 * interpreters on it; the caller destroys the pool, then closes the package. */
static servd_pool *open_example(const char *file, int n, mpk_package **pkg) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", EXAMPLES_BUILD_DIR, file);
  *pkg = NULL;
  assert_int_equal(mpk_open(path, pkg), 0);
  servd_pool_options o = {.n_interpreters = n, .world_size = 1};
  servd_pool *p = NULL;
  int rc = servd_pool_create(*pkg, &o, &p);
  if (rc < 0) fprintf(stderr, "%s\n", servd_last_error());
  assert_int_equal(rc, 0);
  return p;
}

static void test_mlp_classifier(void **state) {
  (void)state;
  mpk_package *pkg;
  servd_pool *p = open_example("mlp_classifier.mpk", 2, &pkg);
  assert_string_equal(mpk_kind(pkg), "generic");
  int rc;

  enum { M = 5, D = 64, H = 256, C = 10 };
  servd_tensor *hold[4];
  const float *norm = weight(pkg, "norm.weight", &hold[0]), *wg = weight(pkg, "gate.weight", &hold[1]),
              *wu = weight(pkg, "up.weight", &hold[2]), *wo = weight(pkg, "out.weight", &hold[3]);
  for (int call = 0; call < 4; call++) { /* both interpreters, twice */
    servd_tensor *x = input(M, D, call);
    const char *in_names[1] = {"x"};
    int n_out;
    char **names;
    servd_tensor **outs;
    servd_py_error err;
    servd_interp *it = servd_pool_acquire(p);
    rc = servd_interp_predict(it, 1, in_names, &x, &n_out, &names, &outs, 5000, &err);
    servd_pool_release(p, it);
    if (rc < 0) fprintf(stderr, "%s: %s\n%s\n", err.type, err.message, err.traceback);
    assert_int_equal(rc, 0);
    servd_tensor *probs = find(n_out, names, outs, "probs"), *label = find(n_out, names, outs, "label");
    assert_int_equal(probs->shape[0], M);
    assert_int_equal(probs->shape[1], C);
    assert_int_equal(label->dtype, SERVD_I32);
    const float *xv = servd_tensor_data(x), *pv = servd_tensor_data(probs);
    const int32_t *lv = servd_tensor_data(label);
    for (int r = 0; r < M; r++) {
      double xr[D], h[D], g[H], u[H], logits[C];
      for (int j = 0; j < D; j++) xr[j] = xv[r * D + j];
      ref_gated_mlp(xr, norm, wg, wu, D, H, h, u, g);
      ref_matvec(wo, g, logits, C, H);
      int best = 0;
      double mx = logits[0], second = -INFINITY, sum = 0;
      for (int c = 1; c < C; c++) {
        if (logits[c] > mx) {
          second = mx;
          mx = logits[c];
          best = c;
        } else if (logits[c] > second) {
          second = logits[c];
        }
      }
      for (int c = 0; c < C; c++) sum += exp(logits[c] - mx);
      /* f32 kernels vs a double reference over sums of <= 256 terms of O(1) values: 1e-4 absolute on
       * probabilities in [0, 1] leaves a wide margin over f32 rounding (~1e-6 relative per term). */
      for (int c = 0; c < C; c++) assert_float_equal(pv[r * C + c], exp(logits[c] - mx) / sum, 1e-4);
      if (mx - second > 1e-3) /* a near tie may legitimately flip in f32 */
        assert_int_equal(lv[r], best);
    }
    free_outputs(n_out, names, outs);
    servd_tensor_release(x);
  }
  for (int i = 0; i < 4; i++) servd_tensor_release(hold[i]);

  /* bad input fails that call only, with the model's message */
  servd_interp *it = servd_pool_acquire(p);
  servd_tensor *bad = input(2, 7, 0);
  const char *in_names[1] = {"x"};
  int n_out;
  char **names;
  servd_tensor **outs;
  servd_py_error err;
  assert_int_equal(servd_interp_predict(it, 1, in_names, &bad, &n_out, &names, &outs, 0, &err), SERVD_EINVAL);
  assert_string_equal(err.type, "ValueError");
  assert_non_null(strstr(err.message, "(batch, 64)"));
  assert_non_null(strstr(err.traceback, "mlp_classifier/model.py"));
  in_names[0] = "y";
  assert_int_equal(servd_interp_predict(it, 1, in_names, &bad, &n_out, &names, &outs, 0, &err), SERVD_EINVAL);
  assert_string_equal(err.type, "KeyError");
  servd_tensor_release(bad);
  json_t *info = NULL;
  assert_int_equal(servd_interp_call_json(it, "info", NULL, &info, 0, &err), 0);
  assert_int_equal(json_integer_value(json_object_get(info, "n_classes")), 10);
  json_decref(info);
  servd_pool_release(p, it);
  servd_pool_destroy(p);
  mpk_close(pkg);
}

static void test_deep_tiny(void **state) {
  (void)state;
  mpk_package *pkg;
  servd_pool *p = open_example("deep_tiny.mpk", 1, &pkg);
  enum { M = 3, D = 32, F = 64, L = 16 };
  servd_tensor *x = input(M, D, 7);
  const char *in_names[1] = {"x"};
  int n_out;
  char **names;
  servd_tensor **outs;
  servd_py_error err;
  assert_int_equal(servd_interp_predict(servd_pool_get(p, 0), 1, in_names, &x, &n_out, &names, &outs, 0, &err), 0);
  const float *yv = servd_tensor_data(find(n_out, names, outs, "y")), *xv = servd_tensor_data(x);
  for (int r = 0; r < M; r++) {
    double res[D], h[D], g[F], u[F], y[D];
    for (int j = 0; j < D; j++) res[j] = xv[r * D + j];
    for (int l = 0; l < L; l++) {
      char name[64];
      servd_tensor *hold[4];
      snprintf(name, sizeof name, "layers.%d.norm", l);
      const float *nw = weight(pkg, name, &hold[0]);
      snprintf(name, sizeof name, "layers.%d.gate", l);
      const float *gw = weight(pkg, name, &hold[1]);
      snprintf(name, sizeof name, "layers.%d.up", l);
      const float *uw = weight(pkg, name, &hold[2]);
      snprintf(name, sizeof name, "layers.%d.down", l);
      const float *dw = weight(pkg, name, &hold[3]);
      ref_gated_mlp(res, nw, gw, uw, D, F, h, u, g);
      ref_matvec(dw, g, y, D, F);
      for (int j = 0; j < D; j++) res[j] += y[j];
      for (int i = 0; i < 4; i++) servd_tensor_release(hold[i]);
    }
    /* 16 residual layers in f32: relative 1e-3 of the row's scale bounds the accumulated rounding */
    double scale = 0;
    for (int j = 0; j < D; j++) scale = fmax(scale, fabs(res[j]));
    for (int j = 0; j < D; j++) assert_float_equal(yv[r * D + j], res[j], 1e-3 * scale + 1e-5);
  }
  free_outputs(n_out, names, outs);
  servd_tensor_release(x);
  servd_pool_destroy(p);
  mpk_close(pkg);
}

int main(int argc, char **argv) {
  support_early_init(argc, argv);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_mlp_classifier),
      cmocka_unit_test(test_deep_tiny),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
