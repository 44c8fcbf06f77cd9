/* servd_matmul: argument checks, ISA dispatch, the thread-pool split, and the scalar reference. */
#include <stdio.h>
#include <string.h>

#include "matmul-impl.h"
#include "servd/threadpool.h"

/* ---- scalar reference ------------------------------------------------------------------------- */

static inline float w_at(servd_dtype t, const char *row, int64_t i) {
  switch (t) {
  case SERVD_F16: return servd_f16_to_f32(((const uint16_t *)row)[i]);
  case SERVD_BF16: return servd_bf16_to_f32(((const uint16_t *)row)[i]);
  default: return ((const float *)row)[i];
  }
}

/* Double accumulation: this is the oracle the SIMD kernels are tested against. */
void servd__mm_float_scalar(const servd__mm *p, int64_t j0, int64_t j1) {
  for (int64_t i = 0; i < p->m; i++) {
    const float *x = (const float *)(p->x + i * p->ldx);
    float *o = (float *)(p->out + i * p->ldo);
    for (int64_t j = j0; j < j1; j++) {
      const char *w = p->w + j * p->ldw;
      double acc = 0;
      for (int64_t l = 0; l < p->k; l++) acc += (double)x[l] * (double)w_at(p->wt, w, l);
      o[j] = (float)acc;
    }
  }
}

/* Per block: exact integer dot of weight and activation quanta, times both scales; the q4 offsets
 * (q4_0: -8*d, q4_1: m) multiply s = d_x * sum(q_x). Same arithmetic as the SIMD kernels. */
void servd__mm_quant_scalar(const servd__mm *p, int64_t j0, int64_t j1) {
  const int64_t nb = p->xq.nb;
  for (int64_t i = 0; i < p->m; i++) {
    const int8_t *xq = p->xq.qs + i * p->xq.ldq;
    const float *xd = p->xq.d + i * p->xq.lds, *xs = p->xq.s + i * p->xq.lds;
    float *o = (float *)(p->out + i * p->ldo);
    for (int64_t j = j0; j < j1; j++) {
      const char *w = p->w + j * p->ldw;
      double acc = 0;
      for (int64_t b = 0; b < nb; b++) {
        const int8_t *xb = xq + b * SERVD_QK;
        int32_t dot = 0;
        if (p->wt == SERVD_Q8_0) {
          const servd__block_q8_0 *blk = (const servd__block_q8_0 *)w + b;
          for (int l = 0; l < SERVD_QK; l++) dot += blk->qs[l] * xb[l];
          acc += (double)servd_f16_to_f32(blk->d) * xd[b] * dot;
        } else {
          const uint8_t *qs;
          float d, c;
          if (p->wt == SERVD_Q4_0) {
            const servd__block_q4_0 *blk = (const servd__block_q4_0 *)w + b;
            qs = blk->qs;
            d = servd_f16_to_f32(blk->d);
            c = -8.0f * d;
          } else {
            const servd__block_q4_1 *blk = (const servd__block_q4_1 *)w + b;
            qs = blk->qs;
            d = servd_f16_to_f32(blk->d);
            c = servd_f16_to_f32(blk->m);
          }
          for (int l = 0; l < SERVD_QK / 2; l++) dot += (qs[l] & 0x0f) * xb[l] + (qs[l] >> 4) * xb[l + SERVD_QK / 2];
          acc += (double)d * xd[b] * dot + (double)c * xs[b];
        }
      }
      o[j] = (float)acc;
    }
  }
}

/* ---- checks ----------------------------------------------------------------------------------- */

static int bad(const servd_tensor *out, const servd_tensor *x, const servd_tensor *w, const char *why) {
  char a[96], b[96], c[96];
  return servd_fail(SERVD_EINVAL, "matmul: %s (out %s, x %s, w %s)", why, servd_tensor_describe(out, a, sizeof a),
                    servd_tensor_describe(x, b, sizeof b), servd_tensor_describe(w, c, sizeof c));
}

