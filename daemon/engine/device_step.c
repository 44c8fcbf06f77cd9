/* One rank's part of a forward step on its GPU: see device_step.h. */
#include "engine/device_step.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/forward_call.h"

typedef struct graph_slot {
  servd_device_graph *graph;
  servd_tensor *logits; /* rank 0: the device logits the graph writes; NULL elsewhere */
  int rows;             /* tokens of the step it was captured over */
} graph_slot;

struct servd_device_step {
  servd_device_step_config c;
  servd_device_batch *db;
  graph_slot *slots;   /* c.n_buckets */
  int n_graphs;        /* slots holding a graph */
  uint64_t generation; /* servd_device_generation when the graphs held were captured */
  servd_tensor *host;  /* rank 0: (c.max_seqs, vocab) f32, allocated at the first download */
  servd_tensor *out;   /* a view of host's first rows, handed to the engine (reshaped per step) */
  int64_t timeout_ms;  /* deadline of each forward; 0: none */
  /* Greedy picks (rank 0): each row's top logit and its index on the device, their host copies, and
   * the (max_seqs, 2) i32 picks handed to the engine. Allocated with the step, before the KV cache
   * takes the device's memory. */
  servd_tensor *pick_val, *pick_idx, *pick_val_h, *pick_idx_h, *picks;
};

/* The pick buffers of rank 0 (one value and index per sequence). */
static int create_picks(servd_device_step *s) {
  const int64_t col[2] = {s->c.max_seqs, 1}, two[2] = {s->c.max_seqs, 2};
  int rc;
  if ((rc = servd_device_tensor_new(s->c.device, SERVD_F32, 2, col, &s->pick_val)) ||
      (rc = servd_device_tensor_new(s->c.device, SERVD_I32, 2, col, &s->pick_idx)))
    return rc;
  s->pick_val_h = servd_tensor_new(SERVD_F32, 2, col);
  s->pick_idx_h = servd_tensor_new(SERVD_I32, 2, col);
  s->picks = servd_tensor_new(SERVD_I32, 2, two);
  if (!s->pick_val_h || !s->pick_idx_h || !s->picks)
    return servd_fail(SERVD_ENOMEM, "device step: pick buffers for %d sequences", s->c.max_seqs);
  return 0;
}

int servd_device_step_create(const servd_device_step_config *c, servd_device_step **out) {
  *out = NULL;
  if (c->device < 0 || c->rank < 0 || !c->dkv || c->max_tokens < 1 || c->max_seqs < 1 || c->max_blocks_per_seq < 1 ||
      c->block_size < 1 || c->n_buckets < 0)
    return servd_fail(SERVD_EINVAL,
                      "device step: device %d, rank %d, max_tokens %d, max_seqs %d, max_blocks_per_seq %d, "
                      "block_size %d, %d graph buckets, %s device cache: expected a cache and positive sizes",
                      c->device, c->rank, c->max_tokens, c->max_seqs, c->max_blocks_per_seq, c->block_size,
                      c->n_buckets, c->dkv ? "a" : "no");
  servd_device_step *s = calloc(1, sizeof *s);
  if (!s) return servd_fail(SERVD_ENOMEM, "device step: allocation");
  s->c = *c;
  int rc;
  if (c->n_buckets > 0 && !(s->slots = calloc((size_t)c->n_buckets, sizeof *s->slots))) {
    rc = servd_fail(SERVD_ENOMEM, "device step: %d graph slots", c->n_buckets);
    goto fail;
  }
  if ((rc = servd_device_batch_create(c->device, c->max_tokens, c->max_seqs, c->max_blocks_per_seq, &s->db))) goto fail;
  if (c->rank == 0 && (rc = create_picks(s))) goto fail;
  *out = s;
  return 0;
fail:
  servd_device_step_destroy(s);
  return rc;
}

void servd_device_step_destroy(servd_device_step *s) {
  if (!s) return;
  servd_device_step_drop_all(s);
  free(s->slots);
  servd_device_batch_destroy(s->db);
  servd_tensor_release(s->out);
  servd_tensor_release(s->host);
  servd_tensor *picks[] = {s->pick_val, s->pick_idx, s->pick_val_h, s->pick_idx_h, s->picks};
  for (size_t i = 0; i < sizeof picks / sizeof *picks; i++) servd_tensor_release(picks[i]);
  free(s);
}

