/* Step plans: capture, guards, replay and the host executor (servd/plan.h). */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "op_dispatch.h"
#include "plan-impl.h"

static const char *const op_names[] = {
#define SERVD_OP(name, dispatch, py, sig, names) #name,
#include "servd/ops.def"
#undef SERVD_OP
};
_Static_assert(sizeof op_names / sizeof op_names[0] == SERVD_OP_COUNT, "plan.c: one name per op");

const char *plan__op_name(servd_op_id op) { return (unsigned)op < SERVD_OP_COUNT ? op_names[op] : "?"; }

static const char *const in_names[PLAN_IN_COUNT] = {"tokens", "positions", "slots", "logit_rows"};

/* SERVD_PLAN_PROFILE: where the replayed steps spent their time, by op and fused kind. */
static void print_profile(const servd_plan *p, FILE *f) {
  int64_t total = 0;
  for (int k = 0; k < SERVD_OP_COUNT + PLAN_FUSE_KINDS; k++) total += p->prof_ns[k];
  if (p->prof_steps == 0 || total == 0) return;
  fprintf(f, "plan profile: %d tokens, %lld replayed steps, %.1f us per step in nodes\n", p->n_tokens,
          (long long)p->prof_steps, (double)total / 1e3 / (double)p->prof_steps);
  for (int k = 0; k < SERVD_OP_COUNT + PLAN_FUSE_KINDS; k++) {
    if (!p->prof_ns[k]) continue;
    int nodes = 0; /* nodes of op k outside fused groups, or groups of fused kind k */
    for (int i = 0; i < p->n;) {
      int fk = plan__fused_at(p, i);
      nodes += fk ? k == SERVD_OP_COUNT + fk : (int)p->nodes[i].op == k;
      i += plan__fuse_len[fk];
    }
    fprintf(f, "  %-16s %4d %s  %8.1f us per step  %5.1f%%\n",
            k < SERVD_OP_COUNT ? op_names[k] : plan__fuse_names[k - SERVD_OP_COUNT], nodes,
            k < SERVD_OP_COUNT ? "nodes " : "groups", (double)p->prof_ns[k] / 1e3 / (double)p->prof_steps,
            100.0 * (double)p->prof_ns[k] / (double)total);
  }
}

void servd_plan_destroy(servd_plan *p) {
  if (!p) return;
  if (p->prof_ns) print_profile(p, stderr);
  free(p->prof_ns);
  plan__fusion_free(p->fusion);
  for (int i = 0; i < p->n; i++)
    for (int j = 0; j < p->nodes[i].nt; j++) servd_tensor_release(p->nodes[i].t[j]);
  for (int k = 0; k < PLAN_IN_COUNT; k++) servd_tensor_release(p->in[k]);
  servd_tensor_release(p->logits);
  free(p->nodes);
  plan__par_free(p->par);
  free(p->held);
  free(p->held_s);
  free(p);
}

int servd_plan_node_count(const servd_plan *p) { return p ? p->n : 0; }

static int in_role(const servd_plan *p, const servd_storage *s) {
  for (int k = 0; k < PLAN_IN_COUNT; k++)
    if (p->in[k] && p->in[k]->storage == s) return k;
  return -1;
}

/* The guard's baseline: per owned tensor the plan's references, per storage the plan's tensors over
 * it. A tensor that nobody else references, over a storage that no other tensor covers, was dropped
 * by the model (it replaced its buffers). */
static void note_held(servd_plan *p, const servd_tensor *t) {
  if (!t || servd_storage_get_kind(t->storage) != SERVD_STORAGE_OWNED || in_role(p, t->storage) >= 0) return;
  for (int i = 0; i < p->n_held; i++)
    if (p->held[i].t == t) {
      p->held[i].mine++;
      return;
    }
  p->held[p->n_held++] = (struct plan_held){t, 1};
  for (int i = 0; i < p->n_held_s; i++)
    if (p->held_s[i].s == t->storage) {
      p->held_s[i].mine++;
      return;
    }
  p->held_s[p->n_held_s++] = (struct plan_held_storage){t->storage, 1, 0};
}

