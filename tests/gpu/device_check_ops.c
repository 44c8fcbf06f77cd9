/* The tensor ops of servd/device.h against the CPU ops of servd/ops.h on the same bf16 values. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device_check.h"

/* matmul, bf16 and f32 outputs. Inputs are exact bf16 values on both sides and both accumulate in
 * f32, in different orders. Per output element, let S = sum_k |x_k||w_k| (computed with the CPU op on
 * |x| and |w|): an f32 sum of k terms in any order is within k * 2^-24 * S of the exact sum in the
 * worst case and ~sqrt(k) * 2^-24 * S typically (~2^-18 S at k = 4096). The allowance 2^-15 S is 8x
 * the typical difference of the two orders and still below one average product term, so a dropped
 * or repeated term of the k loop shows. The bf16 output adds one rounding (2^-8 |ref|), allowed
 * twice: 2^-7 |ref|. */
static void check_matmul_shape(int n, int k) {
  const int ms[] = {1, 7, 64, 300};
  const char *name = "matmul setup";
  char label[128];
  float *wv = NULL, *wabs = NULL, *xv = NULL, *xabs = NULL, *got = NULL, *ref = NULL, *sum = NULL;
  servd_tensor *wh = NULL, *wah = NULL, *wd = NULL, *xh = NULL, *xah = NULL, *xd = NULL, *rh = NULL, *sh = NULL,
               *ob = NULL, *of = NULL;
  const float wscale = 3.f / sqrtf((float)k);
  NN(wv = dc_rand_bf16((size_t)n * k, wscale));
  NN(wabs = malloc((size_t)n * k * sizeof *wabs));
  for (size_t i = 0; i < (size_t)n * k; i++) wabs[i] = fabsf(wv[i]);
  const int64_t wshape[2] = {n, k};
  NN(wh = dc_host_as(SERVD_BF16, wv, 2, wshape));
  NN(wah = dc_host_as(SERVD_BF16, wabs, 2, wshape));
  TRY(servd_device_upload(dc_device, wh, SERVD_BF16, &wd));
  for (size_t t = 0; t < sizeof ms / sizeof *ms; t++) {
    const int m = ms[t];
    const int64_t xshape[2] = {m, k}, oshape[2] = {m, n};
    NN(xv = dc_rand_bf16((size_t)m * k, 1.f));
    NN(xabs = malloc((size_t)m * k * sizeof *xabs));
    for (size_t i = 0; i < (size_t)m * k; i++) xabs[i] = fabsf(xv[i]);
    NN(xh = dc_host_f32(xv, 2, xshape));
    NN(xah = dc_host_f32(xabs, 2, xshape));
    NN(rh = dc_host_f32(NULL, 2, oshape));
    NN(sh = dc_host_f32(NULL, 2, oshape));
    name = "matmul cpu reference";
    TRY(servd_matmul(rh, xh, wh));
    TRY(servd_matmul(sh, xah, wah));
    ref = servd_tensor_data(rh);
    NN(sum = malloc((size_t)m * n * sizeof *sum));
    for (size_t i = 0; i < (size_t)m * n; i++) sum[i] = ldexpf(((float *)servd_tensor_data(sh))[i], -15);
    NN(got = malloc((size_t)m * n * sizeof *got));
    TRY(servd_device_upload(dc_device, xh, SERVD_BF16, &xd));
    TRY(dc_dev_new(SERVD_BF16, 2, oshape, &ob));
    TRY(dc_dev_new(SERVD_F32, 2, oshape, &of));
    snprintf(label, sizeof label, "matmul bf16-out m=%d n=%d k=%d", m, n, k);
    name = label;
    TRY(servd_device_matmul(ob, xd, wd));
    TRY(dc_download_f32(ob, got));
    dc_expect_close(label, got, ref, (size_t)m * n, 0, ldexp(1, -7), sum, "2^-7|ref| + 2^-15 sum|x||w|");
    snprintf(label, sizeof label, "matmul f32-out m=%d n=%d k=%d", m, n, k);
    TRY(servd_device_matmul(of, xd, wd));
    TRY(dc_download_f32(of, got));
    dc_expect_close(label, got, ref, (size_t)m * n, 0, 0, sum, "2^-15 sum|x||w|");
    free(xv), free(xabs), free(sum), free(got);
    xv = xabs = sum = got = NULL;
    servd_tensor_release(xh), servd_tensor_release(xah), servd_tensor_release(xd), servd_tensor_release(rh);
    servd_tensor_release(sh), servd_tensor_release(ob), servd_tensor_release(of);
    xh = xah = xd = rh = sh = ob = of = NULL;
  }
done:
  free(wv), free(wabs), free(xv), free(xabs), free(got), free(sum);
  servd_tensor_release(wh), servd_tensor_release(wah), servd_tensor_release(wd), servd_tensor_release(xh);
  servd_tensor_release(xah), servd_tensor_release(xd), servd_tensor_release(rh), servd_tensor_release(sh);
  servd_tensor_release(ob), servd_tensor_release(of);
}

