/* q2_k, q3_k, iq4_nl and iq4_xs rows (servd/blocks.h): dequantization as ggml's dequantize_row_*
 * (tested against gguf-py's gguf.quants), quantization by plain rounding to each type's grid (ggml's
 * quantizers search scales harder; GGUF tensors of these types arrive quantized and are kept). */
#include <math.h>
#include <string.h>

#include "convert-impl.h"
#include "servd/blocks.h"

/* Float to int; NaN and infinities (undefined in C) become 0. */
static inline int to_int(float v) { return v > -65536.0f && v < 65536.0f ? (int)v : 0; }
static inline int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

void servd__q2_k_to_f32(const void *src, float *y, int64_t nb) {
  const servd_block_q2_k *b = src;
  for (int64_t i = 0; i < nb; i++, b++, y += SERVD_QK_K) {
    const float d = servd_f16_to_f32(b->d), dmin = servd_f16_to_f32(b->dmin);
    for (int e = 0; e < SERVD_QK_K; e++) {
      const int n = e / 128, j = (e % 128) / 32, l = e % 32, sc = b->scales[e / 16];
      const int q = (b->qs[32 * n + l] >> (2 * j)) & 3;
      y[e] = d * (float)(sc & 0xF) * (float)q - dmin * (float)(sc >> 4);
    }
  }
}

void servd__q3_k_to_f32(const void *src, float *y, int64_t nb) {
  const servd_block_q3_k *b = src;
  for (int64_t i = 0; i < nb; i++, b++, y += SERVD_QK_K) {
    const float d = servd_f16_to_f32(b->d);
    for (int e = 0; e < SERVD_QK_K; e++) {
      const int n = e / 128, j = (e % 128) / 32, l = e % 32;
      const int q = ((b->qs[32 * n + l] >> (2 * j)) & 3) - ((b->hmask[l] >> (4 * n + j)) & 1 ? 0 : 4);
      y[e] = d * (float)(servd_k3_scale(b->scales, e / 16) - 32) * (float)q;
    }
  }
}

void servd__iq4_nl_to_f32(const void *src, float *y, int64_t nb) {
  const servd_block_iq4_nl *b = src;
  for (int64_t i = 0; i < nb; i++, b++, y += SERVD_QK) {
    const float d = servd_f16_to_f32(b->d);
    for (int j = 0; j < SERVD_QK / 2; j++) {
      y[j] = d * (float)servd_iq4_values[b->qs[j] & 0xF];
      y[j + SERVD_QK / 2] = d * (float)servd_iq4_values[b->qs[j] >> 4];
    }
  }
}

void servd__iq4_xs_to_f32(const void *src, float *y, int64_t nb) {
  const servd_block_iq4_xs *b = src;
  for (int64_t i = 0; i < nb; i++, b++) {
    const float d = servd_f16_to_f32(b->d);
    for (int ib = 0; ib < 8; ib++, y += 32) {
      const float dl = d * (float)(servd_iq4xs_scale(b, ib) - 32);
      const uint8_t *qs = b->qs + 16 * ib;
      for (int j = 0; j < 16; j++) {
        y[j] = dl * (float)servd_iq4_values[qs[j] & 0xF];
        y[j + 16] = dl * (float)servd_iq4_values[qs[j] >> 4];
      }
    }
  }
}

/* The code whose table value is nearest v (in units of the block scale). */
static int iq4_nearest(float v) {
  int best = 0;
  float err = INFINITY;
  for (int c = 0; c < 16; c++) {
    const float e = fabsf(v - (float)servd_iq4_values[c]);
    if (e < err) {
      err = e;
      best = c;
    }
  }
  return best;
}

/* n values (a multiple of 32) with scale dl into iq4 codes, q4_0's nibble order per 32. */
static void iq4_codes(const float *x, float dl, uint8_t *qs, int n) {
  const float id = dl != 0.0f && isfinite(dl) ? 1.0f / dl : 0.0f;
  for (int k = 0; k < n / 32; k++)
    for (int j = 0; j < 16; j++)
      qs[16 * k + j] = (uint8_t)(iq4_nearest(x[32 * k + j] * id) | iq4_nearest(x[32 * k + j + 16] * id) << 4);
}

/* The element of largest magnitude, sign kept. */
static float signed_absmax(const float *x, int n) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < n; j++) {
    if (amax < fabsf(x[j])) {
      amax = fabsf(x[j]);
      max = x[j];
    }
  }
  return max;
}

void servd__iq4_nl_from_f32(const float *x, void *dst, int64_t nb) {
  servd_block_iq4_nl *y = dst;
  for (int64_t i = 0; i < nb; i++, x += SERVD_QK, y++) {
    y->d = servd_f32_to_f16(signed_absmax(x, SERVD_QK) / (float)servd_iq4_values[0]);
    iq4_codes(x, servd_f16_to_f32(y->d), y->qs, SERVD_QK);
  }
}

