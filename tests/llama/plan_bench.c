/* Benchmark (not a test): decode steps replayed from step plans (the serial walk unfused and with
 * its fusions, plan_fuse.c; the parallel executor) against the same steps through Python, at batch 1
 * and at a larger batch, with the anchors measured in the same run: the 2-thread
 * streaming read rate of a buffer far beyond L3 (the batch-1 roofline: read rate / weight bytes) and
 * llama.cpp's llama-bench on the same GGUF. The modes run one after the other in each round, in an
 * order rotated round by round, so that all see the same machine load; medians over rounds (the
 * first, which captures, is left out), and the median of each round's own fused/unfused ratio. The replayed
 * logits are compared with those through Python bit for bit.
 *
 *   plan_bench PKG [--gguf FILE --llama-bench BIN] [--threads N] [--rounds R] [--steps S] [--batch B]
 *              [--fuse KINDS]   (the fused mode's SERVD_PLAN_FUSE: "on", or e.g. "rope_kv")
 */
#include <immintrin.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/model_runner.h"
#include "mpk/package.h"
#include "servd/bench-util.h"
#include "servd/interp.h"
#include "servd/threadpool.h"

/* ---- the read roofline ---------------------------------------------------------------------------- */
#define CHUNK (1 << 20)
typedef struct read_job {
  const char *buf;
  double sink[256];
} read_job;

__attribute__((target("avx2"))) static void read_chunks(void *ctx, int64_t begin, int64_t end, int thread) {
  read_job *j = ctx;
  __m256i acc = _mm256_setzero_si256();
  for (int64_t c = begin; c < end; c++) {
    const __m256i *p = (const __m256i *)(j->buf + c * CHUNK);
    for (size_t i = 0; i < CHUNK / 32; i += 4)
      acc = _mm256_add_epi64(
          acc, _mm256_xor_si256(_mm256_xor_si256(_mm256_load_si256(p + i), _mm256_load_si256(p + i + 1)),
                                _mm256_xor_si256(_mm256_load_si256(p + i + 2), _mm256_load_si256(p + i + 3))));
  }
  j->sink[thread & 255] += (double)_mm256_extract_epi64(acc, 0);
}

/* GB/s of reading `bytes` once with the compute pool's threads. */
static double read_rate(const char *buf, size_t bytes) {
  read_job j = {.buf = buf};
  double t0 = bench_now_s();
  servd_parallel_for((int64_t)(bytes / CHUNK), 1, read_chunks, &j);
  return (double)bytes / (bench_now_s() - t0) / 1e9;
}

/* ---- llama-bench ---------------------------------------------------------------------------------- */
static double llama_tg(const char *bin, const char *gguf, int threads, int n) {
  if (!bin || !gguf) return -1;
  char cmd[4096];
  snprintf(cmd, sizeof cmd, "'%s' -m '%s' -t %d -p 0 -n %d -r 5 -o csv 2>/dev/null", bin, gguf, threads, n);
  FILE *f = popen(cmd, "r");
  if (!f) return -1;
  char line[8192];
  int col_n = -1, col_ts = -1;
  double tg = -1;
  while (fgets(line, sizeof line, f)) {
    char *save = NULL, *tok = strtok_r(line, ",", &save);
    bool header = col_ts < 0;
    long ng = -1;
    double ts = -1;
    for (int i = 0; tok; tok = strtok_r(NULL, ",", &save), i++) {
      char *v = tok + (*tok == '"');
      char *q = strchr(v, '"');
      if (q) *q = 0;
      if (header) {
        if (!strcmp(v, "n_gen")) col_n = i;
        else if (!strcmp(v, "avg_ts")) col_ts = i;
      } else if (i == col_n) ng = atol(v);
      else if (i == col_ts) ts = atof(v);
    }
    if (!header && ng > 0) tg = ts;
  }
  pclose(f);
  return tg;
}

/* ---- decode steps through a runner ---------------------------------------------------------------- */
#define BLOCK 16
typedef struct side {
  const char *exec; /* SERVD_PLAN_EXEC at its captures */
  const char *fuse; /* SERVD_PLAN_FUSE at its captures */
  servd_pool *pool;
  servd_kv_cache *kv;
  servd_runner *rn;
  int32_t *blocks; /* [batch][per_seq] */
  int per_seq;
} side;

