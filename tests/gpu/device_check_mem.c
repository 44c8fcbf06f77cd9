/* Uploads, copies and strided views; the shared weight cache. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device_check.h"

/* Upload of a host tensor of dtype `src` into a device tensor of dtype `dst`, then back to the host.
 * The reference is servd_row_to_f32 of the host rows (rounded to bf16 for a bf16 target).
 * Plain dtypes convert exactly (f16 and bf16 fit in f32; f32 -> bf16 is one round-to-nearest-even on
 * both sides). q8_0 (d*q: 11 x 8 significant bits) and q4_1 (d*q exact, + m rounded once) are exact
 * in f32 whether or not the device fuses the multiply-add; a tolerance of one f32 ulp (2^-23 |ref|)
 * covers another association, and for a bf16 target one bf16 ulp (<= 2^-7 |ref|) covers a value one
 * f32 ulp away from a rounding tie. */
static void check_roundtrip(servd_dtype src, servd_dtype dst) {
  char name[96];
  snprintf(name, sizeof name, "upload %s -> device %s -> host", servd_dtype_name(src), servd_dtype_name(dst));
  enum { R = 33, C = 256 };
  const int64_t shape[2] = {R, C};
  float *v = NULL, *ref = NULL, *got = NULL;
  servd_tensor *h = NULL, *d = NULL, *d2 = NULL;
  NN(v = malloc((size_t)R * C * sizeof *v));
  NN(ref = malloc((size_t)R * C * sizeof *ref));
  NN(got = malloc((size_t)R * C * sizeof *got));
  for (size_t i = 0; i < (size_t)R * C; i++) v[i] = dc_frand() * ldexpf(1.f, (int)(dc_rand_u64() % 24) - 12);
  /* ties of f32 -> bf16 rounding: 1 + 2^-8 goes to 1 (even), 1 + 3*2^-8 to 1 + 2^-6 */
  v[0] = 1.f + ldexpf(1, -8), v[1] = 1.f + 3 * ldexpf(1, -8), v[2] = -0.f;
  NN(h = dc_host_as(src, v, 2, shape));
  TRY(dc_host_values(h, ref));
  const bool quant = servd_dtype_is_quantized(src);
  if (dst == SERVD_BF16)
    for (size_t i = 0; i < (size_t)R * C; i++) ref[i] = dc_round_bf16(ref[i]);
  TRY(servd_device_upload(dc_device, h, dst, &d));
  TRY(dc_download_f32(d, got));
  const double rtol = !quant ? 0 : dst == SERVD_BF16 ? ldexp(1, -7) : ldexp(1, -23);
  dc_expect_close(name, got, ref, (size_t)R * C, 0, rtol, NULL,
                  !quant              ? "exact"
                  : dst == SERVD_BF16 ? "1 bf16 ulp (2^-7|ref|)"
                                      : "1 f32 ulp (2^-23|ref|)");
  /* device -> device copy of the same */
  TRY(dc_dev_new(dst, 2, shape, &d2));
  TRY(servd_device_copy(d2, d));
  float *again = got;
  TRY(dc_download_f32(d2, again));
  float *first = ref;
  TRY(dc_download_f32(d, first));
  snprintf(name, sizeof name, "copy device %s -> device", servd_dtype_name(dst));
  dc_expect_close(name, again, first, (size_t)R * C, 0, 0, NULL, "exact");
done:
  free(v), free(ref), free(got);
  servd_tensor_release(h), servd_tensor_release(d), servd_tensor_release(d2);
}

/* A tensor larger than any reasonable staging buffer (34 MB of f32, 18 MB of q4_1 rows), so a
 * conversion that goes through the host in chunks is checked across chunk boundaries. Tolerances as
 * above. */
