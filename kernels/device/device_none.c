/* servd/device.h without the CUDA backend: no devices; every device call fails and says why. The
 * arguments are checked first (device_args.c), so a caller's mistake reads the same either way. */
#include "device_internal.h"

#include <stdio.h>
#include <string.h>

#define TRY(x) \
  do { \
    int rc_ = (x); \
    if (rc_ != 0) return rc_; \
  } while (0)

#define NO_CUDA(op) servd_fail(SERVD_EDEVICE, "%s: servd was built without CUDA (configure with nvcc present)", op)

int servd_device_count(int *n, char *why, size_t why_cap) {
  *n = 0;
  if (why && why_cap) snprintf(why, why_cap, "servd was built without CUDA");
  return SERVD_OK;
}
bool servd_device_built(void) { return false; }
int servd_device_describe(int device, char *buf, size_t cap) {
  (void)device;
  if (buf && cap) buf[0] = 0;
  return NO_CUDA("device_describe");
}
int servd_device_mem_info(int device, size_t *free_bytes, size_t *total_bytes) {
  (void)device;
  *free_bytes = *total_bytes = 0;
  return NO_CUDA("device_mem_info");
}
int servd_device_tensor_new(int device, servd_dtype dtype, int ndim, const int64_t *shape, servd_tensor **out) {
  (void)device;
  *out = NULL;
  TRY(servd__dev_check_new("device_tensor_new", dtype, ndim, shape));
  return NO_CUDA("device_tensor_new");
}
int servd_device_upload(int device, const servd_tensor *host, servd_dtype dtype, servd_tensor **out) {
  (void)device;
  *out = NULL;
  TRY(servd__dev_check_upload("device_upload", host, dtype));
  return NO_CUDA("device_upload");
}
int servd_device_weight(int device, const servd_tensor *host, servd_tensor **out) {
  (void)device;
  *out = NULL;
  TRY(servd__dev_check_upload("device_weight", host, SERVD_BF16));
  return NO_CUDA("device_weight");
}
void servd_device_weights_trim(void) {}
size_t servd_device_weights_bytes(int device) {
  (void)device;
  return 0;
}
int servd_device_copy(servd_tensor *dst, const servd_tensor *src) {
  TRY(servd__dev_check_copy(dst, src));
  return NO_CUDA("device_copy");
}
int servd_device_sync(int device) {
  (void)device;
  return NO_CUDA("device_sync");
}
void servd_device_thread_release(void) {}
uint64_t servd_device_generation(int device) {
  (void)device;
  return 0;
}
/* The ops of the registry (servd/ops.def): their checks, then no CUDA. */
#define SERVD_OP(name, dispatch, py, sig, names) \
  SERVD__IF_ANYH_##dispatch(int servd_device_##name(SERVD__PARAMS(sig, names)) { \
    TRY(servd__dev_check_##name(SERVD__ARGS(names))); \
    return NO_CUDA("device " #name); \
  }) SERVD__IF_ANYT_##dispatch(int servd_device_##name(SERVD__PARAMS(sig, names)) { \
    SERVD__DEV_CHECK_ANYT(name, sig, names); \
    return NO_CUDA("device " #name); \
  })
#include "servd/ops.def"
#undef SERVD_OP