int servd_device_step_device(const servd_device_step *s) { return s->c.device; }

static int upload(servd_device_step *s, const servd_forward_batch *b) {
  return servd_device_batch_upload(s->db, b->n_tokens, b->tokens, b->positions, b->slots, b->n_logit_rows,
                                   b->logit_rows, &b->attn, s->c.block_size);
}

/* What the interpreter sees: the host step plus this rank's device inputs and cache. */
static servd_forward_batch on_device(const servd_device_step *s, const servd_forward_batch *b) {
  servd_forward_batch mine = *b;
  mine.dbatch = s->db;
  mine.dkv = s->c.dkv;
  mine.max_tokens = s->c.max_tokens;
  mine.max_seqs = s->c.max_seqs;
  return mine;
}

static bool logits_shape_ok(const servd_tensor *t, int rows) {
  return t && t->dtype == SERVD_F32 && t->ndim == 2 && t->shape[0] == rows && t->shape[1] >= 1;
}

static int bad_logits(const servd_device_step *s, const servd_tensor *t, int rows, servd_py_error *err) {
  char d[128] = "None";
  if (t) servd_tensor_describe(t, d, sizeof d);
  int rc =
      servd_fail(SERVD_EMODEL, "forward returned logits %s on %s%d: expected f32 (%d, vocab)", d,
                 t && t->device >= 0 ? "cuda:" : "the host, rank ", t && t->device >= 0 ? t->device : s->c.rank, rows);
  if (err) {
    snprintf(err->type, sizeof err->type, "%s", "TypeError");
    snprintf(err->message, sizeof err->message, "%s", servd_last_error());
  }
  return rc;
}

/* The host buffer the logits come down into, sized for every step this rank can run. */
static int ensure_host(servd_device_step *s, int64_t vocab) {
  if (s->host && s->host->shape[1] == vocab) return 0;
  servd_tensor_release(s->out);
  servd_tensor_release(s->host);
  s->out = NULL;
  int64_t shape[2] = {s->c.max_seqs, vocab};
  s->host = servd_tensor_new(SERVD_F32, 2, shape);
  if (s->host) s->out = servd_tensor_narrow(s->host, 0, 0, s->c.max_seqs);
  if (!s->host || !s->out)
    return servd_fail(SERVD_ENOMEM, "device step: host logits (%d, %lld) f32", s->c.max_seqs, (long long)vocab);
  return 0;
}

/* Rows [0, n_rows) of dl (device, checked by the caller) into the host buffer; *logits: a new
 * reference to a host tensor of those rows. */
static int download(servd_device_step *s, const servd_tensor *dl, int n_rows, servd_tensor **logits) {
  int rc = ensure_host(s, dl->shape[1]);
  if (rc) return rc;
  if (n_rows > s->c.max_seqs)
    return servd_fail(SERVD_ERANGE, "device step: %d logit rows beyond the capacity of %d", n_rows, s->c.max_seqs);
  /* Views on the stack: no allocation per step. The copy waits for the device. */
  servd_tensor src = *dl, dst = *s->host;
  src.shape[0] = dst.shape[0] = n_rows;
  if (n_rows > 0 && (rc = servd_device_copy(&dst, &src))) return rc;
  servd_tensor *out = s->out;
  if (__atomic_load_n(&out->refcount, __ATOMIC_ACQUIRE) != 1) {
    /* The engine still holds last step's view (it never does past a step): leave it alone. */
    out = servd_tensor_narrow(s->host, 0, 0, n_rows);
    if (!out) return servd_fail(SERVD_ENOMEM, "device step: logits view");
  } else {
    out->shape[0] = n_rows;
    servd_tensor_retain(out);
  }
  *logits = out;
  return 0;
}

/* Rows [0, n_rows) of dl reduced on the device to their top token (servd_device_topk, k = 1: the
 * greedy order, ties to the lower id), downloaded as picks (see servd_forward_batch.want_picks). */
