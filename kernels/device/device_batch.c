/* One step's inputs on a device, in buffers allocated once at their capacities so that their
 * addresses never change (a graph captured over one step replays over the next one's inputs).
 * Uploads go through pinned host staging, so the copies are truly asynchronous. */
#include <stdlib.h>
#include <string.h>

#include "device_internal.h"

/* Layout of the i32 buffer (and of the pinned staging), in elements: */
enum { F_TOKENS, F_POSITIONS, F_SLOTS, F_LOGIT_ROWS }; /* T each */
struct servd_device_batch {
  int device, max_tokens, max_seqs, max_blocks;
  servd_tensor *buf;  /* i32 (4*T + 3*S + S*B) on the device */
  int32_t *pinned;    /* the same layout on the host, from cudaHostAlloc */
  int32_t *h_seq;     /* q_start, q_len, kv_len (3*S) as last uploaded, for launch planning */
  cudaEvent_t copied; /* the last upload's copies have read the staging */
  bool pending;
  bool uploaded;
  int n_tokens, n_logit_rows, n_seqs, block_size, max_block_id;
};

static size_t seq_off(const servd_device_batch *db) { return (size_t)4 * db->max_tokens; }
static size_t table_off(const servd_device_batch *db) { return seq_off(db) + (size_t)3 * db->max_seqs; }
static size_t total_elems(const servd_device_batch *db) {
  return table_off(db) + (size_t)db->max_seqs * db->max_blocks;
}

typedef struct batch_create_args {
  int device;
  int max_tokens;
  int max_seqs;
  int max_blocks;
  servd_device_batch **out;
} batch_create_args;
SERVD__DEV_JOB(batch_create, servd_device_batch_create(a->device, a->max_tokens, a->max_seqs, a->max_blocks, a->out))
typedef struct batch_destroy_args {
  servd_device_batch *db;
} batch_destroy_args;
SERVD__DEV_JOB(batch_destroy, (servd_device_batch_destroy(a->db), 0))
typedef struct batch_upload_args {
  servd_device_batch *db;
  int n_tokens;
  const int32_t *tokens;
  const int32_t *positions;
  const int32_t *slots;
  int n_logit_rows;
  const int32_t *logit_rows;
  const servd_attn_batch *attn;
  int block_size;
} batch_upload_args;
SERVD__DEV_JOB(batch_upload, servd_device_batch_upload(a->db, a->n_tokens, a->tokens, a->positions, a->slots,
                                                       a->n_logit_rows, a->logit_rows, a->attn, a->block_size))

int servd_device_batch_create(int device, int max_tokens, int max_seqs, int max_blocks_per_seq,
                              servd_device_batch **out) {
  const char *op = "device_batch_create";
  *out = NULL;
  int rc = servd__dev_check_batch(op, max_tokens, max_seqs, max_blocks_per_seq);
  if (rc) return rc;
  rc = servd__dev_valid(op, device);
  if (rc) return rc;
  SERVD__DEV_SYNC(op, device, batch_create, 0, device, max_tokens, max_seqs, max_blocks_per_seq, out);
  servd_device_batch *db = calloc(1, sizeof *db);
  if (!db) return servd_fail(SERVD_ENOMEM, "%s: out of host memory", op);
  db->device = device;
  db->max_tokens = max_tokens;
  db->max_seqs = max_seqs;
  db->max_blocks = max_blocks_per_seq;
  db->h_seq = calloc((size_t)3 * max_seqs, sizeof(int32_t));
  if (!db->h_seq) {
    rc = servd_fail(SERVD_ENOMEM, "%s: out of host memory", op);
    goto fail;
  }
  int64_t n = (int64_t)total_elems(db);
  rc = servd__dev_tensor(op, device, SERVD_I32, 1, &n, true, &db->buf);
  if (rc) goto fail;
  cudaError_t err = cudaHostAlloc((void **)&db->pinned, (size_t)n * sizeof(int32_t), cudaHostAllocDefault);
  if (err != cudaSuccess) {
    db->pinned = NULL;
    rc = servd_fail(SERVD_ENOMEM, "%s: cudaHostAlloc(%lld bytes): %s", op, (long long)n * 4, cudaGetErrorString(err));
    goto fail;
  }
  memset(db->pinned, 0, (size_t)n * sizeof(int32_t));
  err = cudaEventCreateWithFlags(&db->copied, cudaEventDisableTiming);
  if (err != cudaSuccess) {
    db->copied = NULL;
    rc = servd_fail(SERVD_EDEVICE, "%s: cudaEventCreate: %s", op, cudaGetErrorString(err));
    goto fail;
  }
  rc = servd_device_sync(device); /* the zeroing is done before any stream reads the buffers */
  if (rc) goto fail;
  *out = db;
  return SERVD_OK;
fail:
  servd_device_batch_destroy(db);
  return rc;
}

