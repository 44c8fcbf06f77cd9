/* Paged causal attention over a batch of sequences in mixed phases (prefill chunks and decode rows),
 * with grouped-query heads and online (flash-style) softmax, so memory is O(tile) whatever kv_len is.
 *
 * Work is split into items of (sequence, kv head, head subgroup, chunk of query rows); one item reads
 * each K/V row of its kv head once from memory for all the query heads that share it, which is what
 * makes decode bandwidth bound rather than bound by re-reading the cache per query head. */
#include "ops-impl.h"

#include <math.h>
#include <stdlib.h>

#include "servd/threadpool.h"

#define ATTN_MAX_Q 16     /* queries (rows x heads) per item: their accumulators live on the stack */
#define ATTN_MAX_DIM 512  /* head_dim bound for those accumulators */
#define ATTN_TILE 64      /* keys per softmax update (spanning blocks) */
#define ATTN_TILE_DIM 128 /* head_dim bound of the f32 tile a quantized cache's prefill converts into */

static float kv_elem(const void *p, servd_dtype t, size_t i) {
  if (t == SERVD_F16) return servd_f16_to_f32(((const uint16_t *)p)[i]);
  if (t == SERVD_BF16) return servd_bf16_to_f32(((const uint16_t *)p)[i]);
  return ((const float *)p)[i];
}

void servd__attn_scores_scalar(float *out, int ld, const float *const *q, int nq, const void *k, servd_dtype kt, int n,
                               int hd, int64_t kstride, float scale, const void *pf) {
  (void)pf; /* the reference kernel does not prefetch */
  for (int i = 0; i < nq; i++)
    for (int j = 0; j < n; j++) {
      float s = 0.0f;
      for (int d = 0; d < hd; d++) {
        size_t at = (size_t)d * (size_t)kstride + (size_t)j;
        s += q[i][d] * kv_elem(k, kt, at);
      }
      out[(size_t)i * (size_t)ld + (size_t)j] = s * scale;
    }
}

void servd__attn_accum_scalar(float *acc, int acc_ld, const float *p, int ld, int nq, const void *v, servd_dtype vt,
                              int n, int hd, int64_t vstride, const void *pf) {
  (void)pf;
  for (int i = 0; i < nq; i++)
    for (int j = 0; j < n; j++) {
      float pj = p[(size_t)i * (size_t)ld + (size_t)j];
      float *a = acc + (size_t)i * (size_t)acc_ld;
      for (int d = 0; d < hd; d++) a[d] += pj * kv_elem(v, vt, (size_t)j * (size_t)vstride + (size_t)d);
    }
}

typedef struct attn_kernels {
  void (*scores)(float *, int, const float *const *, int, const void *, servd_dtype, int, int, int64_t, float,
                 const void *);
  void (*accum)(float *, int, const float *, int, int, const void *, servd_dtype, int, int, int64_t, const void *);
  /* over a quantized cache (q8_0, q4_0) */
  void (*scores_q)(float *, int, const float *const *, int, const char *, servd_dtype, int, int, int, int, float,
                   const char *);
  void (*accum_q)(float *, int, const float *, int, int, const char *, servd_dtype, int, int, int, const char *);
  void (*dequant_k)(float *, int, const char *, servd_dtype, int, int, int, int);
  void (*dequant_v)(float *, const char *, servd_dtype, int, int, int);
  float (*max)(const float *, int64_t);
  float (*exp_shift_sum)(float *, int64_t, float, float);
  void (*mul)(float *, int64_t, float);
} attn_kernels;

/* AVX-512 reads quantized caches with the AVX2 kernels (a superset ISA; no 512-bit version yet). */
static const attn_kernels kernels[SERVD_ISA_COUNT] = {
    {servd__attn_scores_scalar, servd__attn_accum_scalar, servd__attn_scores_q_scalar, servd__attn_accum_q_scalar,
     servd__kvq_dequant_k_scalar, servd__kvq_dequant_v_scalar, servd__max_scalar, servd__exp_shift_sum_scalar,
     servd__mul_scalar_scalar},
    {servd__attn_scores_avx2, servd__attn_accum_avx2, servd__attn_scores_q_avx2, servd__attn_accum_q_avx2,
     servd__kvq_dequant_k_avx2, servd__kvq_dequant_v_avx2, servd__max_avx2, servd__exp_shift_sum_avx2,
     servd__mul_scalar_avx2},
    {servd__attn_scores_avx512, servd__attn_accum_avx512, servd__attn_scores_q_avx2, servd__attn_accum_q_avx2,
     servd__kvq_dequant_k_avx2, servd__kvq_dequant_v_avx2, servd__max_avx512, servd__exp_shift_sum_avx512,
     servd__mul_scalar_avx512},
};

