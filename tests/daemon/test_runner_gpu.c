/* The model runner's GPU protocol without a GPU: the runner, device_step and graph_plan are built
 * into this test over a fake device layer (device tensors in host memory, a "graph" that recomputes
 * its step's logits from the inputs last uploaded) and a fake interpreter pool whose forward counts
 * its calls. Checked against hand-computed logits and call counts: warm-up, capture and replay per
 * bucket on both ranks, replays calling no Python, padding rows cut off, prefill steps eager and
 * unpadded, graphs dropped when device memory moves, a failed capture on one rank disabling its
 * bucket for both and rerunning the step eagerly, a failing rank aborting and resetting NCCL, and
 * --cuda-graphs off. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine/model_runner.h"

#define VOCAB 5
#define WORLD 2

/* ---- fake devices ---------------------------------------------------------------------------- */

struct servd_device_batch {
  int device, max_tokens, max_seqs;
  int n_tokens;
  int32_t *tokens, *positions;
};

typedef struct fake_graph {
  int device;
  uint64_t generation;
  servd_device_batch *db;
  servd_tensor *logits; /* what the captured forward returned (rank 0), written at launch */
} fake_graph;

static uint64_t generation[WORLD];
static _Thread_local fake_graph *capturing;
static int graphs_alive, launches, comm_aborts, comm_resets;
static int forward_calls[WORLD];
static int fail_capture_rank = -1, fail_forward_rank = -1;
static int bump_on_upload = -1; /* device whose memory "moves" at its next upload (another thread) */
static int last_forward_tokens[WORLD];
static int syncs[WORLD];
static int64_t last_timeout[WORLD];
static servd_device_kv *last_dkv[WORLD];

/* The model: logit j of row i = 1000 token + 10 position + j (exact in f32). */
static void compute(servd_tensor *logits, const int32_t *tokens, const int32_t *positions, int rows) {
  for (int i = 0; i < rows; i++) {
    float *row = (float *)((char *)servd_tensor_data(logits) + i * logits->strides[0]);
    for (int j = 0; j < VOCAB; j++) row[j] = 1000.0f * (float)tokens[i] + 10.0f * (float)positions[i] + (float)j;
  }
}

int servd_device_batch_create(int device, int max_tokens, int max_seqs, int max_blocks_per_seq,
                              servd_device_batch **out) {
  (void)max_blocks_per_seq;
  servd_device_batch *db = calloc(1, sizeof *db);
  db->device = device;
  db->max_tokens = max_tokens;
  db->max_seqs = max_seqs;
  db->tokens = calloc((size_t)max_tokens, sizeof(int32_t));
  db->positions = calloc((size_t)max_tokens, sizeof(int32_t));
  *out = db;
  return 0;
}

void servd_device_batch_destroy(servd_device_batch *db) {
  if (!db) return;
  free(db->tokens);
  free(db->positions);
  free(db);
}

int servd_device_batch_upload(servd_device_batch *db, int n_tokens, const int32_t *tokens, const int32_t *positions,
                              const int32_t *slots, int n_logit_rows, const int32_t *logit_rows,
                              const servd_attn_batch *attn, int block_size) {
  (void)slots, (void)logit_rows, (void)block_size;
  if (capturing) fail_msg("upload during a capture");
  if (n_tokens > db->max_tokens || attn->n_seqs > db->max_seqs || n_logit_rows > n_tokens)
    return servd_fail(SERVD_ERANGE, "fake upload: %d tokens, %d seqs beyond %d, %d", n_tokens, attn->n_seqs,
                      db->max_tokens, db->max_seqs);
  if (db->device == bump_on_upload) {
    generation[db->device]++;
    bump_on_upload = -1;
  }
  memcpy(db->tokens, tokens, sizeof(int32_t) * (size_t)n_tokens);
  memcpy(db->positions, positions, sizeof(int32_t) * (size_t)n_tokens);
  db->n_tokens = n_tokens;
  return 0;
}

uint64_t servd_device_generation(int device) { return generation[device]; }

