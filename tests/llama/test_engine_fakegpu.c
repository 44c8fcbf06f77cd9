/* The engine's GPU path on the host stand-in for CUDA (tests/device/fake_cuda.c), for what a short
 * run on a real GPU cannot cover: failures. A synthesized 12-layer model ("200mb", head_dim 64, bf16).
 *
 *  - graphs against no graphs: the same tokens (the stand-in computes padded and unpadded rows alike,
 *    so equality is exact), and unloading gives every byte of device memory back;
 *  - every capture failing (as when an op that cannot be captured runs), or the forward raising in
 *    it: the buckets fall back to eager steps, no request fails, the same tokens;
 *  - a graph launch failing: that step's requests fail, later requests get the same tokens again
 *    from graphs captured anew;
 *  - device memory moving while graphs are held (the generation bumped between steps, as another
 *    model unloading does): graphs are dropped and captured again, the same tokens;
 *  - two models on one GPU, one unloading while the other serves (the weight cache trimmed, cached
 *    memory given back, the other's graphs stale): the other's tokens stay right;
 *  - a chat template rendered on the template interpreter (GPU 0) while steps run: no device work
 *    of its own, no effect on the tokens;
 *  - tensor parallelism on two stand-in GPUs (NCCL all-reduce and all-gather of the vocabulary
 *    shards): TP 2 against TP 1 (equal up to a near tie of TP 1: bf16 partial sums round apart), TP 2
 *    graphs against TP 2 eager (exactly);
 *  - TP 2 with rank 1's forward raising while its graph is captured (rank 0's capture succeeds):
 *    the bucket is dropped on both ranks, the step reruns eagerly, nothing hangs, same tokens;
 *  - TP 2 with a graph launch failing on one rank while the other replays: NCCL aborted and rebuilt,
 *    that step's requests fail, graphs captured anew, later requests right;
 *  - TP 2 with rank 1 raising in an eager step while rank 0 waits for it in an all-reduce: the
 *    communicator is aborted and rebuilt, only that step's request fails, later ones are right;
 *  - TP 2 with rank 1 looping forever in Python while rank 0 waits in NCCL: the step timeout
 *    interrupts it, the request fails with TimeoutError naming rank 1, later ones are right;
 *  - too little device memory for one context of KV cache after the weights: the load fails with the
 *    reason and leaves no device memory behind (the weights uploaded before are freed);
 *  - memory profiling at load: device memory in use after the load is exactly the weights, the KV
 *    cache and what the warm-up steps measured; later steps of every shape, captures and replays
 *    (one GPU, and TP 2 with its all-gather buffers) allocate nothing and never move memory (the
 *    device generation stays as the load left it); with the cache sized by the memory itself (a
 *    fraction of 1 of a device that holds little more than the model) requests are served right;
 *  - an embedding (final-norm hidden rows, bf16 on the device, widened to f32 on the host by the
 *    model code) points the same way as the same model's on the CPU, in f32.
 *
 * Integration (interpreters are loaded with dlmopen, which the sanitizers cannot follow).
 */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "engine-gpu-test.h"
#include "engine-test.h"
#include "engine/engine.h"
#include "fake_cuda.h"
#include "servd/cuda.h"

#define NREQ 4

typedef engine_gpu_result result;

static char pkg_path[256];
/* Raises on rank 1 in its second step of one token (once per interpreter) and in every step of 13;
 * loops forever on rank 1 in a step of 17. */
static const char faulty_py[] = "import servd\n"
                                "from .model import LlamaModel\n"
                                "class Faulty(LlamaModel):\n"
                                "    ones = 0\n"
                                "    def forward(self, batch):\n"
                                "        if servd.rank() == 1 and batch.n_tokens == 13:\n"
                                "            raise RuntimeError('injected failure on rank 1 (13 tokens)')\n"
                                "        if servd.rank() == 1 and batch.n_tokens == 17:\n"
                                "            while True:\n"
                                "                pass\n"
                                "        if servd.rank() == 1 and batch.n_tokens == 1:\n"
                                "            self.ones += 1\n"
                                "            if self.ones == 2:\n"
                                "                raise RuntimeError('injected failure on rank 1')\n"
                                "        return super().forward(batch)\n";
