/* Paged attention against a naive reference written here: K/V of each sequence kept contiguously in
 * double, plain causal softmax. Covers prefill, chunked prefill, decode batches with scrambled block
 * tables, mixed batches, GQA ratios 1/2/3 and above 16, odd head dims, f16, bf16, q8_0 and q4_0
 * caches (the reference reads the values the reference quantizer gives back), long single sequences
 * split over positions, every ISA; and batch invariance: a row comes out bit for bit the same alone,
 * in a batch, in a chunk of any length. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "servd/ops.h"

static uint32_t rng = 2024;
static uint32_t urand(void) {
  rng ^= rng << 13;
  rng ^= rng >> 17;
  rng ^= rng << 5;
  return rng;
}
static float frand(float lo, float hi) { return lo + (hi - lo) * (float)(urand() >> 8) / (float)(1u << 24); }

static float *f(const servd_tensor *t) { return servd_tensor_data(t); }

static servd_tensor *tnew(servd_dtype t, int ndim, int64_t a, int64_t b) {
  int64_t shape[2] = {a, b};
  servd_tensor *x = servd_tensor_new(t, ndim, shape);
  assert_non_null(x);
  return x;
}

/* One attention problem: the cache, each sequence's contiguous K/V (as stored), tables and q. */
typedef struct problem {
  int n_kv, hd, n_heads, bs, n_seqs;
  servd_dtype dt;
  servd_kv_cache *c;
  int32_t q_start[8], q_len[8], kv_len[8];
  int32_t *tables[8];
  float *k[8], *v[8]; /* [kv_len][n_kv*hd], rounded as the cache stores them */
  servd_tensor *q, *out;
  int t;
  int window; /* sliding window of the run (0: none) */
} problem;

/* Rounds one token's head vector x (hd values) to what the cache stores: f16, bf16, or the blocks of
 * 32 of q8_0 / q4_0 through core's reference quantizer. */
static void stored(const problem *p, float *x) {
  if (p->dt == SERVD_F32) return;
  if (p->dt == SERVD_F16 || p->dt == SERVD_BF16) {
    for (int e = 0; e < p->hd; e++)
      x[e] = p->dt == SERVD_F16 ? servd_f16_to_f32(servd_f32_to_f16(x[e])) : servd_bf16_to_f32(servd_f32_to_bf16(x[e]));
    return;
  }
  char blocks[34 * 16];
  assert_true(p->hd % 32 == 0 && p->hd <= 512);
  assert_int_equal(servd_row_from_f32(p->dt, x, blocks, p->hd), 0);
  assert_int_equal(servd_row_to_f32(p->dt, blocks, x, p->hd), 0);
}

/* Writes positions [from, to) of sequence s into layer 1 (layer 0 gets other data). */
static void write_range(problem *p, int s, int from, int to) {
  int w = p->n_kv * p->hd, n = to - from;
  if (n <= 0) return;
  servd_tensor *k = tnew(SERVD_F32, 2, n, w), *v = tnew(SERVD_F32, 2, n, w), *sl = tnew(SERVD_I32, 1, n, 0);
  for (int i = 0; i < n; i++) {
    int pos = from + i;
    for (int j = 0; j < w; j++) {
      f(k)[i * w + j] = p->k[s][pos * w + j];
      f(v)[i * w + j] = p->v[s][pos * w + j];
    }
    ((int32_t *)servd_tensor_data(sl))[i] = p->tables[s][pos / p->bs] * p->bs + pos % p->bs;
  }
  assert_int_equal(servd_kv_write(p->c, 1, k, v, sl), 0);
  for (int j = 0; j < n * w; j++) f(k)[j] = f(v)[j] = 50.0f; /* a poison other layer */
  assert_int_equal(servd_kv_write(p->c, 0, k, v, sl), 0);
  servd_tensor_release(k);
  servd_tensor_release(v);
  servd_tensor_release(sl);
}

/* Sets up sequences with the given q_len/kv_len; blocks are handed out in a shuffled order and query
 * rows are laid out in reverse sequence order, so nothing depends on ids or rows being sequential. */
