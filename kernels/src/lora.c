/* lora: out += scale * (x @ A^T) @ B^T, the adapter product of one projection for one group of rows
 * (the engine calls it once per adapter group, as punica's SGMV segments). The scalar kernels are the
 * reference for the SIMD ones (lora_avx2.c, lora_avx512.c) and the device one (kernels/cuda/lora.cu).
 *
 * Work is split so that a row's bits never depend on its batch: a batch of few rows computes each
 * row's r values of x·A on the caller, then splits B's columns over the pool on LORA_COL_ALIGN
 * boundaries; a larger one gives each task whole rows. Either way every output element is the same
 * chain of fused multiply-adds. */
#include "lora-impl.h"
#include "ops-impl.h"

#include <math.h>
#include <stdlib.h>

#include "servd/threadpool.h"

#define LORA_MAX_RANK SERVD_LORA_MAX_RANK

int servd__check_lora(servd_tensor *out, const servd_tensor *x, const servd_tensor *ab, float scale) {
  char bo[96], bx[96], bab[96];
  bool dev = out && out->dtype == SERVD_BF16;
  bool ok = out && x && ab && (out->dtype == SERVD_F32 || dev) && x->dtype == out->dtype && out->ndim == 2 &&
            x->ndim == 2 && ab->ndim == 2 && (ab->dtype == SERVD_F32 || ab->dtype == SERVD_F16) &&
            out->shape[0] == x->shape[0] && ab->shape[1] == x->shape[1] + out->shape[1] && ab->shape[0] >= 1 &&
            ab->shape[0] <= LORA_MAX_RANK;
  if (!ok)
    return servd_fail(SERVD_EINVAL,
                      "lora: expected out (m,n), x (m,k) f32 (bf16 on a device), ab (r, k+n) f32 or f16 with "
                      "1 <= r <= %d; got out %s, x %s, ab %s",
                      LORA_MAX_RANK, ops__desc(out, bo, sizeof bo), ops__desc(x, bx, sizeof bx),
                      ops__desc(ab, bab, sizeof bab));
  if (!isfinite(scale)) return servd_fail(SERVD_EINVAL, "lora: scale %g is not finite", (double)scale);
  if (servd_tensor_data(out) == servd_tensor_data(x) && servd_tensor_numel(out) > 0)
    return servd_fail(SERVD_EINVAL, "lora: out must not alias x");
  return 0;
}

static inline float ab_at(const void *ab, servd_dtype t, int64_t i) {
  return t == SERVD_F16 ? servd_f16_to_f32(((const uint16_t *)ab)[i]) : ((const float *)ab)[i];
}

void servd__lora_down_scalar(float *t, const float *x, const void *ab, servd_dtype abt, int64_t r, int64_t k,
                             int64_t ld, float scale) {
  for (int64_t j = 0; j < r; j++) {
    float s = 0.0f;
    for (int64_t i = 0; i < k; i++) s = fmaf(x[i], ab_at(ab, abt, j * ld + i), s);
    t[j] = scale * s;
  }
}

void servd__lora_up_scalar(float *out, const float *t, const void *ab, servd_dtype abt, int64_t r, int64_t k,
                           int64_t ld, int64_t c0, int64_t c1) {
  for (int64_t c = c0; c < c1; c++) {
    float acc = out[c];
    for (int64_t j = 0; j < r; j++) acc = fmaf(t[j], ab_at(ab, abt, j * ld + k + c), acc);
    out[c] = acc;
  }
}

typedef struct lora_job {
  ops__rows o, x;
  const servd_lora_seg *segs;
  int n_segs;
  int64_t k;
  const float *t;        /* column split: the rows' x·A values, LORA_MAX_RANK apart */
  const int32_t *seg_of; /* column split: each listed row's segment */
  const int64_t *row_of; /* column split: the listed rows */
  int64_t n_listed;
  lora_down_fn down;
  lora_up_fn up;
} lora_job;

static inline int64_t ld_of(const servd_tensor *ab) { return ab->shape[1]; }

static void one_row(const lora_job *j, const servd_lora_seg *s, int64_t i) {
  float t[LORA_MAX_RANK];
  const void *ab = servd_tensor_data(s->ab);
  j->down(t, (const float *)(j->x.data + i * j->x.stride), ab, s->ab->dtype, s->ab->shape[0], j->k, ld_of(s->ab),
          s->scale);
  j->up((float *)(j->o.data + i * j->o.stride), t, ab, s->ab->dtype, s->ab->shape[0], j->k, ld_of(s->ab), 0, j->o.cols);
}