int servd_device_graph_begin(int device) {
  if (capturing) return servd_fail(SERVD_EINVAL, "fake: already capturing");
  capturing = calloc(1, sizeof *capturing);
  capturing->device = device;
  return 0;
}

int servd_device_graph_end(int device, servd_device_graph **out) {
  fake_graph *g = capturing;
  capturing = NULL;
  assert_non_null(g);
  assert_int_equal(g->device, device);
  g->generation = generation[device];
  graphs_alive++;
  *out = (servd_device_graph *)g;
  return 0;
}

int servd_device_graph_launch(servd_device_graph *graph) {
  fake_graph *g = (fake_graph *)graph;
  if (generation[g->device] != g->generation) return servd_fail(SERVD_ECANCELED, "fake: stale graph");
  launches++;
  if (g->logits) compute(g->logits, g->db->tokens, g->db->positions, (int)g->logits->shape[0]);
  return 0;
}

void servd_device_graph_destroy(servd_device_graph *graph) {
  fake_graph *g = (fake_graph *)graph;
  if (!g) return;
  servd_tensor_release(g->logits);
  graphs_alive--;
  free(g);
}

int servd_device_copy(servd_tensor *dst, const servd_tensor *src) {
  assert_true(src->device >= 0 && dst->device < 0);
  assert_int_equal(dst->shape[0], src->shape[0]);
  assert_int_equal(dst->shape[1], src->shape[1]);
  for (int64_t i = 0; i < src->shape[0]; i++)
    memcpy((char *)servd_tensor_data(dst) + i * dst->strides[0],
           (const char *)servd_tensor_data(src) + i * src->strides[0], sizeof(float) * (size_t)src->shape[1]);
  return 0;
}

int servd_device_tensor_new(int device, servd_dtype dtype, int ndim, const int64_t *shape, servd_tensor **out) {
  *out = servd_tensor_new(dtype, ndim, shape);
  if (!*out) return SERVD_ENOMEM;
  (*out)->device = device;
  return 0;
}

/* Top-1 of each row in the greedy order: the larger value, ties to the lower index. */
int servd_device_topk(servd_tensor *values, servd_tensor *indices, const servd_tensor *x, int k) {
  assert_int_equal(k, 1);
  assert_true(x->device >= 0 && values->device == x->device && indices->device == x->device);
  assert_int_equal(values->shape[0], x->shape[0]);
  for (int64_t i = 0; i < x->shape[0]; i++) {
    const float *row = (const float *)((const char *)servd_tensor_data(x) + i * x->strides[0]);
    int best = 0;
    for (int j = 1; j < x->shape[1]; j++)
      if (row[j] > row[best]) best = j;
    ((float *)servd_tensor_data(values))[i] = row[best];
    ((int32_t *)servd_tensor_data(indices))[i] = best;
  }
  return 0;
}

int servd_device_sync(int device) {
  __atomic_add_fetch(&syncs[device], 1, __ATOMIC_SEQ_CST);
  return 0;
}

/* Rank worker threads release their device contexts before they end (not in a thread-exit
 * destructor): counted here. */
static int thread_releases;
void servd_device_thread_release(void) { __atomic_add_fetch(&thread_releases, 1, __ATOMIC_SEQ_CST); }

void servd_device_comm_abort(servd_device_comm *c) {
  (void)c;
  __atomic_add_fetch(&comm_aborts, 1, __ATOMIC_SEQ_CST);
}

int servd_device_comm_reset(servd_device_comm *c) {
  (void)c;
  comm_resets++;
  return 0;
}

/* ---- a fake pool of WORLD interpreters, interpreter i on GPU i ---------------------------------- */

int servd_pool_size(const servd_pool *p) {
  (void)p;
  return WORLD;
}

servd_interp *servd_pool_get(servd_pool *p, int index) {
  (void)p;
  return (servd_interp *)(intptr_t)(index + 1);
}