static int collect_held(servd_plan *p) {
  int max = 1;
  for (int i = 0; i < p->n; i++) max += p->nodes[i].nt;
  p->held = malloc(sizeof *p->held * (size_t)max);
  p->held_s = malloc(sizeof *p->held_s * (size_t)max);
  if (!p->held || !p->held_s) return servd_fail(SERVD_ENOMEM, "plan: guard table of %d tensors", max);
  for (int i = 0; i < p->n; i++)
    for (int j = 0; j < p->nodes[i].nt; j++) note_held(p, p->nodes[i].t[j]);
  note_held(p, p->logits);
  plan__guard_views(p);
  return 0;
}

void plan__guard_views(servd_plan *p) {
  for (int i = 0; i < p->n_held_s; i++) p->held_s[i].views = 0;
  int n = plan__fusion_views(p, NULL);
  const servd_tensor **v = n ? malloc(sizeof *v * (size_t)n) : NULL;
  if (n && !v) { /* out of memory: the groups go, so that no uncounted view holds a storage */
    plan__fusion_free(p->fusion);
    p->fusion = NULL;
    return;
  }
  plan__fusion_views(p, v);
  for (int k = 0; k < n; k++)
    for (int i = 0; i < p->n_held_s; i++)
      if (p->held_s[i].s == v[k]->storage) {
        p->held_s[i].views++;
        break;
      }
  free(v);
}

static int storage_mine(const servd_plan *p, const servd_storage *s) {
  for (int i = 0; i < p->n_held_s; i++)
    if (p->held_s[i].s == s) return p->held_s[i].mine + p->held_s[i].views;
  return 0;
}

static servd_tensor *i32_input(const int32_t *src, int n) {
  int64_t shape[1] = {n};
  servd_tensor *t = servd_tensor_new(SERVD_I32, 1, shape);
  if (t && n > 0) memcpy(servd_tensor_data(t), src, sizeof(int32_t) * (size_t)n);
  return t;
}

int servd_plan_capture(servd_interp *it, const servd_forward_batch *b, int64_t timeout_ms, servd_tensor **logits,
                       servd_py_error *err, servd_plan **plan, char *why, size_t why_cap) {
  *plan = NULL;
  *logits = NULL;
  if (why_cap) why[0] = '\0';
  servd_plan *p = calloc(1, sizeof *p);
  if (!p) return servd_fail(SERVD_ENOMEM, "plan: capture");
  p->n_tokens = b->n_tokens;
  p->n_logit_rows = b->n_logit_rows;
  p->n_seqs = b->attn.n_seqs;
  p->kv = b->kv;
  const char *ex = getenv("SERVD_PLAN_EXEC");
  p->exec = ex && !strcmp(ex, "parallel") ? &plan__host_parallel_executor : &plan__host_executor;
  const char *fu = getenv("SERVD_PLAN_FUSE"), *pr = getenv("SERVD_PLAN_PROFILE");
  p->fuse_env = fu && strcmp(fu, "on") ? fu : NULL; /* read by plan__fuse, still during the capture */
  if (pr && strcmp(pr, "0") && !(p->prof_ns = calloc(SERVD_OP_COUNT + PLAN_FUSE_KINDS, sizeof *p->prof_ns))) {
    servd_plan_destroy(p);
    return servd_fail(SERVD_ENOMEM, "plan: profile");
  }
  const int32_t *src[PLAN_IN_COUNT] = {b->tokens, b->positions, b->slots, b->logit_rows};
  for (int k = 0; k < PLAN_IN_COUNT; k++)
    if (!(p->in[k] = i32_input(src[k], k == PLAN_IN_LOGIT_ROWS ? b->n_logit_rows : b->n_tokens))) {
      servd_plan_destroy(p);
      return servd_fail(SERVD_ENOMEM, "plan: step inputs of %d tokens", b->n_tokens);
    }
  /* The model sees the plan's inputs as batch.tokens etc., so the nodes name them. */
  servd_forward_batch mine = *b;
  for (int k = 0; k < PLAN_IN_COUNT; k++) mine.host_inputs[k] = p->in[k];
  plan_recorder rec = {.p = p, .b = &mine};
  if (b->dbatch || b->dkv) plan__rec_refuse(&rec, "a step on a device (CUDA graphs capture those)");
  plan__rec = &rec;
  int rc = servd_interp_forward_deadline(it, &mine, timeout_ms, logits, err);
  plan__rec = NULL;
  if (rc == 0 && !rec.refused && *logits) {
    if ((*logits)->device >= 0) plan__rec_refuse(&rec, "logits on a device");
    servd_tensor_retain(*logits);
    p->logits = *logits;
  }
  if (rc == 0 && !rec.refused && p->n == 0) plan__rec_refuse(&rec, "the forward called no servd.ops");
  if (rc == 0 && !rec.refused) plan__fuse(p);
  if (rc == 0 && !rec.refused && (rc = collect_held(p)) != 0) plan__rec_refuse(&rec, "%s", servd_last_error());
  if (rc != 0 || rec.refused) {
    if (rec.refused && why_cap) snprintf(why, why_cap, "%s", rec.why);
    servd_plan_destroy(p);
    return rc;
  }
  *plan = p;
  return 0;
}

