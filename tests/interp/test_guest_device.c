/* The servd module's GPU path without a GPU: an interpreter started for cuda:0 with a host table whose
 * device entries are stand-ins. A stand-in "device tensor" is a host tensor with device 0; the stand-ins
 * record their calls and compute on the host, so the test sees what the module asks of the device
 * layer: which entry, with which tensors, dtypes, KV cache, step inputs and communicator.
 *
 * Covered: servd.to_device's dtypes, to_host, copy, upload, empty(device=), views of device tensors,
 * the refusal of host reads of device tensors (buffer protocol, tolist, servd.tensor, predict outputs),
 * op dispatch and the mixed-device error, allreduce/allgather_cols through the device communicator,
 * batch inputs as views of the device batch, kv_write/attention through the device KV cache with the
 * step's device batch, max_tokens/max_seqs, device logits handed to the caller, and the device sync at
 * the end of loading (and a failed one failing the load).
 *
 * What it cannot show is that the device layer computes correctly: tests/gpu and scripts/gpu-check.sh
 * do that on a GPU. */
#include "support.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "op_dispatch.h"

enum { C_NEW, C_UPLOAD, C_WEIGHT, C_COPY, C_SYNC, C_KVW, C_ATT, C_AR, C_AG, C_BT, C_OP, C_N };
static int g_calls[C_N];
static servd_dtype g_upload_dtype;
static int g_sync_fail;
static char g_kv_tag, g_db_tag, g_comm_tag; /* opaque handles: the stand-ins compare, never read them */
#define FAKE_DKV ((servd_device_kv *)&g_kv_tag)
#define FAKE_DB ((servd_device_batch *)&g_db_tag)
#define FAKE_DCOMM ((servd_device_comm *)&g_comm_tag)
static const int32_t g_db_vals[4][3] = {{11, 12, 13}, {5, 6, 7}, {40, 41, 42}, {2}};
static const int g_db_n[4] = {3, 3, 3, 1};

static int on0(const servd_tensor *t) { return t && t->device == 0; }

/* Runs fn over tensors marked as on the host, then marks them back (single-threaded test). */
#define AS_HOST(n, ts, call) \
  ({ \
    int saved_[n]; \
    for (int i_ = 0; i_ < (n); i_++) saved_[i_] = (ts)[i_]->device, (ts)[i_]->device = -1; \
    int rc_ = (call); \
    for (int i_ = (n)-1; i_ >= 0; i_--) (ts)[i_]->device = saved_[i_]; /* reverse: aliases */ \
    rc_; \
  })

static int fake_new(int device, servd_dtype dtype, int ndim, const int64_t *shape, servd_tensor **out) {
  g_calls[C_NEW]++;
  *out = NULL;
  if (dtype != SERVD_BF16 && dtype != SERVD_F32 && dtype != SERVD_I32)
    return servd_fail(SERVD_EINVAL, "fake device_tensor_new: %s", servd_dtype_name(dtype));
  *out = servd_tensor_new(dtype, ndim, shape);
  if (!*out) return SERVD_EINVAL;
  (*out)->device = device;
  return 0;
}

/* A converted contiguous copy (the device's upload), rows through f32. */
static int convert(int device, const servd_tensor *host, servd_dtype dtype, servd_tensor **out) {
  if (host->device >= 0 || !servd_tensor_is_contiguous(host))
    return servd_fail(SERVD_EINVAL, "fake upload: a contiguous host tensor expected");
  int rc = fake_new(device, dtype, host->ndim, host->shape, out);
  if (rc < 0) return rc;
  int64_t cols = host->ndim ? host->shape[host->ndim - 1] : 1, rows = servd_tensor_numel(host) / cols;
  float *buf = malloc(sizeof(float) * (size_t)cols);
  for (int64_t r = 0; r < rows && rc == 0; r++) {
    rc = servd_row_to_f32(
        host->dtype, (const char *)servd_tensor_data(host) + r * servd_dtype_row_bytes(host->dtype, cols), buf, cols);
    if (rc == 0)
      rc = servd_row_from_f32(dtype, buf, (char *)servd_tensor_data(*out) + r * servd_dtype_row_bytes(dtype, cols),
                              cols);
  }
  free(buf);
  return rc;
}