static int setup(servd__mm *p, servd_tensor *out, const servd_tensor *x, const servd_tensor *w) {
  servd__mat mx, mw, mo;
  if (!out || !x || !w) return servd_fail(SERVD_EINVAL, "matmul: NULL tensor");
  if (x->dtype != SERVD_F32 || out->dtype != SERVD_F32) return bad(out, x, w, "x and out must be f32");
  if ((unsigned)w->dtype >= SERVD_DTYPE_COUNT || !servd__dtype_cpu_traits[w->dtype].scalar)
    return bad(out, x, w, "w must be f32, f16, bf16 or a block dtype");
  if (w->ndim != 2) return bad(out, x, w, "w must be 2-D (n,k)");
  if (x->device >= 0 || w->device >= 0 || out->device >= 0) return bad(out, x, w, "tensors must be on the host");
  if (!servd__as_matrix(x, &mx) || !servd__as_matrix(w, &mw) || !servd__as_matrix(out, &mo))
    return bad(out, x, w, "outer dimensions of a view cannot be merged into rows");
  if (mx.cols != mw.cols) return bad(out, x, w, "inner dimensions differ");
  if (mw.cols % (int64_t)servd_dtype_block_elems(w->dtype) != 0)
    return bad(out, x, w, "k is not a whole number of weight blocks");
  if (mo.rows != mx.rows || mo.cols != mw.rows) return bad(out, x, w, "out must be (m,n)");
  if (((uintptr_t)mx.base | (uintptr_t)mo.base | (uintptr_t)mx.row_stride | (uintptr_t)mo.row_stride) % 4 ||
      ((uintptr_t)mw.base | (uintptr_t)mw.row_stride) % (w->dtype == SERVD_F32 ? 4 : 2))
    return bad(out, x, w, "misaligned view");
  *p = (servd__mm){.x = mx.base,
                   .w = mw.base,
                   .out = mo.base,
                   .ldx = mx.row_stride,
                   .ldw = mw.row_stride,
                   .ldo = mo.row_stride,
                   .m = mx.rows,
                   .n = mw.rows,
                   .k = mx.cols,
                   .wt = w->dtype};
  return 0;
}

/* ---- dispatch --------------------------------------------------------------------------------- */

/* p with its residual activations in place of the first level's: the same kernel computes their
 * product with the weights (exact integer dots times the residual scales). */
static servd__mm residual_view(const servd__mm *p) {
  servd__mm r = *p;
  if (p->xq.qs2) {
    r.xq.qs = p->xq.qs2;
    r.xq.d = p->xq.d2;
    r.xq.s = p->xq.s2;
    r.xq.qs2 = NULL;
  }
  if (p->xk.qs2) {
    r.xk.qs = p->xk.qs2;
    r.xk.d = p->xk.d2;
    r.xk.bsums = p->xk.bsums2;
    r.xk.qs2 = NULL;
  }
  return r;
}

void servd__mm_run(servd__mm_fn fn, const servd__mm *p, int64_t j0, int64_t j1) {
  if ((!p->xq.qs2 && !p->xk.qs2) || p->residual_fused) {
    fn(p, j0, j1);
    return;
  }
  /* Per run of COLS columns, while its weights are still in L1/L2: the first level's product into
   * out, the residual's into scratch, then their sum. Each is a row's own arithmetic, so the sum
   * keeps the kernels' batch invariance. */
  enum { COLS = 32 };
  float *tmp = servd__scratch(4, (size_t)p->m * COLS * sizeof(float));
  if (!tmp) { /* no memory for the residual's columns: NaN marks the outputs rather than a wrong value */
    for (int64_t i = 0; i < p->m; i++)
      for (int64_t j = j0; j < j1; j++) ((float *)(p->out + i * p->ldo))[j] = NAN;
    return;
  }
  servd__mm r = residual_view(p);
  r.ldo = COLS * sizeof(float);
  for (int64_t jb = j0; jb < j1; jb += COLS) {
    const int64_t je = j1 - jb < COLS ? j1 : jb + COLS;
    fn(p, jb, je);
    r.out = (char *)((uintptr_t)tmp - (uintptr_t)jb * sizeof(float)); /* column jb at tmp[0] */
    fn(&r, jb, je);
    for (int64_t i = 0; i < p->m; i++) {
      float *o = (float *)(p->out + i * p->ldo);
      const float *t = tmp + i * COLS - jb;
      for (int64_t j = jb; j < je; j++) o[j] += t[j];
    }
  }
}