static void setup(problem *p, int n_kv, int hd, int n_heads, int bs, servd_dtype dt, int n_seqs, const int *q_len,
                  const int *kv_len, bool write) {
  memset(p, 0, sizeof *p);
  p->n_kv = n_kv, p->hd = hd, p->n_heads = n_heads, p->bs = bs, p->dt = dt, p->n_seqs = n_seqs;
  int need = 0;
  for (int s = 0; s < n_seqs; s++) need += (kv_len[s] + bs - 1) / bs;
  int nb = need + 5;
  assert_int_equal(servd_kv_cache_create(&p->c, 2, n_kv, hd, bs, nb, dt), 0);
  int32_t *ids = test_malloc((size_t)nb * sizeof(int32_t));
  assert_int_equal(servd_kv_cache_alloc(p->c, nb, ids), 0);
  for (int i = nb - 1; i > 0; i--) {
    int j = (int)(urand() % (uint32_t)(i + 1));
    int32_t x = ids[i];
    ids[i] = ids[j];
    ids[j] = x;
  }
  int next = 0, w = n_kv * hd;
  p->t = 0;
  for (int s = n_seqs - 1; s >= 0; s--) {
    p->q_start[s] = p->t;
    p->t += q_len[s];
  }
  for (int s = 0; s < n_seqs; s++) {
    p->q_len[s] = q_len[s];
    p->kv_len[s] = kv_len[s];
    int nbs = (kv_len[s] + bs - 1) / bs;
    p->tables[s] = test_malloc((size_t)(nbs + 1) * sizeof(int32_t));
    for (int i = 0; i < nbs; i++) p->tables[s][i] = ids[next++];
    p->k[s] = test_malloc((size_t)(kv_len[s] * w + 1) * sizeof(float));
    p->v[s] = test_malloc((size_t)(kv_len[s] * w + 1) * sizeof(float));
    for (int i = 0; i < kv_len[s] * w; i++) {
      p->k[s][i] = frand(-1, 1);
      p->v[s][i] = frand(-1, 1);
    }
    for (int i = 0; i < kv_len[s] * n_kv; i++) {
      stored(p, p->k[s] + (size_t)i * hd);
      stored(p, p->v[s] + (size_t)i * hd);
    }
    if (write) write_range(p, s, 0, kv_len[s]);
  }
  test_free(ids);
  p->q = tnew(SERVD_F32, 2, p->t, (int64_t)n_heads * hd);
  p->out = tnew(SERVD_F32, 2, p->t, (int64_t)n_heads * hd);
  for (int64_t i = 0; i < (int64_t)p->t * n_heads * hd; i++) f(p->q)[i] = frand(-2, 2);
}

static void teardown_problem(problem *p) {
  for (int s = 0; s < p->n_seqs; s++) {
    test_free(p->tables[s]);
    test_free(p->k[s]);
    test_free(p->v[s]);
  }
  servd_tensor_release(p->q);
  servd_tensor_release(p->out);
  servd_kv_cache_destroy(p->c);
}

static int run(problem *p, float scale) {
  const int32_t *tables[8];
  for (int s = 0; s < p->n_seqs; s++) tables[s] = p->tables[s];
  servd_attn_batch b = {p->n_seqs, p->q_start, p->q_len, p->kv_len, tables};
  for (int64_t i = 0; i < (int64_t)p->t * p->n_heads * p->hd; i++) f(p->out)[i] = NAN;
  if (p->window) return servd_attention_window(p->out, p->q, p->c, 1, &b, p->n_heads, scale, p->window);
  return servd_attention(p->out, p->q, p->c, 1, &b, p->n_heads, scale);
}