static int side_open(side *s, mpk_package *p, int L, int KV, int HD, int batch, int steps, bool plans) {
  memset(s, 0, sizeof *s);
  s->per_seq = (steps + BLOCK - 1) / BLOCK;
  if (plans) unsetenv("SERVD_PLANS");
  else setenv("SERVD_PLANS", "off", 1);
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

/* Seconds per decode step of `batch` sequences over positions 1..steps-1 (position 0 first); the
 * last step's logits into last (vocab * batch floats). */
static double decode(side *s, int batch, int steps, float *last, size_t last_n) {
  setenv("SERVD_PLAN_EXEC", s->exec ? s->exec : "serial", 1);
  setenv("SERVD_PLAN_FUSE", s->fuse ? s->fuse : "on", 1);
  int32_t tok[256], pos[256], slot[256], row[256], qs[256], ql[256], kl[256];
  const int32_t *tables[256];
  for (int q = 0; q < batch; q++) tables[q] = s->blocks + q * s->per_seq;
  servd_forward_batch b = {.n_tokens = batch,
                           .tokens = tok,
                           .positions = pos,
                           .slots = slot,
                           .n_logit_rows = batch,
                           .logit_rows = row,
                           .attn = {.n_seqs = batch, .q_start = qs, .q_len = ql, .kv_len = kl, .block_tables = tables}};
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
    if (i == steps - 1 && lg) memcpy(last, servd_tensor_data(lg), sizeof(float) * last_n);
    servd_tensor_release(lg);
  }
  return (bench_now_s() - t0) / (steps - 1);
}

