/* Step plans (servd/plan.h): a forward captured once replays natively with the next step's inputs,
 * checked against values computed here by hand; a changing Python path, an op the executor does not
 * run, moved buffers and another shape are caught. */
#include "support.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "servd/plan.h"

static servd_pool *g_pool;
static char g_dir[256];

#define VOCAB 16
#define DIM 8

/* x = 2 * table[tokens]; K = 0, V = x into the cache; attention with zero keys is the mean of the
 * sequence's values; logits = the logit rows of that mean. Buffers are made once per step size and
 * kept, as models/llama does; grow() replaces them (host growth). */
static const char *entry_py =
    "import array, math\n"
    "import servd\n"
    "from servd import ops\n"
    "VOCAB, DIM, FF, WIDE = 16, 8, 96, 8192\n"
    "class Mean:\n"
    "    def __init__(self):\n"
    "        self.table = servd.tensor([[i + j / 10 for j in range(DIM)] for i in range(VOCAB)])\n"
    "        self.mode = 'plain'\n"
    "        self.steps = 0\n"
    "        self.grow()\n"
    "        w = lambda n, k, s: servd.tensor(array.array('f', (math.sin(s * i) / k for i in range(n * "
    "k))).tobytes(),\n"
    "                                         shape=(n, k))\n"
    "        self.wg, self.wu, self.wq, self.wk = w(FF, DIM, 0.7), w(FF, DIM, 1.3), w(WIDE, FF, 0.11), w(DIM, DIM, "
    "2.1)\n"
    "        self.rope = servd.Rope(layout='interleaved', head_dim=4, theta=100.0)\n"
    "    def grow(self):\n"
    "        self.buf = [servd.empty((8, DIM)) for _ in range(4)]\n"
    "        self.fbuf = [servd.empty((8, FF)), servd.empty((8, FF)), servd.empty((8, WIDE)), servd.empty((8, WIDE))]\n"
    "        self.views = {}\n"
    "    def grow_q(self):\n"
    "        self.fbuf[2] = servd.empty((8, WIDE))\n"
    "    def set_mode(self, m):\n"
    "        self.mode = m\n"
    "    def forward(self, batch):\n"
    "        n = batch.n_tokens\n"
    "        v = self.views.get(n)\n"
    "        if v is None:\n"
    "            v = self.views[n] = tuple(b.narrow(0, 0, n) for b in self.buf)\n"
    "        x, k, a, sel = v\n"
    "        self.steps += 1\n"
    "        ops.embedding(x, self.table, batch.tokens)\n"
    "        ops.add(x, x, x)\n"
    "        if self.mode == 'branchy' and self.steps % 2:\n"
    "            ops.add(x, x, k)\n"
    "        if self.mode == 'softmax':\n"
    "            ops.softmax(k)\n"
    "        if self.mode == 'fused':\n"
    "            return self.fused(batch, x, k, a)\n"
    "        ops.kv_write(batch.kv, 0, k, x, batch.slots)\n"
    "        ops.attention(a, x, batch.kv, 0, batch, 1, 1.0)\n"
    "        r = len(batch.logit_rows)\n"
    "        out = sel.narrow(0, 0, r)\n"
    "        ops.embedding(out, a, batch.logit_rows)\n"
    "        return out\n"
    /* The patterns the serial walk fuses (gate/up + SwiGLU, RoPE of q and k + KV write) with a q
     * wide enough that a step of 2 tokens splits into row slices; the logit rows are q's, so they
     * carry both, and the next step's attention reads the KV rows. */
    "    def fused(self, batch, x, k, a):\n"
    "        n, r = batch.n_tokens, len(batch.logit_rows)\n"
    "        g, u, q, out = (b.narrow(0, 0, m) for b, m in zip(self.fbuf, (n, n, n, r)))\n"
    "        ops.matmul_many(x, g, self.wg, u, self.wu)\n"
    "        ops.swiglu(g, g, u)\n"
    "        ops.matmul(q, g, self.wq)\n"
    "        ops.matmul(k, x, self.wk)\n"
    "        ops.rope(q, batch.positions, self.rope)\n"
    "        ops.rope(k, batch.positions, self.rope)\n"
    "        ops.kv_write(batch.kv, 0, k, x, batch.slots)\n"
    "        ops.attention(a, k, batch.kv, 0, batch, 1, 1.0)\n"
    "        ops.add(x, x, a)\n"
    "        ops.matmul(q.narrow(1, 0, DIM), x, self.wk)\n"
    "        ops.embedding(out, q, batch.logit_rows)\n"
    "        return out\n";

static int setup(void **state) {
  (void)state;
  snprintf(g_dir, sizeof g_dir, "/tmp/servd-plan-test-XXXXXX");
  if (support_pool_with_entry(g_dir, "mean.py", entry_py, "mean:Mean", &g_pool) < 0) return -1;
  return 0;
}