/* Naive causal attention in double over the contiguous K/V of each sequence. */
static void check(const problem *p, float scale, const char *what) {
  int hd = p->hd, w = p->n_kv * hd, rep = p->n_heads / p->n_kv;
  double *sc = test_malloc(4096 * sizeof(double));
  for (int s = 0; s < p->n_seqs; s++)
    for (int r = 0; r < p->q_len[s]; r++) {
      int pos = p->kv_len[s] - p->q_len[s] + r;
      const float *qrow = f(p->q) + (int64_t)(p->q_start[s] + r) * p->n_heads * hd;
      const float *orow = f(p->out) + (int64_t)(p->q_start[s] + r) * p->n_heads * hd;
      for (int h = 0; h < p->n_heads; h++) {
        int g = h / rep;
        double mx = -INFINITY, sum = 0;
        assert_true(pos + 1 <= 4096);
        int j0 = p->window && pos + 1 > p->window ? pos + 1 - p->window : 0; /* the window's oldest key */
        for (int j = j0; j <= pos; j++) {
          double d = 0;
          for (int e = 0; e < hd; e++) d += (double)qrow[h * hd + e] * p->k[s][j * w + g * hd + e];
          sc[j] = d * scale;
          mx = fmax(mx, sc[j]);
        }
        for (int j = j0; j <= pos; j++) sum += (sc[j] = exp(sc[j] - mx));
        for (int e = 0; e < hd; e++) {
          double ref = 0;
          for (int j = j0; j <= pos; j++) ref += sc[j] * p->v[s][j * w + g * hd + e];
          ref /= sum;
          /* Scores are f32 dot products of <= 128 terms of |q| <= 2, |k| <= 1 (error <= ~1e-5 after
           * scaling); weights go through a ~2 ulp exp and f32 running sums; the output is a convex
           * combination of |v| <= 1, so its absolute error stays near 1e-5. 5e-5 leaves margin. */
          double got = orow[h * hd + e];
          if (!(fabs(got - ref) <= 5e-5))
            fail_msg("%s isa %s: seq %d row %d head %d dim %d: %.8g vs %.8g", what,
                     servd_isa_name(servd_cpu_active_isa()), s, r, h, e, got, ref);
        }
      }
    }
  test_free(sc);
}

typedef struct shape_case {
  const char *what;
  int n_kv, hd, n_heads, bs;
  servd_dtype dt;
  int n_seqs;
  int q_len[8], kv_len[8];
} shape_case;

static const shape_case cases[] = {
    {"prefill", 2, 32, 4, 16, SERVD_F32, 1, {37}, {37}},
    {"prefill q_len 1 kv_len 1", 1, 16, 1, 4, SERVD_F32, 1, {1}, {1}},
    {"decode batch", 2, 64, 4, 16, SERVD_F32, 5, {1, 1, 1, 1, 1}, {1, 15, 16, 17, 100}},
    {"decode gqa 1", 4, 48, 4, 8, SERVD_F32, 3, {1, 1, 1}, {9, 33, 70}},
    {"decode gqa 3 smollm2", 3, 64, 9, 16, SERVD_F32, 4, {1, 1, 1, 1}, {5, 64, 129, 300}},
    {"decode f16", 3, 64, 9, 16, SERVD_F16, 4, {1, 1, 1, 1}, {5, 64, 129, 300}},
    {"mixed prefill + decode", 2, 40, 6, 16, SERVD_F32, 4, {1, 23, 1, 7}, {50, 40, 3, 7}},
    {"mixed f16 odd dims", 2, 20, 4, 5, SERVD_F16, 3, {4, 1, 13}, {9, 1, 13}},
    {"gqa 20 (subgroups)", 1, 24, 20, 16, SERVD_F32, 2, {1, 5}, {40, 20}},
    {"head_dim 128 block 256", 2, 128, 8, 256, SERVD_F32, 2, {1, 2}, {300, 260}},
    {"head_dim 72 tail", 2, 72, 4, 16, SERVD_F32, 2, {3, 1}, {20, 33}},
    {"empty rows", 2, 16, 2, 4, SERVD_F32, 3, {0, 2, 0}, {0, 5, 8}},
    /* the kernels prefetch a later block of the table while reading one: these reach the table's end
     * with a distance of 2 blocks (f16, head_dim 128) and of 48 blocks of 3 tokens, tiles mid-block */
    {"decode f16 llama-like", 8, 128, 32, 16, SERVD_F16, 2, {1, 1}, {200, 33}},
    {"small blocks long context", 2, 16, 4, 3, SERVD_F16, 2, {2, 1}, {400, 97}},
    /* bf16 and the quantized caches (head_dim a multiple of 32): decode, prefill, odd block sizes
     * (q4_0 packs two tokens per byte, so segments start on odd keys), GQA above 3 queries a pass */
    {"decode bf16", 3, 64, 9, 16, SERVD_BF16, 4, {1, 1, 1, 1}, {5, 64, 129, 300}},
    {"mixed bf16 odd dims", 2, 20, 4, 5, SERVD_BF16, 3, {4, 1, 13}, {9, 1, 13}},
    {"decode q8_0", 3, 64, 9, 16, SERVD_Q8_0, 4, {1, 1, 1, 1}, {5, 64, 129, 300}},
    {"decode q4_0", 3, 64, 9, 16, SERVD_Q4_0, 4, {1, 1, 1, 1}, {5, 64, 129, 300}},
    {"mixed q8_0 block 5", 2, 32, 8, 5, SERVD_Q8_0, 3, {4, 1, 13}, {9, 1, 13}},
    {"mixed q4_0 block 5", 2, 32, 8, 5, SERVD_Q4_0, 3, {4, 1, 13}, {9, 1, 13}},
    {"prefill q8_0 head_dim 128", 2, 128, 32, 16, SERVD_Q8_0, 2, {37, 1}, {37, 200}},
    {"prefill q4_0 gqa 20", 1, 96, 20, 7, SERVD_Q4_0, 2, {9, 1}, {30, 77}},
    /* one long sequence: its kv heads' keys split over the threads, ranges merged */
    {"long decode f16 split", 3, 64, 9, 16, SERVD_F16, 1, {1}, {1500}},
    {"long decode q8_0 split", 3, 64, 9, 16, SERVD_Q8_0, 1, {1}, {1500}},
    {"long decode q4_0 split", 3, 64, 9, 16, SERVD_Q4_0, 1, {1}, {1203}},
    {"long verify rows q8_0 split", 1, 32, 2, 16, SERVD_Q8_0, 1, {4}, {2000}},
};

