/* The servd module without a package: Tensor, ops, and the predict path with host tensors. */
#include "support.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static servd_pool *g_pool;
static char g_dir[256];

static const char *entry_py =
    "import servd\n"
    "from servd import ops\n"
    "class Doubler:\n"
    "    def __init__(self):\n"
    "        self.calls = 0\n"
    "    def predict(self, inputs):\n"
    "        self.calls += 1\n"
    "        x = inputs['x']\n"
    "        y = servd.empty(x.shape)\n"
    "        ops.add(y, x, x)\n"
    "        return {'y': y, 'same': x}\n"
    "    def bad(self, inputs):\n"
    "        return {'y': [1, 2]}\n"
    "    def forward(self, batch):\n"
    "        # q = k = v = ones: attention of identical values returns those values\n"
    "        t = batch.n_tokens\n"
    "        assert batch.tokens.dtype == 'i32' and batch.tokens.shape == (t,)\n"
    "        assert batch.tokens.device == 'cpu' and batch.kv.device == 'cpu', repr(batch.kv)\n"
    "        assert (batch.max_tokens, batch.max_seqs) == (8, 2), (batch.max_tokens, batch.max_seqs)\n"
    "        ones = servd.tensor([[1.0] * 8 for _ in range(t)])\n"
    "        ops.kv_write(batch.kv, 0, ones, ones, batch.slots)\n"
    "        out = servd.empty((t, 16))\n"
    "        q = servd.tensor([[0.5] * 16 for _ in range(t)])\n"
    "        ops.attention(out, q, batch.kv, 0, batch, 2, 0.25)\n"
    "        self.old = batch\n"
    "        rows = batch.logit_rows.tolist()\n"
    "        toks = batch.tokens.tolist()\n"
    "        pos = batch.positions.tolist()\n"
    "        o = out.tolist()\n"
    "        return servd.tensor([[float(toks[r]), float(pos[r]), o[r][0], o[r][15], float(batch.n_seqs)] for r in "
    "rows])\n"
    "    def stale(self):\n"
    "        out = servd.empty((1, 16))\n"
    "        ops.attention(out, servd.empty((1, 16)), self.old.kv, 0, self.old, 2, 0.25)\n"
    "    def info(self, a, b):\n"
    "        return {'sum': a + b, 'calls': self.calls, 'rank': servd.rank(), 'ws': servd.world_size()}\n";

/* The pool's only interpreter, where every check runs. */
static servd_interp *it0(void) { return servd_pool_get(g_pool, 0); }

static int setup(void **state) {
  (void)state;
  snprintf(g_dir, sizeof g_dir, "/tmp/servd-interp-test-XXXXXX");
  if (support_pool_with_entry(g_dir, "doubler.py", entry_py, "doubler:Doubler", &g_pool) < 0) return -1;
  support_exec(servd_pool_get(g_pool, 0), "import servd, math\nfrom servd import ops\n");
  return 0;
}

static int teardown(void **state) {
  (void)state;
  servd_pool_destroy(g_pool);
  support_system("rm -rf %s", g_dir);
  return 0;
}