static int teardown(void **state) {
  (void)state;
  servd_pool_destroy(g_pool);
  support_system("rm -rf %s", g_dir);
  return 0;
}

/* Two sequences of one cache, decoded one token each per step. */
typedef struct seqs {
  servd_kv_cache *kv;
  int32_t blocks[2][4];
  int32_t hist[2][16]; /* the tokens so far */
  int len[2];
  int32_t tokens[2], positions[2], slots[2], rows[2], q_start[2], q_len[2], kv_len[2];
  const int32_t *tables[2];
  servd_forward_batch b;
} seqs;

static void seqs_init(seqs *s) {
  memset(s, 0, sizeof *s);
  assert_int_equal(servd_kv_cache_create(&s->kv, 1, 1, DIM, 4, 8, SERVD_F32), 0);
  for (int q = 0; q < 2; q++) {
    assert_int_equal(servd_kv_cache_alloc(s->kv, 4, s->blocks[q]), 0);
    s->tables[q] = s->blocks[q];
  }
}

/* The next step: sequence q gets token tok[q]. */
static const servd_forward_batch *seqs_step(seqs *s, int n, const int32_t *tok) {
  for (int q = 0; q < n; q++) {
    int p = s->len[q]++;
    s->hist[q][p] = tok[q];
    s->tokens[q] = tok[q];
    s->positions[q] = p;
    s->slots[q] = s->blocks[q][p / 4] * 4 + p % 4;
    s->rows[q] = q;
    s->q_start[q] = q;
    s->q_len[q] = 1;
    s->kv_len[q] = p + 1;
  }
  s->b = (servd_forward_batch){
      .n_tokens = n,
      .tokens = s->tokens,
      .positions = s->positions,
      .slots = s->slots,
      .n_logit_rows = n,
      .logit_rows = s->rows,
      .attn = {.n_seqs = n, .q_start = s->q_start, .q_len = s->q_len, .kv_len = s->kv_len, .block_tables = s->tables},
      .kv = s->kv};
  return &s->b;
}

/* logits row q = mean over sequence q's tokens t of 2 * (t + j/10), by hand. */
static void expect_means(const seqs *s, int n, const servd_tensor *logits) {
  assert_non_null(logits);
  assert_int_equal(logits->shape[0], n);
  const float *l = servd_tensor_data(logits);
  for (int q = 0; q < n; q++) {
    double sum = 0;
    for (int i = 0; i < s->len[q]; i++) sum += s->hist[q][i];
    for (int j = 0; j < DIM; j++) assert_float_equal(l[q * DIM + j], 2.0 * (sum / s->len[q] + j / 10.0), 1e-5);
  }
}

static void set_mode(const char *m) {
  char code[96];
  snprintf(code, sizeof code, "[%s]", m);
  json_t *res = NULL, *args = json_loads(code, 0, NULL);
  servd_py_error err;
  assert_int_equal(servd_interp_call_json(servd_pool_get(g_pool, 0), "set_mode", args, &res, 0, &err), 0);
  json_decref(args);
  json_decref(res);
}

static servd_plan *capture(seqs *s, int n, const int32_t *tok, char *why, size_t cap) {
  servd_tensor *logits = NULL;
  servd_py_error err;
  servd_plan *p = NULL;
  int rc = servd_plan_capture(servd_pool_get(g_pool, 0), seqs_step(s, n, tok), 0, &logits, &err, &p, why, cap);
  if (rc) fprintf(stderr, "%s: %s\n%s\n", err.type, err.message, err.traceback);
  assert_int_equal(rc, 0);
  expect_means(s, n, logits); /* the captured step ran */
  servd_tensor_release(logits);
  return p;
}

/* Captured twice alike, then replayed over steps whose tokens, slots and lengths all differ, by
 * the executor SERVD_PLAN_EXEC names at capture (the serial walk, or the pool job whose threads
 * claim matmul columns and attention sequences). */
