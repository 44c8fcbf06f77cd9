/* Test driver: runs a package's causal-LM code through the interpreters exactly as the engine does
 * (servd_forward_batch over a paged KV cache, every tensor-parallel rank at once) and writes the
 * logits for every prompt position plus a greedy continuation, for comparison with the numpy
 * reference in test_llama.py.
 *
 *   llama_logits PKG OUT.bin --tokens 1,2,3 [--tp N] [--chunk C] [--decode K] [--block-size B]
 *                [--pair] [--lora DIR] [--lora2 DIR|-] [--kv-dtype f32|f16|bf16|q8_0|q4_0] [--keep-last R]
 *
 * --kv-dtype: the KV cache's dtype (default f32); --keep-last R: only the last R rows are kept and
 * written (long prompts: a row is vocab floats), n_rows then being R.
 *
 * OUT.bin: int32 n_rows, int32 vocab, then n_rows*vocab f32 (prompt rows, then one row per decoded
 * token), then int32 K and the K greedy ids. --pair runs a second copy of the sequence, one chunk
 * behind, in the same batches (mixed prefill/decode steps); its results must equal the first's.
 * --lora runs the first sequence with that PEFT adapter (batch.lora), --lora2 the second with its
 * own ("-": the base alone; default: the first's); with different adapters the two generate
 * different tokens, and each must equal its adapter's run alone.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/model_runner.h"
#include "mpk/lora.h"
#include "mpk/package.h"
#include "servd/interp.h"
#include "servd/threadpool.h"

#define MAX_TOK 8192

static int argmax_row(const float *x, int n) {
  int b = 0;
  for (int i = 1; i < n; i++)
    if (x[i] > x[b]) b = i;
  return b;
}

typedef struct seqst {
  int32_t tok[MAX_TOK];
  int n_tok, n_done;
  int32_t blocks[MAX_TOK];
  float *rows; /* logits of every computed position */
  int n_rows;
} seqst;