static void test_tensor(void **state) {
  (void)state;
  support_exec(servd_pool_get(g_pool, 0), "t = servd.tensor([[1, 2, 3], [4, 5, 6]])\n"
                                          "i = servd.tensor([7, -8], dtype='i32')\n");
  support_expect_true(it0(),
                      "t.shape == (2, 3) and t.dtype == 'f32' and t.device == 'cpu' and t.ndim == 2 and len(t) == 2");
  support_expect_true(it0(), "t.tolist() == [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]");
  support_expect_true(it0(), "i.tolist() == [7, -8] and i.dtype == 'i32'");
  /* buffer protocol: format, shape, strides, writable owned storage */
  support_expect_true(
      it0(), "memoryview(t).format == 'f' and memoryview(t).shape == (2, 3) and memoryview(t).strides == (12, 4)");
  support_exec(servd_pool_get(g_pool, 0), "m = memoryview(t); m[1, 2] = 9.5; del m\n");
  support_expect_true(it0(), "t.tolist()[1][2] == 9.5");
  /* views share data */
  support_expect_true(
      it0(), "t.row(1).tolist() == [4.0, 5.0, 9.5] and t.narrow(1, 1, 2).tolist() == [[2.0, 3.0], [5.0, 9.5]]");
  support_expect_true(it0(),
                      "t.view(3, 2).tolist() == [[1.0, 2.0], [3.0, 4.0], [5.0, 9.5]] and t.reshape(-1).shape == (6,)");
  /* bytes round trip, f16/bf16 of exactly representable values */
  support_expect_true(it0(), "servd.tensor(bytes(memoryview(t)), shape=(2, 3)).tolist() == t.tolist()");
  support_expect_true(it0(), "servd.tensor([1.5, -2.25, 0.0], dtype='f16').tolist() == [1.5, -2.25, 0.0]");
  support_expect_true(it0(), "servd.tensor([1.5, -2.25, 0.0], dtype='bf16').tolist() == [1.5, -2.25, 0.0]");
  support_expect_true(it0(), "memoryview(servd.tensor([1.5], dtype='f16')).format == 'e'");
  support_expect_true(it0(), "len(bytes(memoryview(servd.tensor([1.5, 2.0], dtype='bf16')))) == 4");
  /* q8_0: one block, |error| <= scale/2 = max|x|/127/2 (ggml rounding) */
  support_expect_true(it0(), "all(abs(a - b) <= 31 / 127 / 2 + 1e-6 for a, b in "
                             "zip(servd.tensor([i - 16 + 0.5 for i in range(32)], dtype='q8_0').tolist(), "
                             "[i - 16 + 0.5 for i in range(32)]))");
  support_expect_true(it0(), "servd.empty((2, 4), dtype='i32').tolist() == [[0] * 4] * 2");
  support_expect_raises(it0(), "servd.tensor([[1, 2], [3]])", "ValueError", "ragged");
  support_expect_raises(it0(), "servd.tensor([1.0], dtype='nope')", "ValueError", "unknown dtype");
  support_expect_raises(it0(), "servd.tensor(b'abc', shape=(1,))", "ValueError", "bytes");
  support_expect_raises(it0(), "t.row(5)", "IndexError", "out of range");
  support_expect_raises(it0(), "servd.Tensor()", "TypeError", "");
}

static void test_ops(void **state) {
  (void)state;
  /* x (2,3) @ w^T, w (2,3): hand-computed [[1*1+2*0+3*1, 1*0+2*1+3*1], [4+6, 5+6]] = [[4,5],[10,11]] */
  support_exec(servd_pool_get(g_pool, 0), "x = servd.tensor([[1, 2, 3], [4, 5, 6]])\n"
                                          "w = servd.tensor([[1, 0, 1], [0, 1, 1]])\n"
                                          "o = servd.empty((2, 2))\nops.matmul(o, x, w)\n");
  support_expect_true(it0(), "o.tolist() == [[4.0, 5.0], [10.0, 11.0]]");
  support_exec(servd_pool_get(g_pool, 0), "s = servd.tensor([[0.0, 1.0, 2.0]])\nops.softmax(s)\n"
                                          "e = [math.exp(v) for v in (0.0, 1.0, 2.0)]\n");
  /* reference: math.exp in double; 1e-6 covers f32 rounding of values in (0, 1) */
  support_expect_true(it0(), "all(abs(a - b / sum(e)) < 1e-6 for a, b in zip(s.tolist()[0], e))");
  support_exec(servd_pool_get(g_pool, 0), "am = servd.empty((2,), dtype='i32')\nops.argmax(am, x)\n");
  support_expect_true(it0(), "am.tolist() == [2, 2]");
  support_exec(servd_pool_get(g_pool, 0), "r = servd.Rope('half', 4, 10000.0)\n");
  support_expect_true(it0(), "'half' in repr(r)");
  support_expect_raises(it0(), "ops.matmul(servd.empty((2, 2)), x, servd.empty((2, 4)))", "ValueError", "matmul");
  support_expect_raises(it0(), "ops.add(o, o, 3)", "TypeError", "servd.Tensor");
  support_expect_raises(it0(), "ops.matmul(o, x)", "TypeError", "3 arguments");
  support_expect_raises(it0(), "servd.package.tensor('w')", "RuntimeError", "no package");
  support_expect_true(it0(), "servd.rank() == 0 and servd.world_size() == 1 and servd.device() == 'cpu'");
  support_expect_true(it0(), "ops.allreduce(o) is None");
}