/* Embedding of a vocabulary shard [500, 1500): a copy of rows, so exact; ids outside the shard
 * (below, above, far above) give zero rows. */
static void check_embedding(void) {
  const char *name = "embedding";
  enum { ROWS = 1000, D = 4096, M = 9 };
  const int64_t off = 500;
  const int32_t ids[M] = {500, 1499, 0, 1500, 777, 2000000000, 499, 1000, 777};
  float *tv = NULL, *got = NULL;
  servd_tensor *th = NULL, *ih = NULL, *rh = NULL, *td = NULL, *idd = NULL, *od = NULL;
  NN(tv = dc_rand_bf16((size_t)ROWS * D, 1.f));
  const int64_t tshape[2] = {ROWS, D}, oshape[2] = {M, D};
  NN(th = dc_host_as(SERVD_BF16, tv, 2, tshape));
  NN(ih = dc_host_i32(ids, M));
  NN(rh = dc_host_f32(NULL, 2, oshape));
  TRY(servd_embedding(rh, th, ih, off));
  TRY(servd_device_upload(dc_device, th, SERVD_BF16, &td));
  TRY(servd_device_upload(dc_device, ih, SERVD_I32, &idd));
  /* poison the output so that "zero rows" must be written, not inherited from a zeroed tensor */
  TRY(dc_dev_f32(tv, 2, oshape, SERVD_BF16, &od));
  TRY(servd_device_embedding(od, td, idd, off));
  NN(got = malloc((size_t)M * D * sizeof *got));
  TRY(dc_download_f32(od, got));
  dc_expect_close("embedding shard [500,1500) of 1000x4096, 4 ids outside -> zero rows", got, servd_tensor_data(rh),
                  (size_t)M * D, 0, 0, NULL, "exact (a copy)");
done:
  free(tv), free(got);
  servd_tensor_release(th), servd_tensor_release(ih), servd_tensor_release(rh), servd_tensor_release(td);
  servd_tensor_release(idd), servd_tensor_release(od);
}

/* rmsnorm: the scale 1/rms is an f32 reduction (relative differences ~1e-6); the output may be
 * rounded twice (the normalized value, then the product with the weight, as Hugging Face does):
 * 2 * 2^-8, doubled: 2^-6 |ref|. */
static void check_rmsnorm(void) {
  const char *name = "rmsnorm";
  enum { M = 7, D = 4096 };
  float *xv = NULL, *wv = NULL, *got = NULL;
  servd_tensor *xh = NULL, *wh = NULL, *rh = NULL, *xd = NULL, *wd = NULL, *od = NULL;
  const int64_t xshape[2] = {M, D}, wshape[1] = {D};
  NN(xv = dc_rand_bf16((size_t)M * D, 2.f));
  NN(wv = dc_rand_bf16(D, 1.f));
  for (int i = 0; i < D; i++) wv[i] = dc_round_bf16(1.f + 0.5f * wv[i]);
  NN(xh = dc_host_f32(xv, 2, xshape));
  NN(wh = dc_host_f32(wv, 1, wshape));
  NN(rh = dc_host_f32(NULL, 2, xshape));
  TRY(servd_rmsnorm(rh, xh, wh, 1e-5f));
  TRY(dc_dev_f32(xv, 2, xshape, SERVD_BF16, &xd));
  TRY(dc_dev_f32(wv, 1, wshape, SERVD_BF16, &wd));
  TRY(dc_dev_new(SERVD_BF16, 2, xshape, &od));
  TRY(servd_device_rmsnorm(od, xd, wd, 1e-5f));
  NN(got = malloc((size_t)M * D * sizeof *got));
  TRY(dc_download_f32(od, got));
  dc_expect_close("rmsnorm 7x4096", got, servd_tensor_data(rh), (size_t)M * D, 1e-6, ldexp(1, -6), NULL,
                  "2^-6|ref| + 1e-6");
done:
  free(xv), free(wv), free(got);
  servd_tensor_release(xh), servd_tensor_release(wh), servd_tensor_release(rh), servd_tensor_release(xd);
  servd_tensor_release(wd), servd_tensor_release(od);
}

