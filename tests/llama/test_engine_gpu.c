/* The engine on GPU 0 (needs a GPU; exits 77, skipped, without one): a synthesized 12-layer model
 * ("200mb": head_dim 64, bf16 weights) served on the CPU, on the GPU with CUDA graphs, and on the
 * GPU without them, by five concurrent greedy requests whose lengths differ, so that decode steps
 * run at batch 5, 4, 3, 2 and 1 (buckets 8, 4, 4, 2, 1).
 *
 * Checks: the GPU generates what the CPU generates, and graphs what no graphs generate. Oracle: the
 * CPU (f32 activations) for the GPU (bf16 activations), the eager GPU for the graph GPU. Rule: the
 * tokens are equal until the first difference, which is allowed only where the reference's top two
 * logprobs are within NEAR_TIE (rounding can swap a near tie; a wrong step moves logits by far more);
 * after it the sequences differ legitimately and are not compared further. The graph path must have
 * captured buckets, replayed steps (no Python) and failed no capture; with graphs off neither. Over
 * the CUDA stand-in, serving allocates no device memory beyond what the load's warm-up left. The
 * GPU steps of these greedy requests return picks (each row's top token), not logits.
 *
 * Integration (interpreters are loaded with dlmopen, which the sanitizers cannot follow).
 */
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
#include "servd/device.h"

#ifdef SERVD_TEST_FAKE_GPU
/* Built over tests/device/fake_cuda.c (llama_test_engine_fakegpu): the device layer on the host. */
#include "fake_cuda.h"
#endif

#define NREQ 5

typedef engine_gpu_result result;

static char pkg_path[256];
static char tmpdir[128];
static const char *prompts[NREQ] = {"Hello there, how are you?", "abc", "The quick brown fox jumps over the lazy dog",
                                    "0123456789", "Once upon a time in a land far away, there lived"};
static const int lengths[NREQ] = {24, 20, 16, 12, 8};
/* SERVD_ENGINE_GPU_TEST_ON_CPU=1: every run on the CPU, to check this test itself without a GPU. */
static bool on_cpu;

/* Loads the model (gpus 0: CPU), runs the requests at once, fills res; returns the model's stats. */
static servd_model_stats run_spec(int gpus, bool graphs, bool logprobs, int speculative, result *res) {
  servd_model_options o;
  engine_gpu_options(&o, pkg_path, on_cpu ? 0 : gpus, graphs);
  o.speculative = speculative;
  servd_model *m = NULL;
  int rc = servd_model_load(&o, &m);
  if (rc) fail_msg("load (gpus %d): %s", gpus, servd_last_error());
#ifdef SERVD_TEST_FAKE_GPU
  fake_cuda_stats loaded;
  fake_cuda_get_stats(&loaded);
#endif
  servd_request *req[NREQ];
  for (int i = 0; i < NREQ; i++) {
    engine_gpu_result_init(&res[i]);
    rc = engine_gpu_submit_prompt_ex(m, prompts[i], lengths[i], logprobs, &res[i], &req[i]);
    if (rc) fail_msg("submit: %s", servd_last_error());
  }
  for (int i = 0; i < NREQ; i++) {
    engine_gpu_wait(&res[i], req[i]);
    if (res[i].error_code) fail_msg("request %d (gpus %d, graphs %d): %s", i, gpus, graphs, res[i].error);
    assert_int_equal(res[i].n, lengths[i]);
  }
#ifdef SERVD_TEST_FAKE_GPU
  fake_cuda_stats served;
  fake_cuda_get_stats(&served);
  printf("fake GPU while serving (gpus %d, graphs %d): %llu mallocs, %zd bytes more than after load\n", gpus, graphs,
         (unsigned long long)(served.mallocs - loaded.mallocs), (ssize_t)(served.device_bytes - loaded.device_bytes));
  /* The load's warm-up steps (a full prefill, a full decode batch) left what serving needs: the KV
   * cache was sized from the memory left after them, so serving must not allocate more. */
  assert_int_equal(served.mallocs, loaded.mallocs);
#endif
  servd_model_stats st;
  servd_model_get_stats(m, &st);
  servd_model_unload(m, 0);
#ifdef SERVD_TEST_FAKE_GPU
  /* Unloading gives every byte of device memory back (weights, KV cache, buffers, graphs). */
  fake_cuda_stats fs;
  fake_cuda_get_stats(&fs);
  printf("fake GPU after unload: %zu bytes held, %llu mallocs, %llu frees, %llu graph launches\n", fs.device_bytes,
         (unsigned long long)fs.mallocs, (unsigned long long)fs.frees, (unsigned long long)fs.graph_launches);
  if (gpus > 0) assert_int_equal(fs.device_bytes, 0);
#endif
  return st;
}