static int fake_upload(int device, const servd_tensor *host, servd_dtype dtype, servd_tensor **out) {
  g_calls[C_UPLOAD]++;
  g_upload_dtype = dtype;
  return convert(device, host, dtype, out);
}

static int fake_weight(int device, const servd_tensor *host, servd_tensor **out) {
  g_calls[C_WEIGHT]++;
  return convert(device, host, SERVD_BF16, out);
}

static int fake_copy(servd_tensor *dst, const servd_tensor *src) {
  g_calls[C_COPY]++;
  servd_tensor *ts[2] = {dst, (servd_tensor *)src};
  return AS_HOST(2, ts, servd_op__copy(dst, src));
}

static int fake_sync(int device) {
  g_calls[C_SYNC]++;
  if (g_sync_fail) return servd_fail(SERVD_EDEVICE, "fake device_sync: an earlier kernel on device %d failed", device);
  return 0;
}

static int fake_kv_device(const servd_device_kv *kv) { return kv == FAKE_DKV ? 0 : -1; }

static int fake_kv_write(servd_device_kv *kv, int layer, const servd_tensor *k, const servd_tensor *v,
                         const servd_tensor *slots) {
  if (kv != FAKE_DKV || layer != 0 || !on0(k) || !on0(v) || !on0(slots) || slots->dtype != SERVD_I32)
    return servd_fail(SERVD_EINVAL, "fake kv_write: unexpected arguments");
  g_calls[C_KVW]++;
  return 0;
}

static int fake_attention(servd_tensor *out, const servd_tensor *q, const servd_device_kv *kv, int layer,
                          const servd_device_batch *db, int n_heads, float scale) {
  if (kv != FAKE_DKV || db != FAKE_DB || layer != 0 || n_heads != 2 || scale != 0.25f || !on0(out) || !on0(q))
    return servd_fail(SERVD_EINVAL, "fake attention: unexpected arguments");
  g_calls[C_ATT]++;
  return 0;
}

/* Two ranks holding the same x: the sum doubles it. */
static int fake_allreduce(servd_device_comm *c, int rank, servd_tensor *x) {
  if (c != FAKE_DCOMM || rank != 0 || !on0(x) || x->dtype != SERVD_F32 || !servd_tensor_is_contiguous(x))
    return servd_fail(SERVD_EINVAL, "fake allreduce: unexpected arguments");
  g_calls[C_AR]++;
  float *p = servd_tensor_data(x);
  for (int64_t i = 0; i < servd_tensor_numel(x); i++) p[i] *= 2;
  return 0;
}

static int fake_allgather(servd_device_comm *c, int rank, servd_tensor *out, const servd_tensor *x) {
  if (c != FAKE_DCOMM || rank != 0 || !on0(out) || !on0(x))
    return servd_fail(SERVD_EINVAL, "fake allgather_cols: unexpected arguments");
  g_calls[C_AG]++;
  return 0;
}

static servd_tensor *fake_batch_tensor(const servd_device_batch *db, servd_device_batch_field f) {
  if (db != FAKE_DB || f < 0 || f > SERVD_DB_LOGIT_ROWS) return NULL;
  g_calls[C_BT]++;
  servd_tensor *t = servd_tensor_new(SERVD_I32, 1, (int64_t[]){g_db_n[f]});
  memcpy(servd_tensor_data(t), g_db_vals[f], sizeof(int32_t) * (size_t)g_db_n[f]);
  t->device = 0;
  return t;
}

/* The dispatched ops the test uses: all on device 0, the host kernel on the stand-in tensors; any
 * other mix, the real dispatcher (which refuses a mix before any kernel runs). */
