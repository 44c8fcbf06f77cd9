/* Embedding pooling and prompt logprobs: see step_rows.h. */
#include "engine/step_rows.h"

#include <math.h>
#include <string.h>

#include "servd/status.h"

int servd_embedding_info_read(json_t *cfg, int hidden_size, servd_embedding_info *out) {
  memset(out, 0, sizeof *out);
  out->dim = hidden_size;
  json_t *p = json_object_get(cfg, "pooling");
  const char *mode = json_is_string(p) ? json_string_value(p) : "last";
  if (p && !json_is_string(p) && !json_is_null(p))
    return servd_fail(SERVD_EFORMAT, "model config: \"pooling\" must be a string (last, mean or cls)");
  if (!strcmp(mode, "last")) out->pooling = SERVD_POOL_LAST;
  else if (!strcmp(mode, "mean")) out->pooling = SERVD_POOL_MEAN;
  else if (!strcmp(mode, "cls")) out->pooling = SERVD_POOL_CLS;
  else return servd_fail(SERVD_EFORMAT, "model config: \"pooling\" is \"%s\": expected last, mean or cls", mode);
  out->truncatable = json_is_array(json_object_get(cfg, "matryoshka_dimensions"));
  out->bidirectional = json_is_false(json_object_get(cfg, "is_causal"));
  return 0;
}

int servd_score_info_read(json_t *cfg, int n_labels, servd_embedding_info *out) {
  out->n_labels = n_labels;
  out->activation = n_labels == 1 ? SERVD_SCORE_SIGMOID : SERVD_SCORE_IDENTITY;
  json_t *st = json_object_get(json_object_get(cfg, "sentence_transformers"), "activation_fn");
  const char *key = "sentence_transformers.activation_fn";
  if (!json_is_string(st)) {
    st = json_object_get(cfg, "sbert_ce_default_activation_function");
    key = "sbert_ce_default_activation_function";
  }
  if (!json_is_string(st)) return 0;
  /* torch's qualified names, e.g. torch.nn.modules.activation.Sigmoid: the class name decides */
  const char *fn = json_string_value(st), *dot = strrchr(fn, '.');
  const char *cls = dot ? dot + 1 : fn;
  if (!strcmp(cls, "Sigmoid")) out->activation = SERVD_SCORE_SIGMOID;
  else if (!strcmp(cls, "Identity")) out->activation = SERVD_SCORE_IDENTITY;
  else if (!strcmp(cls, "Tanh")) out->activation = SERVD_SCORE_TANH;
  else
    return servd_fail(SERVD_EUNSUPPORTED, "model config: %s \"%.200s\": expected Sigmoid, Identity or Tanh", key, fn);
  return 0;
}

void servd_scores_finish(const float *raw, int n, servd_score_activation act, float *out) {
  for (int i = 0; i < n; i++) {
    double x = raw[i];
    out[i] = (float)(act == SERVD_SCORE_SIGMOID ? 1.0 / (1.0 + exp(-x)) : act == SERVD_SCORE_TANH ? tanh(x) : x);
  }
}

void servd_pool_sum_reset(servd_pool_sum *p) {
  if (p->sum) memset(p->sum, 0, sizeof(float) * (size_t)p->dim);
  p->n = 0;
}

void servd_pool_sum_add(servd_pool_sum *p, const float *row) {
  for (int i = 0; i < p->dim; i++) p->sum[i] += row[i];
  p->n++;
}

void servd_pool_sum_finish(const servd_pool_sum *p, int dims, float *out) {
  int n = dims > 0 && dims < p->dim ? dims : p->dim;
  double ss = 0;
  for (int i = 0; i < n; i++) ss += (double)p->sum[i] * p->sum[i];
  /* The mean's scale cancels in the normalization: only the direction is kept. */
  double inv = ss > 0 ? 1.0 / sqrt(ss) : 0;
  for (int i = 0; i < n; i++) out[i] = (float)(p->sum[i] * inv);
}

/* a ranks before b: higher logit, then lower id. */
static int better(float la, int32_t a, float lb, int32_t b) { return la > lb || (la == lb && a < b); }

float servd_row_logprob(const float *row, int n_vocab, int32_t token, int n_top, servd_top_logprob *top) {
  float mx = -INFINITY;
  for (int i = 0; i < n_vocab; i++)
    if (row[i] > mx) mx = row[i];
  double s = 0;
  for (int i = 0; i < n_vocab; i++) s += exp((double)row[i] - mx);
  double lse = mx + log(s);
  int k = 0;
  for (int i = 0; i < n_vocab && n_top > 0; i++) {
    float l = row[i];
    if (k == n_top && !better(l, i, top[k - 1].logprob, top[k - 1].token)) continue;
    int j = k < n_top ? k++ : k - 1; /* insertion into the sorted best n_top */
    while (j > 0 && better(l, i, top[j - 1].logprob, top[j - 1].token)) {
      top[j] = top[j - 1];
      j--;
    }
    top[j] = (servd_top_logprob){.token = i, .logprob = l};
  }
  for (int j = 0; j < k; j++) top[j].logprob = (float)(top[j].logprob - lse);
  return (float)(row[token] - lse);
}