int servd_interp_forward(servd_interp *it, const servd_forward_batch *b, servd_tensor **logits, servd_py_error *err) {
  int rank = (int)(intptr_t)it - 1;
  __atomic_add_fetch(&forward_calls[rank], 1, __ATOMIC_SEQ_CST);
  last_dkv[rank] = b->dkv;
  last_forward_tokens[rank] = b->n_tokens;
  *logits = NULL;
  if (!b->dbatch || !b->dkv || b->max_tokens < b->n_tokens || b->max_seqs < b->attn.n_seqs)
    return servd_fail(SERVD_EINVAL, "fake forward: no device inputs");
  if ((capturing && rank == fail_capture_rank) || rank == fail_forward_rank) {
    snprintf(err->type, sizeof err->type, "RuntimeError");
    snprintf(err->message, sizeof err->message, "rank %d fails", rank);
    return SERVD_EINVAL;
  }
  if (rank != 0) return 0;
  int64_t shape[2] = {b->n_logit_rows, VOCAB};
  servd_tensor *t = servd_tensor_new(SERVD_F32, 2, shape);
  t->device = rank;
  if (capturing) {
    /* Nothing runs now: the graph writes these logits when launched. */
    capturing->db = b->dbatch;
    servd_tensor_retain(t);
    capturing->logits = t;
  } else {
    /* logit rows are the token rows here: decode steps and the prefill steps below */
    int32_t tok[64], pos[64];
    for (int i = 0; i < b->n_logit_rows; i++) {
      tok[i] = b->tokens[b->logit_rows[i]];
      pos[i] = b->positions[b->logit_rows[i]];
    }
    compute(t, tok, pos, b->n_logit_rows);
  }
  *logits = t;
  return 0;
}

/* The step deadline (engine/forward_call.c) is the interpreters'; here the fake forward runs. */
int servd_engine_forward(servd_interp *it, const servd_forward_batch *b, int64_t timeout_ms, servd_tensor **logits,
                         servd_py_error *err) {
  last_timeout[(int)(intptr_t)it - 1] = timeout_ms;
  return servd_interp_forward(it, b, logits, err);
}

/* ---- steps ----------------------------------------------------------------------------------- */

typedef struct step {
  int n;
  int32_t tok[16], pos[16], slot[16], rows[16], qs[16], ql[16], kvl[16];
  const int32_t *tables[16];
  int32_t table[4];
  servd_forward_batch b;
} step;

/* n decoding sequences with tokens base+i at position 10+i. */
static void decode_step(step *s, int n, int base) {
  memset(s, 0, sizeof *s);
  s->n = n;
  for (int i = 0; i < n; i++) {
    s->tok[i] = base + i;
    s->pos[i] = 10 + i;
    s->slot[i] = 10 + i;
    s->rows[i] = i;
    s->qs[i] = i;
    s->ql[i] = 1;
    s->kvl[i] = 11 + i;
    s->tables[i] = s->table;
  }
  s->b = (servd_forward_batch){
      .n_tokens = n,
      .tokens = s->tok,
      .positions = s->pos,
      .slots = s->slot,
      .n_logit_rows = n,
      .logit_rows = s->rows,
      .attn = {.n_seqs = n, .q_start = s->qs, .q_len = s->ql, .kv_len = s->kvl, .block_tables = s->tables}};
}

/* One sequence prefilling 4 tokens (logits of the last one). */
static void prefill_step(step *s, int base) {
  memset(s, 0, sizeof *s);
  for (int i = 0; i < 4; i++) {
    s->tok[i] = base + i;
    s->pos[i] = i;
    s->slot[i] = i;
  }
  s->rows[0] = 3;
  s->qs[0] = 0;
  s->ql[0] = 4;
  s->kvl[0] = 4;
  s->tables[0] = s->table;
  s->b = (servd_forward_batch){
      .n_tokens = 4,
      .tokens = s->tok,
      .positions = s->pos,
      .slots = s->slot,
      .n_logit_rows = 1,
      .logit_rows = s->rows,
      .attn = {.n_seqs = 1, .q_start = s->qs, .q_len = s->ql, .kv_len = s->kvl, .block_tables = s->tables}};
}