static int download_picks(servd_device_step *s, const servd_tensor *dl, int n_rows, servd_tensor **picks) {
  if (n_rows > s->c.max_seqs)
    return servd_fail(SERVD_ERANGE, "device step: %d logit rows beyond the capacity of %d", n_rows, s->c.max_seqs);
  /* Views on the stack over the first n_rows rows: no allocation per step. */
  servd_tensor src = *dl, v = *s->pick_val, i = *s->pick_idx, vh = *s->pick_val_h, ih = *s->pick_idx_h;
  src.shape[0] = v.shape[0] = i.shape[0] = vh.shape[0] = ih.shape[0] = n_rows;
  int rc;
  if (n_rows > 0 && ((rc = servd_device_topk(&v, &i, &src, 1)) || (rc = servd_device_copy(&ih, &i)) ||
                     (rc = servd_device_copy(&vh, &v))))
    return rc;
  int32_t *out = servd_tensor_data(s->picks);
  const int32_t *ids = servd_tensor_data(s->pick_idx_h);
  const float *vals = servd_tensor_data(s->pick_val_h);
  for (int r = 0; r < n_rows; r++) {
    out[2 * r] = ids[r];
    memcpy(&out[2 * r + 1], &vals[r], sizeof vals[r]);
  }
  *picks = servd_tensor_narrow(s->picks, 0, 0, n_rows);
  return *picks ? 0 : servd_fail(SERVD_ENOMEM, "device step: picks view");
}

/* Rank 0's result of a forward that computed b->n_logit_rows rows, of which the engine gets n_rows. */
static int take_logits(servd_device_step *s, servd_tensor *dl, int rows, int n_rows, bool picks, servd_tensor **logits,
                       servd_py_error *err) {
  if (rows == 0) {
    servd_tensor_release(dl); /* no row wanted: the engine reads none (as on the CPU) */
    return 0;
  }
  if (dl && dl->device < 0) {
    /* The model brought its logits to the host itself. */
    if (n_rows < rows && logits_shape_ok(dl, rows)) {
      *logits = servd_tensor_narrow(dl, 0, 0, n_rows);
      servd_tensor_release(dl);
      return *logits ? 0 : servd_fail(SERVD_ENOMEM, "device step: logits view");
    }
    *logits = dl; /* the engine checks the shape */
    return 0;
  }
  if (!logits_shape_ok(dl, rows) || dl->device != s->c.device) {
    int rc = bad_logits(s, dl, rows, err);
    servd_tensor_release(dl);
    return rc;
  }
  int rc = picks ? download_picks(s, dl, n_rows, logits) : download(s, dl, n_rows, logits);
  servd_tensor_release(dl);
  return rc;
}

int servd_device_step_eager(servd_device_step *s, servd_interp *it, const servd_forward_batch *b, int n_rows,
                            servd_tensor **logits, servd_py_error *err) {
  if (logits) *logits = NULL;
  int rc = upload(s, b);
  if (rc) return rc;
  servd_forward_batch mine = on_device(s, b);
  servd_tensor *dl = NULL;
  if ((rc = servd_engine_forward(it, &mine, s->timeout_ms, &dl, err))) {
    servd_tensor_release(dl);
    /* A queued device op of this step that failed too is this step's: waiting here reports and
     * clears it, so the next step's first wait does not fail for it. */
    char why[600];
    snprintf(why, sizeof why, "%s", servd_last_error());
    servd_device_sync(s->c.device);
    return servd_fail(rc, "%s", why);
  }
  if (!logits) {
    servd_tensor_release(dl); /* ranks other than 0 return none */
    return 0;
  }
  return take_logits(s, dl, b->n_logit_rows, n_rows, b->want_picks, logits, err);
}

