/* Benchmark (not a test): decode steps with LoRA adapters against the base alone, through the runner
 * (no HTTP, no scheduler), the two back to back in every round (order swapped round by round),
 * medians of the rounds' own ratios:
 *   batch 1: one sequence with the first adapter (its steps replay a captured plan, as the base's);
 *   batch B: B sequences in groups of B/n over the n adapters given (every step mixes them).
 *
 *   lora_bench PKG --lora DIR [--lora DIR]... [--threads N] [--rounds R] [--steps S] [--batch B]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/model_runner.h"
#include "mpk/lora.h"
#include "mpk/package.h"
#include "servd/bench-util.h"
#include "servd/interp.h"
#include "servd/threadpool.h"

#define BLOCK 16
#define MAX_ADAPTERS 8

typedef struct side {
  servd_pool *pool;
  servd_kv_cache *kv;
  servd_runner *rn;
  int32_t *blocks;
  int per_seq;
} side;

static int side_open(side *s, mpk_package *p, int L, int KV, int HD, int batch, int steps) {
  memset(s, 0, sizeof *s);
  s->per_seq = (steps + BLOCK - 1) / BLOCK;
  servd_pool_options po = {.n_interpreters = 1, .world_size = 1};
  int n_blocks = batch * s->per_seq;
  if (servd_kv_cache_create(&s->kv, L, KV, HD, BLOCK, n_blocks, SERVD_F16) || servd_pool_create(p, &po, &s->pool) ||
      servd_runner_create(s->pool, &s->kv, 1, NULL, &s->rn))
    return -1;
  s->blocks = malloc(sizeof(int32_t) * (size_t)n_blocks);
  return s->blocks ? servd_kv_cache_alloc(s->kv, n_blocks, s->blocks) : -1;
}

static void side_close(side *s) {
  servd_runner_destroy(s->rn);
  servd_pool_destroy(s->pool);
  servd_kv_cache_destroy(s->kv);
  free(s->blocks);
}

/* Seconds per decode step of `batch` sequences (steps 1..steps-1), the rows in n_groups groups of
 * the adapters (0: the base alone). */
static double decode(side *s, int batch, int steps, mpk_lora *const *ad, int n_groups) {
  int32_t tok[256], pos[256], slot[256], row[256], qs[256], ql[256], kl[256];
  const int32_t *tables[256];
  servd_lora_group groups[MAX_ADAPTERS];
  for (int g = 0; g < n_groups; g++)
    groups[g] = (servd_lora_group){.first = g * (batch / n_groups),
                                   .n = g == n_groups - 1 ? batch - g * (batch / n_groups) : batch / n_groups,
                                   .id = g + 1,
                                   .scale = ad[g]->scale,
                                   .n_layers = ad[g]->n_layers,
                                   .ab = ad[g]->ab};
  for (int q = 0; q < batch; q++) tables[q] = s->blocks + q * s->per_seq;
  servd_forward_batch b = {.n_tokens = batch,
                           .tokens = tok,
                           .positions = pos,
                           .slots = slot,
                           .n_logit_rows = batch,
                           .logit_rows = row,
                           .attn = {.n_seqs = batch, .q_start = qs, .q_len = ql, .kv_len = kl, .block_tables = tables},
                           .n_lora = n_groups,
                           .lora = groups};
  double t0 = 0;
  for (int i = 0; i < steps; i++) {
    if (i == 1) t0 = bench_now_s();
    for (int q = 0; q < batch; q++) {
      tok[q] = 100 + (q * 131 + i * 17) % 4000;
      pos[q] = i;
      slot[q] = tables[q][i / BLOCK] * BLOCK + i % BLOCK;
      row[q] = qs[q] = q;
      ql[q] = 1;
      kl[q] = i + 1;
    }
    servd_tensor *lg = NULL;
    servd_py_error err;
    if (servd_runner_step(s->rn, &b, &lg, &err, NULL)) {
      fprintf(stderr, "step: %s %s %s\n", err.type, err.message, servd_last_error());
      return -1;
    }
    servd_tensor_release(lg);
  }
  return (bench_now_s() - t0) / (steps - 1);
}