/* The fused ops on the host: add_rmsnorm against hand-computed values and against its parts (bitwise),
 * matmul_many against hand-computed values and one matmul per weight (weights of two dtypes). */
static void test_fused_ops(void **state) {
  (void)state;
  servd_interp *it = servd_pool_get(g_pool, 0);
  /* x + o = [[3, 4], [4, 0]]; rms = sqrt(12.5), sqrt(8); weight [1, 2]; eps 0 */
  support_exec(it, "x = servd.tensor([[1, 2], [3, -1]])\no = servd.tensor([[2, 2], [1, 1]])\n"
                   "nw = servd.tensor([1, 2])\nh = servd.empty((2, 2))\nops.add_rmsnorm(x, o, h, nw, 0.0)\n"
                   "want = [[3 / math.sqrt(12.5), 8 / math.sqrt(12.5)], [4 / math.sqrt(8), 0.0]]\n");
  support_expect_true(it, "x.tolist() == [[3.0, 4.0], [4.0, 0.0]]");
  /* f32 rounding of values near 1: 1e-6 */
  support_expect_true(it, "all(abs(a - b) < 1e-6 for r, s in zip(h.tolist(), want) for a, b in zip(r, s))");
  support_exec(it, "x2 = servd.tensor([[1, 2], [3, -1]])\nh2 = servd.empty((2, 2))\n"
                   "ops.add(x2, x2, o)\nops.rmsnorm(h2, x2, nw, 0.0)\n");
  support_expect_true(it, "h.tolist() == h2.tolist() and x.tolist() == x2.tolist()");
  support_expect_raises(it, "ops.add_rmsnorm(x, o, x, nw, 0.0)", "ValueError", "out must not be x");
  support_expect_raises(it, "ops.add_rmsnorm(x, o, h, nw)", "TypeError", "5 arguments");

  /* x (2,3) @ [[1,0,1],[0,1,1]]^T = [[4,5],[10,11]]; @ [[1,1,1]]^T = [[6],[15]] */
  support_exec(it,
               "xm = servd.tensor([[1, 2, 3], [4, 5, 6]])\n"
               "wa = servd.tensor([[1, 0, 1], [0, 1, 1]])\nwb = servd.tensor([[1, 1, 1]], dtype='bf16')\n"
               "oa = servd.empty((2, 2))\nob = servd.empty((2, 1))\nops.matmul_many(xm, oa, wa, ob, wb)\n"
               "ra = servd.empty((2, 2))\nrb = servd.empty((2, 1))\nops.matmul(ra, xm, wa)\nops.matmul(rb, xm, wb)\n");
  support_expect_true(it, "oa.tolist() == [[4.0, 5.0], [10.0, 11.0]] and ob.tolist() == [[6.0], [15.0]]");
  support_expect_true(it, "oa.tolist() == ra.tolist() and ob.tolist() == rb.tolist()");
  support_expect_raises(it, "ops.matmul_many(xm, oa)", "TypeError", "pairs");
  support_expect_raises(it, "ops.matmul_many(xm, oa, wa, ob)", "TypeError", "pairs");
  support_expect_raises(it, "ops.matmul_many(xm, oa, wa, oa, wa, oa, wa, oa, wa, oa, wa)", "TypeError", "pairs");
  support_expect_raises(it, "ops.matmul_many(xm, ob, wa)", "ValueError", "matmul");
}