typedef struct attn_job {
  const attn_kernels *kn;
  const servd_kv_cache *c;
  int layer;
  const servd_attn_batch *b;
  ops__rows o, q;
  int n_heads, rep; /* rep: query heads per kv head */
  int heads_per_item, n_sub, rows_per_item;
  int pf_blocks; /* prefetch distance in blocks */
  float scale;
  int window; /* 0: none */
  /* split over positions (long contexts): each range's running max, sum and unnormalized sums in
   * part[] (part_floats per range), merged after */
  float *part;
  size_t part_floats; /* one range's state: max and sum of each of ATTN_MAX_Q queries, their head_dim sums */
} attn_job;

static int64_t seq_items(const attn_job *j, int s) {
  int64_t chunks = (j->b->q_len[s] + j->rows_per_item - 1) / j->rows_per_item;
  return chunks * j->c->n_kv_heads * j->n_sub;
}

/* Item: rows [r0, r1) of sequence s, query heads [h0, h1) of kv head g (h relative to the group),
 * over keys [k0, k1) of the sequence; part NULL: the outputs, normalized, else the range's state. */
static void attn_item(const attn_job *j, int s, int g, int h0, int h1, int r0, int r1, int k0, int k1, float *part) {
  const servd_kv_cache *c = j->c;
  const attn_kernels *kn = j->kn;
  int hd = c->head_dim, bs = c->block_size;
  int q_len = j->b->q_len[s], kv_len = j->b->kv_len[s], q_start = j->b->q_start[s];
  const int32_t *table = j->b->block_tables[s];
  float acc[ATTN_MAX_Q][ATTN_MAX_DIM] __attribute__((aligned(64)));
  float sc[ATTN_MAX_Q][ATTN_TILE] __attribute__((aligned(64)));
  float mx[ATTN_MAX_Q], sum[ATTN_MAX_Q];
  const float *qp[ATTN_MAX_Q];
  int lim[ATTN_MAX_Q], lo[ATTN_MAX_Q]; /* keys [lo, lim) are visible to that query */
  int nq = 0;
  for (int r = r0; r < r1; r++)
    for (int h = h0; h < h1; h++, nq++) {
      qp[nq] = (const float *)(j->q.data + (int64_t)(q_start + r) * j->q.stride) + (size_t)(g * j->rep + h) * hd;
      lim[nq] = kv_len - q_len + r + 1;
      lo[nq] = j->window > 0 && lim[nq] > j->window ? lim[nq] - j->window : 0;
      mx[nq] = -INFINITY;
      sum[nq] = 0.0f;
      memset(acc[nq], 0, (size_t)hd * sizeof(float));
    }
  int end = kv_len - q_len + r1; /* the last row sees the most keys */
  int begin = lo[0];             /* the first row the oldest (lo grows with the row) */
  if (begin < k0) begin = k0;
  if (end > k1) end = k1;
  bool quant = ops__kv_quantized(c->dtype);
  /* Many queries (a prefill chunk) convert each key and value once into an f32 tile in L1 and run
   * the f32 kernels on it, rather than once per three queries; a few (decode) read codes directly. */
  bool tiled = quant && nq > 3 && hd <= ATTN_TILE_DIM;
  float tile[ATTN_TILE_DIM * ATTN_TILE] __attribute__((aligned(64)));
  /* the kernels prefetch pf_blocks ahead of what they read, so the first blocks are fetched here */
  for (int t = begin - begin % bs; t < end && t < begin + j->pf_blocks * bs; t += bs)
    for (int kv = 0; kv < 2; kv++) {
      const char *r = ops__kv_run(c, j->layer, kv, table[t / bs], g);
      for (size_t o = 0; o < c->head_bytes; o += 64) __builtin_prefetch(r + o);
    }
  /* A tile is up to ATTN_TILE keys and may span blocks: scores and value sums run per block segment,
   * the softmax bookkeeping once per tile. */
  for (int t0 = begin; t0 < end;) {
    int n = end - t0 < ATTN_TILE ? end - t0 : ATTN_TILE;
    for (int t = t0; t < t0 + n;) {
      int off = t % bs, m = bs - off < t0 + n - t ? bs - off : t0 + n - t;
      int far = t / bs + j->pf_blocks; /* the block prefetched while this one is read */
      const char *kp = ops__kv_run(c, j->layer, 0, table[t / bs], g);
      const char *pf = far * bs < end ? ops__kv_run(c, j->layer, 0, table[far], g) : NULL;
      if (tiled) {
        kn->dequant_k(tile, ATTN_TILE, kp, c->dtype, off, m, hd, bs);
        kn->scores(&sc[0][t - t0], ATTN_TILE, qp, nq, tile, SERVD_F32, m, hd, ATTN_TILE, j->scale, NULL);
      } else if (quant) {
        /* a later run is prefetched whole once, from the segment that starts its block's keys */
        kn->scores_q(&sc[0][t - t0], ATTN_TILE, qp, nq, kp, c->dtype, off, m, hd, bs, j->scale,
                     off == 0 || t == begin ? pf : NULL);
      } else {
        size_t at = (size_t)off * c->elem;
        kn->scores(&sc[0][t - t0], ATTN_TILE, qp, nq, kp + at, c->dtype, m, hd, bs, j->scale, pf ? pf + at : NULL);
      }
      t += m;
    }
    /* online softmax per query; keys past a query's causal limit get weight 0, so one weighted sum
     * over the tile serves every query of the item */
    for (int i = 0; i < nq; i++) {
      int ni = lim[i] - t0 < n ? lim[i] - t0 : n;
      int a = lo[i] > t0 ? lo[i] - t0 : 0; /* keys before the window: weight 0 */
      float *si = sc[i];
      if (ni <= a) {
        memset(si, 0, (size_t)n * sizeof(float));
        continue;
      }
      float m_new = kn->max(si + a, ni - a);
      if (m_new < mx[i]) m_new = mx[i];
      float corr = expf(mx[i] - m_new); /* 0 on the first tile: mx is -inf */
      float ps = kn->exp_shift_sum(si + a, ni - a, 1.0f, m_new);
      for (int jj = 0; jj < a; jj++) si[jj] = 0.0f;
      for (int jj = ni; jj < n; jj++) si[jj] = 0.0f;
      if (corr != 1.0f) kn->mul(acc[i], hd, corr);
      sum[i] = sum[i] * corr + ps;
      mx[i] = m_new;
    }
    for (int t = t0; t < t0 + n;) {
      int off = t % bs, m = bs - off < t0 + n - t ? bs - off : t0 + n - t;
      int far = t / bs + j->pf_blocks;
      const char *vp = ops__kv_run(c, j->layer, 1, table[t / bs], g);
      const char *pf = far * bs < end ? ops__kv_run(c, j->layer, 1, table[far], g) : NULL;
      if (tiled) {
        kn->dequant_v(tile, vp, c->dtype, off, m, hd);
        kn->accum(&acc[0][0], ATTN_MAX_DIM, &sc[0][t - t0], ATTN_TILE, nq, tile, SERVD_F32, m, hd, hd, NULL);
      } else if (quant) {
        kn->accum_q(&acc[0][0], ATTN_MAX_DIM, &sc[0][t - t0], ATTN_TILE, nq, vp, c->dtype, off, m, hd, pf);
      } else {
        size_t at = (size_t)off * (size_t)hd * c->elem;
        kn->accum(&acc[0][0], ATTN_MAX_DIM, &sc[0][t - t0], ATTN_TILE, nq, vp + at, c->dtype, m, hd, hd,
                  pf ? pf + at : NULL);
      }
      t += m;
    }
    t0 += n;
  }
  if (part) {
    for (int i = 0; i < nq; i++) {
      part[i] = mx[i];
      part[ATTN_MAX_Q + i] = sum[i];
      memcpy(part + 2 * ATTN_MAX_Q + (size_t)i * (size_t)hd, acc[i], (size_t)hd * sizeof(float));
    }
    return;
  }
  nq = 0;
  for (int r = r0; r < r1; r++)
    for (int h = h0; h < h1; h++, nq++) {
      float *o = (float *)(j->o.data + (int64_t)(q_start + r) * j->o.stride) + (size_t)(g * j->rep + h) * hd;
      float inv = 1.0f / sum[nq]; /* sum >= 1: the max key contributes exp(0) */
      for (int d = 0; d < hd; d++) o[d] = acc[nq][d] * inv;
    }
}