typedef struct fixture {
  servd_runner *r;
  servd_kv_cache *kv[WORLD];
  servd_device_kv *dkv[WORLD];
  int devices[WORLD];
} fixture;

static fixture *make(bool graphs, int graph_max_batch) {
  fixture *f = calloc(1, sizeof *f);
  for (int k = 0; k < WORLD; k++) {
    f->devices[k] = k;
    f->dkv[k] = (servd_device_kv *)(intptr_t)(0x100 + k); /* opaque to the runner */
    generation[k] = 7;
    forward_calls[k] = 0;
    syncs[k] = 0;
    last_timeout[k] = -1;
  }
  graphs_alive = launches = comm_aborts = comm_resets = thread_releases = 0;
  fail_capture_rank = fail_forward_rank = bump_on_upload = -1;
  servd_runner_gpu g = {.devices = f->devices,
                        .dkv = f->dkv,
                        .dcomm = (servd_device_comm *)(intptr_t)0x200,
                        .max_tokens = 16,
                        .max_seqs = 16,
                        .max_blocks_per_seq = 4,
                        .block_size = 16,
                        .graphs = graphs,
                        .graph_max_batch = graph_max_batch};
  assert_int_equal(servd_runner_create_gpu((servd_pool *)(intptr_t)0x300, f->kv, WORLD, &g, &f->r), 0);
  return f;
}

static void destroy(fixture *f) {
  servd_runner_destroy(f->r);
  assert_int_equal(graphs_alive, 0);
  assert_int_equal(thread_releases, WORLD - 1); /* every rank worker (rank 0 runs on the caller's thread) */
  free(f);
}

/* Runs s; checks the logits the engine gets: n_logit_rows rows of the model's values. */
static void run_ok(fixture *f, const step *s) {
  servd_tensor *logits = NULL;
  servd_py_error err;
  memset(&err, 0, sizeof err);
  int failed = -2;
  int rc = servd_runner_step(f->r, &s->b, &logits, &err, &failed);
  if (rc) fail_msg("step: %s (%s: %s)", servd_last_error(), err.type, err.message);
  assert_int_equal(failed, -1);
  assert_non_null(logits);
  assert_true(logits->device < 0);
  assert_int_equal(logits->ndim, 2);
  assert_int_equal(logits->shape[0], s->b.n_logit_rows);
  assert_int_equal(logits->shape[1], VOCAB);
  for (int i = 0; i < s->b.n_logit_rows; i++) {
    const float *row = (const float *)((const char *)servd_tensor_data(logits) + i * logits->strides[0]);
    int t = s->b.logit_rows[i];
    for (int j = 0; j < VOCAB; j++) {
      float want = 1000.0f * (float)s->b.tokens[t] + 10.0f * (float)s->b.positions[t] + (float)j;
      if (row[j] != want) fail_msg("logit [%d][%d] = %g, expected %g", i, j, row[j], want);
    }
  }
  servd_tensor_release(logits);
}

/* Runs s asking for picks; checks them: each row's top token (the last, VOCAB - 1) and its logit. */
static void run_picks(fixture *f, step *s) {
  s->b.want_picks = true;
  servd_tensor *picks = NULL;
  servd_py_error err;
  memset(&err, 0, sizeof err);
  int failed = -2;
  int rc = servd_runner_step(f->r, &s->b, &picks, &err, &failed);
  if (rc) fail_msg("step: %s (%s: %s)", servd_last_error(), err.type, err.message);
  assert_non_null(picks);
  assert_true(picks->device < 0 && picks->dtype == SERVD_I32 && picks->ndim == 2);
  assert_int_equal(picks->shape[0], s->b.n_logit_rows);
  assert_int_equal(picks->shape[1], 2);
  for (int i = 0; i < s->b.n_logit_rows; i++) {
    const int32_t *row = (const int32_t *)((const char *)servd_tensor_data(picks) + i * picks->strides[0]);
    int t = s->b.logit_rows[i];
    float logit, want = 1000.0f * (float)s->b.tokens[t] + 10.0f * (float)s->b.positions[t] + (float)(VOCAB - 1);
    memcpy(&logit, &row[1], sizeof logit);
    assert_int_equal(row[0], VOCAB - 1);
    if (logit != want) fail_msg("pick %d: logit %g, expected %g", i, logit, want);
  }
  servd_tensor_release(picks);
  s->b.want_picks = false;
}

