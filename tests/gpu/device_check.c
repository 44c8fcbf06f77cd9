/* GPU check of the device layer (servd/device.h), through its API only: every device op against the
 * CPU op on the same values, uploads and copies, the shared weight cache, the device KV cache and
 * step inputs with a mixed-phase attention batch, a CUDA graph of a decode step replayed on new
 * inputs, the generation counter and the NCCL collectives. Finishes in well under a minute on one
 * H200. Exit 0: every check passed; 1: a check failed; 77: no GPU visible (skipped).
 * Usage: device_check [--device N] */
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "device_check.h"
#include "servd/threadpool.h"

int dc_failures;
int dc_device;
int dc_devices;

double dc_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

void dc_verdict(bool ok, const char *name, const char *fmt, ...) {
  printf("%s %s: ", ok ? "PASS" : "FAIL", name);
  va_list ap;
  va_start(ap, fmt);
  vprintf(fmt, ap);
  va_end(ap);
  printf("\n");
  fflush(stdout);
  if (!ok) dc_failures++;
}

void dc_fail_call(const char *name, const char *call, int rc) {
  dc_verdict(false, name, "%s returned %s (%s)", call, servd_strerror(rc), servd_last_error());
}

bool dc_expect_close(const char *name, const float *g, const float *r, size_t n, double atol, double rtol,
                     const float *atol_i, const char *tol_text) {
  double max_err = 0, max_ratio = 0;
  size_t bad = 0, first_bad = 0;
  for (size_t i = 0; i < n; i++) {
    const double e = fabs((double)g[i] - (double)r[i]);
    const double tol = atol + (atol_i ? atol_i[i] : 0) + rtol * fabs((double)r[i]);
    if (!(e <= tol)) { /* NaN lands here too */
      if (!bad) first_bad = i;
      bad++;
    }
    if (e > max_err || isnan(e)) max_err = e;
    const double ratio = tol > 0 ? e / tol : (e > 0 ? INFINITY : 0);
    if (ratio > max_ratio || isnan(ratio)) max_ratio = ratio;
  }
  if (bad)
    dc_verdict(false, name,
               "%zu of %zu beyond tolerance (first at %zu: device %.6g, cpu %.6g); max err %.3g, "
               "max err/tol %.3g; tol %s",
               bad, n, first_bad, g[first_bad], r[first_bad], max_err, max_ratio, tol_text);
  else dc_verdict(true, name, "n=%zu max err %.3g, max err/tol %.3g; tol %s", n, max_err, max_ratio, tol_text);
  return !bad;
}

bool dc_expect_equal_i32(const char *name, const int32_t *g, const int32_t *r, size_t n) {
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < n; i++)
    if (g[i] != r[i] && !bad++) first = i;
  if (bad)
    dc_verdict(false, name, "%zu of %zu differ (first at %zu: device %d, cpu %d); exact match required", bad, n, first,
               g[first], r[first]);
  else dc_verdict(true, name, "n=%zu, all identical (exact match required)", n);
  return !bad;
}

static uint64_t rng_state = 88172645463325252ull;
uint64_t dc_rand_u64(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return rng_state;
}
float dc_frand(void) { return (float)((dc_rand_u64() >> 40) * (1.0 / 8388608.0)) - 1.0f; }
float dc_round_bf16(float x) { return servd_bf16_to_f32(servd_f32_to_bf16(x)); }

float *dc_rand_bf16(size_t n, float scale) {
  float *v = malloc((n ? n : 1) * sizeof *v);
  if (!v) {
    servd_fail(SERVD_ENOMEM, "device_check: %zu random values", n);
    return NULL;
  }
  for (size_t i = 0; i < n; i++) v[i] = dc_round_bf16(dc_frand() * scale);
  return v;
}

servd_tensor *dc_host_f32(const float *v, int ndim, const int64_t *shape) {
  servd_tensor *t = servd_tensor_new(SERVD_F32, ndim, shape);
  if (t && v) memcpy(servd_tensor_data(t), v, servd_tensor_nbytes(t));
  return t;
}

servd_tensor *dc_host_i32(const int32_t *v, int64_t n) {
  servd_tensor *t = servd_tensor_new(SERVD_I32, 1, &n);
  if (t && v) memcpy(servd_tensor_data(t), v, (size_t)n * 4);
  return t;
}

servd_tensor *dc_host_as(servd_dtype dt, const float *v, int ndim, const int64_t *shape) {
  servd_tensor *t = servd_tensor_new(dt, ndim, shape);
  if (!t) return NULL;
  const int64_t cols = shape[ndim - 1], rows = servd_tensor_numel(t) / (cols ? cols : 1);
  for (int64_t r = 0; r < rows; r++) {
    if (servd_row_from_f32(dt, v + r * cols, (char *)servd_tensor_data(t) + r * servd_dtype_row_bytes(dt, cols),
                           cols)) {
      servd_tensor_release(t);
      return NULL;
    }
  }
  return t;
}