int main(int argc, char **argv) {
  if (servd_interp_early_init(argc, argv)) {
    fprintf(stderr, "early init: %s\n", servd_last_error());
    return 1;
  }
  if (argc < 3) {
    fprintf(stderr, "usage: llama_logits PKG OUT.bin --tokens a,b,c [--tp N] [--chunk C] [--decode K] [--pair]\n");
    return 2;
  }
  const char *pkg_path = argv[1], *out_path = argv[2];
  int tp = 1, chunk = 1 << 20, decode = 0, bs = 4, n_prompt = 0, keep_last = 0;
  servd_dtype kv_dtype = SERVD_F32;
  bool pair = false;
  const char *lora_path[2] = {NULL, NULL};
  bool lora2_set = false;
  int32_t prompt[MAX_TOK];
  for (int i = 3; i < argc; i++) {
    if (!strcmp(argv[i], "--tokens") && i + 1 < argc) {
      for (char *s = argv[++i]; *s && n_prompt < MAX_TOK;) {
        prompt[n_prompt++] = (int32_t)strtol(s, &s, 10);
        if (*s == ',') s++;
      }
    } else if (!strcmp(argv[i], "--tp") && i + 1 < argc) {
      tp = atoi(argv[++i]);
    } else if (!strcmp(argv[i], "--chunk") && i + 1 < argc) {
      chunk = atoi(argv[++i]);
    } else if (!strcmp(argv[i], "--decode") && i + 1 < argc) {
      decode = atoi(argv[++i]);
    } else if (!strcmp(argv[i], "--block-size") && i + 1 < argc) {
      bs = atoi(argv[++i]);
    } else if (!strcmp(argv[i], "--kv-dtype") && i + 1 < argc) {
      if (servd_dtype_from_name(argv[++i], &kv_dtype) != 0) {
        fprintf(stderr, "llama_logits: unknown dtype %s\n", argv[i]);
        return 2;
      }
    } else if (!strcmp(argv[i], "--keep-last") && i + 1 < argc) {
      keep_last = atoi(argv[++i]);
    } else if (!strcmp(argv[i], "--pair")) {
      pair = true;
    } else if (!strcmp(argv[i], "--lora") && i + 1 < argc) {
      lora_path[0] = argv[++i];
    } else if (!strcmp(argv[i], "--lora2") && i + 1 < argc) {
      lora_path[1] = strcmp(argv[++i], "-") ? argv[i] : NULL;
      lora2_set = true;
    } else {
      fprintf(stderr, "llama_logits: unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  if (n_prompt < 1 || tp < 1 || chunk < 1 || decode < 0 || n_prompt + decode > MAX_TOK / 2 || keep_last < 0 ||
      (keep_last > 0 && (pair || keep_last < decode + 1))) {
    fprintf(stderr, "llama_logits: bad arguments\n");
    return 2;
  }

  int status = 1;
  mpk_package *pkg = NULL;
  servd_comm *comm = NULL;
  servd_kv_cache *kv[SERVD_INTERP_MAX] = {0};
  servd_pool *pool = NULL;
  servd_runner *runner = NULL;
  mpk_lora *lora[2] = {NULL, NULL};
  servd_lora_group groups[2];
  if (!lora2_set) lora_path[1] = lora_path[0];
  seqst *S = calloc(2, sizeof *S);
  servd_threadpool_init(2);
  if (mpk_open(pkg_path, &pkg)) goto fail;
  json_t *cfg = mpk_config(pkg);
  int layers = (int)json_integer_value(json_object_get(cfg, "num_hidden_layers"));
  int heads = (int)json_integer_value(json_object_get(cfg, "num_attention_heads"));
  json_t *kvh = json_object_get(cfg, "num_key_value_heads");
  int kv_heads = kvh ? (int)json_integer_value(kvh) : heads;
  int dim = (int)json_integer_value(json_object_get(cfg, "hidden_size"));
  json_t *hdj = json_object_get(cfg, "head_dim");
  int head_dim = hdj ? (int)json_integer_value(hdj) : dim / heads;
  int vocab = (int)json_integer_value(json_object_get(cfg, "vocab_size"));
  int n_seq = pair ? 2 : 1;
  int total = n_prompt + decode;
  int blocks_per_seq = (total + bs - 1) / bs;
  int skip = keep_last > 0 && keep_last < total ? total - keep_last : 0; /* rows not kept */
  if (tp > 1 && servd_comm_create(&comm, tp)) goto fail;
  for (int r = 0; r < tp; r++)
    if (servd_kv_cache_create(&kv[r], layers, kv_heads / tp, head_dim, bs, blocks_per_seq * n_seq + 1, kv_dtype))
      goto fail;
  servd_pool_options po = {.n_interpreters = tp, .world_size = tp, .comm = comm};
  if (servd_pool_create(pkg, &po, &pool)) goto fail;
  if (servd_runner_create(pool, kv, tp, comm, &runner)) goto fail;
  if (lora_path[0] || lora_path[1]) {
    mpk_lora_base base;
    if (mpk_lora_base_of(pkg, &base)) goto fail;
    for (int s = 0; s < 2; s++)
      if (lora_path[s] && mpk_lora_load(lora_path[s], &base, &lora[s])) goto fail;
  }

  for (int s = 0; s < n_seq; s++) {
    memcpy(S[s].tok, prompt, sizeof(int32_t) * (size_t)n_prompt);
    S[s].n_tok = n_prompt;
    /* A scattered block table: the second sequence takes blocks in reverse order. */
    if (servd_kv_cache_alloc(kv[0], blocks_per_seq, S[s].blocks)) goto fail;
    if (s == 1)
      for (int i = 0; i < blocks_per_seq / 2; i++) {
        int32_t t = S[s].blocks[i];
        S[s].blocks[i] = S[s].blocks[blocks_per_seq - 1 - i];
        S[s].blocks[blocks_per_seq - 1 - i] = t;
      }
    S[s].rows = calloc((size_t)(total - skip) * vocab, sizeof(float));
    if (!S[s].rows) goto fail;
  }

  static int32_t tok[2 * MAX_TOK], pos[2 * MAX_TOK], slot[2 * MAX_TOK], lrows[2 * MAX_TOK];
  int32_t q_start[2], q_len[2], kv_len[2], which[2];
  const int32_t *tables[2];
  int32_t lrow_count[2];
  int n_groups = 0;
  /* Steps until every sequence has its prompt done and `decode` tokens generated. The second
   * sequence starts one step late, so steps mix its prefill with the first one's decode. */
  for (int stepno = 0;; stepno++) {
    int n = 0, ns = 0, nl = 0;
    n_groups = 0;
    for (int s = 0; s < n_seq; s++) {
      seqst *q = &S[s];
      if (s == 1 && stepno == 0) continue;
      if (q->n_done == total) continue;
      int need = q->n_tok - q->n_done;
      if (need == 0) continue;
      int c = need < chunk ? need : chunk;
      which[ns] = s;
      q_start[ns] = n;
      q_len[ns] = c;
      kv_len[ns] = q->n_done + c;
      tables[ns] = q->blocks;
      lrow_count[ns] = c;
      if (lora[s])
        groups[n_groups++] = (servd_lora_group){.first = n,
                                                .n = c,
                                                .id = s + 1,
                                                .scale = lora[s]->scale,
                                                .n_layers = lora[s]->n_layers,
                                                .ab = lora[s]->ab};
      for (int j = 0; j < c; j++) {
        int p = q->n_done + j;
        tok[n] = q->tok[p];
        pos[n] = p;
        slot[n] = q->blocks[p / bs] * bs + p % bs;
        lrows[nl++] = n;
        n++;
      }
      ns++;
    }
    if (ns == 0) break;
    servd_forward_batch b = {
        .n_tokens = n,
        .tokens = tok,
        .positions = pos,
        .slots = slot,
        .n_logit_rows = nl,
        .logit_rows = lrows,
        .attn = {.n_seqs = ns, .q_start = q_start, .q_len = q_len, .kv_len = kv_len, .block_tables = tables},
        .n_lora = n_groups,
        .lora = groups};
    servd_tensor *logits = NULL;
    servd_py_error err;
    memset(&err, 0, sizeof err);
    if (servd_runner_step(runner, &b, &logits, &err, NULL)) {
      fprintf(stderr, "forward: %s: %s\n%s\n", err.type, err.message, err.traceback);
      goto fail;
    }
    if (!logits || logits->shape[0] != nl || logits->shape[1] < vocab) {
      fprintf(stderr, "forward: bad logits shape\n");
      servd_tensor_release(logits);
      goto fail;
    }
    int row = 0;
    for (int i = 0; i < ns; i++) {
      seqst *q = &S[which[i]];
      for (int j = 0; j < lrow_count[i]; j++, row++) {
        const float *src = (const float *)((char *)servd_tensor_data(logits) + (size_t)row * logits->strides[0]);
        if (q->n_rows >= skip) memcpy(q->rows + (size_t)(q->n_rows - skip) * vocab, src, sizeof(float) * vocab);
        q->n_rows++;
      }
      q->n_done += q_len[i];
      if (q->n_done == q->n_tok && q->n_tok < total)
        q->tok[q->n_tok++] = argmax_row(q->rows + (size_t)(q->n_rows - 1 - skip) * vocab, vocab);
    }
    servd_tensor_release(logits);
  }
  bool same_adapter =
      lora_path[0] == lora_path[1] || (lora_path[0] && lora_path[1] && !strcmp(lora_path[0], lora_path[1]));
  if (pair && same_adapter && memcmp(S[0].tok, S[1].tok, sizeof(int32_t) * total)) {
    fprintf(stderr, "llama_logits: the paired sequence generated different tokens\n");
    goto fail;
  }
  FILE *f = fopen(out_path, "wb");
  if (!f) goto fail;
  int32_t hdr[2] = {S[0].n_rows - skip, vocab};
  fwrite(hdr, sizeof hdr, 1, f);
  fwrite(S[0].rows, sizeof(float), (size_t)(S[0].n_rows - skip) * vocab, f);
  int32_t k = decode;
  fwrite(&k, sizeof k, 1, f);
  fwrite(S[0].tok + n_prompt, sizeof(int32_t), (size_t)decode, f);
  if (pair) fwrite(S[1].rows, sizeof(float), (size_t)S[1].n_rows * vocab, f);
  fclose(f);
  status = 0;
fail:
  if (status) fprintf(stderr, "llama_logits: %s\n", servd_last_error());
  servd_runner_destroy(runner);
  mpk_lora_free(lora[0]);
  mpk_lora_free(lora[1]);
  servd_pool_destroy(pool);
  for (int r = 0; r < SERVD_INTERP_MAX; r++) servd_kv_cache_destroy(kv[r]);
  servd_comm_destroy(comm);
  mpk_close(pkg);
  for (int s = 0; S && s < 2; s++) free(S[s].rows);
  free(S);
  fflush(stdout);
  fflush(stderr);
  _exit(status); /* secondary namespaces' library destructors must not run (docs: interp) */
}