static char tmpdir[128];
static const char *prompts[NREQ] = {"Hello there", "abc", "The quick brown fox", "0123456789"};
static const int lengths[NREQ] = {20, 16, 12, 8};

/* Bumps the device generation at each of the first bump_tokens tokens ("memory moved" between steps). */
static void bump(result *r) {
  if (r->n <= r->bump_tokens) servd_cuda_generation_bump(0);
}

static double step_timeout_s = 120;

static int load_tp(const char *path, int gpus, bool graphs, double fraction, servd_model **m) {
  servd_model_options o;
  engine_gpu_options(&o, path, gpus, graphs);
  o.step_timeout_s = step_timeout_s;
  o.gpu_memory_fraction = fraction;
  return servd_model_load(&o, m);
}

static int load(bool graphs, double fraction, servd_model **m) { return load_tp(pkg_path, 1, graphs, fraction, m); }

typedef struct chat_job {
  servd_model *m;
  int rc;
  char text[256];
} chat_job;

static void *chat_main(void *p) {
  chat_job *j = p;
  json_t *msgs = json_pack("[{s:s, s:s}]", "role", "user", "content", "hi");
  char *text = NULL;
  j->rc = servd_model_apply_chat_template(j->m, msgs, true, &text);
  json_decref(msgs);
  snprintf(j->text, sizeof j->text, "%s", text ? text : servd_last_error());
  free(text);
  return NULL;
}

/* Runs the requests at once on m (and a chat template alongside when chat); returns how many failed
 * (with fail false, a failure fails the test). */
static int run_on(servd_model *m, int bump_tokens, bool chat, bool may_fail, result *res) {
  servd_request *req[NREQ];
  for (int i = 0; i < NREQ; i++) {
    engine_gpu_result_init(&res[i]);
    res[i].on_token = bump;
    res[i].bump_tokens = i == 0 ? bump_tokens : 0;
    if (engine_gpu_submit_prompt(m, prompts[i], lengths[i], &res[i], &req[i]))
      fail_msg("submit: %s", servd_last_error());
  }
  chat_job cj = {m, -1, ""};
  pthread_t th;
  if (chat) assert_int_equal(pthread_create(&th, NULL, chat_main, &cj), 0);
  int failed = 0;
  for (int i = 0; i < NREQ; i++) {
    engine_gpu_wait(&res[i], req[i]);
    if (res[i].error_code) {
      if (!may_fail) fail_msg("request %d: %s", i, res[i].error);
      printf("request %d failed as injected: %s\n", i, res[i].error);
      failed++;
      continue;
    }
    assert_int_equal(res[i].n, lengths[i]);
  }
  if (chat) {
    pthread_join(th, NULL);
    if (cj.rc) fail_msg("chat template on the GPU model: %s", cj.text);
    assert_non_null(strstr(cj.text, "hi"));
  }
  return failed;
}

/* Unloads m and checks that no device memory is left; returns its stats. */
static servd_model_stats unload(servd_model *m) {
  servd_model_stats st;
  servd_model_get_stats(m, &st);
  servd_model_unload(m, 0);
  fake_cuda_stats fs;
  fake_cuda_get_stats(&fs);
  assert_int_equal(fs.device_bytes, 0);
  return st;
}

static servd_model_stats run_tp(const char *path, int gpus, bool graphs, int bump_tokens, bool chat, result *res) {
  servd_model *m = NULL;
  if (load_tp(path, gpus, graphs, 0.9, &m)) fail_msg("load: %s", servd_last_error());
  run_on(m, bump_tokens, chat, false, res);
  return unload(m);
}

static servd_model_stats run(bool graphs, int bump_tokens, bool chat, result *res) {
  return run_tp(pkg_path, 1, graphs, bump_tokens, chat, res);
}

static void same(const char *what, const result *ref, const result *got) {
  for (int i = 0; i < NREQ; i++)
    for (int t = 0; t < ref[i].n; t++)
      if (ref[i].tokens[t] != got[i].tokens[t])
        fail_msg("%s: request %d token %d: %d, expected %d", what, i, t, got[i].tokens[t], ref[i].tokens[t]);
}

static result eager[NREQ];
static char faulty_path[256];