int main(int argc, char **argv) {
  if (servd_interp_early_init(argc, argv)) return 1;
  if (argc < 2) {
    fprintf(stderr, "usage: plan_bench PKG [--gguf FILE --llama-bench BIN] [--threads N] [--rounds R] [--steps S] "
                    "[--batch B] [--fuse KINDS]\n");
    return 2;
  }
  const char *pkg = argv[1], *gguf = NULL, *lb = NULL, *fuse = "on"; /* --fuse: SERVD_PLAN_FUSE of the fused mode */
  int threads = 2, rounds = 7, steps = 48, big = 32;
  for (int i = 2; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--gguf")) gguf = argv[i + 1];
    else if (!strcmp(argv[i], "--llama-bench")) lb = argv[i + 1];
    else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--rounds")) rounds = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--steps")) steps = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--batch")) big = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--fuse")) fuse = argv[i + 1];
  }
  if (rounds < 2 || rounds > 50 || steps < 4 || big < 2 || big > 64) return 2;
  servd_threadpool_init(threads);

  mpk_package *p = NULL;
  json_t *cfg;
  if (mpk_open(pkg, &p) || !(cfg = mpk_config(p))) {
    fprintf(stderr, "%s: %s\n", pkg, servd_last_error());
    return 1;
  }
  int L = (int)json_integer_value(json_object_get(cfg, "num_hidden_layers"));
  int H = (int)json_integer_value(json_object_get(cfg, "num_attention_heads"));
  json_t *kvj = json_object_get(cfg, "num_key_value_heads"), *hdj = json_object_get(cfg, "head_dim");
  int KV = kvj ? (int)json_integer_value(kvj) : H;
  int D = (int)json_integer_value(json_object_get(cfg, "hidden_size"));
  int HD = hdj ? (int)json_integer_value(hdj) : D / H;
  int vocab = (int)json_integer_value(json_object_get(cfg, "vocab_size"));
  double wbytes = 0;
  for (int i = 0; i < mpk_tensor_count(p); i++) {
    servd_tensor *t = NULL;
    if (mpk_tensor(p, mpk_tensor_name(p, i), &t) == 0) wbytes += (double)servd_tensor_nbytes(t);
    servd_tensor_release(t);
  }

  /* through Python; the serial replay unfused and with its fusions (plan_fuse.c); the parallel
   * replay (with its own gate/up fusion); at batch 1 and big */
  enum { MODES = 4, UNFUSED = 1 };
  static const char *const mode_names[MODES] = {"through Python", "replayed (serial walk, unfused)",
                                                "replayed (serial walk, fused)", "replayed (parallel)"};
  side sides[2][MODES];
  for (int b = 0; b < 2; b++)
    for (int m = 0; m < MODES; m++) {
      if (side_open(&sides[b][m], p, L, KV, HD, b ? big : 1, steps, m > 0)) {
        fprintf(stderr, "setup: %s\n", servd_last_error());
        return 1;
      }
      sides[b][m].exec = m == 3 ? "parallel" : "serial";
      sides[b][m].fuse = m == UNFUSED ? "off" : fuse;
    }
  const size_t rbytes = (size_t)1 << 30; /* 1 GiB: far beyond any L3 */
  char *buf = aligned_alloc(64, rbytes);
  if (!buf) return 1;
  memset(buf, 1, rbytes);
  size_t lnB = (size_t)vocab * (size_t)big;
  float *last[MODES]; /* each mode's last logits of the round */
  for (int m = 0; m < MODES; m++)
    if (!(last[m] = malloc(sizeof(float) * lnB))) return 1;
  double *rr = calloc((size_t)rounds, sizeof *rr), *sec[2][MODES];
  for (int b = 0; b < 2; b++)
    for (int m = 0; m < MODES; m++) sec[b][m] = calloc((size_t)rounds, sizeof(double));
  bool same[2][MODES] = {{true, true, true, true}, {true, true, true, true}};
  for (int r = 0; r < rounds; r++) {
    rr[r] = read_rate(buf, rbytes);
    for (int b = 0; b < 2; b++) {
      int batch = b ? big : 1;
      size_t ln = (size_t)vocab * (size_t)batch;
      /* the modes in another order each round (a rotation), so that none always runs first after
       * the read anchor or after the same neighbour */
      for (int i = 0; i < MODES; i++) {
        int m = (i + r) % MODES;
        sec[b][m][r] = decode(&sides[b][m], batch, steps, last[m], ln);
        if (sec[b][m][r] < 0) return 1;
      }
      for (int m = 1; m < MODES; m++) same[b][m] = same[b][m] && memcmp(last[0], last[m], sizeof(float) * ln) == 0;
      fprintf(stderr, "round %d: read %.1f GB/s; batch %d: %.1f / %.1f / %.1f / %.1f tok/s\n", r, rr[r], batch,
              batch / sec[b][0][r], batch / sec[b][1][r], batch / sec[b][2][r], batch / sec[b][3][r]);
    }
  }
  double tg = llama_tg(lb, gguf, threads, 64);
  int n = rounds - 1; /* round 0 captures */
  double gbs = bench_median(rr + 1, n), roof = gbs * 1e9 / wbytes;
  printf("threads %d, %d rounds of %d decode steps (medians of rounds 2..%d)\n", threads, rounds, steps, rounds);
  printf("read roofline: %.1f GB/s over 1 GiB / %.1f MB of weights = %.0f tok/s\n", gbs, wbytes / 1e6, roof);
  double tok[2][MODES];
  for (int b = 0; b < 2; b++)
    for (int m = 0; m < MODES; m++) {
      int batch = b ? big : 1;
      tok[b][m] = batch / bench_median(sec[b][m] + 1, n);
      printf("batch %d, %s: %.1f tok/s", batch, mode_names[m], tok[b][m]);
      if (b == 0) printf(" (%.0f%% of the roofline)", 100 * tok[b][m] / roof);
      if (m) printf(", %.2fx through Python, logits bit-equal: %s", tok[b][m] / tok[b][0], same[b][m] ? "yes" : "NO");
      if (m > UNFUSED) { /* also the median of the rounds' own ratios: each round's modes ran back to back */
        double q[50];
        for (int r = 1; r < rounds; r++) q[r - 1] = sec[b][UNFUSED][r] / sec[b][m][r];
        printf(", %.3fx the unfused replay (per-round median %.3fx)", tok[b][m] / tok[b][UNFUSED], bench_median(q, n));
      }
      printf("\n");
    }
  if (tg > 0)
    printf("llama-bench tg64: %.1f tok/s; batch 1 / llama-bench: serial unfused %.2fx, fused %.2fx, parallel %.2fx\n",
           tg, tok[0][1] / tg, tok[0][2] / tg, tok[0][3] / tg);
  else printf("llama-bench: not run (--gguf and --llama-bench)\n");
  bool all = true;
  for (int b = 0; b < 2; b++)
    for (int m = 0; m < MODES; m++) {
      all = all && same[b][m];
      side_close(&sides[b][m]);
    }
  mpk_close(p);
  free(buf);
  for (int m = 0; m < MODES; m++) free(last[m]);
  return all ? 0 : 1;
}