int servd_device_step_capture(servd_device_step *s, servd_interp *it, const servd_forward_batch *b, int bucket,
                              servd_py_error *err) {
  if (bucket < 0 || bucket >= s->c.n_buckets)
    return servd_fail(SERVD_EINVAL, "device step: graph slot %d outside [0, %d)", bucket, s->c.n_buckets);
  servd_device_step_drop(s, bucket);
  int rc = upload(s, b); /* outside the capture: host-to-device copies are not captured */
  if (rc) return rc;
  int dev = s->c.device;
  uint64_t before = servd_device_generation(dev);
  if ((rc = servd_device_graph_begin(dev))) return rc;
  servd_forward_batch mine = on_device(s, b);
  servd_tensor *dl = NULL;
  int frc = servd_engine_forward(it, &mine, s->timeout_ms, &dl, err);
  char why[512] = "";
  if (frc) snprintf(why, sizeof why, "%s", servd_last_error());
  servd_device_graph *g = NULL;
  rc = servd_device_graph_end(dev, &g); /* always: the stream must leave capture mode */
  uint64_t after = servd_device_generation(dev);
  if (frc) {
    rc = servd_fail(frc, "%s", why);
  } else if (rc) {
    /* the end's own message (an op that cannot be captured ran) */
  } else if (s->c.rank == 0 && (!logits_shape_ok(dl, b->n_logit_rows) || dl->device != dev)) {
    rc = bad_logits(s, dl, b->n_logit_rows, err);
  } else if (after != before) {
    /* Memory the graph may use was freed or moved while it was recorded: it cannot be trusted. */
    rc = servd_fail(SERVD_EBUSY, "device step: device memory of cuda:%d moved during the capture", dev);
  }
  if (rc) {
    servd_device_graph_destroy(g);
    servd_tensor_release(dl);
    return rc;
  }
  if (s->n_graphs == 0) s->generation = after;
  graph_slot *slot = &s->slots[bucket];
  slot->graph = g;
  slot->rows = b->n_tokens;
  if (s->c.rank == 0) slot->logits = dl;
  else servd_tensor_release(dl);
  s->n_graphs++;
  return 0;
}

int servd_device_step_replay(servd_device_step *s, servd_interp *it, const servd_forward_batch *b, int bucket,
                             int n_rows, servd_tensor **logits, servd_py_error *err) {
  if (logits) *logits = NULL;
  if (!servd_device_step_has_graph(s, bucket) || s->slots[bucket].rows != b->n_tokens)
    return servd_fail(SERVD_EINVAL, "device step: no graph in slot %d for a step of %d tokens", bucket, b->n_tokens);
  /* Memory moved since the runner looked (another thread on this device released some): the graph
   * is stale, so this rank runs the same step through the model's code. Its collectives are the
   * graph's, in the same order, so ranks that replay and this one still meet. The runner drops the
   * graphs before the next step. */
  if (servd_device_generation(s->c.device) != s->generation)
    return servd_device_step_eager(s, it, b, n_rows, logits, err);
  int rc = upload(s, b);
  if (rc) return rc;
  if ((rc = servd_device_graph_launch(s->slots[bucket].graph))) {
    if (rc != SERVD_ECANCELED) return rc;
    return servd_device_step_eager(s, it, b, n_rows, logits, err); /* the same race, seen by the launch */
  }
  if (!logits) return 0;
  return b->want_picks ? download_picks(s, s->slots[bucket].logits, n_rows, logits)
                       : download(s, s->slots[bucket].logits, n_rows, logits);
}

int servd_device_step_sync(servd_device_step *s) { return servd_device_sync(s->c.device); }

void servd_device_step_set_timeout(servd_device_step *s, int64_t timeout_ms) { s->timeout_ms = timeout_ms; }

void servd_device_step_set_kv(servd_device_step *s, servd_device_kv *dkv) {
  servd_device_step_drop_all(s);
  s->c.dkv = dkv;
}

bool servd_device_step_has_graph(const servd_device_step *s, int bucket) {
  return bucket >= 0 && bucket < s->c.n_buckets && s->slots[bucket].graph;
}

bool servd_device_step_stale(const servd_device_step *s) {
  return s->n_graphs > 0 && servd_device_generation(s->c.device) != s->generation;
}

void servd_device_step_drop(servd_device_step *s, int bucket) {
  if (bucket < 0 || bucket >= s->c.n_buckets || !s->slots[bucket].graph) return;
  servd_device_graph_destroy(s->slots[bucket].graph);
  servd_tensor_release(s->slots[bucket].logits);
  s->slots[bucket] = (graph_slot){0};
  s->n_graphs--;
}

void servd_device_step_drop_all(servd_device_step *s) {
  for (int i = 0; s->slots && i < s->c.n_buckets; i++) servd_device_step_drop(s, i);
}