static void test_graphs_match_eager(void **state) {
  (void)state;
  static result g[NREQ];
  run(false, 0, false, eager);
  servd_model_stats st = run(true, 0, false, g);
  same("graphs against eager", eager, g);
  assert_true(st.cuda_graph_captures >= 3);
  assert_true(st.cuda_graph_replays >= 6);
  assert_int_equal(st.cuda_graph_capture_failures, 0);
}

/* Every capture failing through inject (armed for 1000): the buckets fall back to eager steps. */
static void check_captures_fail(void (*inject)(int n), const char *what) {
  static result g[NREQ];
  inject(1000);
  servd_model_stats st = run(true, 0, false, g);
  inject(0);
  same(what, eager, g);
  assert_true(st.cuda_graph_capture_failures >= 1);
  assert_int_equal(st.cuda_graph_replays, 0);
}

static void test_capture_failures(void **state) {
  (void)state;
  check_captures_fail(fake_cuda_fail_captures, "every capture failing");
}

static void test_capture_forward_raises(void **state) {
  (void)state;
  check_captures_fail(fake_cuda_fail_launches_in_capture, "the forward raising in every capture");
}

static void test_replay_failure_recovers(void **state) {
  (void)state;
  static result g[NREQ];
  servd_model *m = NULL;
  if (load(true, 0.9, &m)) fail_msg("load: %s", servd_last_error());
  run_on(m, 0, false, false, g); /* every bucket captured */
  servd_model_stats before;
  servd_model_get_stats(m, &before);
  fake_cuda_fail_graph_launches(1);
  int failed = run_on(m, 0, false, true, g);
  fake_cuda_fail_graph_launches(0);
  assert_true(failed >= 1); /* the requests of the step whose launch failed */
  run_on(m, 0, false, false, g);
  same("after a failed graph launch", eager, g);
  servd_model_stats st = unload(m);
  assert_true(st.cuda_graph_replays > before.cuda_graph_replays);
}

static void test_memory_moves(void **state) {
  (void)state;
  static result g[NREQ];
  servd_model_stats st = run(true, 12, false, g);
  same("device memory moving between steps", eager, g);
  assert_int_equal(st.cuda_graph_capture_failures, 0);
  assert_true(st.cuda_graph_replays >= 1);
}

static void test_chat_while_stepping(void **state) {
  (void)state;
  static result g[NREQ];
  run(true, 0, true, g);
  same("a chat template rendered alongside", eager, g);
}

static void test_tp2(void **state) {
  (void)state;
  static result e2[NREQ], g2[NREQ];
  run_tp(pkg_path, 2, false, 0, false, e2);
  servd_model_stats st = run_tp(pkg_path, 2, true, 0, false, g2);
  engine_gpu_close_to("TP 2 (eager) against TP 1", eager, e2, NREQ);
  same("TP 2 graphs against TP 2 eager", e2, g2);
  assert_true(st.cuda_graph_captures >= 3);
  assert_true(st.cuda_graph_replays >= 6);
  assert_int_equal(st.cuda_graph_capture_failures, 0);
}

/* A graph launch failing on one rank while the other replays (its collectives then wait for the
 * failed rank): the communicator is aborted and rebuilt, the step's requests fail, the graphs are
 * captured again and later requests are right. Three times: whichever rank launches first fails. */
static void test_tp2_replay_failure_recovers(void **state) {
  (void)state;
  static result e2[NREQ], g[NREQ];
  run_tp(pkg_path, 2, false, 0, false, e2);
  servd_model *m = NULL;
  if (load_tp(pkg_path, 2, true, 0.9, &m)) fail_msg("load: %s", servd_last_error());
  run_on(m, 0, false, false, g);
  same("TP 2 graphs", e2, g);
  for (int k = 0; k < 3; k++) {
    fake_cuda_fail_graph_launches(1);
    int failed = run_on(m, 0, false, true, g);
    fake_cuda_fail_graph_launches(0);
    assert_true(failed >= 1);
    run_on(m, 0, false, false, g);
    same("TP 2 after a failed graph launch", e2, g);
  }
  servd_model_stats st = unload(m);
  assert_true(st.cuda_graph_captures >= 6); /* captured again after each failure */
}

