/* The engine's bridge to token sampling.
 *
 * Greedy decoding and the log-probabilities are computed here; the full sampling chain (penalties,
 * temperature, top-k/top-p/min-p, seeds) is the sampler's job. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_impl.h"
#include "engine/sampling.h"

int servd_engine_sampling_init(servd_model *m) {
  m->probs = malloc(sizeof(float) * (size_t)m->vocab);
  m->top = malloc(sizeof(servd_top_logprob) * 21);
  if (!m->probs || !m->top) return servd_fail(SERVD_ENOMEM, "sampling: buffers for a vocabulary of %d", m->vocab);
  return 0;
}

void servd_engine_sampling_free(servd_model *m) {
  free(m->probs);
  free(m->top);
  m->probs = NULL;
  m->top = NULL;
}

static uint64_t next_rand(uint64_t *s) { /* splitmix64: same seed, same stream */
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

int servd_engine_sample(servd_model *m, servd_request *r, const float *logits, servd_sample_result *out) {
  int n = m->vocab;
  const servd_gen_params *p = &r->p;
  int best = 0;
  float mx = logits[0];
  for (int i = 1; i < n; i++)
    if (logits[i] > mx) {
      mx = logits[i];
      best = i;
    }
  double sum = 0;
  for (int i = 0; i < n; i++) sum += exp((double)logits[i] - mx);
  double lse = mx + log(sum);
  int32_t tok = best;
  if (p->temperature > 0) {
    /* Plain temperature sampling over the full distribution. */
    double t = p->temperature, z = 0;
    for (int i = 0; i < n; i++) {
      m->probs[i] = (float)exp(((double)logits[i] - mx) / t);
      z += m->probs[i];
    }
    double u = (double)(next_rand(&r->rng) >> 11) / 9007199254740992.0 * z, acc = 0;
    tok = n - 1;
    for (int i = 0; i < n; i++) {
      acc += m->probs[i];
      if (acc > u) {
        tok = i;
        break;
      }
    }
  }
  out->token = tok;
  out->logprob = (float)(logits[tok] - lse);
  out->top = m->top;
  out->n_top = 0;
  int k = p->logprobs > 20 ? 20 : p->logprobs;
  for (int i = 0; i < n && k > 0; i++) { /* insertion into a descending list of k */
    float lp = (float)(logits[i] - lse);
    int j = out->n_top < k ? out->n_top++ : k;
    if (j == k && lp <= m->top[k - 1].logprob) continue;
    if (j == k) j = k - 1;
    while (j > 0 && m->top[j - 1].logprob < lp) {
      m->top[j] = m->top[j - 1];
      j--;
    }
    m->top[j].token = i;
    m->top[j].logprob = lp;
  }
  return 0;
}