/* An item's place: sequence, kv head, query heads [h0, h1) of its group, rows [r0, r1). */
typedef struct item_at {
  int s, g, h0, h1, r0, r1;
} item_at;

/* Item local of sequence s; order within a sequence: kv head, then subgroup, then row chunk. */
static item_at item_of(const attn_job *j, int s, int64_t local) {
  int64_t chunks = (j->b->q_len[s] + j->rows_per_item - 1) / j->rows_per_item;
  int chunk = (int)(local % chunks), sub = (int)(local / chunks % j->n_sub);
  item_at a = {.s = s, .g = (int)(local / chunks / j->n_sub), .h0 = sub * j->heads_per_item};
  a.h1 = a.h0 + j->heads_per_item > j->rep ? j->rep : a.h0 + j->heads_per_item;
  a.r0 = chunk * j->rows_per_item;
  a.r1 = a.r0 + j->rows_per_item > j->b->q_len[s] ? j->b->q_len[s] : a.r0 + j->rows_per_item;
  return a;
}

static void attn_task(void *ctx, int64_t begin, int64_t end, int thread) {
  (void)thread;
  const attn_job *j = ctx;
  int s = 0;
  int64_t base = 0;
  while (s < j->b->n_seqs && base + seq_items(j, s) <= begin) base += seq_items(j, s++);
  for (int64_t it = begin; it < end; it++) {
    while (it - base >= seq_items(j, s)) base += seq_items(j, s++);
    item_at a = item_of(j, s, it - base);
    attn_item(j, a.s, a.g, a.h0, a.h1, a.r0, a.r1, 0, INT32_MAX, NULL);
  }
}