/* Runs the requests on TP 2 with graphs into ref (a run without the fault), then loads the faulty
 * package the same way with a step timeout of timeout_s and returns it. */
static servd_model *reference_then_faulty(result *ref, double timeout_s) {
  servd_model *m = NULL;
  if (load_tp(pkg_path, 2, true, 0.9, &m)) fail_msg("load: %s", servd_last_error());
  run_on(m, 0, false, false, ref);
  unload(m);
  step_timeout_s = timeout_s;
  int rc = load_tp(faulty_path, 2, true, 0.9, &m);
  step_timeout_s = 120;
  if (rc) fail_msg("load: %s", servd_last_error());
  return m;
}

/* Submits one greedy request of n (at most 32) prompt tokens for 4 tokens, a step the faulty package
 * fails on, and waits for it: it must fail with SERVD_EMODEL; bad holds its error. */
static void run_faulty_step(servd_model *m, int n, const char *what, result *bad) {
  engine_gpu_result_init(bad);
  bad->on_token = bump;
  int32_t ids[32];
  for (int i = 0; i < n; i++) ids[i] = 3 + i;
  servd_request *q = NULL;
  assert_int_equal(engine_gpu_submit_ids(m, ids, n, 4, false, bad, &q), 0);
  engine_gpu_wait(bad, q);
  printf("%s: %d: %s\n", what, bad->error_code, bad->error);
  assert_int_equal(bad->error_code, SERVD_EMODEL);
}

/* The package's forward raises on rank 1 once, in its second decode step of one sequence: the
 * capture of bucket 1 on rank 1 (rank 0 captures). The bucket is disabled on both ranks, the step
 * runs eagerly, the request completes with the tokens of a run without the fault. */
static void test_tp2_rank_raises_in_capture(void **state) {
  (void)state;
  static result ref[NREQ], got[NREQ];
  servd_model *m = reference_then_faulty(ref, 120);
  run_on(m, 0, false, false, got);
  servd_model_stats st = unload(m);
  same("TP 2, rank 1 raising in a capture", ref, got);
  assert_true(st.cuda_graph_capture_failures >= 1);
}

/* Rank 1 raises in an eager step while rank 0 waits in an all-reduce for it: the communicator is
 * aborted, the step's request fails naming rank 1, the communicator is rebuilt and later requests
 * get the tokens of a run without the fault. */
static void test_tp2_rank_raises_eager(void **state) {
  (void)state;
  static result ref[NREQ], got[NREQ];
  static result bad;
  servd_model *m = reference_then_faulty(ref, 120);
  for (int round = 0; round < 2; round++) {
    run_faulty_step(m, 13, "the faulty step", &bad);
    assert_non_null(strstr(bad.error, "rank 1"));
    run_on(m, 0, false, false, got);
    same("TP 2 after rank 1 raised in an eager step", ref, got);
  }
  unload(m);
}

/* Rank 1 loops forever in a step of 17 tokens while rank 0 waits in an all-reduce; the step timeout
 * interrupts it: that request fails, NCCL is rebuilt, later requests are right. The timeout (15 s)
 * is far above a healthy step of the stand-in even on a loaded 2-core machine (2 s was not). */
static void test_tp2_step_timeout(void **state) {
  (void)state;
  static result ref[NREQ], got[NREQ];
  static result bad;
  servd_model *m = reference_then_faulty(ref, 15);
  run_faulty_step(m, 17, "the hung step", &bad);
  assert_non_null(strstr(bad.error, "TimeoutError (rank 1)"));
  assert_non_null(strstr(bad.error, "step timeout"));
  run_on(m, 0, false, false, got);
  same("TP 2 after rank 1 hung in an eager step", ref, got);
  unload(m);
}

/* Two models on GPU 0; the second unloads (trimming the weight cache, giving cached device memory
 * back, which makes the first model's graphs stale) while the first serves: its tokens stay right. */
typedef struct unload_job {
  servd_model *m;
} unload_job;
static void *unload_main(void *p) {
  servd_model_unload(((unload_job *)p)->m, 0);
  return NULL;
}