/* rope with Llama 3.1 scaling, both layouts. Both sides compute the angle pos * inv_freq in f32 with
 * inv_freq <= 1 from a few f32 operations (pow, division, the scaling blend), each within a few ulp:
 * their angles can differ by up to ~pos * 2^-20.4, which moves a rotated value by that times the
 * pair's length (<= sqrt(2) * max|x| = sqrt(2)): the per-row allowance pos * 2^-19.9. Add one bf16
 * rounding of the output (2^-8 |ref|, allowed as 2^-7 |ref|) and 2^-9 for sin/cos themselves. Rows up
 * to position 9000 are thus checked to ~2^-6; the 32768 and 70000 rows (a line of their own) test long
 * contexts loosely (0.04, 0.08) but still catch a wrong frequency, which gives O(1) errors. */
static void check_rope(int layout) {
  const char *name = layout ? "rope half-split" : "rope interleaved";
  enum { M = 9, HEADS = 32, HD = 128, W = HEADS * HD };
  const int32_t pos[M] = {0, 1, 17, 100, 4095, 8191, 9000, 32768, 70000};
  const servd_rope_params p = {.layout = layout ? SERVD_ROPE_HALF : SERVD_ROPE_INTERLEAVED,
                               .head_dim = HD,
                               .theta = 500000.f,
                               .scaling_factor = 8.f,
                               .low_freq_factor = 1.f,
                               .high_freq_factor = 4.f,
                               .original_max_positions = 8192};
  float *xv = NULL, *got = NULL, *atol_i = NULL;
  servd_tensor *xh = NULL, *ph = NULL, *xd = NULL, *pd = NULL;
  const int64_t shape[2] = {M, W};
  NN(xv = dc_rand_bf16((size_t)M * W, 1.f));
  NN(xh = dc_host_f32(xv, 2, shape));
  NN(ph = dc_host_i32(pos, M));
  TRY(dc_dev_f32(xv, 2, shape, SERVD_BF16, &xd));
  TRY(servd_device_upload(dc_device, ph, SERVD_I32, &pd));
  TRY(servd_rope(xh, ph, &p));
  TRY(servd_device_rope(xd, pd, &p));
  NN(got = malloc((size_t)M * W * sizeof *got));
  NN(atol_i = malloc((size_t)M * W * sizeof *atol_i));
  for (int r = 0; r < M; r++)
    for (int i = 0; i < W; i++) atol_i[(size_t)r * W + i] = (float)(ldexp(1, -9) + pos[r] * exp2(-19.9));
  TRY(dc_download_f32(xd, got));
  const float *ref = servd_tensor_data(xh);
  const size_t near = (size_t)(M - 2) * W; /* rows up to position 9000; the last two rows are long contexts */
  char label[128];
  snprintf(label, sizeof label, "rope %s, llama3.1 scaling, positions 0..9000", layout ? "half-split" : "interleaved");
  dc_expect_close(label, got, ref, near, 0, ldexp(1, -7), atol_i, "2^-7|ref| + 2^-9 + pos*2^-19.9 (f32 angle)");
  snprintf(label, sizeof label, "rope %s, llama3.1 scaling, positions 32768, 70000",
           layout ? "half-split" : "interleaved");
  dc_expect_close(label, got + near, ref + near, (size_t)M * W - near, 0, ldexp(1, -7), atol_i + near,
                  "2^-7|ref| + 2^-9 + pos*2^-19.9 (f32 angle)");
done:
  free(xv), free(got), free(atol_i);
  servd_tensor_release(xh), servd_tensor_release(ph), servd_tensor_release(xd), servd_tensor_release(pd);
}