/* ---- guards --------------------------------------------------------------------------------------- */
static bool same_tensor(const servd_plan *a, const servd_tensor *x, const servd_plan *b, const servd_tensor *y) {
  if (!x || !y) return x == y;
  int ra = in_role(a, x->storage), rb = in_role(b, y->storage);
  if (ra != rb || (ra < 0 && x->storage != y->storage)) return false;
  size_t ox = x->offset - (ra >= 0 ? a->in[ra]->offset : 0), oy = y->offset - (rb >= 0 ? b->in[rb]->offset : 0);
  return ox == oy && x->dtype == y->dtype && x->ndim == y->ndim &&
         memcmp(x->shape, y->shape, sizeof(int64_t) * (size_t)x->ndim) == 0 &&
         memcmp(x->strides, y->strides, sizeof(int64_t) * (size_t)x->ndim) == 0;
}

bool servd_plan_same(const servd_plan *a, const servd_plan *b, char *why, size_t why_cap) {
  if (a->n != b->n) {
    snprintf(why, why_cap, "%d ops, then %d", a->n, b->n);
    return false;
  }
  for (int i = 0; i < a->n; i++) {
    const plan_node *x = &a->nodes[i], *y = &b->nodes[i];
    bool same = x->op == y->op && x->nt == y->nt && x->fval == y->fval && x->lval == y->lval &&
                memcmp(x->ival, y->ival, sizeof x->ival) == 0 && x->obj == y->obj &&
                memcmp(&x->rope, &y->rope, sizeof x->rope) == 0;
    for (int j = 0; same && j < x->nt; j++) same = same_tensor(a, x->t[j], b, y->t[j]);
    if (!same) {
      snprintf(why, why_cap, "op %d (%s, then %s) differs", i, op_names[x->op], op_names[y->op]);
      return false;
    }
  }
  if (!same_tensor(a, a->logits, b, b->logits)) {
    snprintf(why, why_cap, "the forward returned other logits");
    return false;
  }
  return true;
}

int servd_plan_check(const servd_plan *p, const servd_forward_batch *b, char *why, size_t why_cap) {
  if (b->n_tokens != p->n_tokens || b->n_logit_rows != p->n_logit_rows || b->attn.n_seqs != p->n_seqs) {
    snprintf(why, why_cap, "a step of %d tokens, %d logit rows, %d sequences; the plan has %d, %d, %d", b->n_tokens,
             b->n_logit_rows, b->attn.n_seqs, p->n_tokens, p->n_logit_rows, p->n_seqs);
    return SERVD_EINVAL;
  }
  if (b->kv != p->kv || b->dbatch || b->dkv) {
    snprintf(why, why_cap, "the step's KV cache is not the one the plan recorded");
    return SERVD_EINVAL;
  }
  for (int i = 0; i < p->n_held; i++) {
    const servd_tensor *t = p->held[i].t;
    if (__atomic_load_n(&t->refcount, __ATOMIC_ACQUIRE) <= p->held[i].mine &&
        servd_storage_refs(t->storage) <= storage_mine(p, t->storage)) {
      char d[64];
      snprintf(why, why_cap, "the model dropped a buffer the plan uses, %s of %zu bytes (its buffers moved)",
               servd_tensor_describe(t, d, sizeof d), servd_storage_bytes(t->storage));
      return SERVD_EINVAL;
    }
  }
  return 0;
}

