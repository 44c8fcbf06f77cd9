/* Attention of a step's queries over the device KV cache, in the layout uploaded to the batch. */
#include "device_internal.h"

int servd__dev_batch_device(const servd_device_batch *db);

typedef struct attention_args {
  servd_tensor *out;
  const servd_tensor *q;
  const servd_device_kv *kv;
  int layer;
  const servd_device_batch *db;
  int n_heads;
  float scale;
  int window;
} attention_args;
SERVD__DEV_JOB(attention,
               servd_device_attention_window(a->out, a->q, a->kv, a->layer, a->db, a->n_heads, a->scale, a->window))

int servd_device_attention(servd_tensor *out, const servd_tensor *q, const servd_device_kv *kv, int layer,
                           const servd_device_batch *db, int n_heads, float scale) {
  return servd_device_attention_window(out, q, kv, layer, db, n_heads, scale, 0);
}

int servd_device_attention_window(servd_tensor *out, const servd_tensor *q, const servd_device_kv *kv, int layer,
                                  const servd_device_batch *db, int n_heads, float scale, int window) {
  const char *op = "device attention";
  /* The batch's layout is read when the job runs: uploads wait, so it is this step's. */
  SERVD__DEV_ASYNC(op, attention, (out, (servd_tensor *)q), out, q, kv, layer, db, n_heads, scale, window);
  char a[128], b[128];
  if (!kv || !db) return servd_fail(SERVD_EINVAL, "%s: NULL %s", op, kv ? "batch" : "cache");
  int rc = servd__dev_check_tensor(op, "q", q, SERVD_BF16);
  if (!rc) rc = servd__dev_check_tensor(op, "out", out, SERVD_BF16);
  if (rc) return rc;
  int kv_dim, block_size, n_blocks, n_layers;
  const int device = servd__dev_kv_geometry(kv, &kv_dim, &block_size, &n_blocks, &n_layers);
  if (q->device != device || out->device != device || servd__dev_batch_device(db) != device)
    return servd_fail(SERVD_EINVAL, "%s: q %s, out %s, the batch (cuda:%d) and the cache (cuda:%d) must share a device",
                      op, servd__dev_describe(q, a, sizeof a), servd__dev_describe(out, b, sizeof b),
                      servd__dev_batch_device(db), device);
  if (layer < 0 || layer >= n_layers) return servd_fail(SERVD_EINVAL, "%s: layer %d of %d", op, layer, n_layers);
  if (window < 0) return servd_fail(SERVD_EINVAL, "%s: window %d (0: none)", op, window);
  if (q->ndim != 2 || out->ndim != 2 || out->shape[0] != q->shape[0] || out->shape[1] != q->shape[1] || n_heads < 1 ||
      q->shape[1] % n_heads)
    return servd_fail(SERVD_EINVAL, "%s: q %s, out %s, %d heads: expected q and out (t, n_heads*head_dim)", op,
                      servd__dev_describe(q, a, sizeof a), servd__dev_describe(out, b, sizeof b), n_heads);
  const int64_t head_dim = q->shape[1] / n_heads;
  if (head_dim == 0 || kv_dim % head_dim || n_heads % (kv_dim / head_dim))
    return servd_fail(SERVD_EINVAL, "%s: q %s with %d heads (head_dim %lld) does not fit the cache's kv_dim %d", op,
                      servd__dev_describe(q, a, sizeof a), n_heads, (long long)head_dim, kv_dim);
  servd_cuda_attn_batch lay;
  int n_tokens;
  rc = servd__dev_batch_layout(db, op, block_size, n_blocks, &lay, &n_tokens);
  if (rc) return rc;
  if (q->shape[0] != n_tokens)
    return servd_fail(SERVD_EINVAL, "%s: q %s has %lld rows, the uploaded step %d tokens", op,
                      servd__dev_describe(q, a, sizeof a), (long long)q->shape[0], n_tokens);
  servd_cuda_ctx *c;
  rc = servd__dev_ctx(op, device, &c);
  if (rc) return rc;
  rc = servd_cuda_attention_window(c, servd_tensor_data(out), servd_tensor_data(q), servd__dev_kv_layer(kv, layer, 0),
                                   servd__dev_kv_layer(kv, layer, 1), &lay, n_heads, kv_dim / (int)head_dim,
                                   (int)head_dim, block_size, scale, window);
  return servd__dev_wrap(rc, op);
}