int main(int argc, char **argv) {
  if (servd_interp_early_init(argc, argv)) return 1;
  const char *pkg = argc > 1 ? argv[1] : NULL, *paths[MAX_ADAPTERS];
  int n_ad = 0, threads = 2, rounds = 7, steps = 48, big = 32;
  for (int i = 2; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--lora") && n_ad < MAX_ADAPTERS) paths[n_ad++] = argv[i + 1];
    else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--rounds")) rounds = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--steps")) steps = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--batch")) big = atoi(argv[i + 1]);
  }
  if (!pkg || !n_ad || rounds < 2 || rounds > 50 || steps < 4 || big < n_ad || big > 256) {
    fprintf(stderr, "usage: lora_bench PKG --lora DIR [--lora DIR]... [--threads N] [--rounds R] [--steps S] "
                    "[--batch B]\n");
    return 2;
  }
  servd_threadpool_init(threads);
  mpk_package *p = NULL;
  mpk_lora_base base;
  mpk_lora *ad[MAX_ADAPTERS] = {0};
  json_t *cfg;
  if (mpk_open(pkg, &p) || !(cfg = mpk_config(p)) || mpk_lora_base_of(p, &base)) {
    fprintf(stderr, "%s: %s\n", pkg, servd_last_error());
    return 1;
  }
  for (int a = 0; a < n_ad; a++)
    if (mpk_lora_load(paths[a], &base, &ad[a])) {
      fprintf(stderr, "%s\n", servd_last_error());
      return 1;
    }
  int L = (int)json_integer_value(json_object_get(cfg, "num_hidden_layers"));
  int H = (int)json_integer_value(json_object_get(cfg, "num_attention_heads"));
  json_t *kvj = json_object_get(cfg, "num_key_value_heads"), *hdj = json_object_get(cfg, "head_dim");
  int KV = kvj ? (int)json_integer_value(kvj) : H;
  int D = (int)json_integer_value(json_object_get(cfg, "hidden_size"));
  int HD = hdj ? (int)json_integer_value(hdj) : D / H;
  side sides[2][2]; /* [batch 1, big][base, lora] */
  for (int b = 0; b < 2; b++)
    for (int l = 0; l < 2; l++)
      if (side_open(&sides[b][l], p, L, KV, HD, b ? big : 1, steps)) {
        fprintf(stderr, "setup: %s\n", servd_last_error());
        return 1;
      }
  double *ratio[2], *sec[2][2];
  for (int b = 0; b < 2; b++) {
    ratio[b] = calloc((size_t)rounds, sizeof(double));
    for (int l = 0; l < 2; l++) sec[b][l] = calloc((size_t)rounds, sizeof(double));
  }
  for (int r = 0; r < rounds; r++)
    for (int b = 0; b < 2; b++) {
      int batch = b ? big : 1;
      for (int i = 0; i < 2; i++) {
        int l = (i + r) % 2; /* base first in even rounds, LoRA first in odd ones */
        sec[b][l][r] = decode(&sides[b][l], batch, steps, ad, l ? (b ? n_ad : 1) : 0);
        if (sec[b][l][r] < 0) return 1;
      }
      ratio[b][r] = sec[b][0][r] / sec[b][1][r];
      fprintf(stderr, "round %d, batch %d: base %.1f tok/s, LoRA %.1f tok/s, %.3fx\n", r, batch, batch / sec[b][0][r],
              batch / sec[b][1][r], ratio[b][r]);
    }
  int n = rounds - 1; /* round 0 captures the plans */
  printf("threads %d, %d rounds of %d decode steps, adapters of rank %d (medians of rounds 2..%d)\n", threads, rounds,
         steps, ad[0]->rank, rounds);
  for (int b = 0; b < 2; b++) {
    int batch = b ? big : 1;
    double tb = batch / bench_median(sec[b][0] + 1, n), tl = batch / bench_median(sec[b][1] + 1, n);
    printf("batch %d (%s): base %.1f tok/s, LoRA %.1f tok/s, LoRA/base per-round median %.3fx\n", batch,
           b ? "groups over every adapter" : "one adapter", tb, tl, bench_median(ratio[b] + 1, n));
  }
  for (int b = 0; b < 2; b++)
    for (int l = 0; l < 2; l++) side_close(&sides[b][l]);
  for (int a = 0; a < n_ad; a++) mpk_lora_free(ad[a]);
  mpk_close(p);
  return 0;
}
