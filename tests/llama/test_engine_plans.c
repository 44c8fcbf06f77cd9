/* Step plans in the runner: decode steps replayed from plans give the logits of the same steps
 * through the model's Python bit for bit (a runner with SERVD_PLANS=off beside it, on the tiny
 * Llama), with the serial walk's fused groups, and a prefill that makes the model grow its buffers
 * drops the plan (logged with the reason) and captures again, still bit for bit. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <fcntl.h>
#include <unistd.h>

#include "engine-test.h"
#include "engine/model_runner.h"
#include "mpk/package.h"

static char g_tmp[256], g_pkg[512];

typedef struct side {
  servd_pool *pool;
  servd_kv_cache *kv;
  servd_runner *rn;
  int32_t blocks[8];
} side;

static void side_open(side *s, mpk_package *p, bool plans) {
  memset(s, 0, sizeof *s);
  json_t *cfg = mpk_config(p);
  int L = (int)json_integer_value(json_object_get(cfg, "num_hidden_layers"));
  int H = (int)json_integer_value(json_object_get(cfg, "num_attention_heads"));
  json_t *kvj = json_object_get(cfg, "num_key_value_heads");
  int KV = kvj ? (int)json_integer_value(kvj) : H;
  int HD = (int)json_integer_value(json_object_get(cfg, "hidden_size")) / H;
  if (plans) unsetenv("SERVD_PLANS");
  else setenv("SERVD_PLANS", "off", 1);
  servd_pool_options po = {.n_interpreters = 1, .world_size = 1};
  assert_int_equal(servd_kv_cache_create(&s->kv, L, KV, HD, 16, 8, SERVD_F32), 0);
  assert_int_equal(servd_pool_create(p, &po, &s->pool), 0);
  assert_int_equal(servd_runner_create(s->pool, &s->kv, 1, NULL, &s->rn), 0);
  assert_int_equal(servd_kv_cache_alloc(s->kv, 8, s->blocks), 0);
  unsetenv("SERVD_PLANS");
}

static void side_close(side *s) {
  servd_runner_destroy(s->rn);
  servd_pool_destroy(s->pool);
  servd_kv_cache_destroy(s->kv);
}

/* One step of sequence `seq` (blocks 4*seq..): n tokens from position pos; logits of its last. */
static servd_tensor *step(side *s, int seq, int pos, int n) {
  int32_t tok[64], p[64], slot[64], row = n - 1, qs = 0, ql = n, kl = pos + n;
  for (int i = 0; i < n; i++) {
    tok[i] = (7 * (pos + i) + 3) % 200 + 1;
    p[i] = pos + i;
    slot[i] = s->blocks[4 * seq + (pos + i) / 16] * 16 + (pos + i) % 16;
  }
  const int32_t *tables[1] = {s->blocks + 4 * seq};
  servd_forward_batch b = {.n_tokens = n,
                           .tokens = tok,
                           .positions = p,
                           .slots = slot,
                           .n_logit_rows = 1,
                           .logit_rows = &row,
                           .attn = {.n_seqs = 1, .q_start = &qs, .q_len = &ql, .kv_len = &kl, .block_tables = tables}};
  servd_tensor *lg = NULL;
  servd_py_error err;
  int rc = servd_runner_step(s->rn, &b, &lg, &err, NULL);
  if (rc) fprintf(stderr, "step: %s %s %s\n", err.type, err.message, servd_last_error());
  assert_int_equal(rc, 0);
  assert_non_null(lg);
  return lg;
}

static void same_logits(side *eager, side *plan, int seq, int pos, int n) {
  servd_tensor *a = step(eager, seq, pos, n), *b = step(plan, seq, pos, n);
  assert_int_equal(servd_tensor_nbytes(a), servd_tensor_nbytes(b));
  assert_memory_equal(servd_tensor_data(a), servd_tensor_data(b), servd_tensor_nbytes(a));
  servd_tensor_release(a);
  servd_tensor_release(b);
}

static void test_replay_and_growth(void **state) {
  (void)state;
  mpk_package *p = NULL;
  assert_int_equal(mpk_open(g_pkg, &p), 0);
  side eager, plan;
  side_open(&eager, p, false);
  setenv("SERVD_TRACE_PLAN", "1", 1); /* the plan's trace names its fused groups */
  side_open(&plan, p, true);
  unsetenv("SERVD_TRACE_PLAN");
  /* stderr to a file: the runner logs why a plan was dropped */
  char log[600];
  snprintf(log, sizeof log, "%s/stderr.txt", g_tmp);
  fflush(stderr);
  int saved = dup(2), fd = open(log, O_CREAT | O_TRUNC | O_WRONLY, 0600);
  assert_true(saved >= 0 && fd >= 0);
  dup2(fd, 2);
  same_logits(&eager, &plan, 0, 0, 4); /* prefill of 4 tokens: buffers for 16 rows */
  for (int pos = 4; pos < 10; pos++) same_logits(&eager, &plan, 0, pos, 1); /* captured twice, then replayed */
  same_logits(&eager, &plan, 1, 0, 40); /* a prefill of 40 tokens: the model grows its buffers */
  for (int pos = 10; pos < 16; pos++) same_logits(&eager, &plan, 0, pos, 1); /* dropped, captured, replayed */
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  close(fd);
  FILE *f = fopen(log, "r");
  char text[4096] = "";
  size_t got = f ? fread(text, 1, sizeof text - 1, f) : 0;
  text[got] = '\0';
  if (f) fclose(f);
  fprintf(stderr, "%s", text);
  assert_non_null(strstr(text, "step plan for decode batches of 1 dropped"));
  assert_non_null(strstr(text, "buffers moved"));
  assert_null(strstr(text, "step plans off"));
  /* the serial walk fused each layer's RoPE + KV write and gate/up + SwiGLU, and each group gave
   * its unfused nodes' bits at its first use (else it would say so and run them apart) */
  assert_non_null(strstr(text, "fused rope_kv"));
  assert_non_null(strstr(text, "fused gate_up_swiglu"));
  assert_null(strstr(text, "differs from its unfused nodes"));
  side_close(&eager);
  side_close(&plan);
  mpk_close(p);
}

int main(int argc, char **argv) {
  if (engine_test_start(argc, argv, "plans", g_tmp, sizeof g_tmp) ||
      engine_test_synth_tiny(g_tmp, "tiny.mpk", g_pkg, sizeof g_pkg, NULL))
    return 1;
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_replay_and_growth)};
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmp);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_tmp);
  return rc;
}