/* swiglu: silu(g) * u with f32 exp (a few ulp), output rounded to bf16 possibly after rounding
 * silu(g) too: 2 roundings, doubled: 2^-6 |ref|. add: a + b of two bf16 values is exact in f32 (or
 * rounded once, at 2^-24), then rounded to bf16 once: 2^-8, doubled: 2^-7 |ref|. Width 2003 is odd
 * so a vectorized tail shows. */
static void check_elementwise(void) {
  const char *name = "swiglu/add";
  enum { M = 5, N = 2003 };
  const int64_t shape[2] = {M, N};
  float *av = NULL, *bv = NULL, *got = NULL;
  servd_tensor *ah = NULL, *bh = NULL, *rh = NULL, *ad = NULL, *bd = NULL, *od = NULL;
  NN(av = dc_rand_bf16((size_t)M * N, 4.f));
  NN(bv = dc_rand_bf16((size_t)M * N, 4.f));
  NN(ah = dc_host_f32(av, 2, shape));
  NN(bh = dc_host_f32(bv, 2, shape));
  NN(rh = dc_host_f32(NULL, 2, shape));
  TRY(dc_dev_f32(av, 2, shape, SERVD_BF16, &ad));
  TRY(dc_dev_f32(bv, 2, shape, SERVD_BF16, &bd));
  TRY(dc_dev_new(SERVD_BF16, 2, shape, &od));
  NN(got = malloc((size_t)M * N * sizeof *got));
  TRY(servd_swiglu(rh, ah, bh));
  TRY(servd_device_swiglu(od, ad, bd));
  TRY(dc_download_f32(od, got));
  dc_expect_close("swiglu 5x2003", got, servd_tensor_data(rh), (size_t)M * N, 1e-6, ldexp(1, -6), NULL,
                  "2^-6|ref| + 1e-6");
  TRY(servd_add(rh, ah, bh));
  TRY(servd_device_add(od, ad, bd));
  TRY(dc_download_f32(od, got));
  dc_expect_close("add 5x2003", got, servd_tensor_data(rh), (size_t)M * N, 0, ldexp(1, -7), NULL, "2^-7|ref|");
  /* out aliasing an input, as a residual stream does (x = x + o) */
  TRY(servd_device_add(ad, ad, bd));
  TRY(dc_download_f32(ad, got));
  dc_expect_close("add in place (out == a)", got, servd_tensor_data(rh), (size_t)M * N, 0, ldexp(1, -7), NULL,
                  "2^-7|ref|");
done:
  free(av), free(bv), free(got);
  servd_tensor_release(ah), servd_tensor_release(bh), servd_tensor_release(rh), servd_tensor_release(ad);
  servd_tensor_release(bd), servd_tensor_release(od);
}

/* argmax and top-k over a Llama 3 vocabulary: values are distinct (a permutation), so the answers
 * are unique and must match exactly. */