void servd_device_batch_destroy(servd_device_batch *db) {
  if (!db) return;
  if (servd__dev_forwarding()) { /* after the ops queued before it; a failure stays for its step */
    batch_destroy_args a = {db};
    servd__dev_forward("device_batch_destroy", db->device, batch_destroy_job, &a, sizeof a,
                       SERVD__DEV_WAIT | SERVD__DEV_ALWAYS | SERVD__DEV_KEEP, NULL, 0);
    return;
  }
  if (db->copied) {
    cudaEventSynchronize(db->copied);
    cudaEventDestroy(db->copied);
  }
  if (db->pinned) cudaFreeHost(db->pinned);
  servd_tensor_release(db->buf);
  free(db->h_seq);
  free(db);
}

int servd_device_batch_capacity(const servd_device_batch *db, int *max_tokens, int *max_seqs) {
  *max_tokens = *max_seqs = 0;
  if (!db) return servd_fail(SERVD_EINVAL, "device_batch_capacity: NULL batch");
  *max_tokens = db->max_tokens;
  *max_seqs = db->max_seqs;
  return SERVD_OK;
}

/* Checks one step against the capacities and itself; returns the largest block id used. */
static int check_step(const servd_device_batch *db, int n_tokens, const int32_t *tokens, const int32_t *positions,
                      const int32_t *slots, int n_logit_rows, const int32_t *logit_rows, const servd_attn_batch *attn,
                      int block_size, int *max_block) {
  const char *op = "device_batch_upload";
  *max_block = -1;
  if (n_tokens < 0 || n_logit_rows < 0 || block_size < 1)
    return servd_fail(SERVD_EINVAL, "%s: n_tokens %d, n_logit_rows %d, block_size %d", op, n_tokens, n_logit_rows,
                      block_size);
  if (n_tokens > 0 && (!tokens || !positions || !slots))
    return servd_fail(SERVD_EINVAL, "%s: tokens, positions and slots are required for %d tokens", op, n_tokens);
  if (n_logit_rows > 0 && !logit_rows) return servd_fail(SERVD_EINVAL, "%s: logit_rows is NULL", op);
  if (n_tokens > db->max_tokens || n_logit_rows > db->max_tokens)
    return servd_fail(SERVD_ERANGE, "%s: %d tokens, %d logit rows exceed the capacity of %d tokens", op, n_tokens,
                      n_logit_rows, db->max_tokens);
  for (int i = 0; i < n_logit_rows; i++)
    if (logit_rows[i] < 0 || logit_rows[i] >= n_tokens)
      return servd_fail(SERVD_EINVAL, "%s: logit row %d is %d, outside [0, %d)", op, i, logit_rows[i], n_tokens);
  int n_seqs = attn ? attn->n_seqs : 0;
  if (n_seqs < 0 || n_seqs > db->max_seqs)
    return servd_fail(n_seqs < 0 ? SERVD_EINVAL : SERVD_ERANGE, "%s: %d sequences (capacity %d)", op, n_seqs,
                      db->max_seqs);
  if (n_seqs > 0 && (!attn->q_start || !attn->q_len || !attn->kv_len || !attn->block_tables))
    return servd_fail(SERVD_EINVAL, "%s: attention layout needs q_start, q_len, kv_len and block_tables", op);
  for (int s = 0; s < n_seqs; s++) {
    int32_t qs = attn->q_start[s], ql = attn->q_len[s], kl = attn->kv_len[s];
    if (qs < 0 || ql < 0 || (int64_t)qs + ql > n_tokens || kl < ql)
      return servd_fail(SERVD_EINVAL, "%s: sequence %d has q_start %d, q_len %d, kv_len %d with %d tokens", op, s, qs,
                        ql, kl, n_tokens);
    int64_t nb = ((int64_t)kl + block_size - 1) / block_size;
    if (nb > db->max_blocks)
      return servd_fail(SERVD_ERANGE, "%s: sequence %d needs %lld blocks of %d for kv_len %d (capacity %d)", op, s,
                        (long long)nb, block_size, kl, db->max_blocks);
    if (nb > 0 && !attn->block_tables[s]) return servd_fail(SERVD_EINVAL, "%s: sequence %d has no block table", op, s);
    for (int64_t i = 0; i < nb; i++) {
      int32_t id = attn->block_tables[s][i];
      if (id < 0) return servd_fail(SERVD_EINVAL, "%s: sequence %d block %lld is %d", op, s, (long long)i, id);
      if (id > *max_block) *max_block = id;
    }
  }
  return SERVD_OK;
}