static void check_upload_large(servd_dtype src, servd_dtype dst, int64_t rows) {
  char name[128];
  snprintf(name, sizeof name, "upload %s[%lld,4096] -> device %s (large: several staging chunks)",
           servd_dtype_name(src), (long long)rows, servd_dtype_name(dst));
  const int64_t shape[2] = {rows, 4096};
  const size_t n = (size_t)rows * 4096;
  float *v = NULL, *ref = NULL, *got = NULL;
  servd_tensor *h = NULL, *d = NULL;
  NN(v = malloc(n * sizeof *v));
  NN(ref = malloc(n * sizeof *ref));
  NN(got = malloc(n * sizeof *got));
  for (size_t i = 0; i < n; i++) v[i] = dc_frand() * 3.f;
  NN(h = dc_host_as(src, v, 2, shape));
  TRY(dc_host_values(h, ref));
  if (dst == SERVD_BF16)
    for (size_t i = 0; i < n; i++) ref[i] = dc_round_bf16(ref[i]);
  TRY(servd_device_upload(dc_device, h, dst, &d));
  TRY(dc_download_f32(d, got));
  const bool quant = servd_dtype_is_quantized(src);
  dc_expect_close(name, got, ref, n, 0,
                  !quant              ? 0
                  : dst == SERVD_BF16 ? ldexp(1, -7)
                                      : ldexp(1, -23),
                  NULL,
                  !quant              ? "exact"
                  : dst == SERVD_BF16 ? "1 bf16 ulp (2^-7|ref|)"
                                      : "1 f32 ulp (2^-23|ref|)");
done:
  free(v), free(ref), free(got);
  servd_tensor_release(h), servd_tensor_release(d);
}

static void check_roundtrip_i32(void) {
  const char *name = "upload i32 -> device i32 -> host";
  enum { N = 1000 };
  int32_t v[N], got[N];
  servd_tensor *d = NULL;
  for (int i = 0; i < N; i++) v[i] = (int32_t)(dc_rand_u64() >> 32);
  TRY(dc_dev_i32(v, N, &d));
  TRY(dc_download_i32(d, got));
  dc_expect_equal_i32(name, got, v, N);
done:
  servd_tensor_release(d);
}