static void check_select(void) {
  const char *name = "argmax/topk";
  enum { M = 3, N = 128256 };
  float *lg = NULL, *gv = NULL;
  int32_t *perm = NULL, *gi = NULL;
  servd_tensor *lh = NULL, *ah = NULL, *vh = NULL, *ih = NULL, *ld = NULL, *ad = NULL, *vd = NULL, *idd = NULL;
  const int64_t lshape[2] = {M, N}, ashape[1] = {M};
  NN(lg = malloc((size_t)M * N * sizeof *lg));
  NN(perm = malloc((size_t)N * sizeof *perm));
  for (int r = 0; r < M; r++) {
    for (int i = 0; i < N; i++) perm[i] = i;
    for (int i = N - 1; i > 0; i--) {
      int j = (int)(dc_rand_u64() % (uint64_t)(i + 1)), t = perm[i];
      perm[i] = perm[j], perm[j] = t;
    }
    for (int i = 0; i < N; i++) lg[(size_t)r * N + i] = (float)(perm[i] - N / 2) * 1e-3f;
  }
  NN(lh = dc_host_f32(lg, 2, lshape));
  NN(ah = servd_tensor_new(SERVD_I32, 1, ashape));
  TRY(servd_argmax(ah, lh));
  TRY(servd_device_upload(dc_device, lh, SERVD_F32, &ld));
  TRY(dc_dev_new(SERVD_I32, 1, ashape, &ad));
  NN(gi = malloc((size_t)M * 64 * sizeof *gi));
  NN(gv = malloc((size_t)M * 64 * sizeof *gv));
  TRY(servd_device_argmax(ad, ld));
  TRY(dc_download_i32(ad, gi));
  dc_expect_equal_i32("argmax 3x128256 f32", gi, servd_tensor_data(ah), M);
  const int ks[2] = {5, 64};
  for (int t = 0; t < 2; t++) {
    const int k = ks[t];
    const int64_t kshape[2] = {M, k};
    char label[96];
    NN(vh = dc_host_f32(NULL, 2, kshape));
    NN(ih = servd_tensor_new(SERVD_I32, 2, kshape));
    TRY(servd_topk(vh, ih, lh, k));
    TRY(dc_dev_new(SERVD_F32, 2, kshape, &vd));
    TRY(dc_dev_new(SERVD_I32, 2, kshape, &idd));
    TRY(servd_device_topk(vd, idd, ld, k));
    TRY(dc_download_f32(vd, gv));
    TRY(dc_download_i32(idd, gi));
    snprintf(label, sizeof label, "topk k=%d of 3x128256: indices", k);
    dc_expect_equal_i32(label, gi, servd_tensor_data(ih), (size_t)M * k);
    snprintf(label, sizeof label, "topk k=%d of 3x128256: values", k);
    dc_expect_close(label, gv, servd_tensor_data(vh), (size_t)M * k, 0, 0, NULL, "exact (selected, not computed)");
    servd_tensor_release(vh), servd_tensor_release(ih), servd_tensor_release(vd), servd_tensor_release(idd);
    vh = ih = vd = idd = NULL;
  }
done:
  free(lg), free(gv), free(perm), free(gi);
  servd_tensor_release(lh), servd_tensor_release(ah), servd_tensor_release(vh), servd_tensor_release(ih);
  servd_tensor_release(ld), servd_tensor_release(ad), servd_tensor_release(vd), servd_tensor_release(idd);
}

/* Bad arguments are refused with an error (never a launch on bad shapes, never a crash). */
static void check_errors(void) {
  const char *name = "bad arguments";
  servd_tensor *x = NULL, *w = NULL, *o = NULL, *h = NULL, *lv = NULL, *li = NULL, *lg = NULL;
  const int64_t xs[2] = {4, 64}, ws[2] = {16, 72}, os[2] = {4, 16}, ks[2] = {4, 65}, ls[2] = {4, 100};
  TRY(dc_dev_new(SERVD_BF16, 2, xs, &x));
  TRY(dc_dev_new(SERVD_BF16, 2, ws, &w));
  TRY(dc_dev_new(SERVD_BF16, 2, os, &o));
  TRY(dc_dev_new(SERVD_F32, 2, ks, &lv));
  TRY(dc_dev_new(SERVD_I32, 2, ks, &li));
  TRY(dc_dev_new(SERVD_F32, 2, ls, &lg));
  NN(h = servd_tensor_new(SERVD_BF16, 2, xs));
  const int r1 = servd_device_matmul(o, x, w);      /* k 64 vs 72 */
  const int r2 = servd_device_add(x, x, h);         /* a host operand */
  const int r3 = servd_device_topk(lv, li, lg, 65); /* k > 64 */
  dc_verdict(r1 < 0 && r2 < 0 && r3 < 0, "bad arguments refused",
             "matmul k mismatch %d, add with a host tensor %d, topk k=65 %d (all must be < 0)", r1, r2, r3);
done:
  servd_tensor_release(x), servd_tensor_release(w), servd_tensor_release(o), servd_tensor_release(h);
  servd_tensor_release(lv), servd_tensor_release(li), servd_tensor_release(lg);
}