static int fake_add(servd_tensor *out, const servd_tensor *a, const servd_tensor *b) {
  if (!(on0(out) && on0(a) && on0(b))) return servd_op__add(out, a, b);
  g_calls[C_OP]++;
  servd_tensor *ts[3] = {out, (servd_tensor *)a, (servd_tensor *)b};
  return AS_HOST(3, ts, servd_add(out, a, b));
}

/* All on one device: no stand-in (the real op must never see a stand-in tensor). Host tensors and mixes
 * go to the real dispatcher, which runs the CPU op or refuses the mix before any kernel. */
static int refuse_device(const char *op, int n, const servd_tensor *const *ts) {
  for (int i = 0; i < n; i++)
    if (!ts[i] || ts[i]->device < 0 || ts[i]->device != ts[0]->device) return 0;
  return servd_fail(SERVD_EUNSUPPORTED, "%s: no stand-in for device tensors in this test", op);
}
static int guard_matmul(servd_tensor *out, const servd_tensor *x, const servd_tensor *w) {
  const servd_tensor *ts[] = {out, x, w};
  int rc = refuse_device("matmul", 3, ts);
  return rc < 0 ? rc : servd_op__matmul(out, x, w);
}
static int guard_embedding(servd_tensor *out, const servd_tensor *table, const servd_tensor *ids, int64_t off) {
  const servd_tensor *ts[] = {out, table, ids};
  int rc = refuse_device("embedding", 3, ts);
  return rc < 0 ? rc : servd_op__embedding(out, table, ids, off);
}
static int guard_rmsnorm(servd_tensor *out, const servd_tensor *x, const servd_tensor *w, float eps) {
  const servd_tensor *ts[] = {out, x, w};
  int rc = refuse_device("rmsnorm", 3, ts);
  return rc < 0 ? rc : servd_op__rmsnorm(out, x, w, eps);
}
static int guard_rope(servd_tensor *x, const servd_tensor *pos, const servd_rope_params *p) {
  const servd_tensor *ts[] = {x, pos};
  int rc = refuse_device("rope", 2, ts);
  return rc < 0 ? rc : servd_op__rope(x, pos, p);
}
static int guard_swiglu(servd_tensor *out, const servd_tensor *g, const servd_tensor *u) {
  const servd_tensor *ts[] = {out, g, u};
  int rc = refuse_device("swiglu", 3, ts);
  return rc < 0 ? rc : servd_op__swiglu(out, g, u);
}
static int guard_argmax(servd_tensor *out, const servd_tensor *x) {
  const servd_tensor *ts[] = {out, x};
  int rc = refuse_device("argmax", 2, ts);
  return rc < 0 ? rc : servd_op__argmax(out, x);
}
static int guard_topk(servd_tensor *v, servd_tensor *i, const servd_tensor *x, int k) {
  const servd_tensor *ts[] = {v, i, x};
  int rc = refuse_device("topk", 3, ts);
  return rc < 0 ? rc : servd_op__topk(v, i, x, k);
}

static servd_host_api g_host;
static servd_interp g_it; /* rank 0 of 2 on cuda:0 */
static char g_dir[64];

