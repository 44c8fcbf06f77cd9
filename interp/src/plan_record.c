/* The host table's ops with recording: each runs the op of op_dispatch.c and, while the calling
 * thread records a forward (plan__rec), appends the call to its plan. Ops the executor cannot run
 * alone (device tensors and device caches: CUDA graphs capture those; softmax, whose callers sample
 * in Python) stop the recording with the reason; the forward itself runs on unchanged. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "op_dispatch.h"
#include "plan-impl.h"

_Thread_local plan_recorder *plan__rec;

void plan__rec_refuse(plan_recorder *r, const char *fmt, ...) {
  if (r->refused) return;
  r->refused = true;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->why, sizeof r->why, fmt, ap);
  va_end(ap);
}

static const char *const op_names[] = {
#define SERVD_OP(name, dispatch, py, sig, names) #name,
#include "servd/ops.def"
#undef SERVD_OP
};

plan_node *plan__rec_node(plan_recorder *r, servd_op_id op) {
  if (r->refused) return NULL;
  servd_plan *p = r->p;
  if (p->n == p->cap) {
    int cap = p->cap ? 2 * p->cap : 256;
    plan_node *nodes = realloc(p->nodes, sizeof *nodes * (size_t)cap);
    if (!nodes) {
      plan__rec_refuse(r, "out of memory for %d plan nodes", cap);
      return NULL;
    }
    p->nodes = nodes;
    p->cap = cap;
  }
  plan_node *n = &p->nodes[p->n++];
  memset(n, 0, sizeof *n);
  n->op = op;
  return n;
}

void plan__rec_tensor(plan_recorder *r, plan_node *n, const servd_tensor *t) {
  if (r->refused) return;
  if (t && t->device >= 0) {
    plan__rec_refuse(r, "%s: a tensor on cuda:%d (device steps are captured as CUDA graphs)", op_names[n->op],
                     t->device);
    return;
  }
  if (n->nt == PLAN_MAX_TENSORS) {
    plan__rec_refuse(r, "%s: more than %d tensors", op_names[n->op], PLAN_MAX_TENSORS);
    return;
  }
  if (t) servd_tensor_retain((servd_tensor *)t);
  n->t[n->nt++] = (servd_tensor *)t;
}

/* ---- ANY/ANYT rows: tensors by the signature, then its scalars ------------------------------------ */
#define REC_T(x) plan__rec_tensor(rec_, node_, x);
#define REC_SCALARS_T2(n, a, b)
#define REC_SCALARS_T3(n, a, b, c)
#define REC_SCALARS_T3F(n, a, b, c, x) (n)->fval = (x);
#define REC_SCALARS_T3L(n, a, b, c, x) (n)->lval = (x);
#define REC_SCALARS_TOPK(n, a, b, c, x) (n)->ival[0] = (x);
#define REC_SCALARS_ROPE(n, x, pos, params) (n)->rope = *(params);
#define SERVD_OP(name, dispatch, py, sig, names) \
  SERVD__IF_ANY_##dispatch(int servd_plan__##name(SERVD__PARAMS(sig, names)) { \
    plan_recorder *rec_ = plan__rec; \
    plan_node *node_ = rec_ ? plan__rec_node(rec_, SERVD_OP_##name) : NULL; \
    if (node_) { \
      SERVD__EACH(sig, REC_T, names) \
      SERVD__CALL(REC_SCALARS_##sig, node_, SERVD__UNPAREN names) \
    } \
    return servd_op__##name(SERVD__ARGS(names)); \
  })
#include "servd/ops.def"
#undef SERVD_OP

/* ---- HAND rows ---------------------------------------------------------------------------------- */
static plan_node *rec_begin(servd_op_id op) { return plan__rec ? plan__rec_node(plan__rec, op) : NULL; }

static void refuse(const char *what) {
  if (plan__rec) plan__rec_refuse(plan__rec, "%s", what);
}

int servd_plan__lora_sgmv(servd_tensor *out, const servd_tensor *x, int n_segs, const servd_lora_seg *segs) {
  refuse("LoRA adapters (their row groups change every step)");
  return servd_op__lora_sgmv(out, x, n_segs, segs);
}

int servd_plan__softmax(servd_tensor *x, float scale) {
  refuse("softmax in the forward (sampling belongs to the engine)");
  return servd_op__softmax(x, scale);
}

int servd_plan__kv_write(servd_kv_cache *c, int layer, const servd_tensor *k, const servd_tensor *v,
                         const servd_tensor *slots) {
  plan_node *n = rec_begin(SERVD_OP_kv_write);
  if (n) {
    n->obj = c;
    n->ival[0] = layer;
    plan__rec_tensor(plan__rec, n, k);
    plan__rec_tensor(plan__rec, n, v);
    plan__rec_tensor(plan__rec, n, slots);
    if (c != plan__rec->b->kv) plan__rec_refuse(plan__rec, "kv_write: a KV cache other than the step's");
  }
  return servd_op__kv_write(c, layer, k, v, slots);
}