/* The fused ops, first turned on by their check on this GPU (which must pass), then against the CPU:
 * add_rmsnorm's sum is the bf16 rounding of x + o on both sides (exact), its norm as check_rmsnorm
 * allows; matmul_many's outputs against the CPU matmul of each weight, with the bf16-output
 * allowance of check_matmul_shape in its simple form (outputs are O(1): weights 3/sqrt(k)). */
static void check_fused(void) {
  const char *name = "fused ops";
  enum { M = 5, D = 4096, K = 4096 };
  const int ns[3] = {4096, 1024, 1024}, rows_m[2] = {1, M};
  char report[256] = "";
  float *xv = NULL, *ov = NULL, *wv = NULL, *sumv = NULL, *got = NULL, *ref = NULL, *mw[3] = {NULL, NULL, NULL};
  servd_tensor *sh = NULL, *wh = NULL, *rh = NULL, *xd = NULL, *od = NULL, *wd = NULL, *hd = NULL;
  servd_tensor *mwh[3] = {NULL, NULL, NULL}, *mwd[3] = {NULL, NULL, NULL}, *mo[3] = {NULL, NULL, NULL};
  servd_tensor *mxh = NULL, *mxd = NULL, *mref = NULL;
  float *mx = NULL;
  TRY(servd_device_fused_check(dc_device, report, sizeof report));
  dc_verdict(strncmp(report, "on", 2) == 0, "fused kernels' own check", "%s", report);

  const int64_t xshape[2] = {M, D}, wshape[1] = {D};
  NN(xv = dc_rand_bf16((size_t)M * D, 2.f));
  NN(ov = dc_rand_bf16((size_t)M * D, 2.f));
  NN(wv = dc_rand_bf16(D, 1.f));
  for (int i = 0; i < D; i++) wv[i] = dc_round_bf16(1.f + 0.5f * wv[i]);
  NN(sumv = malloc((size_t)M * D * sizeof *sumv));
  for (size_t i = 0; i < (size_t)M * D; i++) sumv[i] = dc_round_bf16(xv[i] + ov[i]);
  NN(sh = dc_host_f32(sumv, 2, xshape));
  NN(wh = dc_host_f32(wv, 1, wshape));
  NN(rh = dc_host_f32(NULL, 2, xshape));
  TRY(servd_rmsnorm(rh, sh, wh, 1e-5f));
  TRY(dc_dev_f32(xv, 2, xshape, SERVD_BF16, &xd));
  TRY(dc_dev_f32(ov, 2, xshape, SERVD_BF16, &od));
  TRY(dc_dev_f32(wv, 1, wshape, SERVD_BF16, &wd));
  TRY(dc_dev_new(SERVD_BF16, 2, xshape, &hd));
  TRY(servd_device_add_rmsnorm(xd, od, hd, wd, 1e-5f));
  NN(got = malloc((size_t)M * D * sizeof *got));
  TRY(dc_download_f32(xd, got));
  dc_expect_close("add_rmsnorm 5x4096: x + o", got, sumv, (size_t)M * D, 0, 0, NULL, "exact (bf16 of the sum)");
  TRY(dc_download_f32(hd, got));
  dc_expect_close("add_rmsnorm 5x4096: the norm", got, servd_tensor_data(rh), (size_t)M * D, 1e-6, ldexp(1, -6), NULL,
                  "2^-6|ref| + 1e-6");

  for (int i = 0; i < 3; i++) {
    const int64_t shape[2] = {ns[i], K};
    NN(mw[i] = dc_rand_bf16((size_t)ns[i] * K, 3.f / sqrtf((float)K)));
    NN(mwh[i] = dc_host_as(SERVD_BF16, mw[i], 2, shape));
    TRY(servd_device_upload(dc_device, mwh[i], SERVD_BF16, &mwd[i]));
  }
  for (int r = 0; r < 2; r++) {
    const int m = rows_m[r];
    const int64_t mxs[2] = {m, K};
    NN(mx = dc_rand_bf16((size_t)m * K, 1.f));
    NN(mxh = dc_host_f32(mx, 2, mxs));
    TRY(servd_device_upload(dc_device, mxh, SERVD_BF16, &mxd));
    for (int i = 0; i < 3; i++) {
      const int64_t os[2] = {m, ns[i]};
      TRY(dc_dev_new(SERVD_BF16, 2, os, &mo[i]));
    }
    TRY(servd_device_matmul_many(3, mo, mxd, (const servd_tensor *const *)mwd));
    for (int i = 0; i < 3; i++) {
      const int64_t os[2] = {m, ns[i]};
      char label[96];
      snprintf(label, sizeof label, "matmul_many m=%d: weight %d (%d x %d)", m, i, ns[i], K);
      NN(mref = dc_host_f32(NULL, 2, os));
      TRY(servd_matmul(mref, mxh, mwh[i]));
      free(ref);
      NN(ref = malloc((size_t)m * ns[i] * sizeof *ref));
      TRY(dc_download_f32(mo[i], ref));
      dc_expect_close(label, ref, servd_tensor_data(mref), (size_t)m * ns[i], 1e-3, ldexp(1, -7), NULL,
                      "2^-7|ref| + 1e-3");
      servd_tensor_release(mref), servd_tensor_release(mo[i]);
      mref = mo[i] = NULL;
    }
    free(mx), servd_tensor_release(mxh), servd_tensor_release(mxd);
    mx = NULL, mxh = mxd = NULL;
  }
done:
  free(xv), free(ov), free(wv), free(sumv), free(got), free(ref), free(mx);
  servd_tensor_release(sh), servd_tensor_release(wh), servd_tensor_release(rh), servd_tensor_release(xd);
  servd_tensor_release(od), servd_tensor_release(wd), servd_tensor_release(hd), servd_tensor_release(mxh);
  servd_tensor_release(mxd), servd_tensor_release(mref);
  for (int i = 0; i < 3; i++) {
    free(mw[i]);
    servd_tensor_release(mwh[i]), servd_tensor_release(mwd[i]), servd_tensor_release(mo[i]);
  }
}