static const char *entry_py =
    "import servd\n"
    "from servd import ops\n"
    "class Entry:\n"
    "    def __init__(self):\n"
    "        self.w = servd.upload(servd.tensor([[1.0, 2.0], [3.0, 4.0]]))\n"
    "    def forward(self, batch):\n"
    "        assert [t.device for t in (batch.tokens, batch.positions, batch.slots, batch.logit_rows)] == ['cuda:0'] * "
    "4\n"
    "        assert batch.tokens.to_host().tolist() == [11, 12, 13], batch.tokens.to_host().tolist()\n"
    "        assert batch.positions.to_host().tolist() == [5, 6, 7]\n"
    "        assert batch.slots.to_host().tolist() == [40, 41, 42] and batch.logit_rows.to_host().tolist() == [2]\n"
    "        assert batch.kv.device == 'cuda:0' and repr(batch.kv) == 'servd.KVCache(cuda:0)'\n"
    "        assert (batch.max_tokens, batch.max_seqs, batch.n_tokens, batch.n_seqs) == (16, 4, 3, 1)\n"
    "        k = servd.empty((3, 8), 'bf16', device='cuda')\n"
    "        ops.kv_write(batch.kv, 0, k, k, batch.slots)\n"
    "        q = servd.empty((3, 16), 'bf16', device='cuda')\n"
    "        out = servd.empty((3, 16), 'bf16', device='cuda')\n"
    "        ops.attention(out, q, batch.kv, 0, batch, 2, 0.25)\n"
    "        self.old = batch\n"
    "        return servd.empty((1, 10), device='cuda')\n"
    "    def predict(self, inputs):\n"
    "        return {'y': servd.to_device(inputs['x'])}\n";

static int setup(void **state) {
  (void)state;
  snprintf(g_dir, sizeof g_dir, "/tmp/servd-guestdev-XXXXXX");
  if (support_make_dir_with(g_dir, "gpu_entry.py", entry_py) < 0) return -1;
  g_host = *servd_host_api__get();
  g_host.device_tensor_new = fake_new;
  g_host.device_upload = fake_upload;
  g_host.device_weight = fake_weight;
  g_host.copy = fake_copy;
  g_host.device_sync = fake_sync;
  g_host.device_kv_device = fake_kv_device;
  g_host.device_kv_write = fake_kv_write;
  g_host.device_attention = fake_attention;
  g_host.device_allreduce_sum = fake_allreduce;
  g_host.device_allgather_cols = fake_allgather;
  g_host.device_batch_tensor = fake_batch_tensor;
  g_host.add = fake_add;
  g_host.matmul = guard_matmul;
  g_host.embedding = guard_embedding;
  g_host.rmsnorm = guard_rmsnorm;
  g_host.rope = guard_rope;
  g_host.swiglu = guard_swiglu;
  g_host.argmax = guard_argmax;
  g_host.topk = guard_topk;
  servd_interp_config c = {.index = 0,
                           .rank = 0,
                           .world_size = 2,
                           .device = 0,
                           .dcomm = FAKE_DCOMM,
                           .extra_sys_path = g_dir,
                           .host = &g_host};
  servd_py_error err;
  if (servd_interp__init(&g_it, &c, &err) < 0) {
    fprintf(stderr, "init: %s: %s\n", err.type, err.message);
    return -1;
  }
  support_exec(&g_it, "import servd\nfrom servd import ops\n");
  return 0;
}

static int teardown(void **state) {
  (void)state;
  servd_interp__fini(&g_it);
  support_system("rm -rf %s", g_dir);
  return 0;
}