static void capture_replay(const char *exec) {
  setenv("SERVD_PLAN_EXEC", exec, 1);
  set_mode("\"plain\"");
  seqs s;
  seqs_init(&s);
  char why[256];
  servd_plan *a = capture(&s, 2, (int32_t[]){3, 5}, why, sizeof why), *b;
  assert_non_null(a);
  b = capture(&s, 2, (int32_t[]){7, 1}, why, sizeof why);
  assert_non_null(b);
  assert_true(servd_plan_same(a, b, why, sizeof why));
  assert_int_equal(servd_plan_node_count(a), 5);
  for (int step = 0; step < 5; step++) {
    const servd_forward_batch *fb = seqs_step(&s, 2, (int32_t[]){(step * 3 + 2) % VOCAB, (step * 7 + 4) % VOCAB});
    int crc = servd_plan_check(a, fb, why, sizeof why);
    if (crc) fprintf(stderr, "check: %s\n", why);
    assert_int_equal(crc, 0);
    servd_tensor *logits = NULL;
    assert_int_equal(servd_plan_replay(a, fb, &logits), 0);
    expect_means(&s, 2, logits);
    servd_tensor_release(logits);
  }
  /* another shape is refused by name */
  assert_int_equal(servd_plan_check(a, seqs_step(&s, 1, (int32_t[]){2}), why, sizeof why), SERVD_EINVAL);
  assert_non_null(strstr(why, "1 tokens"));
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  servd_plan_print(a, f);
  fclose(f);
  assert_non_null(strstr(text, "kv_write"));
  assert_non_null(strstr(text, "tokens i32[2]"));
  assert_non_null(strstr(text, exec));
  free(text);
  servd_plan_destroy(a);
  servd_plan_destroy(b);
  servd_kv_cache_destroy(s.kv);
  unsetenv("SERVD_PLAN_EXEC");
}

static void test_capture_replay(void **state) {
  (void)state;
  capture_replay("serial");
}

static void test_capture_replay_parallel(void **state) {
  (void)state;
  capture_replay("parallel");
}

/* A forward whose Python takes another path every other step records different plans. */
static void test_branch_differs(void **state) {
  (void)state;
  set_mode("\"branchy\"");
  seqs s;
  seqs_init(&s);
  char why[256];
  servd_tensor *logits = NULL;
  servd_py_error err;
  servd_plan *a = NULL, *b = NULL;
  assert_int_equal(servd_plan_capture(servd_pool_get(g_pool, 0), seqs_step(&s, 1, (int32_t[]){1}), 0, &logits, &err, &a,
                                      why, sizeof why),
                   0);
  servd_tensor_release(logits);
  assert_int_equal(servd_plan_capture(servd_pool_get(g_pool, 0), seqs_step(&s, 1, (int32_t[]){2}), 0, &logits, &err, &b,
                                      why, sizeof why),
                   0);
  servd_tensor_release(logits);
  assert_non_null(a);
  assert_non_null(b);
  assert_false(servd_plan_same(a, b, why, sizeof why));
  assert_non_null(strstr(why, "ops"));
  servd_plan_destroy(a);
  servd_plan_destroy(b);
  servd_kv_cache_destroy(s.kv);
  set_mode("\"plain\"");
}

/* An op the executor does not run: the step runs, no plan, the reason names it. */
static void test_refused(void **state) {
  (void)state;
  set_mode("\"softmax\"");
  seqs s;
  seqs_init(&s);
  char why[256];
  servd_plan *p = capture(&s, 1, (int32_t[]){4}, why, sizeof why);
  assert_null(p);
  assert_non_null(strstr(why, "softmax"));
  servd_kv_cache_destroy(s.kv);
  set_mode("\"plain\"");
}

/* The model replaced its buffers (grown for a larger step): the plan no longer applies. */
static void test_buffers_moved(void **state) {
  (void)state;
  set_mode("\"plain\"");
  seqs s;
  seqs_init(&s);
  char why[256];
  servd_plan *p = capture(&s, 1, (int32_t[]){4}, why, sizeof why);
  assert_non_null(p);
  assert_int_equal(servd_plan_check(p, seqs_step(&s, 1, (int32_t[]){5}), why, sizeof why), 0);
  s.len[0]--; /* that step did not run */
  json_t *res = NULL;
  servd_py_error err;
  assert_int_equal(servd_interp_call_json(servd_pool_get(g_pool, 0), "grow", NULL, &res, 0, &err), 0);
  json_decref(res);
  assert_int_equal(servd_plan_check(p, seqs_step(&s, 1, (int32_t[]){5}), why, sizeof why), SERVD_EINVAL);
  assert_non_null(strstr(why, "moved"));
  servd_plan_destroy(p);
  servd_kv_cache_destroy(s.kv);
}

/* The serial walk's fused groups (plan_fuse.c) against the same steps through Python and against
 * the plan replayed unfused: the logits bit for bit, step after step (each step's attention reads
 * the KV rows the fused groups wrote before). */
static servd_tensor *eager_step(seqs *s, int n, const int32_t *tok) {
  servd_tensor *logits = NULL;
  servd_py_error err;
  int rc = servd_interp_forward_deadline(servd_pool_get(g_pool, 0), seqs_step(s, n, tok), 0, &logits, &err);
  if (rc) fprintf(stderr, "%s: %s\n%s\n", err.type, err.message, err.traceback);
  assert_int_equal(rc, 0);
  return logits;
}

static bool plan_says(const servd_plan *p, const char *what) {
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  servd_plan_print(p, f);
  fclose(f);
  bool says = strstr(text, what) != NULL;
  free(text);
  return says;
}