/* The GEMV variant the device chooses for a shape, then that shape again against the CPU. */
static void check_tuned_matmul(int n, int k) {
  char report[512] = "";
  int rc = servd_device_matmul_tune(dc_device, n, k, report, sizeof report);
  dc_verdict(rc == 0, "GEMV choice", "%s", rc ? servd_last_error() : report);
  if (rc == 0) check_matmul_shape(n, k);
}

/* matmul on q8_0/q4_k/q6_k weights kept as their blocks (gemv_quant.cu): the GEMV for m <= 8, a bf16
 * copy of the weight and cuBLAS above. Reference: the CPU f32 matmul on the same bf16 x and the weight
 * dequantized by servd_row_to_f32 (rounded to bf16 where the GPU multiplies a bf16 copy), so the
 * allowance is check_matmul_shape's: 2^-15 sum|x||w| (+ 2^-7 |ref| for bf16 outputs). */
static void check_quant_matmul(servd_dtype dt, int n, int k) {
  const int ms[] = {1, 4, 8, 64};
  char label[128];
  const char *name = "quantized matmul setup";
  float *wv = NULL, *wq = NULL, *xv = NULL, *got = NULL, *sum = NULL;
  servd_tensor *wh = NULL, *wd = NULL, *wf = NULL, *wa = NULL, *xh = NULL, *xa = NULL, *xd = NULL, *rh = NULL,
               *sh = NULL, *ob = NULL, *of = NULL;
  const int64_t wshape[2] = {n, k};
  NN(wv = dc_rand_bf16((size_t)n * k, 3.f / sqrtf((float)k)));
  NN(wq = malloc((size_t)n * k * sizeof *wq));
  NN(wh = servd_tensor_new(dt, 2, wshape));
  for (int j = 0; j < n; j++) {
    char *row = (char *)servd_tensor_data(wh) + (size_t)j * wh->strides[0];
    TRY(servd_row_from_f32(dt, wv + (size_t)j * k, row, k));
    TRY(servd_row_to_f32(dt, row, wq + (size_t)j * k, k));
  }
  TRY(servd_device_upload(dc_device, wh, dt, &wd));
  for (size_t t = 0; t < sizeof ms / sizeof *ms; t++) {
    const int m = ms[t];
    const int64_t xshape[2] = {m, k}, oshape[2] = {m, n};
    float *wr = malloc((size_t)n * k * sizeof *wr), *wabs = malloc((size_t)n * k * sizeof *wabs);
    NN(wr);
    NN(wabs);
    for (size_t i = 0; i < (size_t)n * k; i++) {
      wr[i] = m > 8 ? servd_bf16_to_f32(servd_f32_to_bf16(wq[i])) : wq[i];
      wabs[i] = fabsf(wr[i]);
    }
    wf = dc_host_f32(wr, 2, wshape), wa = dc_host_f32(wabs, 2, wshape);
    free(wr), free(wabs);
    NN(wf);
    NN(wa);
    NN(xv = dc_rand_bf16((size_t)m * k, 1.f));
    NN(xh = dc_host_f32(xv, 2, xshape));
    for (size_t i = 0; i < (size_t)m * k; i++) xv[i] = fabsf(xv[i]);
    NN(xa = dc_host_f32(xv, 2, xshape));
    NN(rh = dc_host_f32(NULL, 2, oshape));
    NN(sh = dc_host_f32(NULL, 2, oshape));
    name = "quantized matmul cpu reference";
    TRY(servd_matmul(rh, xh, wf));
    TRY(servd_matmul(sh, xa, wa));
    NN(sum = malloc((size_t)m * n * sizeof *sum));
    for (size_t i = 0; i < (size_t)m * n; i++) sum[i] = ldexpf(((float *)servd_tensor_data(sh))[i], -15);
    NN(got = malloc((size_t)m * n * sizeof *got));
    TRY(servd_device_upload(dc_device, xh, SERVD_BF16, &xd));
    TRY(dc_dev_new(SERVD_BF16, 2, oshape, &ob));
    TRY(dc_dev_new(SERVD_F32, 2, oshape, &of));
    snprintf(label, sizeof label, "matmul %s bf16-out m=%d n=%d k=%d", servd_dtype_name(dt), m, n, k);
    name = label;
    TRY(servd_device_matmul(ob, xd, wd));
    TRY(dc_download_f32(ob, got));
    dc_expect_close(label, got, servd_tensor_data(rh), (size_t)m * n, 0, ldexp(1, -7), sum,
                    "2^-7|ref| + 2^-15 sum|x||w|");
    snprintf(label, sizeof label, "matmul %s f32-out m=%d n=%d k=%d", servd_dtype_name(dt), m, n, k);
    TRY(servd_device_matmul(of, xd, wd));
    TRY(dc_download_f32(of, got));
    dc_expect_close(label, got, servd_tensor_data(rh), (size_t)m * n, 0, 0, sum, "2^-15 sum|x||w|");
    free(xv), free(sum), free(got);
    xv = sum = got = NULL;
    servd_tensor_release(wf), servd_tensor_release(wa), servd_tensor_release(xh), servd_tensor_release(xa);
    servd_tensor_release(xd), servd_tensor_release(rh), servd_tensor_release(sh), servd_tensor_release(ob);
    servd_tensor_release(of);
    wf = wa = xh = xa = xd = rh = sh = ob = of = NULL;
  }
done:
  free(wv), free(wq), free(xv), free(got), free(sum);
  servd_tensor_release(wh), servd_tensor_release(wd), servd_tensor_release(wf), servd_tensor_release(wa);
  servd_tensor_release(xh), servd_tensor_release(xa), servd_tensor_release(xd), servd_tensor_release(rh);
  servd_tensor_release(sh), servd_tensor_release(ob), servd_tensor_release(of);
}

void dc_check_ops(void) {
  check_matmul_shape(4096, 4096);
  check_matmul_shape(1001, 2056); /* odd n; k a multiple of 8 but not of 16 */
  check_tuned_matmul(4096, 4096);
  check_tuned_matmul(1024, 4096); /* few rows: where the split variants are meant to win */
  check_tuned_matmul(1001, 2056);
  check_quant_matmul(SERVD_Q8_0, 4096, 4096);
  check_quant_matmul(SERVD_Q4_K, 4096, 4096);
  check_quant_matmul(SERVD_Q6_K, 1001, 2048); /* odd n */
  check_quant_matmul(SERVD_Q8_0, 1001, 2080); /* k not a multiple of 256 */
  check_embedding();
  check_rmsnorm();
  check_rope(0);
  check_rope(1);
  check_elementwise();
  check_fused();
  check_select();
  check_errors();
}