static void test_shapes(void **state) {
  (void)state;
  for (int isa = 0; isa < SERVD_ISA_COUNT; isa++) {
    if (servd_cpu_force_isa((servd_isa)isa) != 0) continue;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
      const shape_case *sc = &cases[i];
      problem p;
      setup(&p, sc->n_kv, sc->hd, sc->n_heads, sc->bs, sc->dt, sc->n_seqs, sc->q_len, sc->kv_len, true);
      float scale = 1.0f / sqrtf((float)sc->hd);
      assert_int_equal(run(&p, scale), 0);
      check(&p, scale, sc->what);
      teardown_problem(&p);
    }
  }
  servd_cpu_force_isa(SERVD_ISA_COUNT);
}

/* Sliding windows (keys older than pos - window + 1 masked) over every shape: windows of one key,
 * within a block, across tiles, and wider than every context (the same as none). */
static void test_window(void **state) {
  (void)state;
  static const int windows[] = {1, 5, 17, 70, 5000};
  for (int isa = 0; isa < SERVD_ISA_COUNT; isa++) {
    if (servd_cpu_force_isa((servd_isa)isa) != 0) continue;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
      for (size_t w = 0; w < sizeof windows / sizeof *windows; w++) {
        const shape_case *sc = &cases[i];
        problem p;
        setup(&p, sc->n_kv, sc->hd, sc->n_heads, sc->bs, sc->dt, sc->n_seqs, sc->q_len, sc->kv_len, true);
        p.window = windows[w];
        float scale = 1.0f / sqrtf((float)sc->hd);
        assert_int_equal(run(&p, scale), 0);
        check(&p, scale, sc->what);
        teardown_problem(&p);
      }
  }
  servd_cpu_force_isa(SERVD_ISA_COUNT);
  problem p;
  const int ql[1] = {3}, kl[1] = {9};
  setup(&p, 1, 16, 1, 4, SERVD_F32, 1, ql, kl, true);
  p.window = -1;
  assert_int_equal(run(&p, 0.25f), SERVD_EINVAL);
  teardown_problem(&p);
}

/* A 50-token prompt in two chunks: the second chunk's queries attend to the first chunk's keys. */
static void test_chunked_prefill(void **state) {
  (void)state;
  for (int isa = 0; isa < SERVD_ISA_COUNT; isa++) {
    if (servd_cpu_force_isa((servd_isa)isa) != 0) continue;
    problem p;
    const int ql[1] = {20}, kl[1] = {50};
    setup(&p, 3, 64, 9, 16, SERVD_F32, 1, ql, kl, false);
    write_range(&p, 0, 0, 20);
    p.kv_len[0] = 20; /* chunk 1: rows 0..19 */
    assert_int_equal(run(&p, 0.125f), 0);
    check(&p, 0.125f, "chunk 1");
    write_range(&p, 0, 20, 50);
    p.q_len[0] = 20; /* chunk 2 would be 30 rows; reuse q's 20 rows as positions 30..49 */
    p.kv_len[0] = 50;
    assert_int_equal(run(&p, 0.125f), 0);
    check(&p, 0.125f, "chunk 2");
    teardown_problem(&p);
  }
  servd_cpu_force_isa(SERVD_ISA_COUNT);
}