static void expect_calls(int rank0, int rank1) {
  assert_int_equal(forward_calls[0], rank0);
  assert_int_equal(forward_calls[1], rank1);
}

static void test_warmup_capture_replay(void **state) {
  (void)state;
  fixture *f = make(true, 8); /* buckets 1, 2, 4, 8 */
  step s;
  decode_step(&s, 3, 100);
  run_ok(f, &s); /* warm-up: padded to 4, through Python on both ranks */
  expect_calls(1, 1);
  assert_int_equal(last_forward_tokens[0], 4);
  assert_int_equal(last_forward_tokens[1], 4);
  assert_int_equal(launches, 0);

  decode_step(&s, 3, 200);
  run_ok(f, &s); /* capture on both ranks (one Python call each), then launch */
  expect_calls(2, 2);
  assert_int_equal(graphs_alive, 2);
  assert_int_equal(launches, 2);

  for (int k = 0; k < 3; k++) {
    decode_step(&s, 3, 300 + 10 * k);
    run_ok(f, &s); /* replay: new inputs, no Python */
  }
  expect_calls(2, 2);
  assert_int_equal(launches, 8);

  /* 4 sequences share the bucket of 4: replayed too */
  decode_step(&s, 4, 400);
  run_ok(f, &s);
  expect_calls(2, 2);

  /* a prefill step: unpadded, through Python */
  prefill_step(&s, 500);
  run_ok(f, &s);
  expect_calls(3, 3);
  assert_int_equal(last_forward_tokens[0], 4);

  /* 9 sequences: beyond the largest bucket (8): eager, unpadded */
  decode_step(&s, 9, 600);
  run_ok(f, &s);
  expect_calls(4, 4);
  assert_int_equal(last_forward_tokens[1], 9);

  servd_runner_stats st;
  servd_runner_get_stats(f->r, &st);
  assert_int_equal(st.steps, 8);
  assert_int_equal(st.graph_captures, 1);
  assert_int_equal(st.graph_replays, 5);
  assert_int_equal(st.eager_steps, 3);
  destroy(f);
}

static void test_generation_drops(void **state) {
  (void)state;
  fixture *f = make(true, 8);
  step s;
  decode_step(&s, 2, 100);
  run_ok(f, &s);
  run_ok(f, &s);
  assert_int_equal(graphs_alive, 2);
  expect_calls(2, 2);
  generation[1]++; /* memory moved on rank 1's GPU */
  decode_step(&s, 2, 200);
  run_ok(f, &s); /* every graph dropped; warm up again */
  assert_int_equal(graphs_alive, 0);
  expect_calls(3, 3);
  run_ok(f, &s); /* capture again */
  assert_int_equal(graphs_alive, 2);
  expect_calls(4, 4);
  run_ok(f, &s);
  expect_calls(4, 4);
  servd_runner_stats st;
  servd_runner_get_stats(f->r, &st);
  assert_int_equal(st.graph_drops, 1);
  assert_int_equal(st.graph_captures, 2);

  /* Memory moves on rank 1's GPU after the runner looked, before the launch: rank 1 runs the step
   * through Python (its collectives match the graph's), rank 0 replays; then every graph goes. */
  bump_on_upload = 1;
  decode_step(&s, 2, 300);
  run_ok(f, &s);
  expect_calls(4, 5);
  decode_step(&s, 2, 400);
  run_ok(f, &s);
  assert_int_equal(graphs_alive, 0);
  expect_calls(5, 6);
  destroy(f);
}

