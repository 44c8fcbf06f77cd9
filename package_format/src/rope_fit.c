/* Llama 3.1/3.2 GGUF files carry their rope scaling as per-dimension factors (rope_freqs.weight)
 * instead of metadata. servd's RoPE takes the four Llama 3 parameters, so the importer turns the
 * tensor back into them, and accepts only parameters that reproduce every factor: anything else
 * (learned or otherwise scaled frequencies) would run silently wrong. */
#include "rope_fit.h"

#include <math.h>
#include <stdbool.h>

#include "servd/status.h"

/* convert_hf_to_gguf.py (LlamaModel.generate_extra_tensors) in torch f32: freqs = 1 / base **
 * (arange(0, dim, 2) / dim); wavelen = 2*pi / freq; factor 1 below old/high, `factor` above
 * old/low, 1 / ((1 - smooth) / factor + smooth) between. Python scalar / tensor is reciprocal times
 * scalar in torch, and comparisons cast the scalar to f32: mirrored here. */
void mpk__llama3_rope_factors(const mpk_llama3_rope *r, double theta, int n, float *out) {
  const float two_pi = (float)(2.0 * M_PI), old = (float)r->original_max_positions;
  const float lo = (float)r->low_freq_factor, hi = (float)r->high_freq_factor, f = (float)r->factor;
  const float high_wl = (float)((double)r->original_max_positions / r->high_freq_factor);
  const float low_wl = (float)((double)r->original_max_positions / r->low_freq_factor);
  for (int i = 0; i < n; i++) {
    float e = (float)(2 * i) / (float)(2 * n);
    float freq = 1.0f / powf((float)theta, e);
    float wl = (1.0f / freq) * two_pi;
    if (wl < high_wl) out[i] = 1.0f;
    else if (wl > low_wl) out[i] = f;
    else {
      float smooth = ((1.0f / wl) * old - lo) / (hi - lo);
      out[i] = 1.0f / ((1.0f - smooth) / f + smooth);
    }
  }
}

static bool matches(const float *want, const float *got, int n) {
  for (int i = 0; i < n; i++)
    if (!(fabs((double)got[i] - (double)want[i]) <= 1e-6 * fabs((double)want[i]))) return false;
  return true;
}

int mpk__rope_fit_llama3(const char *what, const char *tensor, const float *ff, int n, double theta, uint32_t hint_orig,
                         mpk_llama3_rope *out) {
  if (n < 1 || n > 4096) return servd_fail(SERVD_EFORMAT, "%s: %s: %d values, expected 1..4096", what, tensor, n);
  float mx = ff[0], mn = ff[0];
  for (int i = 0; i < n; i++) {
    if (!isfinite(ff[i]) || ff[i] <= 0)
      return servd_fail(SERVD_EUNSUPPORTED, "%s: %s[%d] = %g: expected positive finite frequency factors", what, tensor,
                        i, (double)ff[i]);
    mx = ff[i] > mx ? ff[i] : mx;
    mn = ff[i] < mn ? ff[i] : mn;
  }
  if (mx == 1.0f && mn == 1.0f) { /* all 1: plain RoPE */
    *out = (mpk_llama3_rope){.factor = 1.0,
                             .low_freq_factor = 1.0,
                             .high_freq_factor = 4.0,
                             .original_max_positions = 8192};
    return 0;
  }
  if (mx > 1.0f) { /* Llama 3 factors grow from 1 (high frequencies) to `factor` (low ones) */
    static const uint32_t origs[] = {8192, 2048, 4096, 16384, 32768};
    static const double los[] = {1.0, 0.5, 2.0}, his[] = {4.0, 2.0, 8.0};
    float cand[4096];
    for (int o = -1; o < 5; o++) {
      uint32_t orig = o < 0 ? hint_orig : origs[o];
      if (!orig || (o >= 0 && orig == hint_orig)) continue;
      for (int l = 0; l < 3; l++)
        for (int h = 0; h < 3; h++) {
          mpk_llama3_rope r = {.factor = mx,
                               .low_freq_factor = los[l],
                               .high_freq_factor = his[h],
                               .original_max_positions = orig};
          mpk__llama3_rope_factors(&r, theta, n, cand);
          if (matches(ff, cand, n)) {
            *out = r;
            return 0;
          }
        }
    }
  }
  return servd_fail(SERVD_EUNSUPPORTED,
                    "%s: %s: %d per-dimension factors (min %g, max %g) that match no Llama-3 rope scaling; learned or "
                    "other RoPE frequencies are not supported",
                    what, tensor, n, (double)mn, (double)mx);
}