/* ---- replay --------------------------------------------------------------------------------------- */
#define RUN_T2(name, n) servd_op__##name((n)->t[0], (n)->t[1])
#define RUN_T3(name, n) servd_op__##name((n)->t[0], (n)->t[1], (n)->t[2])
#define RUN_T3F(name, n) servd_op__##name((n)->t[0], (n)->t[1], (n)->t[2], (n)->fval)
#define RUN_T3L(name, n) servd_op__##name((n)->t[0], (n)->t[1], (n)->t[2], (n)->lval)
#define RUN_T4F(name, n) servd_op__##name((n)->t[0], (n)->t[1], (n)->t[2], (n)->t[3], (n)->fval)
#define RUN_T5(name, n) servd_op__##name((n)->t[0], (n)->t[1], (n)->t[2], (n)->t[3], (n)->t[4])
#define RUN_TOPK(name, n) servd_op__##name((n)->t[0], (n)->t[1], (n)->t[2], (n)->ival[0])
#define RUN_ROPE(name, n) servd_op__##name((n)->t[0], (n)->t[1], &(n)->rope)

int plan__run_node(servd_plan *p, const plan_node *n) {
  switch (n->op) {
#define SERVD_OP(name, dispatch, py, sig, names) \
  SERVD__IF_ANY_##dispatch(case SERVD_OP_##name : return RUN_##sig(name, n);)
#include "servd/ops.def"
#undef SERVD_OP
  case SERVD_OP_kv_write: return servd_op__kv_write(n->obj, n->ival[0], n->t[0], n->t[1], n->t[2]);
  case SERVD_OP_attention:
    return servd_op__attention(n->t[0], n->t[1], n->obj, n->ival[0], &p->attn, n->ival[1], n->fval);
  case SERVD_OP_attention_window:
    return servd_op__attention_window(n->t[0], n->t[1], n->obj, n->ival[0], &p->attn, n->ival[1], n->fval, n->ival[2]);
  case SERVD_OP_allreduce_sum: return servd_op__allreduce_sum(n->obj, n->ival[0], n->t[0]);
  case SERVD_OP_allgather_cols: return servd_op__allgather_cols(n->obj, n->ival[0], n->t[0], n->t[1]);
  case SERVD_OP_copy: return servd_op__copy(n->t[0], n->t[1]);
  case SERVD_OP_add_rmsnorm: return servd_op__add_rmsnorm(n->t[0], n->t[1], n->t[2], n->t[3], n->fval);
  case SERVD_OP_matmul_many:
    return servd_op__matmul_many(n->ival[0], &n->t[1], n->t[0], (const servd_tensor *const *)&n->t[1 + n->ival[0]]);
  case SERVD_OP_lora_sgmv: {
    const servd_lora_seg seg = {n->lval, n->ival[1], n->ival[2] ? n->t[2] : NULL, n->fval};
    return servd_op__lora_sgmv(n->t[0], n->t[1], n->ival[0], &seg);
  }
  default: return servd_fail(SERVD_EINVAL, "plan: no executor for op %s", op_names[n->op]);
  }
}

static int host_run(servd_plan *p) { return plan__serial_run(p); }

const plan_executor plan__host_executor = {"host-serial", host_run};