/* Work items: blocks of `cols` output columns, times blocks of `rows` x rows when m is large (so
 * that many threads find work in prefill), columns fastest so neighbouring chunks share x rows. */
typedef struct task {
  const servd__mm *p;
  servd__mm_fn fn;
  int64_t cols, rows, n_items; /* n_items: column blocks per row block */
} task;

/* p's rows [r0, r0 + rows) as a matmul of their own (x, out and the prepared activations moved). */
static servd__mm row_block(const servd__mm *p, int64_t r0, int64_t rows) {
  servd__mm sub = *p;
  sub.m = p->m - r0 < rows ? p->m - r0 : rows;
  sub.x += r0 * p->ldx;
  sub.out += r0 * p->ldo;
  servd__q8x_rows_from(&sub.xq, r0);
  servd__q8k_rows_from(&sub.xk, r0);
  if (p->xeo) sub.xeo += r0 * p->ldxeo;
  return sub;
}

static void run_task(void *ctx, int64_t b, int64_t e, int thread) {
  const task *t = ctx;
  const servd__mm *p = t->p;
  (void)thread;
  for (int64_t it = b; it < e;) {
    const int64_t mb = it / t->n_items, jb = it % t->n_items;
    const int64_t jend = jb + (e - it) < t->n_items ? jb + (e - it) : t->n_items;
    const int64_t j0 = jb * t->cols, j1 = jend * t->cols < p->n ? jend * t->cols : p->n;
    if (t->rows >= p->m) {
      servd__mm_run(t->fn, p, j0, j1);
    } else {
      const servd__mm sub = row_block(p, mb * t->rows, t->rows);
      servd__mm_run(t->fn, &sub, j0, j1);
    }
    it += jend - jb;
  }
}

typedef struct quant_task {
  const servd__mm *p;
  bool avx512;
} quant_task;

/* Quantizes x rows [b, e) into p->xq. */
static void run_quant(void *ctx, int64_t b, int64_t e, int thread) {
  const quant_task *t = ctx;
  const servd__mm *p = t->p;
  servd__q8x q = p->xq;
  (void)thread;
  servd__q8x_rows_from(&q, b);
  if (servd__dtype_cpu_traits[p->wt].act == SERVD__ACT_Q8K) {
    servd__q8k k = p->xk;
    servd__q8k_rows_from(&k, b);
    (t->avx512 ? servd__quantize_q8k_avx512 : servd__quantize_q8k)(p->x + b * p->ldx, p->ldx, e - b, p->k, &k);
  } else if (t->avx512) servd__quantize_q8x_avx512(p->x + b * p->ldx, p->ldx, e - b, p->k, &q);
  else servd__quantize_q8x(p->x + b * p->ldx, p->ldx, e - b, p->k, &q);
}

/* Prepares x for w's dtype as its row of dtype_cpu.c asks (q8 activations, or the AVX-512 bf16
 * layout, in thread scratch slot 0) and picks the row's kernel for this CPU. */