/* Visits the rows (innermost runs) of a tensor of any layout in row-major order. */
static int64_t row_offset(const servd_tensor *t, int64_t r) {
  int64_t off = 0;
  for (int d = t->ndim - 2; d >= 0; d--) {
    off += (r % t->shape[d]) * t->strides[d];
    r /= t->shape[d];
  }
  return off;
}

int dc_host_values(const servd_tensor *h, float *out) {
  const int64_t cols = h->shape[h->ndim - 1], rows = servd_tensor_numel(h) / (cols ? cols : 1);
  for (int64_t r = 0; r < rows; r++) {
    const char *src = (const char *)servd_tensor_data(h) + row_offset(h, r);
    if (h->dtype == SERVD_I32) {
      for (int64_t c = 0; c < cols; c++) out[r * cols + c] = (float)((const int32_t *)src)[c];
      continue;
    }
    int rc = servd_row_to_f32(h->dtype, src, out + r * cols, cols);
    if (rc) return rc;
  }
  return SERVD_OK;
}

int dc_dev_f32(const float *v, int ndim, const int64_t *shape, servd_dtype dtype, servd_tensor **out) {
  *out = NULL;
  servd_tensor *h = dc_host_f32(v, ndim, shape);
  if (!h) return SERVD_ENOMEM;
  int rc = servd_device_upload(dc_device, h, dtype, out);
  servd_tensor_release(h);
  return rc;
}

int dc_dev_i32(const int32_t *v, int64_t n, servd_tensor **out) {
  *out = NULL;
  servd_tensor *h = dc_host_i32(v, n);
  if (!h) return SERVD_ENOMEM;
  int rc = servd_device_upload(dc_device, h, SERVD_I32, out);
  servd_tensor_release(h);
  return rc;
}

int dc_dev_new(servd_dtype dtype, int ndim, const int64_t *shape, servd_tensor **out) {
  return servd_device_tensor_new(dc_device, dtype, ndim, shape, out);
}

int dc_download_f32(const servd_tensor *d, float *out) {
  servd_tensor *h = servd_tensor_new(d->dtype, d->ndim, d->shape);
  if (!h) return SERVD_ENOMEM;
  int rc = servd_device_copy(h, d);
  if (!rc) rc = dc_host_values(h, out);
  servd_tensor_release(h);
  return rc;
}

int dc_download_i32(const servd_tensor *d, int32_t *out) {
  servd_tensor *h = servd_tensor_new(d->dtype, d->ndim, d->shape);
  if (!h) return SERVD_ENOMEM;
  int rc = d->dtype == SERVD_I32
               ? servd_device_copy(h, d)
               : servd_fail(SERVD_EINVAL, "device_check: download_i32 of a %s tensor", servd_dtype_name(d->dtype));
  if (!rc) memcpy(out, servd_tensor_data(h), servd_tensor_nbytes(h));
  servd_tensor_release(h);
  return rc;
}

static void on_alarm(int sig) {
  (void)sig;
  static const char msg[] = "FAIL device_check: still running after 120 s (a hang); stopped\n";
  ssize_t w = write(1, msg, sizeof msg - 1);
  (void)w;
  _exit(1);
}

int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--device") && i + 1 < argc) {
      dc_device = atoi(argv[++i]);
    } else {
      fprintf(stderr, "usage: device_check [--device N]\n");
      return 2;
    }
  }
  char why[256] = "";
  int rc = servd_device_count(&dc_devices, why, sizeof why);
  if (rc || dc_devices == 0) {
    printf("SKIP device_check: no CUDA device visible (%s); the device-layer check needs one\n",
           rc ? servd_last_error() : why);
    return 77;
  }
  if (dc_device < 0 || dc_device >= dc_devices) {
    fprintf(stderr, "device_check: --device %d, but %d device(s) are visible\n", dc_device, dc_devices);
    return 2;
  }
  signal(SIGALRM, on_alarm);
  alarm(120);
  servd_threadpool_init(0);
  char desc[256] = "";
  size_t free_b = 0, total_b = 0;
  if (servd_device_describe(dc_device, desc, sizeof desc) || servd_device_mem_info(dc_device, &free_b, &total_b))
    dc_verdict(false, "describe", "%s", servd_last_error());
  else
    dc_verdict(true, "describe", "cuda:%d of %d: %s; %.1f of %.1f GB free", dc_device, dc_devices, desc, free_b / 1e9,
               total_b / 1e9);
  const double t0 = dc_now();
  dc_check_ops();
  dc_check_memory();
  dc_check_kv();
  dc_check_graph();
  dc_check_comm();
  printf("device_check: %s, %d failed check(s), %.1f s\n", dc_failures ? "FAIL" : "PASS", dc_failures, dc_now() - t0);
  return dc_failures ? 1 : 0;
}