/* ---- split over positions ------------------------------------------------------------------------
 * A decode step of one sequence is n_kv_heads items: fewer than the threads, or not a multiple of
 * them (3 kv heads on 2 threads: one thread reads two thirds of the cache), while the cache read is
 * the whole cost at long contexts. An item whose rows see more than SPLIT_KEYS keys therefore reads
 * them in ranges of SPLIT_KEYS positions, [0, R), [R, 2R), ..., each with its own running max and
 * sums, merged in order by rescaling to the largest max (flash decoding); the ranges are the units
 * the threads share. The ranges are fixed positions, never a share of the threads or of the batch:
 * a row's output is the same bits alone, in any batch and in a prompt chunk of any length (a row that
 * sees at most SPLIT_KEYS keys gives the same bits through one range as without one). */
/* A multiple of ATTN_TILE (tiles start at the same positions either way). 512: a 6,000-key decode is
 * 12 ranges per kv head for the threads to share, and a range's state (16 queries' max, sum and sums)
 * costs ~3% of reading its 512 keys in a long prompt's chunk. */
#define SPLIT_KEYS 512

/* The split's bookkeeping: per item its place, its first unit and, when it has several ranges, its
 * first range state in part (-1: one range, computed straight into the outputs). */
typedef struct split_plan {
  item_at *at;
  int64_t *first_unit; /* [items + 1] */
  int64_t *state;      /* [items] */
} split_plan;

static int item_ranges(const attn_job *j, const item_at *a) {
  int end = j->b->kv_len[a->s] - j->b->q_len[a->s] + a->r1; /* its last row sees the most keys */
  return end > SPLIT_KEYS ? (end + SPLIT_KEYS - 1) / SPLIT_KEYS : 1;
}

typedef struct split_job {
  const attn_job *j;
  const split_plan *sp;
  int64_t items;
} split_job;

static void split_task(void *ctx, int64_t begin, int64_t end, int thread) {
  (void)thread;
  const split_job *x = ctx;
  const attn_job *j = x->j;
  const split_plan *sp = x->sp;
  int64_t lo = 0, hi = x->items - 1; /* the item holding unit begin */
  while (lo < hi) {
    int64_t mid = (lo + hi + 1) / 2;
    if (sp->first_unit[mid] <= begin) lo = mid;
    else hi = mid - 1;
  }
  for (int64_t u = begin, it = lo; u < end; u++) {
    while (u >= sp->first_unit[it + 1]) it++;
    const item_at *a = &sp->at[it];
    if (sp->state[it] < 0) {
      attn_item(j, a->s, a->g, a->h0, a->h1, a->r0, a->r1, 0, INT32_MAX, NULL);
      continue;
    }
    int64_t r = u - sp->first_unit[it];
    attn_item(j, a->s, a->g, a->h0, a->h1, a->r0, a->r1, (int)(r * SPLIT_KEYS), (int)((r + 1) * SPLIT_KEYS),
              j->part + (size_t)(sp->state[it] + r) * j->part_floats);
  }
}

/* Item it's ranges into its outputs, in order: each range's sums rescaled by exp(its max - the
 * largest). */