/* Strided views: column slices and row ranges, on the host side and on the device side. */
static void check_strided(void) {
  const char *name = "strided views";
  enum { R = 40, C = 256 };
  const int64_t shape[2] = {R, C};
  float *v = NULL, *ref = NULL, *got = NULL, *full = NULL;
  servd_tensor *hf = NULL, *hq = NULL, *view = NULL, *d = NULL, *dfull = NULL, *dview = NULL, *dcont = NULL,
               *hdst = NULL, *hview = NULL, *src = NULL;
  NN(v = dc_rand_bf16((size_t)R * C, 1.f));
  NN(ref = malloc((size_t)R * C * sizeof *ref));
  NN(got = malloc((size_t)R * C * sizeof *got));
  NN(full = malloc((size_t)R * C * sizeof *full));
  NN(hf = dc_host_f32(v, 2, shape));
  /* host f32 column slice [16, 64) of rows [3, 23): rows 1 KB apart, 192 bytes each */
  {
    servd_tensor *rows = servd_tensor_narrow(hf, 0, 3, 20);
    NN(rows);
    view = servd_tensor_narrow(rows, 1, 16, 48);
    servd_tensor_release(rows);
    NN(view);
  }
  TRY(dc_host_values(view, ref));
  TRY(servd_device_upload(dc_device, view, SERVD_BF16, &d));
  TRY(dc_download_f32(d, got));
  dc_expect_close("upload of a strided host view f32[20,48] (row stride 1024 B) -> bf16", got, ref, 20 * 48, 0, 0, NULL,
                  "exact (bf16 values)");
  servd_tensor_release(d), d = NULL;
  servd_tensor_release(view), view = NULL;
  /* host q4_1 view: rows [5, 25), blocks [2, 6) of each row */
  NN(hq = dc_host_as(SERVD_Q4_1, v, 2, shape));
  {
    servd_tensor *rows = servd_tensor_narrow(hq, 0, 5, 20);
    NN(rows);
    view = servd_tensor_narrow(rows, 1, 64, 128);
    servd_tensor_release(rows);
    NN(view);
  }
  TRY(dc_host_values(view, ref));
  TRY(servd_device_upload(dc_device, view, SERVD_F32, &d));
  TRY(dc_download_f32(d, got));
  dc_expect_close("upload of a strided q4_1 view [20,128] -> f32 (dequantized)", got, ref, 20 * 128, 0, ldexp(1, -23),
                  NULL, "1 f32 ulp");
  servd_tensor_release(view), view = NULL;
  /* device -> strided host destination: columns [32, 160) of a zeroed host f32[20,256] */
  {
    const int64_t hs[2] = {20, 256};
    NN(hdst = dc_host_f32(NULL, 2, hs));
    NN(hview = servd_tensor_narrow(hdst, 1, 32, 128));
    TRY(servd_device_copy(hview, d));
    const float *h = servd_tensor_data(hdst);
    size_t bad = 0;
    for (int r = 0; r < 20; r++)
      for (int c = 0; c < 256; c++) {
        const float want = c >= 32 && c < 160 ? ref[r * 128 + c - 32] : 0.f;
        bad += h[r * 256 + c] != want;
      }
    dc_verdict(!bad, "copy device f32[20,128] -> strided host columns [32,160) of f32[20,256]",
               "%zu of %d values wrong (columns outside must stay 0; exact)", bad, 20 * 256);
  }
  servd_tensor_release(d), d = NULL;
  /* host -> strided device destination, then device view -> contiguous device */
  {
    const int64_t ds[2] = {20, 256}, vs[2] = {20, 100};
    TRY(dc_dev_new(SERVD_BF16, 2, ds, &dfull));
    NN(dview = servd_tensor_narrow(dfull, 1, 60, 100));
    NN(src = dc_host_as(SERVD_BF16, v, 2, vs));
    TRY(servd_device_copy(dview, src));
    TRY(dc_download_f32(dfull, full));
    size_t bad = 0;
    for (int r = 0; r < 20; r++)
      for (int c = 0; c < 256; c++) {
        const float want = c >= 60 && c < 160 ? v[r * 100 + c - 60] : 0.f;
        bad += full[r * 256 + c] != want;
      }
    dc_verdict(!bad, "copy host bf16[20,100] -> strided device columns [60,160) of bf16[20,256]",
               "%zu of %d values wrong (columns outside must stay 0; exact)", bad, 20 * 256);
    TRY(dc_dev_new(SERVD_BF16, 2, vs, &dcont));
    TRY(servd_device_copy(dcont, dview));
    TRY(dc_download_f32(dcont, got));
    dc_expect_close("copy strided device view -> contiguous device tensor", got, v, 20 * 100, 0, 0, NULL, "exact");
    TRY(dc_download_f32(dview, got));
    dc_expect_close("copy strided device view -> host", got, v, 20 * 100, 0, 0, NULL, "exact");
  }
done:
  free(v), free(ref), free(got), free(full);
  servd_tensor_release(hf), servd_tensor_release(hq), servd_tensor_release(view), servd_tensor_release(d);
  servd_tensor_release(dfull), servd_tensor_release(dview), servd_tensor_release(dcont);
  servd_tensor_release(hdst), servd_tensor_release(hview), servd_tensor_release(src);
}

/* ---- the shared weight cache ---- */
typedef struct weight_req {
  const servd_tensor *base; /* host weight; each thread makes its own view of it */
  pthread_barrier_t *start;
  servd_tensor *got;
  int rc;
  char err[256];
} weight_req;

static void *weight_thread(void *arg) {
  weight_req *q = arg;
  servd_tensor *view = servd_tensor_narrow(q->base, 0, 64, 128);
  pthread_barrier_wait(q->start);
  q->rc = view ? servd_device_weight(dc_device, view, &q->got) : SERVD_ENOMEM;
  if (q->rc) snprintf(q->err, sizeof q->err, "%s", servd_last_error());
  servd_tensor_release(view);
  return NULL;
}