/* A CPU interpreter: the device calls say so; host copies and the single-rank gather work. */
static void test_device_api_on_cpu(void **state) {
  (void)state;
  support_expect_true(it0(), "servd.device() == 'cpu' and servd.sync() is None");
  support_expect_raises(it0(), "servd.upload(servd.empty(4))", "RuntimeError",
                        "servd.upload: this interpreter runs on the CPU");
  support_expect_raises(it0(), "servd.to_device(servd.empty(4))", "RuntimeError",
                        "servd.to_device: this interpreter runs on the CPU");
  support_expect_raises(it0(), "servd.empty(4, device='cuda')", "RuntimeError",
                        "servd.empty: this interpreter runs on the CPU");
  support_expect_raises(it0(), "servd.empty((2, 2), 'bf16', 'cuda:0')", "RuntimeError",
                        "servd.empty: this interpreter runs on the CPU");
  support_expect_raises(it0(), "servd.empty(4, device='bogus')", "ValueError",
                        "servd.empty: device must be \"cpu\", \"cuda\" or \"cuda:N\", not \"bogus\"");
  support_expect_raises(it0(), "servd.empty(4, device='cuda:x')", "ValueError", "not \"cuda:x\"");
  support_expect_raises(it0(), "servd.empty(4, device=0)", "TypeError", "device must be a str");
  support_expect_raises(it0(), "servd.upload([1.0])", "TypeError", "servd.upload: t must be a servd.Tensor");
  support_expect_true(
      it0(), "servd.empty((2, 3), device='cpu').device == 'cpu' and servd.empty(3, device=None).shape == (3,)");
  support_exec(servd_pool_get(g_pool, 0), "src = servd.tensor([[1, 2, 3], [4, 5, 6]])\n");
  support_expect_true(it0(), "src.to_host() is src");
  /* copy into a strided view: columns 1..3 of a (2, 5) tensor */
  support_exec(servd_pool_get(g_pool, 0), "wide = servd.empty((2, 5))\nservd.copy(wide.narrow(1, 1, 3), src)\n");
  support_expect_true(it0(), "wide.tolist() == [[0.0, 1.0, 2.0, 3.0, 0.0], [0.0, 4.0, 5.0, 6.0, 0.0]]");
  support_expect_raises(it0(), "servd.copy(servd.empty((3, 2)), src)", "ValueError",
                        "servd.copy: copy: dst f32[3,2] and src f32[2,3] differ");
  support_expect_raises(it0(), "servd.copy(src)", "TypeError", "2 arguments");
  /* one rank: allgather_cols copies the only shard */
  support_exec(servd_pool_get(g_pool, 0), "g = servd.empty((2, 3))\nops.allgather_cols(g, src)\n");
  support_expect_true(it0(), "g.tolist() == src.tolist()");
  support_expect_raises(it0(), "ops.allgather_cols(servd.empty((2, 4)), src)", "ValueError", "one shape");
  support_expect_true(it0(), "'cpu' in repr(src)");
}