int servd_device_matmul_tune(int device, int n, int k, char *report, size_t cap) {
  (void)device, (void)n, (void)k;
  if (report && cap) report[0] = 0;
  return NO_CUDA("device matmul tune");
}
int servd_device_add_rmsnorm(servd_tensor *x, const servd_tensor *o, servd_tensor *out, const servd_tensor *weight,
                             float eps) {
  (void)x, (void)o, (void)out, (void)weight, (void)eps;
  return NO_CUDA("device add_rmsnorm");
}
int servd_device_matmul_many(int count, servd_tensor *const *outs, const servd_tensor *x,
                             const servd_tensor *const *ws) {
  (void)count, (void)outs, (void)x, (void)ws;
  return NO_CUDA("device matmul_many");
}
int servd_device_fused_check(int device, char *report, size_t cap) {
  (void)device;
  if (report && cap) report[0] = 0;
  return NO_CUDA("device fused check");
}
int servd_device_kv_create(int device, int n_layers, int kv_dim, int block_size, int n_blocks, servd_device_kv **out) {
  (void)device;
  *out = NULL;
  TRY(servd__dev_check_kv("device_kv_create", n_layers, kv_dim, block_size, n_blocks));
  return NO_CUDA("device_kv_create");
}
void servd_device_kv_destroy(servd_device_kv *kv) { (void)kv; }
size_t servd_device_kv_bytes(int n_layers, int kv_dim, int block_size, int n_blocks) {
  if (n_layers < 1 || kv_dim < 1 || block_size < 1 || n_blocks < 1) return 0;
  return (size_t)n_layers * 2 * (size_t)kv_dim * (size_t)block_size * (size_t)n_blocks * 2;
}
int servd_device_kv_device(const servd_device_kv *kv) {
  (void)kv;
  return -1;
}
int servd_device_kv_write(servd_device_kv *kv, int layer, const servd_tensor *k, const servd_tensor *v,
                          const servd_tensor *slots) {
  (void)kv, (void)layer, (void)k, (void)v, (void)slots;
  return NO_CUDA("device kv_write");
}
int servd_device_batch_create(int device, int max_tokens, int max_seqs, int max_blocks_per_seq,
                              servd_device_batch **out) {
  (void)device;
  *out = NULL;
  TRY(servd__dev_check_batch("device_batch_create", max_tokens, max_seqs, max_blocks_per_seq));
  return NO_CUDA("device_batch_create");
}
void servd_device_batch_destroy(servd_device_batch *db) { (void)db; }
int servd_device_batch_upload(servd_device_batch *db, int n_tokens, const int32_t *tokens, const int32_t *positions,
                              const int32_t *slots, int n_logit_rows, const int32_t *logit_rows,
                              const servd_attn_batch *attn, int block_size) {
  (void)db, (void)n_tokens, (void)tokens, (void)positions, (void)slots, (void)n_logit_rows, (void)logit_rows,
      (void)attn, (void)block_size;
  return NO_CUDA("device_batch_upload");
}
servd_tensor *servd_device_batch_tensor(const servd_device_batch *db, servd_device_batch_field f) {
  (void)db, (void)f;
  NO_CUDA("device_batch_tensor");
  return NULL;
}
int servd_device_batch_capacity(const servd_device_batch *db, int *max_tokens, int *max_seqs) {
  (void)db;
  *max_tokens = *max_seqs = 0;
  return NO_CUDA("device_batch_capacity");
}
int servd_device_attention(servd_tensor *out, const servd_tensor *q, const servd_device_kv *kv, int layer,
                           const servd_device_batch *db, int n_heads, float scale) {
  (void)out, (void)q, (void)kv, (void)layer, (void)db, (void)n_heads, (void)scale;
  return NO_CUDA("device attention");
}

int servd_device_attention_window(servd_tensor *out, const servd_tensor *q, const servd_device_kv *kv, int layer,
                                  const servd_device_batch *db, int n_heads, float scale, int window) {
  (void)out, (void)q, (void)kv, (void)layer, (void)db, (void)n_heads, (void)scale, (void)window;
  return NO_CUDA("device attention");
}
int servd_device_comm_create(int world_size, const int *devices, servd_device_comm **out) {
  *out = NULL;
  TRY(servd__dev_check_comm("device_comm_create", world_size, devices));
  return NO_CUDA("device_comm_create");
}
void servd_device_comm_destroy(servd_device_comm *c) { (void)c; }
int servd_device_allreduce_sum(servd_device_comm *c, int rank, servd_tensor *x) {
  (void)c, (void)rank, (void)x;
  return NO_CUDA("device allreduce");
}
int servd_device_allgather_cols(servd_device_comm *c, int rank, servd_tensor *out, const servd_tensor *x) {
  (void)c, (void)rank, (void)out, (void)x;
  return NO_CUDA("device allgather_cols");
}
void servd_device_comm_abort(servd_device_comm *c) { (void)c; }
int servd_device_comm_reset(servd_device_comm *c) {
  (void)c;
  return NO_CUDA("device_comm_reset");
}
int servd_device_graph_begin(int device) {
  (void)device;
  return NO_CUDA("device_graph_begin");
}
int servd_device_graph_end(int device, servd_device_graph **out) {
  (void)device;
  *out = NULL;
  return NO_CUDA("device_graph_end");
}
int servd_device_graph_launch(servd_device_graph *g) {
  (void)g;
  return NO_CUDA("device_graph_launch");
}
void servd_device_graph_destroy(servd_device_graph *g) { (void)g; }

/* No CUDA, no executors: nothing ever calls CUDA. */
bool servd_device_executor_enabled(void) { return false; }
bool servd_device_thread_is_native(void) { return false; }
void servd_device_executors_stop(bool drain) { (void)drain; }
int servd_device_executor_stats(int device, servd_device_executor_figures *out) {
  (void)device;
  memset(out, 0, sizeof *out);
  return SERVD_OK;
}