static void test_other_model_unloads(void **state) {
  (void)state;
  static result g[NREQ];
  servd_model *a = NULL, *b = NULL;
  if (load(true, 0.45, &a) || load(true, 0.9, &b)) fail_msg("load: %s", servd_last_error());
  run_on(a, 0, false, false, g); /* a's buckets captured */
  same("model A", eager, g);
  run_on(b, 0, false, false, g);
  same("model B", eager, g);
  unload_job uj = {b};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, unload_main, &uj), 0);
  run_on(a, 0, false, false, g);
  pthread_join(th, NULL);
  same("model A while B unloads", eager, g);
  run_on(a, 0, false, false, g);
  same("model A after B unloaded", eager, g);
  unload(a);
}

/* Runs the requests on m and checks that nothing was allocated on the devices and no device memory
 * moved since the load (graphs captured at the load's generation stay valid). */
static void run_without_growth(servd_model *m, int gpus, result *res) {
  fake_cuda_stats before, after;
  fake_cuda_get_stats(&before);
  uint64_t gen[2];
  for (int d = 0; d < gpus; d++) gen[d] = servd_cuda_generation(d);
  run_on(m, 0, false, false, res);
  run_on(m, 0, false, false, res); /* every bucket replayed */
  fake_cuda_get_stats(&after);
  for (int d = 0; d < gpus; d++)
    if (servd_cuda_generation(d) != gen[d])
      fail_msg("cuda:%d: device memory moved after the load (generation %llu -> %llu)", d, (unsigned long long)gen[d],
               (unsigned long long)servd_cuda_generation(d));
  assert_int_equal(after.mallocs, before.mallocs);
  assert_int_equal(after.device_bytes, before.device_bytes);
  servd_model_stats st;
  servd_model_get_stats(m, &st);
  assert_true(st.cuda_graph_captures >= 3);
  assert_true(st.cuda_graph_replays >= 6);
  assert_int_equal(st.cuda_graph_capture_failures, 0);
}

/* Device memory after the load: the weights (what was in use when the warm-up began: the only
 * model, so its weights as allocated, at least their bytes), the KV cache and the steps' measured
 * share; nothing else (the warm-up's cache was given back). */
static void check_accounting(servd_model *m, int gpus) {
  servd_model_stats st;
  servd_model_get_stats(m, &st);
  fake_cuda_stats fs;
  fake_cuda_get_stats(&fs);
  size_t weights = 0;
  for (int d = 0; d < gpus; d++) weights += servd_device_weights_bytes(d);
  printf("after load: %zu bytes on the devices = weights %llu (%zu bytes of tensors) + KV %llu + steps %llu\n",
         fs.device_bytes, (unsigned long long)st.gpu_base_bytes, weights, (unsigned long long)st.gpu_kv_bytes,
         (unsigned long long)st.gpu_step_bytes);
  assert_true(st.gpu_kv_bytes > 0 && st.gpu_step_bytes > 0);
  assert_true(st.gpu_base_bytes >= weights && st.gpu_base_bytes < weights + weights / 2); /* size-class rounding */
  assert_int_equal(fs.device_bytes, st.gpu_base_bytes + st.gpu_kv_bytes + st.gpu_step_bytes);
}

/* Loads on gpus GPUs with graphs, checks the accounting and that steps allocate nothing; the tokens
 * must equal ref's. */
static void check_profiled(int gpus, const result *ref, const char *what) {
  static result g[NREQ];
  servd_model *m = NULL;
  if (load_tp(pkg_path, gpus, true, 0.9, &m)) fail_msg("load: %s", servd_last_error());
  check_accounting(m, gpus);
  run_without_growth(m, gpus, g);
  same(what, ref, g);
  unload(m);
}

static void test_profiled_memory(void **state) {
  (void)state;
  check_profiled(1, eager, "after a profiled load");
}

static void test_tp2_profiled_memory(void **state) {
  (void)state;
  static result e2[NREQ];
  run_tp(pkg_path, 2, false, 0, false, e2);
  check_profiled(2, e2, "TP 2 after a profiled load");
}

/* A device that holds the model, the steps' memory, the reserve kept free and room for a few
 * contexts of KV cache: at --gpu-memory-fraction 1 the cache takes all the rest, and every step
 * still finds the memory it needs (no allocation, no memory moved). */