/* Two threads asking at the same moment for the same bytes (each through its own view object) get
 * one device copy; a view with the same address but another shape, or another address, gets its
 * own; trim frees exactly the entries nobody holds, and the memory of an entry outlives the threads
 * that created it. */
static void check_weights(void) {
  const char *name = "weight cache";
  enum { R = 256, C = 512 };
  const int64_t shape[2] = {R, C};
  float *v = NULL, *got = NULL, *want = NULL;
  servd_tensor *w = NULL, *v2 = NULL, *v3 = NULL, *w2 = NULL, *w3 = NULL, *w2b = NULL, *w1b = NULL, *qh = NULL,
               *qw = NULL;
  weight_req req[2] = {{0}, {0}};
  pthread_barrier_t start;
  bool barrier = false;
  NN(v = dc_rand_bf16((size_t)R * C, 1.f));
  NN(got = malloc((size_t)R * C * sizeof *got));
  NN(want = malloc((size_t)R * C * sizeof *want));
  NN(w = dc_host_as(SERVD_BF16, v, 2, shape));
  servd_device_weights_trim(); /* the baseline holds no unreferenced entries */
  const size_t b0 = servd_device_weights_bytes(dc_device);
  pthread_barrier_init(&start, NULL, 2);
  barrier = true;
  pthread_t th[2];
  for (int i = 0; i < 2; i++) {
    req[i].base = w, req[i].start = &start;
    if (pthread_create(&th[i], NULL, weight_thread, &req[i])) {
      dc_verdict(false, name, "pthread_create failed");
      exit(1); /* a started thread waits at the barrier for good */
    }
  }
  for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < 2; i++)
    if (req[i].rc) {
      dc_verdict(false, name, "servd_device_weight in thread %d: %s (%s)", i, servd_strerror(req[i].rc), req[i].err);
      goto done;
    }
  const void *p1 = servd_tensor_data(req[0].got);
  dc_verdict(p1 == servd_tensor_data(req[1].got) && req[0].got->dtype == SERVD_BF16 &&
                 req[0].got->device == dc_device && req[0].got->shape[0] == 128 && req[0].got->shape[1] == C,
             "weight: two threads, same view, same moment -> one device copy",
             "device pointers %p and %p (must be equal), bf16[128,%d] on cuda:%d", p1, servd_tensor_data(req[1].got), C,
             dc_device);
  /* contents, read after both creating threads have exited */
  TRY(dc_download_f32(req[0].got, got));
  dc_expect_close("weight contents (rows 64..191), read after the creating threads exited", got, v + 64 * C, 128 * C, 0,
                  0, NULL, "exact");
  NN(v2 = servd_tensor_narrow(w, 0, 64, 64)); /* same data address, other shape */
  NN(v3 = servd_tensor_narrow(w, 0, 0, 128)); /* same shape, other address */
  TRY(servd_device_weight(dc_device, v2, &w2));
  TRY(servd_device_weight(dc_device, v3, &w3));
  const void *p2 = servd_tensor_data(w2), *p3 = servd_tensor_data(w3);
  dc_verdict(p2 != p1 && p3 != p1 && p2 != p3, "weight: other views -> other device copies",
             "same address other shape %p, other address same shape %p, first %p (all distinct)", p2, p3, p1);
  TRY(dc_download_f32(w3, got));
  dc_expect_close("weight contents (rows 0..127)", got, v, 128 * C, 0, 0, NULL, "exact");
  const size_t b1 = servd_device_weights_bytes(dc_device), e1 = 128 * C * 2, e2 = 64 * C * 2;
  dc_verdict(b1 >= b0 + 2 * e1 + e2, "weights_bytes counts the three entries", "grew by %zu bytes (>= %zu expected)",
             b1 - b0, 2 * e1 + e2);
  /* drop every reference to the first and third entries, keep the second, trim */
  servd_tensor_release(req[0].got), servd_tensor_release(req[1].got), servd_tensor_release(w3);
  req[0].got = req[1].got = w3 = NULL;
  servd_device_weights_trim();
  const size_t b2 = servd_device_weights_bytes(dc_device);
  TRY(servd_device_weight(dc_device, v2, &w2b));
  const size_t b3 = servd_device_weights_bytes(dc_device);
  dc_verdict(b2 + 2 * e1 <= b1 && b2 >= b0 + e2 && servd_tensor_data(w2b) == servd_tensor_data(w2) && b3 == b2,
             "weights_trim frees the unreferenced entries only",
             "bytes %zu -> %zu after trim (-%zu, >= %zu expected), held entry still cached: %s, re-asking it "
             "allocated %zu bytes (0 expected)",
             b1, b2, b1 - b2, 2 * e1, servd_tensor_data(w2b) == servd_tensor_data(w2) ? "yes" : "no", b3 - b2);
  { /* an entry referenced only through a view of its tensor is still referenced: trim keeps it */
    servd_tensor *part = servd_tensor_narrow(w2b, 0, 0, 32);
    NN(part);
    servd_tensor_release(w2), servd_tensor_release(w2b);
    w2 = w2b = NULL;
    servd_device_weights_trim();
    const size_t b4 = servd_device_weights_bytes(dc_device);
    int rc = servd_device_weight(dc_device, v2, &w2);
    const bool same = !rc && servd_tensor_data(w2) == servd_tensor_data(part);
    servd_tensor_release(part);
    TRY(rc);
    /* Reported, not counted: trim judges by references to the cached tensor, and a view holds its
     * storage instead; the memory stays valid either way, the cost is a second upload. */
    printf("info weights_trim with an entry referenced only through a view of it: %s (bytes after trim %zu, "
           "%zu if kept)\n",
           same && b4 == b2 ? "kept" : "dropped; asking again uploaded a second copy", b4, b2);
  }
  { /* the trimmed entry is uploaded again on demand */
    servd_tensor *again = servd_tensor_narrow(w, 0, 64, 128);
    NN(again);
    int rc = servd_device_weight(dc_device, again, &w1b);
    servd_tensor_release(again);
    TRY(rc);
    TRY(dc_download_f32(w1b, got));
    dc_expect_close("weight uploaded again after trim", got, v + 64 * C, 128 * C, 0, 0, NULL, "exact");
  }
  { /* a q4_1 weight: the cache holds bf16 of the dequantized values */
    const int64_t qs[2] = {64, 256};
    NN(qh = dc_host_as(SERVD_Q4_1, v, 2, qs));
    TRY(dc_host_values(qh, want));
    for (int i = 0; i < 64 * 256; i++) want[i] = dc_round_bf16(want[i]);
    TRY(servd_device_weight(dc_device, qh, &qw));
    TRY(dc_download_f32(qw, got));
    dc_expect_close("weight of a q4_1 tensor (bf16 of the dequantized values)", got, want, 64 * 256, 0, ldexp(1, -7),
                    NULL, "1 bf16 ulp (2^-7|ref|)");
  }
done:
  if (barrier) pthread_barrier_destroy(&start);
  servd_tensor_release(req[0].got), servd_tensor_release(req[1].got);
  servd_tensor_release(w2), servd_tensor_release(w3), servd_tensor_release(w2b), servd_tensor_release(w1b);
  servd_tensor_release(v2), servd_tensor_release(v3), servd_tensor_release(w), servd_tensor_release(qh);
  servd_tensor_release(qw);
  servd_device_weights_trim();
  free(v), free(got), free(want);
}

void dc_check_memory(void) {
  const servd_dtype srcs[] = {SERVD_F32, SERVD_BF16, SERVD_F16, SERVD_Q8_0, SERVD_Q4_1};
  for (size_t i = 0; i < sizeof srcs / sizeof *srcs; i++) {
    check_roundtrip(srcs[i], SERVD_F32);
    check_roundtrip(srcs[i], SERVD_BF16);
  }
  check_roundtrip_i32();
  check_upload_large(SERVD_F32, SERVD_BF16, 2100);
  check_upload_large(SERVD_Q4_1, SERVD_F32, 1100);
  check_strided();
  check_weights();
}