static void merge_item(const attn_job *j, const split_plan *sp, int64_t it) {
  const item_at *a = &sp->at[it];
  int hd = j->c->head_dim, nq = 0, parts = (int)(sp->first_unit[it + 1] - sp->first_unit[it]);
  const float *first = j->part + (size_t)sp->state[it] * j->part_floats;
  for (int r = a->r0; r < a->r1; r++)
    for (int h = a->h0; h < a->h1; h++, nq++) {
      float *o =
          (float *)(j->o.data + (int64_t)(j->b->q_start[a->s] + r) * j->o.stride) + (size_t)(a->g * j->rep + h) * hd;
      float m = -INFINITY, sum = 0.0f;
      for (int p = 0; p < parts; p++)
        if (first[(size_t)p * j->part_floats + (size_t)nq] > m) m = first[(size_t)p * j->part_floats + (size_t)nq];
      memset(o, 0, (size_t)hd * sizeof(float));
      for (int p = 0; p < parts; p++) {
        const float *pp = first + (size_t)p * j->part_floats;
        if (pp[ATTN_MAX_Q + nq] == 0.0f) continue; /* a range this query sees no key of */
        float w = expf(pp[nq] - m);
        sum += pp[ATTN_MAX_Q + nq] * w;
        const float *acc = pp + 2 * ATTN_MAX_Q + (size_t)nq * (size_t)hd;
        for (int d = 0; d < hd; d++) o[d] += acc[d] * w;
      }
      float inv = 1.0f / sum; /* >= 1: the range holding the max contributes exp(0) */
      for (int d = 0; d < hd; d++) o[d] *= inv;
    }
}

/* Runs the items of a batch in which some item has several ranges. Its plan and range states live in
 * the calling thread's scratch (reused from step to step: a long prompt's chunk has thousands of
 * ranges); SERVD_ENOMEM without it (nothing computed). */
static int run_split(attn_job *j, int64_t items) {
  int64_t units = 0, states = 0;
  for (int s = 0; s < j->b->n_seqs; s++)
    for (int64_t l = 0; l < seq_items(j, s); l++) {
      item_at a = item_of(j, s, l);
      int n = item_ranges(j, &a);
      units += n;
      states += n > 1 ? n : 0;
    }
  const size_t at_bytes = (size_t)items * sizeof(item_at), idx_bytes = (size_t)(2 * items + 1) * sizeof(int64_t);
  const size_t head = (at_bytes + idx_bytes + 63) / 64 * 64;
  char *mem = servd__scratch(3, head + (size_t)states * j->part_floats * sizeof(float));
  if (!mem)
    return servd_fail(SERVD_ENOMEM, "attention: no memory for %lld ranges of %lld items split over positions",
                      (long long)units, (long long)items);
  split_plan sp = {(item_at *)mem, (int64_t *)(mem + at_bytes), (int64_t *)(mem + at_bytes) + items + 1};
  j->part = (float *)(mem + head);
  int64_t u = 0, st = 0, it = 0;
  for (int s = 0; s < j->b->n_seqs; s++)
    for (int64_t l = 0; l < seq_items(j, s); l++, it++) {
      sp.at[it] = item_of(j, s, l);
      int n = item_ranges(j, &sp.at[it]);
      sp.first_unit[it] = u;
      sp.state[it] = n > 1 ? st : -1;
      st += n > 1 ? n : 0;
      u += n;
    }
  sp.first_unit[items] = u;
  split_job x = {j, &sp, items};
  servd_parallel_for(units, 1, split_task, &x);
  for (it = 0; it < items; it++)
    if (sp.state[it] >= 0) merge_item(j, &sp, it);
  return 0;
}

/* Checks one sequence of the batch; NULL when fine. */
static const char *check_seq(const servd_attn_batch *b, int s, int64_t t, const servd_kv_cache *c, char *buf,
                             size_t cap) {
  int32_t qs = b->q_start[s], ql = b->q_len[s], kl = b->kv_len[s];
  if (ql < 0 || qs < 0 || (int64_t)qs + ql > t) {
    snprintf(buf, cap, "sequence %d: query rows [%d, %d+%d) outside the %lld rows of q", s, qs, qs, ql, (long long)t);
    return buf;
  }
  if (kl < ql) {
    snprintf(buf, cap, "sequence %d: kv_len %d < q_len %d", s, kl, ql);
    return buf;
  }
  if (kl > 0 && !b->block_tables[s]) {
    snprintf(buf, cap, "sequence %d: no block table", s);
    return buf;
  }
  int nb = (int)(((int64_t)kl + c->block_size - 1) / c->block_size);
  for (int i = 0; i < nb; i++) {
    int32_t id = b->block_tables[s][i];
    if (id < 0 || id >= c->n_blocks) {
      snprintf(buf, cap, "sequence %d: block_tables[%d][%d] = %d outside [0, %d)", s, s, i, id, c->n_blocks);
      return buf;
    }
  }
  return NULL;
}