static servd_plan *capture_any(seqs *s, int n, const int32_t *tok) {
  servd_tensor *logits = NULL;
  servd_py_error err;
  servd_plan *p = NULL;
  char why[256] = "";
  assert_int_equal(
      servd_plan_capture(servd_pool_get(g_pool, 0), seqs_step(s, n, tok), 0, &logits, &err, &p, why, sizeof why), 0);
  servd_tensor_release(logits);
  if (!p) fprintf(stderr, "not captured: %s\n", why);
  assert_non_null(p);
  return p;
}

static void test_fused_groups(void **state) {
  (void)state;
  set_mode("\"fused\"");
  setenv("SERVD_PLAN_EXEC", "serial", 1);
  seqs se, sf, su, sp; /* eager, fused, unfused, only rope_kv fused: each its own cache, the same steps */
  seqs_init(&se);
  seqs_init(&sf);
  seqs_init(&su);
  seqs_init(&sp);
  const int32_t first[2] = {3, 5};
  servd_tensor_release(eager_step(&se, 2, first));
  servd_plan *fused = capture_any(&sf, 2, first);
  setenv("SERVD_PLAN_FUSE", "off", 1);
  servd_plan *unfused = capture_any(&su, 2, first);
  setenv("SERVD_PLAN_FUSE", "rope_kv", 1); /* a list of kinds keeps only those */
  servd_plan *partial = capture_any(&sp, 2, first);
  unsetenv("SERVD_PLAN_FUSE");
  for (int step = 0; step < 6; step++) {
    const int32_t tok[2] = {(step * 5 + 1) % VOCAB, (step * 3 + 2) % VOCAB};
    servd_tensor *want = eager_step(&se, 2, tok), *got = NULL, *plain = NULL;
    char why[256];
    const servd_forward_batch *fb = seqs_step(&sf, 2, tok);
    assert_int_equal(servd_plan_check(fused, fb, why, sizeof why), 0);
    assert_int_equal(servd_plan_replay(fused, fb, &got), 0);
    assert_memory_equal(servd_tensor_data(got), servd_tensor_data(want), servd_tensor_nbytes(want));
    servd_tensor_release(got);
    assert_int_equal(servd_plan_replay(unfused, seqs_step(&su, 2, tok), &plain), 0);
    assert_memory_equal(servd_tensor_data(plain), servd_tensor_data(want), servd_tensor_nbytes(want));
    servd_tensor_release(plain);
    fb = seqs_step(&sp, 2, tok);
    assert_int_equal(servd_plan_check(partial, fb, why, sizeof why), 0);
    assert_int_equal(servd_plan_replay(partial, fb, &plain), 0);
    assert_memory_equal(servd_tensor_data(plain), servd_tensor_data(want), servd_tensor_nbytes(want));
    servd_tensor_release(plain);
    servd_tensor_release(want);
  }
  /* both kinds still fused after their first-use check (a kind that differed would be dropped) */
  assert_true(plan_says(fused, "fused rope_kv") && plan_says(fused, "fused gate_up_swiglu"));
  assert_false(plan_says(unfused, "fused"));
  assert_true(plan_says(partial, "fused rope_kv") && !plan_says(partial, "fused gate_up_swiglu"));
  servd_plan_destroy(partial);
  servd_kv_cache_destroy(sp.kv);
  /* the guard still sees the model drop q's buffer, whose storage the rope_kv slices' views hold
   * (the unfused plan, which holds it too, goes first) */
  servd_plan_destroy(unfused);
  json_t *res = NULL;
  servd_py_error err;
  char why[256];
  assert_int_equal(servd_interp_call_json(servd_pool_get(g_pool, 0), "grow_q", NULL, &res, 0, &err), 0);
  json_decref(res);
  assert_int_equal(servd_plan_check(fused, seqs_step(&sf, 2, (int32_t[]){1, 2}), why, sizeof why), SERVD_EINVAL);
  assert_non_null(strstr(why, "moved"));
  servd_plan_destroy(fused);
  servd_kv_cache_destroy(se.kv);
  servd_kv_cache_destroy(sf.kv);
  servd_kv_cache_destroy(su.kv);
  unsetenv("SERVD_PLAN_EXEC");
  set_mode("\"plain\"");
  assert_int_equal(servd_interp_call_json(servd_pool_get(g_pool, 0), "grow", NULL, &res, 0, &err), 0);
  json_decref(res);
}

int main(int argc, char **argv) {
  support_early_init(argc, argv);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_capture_replay), cmocka_unit_test(test_capture_replay_parallel),
      cmocka_unit_test(test_branch_differs), cmocka_unit_test(test_refused),
      cmocka_unit_test(test_buffers_moved),  cmocka_unit_test(test_fused_groups),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