int servd_device_batch_upload(servd_device_batch *db, int n_tokens, const int32_t *tokens, const int32_t *positions,
                              const int32_t *slots, int n_logit_rows, const int32_t *logit_rows,
                              const servd_attn_batch *attn, int block_size) {
  const char *op = "device_batch_upload";
  if (!db) return servd_fail(SERVD_EINVAL, "%s: NULL batch", op);
  int max_block;
  int rc = check_step(db, n_tokens, tokens, positions, slots, n_logit_rows, logit_rows, attn, block_size, &max_block);
  if (rc) return rc;
  /* Waits: the host arrays are copied into the staging by the executor. */
  SERVD__DEV_SYNC(op, db->device, batch_upload, 0, db, n_tokens, tokens, positions, slots, n_logit_rows, logit_rows,
                  attn, block_size);
  servd_cuda_ctx *c;
  rc = servd__dev_ctx(op, db->device, &c);
  if (rc) return rc;
  cudaStream_t stream = (cudaStream_t)servd__dev_stream(c);
  enum cudaStreamCaptureStatus cs;
  DEV_CHECK(op, cudaStreamIsCapturing(stream, &cs));
  if (cs != cudaStreamCaptureStatusNone)
    return servd_fail(SERVD_EINVAL, "%s: called while this thread captures a graph (upload before graph_begin)", op);
  /* The previous upload's copies read the staging: wait for them before overwriting it. */
  if (db->pending) DEV_CHECK(op, cudaEventSynchronize(db->copied));
  db->pending = false;

  const size_t T = (size_t)db->max_tokens, S = (size_t)db->max_seqs, B = (size_t)db->max_blocks;
  int32_t *p = db->pinned;
  const int n_seqs = attn ? attn->n_seqs : 0;
  if (n_tokens) {
    memcpy(p + F_TOKENS * T, tokens, sizeof(int32_t) * (size_t)n_tokens);
    memcpy(p + F_POSITIONS * T, positions, sizeof(int32_t) * (size_t)n_tokens);
    memcpy(p + F_SLOTS * T, slots, sizeof(int32_t) * (size_t)n_tokens);
  }
  if (n_logit_rows) memcpy(p + F_LOGIT_ROWS * T, logit_rows, sizeof(int32_t) * (size_t)n_logit_rows);
  int32_t *ps = p + seq_off(db), *pt = p + table_off(db);
  /* Only the first `used` columns of the tables go up (the longest sequence's blocks): kernels read
   * a sequence's entries below its own block count only, so the columns past it on the device may
   * hold an earlier step's blocks. A full upload was max_seqs x max_blocks (2 MiB a step at 128K). */
  size_t used = 0;
  for (int s = 0; s < n_seqs; s++) {
    size_t nb = (size_t)(((int64_t)attn->kv_len[s] + block_size - 1) / block_size);
    if (nb > used) used = nb;
  }
  for (int s = 0; s < n_seqs; s++) {
    ps[s] = attn->q_start[s];
    ps[S + s] = attn->q_len[s];
    ps[2 * S + s] = attn->kv_len[s];
    size_t nb = (size_t)(((int64_t)attn->kv_len[s] + block_size - 1) / block_size);
    if (nb) memcpy(pt + (size_t)s * B, attn->block_tables[s], sizeof(int32_t) * nb);
    /* Uploaded entries past this sequence's blocks are block 0: valid memory, never read. */
    memset(pt + (size_t)s * B + nb, 0, sizeof(int32_t) * (used - nb));
  }
  for (int s = 0; s < n_seqs; s++) {
    db->h_seq[s] = ps[s];
    db->h_seq[S + s] = ps[S + s];
    db->h_seq[2 * S + s] = ps[2 * S + s];
  }

  int32_t *d = servd_tensor_data(db->buf);
  const size_t w = sizeof(int32_t);
  if (n_tokens)
    DEV_CHECK(op, cudaMemcpy2DAsync(d, T * w, p, T * w, (size_t)n_tokens * w, 3, cudaMemcpyHostToDevice, stream));
  if (n_logit_rows)
    DEV_CHECK(op, cudaMemcpyAsync(d + F_LOGIT_ROWS * T, p + F_LOGIT_ROWS * T, (size_t)n_logit_rows * w,
                                  cudaMemcpyHostToDevice, stream));
  if (n_seqs) {
    DEV_CHECK(op, cudaMemcpy2DAsync(d + seq_off(db), S * w, ps, S * w, (size_t)n_seqs * w, 3, cudaMemcpyHostToDevice,
                                    stream));
    if (used)
      DEV_CHECK(op, cudaMemcpy2DAsync(d + table_off(db), B * w, pt, B * w, used * w, (size_t)n_seqs,
                                      cudaMemcpyHostToDevice, stream));
  }
  DEV_CHECK(op, cudaEventRecord(db->copied, stream));
  db->pending = true;
  db->uploaded = true;
  db->n_tokens = n_tokens;
  db->n_logit_rows = n_logit_rows;
  db->n_seqs = n_seqs;
  db->block_size = block_size;
  db->max_block_id = max_block;
  return SERVD_OK;
}

