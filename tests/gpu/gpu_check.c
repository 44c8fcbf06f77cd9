/* GPU check, sized to finish in a few minutes on one H200:
 *   1. every CUDA op against the CPU op on random data (bf16 inputs, tolerances below);
 *   2. device copy bandwidth (the measured roofline anchor);
 *   3. a Llama-3.1-8B-shaped model with synthesized bf16 weights: greedy tokens of a short prompt on
 *      the GPU against the CPU path, then decode tokens/s at batch 1 and 64 (CUDA graphs), prefill
 *      tokens/s, and the fraction of the memory-bandwidth roofline.
 * Exit 0: all checks passed; 77: no GPU (skipped); 1: a check failed.
 * Usage: gpu_check [--quick] [--out results.md] */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpu_llama.h"
#include "servd/threadpool.h"

static int failures;
static FILE *report;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void line(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void line(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vprintf(fmt, ap);
  va_end(ap);
  printf("\n");
  if (report) {
    va_start(ap, fmt);
    vfprintf(report, fmt, ap);
    va_end(ap);
    fprintf(report, "\n");
  }
  fflush(stdout);
}

#define CHECK_RC(call) \
  do { \
    int rc_ = (call); \
    if (rc_) { \
      line("FAIL %s: %s (%s)", #call, servd_strerror(rc_), servd_last_error()); \
      exit(1); \
    } \
  } while (0)

static uint64_t rng = 88172645463325252ull;
static float frand(void) { /* uniform [-1, 1) */
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (float)((rng >> 40) * (1.0 / 8388608.0)) - 1.0f;
}

/* Random bf16 data, kept both as f32 (exactly the bf16 values) for the CPU and on the device. */
typedef struct buf {
  float *h;
  uint16_t *hb;
  servd_bf16_t *d;
  size_t n;
} buf;

static buf make_buf(servd_cuda_ctx *c, size_t n, float scale) {
  buf b = {malloc(n * 4), malloc(n * 2), servd_cuda_alloc(c, n * 2), n};
  if (!b.h || !b.hb || !b.d) {
    line("FAIL: out of memory for %zu elements", n);
    exit(1);
  }
  for (size_t i = 0; i < n; i++) {
    b.hb[i] = servd_f32_to_bf16(frand() * scale);
    b.h[i] = servd_bf16_to_f32(b.hb[i]);
  }
  CHECK_RC(servd_cuda_upload(c, b.d, b.hb, n * 2));
  return b;
}

static void free_buf(servd_cuda_ctx *c, buf *b) {
  free(b->h);
  free(b->hb);
  servd_cuda_free(c, b->d);
}

static servd_tensor *host_f32(const float *src, int ndim, int64_t d0, int64_t d1) {
  int64_t shape[2] = {d0, d1};
  servd_tensor *t = servd_tensor_new(SERVD_F32, ndim, shape);
  if (t && src) memcpy(servd_tensor_data(t), src, servd_tensor_nbytes(t));
  return t;
}

static servd_tensor *host_i32(const int32_t *src, int64_t n) {
  servd_tensor *t = servd_tensor_new(SERVD_I32, 1, &n);
  if (t) memcpy(servd_tensor_data(t), src, n * 4);
  return t;
}

/* Compares device bf16 output with the CPU f32 reference: |gpu - cpu| <= atol + rtol*|cpu|. */
static void compare(servd_cuda_ctx *c, const char *name, const servd_bf16_t *d, const float *ref, size_t n, float atol,
                    float rtol) {
  uint16_t *hb = malloc(n * 2);
  CHECK_RC(servd_cuda_download(c, hb, d, n * 2));
  double max_err = 0, max_ref = 0;
  size_t bad = 0;
  for (size_t i = 0; i < n; i++) {
    const float g = servd_bf16_to_f32(hb[i]), r = ref[i];
    const double e = fabs((double)g - r);
    if (e > max_err) max_err = e;
    if (fabs(r) > max_ref) max_ref = fabs(r);
    if (!(e <= atol + rtol * fabs(r))) bad++;
  }
  free(hb);
  line("| %s | %zu | %.3g | %.3g | %s |", name, n, max_err, max_ref, bad ? "FAIL" : "ok");
  if (bad) failures++;
}

static void check_ops(servd_cuda_ctx *c) {
  line("## Ops against the CPU reference\n");
  line("| op | elements | max abs error | max abs reference | result |");
  line("|---|---|---|---|---|");
  /* Tolerances: inputs are exact bf16 values on both sides; the GPU rounds its output to bf16
   * (relative 2^-8 = 0.0039) and accumulates in another order in f32, so rtol 0.008 plus a small
   * atol for outputs near zero where cancellation dominates. */
  const float rtol = 0.008f;
  /* matmul */
  const int ms[] = {1, 3, 8, 9, 64};
  for (size_t t = 0; t < sizeof ms / sizeof *ms; t++) {
    const int m = ms[t], n = 1000, k = 4096;
    buf x = make_buf(c, (size_t)m * k, 1.f), w = make_buf(c, (size_t)n * k, 0.05f);
    servd_tensor *xt = host_f32(x.h, 2, m, k), *out = host_f32(NULL, 2, m, n);
    int64_t wshape[2] = {n, k};
    servd_tensor *wt = servd_tensor_new(SERVD_BF16, 2, wshape);
    memcpy(servd_tensor_data(wt), w.hb, (size_t)n * k * 2);
    CHECK_RC(servd_matmul(out, xt, wt));
    servd_bf16_t *d = servd_cuda_alloc(c, (size_t)m * n * 2);
    CHECK_RC(servd_cuda_matmul(c, d, x.d, w.d, m, n, k));
    char name[64];
    snprintf(name, sizeof name, "matmul m=%d n=%d k=%d", m, n, k);
    /* dot products of 4096 terms of size ~0.05: absolute error floor from f32 reordering */
    compare(c, name, d, servd_tensor_data(out), (size_t)m * n, 0.02f, rtol);
    servd_cuda_free(c, d);
    servd_tensor_release(xt);
    servd_tensor_release(out);
    servd_tensor_release(wt);
    free_buf(c, &x);
    free_buf(c, &w);
  }
  { /* rmsnorm */
    const int m = 7, d = 4096;
    buf x = make_buf(c, (size_t)m * d, 2.f), w = make_buf(c, d, 1.f);
    servd_tensor *xt = host_f32(x.h, 2, m, d), *wt = host_f32(w.h, 1, d, 0), *out = host_f32(NULL, 2, m, d);
    CHECK_RC(servd_rmsnorm(out, xt, wt, 1e-5f));
    servd_bf16_t *o = servd_cuda_alloc(c, (size_t)m * d * 2);
    CHECK_RC(servd_cuda_rmsnorm(c, o, x.d, w.d, m, d, 1e-5f));
    compare(c, "rmsnorm 7x4096", o, servd_tensor_data(out), (size_t)m * d, 1e-3f, rtol);
    servd_cuda_free(c, o);
    servd_tensor_release(xt);
    servd_tensor_release(wt);
    servd_tensor_release(out);
    free_buf(c, &x);
    free_buf(c, &w);
  }
  for (int layout = 0; layout < 2; layout++) { /* rope, Llama 3.1 scaling */
    const int m = 5, heads = 32, hd = 128;
    servd_rope_params p = {.layout = layout ? SERVD_ROPE_HALF : SERVD_ROPE_INTERLEAVED,
                           .head_dim = hd,
                           .theta = 500000.f,
                           .scaling_factor = 8.f,
                           .low_freq_factor = 1.f,
                           .high_freq_factor = 4.f,
                           .original_max_positions = 8192};
    const int32_t pos[5] = {0, 1, 17, 4095, 70000};
    buf x = make_buf(c, (size_t)m * heads * hd, 1.f);
    servd_tensor *xt = host_f32(x.h, 2, m, (int64_t)heads * hd), *pt = host_i32(pos, m);
    CHECK_RC(servd_rope(xt, pt, &p));
    int32_t *dpos = servd_cuda_alloc(c, sizeof pos);
    CHECK_RC(servd_cuda_upload(c, dpos, pos, sizeof pos));
    CHECK_RC(servd_cuda_rope(c, x.d, dpos, m, heads, &p));
    /* angles up to 70000 rad in f32: both sides use f32 angles; sin/cos of large angles differ
     * by a few ulp of the angle (70000 * 2^-24 ~ 0.004) */
    compare(c, layout ? "rope half-split, llama3 scaling" : "rope interleaved, llama3 scaling", x.d,
            servd_tensor_data(xt), x.n, 0.01f, rtol);
    servd_cuda_free(c, dpos);
    servd_tensor_release(xt);
    servd_tensor_release(pt);
    free_buf(c, &x);
  }
  { /* swiglu, add */
    const int n = 10007;
    buf a = make_buf(c, n, 4.f), b = make_buf(c, n, 4.f);
    servd_tensor *at = host_f32(a.h, 1, n, 0), *bt = host_f32(b.h, 1, n, 0), *out = host_f32(NULL, 1, n, 0);
    servd_bf16_t *o = servd_cuda_alloc(c, n * 2);
    CHECK_RC(servd_swiglu(out, at, bt));
    CHECK_RC(servd_cuda_swiglu(c, o, a.d, b.d, n));
    compare(c, "swiglu 10007", o, servd_tensor_data(out), n, 1e-3f, rtol);
    CHECK_RC(servd_add(out, at, bt));
    CHECK_RC(servd_cuda_add(c, o, a.d, b.d, n));
    compare(c, "add 10007", o, servd_tensor_data(out), n, 1e-3f, rtol);
    servd_cuda_free(c, o);
    servd_tensor_release(at);
    servd_tensor_release(bt);
    servd_tensor_release(out);
    free_buf(c, &a);
    free_buf(c, &b);
  }
  { /* embedding */
    const int vocab = 1000, d = 4096, m = 5;
    const int32_t ids[5] = {0, 999, 5, 5, 123};
    buf tb = make_buf(c, (size_t)vocab * d, 1.f);
    int64_t shape[2] = {vocab, d};
    servd_tensor *tt = servd_tensor_new(SERVD_BF16, 2, shape), *it = host_i32(ids, m), *out = host_f32(NULL, 2, m, d);
    memcpy(servd_tensor_data(tt), tb.hb, (size_t)vocab * d * 2);
    CHECK_RC(servd_embedding(out, tt, it, 0));
    int32_t *dids = servd_cuda_alloc(c, sizeof ids);
    servd_bf16_t *o = servd_cuda_alloc(c, (size_t)m * d * 2);
    CHECK_RC(servd_cuda_upload(c, dids, ids, sizeof ids));
    CHECK_RC(servd_cuda_embedding(c, o, tb.d, dids, m, d, vocab));
    compare(c, "embedding 5 of 1000x4096", o, servd_tensor_data(out), (size_t)m * d, 0.f, 0.f);
    servd_cuda_free(c, dids);
    servd_cuda_free(c, o);
    servd_tensor_release(tt);
    servd_tensor_release(it);
    servd_tensor_release(out);
    free_buf(c, &tb);
  }
  for (int decode_only = 0; decode_only < 2; decode_only++) { /* attention over the paged cache */
    const int heads = 32, kvh = 8, hd = 128, bs = 16, nseq = 3, max_blocks = 64, kvd = kvh * hd;
    const int n_blocks = nseq * max_blocks;
    int32_t q_len[3] = {40, 17, 1}, kv_len[3] = {40, 300, 700};
    if (decode_only) q_len[0] = q_len[1] = 1;
    int32_t q_start[3], tables[3 * 64];
    int T = 0;
    for (int s = 0; s < nseq; s++) {
      q_start[s] = T;
      T += q_len[s];
      for (int b = 0; b < max_blocks; b++) tables[s * max_blocks + b] = (b * 7 + s * 64 + 13) % n_blocks;
    }
    /* Fill every cached position of every sequence with random K/V through kv_write on both sides. */
    servd_kv_cache *kv = NULL;
    CHECK_RC(servd_kv_cache_create(&kv, 1, kvh, hd, bs, n_blocks, SERVD_F32));
    servd_bf16_t *kc = servd_cuda_alloc(c, (size_t)n_blocks * bs * kvd * 2),
                 *vc = servd_cuda_alloc(c, (size_t)n_blocks * bs * kvd * 2);
    for (int s = 0; s < nseq; s++) {
      const int L = kv_len[s];
      buf k = make_buf(c, (size_t)L * kvd, 1.f), v = make_buf(c, (size_t)L * kvd, 1.f);
      int32_t *slots = malloc(L * 4);
      for (int p = 0; p < L; p++) slots[p] = tables[s * max_blocks + p / bs] * bs + p % bs;
      servd_tensor *kt = host_f32(k.h, 2, L, kvd), *vt = host_f32(v.h, 2, L, kvd), *st = host_i32(slots, L);
      CHECK_RC(servd_kv_write(kv, 0, kt, vt, st));
      int32_t *ds = servd_cuda_alloc(c, L * 4);
      CHECK_RC(servd_cuda_upload(c, ds, slots, L * 4));
      CHECK_RC(servd_cuda_kv_write(c, kc, vc, k.d, v.d, ds, L, kvd, (int64_t)n_blocks * bs));
      CHECK_RC(servd_cuda_sync(c));
      servd_cuda_free(c, ds);
      servd_tensor_release(kt);
      servd_tensor_release(vt);
      servd_tensor_release(st);
      free(slots);
      free_buf(c, &k);
      free_buf(c, &v);
    }
    buf q = make_buf(c, (size_t)T * heads * hd, 1.f);
    servd_tensor *qt = host_f32(q.h, 2, T, (int64_t)heads * hd), *out = host_f32(NULL, 2, T, (int64_t)heads * hd);
    const int32_t *tab[3] = {tables, tables + max_blocks, tables + 2 * max_blocks};
    const servd_attn_batch ab = {nseq, q_start, q_len, kv_len, tab};
    const float scale = 1.f / sqrtf(hd);
    CHECK_RC(servd_attention(out, qt, kv, 0, &ab, heads, scale));
    int32_t *d_arrays = servd_cuda_alloc(c, (3 * 3 + 3 * 64) * 4);
    CHECK_RC(servd_cuda_upload(c, d_arrays, q_start, 12));
    CHECK_RC(servd_cuda_upload(c, d_arrays + 3, q_len, 12));
    CHECK_RC(servd_cuda_upload(c, d_arrays + 6, kv_len, 12));
    CHECK_RC(servd_cuda_upload(c, d_arrays + 9, tables, sizeof tables));
    const servd_cuda_attn_batch cb = {nseq,         max_blocks, d_arrays, d_arrays + 3, d_arrays + 6,
                                      d_arrays + 9, q_start,    q_len,    kv_len};
    servd_bf16_t *o = servd_cuda_alloc(c, q.n * 2);
    CHECK_RC(servd_cuda_attention(c, o, q.d, kc, vc, &cb, heads, kvh, hd, bs, scale));
    compare(c, decode_only ? "attention decode (split-K), GQA 32/8" : "attention prefill+chunk+decode, GQA 32/8", o,
            servd_tensor_data(out), q.n, 2e-3f, rtol);
    servd_cuda_free(c, o);
    servd_cuda_free(c, d_arrays);
    servd_cuda_free(c, kc);
    servd_cuda_free(c, vc);
    servd_tensor_release(qt);
    servd_tensor_release(out);
    servd_kv_cache_destroy(kv);
    free_buf(c, &q);
  }
  { /* argmax, top-k, sampling */
    const int m = 3, n = 128256, k = 10;
    float *lg = malloc((size_t)m * n * 4);
    for (size_t i = 0; i < (size_t)m * n; i++) lg[i] = frand() * 10.f;
    servd_tensor *lt = host_f32(lg, 2, m, n), *am = servd_tensor_new(SERVD_I32, 1, (int64_t[]){m}),
                 *tv = host_f32(NULL, 2, m, k), *ti = servd_tensor_new(SERVD_I32, 2, (int64_t[]){m, k});
    CHECK_RC(servd_argmax(am, lt));
    CHECK_RC(servd_topk(tv, ti, lt, k));
    float *dl = servd_cuda_alloc(c, (size_t)m * n * 4), *dv = servd_cuda_alloc(c, (size_t)m * k * 4);
    int32_t *da = servd_cuda_alloc(c, m * 4), *di = servd_cuda_alloc(c, (size_t)m * k * 4);
    uint64_t seeds[3] = {1, 2, 3};
    uint64_t *dseeds = servd_cuda_alloc(c, sizeof seeds);
    CHECK_RC(servd_cuda_upload(c, dl, lg, (size_t)m * n * 4));
    CHECK_RC(servd_cuda_upload(c, dseeds, seeds, sizeof seeds));
    CHECK_RC(servd_cuda_argmax(c, da, dl, m, n));
    CHECK_RC(servd_cuda_topk(c, dv, di, dl, m, n, k));
    int32_t ga[3], gi[30], gs[3];
    CHECK_RC(servd_cuda_download(c, ga, da, sizeof ga));
    CHECK_RC(servd_cuda_download(c, gi, di, sizeof gi));
    CHECK_RC(servd_cuda_sample(c, da, dl, m, n, 1e-6f, dseeds, 0));
    CHECK_RC(servd_cuda_download(c, gs, da, sizeof gs));
    int ok = !memcmp(ga, servd_tensor_data(am), sizeof ga) && !memcmp(gi, servd_tensor_data(ti), sizeof gi) &&
             !memcmp(gs, ga, sizeof gs);
    line("| argmax, top-10, sample(T->0) over 128256 | %d | %s | | %s |", m * n, ok ? "exact" : "differs",
         ok ? "ok" : "FAIL");
    failures += !ok;
    servd_cuda_free(c, dl);
    servd_cuda_free(c, dv);
    servd_cuda_free(c, da);
    servd_cuda_free(c, di);
    servd_cuda_free(c, dseeds);
    servd_tensor_release(lt);
    servd_tensor_release(am);
    servd_tensor_release(tv);
    servd_tensor_release(ti);
    free(lg);
  }
  { /* sampling distribution: 4 classes with p = .1 .2 .3 .4, 40000 rows with distinct seeds */
    const int m = 40000, n = 4;
    float *lg = malloc((size_t)m * n * 4);
    uint64_t *seeds = malloc((size_t)m * 8);
    for (int i = 0; i < m; i++) {
      for (int j = 0; j < n; j++) lg[i * n + j] = logf(0.1f * (j + 1));
      seeds[i] = 0x1234 + (uint64_t)i * 7919;
    }
    float *dl = servd_cuda_alloc(c, (size_t)m * n * 4);
    uint64_t *ds = servd_cuda_alloc(c, (size_t)m * 8);
    int32_t *dout = servd_cuda_alloc(c, (size_t)m * 4), *hout = malloc((size_t)m * 4);
    CHECK_RC(servd_cuda_upload(c, dl, lg, (size_t)m * n * 4));
    CHECK_RC(servd_cuda_upload(c, ds, seeds, (size_t)m * 8));
    CHECK_RC(servd_cuda_sample(c, dout, dl, m, n, 1.f, ds, 7));
    CHECK_RC(servd_cuda_download(c, hout, dout, (size_t)m * 4));
    double count[4] = {0}, chi2 = 0;
    for (int i = 0; i < m; i++) count[hout[i] & 3]++;
    for (int j = 0; j < n; j++) {
      const double e = m * 0.1 * (j + 1);
      chi2 += (count[j] - e) * (count[j] - e) / e;
    }
    /* 3 degrees of freedom: P(chi2 > 16.27) = 0.001 */
    line("| sample T=1, p=(.1,.2,.3,.4), 40000 draws | %d | chi2 %.2f | | %s |", m, chi2, chi2 < 16.27 ? "ok" : "FAIL");
    failures += chi2 >= 16.27;
    servd_cuda_free(c, dl);
    servd_cuda_free(c, ds);
    servd_cuda_free(c, dout);
    free(lg);
    free(seeds);
    free(hout);
  }
}

static double copy_bandwidth(servd_cuda_ctx *c) {
  const size_t bytes = (size_t)4 << 30;
  void *a = servd_cuda_alloc(c, bytes), *b = servd_cuda_alloc(c, bytes);
  if (!a || !b) return 0;
  CHECK_RC(servd_cuda_copy(c, b, a, bytes));
  CHECK_RC(servd_cuda_sync(c));
  double best = 1e9;
  for (int i = 0; i < 10; i++) {
    double t0 = now_s();
    CHECK_RC(servd_cuda_copy(c, b, a, bytes));
    CHECK_RC(servd_cuda_sync(c));
    double t = now_s() - t0;
    if (t < best) best = t;
  }
  servd_cuda_free(c, a);
  servd_cuda_free(c, b);
  return 2.0 * bytes / best; /* bytes read + written per second */
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* n greedy tokens after a prompt of p tokens, one sequence (eager steps). */
static int gpu_greedy(gpu_llama *g, const int32_t *prompt, int p, int32_t *out, int n) {
  int32_t ql = p, kl = p, next;
  int rc = gpu_llama_step(g, 1, prompt, &ql, &kl, &next);
  if (rc) return rc;
  out[0] = next;
  for (int i = 1; i < n; i++) {
    ql = 1;
    kl = p + i;
    if ((rc = gpu_llama_step(g, 1, &out[i - 1], &ql, &kl, &next))) return rc;
    out[i] = next;
  }
  return 0;
}

/* Decode tokens/s with CUDA graphs at batch 1 and 64 (tps[0], tps[1]), context growing from 128. */
static int decode_speed(gpu_llama *g, const llama_shape *sh, double wbytes, double copy_bw, const char *what,
                        double tps[2]) {
  const int batches[2] = {1, 64};
  for (int bi = 0; bi < 2; bi++) {
    const int B = batches[bi];
    int32_t tokens[64], ql[64], kl[64], next[64];
    for (int i = 0; i < B; i++) {
      ql[i] = 128;
      kl[i] = 128;
    }
    int32_t *prompts = malloc(sizeof(int32_t) * 128 * B);
    if (!prompts) return servd_fail(SERVD_ENOMEM, "decode_speed: prompts");
    for (int i = 0; i < 128 * B; i++) prompts[i] = (i * 7919) % sh->vocab;
    for (int i = 0; i < B; i += 8) { /* prefill 8 sequences at a time */
      int nb = B - i < 8 ? B - i : 8;
      int rc = gpu_llama_step(g, nb, prompts + 128 * i, ql, kl, next); /* rows of seqs 0..nb-1 */
      if (rc) {
        free(prompts);
        return rc;
      }
    }
    free(prompts);
    for (int i = 0; i < B; i++) tokens[i] = next[i % 8];
    const int steps = 64;
    double times[64];
    for (int st = 0; st < steps; st++) {
      for (int i = 0; i < B; i++) kl[i] = 129 + st;
      double t0 = now_s();
      int rc = gpu_llama_decode_graph(g, B, tokens, kl, next);
      if (rc) return rc;
      times[st] = now_s() - t0;
      for (int i = 0; i < B; i++) tokens[i] = next[i];
    }
    qsort(times + 2, steps - 2, sizeof(double), cmp_double);
    const double med = times[2 + (steps - 2) / 2];
    tps[bi] = B / med;
    const double frac_copy = wbytes / med / copy_bw, frac_sheet = wbytes / med / 4.8e12;
    line("Decode batch %d (%s): %.1f tokens/s (median step %.3f ms); weights streamed at %.2f TB/s = %.0f%% of the "
         "measured copy rate, %.0f%% of 4.8 TB/s",
         B, what, tps[bi], med * 1e3, wbytes / med / 1e12, 100 * frac_copy, 100 * frac_sheet);
  }
  return 0;
}

int main(int argc, char **argv) {
  int quick = 0;
  const char *out_path = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--quick")) quick = 1;
    else if (!strcmp(argv[i], "--out") && i + 1 < argc) out_path = argv[++i];
    else {
      fprintf(stderr, "usage: gpu_check [--quick] [--out results.md]\n");
      return 2;
    }
  }
  int n_dev = 0;
  if (servd_cuda_device_count(&n_dev) || n_dev == 0) {
    printf("SKIP: no CUDA device visible (%s); the GPU check needs one\n",
           n_dev == 0 ? "device count 0" : servd_last_error());
    return 77;
  }
  if (out_path && !(report = fopen(out_path, "w"))) {
    fprintf(stderr, "gpu_check: cannot write %s\n", out_path);
    return 2;
  }
  servd_threadpool_init(0);
  char desc[256];
  CHECK_RC(servd_cuda_device_describe(0, desc, sizeof desc));
  time_t now = time(NULL);
  char date[32];
  strftime(date, sizeof date, "%Y-%m-%d", gmtime(&now));
  line("# GPU check, %s, %s, CPU reference on %d threads\n", date, desc, servd_threadpool_size());
  servd_cuda_ctx *c = NULL;
  CHECK_RC(servd_cuda_ctx_create(0, &c));
  check_ops(c);

  const double copy_bw = copy_bandwidth(c);
  line("\n## Llama-3.1-8B-shaped model, synthesized bf16 weights\n");
  line("Device copy (read + write): %.2f TB/s (datasheet 4.8 TB/s)\n", copy_bw / 1e12);

  const servd_rope_params rope = {.layout = SERVD_ROPE_HALF,
                                  .head_dim = 128,
                                  .theta = 500000.f,
                                  .scaling_factor = 8.f,
                                  .low_freq_factor = 1.f,
                                  .high_freq_factor = 4.f,
                                  .original_max_positions = 8192}; /* Llama 3.1's */
  llama_shape s = {128256, 4096, 14336, 32, 32, 8, 128, 1e-5f, rope};
  if (quick) s.layers = 2;
  const int max_seqs = 64, max_ctx = 1024, max_tokens = 2048;
  gpu_llama *g = NULL;
  CHECK_RC(gpu_llama_create(c, &s, max_seqs, max_ctx, max_tokens, 42, &g));
  const double wbytes = gpu_llama_weight_bytes(g);
  line("Weights read per decode step: %.2f GB (%d layers)\n", wbytes / 1e9, s.layers);

  /* Greedy tokens: GPU vs CPU for a short prompt. */
  enum { PROMPT = 6, NEW = 6 };
  int32_t prompt[PROMPT] = {128000, 791, 6864, 315, 9822, 374};
  int32_t gtok[NEW], ctok[NEW];
  float margins[NEW];
  {
    CHECK_RC(gpu_greedy(g, prompt, PROMPT, gtok, NEW));
    cpu_llama *cm = NULL;
    double t0 = now_s();
    CHECK_RC(cpu_llama_create(c, g, max_ctx, &cm));
    CHECK_RC(cpu_llama_step(cm, prompt, PROMPT, 0, &ctok[0], &margins[0]));
    for (int i = 1; i < NEW; i++) CHECK_RC(cpu_llama_step(cm, &ctok[i - 1], 1, PROMPT + i - 1, &ctok[i], &margins[i]));
    cpu_llama_destroy(cm);
    int same = 0;
    while (same < NEW && gtok[same] == ctok[same]) same++;
    line("Greedy tokens, GPU vs CPU (%.0f s on the CPU): %d of %d identical", now_s() - t0, same, NEW);
    for (int i = 0; i < NEW; i++)
      line("- step %d: GPU %d, CPU %d, CPU top-2 logit margin %.4f", i, gtok[i], ctok[i], margins[i]);
    /* A difference counts as a failure unless the CPU's top two logits were within bf16 noise. */
    if (same < NEW && margins[same] > 0.05f) failures++;
  }

  /* Decode speed with CUDA graphs at batch 1 and 64: first with the warp-per-column GEMV everywhere,
   * then after servd_cuda_gemv_tune chose each weight shape's kernel (what servd does at startup). */
  double tps[2] = {0}, tps_default[2] = {0};
  CHECK_RC(decode_speed(g, &s, wbytes, copy_bw, "warp GEMV", tps_default));
  {
    const int shapes[][2] = {{s.heads * s.head_dim, s.hidden},
                             {s.kv_heads * s.head_dim, s.hidden},
                             {s.hidden, s.heads * s.head_dim},
                             {s.inter, s.hidden},
                             {s.hidden, s.inter},
                             {s.vocab, s.hidden}};
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
      char rep[512];
      CHECK_RC(servd_cuda_gemv_tune(c, shapes[i][0], shapes[i][1], rep, sizeof rep));
      line("- GEMV %s", rep);
    }
  }
  gpu_llama_drop_graphs(g);
  CHECK_RC(decode_speed(g, &s, wbytes, copy_bw, "tuned GEMV", tps));
  line("Batch 1 decode, tuned GEMV / warp GEMV: %.2fx", tps[0] / tps_default[0]);
  { /* the fused kernels: the residual add with the next norm, Q/K/V and gate/up in one launch each */
    char rep[256];
    double tps_tuned[2] = {tps[0], tps[1]};
    CHECK_RC(servd_cuda_fused_check(c, rep, sizeof rep));
    line("- fused kernels: %s", rep);
    if (strncmp(rep, "on", 2) != 0) failures++;
    gpu_llama_drop_graphs(g);
    CHECK_RC(decode_speed(g, &s, wbytes, copy_bw, "tuned GEMV, fused kernels", tps));
    line("Batch 1 decode, fused / unfused (both tuned): %.2fx", tps[0] / tps_tuned[0]);
    /* The same greedy tokens with the tuned and fused kernels as with the first ones (sums in
     * another order may swap only a near tie: the CPU margin rule above). */
    int32_t ftok[NEW];
    CHECK_RC(gpu_greedy(g, prompt, PROMPT, ftok, NEW));
    int fsame = 0;
    while (fsame < NEW && ftok[fsame] == gtok[fsame]) fsame++;
    line("Greedy tokens, tuned and fused kernels vs the first run: %d of %d identical", fsame, NEW);
    if (fsame < NEW && margins[fsame] > 0.05f) failures++;
  }
  line("Batch 64 / batch 1 decode tokens/s: %.1fx (target 10x)", tps[1] / tps[0]);
  { /* prefill: 4 sequences of 512 tokens in one step */
    int32_t *toks = malloc(sizeof(int32_t) * 2048), ql[4] = {512, 512, 512, 512}, kl[4] = {512, 512, 512, 512};
    for (int i = 0; i < 2048; i++) toks[i] = (i * 31337) % s.vocab;
    CHECK_RC(gpu_llama_step(g, 4, toks, ql, kl, NULL));
    double best = 1e9;
    for (int r = 0; r < 5; r++) {
      double t0 = now_s();
      CHECK_RC(gpu_llama_step(g, 4, toks, ql, kl, NULL));
      double t = now_s() - t0;
      if (t < best) best = t;
    }
    free(toks);
    const double flops = 2.0 * 2048 * (wbytes / 2);
    line("Prefill 4 x 512 tokens: %.0f tokens/s (%.0f TFLOP/s in the matmuls' terms)", 2048 / best,
         flops / best / 1e12);
  }
  gpu_llama_destroy(g);
  servd_cuda_ctx_destroy(c);
  line("\nResult: %s (%d failed checks)", failures ? "FAIL" : "PASS", failures);
  if (report) fclose(report);
  return failures ? 1 : 0;
}