static servd_model_stats run(int gpus, bool graphs, bool logprobs, result *res) {
  return run_spec(gpus, graphs, logprobs, SERVD_SPEC_OFF, res);
}

static void test_gpu_matches(void **state) {
  (void)state;
  static result cpu[NREQ], graphs[NREQ], eager[NREQ], picked[NREQ];
  run(0, false, true, cpu);
  servd_model_stats sg = run(1, true, true, graphs);
  servd_model_stats se = run(1, false, true, eager);
  servd_model_stats sp = run(1, true, false, picked); /* no logprobs: plain greedy, picks on the GPU */
  engine_gpu_close_to("GPU (eager) against the CPU", cpu, eager, NREQ);
  engine_gpu_close_to("GPU (graphs) against the GPU (eager)", eager, graphs, NREQ);
  printf("graphs: %llu eager steps, %llu captures, %llu replays, %llu capture failures\n",
         (unsigned long long)sg.eager_steps, (unsigned long long)sg.cuda_graph_captures,
         (unsigned long long)sg.cuda_graph_replays, (unsigned long long)sg.cuda_graph_capture_failures);
  if (on_cpu) return;
  assert_int_equal(sg.gpus, 1);
  assert_int_equal(sg.cuda_graph_capture_failures, 0);
  /* buckets 8, 4, 2 and 1 each see at least 3 decode steps (warm-up, capture, replays) */
  assert_true(sg.cuda_graph_captures >= 4);
  assert_true(sg.cuda_graph_replays >= 12);
  assert_int_equal(se.cuda_graph_captures, 0);
  assert_int_equal(se.cuda_graph_replays, 0);
  /* Without logprobs the steps hand back each row's top token, not its logits: the same tokens as the
   * same GPU's logits gave (one order, ties to the lower id, both ways), with graphs too. */
  printf("pick steps: %llu of %llu steps without logprobs; %llu with them\n", (unsigned long long)sp.pick_steps,
         (unsigned long long)sp.steps, (unsigned long long)(sg.pick_steps + se.pick_steps));
  assert_true(sp.pick_steps > 0);
  assert_int_equal(sg.pick_steps + se.pick_steps, 0);
  /* Speculation's verify rows (a row of logits per draft) through the same device step, with graphs
   * on (verify steps run eagerly, decode steps from graphs): the CPU's tokens. */
  static result spec[NREQ];
  servd_model_stats ss = run_spec(1, true, true, SERVD_SPEC_NGRAM, spec);
  printf("speculation on the GPU: %llu verify rows, %llu of %llu drafts accepted\n", (unsigned long long)ss.spec_drafts,
         (unsigned long long)ss.spec_accepted_tokens, (unsigned long long)ss.spec_draft_tokens);
  assert_true(ss.spec_drafts > 0);
  engine_gpu_close_to("GPU with verify rows against the CPU", cpu, spec, NREQ);
  for (int i = 0; i < NREQ; i++) {
    assert_int_equal(picked[i].n, graphs[i].n);
    for (int t = 0; t < picked[i].n; t++)
      if (picked[i].tokens[t] != graphs[i].tokens[t])
        fail_msg("request %d token %d: %d with picks, %d from the logits", i, t, picked[i].tokens[t],
                 graphs[i].tokens[t]);
  }
}

int main(int argc, char **argv) {
  if (engine_test_start(argc, argv, "engine-gpu", tmpdir, sizeof tmpdir)) return 1;
  int n = 0;
  char why[256] = "";
  servd_device_count(&n, why, sizeof why);
  on_cpu = getenv("SERVD_ENGINE_GPU_TEST_ON_CPU") != NULL;
  if (n < 1 && !on_cpu) {
    printf("SKIP: no GPU: %s\n", why);
    return 77;
  }
  snprintf(pkg_path, sizeof pkg_path, "%s/m200.mpk", tmpdir);
  if (mpk_synth("200mb", 11, SERVD_BF16, NULL, pkg_path, NULL)) {
    fprintf(stderr, "synth: %s\n", servd_last_error());
    return 1;
  }
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_gpu_matches)};
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  char cmd[256];
  snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
  if (system(cmd)) fprintf(stderr, "could not remove %s\n", tmpdir);
  fflush(NULL);
  _exit(rc); /* interpreters' namespaces must not run library destructors at exit */
}