/* Batch invariance: a query row's output does not depend on the rows around it. Sequence 0 decodes
 * at a long context (where one sequence's keys may be split over threads), sequence 1 is a prefill
 * chunk, six more are short. Each of their rows must come out bit for bit the same in the batch of 8,
 * alone, and (sequence 1's last row) as a decode row alone or as the last row of a shorter chunk. */
static void expect_rows_equal(const problem *p, const float *want, int row0, int rows, const char *what) {
  const int w = p->n_heads * p->hd;
  for (int i = 0; i < rows * w; i++)
    if (memcmp(&f(p->out)[row0 * w + i], &want[i], sizeof(float)))
      fail_msg("%s (%s, ISA %s): element %d is %.9g, in the batch %.9g", what, servd_dtype_name(p->dt),
               servd_isa_name(servd_cpu_active_isa()), i, (double)f(p->out)[row0 * w + i], (double)want[i]);
}

static void run_sub(problem *p, int s, int q_off, int q_len, int kv_len) {
  const int32_t *tables[1] = {p->tables[s]};
  const int32_t qs[1] = {p->q_start[s] + q_off}, ql[1] = {q_len}, kl[1] = {kv_len};
  servd_attn_batch b = {1, qs, ql, kl, tables};
  for (int64_t i = 0; i < (int64_t)p->t * p->n_heads * p->hd; i++) f(p->out)[i] = NAN;
  assert_int_equal(servd_attention(p->out, p->q, p->c, 1, &b, p->n_heads, 0.125f), 0);
}

static void test_batch_invariance(void **state) {
  (void)state;
  /* the quantized caches with 3 query heads per kv head: a decode row reads the codes directly, a
   * prefill chunk through an f32 tile, and both must give the same bits */
  const servd_dtype dts[] = {SERVD_F32, SERVD_F16, SERVD_BF16, SERVD_Q8_0, SERVD_Q4_0, SERVD_Q8_0};
  const int heads[] = {8, 8, 6, 6, 6, 8};
  for (size_t d = 0; d < sizeof dts / sizeof *dts; d++)
    for (int isa = 0; isa < SERVD_ISA_COUNT; isa++) {
      if (servd_cpu_force_isa((servd_isa)isa) != 0) continue;
      problem p;
      const int ql[8] = {1, 16, 1, 1, 3, 1, 1, 2}, kl[8] = {1500, 1100, 40, 7, 300, 90, 1, 64};
      setup(&p, 2, 64, heads[d], 16, dts[d], 8, ql, kl, true);
      const int w = p.n_heads * p.hd;
      assert_int_equal(run(&p, 0.125f), 0);
      float *batch = test_malloc((size_t)p.t * w * sizeof(float));
      memcpy(batch, f(p.out), (size_t)p.t * w * sizeof(float));
      for (int s = 0; s < 8; s++) {
        run_sub(&p, s, 0, ql[s], kl[s]);
        expect_rows_equal(&p, batch + (size_t)p.q_start[s] * w, p.q_start[s], ql[s], "a sequence alone");
      }
      const int last = p.q_start[1] + 15;
      run_sub(&p, 1, 15, 1, kl[1]);
      expect_rows_equal(&p, batch + (size_t)last * w, last, 1, "a chunk's last row as a decode row");
      run_sub(&p, 1, 12, 4, kl[1]);
      expect_rows_equal(&p, batch + (size_t)last * w, last, 1, "a chunk's last row in a chunk of 4");
      test_free(batch);
      teardown_problem(&p);
    }
  servd_cpu_force_isa(SERVD_ISA_COUNT);
}