void servd__iq4_xs_from_f32(const float *x, void *dst, int64_t nb) {
  servd_block_iq4_xs *y = dst;
  for (int64_t i = 0; i < nb; i++, x += SERVD_QK_K, y++) {
    float s[8], amax = 0.0f;
    for (int ib = 0; ib < 8; ib++) {
      s[ib] = signed_absmax(x + 32 * ib, 32) / (float)servd_iq4_values[0];
      amax = fmaxf(amax, fabsf(s[ib]));
    }
    y->d = servd_f32_to_f16(amax / 32.0f); /* scales ls - 32 in -32..31 */
    const float d = servd_f16_to_f32(y->d);
    y->scales_h = 0;
    memset(y->scales_l, 0, sizeof y->scales_l);
    for (int ib = 0; ib < 8; ib++) {
      const int ls = d > 0 ? clampi(to_int(roundf(s[ib] / d)), -32, 31) + 32 : 32;
      y->scales_l[ib / 2] |= (uint8_t)((ls & 0xF) << (4 * (ib % 2)));
      y->scales_h |= (uint16_t)((ls >> 4) << (2 * ib));
      iq4_codes(x + 32 * ib, d * (float)(ls - 32), y->qs + 16 * ib, 32);
    }
  }
}

void servd__q2_k_from_f32(const float *x, void *dst, int64_t nb) {
  servd_block_q2_k *y = dst;
  for (int64_t i = 0; i < nb; i++, x += SERVD_QK_K, y++) {
    float scale[16], min[16], max_scale = 0.0f, max_min = 0.0f;
    for (int g = 0; g < 16; g++) {
      float mn = 0.0f, mx = -INFINITY;
      for (int l = 0; l < 16; l++) {
        mn = fminf(mn, x[16 * g + l]);
        mx = fmaxf(mx, x[16 * g + l]);
      }
      scale[g] = (mx - mn) / 3.0f;
      min[g] = -mn;
      max_scale = fmaxf(max_scale, scale[g]);
      max_min = fmaxf(max_min, min[g]);
    }
    y->d = servd_f32_to_f16(max_scale / 15.0f);
    y->dmin = servd_f32_to_f16(max_min / 15.0f);
    const float d = servd_f16_to_f32(y->d), dmin = servd_f16_to_f32(y->dmin);
    memset(y->qs, 0, sizeof y->qs);
    for (int g = 0; g < 16; g++) {
      const int ls = d > 0 ? clampi(to_int(roundf(scale[g] / d)), 0, 15) : 0;
      const int lm = dmin > 0 ? clampi(to_int(roundf(min[g] / dmin)), 0, 15) : 0;
      y->scales[g] = (uint8_t)(ls | lm << 4);
      const float dl = d * (float)ls, ml = dmin * (float)lm;
      for (int l = 0; l < 16; l++) {
        const int e = 16 * g + l;
        const int q = dl > 0 ? clampi(to_int(roundf((x[e] + ml) / dl)), 0, 3) : 0;
        y->qs[32 * (e / 128) + e % 32] |= (uint8_t)(q << (2 * ((e % 128) / 32)));
      }
    }
  }
}

void servd__q3_k_from_f32(const float *x, void *dst, int64_t nb) {
  servd_block_q3_k *y = dst;
  for (int64_t i = 0; i < nb; i++, x += SERVD_QK_K, y++) {
    float scale[16], max_scale = 0.0f;
    for (int g = 0; g < 16; g++) {
      scale[g] = signed_absmax(x + 16 * g, 16) / -4.0f; /* q in -4..3, the largest magnitude at -4 */
      max_scale = fmaxf(max_scale, fabsf(scale[g]));
    }
    y->d = servd_f32_to_f16(max_scale / 32.0f);
    const float d = servd_f16_to_f32(y->d);
    memset(y->hmask, 0, sizeof y->hmask);
    memset(y->qs, 0, sizeof y->qs);
    memset(y->scales, 0, sizeof y->scales);
    for (int g = 0; g < 16; g++) {
      const int ls = d > 0 ? clampi(to_int(roundf(scale[g] / d)), -32, 31) : 0;
      const int s = ls + 32;
      y->scales[g % 8] |= (uint8_t)((s & 0xF) << (4 * (g / 8)));
      y->scales[8 + g % 4] |= (uint8_t)((s >> 4) << (2 * (g / 4)));
      const float dl = d * (float)ls;
      for (int l = 0; l < 16; l++) {
        const int e = 16 * g + l, n = e / 128, j = (e % 128) / 32;
        const int q = dl != 0.0f ? clampi(to_int(roundf(x[e] / dl)), -4, 3) + 4 : 4;
        y->qs[32 * n + e % 32] |= (uint8_t)((q & 3) << (2 * j));
        y->hmask[e % 32] |= (uint8_t)((q >> 2) << (4 * n + j));
      }
    }
  }
}