static int prepare(servd__mm *p, servd__mm_fn *fn) {
  const servd_isa isa = servd__isa();
  const bool vnni = servd__cpu_has_vnni();
  const servd__dtype_cpu *c = &servd__dtype_cpu_traits[p->wt];
  const int levels = servd_cpu_activation_levels();
  if (c->act == SERVD__ACT_Q8K) {
    p->xk.nb = p->k / SERVD_QK_K;
    p->xk.ldq = p->k; /* a multiple of 256 */
    const size_t qbytes = (size_t)(p->m * p->k), dbytes = (size_t)(p->m * p->xk.nb) * sizeof(float);
    /* each level from a 64-byte line: the kernels load qs aligned */
    const size_t level = (qbytes + dbytes + (size_t)(p->m * p->xk.nb) * 16 * sizeof(int16_t) + 63) & ~(size_t)63;
    char *buf = servd__scratch(0, level * (size_t)levels);
    if (!buf) return servd_fail(SERVD_ENOMEM, "matmul: cannot allocate %zu bytes of activation scratch", level);
    p->xk.qs = (int8_t *)buf;
    p->xk.d = (float *)(buf + qbytes);
    p->xk.bsums = (int16_t *)(buf + qbytes + dbytes);
    if (levels == 2) {
      p->xk.qs2 = (int8_t *)(buf + level);
      p->xk.d2 = (float *)(buf + level + qbytes);
      p->xk.bsums2 = (int16_t *)(buf + level + qbytes + dbytes);
    }
    p->xk.perm = vnni && c->q8k_perm;
    quant_task qt = {.p = p, .avx512 = vnni}; /* its quantizer lives with the VNNI kernel */
    servd_parallel_for(p->m, (1 << 16) / p->k + 1, run_quant, &qt);
  } else if (c->act == SERVD__ACT_Q8) {
    p->xq.nb = p->k / SERVD_QK;
    p->xq.quad = vnni;
    p->xq.ldq = (p->xq.nb + 3) / 4 * 128; /* whole quads, a multiple of 64 bytes */
    p->xq.lds = (p->xq.nb + 15) / 16 * 16;
    size_t qbytes = (size_t)(p->m * p->xq.ldq), fbytes = (size_t)(p->m * p->xq.lds) * sizeof(float);
    const size_t level = qbytes + 2 * fbytes; /* qbytes: whole 64-byte lines, so every level stays aligned */
    char *buf = servd__scratch(0, level * (size_t)levels);
    if (!buf) return servd_fail(SERVD_ENOMEM, "matmul: cannot allocate %zu bytes of activation scratch", level);
    p->xq.qs = (int8_t *)buf;
    p->xq.d = (float *)(buf + qbytes);
    p->xq.s = (float *)(buf + qbytes + fbytes);
    if (levels == 2) {
      p->xq.qs2 = (int8_t *)(buf + level);
      p->xq.d2 = (float *)(buf + level + qbytes);
      p->xq.s2 = (float *)(buf + level + qbytes + fbytes);
    }
    quant_task qt = {.p = p, .avx512 = isa == SERVD_ISA_AVX512};
    servd_parallel_for(p->m, (1 << 16) / p->k + 1, run_quant, &qt); /* prefill: many rows */
  } else if (c->act == SERVD__ACT_F32_EVEN_ODD && isa == SERVD_ISA_AVX512 && p->k >= 32) {
    p->ldxeo = p->k / 32 * 32;
    float *xeo = servd__scratch(0, (size_t)(p->m * p->ldxeo) * sizeof(float));
    if (!xeo) return servd_fail(SERVD_ENOMEM, "matmul: cannot allocate bf16 activation scratch");
    servd__split_even_odd_avx512(p->x, p->ldx, p->m, p->k, xeo, p->ldxeo);
    p->xeo = xeo;
  }
  *fn = servd__dtype_cpu_kernel(c, isa, vnni);
  p->residual_fused = (p->xq.qs2 || p->xk.qs2) &&
                      ((*fn == c->avx512vnni && c->vnni_fuses_residual) || (*fn == c->avx2 && c->avx2_fuses_residual));
  return 0;
}

/* Items of 32 columns (a whole register tile) by 128 x rows; small problems run inline. */
enum { ITEM_COLS = 32, ITEM_ROWS = 128 };

static int64_t grain_of(const servd__mm *p) {
  const int64_t macs_per_item = (p->m < ITEM_ROWS ? p->m : ITEM_ROWS) * p->k * ITEM_COLS;
  return (1 << 16) / macs_per_item + 1;
}

