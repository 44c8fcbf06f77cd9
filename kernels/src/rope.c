/* Rotary position embedding in place, both pair layouts, with Llama 3.1 frequency scaling or a
 * per-pair table of inverse frequencies (YaRN, LongRoPE: computed by the model code).
 *
 * Frequencies and angles follow Hugging Face transformers in f32: inv_freq_i = 1 / theta^(2i/d),
 * angle = inv_freq_i * (float)position, then cos/sin of that f32 angle (times attn_factor when set);
 * so a GGUF or HF model sees the same rotation as under PyTorch. */
#include "ops-impl.h"

#include <math.h>

#include "servd/threadpool.h"

#define ROPE_MAX_DIM 1024 /* keeps the per-row tables on the stack */

/* INTERLEAVED tables are expanded per element (cs = c0 c0 c1 c1 .., sn = -s0 s0 -s1 s1 ..) so that
 * out = x*cs + swap_pairs(x)*sn; HALF tables hold one entry per pair (head_dim/2). */
void servd__rope_row_scalar(float *x, int64_t n_heads, int head_dim, servd_rope_layout layout, const float *cs,
                            const float *sn) {
  int h = head_dim / 2;
  for (int64_t hd = 0; hd < n_heads; hd++, x += head_dim) {
    if (layout == SERVD_ROPE_HALF) {
      for (int i = 0; i < h; i++) {
        float a = x[i], b = x[i + h];
        x[i] = a * cs[i] - b * sn[i];
        x[i + h] = b * cs[i] + a * sn[i];
      }
    } else {
      for (int i = 0; i < head_dim; i += 2) {
        float a = x[i], b = x[i + 1];
        x[i] = a * cs[i] + b * sn[i];
        x[i + 1] = b * cs[i + 1] + a * sn[i + 1];
      }
    }
  }
}

/* Per-thread cache of the last frequency table: decode calls rope per layer per step with the same
 * parameters, so the pow() calls run once. */
typedef struct freq_cache {
  servd_rope_params p;
  bool valid;
  float inv[ROPE_MAX_DIM / 2];
} freq_cache;
static _Thread_local freq_cache tl_freq;

static const float *inv_freqs(const servd_rope_params *p) {
  freq_cache *fc = &tl_freq;
  if (fc->valid && memcmp(&fc->p, p, sizeof *p) == 0) return fc->inv;
  int d = p->head_dim;
  for (int i = 0; i < d / 2; i++) {
    float inv = 1.0f / powf(p->theta, (float)(2 * i) / (float)d);
    if (p->scaling_factor > 1.0f) { /* transformers _compute_llama3_parameters, in f32 */
      float old = (float)p->original_max_positions;
      float low_wl = old / p->low_freq_factor, high_wl = old / p->high_freq_factor;
      float wavelen = (float)(2.0 * M_PI) / inv;
      float llama = wavelen > low_wl ? inv / p->scaling_factor : inv;
      if (!(wavelen < high_wl) && !(wavelen > low_wl)) {
        float smooth = (old / wavelen - p->low_freq_factor) / (p->high_freq_factor - p->low_freq_factor);
        llama = (1.0f - smooth) * llama / p->scaling_factor + smooth * llama;
      }
      inv = llama;
    }
    fc->inv[i] = inv;
  }
  memcpy(&fc->p, p, sizeof *p); /* params are compared bytewise: copy padding too */
  fc->valid = true;
  return fc->inv;
}

typedef struct rope_job {
  char *x;
  int64_t stride, n_heads;
  const int32_t *pos;
  int64_t pos_stride;
  const servd_rope_params *p;
  const float *table; /* the model's inverse frequencies for this call, or NULL: from theta */
  float attn;         /* 1: cos and sin as they are */
  servd_isa isa;
} rope_job;

static void rope_task(void *ctx, int64_t begin, int64_t end, int thread) {
  (void)thread;
  static void (*const rot[SERVD_ISA_COUNT])(float *, int64_t, int, servd_rope_layout, const float *, const float *) = {
      servd__rope_row_scalar, servd__rope_row_avx2, servd__rope_row_avx512};
  const rope_job *j = ctx;
  const float *inv = j->table ? j->table : inv_freqs(j->p);
  const float attn = j->attn;
  int d = j->p->head_dim, h = d / 2;
  float cs[ROPE_MAX_DIM], sn[ROPE_MAX_DIM];
  for (int64_t r = begin; r < end; r++) {
    float pos = (float)*(const int32_t *)((const char *)j->pos + r * j->pos_stride);
    for (int i = 0; i < h; i++) {
      float a = inv[i] * pos, c = cosf(a), s = sinf(a);
      if (attn != 1.0f) c *= attn, s *= attn;
      if (j->p->layout == SERVD_ROPE_HALF) {
        cs[i] = c;
        sn[i] = s;
      } else {
        cs[2 * i] = cs[2 * i + 1] = c;
        sn[2 * i] = -s;
        sn[2 * i + 1] = s;
      }
    }
    rot[j->isa]((float *)(j->x + r * j->stride), j->n_heads, d, j->p->layout, cs, sn);
  }
}