/* Items are the segments' rows counted in order; a task walks from its first. */
static void rows_task(void *ctx, int64_t begin, int64_t end, int thread) {
  (void)thread;
  const lora_job *j = ctx;
  int si = 0;
  int64_t base = 0;
  while (si < j->n_segs && (!j->segs[si].ab || base + j->segs[si].n <= begin)) {
    if (j->segs[si].ab) base += j->segs[si].n;
    si++;
  }
  for (int64_t item = begin; item < end && si < j->n_segs;) {
    const servd_lora_seg *s = &j->segs[si];
    if (!s->ab) {
      si++;
      continue;
    }
    for (int64_t i = item - base; i < s->n && item < end; i++, item++) one_row(j, s, s->first + i);
    base += s->n;
    si++;
  }
}

static void cols_task(void *ctx, int64_t begin, int64_t end, int thread) {
  (void)thread;
  const lora_job *j = ctx;
  int64_t c0 = begin * LORA_COL_ALIGN, c1 = end * LORA_COL_ALIGN;
  if (c1 > j->o.cols) c1 = j->o.cols;
  for (int64_t l = 0; l < j->n_listed; l++) {
    const servd_lora_seg *s = &j->segs[j->seg_of[l]];
    j->up((float *)(j->o.data + j->row_of[l] * j->o.stride), j->t + l * LORA_MAX_RANK, servd_tensor_data(s->ab),
          s->ab->dtype, s->ab->shape[0], j->k, ld_of(s->ab), c0, c1);
  }
}

/* Multiply-adds below which a call stays on the caller thread (a pool round trip costs about as much). */
#define LORA_SERIAL_WORK (1 << 17)
/* Rows up to which B's columns are split rather than the rows. */
#define LORA_COL_SPLIT_ROWS 8

static const lora_down_fn downs[SERVD_ISA_COUNT] = {servd__lora_down_scalar, servd__lora_down_avx2,
                                                    servd__lora_down_avx512};
static const lora_up_fn ups[SERVD_ISA_COUNT] = {servd__lora_up_scalar, servd__lora_up_avx2, servd__lora_up_avx512};

/* bf16 rows (the device's activations), computed in f32 and rounded once, for the CUDA stand-in. */
static int lora_bf16(servd_tensor *out, const servd_tensor *x, const servd_tensor *ab, float scale) {
  int64_t m = out->shape[0], n = out->shape[1], k = x->shape[1], r = ab->shape[0];
  float *xf = malloc(sizeof(float) * (size_t)(k + n)), t[LORA_MAX_RANK];
  if (!xf) return servd_fail(SERVD_ENOMEM, "lora: bf16 row of %lld", (long long)(k + n));
  float *of = xf + k;
  for (int64_t i = 0; i < m; i++) {
    const uint16_t *xr = (const uint16_t *)((const char *)servd_tensor_data(x) + i * x->strides[0]);
    uint16_t *orow = (uint16_t *)((char *)servd_tensor_data(out) + i * out->strides[0]);
    for (int64_t c = 0; c < k; c++) xf[c] = servd_bf16_to_f32(xr[c]);
    for (int64_t c = 0; c < n; c++) of[c] = servd_bf16_to_f32(orow[c]);
    servd__lora_down_scalar(t, xf, servd_tensor_data(ab), ab->dtype, r, k, ab->shape[1], scale);
    servd__lora_up_scalar(of, t, servd_tensor_data(ab), ab->dtype, r, k, ab->shape[1], 0, n);
    for (int64_t c = 0; c < n; c++) orow[c] = servd_f32_to_bf16(of[c]);
  }
  free(xf);
  return 0;
}