servd_tensor *servd_device_batch_tensor(const servd_device_batch *db, servd_device_batch_field f) {
  if (!db) {
    servd_fail(SERVD_EINVAL, "device_batch_tensor: NULL batch");
    return NULL;
  }
  if ((unsigned)f > SERVD_DB_LOGIT_ROWS) {
    servd_fail(SERVD_EINVAL, "device_batch_tensor: unknown field %d", (int)f);
    return NULL;
  }
  int64_t n = f == SERVD_DB_LOGIT_ROWS ? db->n_logit_rows : db->n_tokens, stride = sizeof(int32_t);
  size_t off = (size_t)f * (size_t)db->max_tokens * sizeof(int32_t);
  servd_tensor *t = servd_tensor_view(db->buf, off, 1, &n, &stride);
  if (t) t->device = db->device;
  return t;
}

int servd__dev_batch_layout(const servd_device_batch *db, const char *op, int block_size, int n_blocks,
                            servd_cuda_attn_batch *out, int *n_tokens) {
  if (!db) return servd_fail(SERVD_EINVAL, "%s: NULL batch", op);
  if (!db->uploaded) return servd_fail(SERVD_EINVAL, "%s: no step was uploaded to the batch", op);
  if (db->n_seqs && db->block_size != block_size)
    return servd_fail(SERVD_EINVAL, "%s: the step was uploaded for block size %d, the cache has %d", op, db->block_size,
                      block_size);
  if (db->max_block_id >= n_blocks)
    return servd_fail(SERVD_EINVAL, "%s: the step names block %d, the cache has %d blocks", op, db->max_block_id,
                      n_blocks);
  const int32_t *d = servd_tensor_data(db->buf);
  const size_t S = (size_t)db->max_seqs;
  out->n_seqs = db->n_seqs;
  out->max_blocks = db->max_blocks;
  out->q_start = d + seq_off(db);
  out->q_len = d + seq_off(db) + S;
  out->kv_len = d + seq_off(db) + 2 * S;
  out->block_tables = d + table_off(db);
  out->h_q_start = db->h_seq;
  out->h_q_len = db->h_seq + S;
  out->h_kv_len = db->h_seq + 2 * S;
  *n_tokens = db->n_tokens;
  return SERVD_OK;
}

int servd__dev_batch_device(const servd_device_batch *db) { return db->device; }