static void test_predict(void **state) {
  (void)state;
  servd_interp *it = servd_pool_acquire(g_pool);
  int64_t shape[2] = {2, 2};
  servd_tensor *x = servd_tensor_new(SERVD_F32, 2, shape);
  float *xd = servd_tensor_data(x);
  for (int i = 0; i < 4; i++) xd[i] = (float)i - 1.5f;
  const char *names[1] = {"x"};
  servd_tensor *ins[1] = {x};
  for (int round = 0; round < 3; round++) {
    int n_out = 0;
    char **out_names = NULL;
    servd_tensor **outs = NULL;
    servd_py_error err;
    int rc = servd_interp_predict(it, 1, names, ins, &n_out, &out_names, &outs, 0, &err);
    if (rc < 0) fprintf(stderr, "%s: %s\n%s\n", err.type, err.message, err.traceback);
    assert_int_equal(rc, 0);
    assert_int_equal(n_out, 2);
    for (int i = 0; i < n_out; i++) {
      if (!strcmp(out_names[i], "y")) {
        const float *y = servd_tensor_data(outs[i]);
        for (int k = 0; k < 4; k++) assert_true(y[k] == 2 * xd[k]);
        assert_int_equal(outs[i]->refcount, 1); /* Python dropped its reference */
      } else {
        assert_string_equal(out_names[i], "same");
        assert_ptr_equal(outs[i], x); /* the very host tensor, not a copy */
        assert_int_equal(x->refcount, 2);
      }
      servd_tensor_release(outs[i]);
      free(out_names[i]);
    }
    free(out_names);
    free(outs);
    assert_int_equal(x->refcount, 1);
  }
  /* call_json with arguments, state kept between calls */
  json_t *args = json_pack("[ii]", 40, 2), *res = NULL;
  servd_py_error err;
  assert_int_equal(servd_interp_call_json(it, "info", args, &res, 0, &err), 0);
  assert_int_equal(json_integer_value(json_object_get(res, "sum")), 42);
  assert_int_equal(json_integer_value(json_object_get(res, "calls")), 3);
  json_decref(res);
  json_decref(args);
  /* a missing method fails that call only */
  assert_int_equal(servd_interp_call_json(it, "nope", NULL, &res, 0, &err), SERVD_EINVAL);
  assert_string_equal(err.type, "AttributeError");
  servd_pool_release(g_pool, it);
  servd_tensor_release(x);
}

/* forward(batch): the Batch object carries the step's arrays (copied), the KV cache and the attention
 * layout, which ops.attention reads from the batch itself; a stale batch is refused. */
static void test_forward(void **state) {
  (void)state;
  servd_kv_cache *kv = NULL;
  assert_int_equal(servd_kv_cache_create(&kv, 1, 1, 8, 4, 4, SERVD_F32), 0);
  int32_t blocks[2];
  assert_int_equal(servd_kv_cache_alloc(kv, 2, blocks), 0);
  int32_t tokens[5] = {11, 12, 13, 14, 15}, positions[5] = {0, 1, 2, 3, 4}, slots[5], rows[2] = {2, 4};
  for (int i = 0; i < 5; i++) slots[i] = blocks[i / 4] * 4 + i % 4;
  int32_t q_start[1] = {0}, q_len[1] = {5}, kv_len[1] = {5};
  const int32_t *tables[1] = {blocks};
  servd_forward_batch b = {
      .n_tokens = 5,
      .tokens = tokens,
      .positions = positions,
      .slots = slots,
      .n_logit_rows = 2,
      .logit_rows = rows,
      .attn = {.n_seqs = 1, .q_start = q_start, .q_len = q_len, .kv_len = kv_len, .block_tables = tables},
      .kv = kv,
      .max_tokens = 8,
      .max_seqs = 2};
  servd_tensor *logits = NULL;
  servd_py_error err;
  servd_interp *it = servd_pool_acquire(g_pool);
  int rc = servd_interp_forward(it, &b, &logits, &err);
  if (rc < 0) fprintf(stderr, "%s: %s\n%s\n", err.type, err.message, err.traceback);
  assert_int_equal(rc, 0);
  assert_non_null(logits);
  assert_int_equal(logits->shape[0], 2);
  const float *l = servd_tensor_data(logits);
  float want[2][5] = {{13, 2, 1, 1, 1}, {15, 4, 1, 1, 1}};
  for (int r = 0; r < 2; r++)
    for (int c = 0; c < 5; c++) assert_float_equal(l[r * 5 + c], want[r][c], 1e-6);
  servd_tensor_release(logits);
  /* the engine reuses its arrays: Python must not see them change */
  tokens[2] = 99;
  json_t *res = NULL;
  assert_int_equal(servd_interp_call_json(it, "stale", NULL, &res, 0, &err), SERVD_EINVAL);
  assert_string_equal(err.type, "RuntimeError");
  assert_non_null(strstr(err.message, "finished step"));
  servd_pool_release(g_pool, it);
  servd_kv_cache_destroy(kv);
}