/* Checks every segment against out and x: shapes by servd__check_lora on the segment's rows. */
static int check_segs(servd_tensor *out, const servd_tensor *x, int n_segs, const servd_lora_seg *segs, int64_t *rows,
                      int64_t *work) {
  char bo[96], bx[96];
  if (!out || !x || out->ndim != 2 || x->ndim != 2 || out->shape[0] != x->shape[0] || n_segs < 0 || (n_segs && !segs))
    return servd_fail(SERVD_EINVAL,
                      "lora_sgmv: expected out (m,n), x (m,k) and segments; got out %s, x %s, %d segments",
                      ops__desc(out, bo, sizeof bo), ops__desc(x, bx, sizeof bx), n_segs);
  int64_t end = 0;
  *rows = *work = 0;
  for (int i = 0; i < n_segs; i++) {
    const servd_lora_seg *s = &segs[i];
    if (s->first < end || s->n < 0 || s->first + s->n > out->shape[0])
      return servd_fail(SERVD_EINVAL,
                        "lora_sgmv: segment %d rows [%lld, %lld) is out of order, overlaps or leaves the %lld rows", i,
                        (long long)s->first, (long long)(s->first + s->n), (long long)out->shape[0]);
    end = s->first + s->n;
    if (!s->ab) continue;
    int rc = servd__check_lora(out, x, s->ab, s->scale);
    if (rc) return servd_fail(rc, "lora_sgmv: segment %d: %s", i, servd_last_error());
    *rows += s->n;
    *work += s->n * s->ab->shape[0] * s->ab->shape[1];
  }
  return 0;
}

int servd_lora_sgmv(servd_tensor *out, const servd_tensor *x, int n_segs, const servd_lora_seg *segs) {
  char bo[96];
  int64_t rows = 0, work = 0;
  int rc = check_segs(out, x, n_segs, segs, &rows, &work);
  if (rc) return rc;
  lora_job j = {.segs = segs, .n_segs = n_segs, .k = x->shape[1]};
  if (ops__as_rows(out, &j.o) || ops__as_rows(x, &j.x))
    return servd_fail(SERVD_EINVAL, "lora: out and x must have contiguous rows; got out %s",
                      ops__desc(out, bo, sizeof bo));
  for (int i = 0; i < n_segs; i++)
    if (segs[i].ab && !servd_tensor_is_contiguous(segs[i].ab))
      return servd_fail(SERVD_EINVAL, "lora: segment %d: ab must be contiguous", i);
  if (rows == 0 || j.o.cols == 0) return 0;
  if (out->dtype == SERVD_BF16) {
    for (int i = 0; i < n_segs; i++) {
      if (!segs[i].ab || !segs[i].n) continue;
      servd_tensor *o = servd_tensor_narrow(out, 0, segs[i].first, segs[i].n);
      servd_tensor *xi = servd_tensor_narrow(x, 0, segs[i].first, segs[i].n);
      rc = o && xi ? lora_bf16(o, xi, segs[i].ab, segs[i].scale) : servd_fail(SERVD_ENOMEM, "lora: views");
      servd_tensor_release(o);
      servd_tensor_release(xi);
      if (rc) return rc;
    }
    return 0;
  }
  servd_isa isa = ops__isa();
  j.down = downs[isa];
  j.up = ups[isa];
  if (work < LORA_SERIAL_WORK || servd_threadpool_size() < 2) {
    rows_task(&j, 0, rows, 0);
  } else if (rows > LORA_COL_SPLIT_ROWS) {
    int64_t per_row = work / rows;
    int64_t grain = per_row >= LORA_SERIAL_WORK / 4 ? 1 : (LORA_SERIAL_WORK / 4) / per_row;
    servd_parallel_for(rows, grain, rows_task, &j);
  } else {
    float t[LORA_COL_SPLIT_ROWS * LORA_MAX_RANK];
    int32_t seg_of[LORA_COL_SPLIT_ROWS];
    int64_t row_of[LORA_COL_SPLIT_ROWS];
    for (int i = 0; i < n_segs; i++)
      for (int64_t r = 0; segs[i].ab && r < segs[i].n; r++, j.n_listed++) {
        const servd_lora_seg *s = &segs[i];
        int64_t row = s->first + r;
        seg_of[j.n_listed] = i;
        row_of[j.n_listed] = row;
        j.down(t + j.n_listed * LORA_MAX_RANK, (const float *)(j.x.data + row * j.x.stride), servd_tensor_data(s->ab),
               s->ab->dtype, s->ab->shape[0], j.k, ld_of(s->ab), s->scale);
      }
    j.t = t;
    j.seg_of = seg_of;
    j.row_of = row_of;
    int64_t chunks = (j.o.cols + LORA_COL_ALIGN - 1) / LORA_COL_ALIGN;
    servd_parallel_for(chunks, 2, cols_task, &j);
  }
  return 0;
}

int servd_lora(servd_tensor *out, const servd_tensor *x, const servd_tensor *ab, float scale) {
  int rc = servd__check_lora(out, x, ab, scale);
  if (rc) return rc;
  const servd_lora_seg seg = {0, out->shape[0], ab, scale};
  return servd_lora_sgmv(out, x, 1, &seg);
}