/* Softmax stability: scores of several hundred must not overflow the running sums. */
static void test_large_scores(void **state) {
  (void)state;
  problem p;
  const int ql[2] = {1, 3}, kl[2] = {200, 90};
  setup(&p, 1, 32, 2, 16, SERVD_F32, 2, ql, kl, true);
  for (int64_t i = 0; i < (int64_t)p.t * 64; i++) f(p.q)[i] *= 30.0f;
  assert_int_equal(run(&p, 1.0f), 0);
  for (int64_t i = 0; i < (int64_t)p.t * 64; i++) assert_false(isnan(f(p.out)[i]));
  check(&p, 1.0f, "large scores");
  teardown_problem(&p);
}

static void test_bad_input(void **state) {
  (void)state;
  problem p;
  const int ql[2] = {1, 3}, kl[2] = {10, 3};
  setup(&p, 2, 16, 4, 4, SERVD_F32, 2, ql, kl, true);
  const int32_t *tables[2] = {p.tables[0], p.tables[1]};
  servd_attn_batch b = {2, p.q_start, p.q_len, p.kv_len, tables};
  assert_int_equal(servd_attention(p.out, p.q, p.c, 1, &b, 4, 0.25f), 0);

  assert_int_equal(servd_attention(p.out, p.q, p.c, 1, &b, 3, 0.25f), SERVD_EINVAL); /* 3 % 2 kv heads */
  assert_non_null(strstr(servd_last_error(), "attention"));
  assert_non_null(strstr(servd_last_error(), "n_heads 3"));
  assert_int_equal(servd_attention(p.out, p.q, p.c, 2, &b, 4, 0.25f), SERVD_EINVAL);
  assert_non_null(strstr(servd_last_error(), "layer"));

  servd_tensor *wrong = tnew(SERVD_F32, 2, p.t, 60), *h = tnew(SERVD_F16, 2, p.t, 64);
  assert_int_equal(servd_attention(wrong, p.q, p.c, 1, &b, 4, 0.25f), SERVD_EINVAL);
  assert_non_null(strstr(servd_last_error(), "f32[4,60]"));
  assert_non_null(strstr(servd_last_error(), "f32[4,64]"));
  assert_int_equal(servd_attention(p.out, h, p.c, 1, &b, 4, 0.25f), SERVD_EINVAL);
  assert_non_null(strstr(servd_last_error(), "f16[4,64]"));
  assert_non_null(strstr(servd_last_error(), "16 dims f32"));

  p.kv_len[1] = 2; /* kv_len < q_len */
  assert_int_equal(servd_attention(p.out, p.q, p.c, 1, &b, 4, 0.25f), SERVD_EINVAL);
  assert_non_null(strstr(servd_last_error(), "kv_len 2 < q_len 3"));
  p.kv_len[1] = 3;
  int32_t keep = p.tables[0][2];
  p.tables[0][2] = 99; /* block id out of range */
  assert_int_equal(servd_attention(p.out, p.q, p.c, 1, &b, 4, 0.25f), SERVD_EINVAL);
  assert_non_null(strstr(servd_last_error(), "block_tables[0][2] = 99"));
  p.tables[0][2] = -3;
  assert_int_equal(servd_attention(p.out, p.q, p.c, 1, &b, 4, 0.25f), SERVD_EINVAL);
  p.tables[0][2] = keep;
  p.q_start[0] = 4; /* rows past q */
  assert_int_equal(servd_attention(p.out, p.q, p.c, 1, &b, 4, 0.25f), SERVD_EINVAL);
  assert_non_null(strstr(servd_last_error(), "query rows"));
  p.q_start[0] = 3;
  assert_int_equal(servd_attention(p.out, p.q, p.c, 1, &b, 4, NAN), SERVD_EINVAL);
  assert_int_equal(servd_attention(p.out, p.q, p.c, 1, NULL, 4, 0.25f), SERVD_EINVAL);
  assert_int_equal(servd_attention(p.out, p.q, NULL, 1, &b, 4, 0.25f), SERVD_EINVAL);
  assert_int_equal(servd_attention(p.out, p.q, p.c, 1, &b, 4, 0.25f), 0);
  servd_tensor_release(wrong);
  servd_tensor_release(h);
  teardown_problem(&p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_shapes),       cmocka_unit_test(test_window),    cmocka_unit_test(test_chunked_prefill),
      cmocka_unit_test(test_large_scores), cmocka_unit_test(test_bad_input), cmocka_unit_test(test_batch_invariance),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