static void test_fraction_one(void **state) {
  (void)state;
  static result g[NREQ];
  servd_model *m = NULL;
  if (load(true, 0.9, &m)) fail_msg("load: %s", servd_last_error());
  servd_model_stats st;
  servd_model_get_stats(m, &st);
  fake_cuda_stats fs;
  fake_cuda_get_stats(&fs);
  size_t base = st.gpu_base_bytes + st.gpu_step_bytes; /* weights and steps */
  assert_int_equal(base + st.gpu_kv_bytes, fs.device_bytes);
  size_t per_block = st.gpu_kv_bytes / (size_t)st.kv_blocks_total;
  unload(m);
  /* 100 blocks beyond the reserve: fewer than max_seqs (8) full contexts of 32 blocks */
  fake_cuda_set_memory(base + ((size_t)256 << 20) + 100 * per_block + per_block / 2);
  int rc = load(true, 1.0, &m);
  fake_cuda_set_memory((size_t)4 << 30);
  if (rc) fail_msg("load at fraction 1: %s", servd_last_error());
  servd_model_get_stats(m, &st);
  printf("fraction 1: %d KV blocks\n", st.kv_blocks_total);
  assert_int_equal(st.kv_blocks_total, 100);
  run_without_growth(m, 1, g);
  same("fraction 1", eager, g);
  unload(m);
}

/* A device with room for the weights but not for what the warm-up steps allocate: the load fails
 * with the warm-up's reason (on the scheduler thread, where it runs) and leaves no device memory. */
static void test_warmup_does_not_fit(void **state) {
  (void)state;
  servd_model *m = NULL;
  if (load(true, 0.9, &m)) fail_msg("load: %s", servd_last_error());
  servd_model_stats st;
  servd_model_get_stats(m, &st);
  unload(m);
  fake_cuda_set_memory(st.gpu_base_bytes + st.gpu_step_bytes / 4);
  int rc = load(true, 0.9, &m);
  fake_cuda_set_memory((size_t)4 << 30);
  printf("load: rc %d: %s\n", rc, servd_last_error());
  assert_int_not_equal(rc, 0);
  assert_null(m);
  assert_non_null(strstr(servd_last_error(), "warm-up"));
  assert_non_null(strstr(servd_last_error(), "--max-batch-tokens"));
  fake_cuda_stats fs;
  fake_cuda_get_stats(&fs);
  assert_int_equal(fs.device_bytes, 0);
}

typedef struct embedding_result {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool done;
  int error_code;
  char error[256];
  float v[1024];
  int n;
} embedding_result;

static void on_embedding(void *ud, const servd_event *ev) {
  embedding_result *r = ud;
  if (ev->kind == SERVD_EVENT_TOKEN) return;
  pthread_mutex_lock(&r->mu);
  r->error_code = ev->error_code;
  if (ev->error_message) snprintf(r->error, sizeof r->error, "%s", ev->error_message);
  if (ev->embedding && ev->n_embedding <= 1024) {
    r->n = ev->n_embedding;
    memcpy(r->v, ev->embedding, sizeof(float) * (size_t)r->n);
  }
  r->done = true;
  pthread_cond_signal(&r->cv);
  pthread_mutex_unlock(&r->mu);
}

/* The embedding of prompt on a model loaded on `gpus` stand-in GPUs (0: the CPU). */
static void embed_on(int gpus, const char *prompt, embedding_result *r) {
  servd_model *m = NULL;
  if (load_tp(pkg_path, gpus, true, 0.9, &m)) fail_msg("load: %s", servd_last_error());
  memset(r, 0, sizeof *r);
  pthread_mutex_init(&r->mu, NULL);
  pthread_cond_init(&r->cv, NULL);
  int32_t *ids;
  int n;
  if (servd_model_tokenize(m, prompt, strlen(prompt), true, &ids, &n)) fail_msg("tokenize: %s", servd_last_error());
  servd_gen_params p;
  servd_gen_params_default(&p);
  p.embed = true;
  servd_request *req = NULL;
  if (servd_model_submit(m, ids, n, &p, on_embedding, r, &req)) fail_msg("submit: %s", servd_last_error());
  free(ids);
  pthread_mutex_lock(&r->mu);
  while (!r->done) pthread_cond_wait(&r->cv, &r->mu);
  pthread_mutex_unlock(&r->mu);
  servd_request_release(req);
  if (r->error_code) fail_msg("embedding on %d GPUs: %s", gpus, r->error);
  if (gpus) unload(m);
  else servd_model_unload(m, 0);
}