static void test_capture_failure(void **state) {
  (void)state;
  fixture *f = make(true, 8);
  fail_capture_rank = 1;
  step s;
  decode_step(&s, 3, 100);
  run_ok(f, &s); /* warm-up */
  expect_calls(1, 1);
  decode_step(&s, 3, 200);
  run_ok(f, &s); /* the capture fails on rank 1: no graph kept anywhere, the step reruns eagerly */
  assert_int_equal(graphs_alive, 0);
  expect_calls(3, 3);
  assert_int_equal(last_forward_tokens[0], 3); /* unpadded */
  assert_int_equal(last_forward_tokens[1], 3);
  assert_int_equal(comm_aborts, 0); /* captures run nothing: no rank waits in a collective */
  decode_step(&s, 3, 300);
  run_ok(f, &s); /* the bucket stays eager */
  expect_calls(4, 4);
  assert_int_equal(launches, 0);
  /* another bucket still gets graphs */
  fail_capture_rank = -1;
  decode_step(&s, 1, 400);
  run_ok(f, &s);
  run_ok(f, &s);
  run_ok(f, &s);
  expect_calls(6, 6);
  assert_int_equal(graphs_alive, 2);
  servd_runner_stats st;
  servd_runner_get_stats(f->r, &st);
  assert_int_equal(st.graph_capture_failures, 1);
  destroy(f);
}

static void test_rank_failure(void **state) {
  (void)state;
  fixture *f = make(true, 8);
  step s;
  decode_step(&s, 2, 100);
  fail_forward_rank = 1;
  servd_tensor *logits = NULL;
  servd_py_error err;
  memset(&err, 0, sizeof err);
  int failed = -2;
  assert_int_equal(servd_runner_step(f->r, &s.b, &logits, &err, &failed), SERVD_EINVAL);
  assert_null(logits);
  assert_int_equal(failed, 1);
  assert_string_equal(err.type, "RuntimeError");
  assert_non_null(strstr(servd_last_error(), "rank 1"));
  assert_int_equal(comm_aborts, 1);
  assert_int_equal(comm_resets, 1);
  /* the runner goes on; the failed step did not count as the bucket's warm-up */
  fail_forward_rank = -1;
  run_ok(f, &s);
  assert_int_equal(launches, 0);
  run_ok(f, &s);
  assert_int_equal(launches, 2);
  destroy(f);
}

static void test_graphs_off(void **state) {
  (void)state;
  fixture *f = make(false, 64);
  step s;
  for (int k = 0; k < 4; k++) {
    decode_step(&s, 3, 100 + k);
    run_ok(f, &s);
  }
  expect_calls(4, 4);
  assert_int_equal(last_forward_tokens[0], 3);
  assert_int_equal(launches, 0);
  assert_int_equal(graphs_alive, 0);
  destroy(f);
}

/* A prefill chunk that wants no logits: rank 0 downloads nothing, so it waits for its device at the
 * end of the step like the other ranks (a device fault shows in this step). */
static void test_no_logits_step_syncs(void **state) {
  (void)state;
  fixture *f = make(true, 8);
  step s;
  prefill_step(&s, 100);
  s.b.n_logit_rows = 0;
  servd_tensor *logits = NULL;
  servd_py_error err;
  memset(&err, 0, sizeof err);
  assert_int_equal(servd_runner_step(f->r, &s.b, &logits, &err, NULL), 0);
  assert_null(logits);
  assert_int_equal(syncs[0], 1);
  assert_int_equal(syncs[1], 1);
  destroy(f);
}

/* The step timeout reaches every rank's forward, eager and captured. */
static void test_step_timeout_passed(void **state) {
  (void)state;
  fixture *f = make(true, 8);
  step s;
  decode_step(&s, 2, 100);
  run_ok(f, &s);
  assert_int_equal(last_timeout[0], 0); /* none set */
  servd_runner_set_step_timeout(f->r, 1500);
  run_ok(f, &s); /* capture */
  assert_int_equal(last_timeout[0], 1500);
  assert_int_equal(last_timeout[1], 1500);
  prefill_step(&s, 200);
  last_timeout[0] = last_timeout[1] = -1;
  run_ok(f, &s);
  assert_int_equal(last_timeout[0], 1500);
  assert_int_equal(last_timeout[1], 1500);
  destroy(f);
}