/* Attention reads the step's layout; the replay binds its own step's, so the recorded one must be it. */
static void rec_attention(plan_node *n, servd_tensor *out, const servd_tensor *q, const servd_kv_cache *c, int layer,
                          const servd_attn_batch *b, int n_heads, float scale, int window) {
  n->obj = (void *)c;
  n->ival[0] = layer;
  n->ival[1] = n_heads;
  n->ival[2] = window;
  n->fval = scale;
  plan__rec_tensor(plan__rec, n, out);
  plan__rec_tensor(plan__rec, n, q);
  const servd_forward_batch *fb = plan__rec->b;
  if (c != fb->kv) plan__rec_refuse(plan__rec, "attention: a KV cache other than the step's");
  if (!b || memcmp(b, &fb->attn, sizeof *b) != 0)
    plan__rec_refuse(plan__rec, "attention: a sequence layout other than the step's batch");
}

int servd_plan__attention(servd_tensor *out, const servd_tensor *q, const servd_kv_cache *c, int layer,
                          const servd_attn_batch *b, int n_heads, float scale) {
  plan_node *n = rec_begin(SERVD_OP_attention);
  if (n) rec_attention(n, out, q, c, layer, b, n_heads, scale, 0);
  return servd_op__attention(out, q, c, layer, b, n_heads, scale);
}

int servd_plan__attention_window(servd_tensor *out, const servd_tensor *q, const servd_kv_cache *c, int layer,
                                 const servd_attn_batch *b, int n_heads, float scale, int window) {
  plan_node *n = rec_begin(SERVD_OP_attention_window);
  if (n) rec_attention(n, out, q, c, layer, b, n_heads, scale, window);
  return servd_op__attention_window(out, q, c, layer, b, n_heads, scale, window);
}

int servd_plan__allreduce_sum(servd_comm *c, int rank, servd_tensor *x) {
  plan_node *n = rec_begin(SERVD_OP_allreduce_sum);
  if (n) {
    n->obj = c;
    n->ival[0] = rank;
    plan__rec_tensor(plan__rec, n, x);
  }
  return servd_op__allreduce_sum(c, rank, x);
}

int servd_plan__allgather_cols(servd_comm *c, int rank, servd_tensor *out, const servd_tensor *x) {
  plan_node *n = rec_begin(SERVD_OP_allgather_cols);
  if (n) {
    n->obj = c;
    n->ival[0] = rank;
    plan__rec_tensor(plan__rec, n, out);
    plan__rec_tensor(plan__rec, n, x);
  }
  return servd_op__allgather_cols(c, rank, out, x);
}

int servd_plan__copy(servd_tensor *dst, const servd_tensor *src) {
  plan_node *n = rec_begin(SERVD_OP_copy);
  if (n) {
    plan__rec_tensor(plan__rec, n, dst);
    plan__rec_tensor(plan__rec, n, src);
  }
  return servd_op__copy(dst, src);
}

int servd_plan__add_rmsnorm(servd_tensor *x, const servd_tensor *o, servd_tensor *out, const servd_tensor *weight,
                            float eps) {
  plan_node *n = rec_begin(SERVD_OP_add_rmsnorm);
  if (n) {
    n->fval = eps;
    plan__rec_tensor(plan__rec, n, x);
    plan__rec_tensor(plan__rec, n, o);
    plan__rec_tensor(plan__rec, n, out);
    plan__rec_tensor(plan__rec, n, weight);
  }
  return servd_op__add_rmsnorm(x, o, out, weight, eps);
}

/* Tensors: x, then the outputs, then the weights. */
int servd_plan__matmul_many(int count, servd_tensor *const *outs, const servd_tensor *x,
                            const servd_tensor *const *ws) {
  plan_node *n = rec_begin(SERVD_OP_matmul_many);
  if (n) {
    if (count < 1 || count > SERVD_MATMUL_MANY_MAX) {
      plan__rec_refuse(plan__rec, "matmul_many: %d weights", count);
    } else {
      n->ival[0] = count;
      plan__rec_tensor(plan__rec, n, x);
      for (int i = 0; i < count; i++) plan__rec_tensor(plan__rec, n, outs[i]);
      for (int i = 0; i < count; i++) plan__rec_tensor(plan__rec, n, ws[i]);
    }
  }
  return servd_op__matmul_many(count, outs, x, ws);
}

/* Device caches and collectives: CUDA graphs capture device steps (daemon/engine/graph_plan.c). */
int servd_plan__device_kv_write(servd_device_kv *kv, int layer, const servd_tensor *k, const servd_tensor *v,
                                const servd_tensor *slots) {
  refuse("kv_write on a device cache");
  return servd_op__device_kv_write(kv, layer, k, v, slots);
}

int servd_plan__device_attention(servd_tensor *out, const servd_tensor *q, const servd_device_kv *kv, int layer,
                                 const servd_device_batch *db, int n_heads, float scale) {
  refuse("attention on a device cache");
  return servd_op__device_attention(out, q, kv, layer, db, n_heads, scale);
}

int servd_plan__device_attention_window(servd_tensor *out, const servd_tensor *q, const servd_device_kv *kv, int layer,
                                        const servd_device_batch *db, int n_heads, float scale, int window) {
  refuse("attention on a device cache");
  return servd_op__device_attention_window(out, q, kv, layer, db, n_heads, scale, window);
}

int servd_plan__device_allreduce_sum(servd_device_comm *c, int rank, servd_tensor *x) {
  refuse("allreduce of device tensors");
  return servd_op__device_allreduce_sum(c, rank, x);
}

int servd_plan__device_allgather_cols(servd_device_comm *c, int rank, servd_tensor *out, const servd_tensor *x) {
  refuse("allgather_cols of device tensors");
  return servd_op__device_allgather_cols(c, rank, out, x);
}