static void test_tensors(void **state) {
  (void)state;
  support_expect_true(&g_it, "servd.device() == 'cuda:0' and servd.world_size() == 2");
  support_exec(&g_it, "h = servd.tensor([[1, 2, 3], [4, 5, 6]])\nd = servd.to_device(h)\n");
  assert_int_equal(g_upload_dtype, SERVD_F32);
  support_expect_true(&g_it, "d.device == 'cuda:0' and d.dtype == 'f32' and d.shape == (2, 3) and repr(d) == "
                             "'servd.Tensor(f32[2,3], cuda:0)'");
  /* default device dtypes: f32/bf16/i32 kept, f16 and block dtypes to bf16; an explicit one wins */
  support_exec(&g_it, "servd.to_device(servd.tensor([0.5] * 32, dtype='q4_1'))\n");
  assert_int_equal(g_upload_dtype, SERVD_BF16);
  support_exec(&g_it, "servd.to_device(servd.tensor([0.5], dtype='f16'))\n");
  assert_int_equal(g_upload_dtype, SERVD_BF16);
  support_exec(&g_it, "servd.to_device(servd.tensor([1], dtype='i32'))\n");
  assert_int_equal(g_upload_dtype, SERVD_I32);
  support_exec(&g_it, "servd.to_device(h, dtype='bf16')\n");
  assert_int_equal(g_upload_dtype, SERVD_BF16);
  int syncs = g_calls[C_SYNC];
  support_exec(&g_it, "servd.to_device(h)\n");
  assert_int_equal(g_calls[C_SYNC], syncs + 1); /* a private copy is complete when it returns */
  /* a device tensor is never read on the host */
  support_expect_raises(&g_it, "memoryview(d)", "BufferError",
                        "servd.Tensor is on cuda:0: copy it to the host with .to_host()");
  support_expect_raises(&g_it, "bytes(d)", "BufferError", "is on cuda:0");
  support_expect_raises(&g_it, "d.tolist()", "ValueError", "is on cuda:0: copy it to the host with .to_host()");
  support_expect_raises(&g_it, "servd.tensor(d, shape=(2, 3))", "BufferError", "is on cuda:0");
  /* to_host, copy, views, empty */
  support_expect_true(&g_it,
                      "d.to_host().device == 'cpu' and d.to_host().tolist() == h.tolist() and d.to_host() is not d");
  support_exec(&g_it,
               "e = servd.empty((2, 3), device='cuda')\nservd.copy(e, h)\nz = servd.empty((2, 3))\nservd.copy(z, e)\n");
  support_expect_true(&g_it, "e.device == 'cuda:0' and z.tolist() == h.tolist()");
  support_expect_true(
      &g_it,
      "e.view(3, 2).device == 'cuda:0' and e.narrow(1, 0, 2).device == 'cuda:0' and e.row(1).device == 'cuda:0'");
  support_expect_true(
      &g_it,
      "servd.empty(2, 'i32', 'cuda:0').device == 'cuda:0' and servd.empty(2, device='cuda:1').device == 'cuda:1'");
  support_exec(&g_it, "d2 = servd.to_device(d)\n"); /* device to device: a new tensor and a copy */
  support_expect_true(&g_it, "d2.device == 'cuda:0' and d2.to_host().tolist() == h.tolist()");
  support_expect_raises(&g_it, "servd.to_device(d, dtype='bf16')", "ValueError", "dtype conversion between devices");
  /* upload: the shared bf16 copy */
  int w = g_calls[C_WEIGHT];
  support_expect_true(&g_it, "servd.upload(h).dtype == 'bf16' and servd.upload(h).device == 'cuda:0'");
  assert_int_equal(g_calls[C_WEIGHT], w + 2);
  support_expect_raises(&g_it, "servd.upload(d)", "ValueError", "already");
}

static void test_ops(void **state) {
  (void)state;
  support_exec(&g_it, "h = servd.tensor([[1, 2, 3], [4, 5, 6]])\nd = servd.to_device(h)\n"
                      "e = servd.empty((2, 3), device='cuda')\nops.add(e, d, d)\n");
  support_expect_true(&g_it, "e.to_host().tolist() == [[2.0, 4.0, 6.0], [8.0, 10.0, 12.0]]");
  assert_int_equal(g_calls[C_OP], 1);
  support_expect_raises(&g_it, "ops.add(e, d, h)", "ValueError",
                        "servd.ops.add: add: out is on cuda:0 but b is on the cpu");
  support_expect_raises(&g_it, "ops.matmul(e, h, h)", "ValueError", "matmul: out is on cuda:0 but x is on the cpu");
  support_expect_raises(&g_it, "ops.softmax(d)", "ValueError",
                        "softmax: x is on cuda:0 but softmax runs on the host only");
  /* collectives of device tensors go to the device communicator; host ones need the host one */
  support_exec(&g_it, "ops.allreduce(d)\n");
  assert_int_equal(g_calls[C_AR], 1);
  support_expect_true(&g_it, "d.to_host().tolist() == [[2.0, 4.0, 6.0], [8.0, 10.0, 12.0]]");
  support_expect_raises(&g_it, "ops.allreduce(h)", "RuntimeError", "no communicator");
  support_exec(&g_it, "g = servd.empty((2, 6), device='cuda')\nops.allgather_cols(g, d)\n");
  assert_int_equal(g_calls[C_AG], 1);
}