int servd_matmul(servd_tensor *out, const servd_tensor *x, const servd_tensor *w) {
  servd__mm p;
  int rc = setup(&p, out, x, w);
  if (rc) return rc;
  if (p.m == 0 || p.n == 0) return 0;
  if (p.k == 0) {
    for (int64_t i = 0; i < p.m; i++) memset(p.out + i * p.ldo, 0, (size_t)p.n * 4);
    return 0;
  }
  servd__mm_fn fn;
  if ((rc = prepare(&p, &fn))) return rc;
  task t = {.p = &p, .fn = fn, .cols = ITEM_COLS, .rows = ITEM_ROWS};
  t.n_items = (p.n + t.cols - 1) / t.cols;
  const int64_t items = t.n_items * ((p.m + t.rows - 1) / t.rows);
  servd_parallel_for(items, grain_of(&p), run_task, &t);
  return 0;
}

/* ---- several weights, one x ------------------------------------------------------------------- */

/* Items: row blocks of x times the column blocks of every weight laid end to end; within a row
 * block, items [first[i], first[i+1]) are weight i's. */
typedef struct many_task {
  const servd__mm *p;
  servd__mm_fn fn;
  int count;
  int64_t first[SERVD_MATMUL_MANY_MAX + 1];
} many_task;

static void run_many(void *ctx, int64_t b, int64_t e, int thread) {
  const many_task *t = ctx;
  const int64_t per_block = t->first[t->count];
  (void)thread;
  for (int64_t it = b; it < e;) {
    const int64_t mb = it / per_block, jb = it % per_block;
    int s = 0;
    while (jb >= t->first[s + 1]) s++;
    const int64_t end = e - it < t->first[s + 1] - jb ? jb + (e - it) : t->first[s + 1];
    const servd__mm *p = &t->p[s];
    const int64_t j0 = (jb - t->first[s]) * ITEM_COLS, j1 = (end - t->first[s]) * ITEM_COLS;
    if (p->m <= ITEM_ROWS) {
      servd__mm_run(t->fn, p, j0, j1 < p->n ? j1 : p->n);
    } else {
      const servd__mm sub = row_block(p, mb * ITEM_ROWS, ITEM_ROWS);
      servd__mm_run(t->fn, &sub, j0, j1 < p->n ? j1 : p->n);
    }
    it += end - jb;
  }
}

int servd_matmul_many(int count, servd_tensor *const *outs, const servd_tensor *x, const servd_tensor *const *ws) {
  if (count < 1 || count > SERVD_MATMUL_MANY_MAX || !outs || !ws)
    return servd_fail(SERVD_EINVAL, "matmul_many: %d weights (1..%d)", count, SERVD_MATMUL_MANY_MAX);
  servd__mm p[SERVD_MATMUL_MANY_MAX];
  bool together = true;
  for (int i = 0; i < count; i++) {
    int rc = setup(&p[i], outs[i], x, ws[i]);
    if (rc) return servd_fail(rc, "matmul_many: weight %d: %s", i, servd_last_error());
    together &= p[i].wt == p[0].wt && p[i].n > 0;
  }
  /* One split when the x side is shared (one dtype): x prepared once, one pass over the pool. */
  if (!together || count == 1 || p[0].m == 0 || p[0].k == 0) {
    for (int i = 0; i < count; i++) {
      int rc = servd_matmul(outs[i], x, ws[i]);
      if (rc) return rc;
    }
    return 0;
  }
  many_task t = {.p = p, .count = count};
  int rc = prepare(&p[0], &t.fn);
  if (rc) return rc;
  for (int i = 0; i < count; i++) {
    servd__mm_share_x(&p[i], &p[0]);
    t.first[i + 1] = t.first[i] + (p[i].n + ITEM_COLS - 1) / ITEM_COLS;
  }
  const int64_t row_blocks = (p[0].m + ITEM_ROWS - 1) / ITEM_ROWS;
  servd_parallel_for(row_blocks * t.first[count], grain_of(&p[0]), run_many, &t);
  return 0;
}

/* ---- for fused kernels (fused_*.c) ------------------------------------------------------------ */

int servd__mm_setup(servd__mm *p, servd_tensor *out, const servd_tensor *x, const servd_tensor *w) {
  return setup(p, out, x, w);
}

int servd__mm_prepare(servd__mm *p, servd__mm_fn *fn) { return prepare(p, fn); }