/* Warm-up steps (servd_runner_eager) run unpadded on every rank and leave the graph bookkeeping
 * alone; a new device cache drops every graph and is what later forwards see. */
static void test_eager_and_new_cache(void **state) {
  (void)state;
  fixture *f = make(true, 8);
  step s;
  decode_step(&s, 3, 100);
  servd_tensor *logits = NULL;
  servd_py_error err;
  memset(&err, 0, sizeof err);
  assert_int_equal(servd_runner_eager(f->r, &s.b, &logits, &err, NULL), 0);
  assert_non_null(logits);
  assert_int_equal(logits->shape[0], 3);
  servd_tensor_release(logits);
  expect_calls(1, 1);
  assert_int_equal(last_forward_tokens[1], 3);
  servd_runner_stats st;
  servd_runner_get_stats(f->r, &st);
  assert_int_equal(st.steps, 0);
  run_ok(f, &s); /* still the bucket's warm-up (padded, through Python) */
  run_ok(f, &s); /* capture */
  expect_calls(3, 3);
  assert_int_equal(graphs_alive, 2);
  servd_device_kv *nkv[WORLD] = {(servd_device_kv *)(intptr_t)0x900, (servd_device_kv *)(intptr_t)0x901};
  assert_int_equal(servd_runner_set_device_kv(f->r, nkv), 0);
  assert_int_equal(graphs_alive, 0);
  run_ok(f, &s); /* warm-up again, over the new cache */
  expect_calls(4, 4);
  assert_ptr_equal(last_dkv[0], nkv[0]);
  assert_ptr_equal(last_dkv[1], nkv[1]);
  int mt = 0, ms = 0;
  servd_runner_capacity(f->r, &mt, &ms);
  assert_int_equal(mt, 16);
  assert_int_equal(ms, 16);
  destroy(f);
}

/* Greedy picks instead of logits: eager (the bucket's warm-up), at its capture and in replays; the
 * padded rows are cut off as the logits' are. */
static void test_picks(void **state) {
  (void)state;
  fixture *f = make(true, 8);
  step s;
  for (int k = 0; k < 4; k++) {
    decode_step(&s, 3, 100 + 10 * k); /* padded to 4: warm-up, capture, replay, replay */
    run_picks(f, &s);
  }
  assert_true(launches >= 2 * 2); /* captured and replayed on both ranks */
  decode_step(&s, 3, 500);
  run_ok(f, &s); /* the same bucket without picks: logits again */
  destroy(f);
}

static void test_bad_config(void **state) {
  (void)state;
  int devices[WORLD] = {0, 1};
  servd_device_kv *dkv[WORLD] = {(servd_device_kv *)1, (servd_device_kv *)2};
  servd_kv_cache *kv[WORLD] = {0};
  servd_runner *r = (servd_runner *)1;
  servd_runner_gpu g = {.devices = devices,
                        .dkv = dkv,
                        .dcomm = NULL,
                        .max_tokens = 16,
                        .max_seqs = 8,
                        .max_blocks_per_seq = 4,
                        .block_size = 16,
                        .graphs = true,
                        .graph_max_batch = 8};
  /* two ranks need a communicator */
  assert_int_equal(servd_runner_create_gpu((servd_pool *)1, kv, WORLD, &g, &r), SERVD_EINVAL);
  assert_null(r);
  assert_non_null(strstr(servd_last_error(), "communicator"));
  g.dcomm = (servd_device_comm *)1;
  g.max_seqs = 0;
  assert_int_equal(servd_runner_create_gpu((servd_pool *)1, kv, WORLD, &g, &r), SERVD_EINVAL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_warmup_capture_replay),
      cmocka_unit_test(test_generation_drops),
      cmocka_unit_test(test_capture_failure),
      cmocka_unit_test(test_rank_failure),
      cmocka_unit_test(test_graphs_off),
      cmocka_unit_test(test_picks),
      cmocka_unit_test(test_bad_config),
      cmocka_unit_test(test_no_logits_step_syncs),
      cmocka_unit_test(test_step_timeout_passed),
      cmocka_unit_test(test_eager_and_new_cache),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