static void test_forward_and_predict(void **state) {
  (void)state;
  servd_py_error err;
  int syncs = g_calls[C_SYNC], weights = g_calls[C_WEIGHT];
  int rc = servd_interp__load_entry(&g_it, "gpu_entry:Entry", &err);
  if (rc < 0) fprintf(stderr, "%s: %s\n%s\n", err.type, err.message, err.traceback);
  assert_int_equal(rc, 0);
  assert_int_equal(g_calls[C_WEIGHT], weights + 1);
  assert_int_equal(g_calls[C_SYNC], syncs + 1); /* loading ends with the device's work done */

  /* the engine's host arrays differ from the device batch's: the model must see the device views */
  int32_t tokens[3] = {1, 2, 3}, positions[3] = {0, 1, 2}, slots[3] = {0, 1, 2}, rows[1] = {2};
  int32_t q_start[1] = {0}, q_len[1] = {3}, kv_len[1] = {3}, blocks[1] = {0};
  const int32_t *tables[1] = {blocks};
  servd_forward_batch b = {
      .n_tokens = 3,
      .tokens = tokens,
      .positions = positions,
      .slots = slots,
      .n_logit_rows = 1,
      .logit_rows = rows,
      .attn = {.n_seqs = 1, .q_start = q_start, .q_len = q_len, .kv_len = kv_len, .block_tables = tables},
      .dbatch = FAKE_DB,
      .dkv = FAKE_DKV,
      .max_tokens = 16,
      .max_seqs = 4};
  servd_tensor *logits = NULL;
  rc = servd_interp_forward(&g_it, &b, &logits, &err);
  if (rc < 0) fprintf(stderr, "%s: %s\n%s\n", err.type, err.message, err.traceback);
  assert_int_equal(rc, 0);
  assert_non_null(logits);
  assert_int_equal(logits->device, 0); /* handed over on the device; the engine downloads */
  assert_int_equal(logits->dtype, SERVD_F32);
  assert_int_equal(logits->shape[1], 10);
  logits->device = -1; /* a stand-in: host memory */
  servd_tensor_release(logits);
  assert_int_equal(g_calls[C_BT], 4);
  assert_int_equal(g_calls[C_KVW], 1);
  assert_int_equal(g_calls[C_ATT], 1);

  /* a device tensor as a predict output: refused, the caller reads outputs on the host */
  servd_tensor *x = servd_tensor_new(SERVD_F32, 1, (int64_t[]){2});
  const char *names[1] = {"x"};
  int n_out = 0;
  char **on = NULL;
  servd_tensor **ot = NULL;
  rc = servd_interp_predict(&g_it, 1, names, &x, &n_out, &on, &ot, 0, &err);
  assert_int_equal(rc, SERVD_EINVAL);
  assert_string_equal(err.type, "ValueError");
  assert_non_null(strstr(err.message, "predict output is on cuda:0: copy it to the host with .to_host()"));
  assert_int_equal(n_out, 0);
  servd_tensor_release(x);

  /* a device error found by the sync at the end of loading fails the load */
  g_sync_fail = 1;
  rc = servd_interp__load_entry(&g_it, "gpu_entry:Entry", &err);
  g_sync_fail = 0;
  assert_int_equal(rc, SERVD_EINVAL);
  assert_string_equal(err.type, "RuntimeError");
  assert_non_null(strstr(err.message, "device work: fake device_sync: an earlier kernel on device 0 failed"));
}

int main(int argc, char **argv) {
  support_early_init(argc, argv);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_tensors),
      cmocka_unit_test(test_ops),
      cmocka_unit_test(test_forward_and_predict),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