int servd_attention(servd_tensor *out, const servd_tensor *q, const servd_kv_cache *c, int layer,
                    const servd_attn_batch *b, int n_heads, float scale) {
  return servd_attention_window(out, q, c, layer, b, n_heads, scale, 0);
}

int servd_attention_window(servd_tensor *out, const servd_tensor *q, const servd_kv_cache *c, int layer,
                           const servd_attn_batch *b, int n_heads, float scale, int window) {
  char bo[96], bq[96], msg[160];
  const char *why = NULL;
  attn_job j = {.c = c, .layer = layer, .b = b, .n_heads = n_heads, .scale = scale, .window = window};
  if (!c) {
    why = "cache is NULL";
  } else if (layer < 0 || layer >= c->n_layers) {
    why = "layer out of range";
  } else if (n_heads < 1 || n_heads % c->n_kv_heads != 0) {
    why = "n_heads must be a positive multiple of the cache's n_kv_heads";
  } else if (c->head_dim > ATTN_MAX_DIM) {
    why = "head_dim above 512 is not supported";
  } else if (!q || !out || q->dtype != SERVD_F32 || out->dtype != SERVD_F32 || q->ndim != 2 || out->ndim != 2 ||
             ops__as_rows(q, &j.q) != 0 || ops__as_rows(out, &j.o) != 0 || j.q.cols != (int64_t)n_heads * c->head_dim ||
             j.o.cols != j.q.cols || j.o.rows != j.q.rows) {
    why = "q and out must be f32 (t, n_heads*head_dim)";
  } else if (!isfinite(scale)) {
    why = "scale must be finite";
  } else if (!b || b->n_seqs < 0 || (b->n_seqs > 0 && (!b->q_start || !b->q_len || !b->kv_len || !b->block_tables))) {
    why = "batch must give q_start, q_len, kv_len and block_tables for n_seqs >= 0 sequences";
  } else if (window < 0) {
    why = "window must be >= 0 (0: none)";
  }
  for (int s = 0; !why && s < b->n_seqs; s++) why = check_seq(b, s, j.q.rows, c, msg, sizeof msg);
  if (why)
    return servd_fail(
        SERVD_EINVAL,
        "attention: %s; got out %s, q %s, layer %d, n_heads %d, window %d, cache %d layers x %d kv heads x %d dims %s",
        why, ops__desc(out, bo, sizeof bo), ops__desc(q, bq, sizeof bq), layer, n_heads, window, c ? c->n_layers : 0,
        c ? c->n_kv_heads : 0, c ? c->head_dim : 0, c ? servd_dtype_name(c->dtype) : "-");
  servd_isa isa = ops__isa();
  /* bf16 runs are AVX2 only; a quantized cache's decode kernels are AVX2 only, and its prefill tiles
   * run the f32 kernels of the same ISA so that a row computes alike in both */
  if (isa == SERVD_ISA_AVX512 && (c->dtype == SERVD_BF16 || ops__kv_quantized(c->dtype))) isa = SERVD_ISA_AVX2;
  j.kn = &kernels[isa];
  j.rep = n_heads / c->n_kv_heads;
  j.heads_per_item = j.rep < ATTN_MAX_Q ? j.rep : ATTN_MAX_Q;
  j.n_sub = (j.rep + j.heads_per_item - 1) / j.heads_per_item;
  j.rows_per_item = ATTN_MAX_Q / j.heads_per_item;
  j.pf_blocks = ops__attn_pf_blocks(c);
  int64_t items = 0;
  for (int s = 0; s < b->n_seqs; s++) items += seq_items(&j, s);
  if (items == 0) return 0;
  j.part_floats = 2 * ATTN_MAX_Q + (size_t)ATTN_MAX_Q * (size_t)c->head_dim;
  for (int s = 0; s < b->n_seqs; s++) /* a row that sees several ranges: the split, batch or not */
    if (b->q_len[s] > 0 && b->kv_len[s] > SPLIT_KEYS) return run_split(&j, items);
  servd_parallel_for(items, 1, attn_task, &j);
  return 0;
}