int servd_rope(servd_tensor *x, const servd_tensor *positions, const servd_rope_params *p) {
  char bx[96], bp[96];
  const char *why = NULL;
  int64_t cols = 0;
  if (!p) {
    why = "params are NULL";
  } else if (p->layout != SERVD_ROPE_INTERLEAVED && p->layout != SERVD_ROPE_HALF) {
    why = "layout is neither interleaved nor half";
  } else if (p->head_dim < 2 || p->head_dim % 2 || p->head_dim > ROPE_MAX_DIM) {
    why = "head_dim must be even and in [2, 1024]";
  } else if (!(p->theta > 0.0f) || !isfinite(p->theta)) {
    why = "theta must be positive";
  } else if (p->scaling_factor > 1.0f && !(p->low_freq_factor > 0.0f && p->high_freq_factor > p->low_freq_factor &&
                                           p->original_max_positions > 0)) {
    why = "llama3 scaling needs 0 < low_freq_factor < high_freq_factor and original_max_positions > 0";
  } else if ((p->inv_freq || p->inv_freq_long) && (!p->inv_freq || p->head_dim > 2 * SERVD_ROPE_TABLE_MAX)) {
    why = "an inverse-frequency table needs inv_freq (inv_freq_long alone is not enough) and head_dim <= 512";
  } else if (p->inv_freq_long && p->long_from < 0) {
    why = "long_from must be >= 0";
  } else if (!(p->attn_factor >= 0.0f) || !isfinite(p->attn_factor)) {
    why = "attn_factor must be finite and >= 0 (0: none)";
  } else if (!x || x->dtype != SERVD_F32 || (x->ndim != 2 && x->ndim != 3)) {
    why = "x must be f32 (m, n_heads, head_dim) or (m, n_heads*head_dim)";
  } else if (x->ndim == 3 && (x->shape[2] != p->head_dim || x->strides[1] != x->shape[2] * 4)) {
    why = "x's last dim must equal head_dim, heads contiguous";
  } else if (x->ndim == 2 && x->shape[1] % p->head_dim != 0) {
    why = "x's columns must be a multiple of head_dim";
  } else if (!positions || positions->dtype != SERVD_I32 || positions->ndim != 1 ||
             positions->shape[0] != x->shape[0]) {
    why = "positions must be i32 (m) with m the rows of x";
  }
  int32_t max_pos = -1;
  if (!why) {
    cols = x->ndim == 3 ? x->shape[1] * x->shape[2] : x->shape[1];
    const char *pd = servd_tensor_data(positions);
    for (int64_t i = 0; i < positions->shape[0] && !why; i++) {
      int32_t v = *(const int32_t *)(pd + i * positions->strides[0]);
      if (v < 0) why = "positions must be >= 0";
      if (v > max_pos) max_pos = v;
    }
  }
  if (why)
    return servd_fail(SERVD_EINVAL, "rope: %s; got x %s, positions %s, head_dim %d", why, ops__desc(x, bx, sizeof bx),
                      ops__desc(positions, bp, sizeof bp), p ? p->head_dim : 0);
  rope_job j = {.x = servd_tensor_data(x),
                .stride = x->strides[0],
                .n_heads = cols / p->head_dim,
                .pos = servd_tensor_data(positions),
                .pos_stride = positions->strides[0],
                .p = p,
                .table = p->inv_freq_long && max_pos >= p->long_from ? p->inv_freq_long : p->inv_freq,
                .attn = p->attn_factor > 0.0f ? p->attn_factor : 1.0f,
                .isa = ops__isa()};
  if (x->shape[0] == 0 || cols == 0) return 0;
  int64_t grain = cols >= 8192 ? 1 : 8192 / cols;
  servd_parallel_for(x->shape[0], grain, rope_task, &j);
  return 0;
}