/* Ops release the GIL: with forced GIL switches made practically impossible (switch interval 100 s), a
 * second Python thread of the same interpreter only runs when the main one releases the GIL itself,
 * and the only place it does between c0 and c1 is inside ops.matmul. */
static void test_gil_released(void **state) {
  (void)state;
  servd_interp *it = servd_pool_get(g_pool, 0);
  support_exec(it, "import sys, threading, time\n"
                   "sys.setswitchinterval(100.0)\n"
                   "stop = False\ncount = 0\n"
                   "def spin():\n"
                   "    global count\n"
                   "    while not stop:\n"
                   "        count += 1\n"
                   "        if count % 1000 == 0:\n"
                   "            time.sleep(0)\n"
                   "th = threading.Thread(target=spin)\nth.start()\n"
                   "while count == 0:\n    time.sleep(0.001)\n"
                   "a = servd.empty((64, 1024)); w = servd.empty((1024, 1024)); o = servd.empty((64, 1024))\n"
                   "c0 = count\n"
                   /* Nothing else releases the GIL here (switch interval 100 s): the other thread
                    * can only progress while a matmul runs. Keep calling until it has, for up to
                    * 10 s, as a loaded machine may not schedule it during the first few calls. */
                   "t_end = time.monotonic() + 10.0\n"
                   "while count == c0 and time.monotonic() < t_end:\n    ops.matmul(o, a, w)\n"
                   "c1 = count\n"
                   "stop = True\nth.join()\nsys.setswitchinterval(0.005)\n");
  long long progressed = support_eval_int(it, "c1 - c0");
  fprintf(stderr, "gil: the other thread ran %lld iterations during the matmuls\n", progressed);
  assert_true(progressed > 0);
}

typedef struct conc_arg {
  servd_interp *it;
  int bad;
} conc_arg;

static void *conc_main(void *v) {
  conc_arg *a = v;
  int64_t shape[2] = {1, 3};
  servd_tensor *x = servd_tensor_new(SERVD_F32, 2, shape);
  float *xd = servd_tensor_data(x);
  const char *names[1] = {"x"};
  for (int i = 0; i < 300; i++) {
    xd[0] = (float)i;
    xd[1] = (float)-i;
    xd[2] = 0.5f;
    int n_out;
    char **on;
    servd_tensor **ot;
    servd_py_error err;
    if (servd_interp_predict(a->it, 1, names, &x, &n_out, &on, &ot, 0, &err) < 0) {
      a->bad++;
      continue;
    }
    for (int k = 0; k < n_out; k++) {
      if (!strcmp(on[k], "y")) {
        const float *y = servd_tensor_data(ot[k]);
        if (y[0] != 2.0f * i || y[1] != -2.0f * i || y[2] != 1.0f) a->bad++;
      }
      free(on[k]);
      servd_tensor_release(ot[k]);
    }
    free(on);
    free(ot);
  }
  servd_tensor_release(x);
  return NULL;
}

/* Several OS threads calling one interpreter at once (each gets its own thread state there). */
static void test_concurrent_callers(void **state) {
  (void)state;
  conc_arg a[3];
  pthread_t t[3];
  for (int i = 0; i < 3; i++) {
    a[i] = (conc_arg){servd_pool_get(g_pool, 0), 0};
    pthread_create(&t[i], NULL, conc_main, &a[i]);
  }
  for (int i = 0; i < 3; i++) {
    pthread_join(t[i], NULL);
    assert_int_equal(a[i].bad, 0);
  }
}

int main(int argc, char **argv) {
  support_early_init(argc, argv);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_tensor),
      cmocka_unit_test(test_ops),
      cmocka_unit_test(test_fused_ops),
      cmocka_unit_test(test_device_api_on_cpu),
      cmocka_unit_test(test_predict),
      cmocka_unit_test(test_forward),
      cmocka_unit_test(test_concurrent_callers),
      cmocka_unit_test(test_gil_released),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