static void test_embedding(void **state) {
  (void)state;
  embedding_result cpu, gpu;
  const char *prompt = "The quick brown fox jumps over the lazy dog";
  embed_on(0, prompt, &cpu);
  embed_on(1, prompt, &gpu);
  assert_true(cpu.n > 0);
  assert_int_equal(gpu.n, cpu.n);
  double dot = 0, nc = 0, ng = 0;
  for (int i = 0; i < cpu.n; i++) {
    dot += (double)cpu.v[i] * gpu.v[i];
    nc += (double)cpu.v[i] * cpu.v[i];
    ng += (double)gpu.v[i] * gpu.v[i];
  }
  /* Unit vectors both; bf16 activations through 12 layers move the direction by well under 1%. A
   * vector read as bf16 bytes, or logits instead of hidden rows, would point anywhere. */
  assert_true(fabs(nc - 1) < 1e-4 && fabs(ng - 1) < 1e-4);
  printf("embedding: cosine(GPU bf16, CPU f32) = %.6f over %d dimensions\n", dot, cpu.n);
  assert_true(dot > 0.99);
}

static void test_kv_does_not_fit(void **state) {
  (void)state;
  /* 4 GiB of device memory, of which a fraction of 1e-4 (~0.4 MB) may hold KV cache: less than one
   * 512-token context needs. */
  servd_model *m = NULL;
  int rc = load(true, 1e-4, &m);
  printf("load: rc %d: %s\n", rc, servd_last_error());
  assert_int_equal(rc, SERVD_ENOMEM);
  assert_null(m);
  assert_non_null(strstr(servd_last_error(), "KV cache"));
  fake_cuda_stats fs;
  fake_cuda_get_stats(&fs);
  assert_int_equal(fs.device_bytes, 0);
}

int main(int argc, char **argv) {
  if (engine_test_start(argc, argv, "engine-fakegpu", tmpdir, sizeof tmpdir)) return 1;
  fake_cuda_configure(2, (size_t)4 << 30);
  snprintf(pkg_path, sizeof pkg_path, "%s/m200.mpk", tmpdir);
  if (mpk_synth("200mb", 11, SERVD_BF16, NULL, pkg_path, NULL)) {
    fprintf(stderr, "synth: %s\n", servd_last_error());
    return 1;
  }
  /* The same model with a forward that raises once on rank 1, in the second step of one token. */
  char code_dir[256], cmd[1024];
  mpk_import_options io;
  if (engine_test_faulty_code(tmpdir, faulty_py, code_dir, sizeof code_dir, &io)) return 1;
  snprintf(faulty_path, sizeof faulty_path, "%s/faulty.mpk", tmpdir);
  if (mpk_synth("200mb", 11, SERVD_BF16, NULL, faulty_path, &io)) {
    fprintf(stderr, "synth: %s\n", servd_last_error());
    return 1;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_graphs_match_eager),     cmocka_unit_test(test_capture_failures),
      cmocka_unit_test(test_capture_forward_raises), cmocka_unit_test(test_replay_failure_recovers),
      cmocka_unit_test(test_memory_moves),           cmocka_unit_test(test_chat_while_stepping),
      cmocka_unit_test(test_kv_does_not_fit),        cmocka_unit_test(test_tp2),
      cmocka_unit_test(test_profiled_memory),        cmocka_unit_test(test_tp2_profiled_memory),
      cmocka_unit_test(test_fraction_one),           cmocka_unit_test(test_tp2_step_timeout),
      cmocka_unit_test(test_warmup_does_not_fit),    cmocka_unit_test(test_tp2_rank_raises_in_capture),
      cmocka_unit_test(test_tp2_rank_raises_eager),  cmocka_unit_test(test_tp2_replay_failure_recovers),
      cmocka_unit_test(test_other_model_unloads),    cmocka_unit_test(test_embedding),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
  if (system(cmd)) fprintf(stderr, "could not remove %s\n", tmpdir);
  fflush(NULL);
  _exit(rc); /* interpreters' namespaces must not run library destructors at exit */
}