int servd_plan_replay(servd_plan *p, const servd_forward_batch *b, servd_tensor **logits) {
  *logits = NULL;
  if (b->n_tokens != p->n_tokens || b->n_logit_rows != p->n_logit_rows || b->kv != p->kv)
    return servd_fail(SERVD_EINVAL, "plan replay: a step of %d tokens, %d logit rows for a plan of %d, %d", b->n_tokens,
                      b->n_logit_rows, p->n_tokens, p->n_logit_rows);
  const int32_t *src[PLAN_IN_COUNT] = {b->tokens, b->positions, b->slots, b->logit_rows};
  for (int k = 0; k < PLAN_IN_COUNT; k++) {
    int n = k == PLAN_IN_LOGIT_ROWS ? b->n_logit_rows : b->n_tokens;
    if (n > 0) memcpy(servd_tensor_data(p->in[k]), src[k], sizeof(int32_t) * (size_t)n);
  }
  p->attn = b->attn;
  const bool first = !p->fusion_tried;
  int rc = p->exec->run(p);
  if (p->prof_ns && first) memset(p->prof_ns, 0, sizeof *p->prof_ns * (SERVD_OP_COUNT + PLAN_FUSE_KINDS));
  else if (p->prof_ns) p->prof_steps++; /* the first replay checks the fusions: not counted */
  memset(&p->attn, 0, sizeof p->attn);  /* the step's arrays are the engine's again */
  if (rc == 0 && p->logits) {
    servd_tensor_retain(p->logits);
    *logits = p->logits;
  }
  return rc;
}

/* ---- --trace-plan ------------------------------------------------------------------------------- */
static size_t tensor_bytes(const servd_tensor *t) {
  if (!t || t->ndim == 0) return 0;
  size_t rows = 1;
  for (int d = 0; d + 1 < t->ndim; d++) rows *= (size_t)t->shape[d];
  return rows * servd_dtype_row_bytes(t->dtype, t->shape[t->ndim - 1]);
}

static const char *tensor_name(const servd_plan *p, const servd_tensor *t, char *buf, size_t cap) {
  char d[64];
  servd_tensor_describe(t, d, sizeof d);
  int role = t ? in_role(p, t->storage) : -1;
  const char *kind = role >= 0                                                        ? in_names[role]
                     : t && servd_storage_get_kind(t->storage) != SERVD_STORAGE_OWNED ? "weight"
                                                                                      : "act";
  snprintf(buf, cap, "%s %s", kind, d);
  return buf;
}

void servd_plan_print(const servd_plan *p, FILE *f) {
  if (!p) return;
  size_t total = 0;
  fprintf(f, "plan: %d nodes, %d tokens, %d logit rows, %d sequences, executor %s\n", p->n, p->n_tokens,
          p->n_logit_rows, p->n_seqs, p->exec->name);
  for (int i = 0; i < p->n; i++) {
    const plan_node *n = &p->nodes[i];
    size_t bytes = 0;
    fprintf(f, "  %4d %-16s", i, op_names[n->op]);
    for (int j = 0; j < n->nt; j++) {
      char b[96];
      /* an embedding reads only the rows its ids name */
      const servd_tensor *t = n->t[j];
      if (n->op == SERVD_OP_embedding && j == 1 && t && t->ndim == 2 && n->t[0])
        bytes += (size_t)n->t[0]->shape[0] * servd_dtype_row_bytes(t->dtype, t->shape[1]);
      else bytes += tensor_bytes(t);
      fprintf(f, "%s%s", j ? ", " : " ", tensor_name(p, n->t[j], b, sizeof b));
    }
    int fused = p->exec == &plan__host_executor ? plan__fused_at(p, i) : PLAN_FUSE_NONE;
    fprintf(f, "  [%zu bytes%s]", bytes,
            n->op == SERVD_OP_attention || n->op == SERVD_OP_attention_window ? " + the KV rows read" : "");
    if (p->exec == &plan__host_parallel_executor && plan__fuses_swiglu(p, i))
      fprintf(f, "  fused with the next (gate/up + SwiGLU per column slice, checked bit-equal at first use)");
    if (fused)
      fprintf(f, "  fused %s: with the next %d, one pool job (checked bit-equal against them at first use)",
              plan__fuse_names[fused], plan__fuse_len[fused] - 1);
    fputc('\n', f);
    total += bytes;
  }
  fprintf(f, "plan: %zu bytes of tensors touched per step (%.1f MB)\n", total, (double)total / 1e6);
}
