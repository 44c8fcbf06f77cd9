/* Fusions of the serial walk: a pass over a captured plan that rewrites node patterns into fused
 * groups, each run as one compute-pool job instead of one job (or one inline pass) per node.
 *
 * - rope_kv: rope(q), rope(k), kv_write(k, v) of one layer. The rows of the step are split into
 *   slices; each slice rotates its q and k rows and writes its k and v rows to the cache, so a row
 *   of k is written while it is still in cache, and a batch pays one pool hand-off for the three.
 *   Both ops work row by row, so a slice computes exactly what the whole op computes for its rows;
 *   the one exception, a rope with a long-context table (chosen by the largest position of the
 *   call), is not fused.
 * - gate_up_swiglu: matmul_many(x, gate, up) then swiglu(gate, gate, up), as one kernel
 *   (servd_gate_up_swiglu, servd/fused.h) whose pool items are 32-column tiles of both weights: the
 *   thread that computed a tile applies SwiGLU to it while it is in cache, one hand-off for the two
 *   (an x of more rows than a decode runs the unfused ops inside the kernel).
 *
 * The groups and the slices' tensor views are made once, at capture; the first serial replay checks every group where the walk reaches it: it runs the group fused, keeps what it
 * wrote to its outputs (q and k; gate and up), restores the inputs it rotates in place, runs the
 * unfused nodes (whose results stay) and compares bit for bit. The KV rows a fused group writes come
 * from the same kv_write on the checked k rows and the unchanged v rows. A kind of fusion with a
 * group that differs is dropped with a line on stderr, so a fused plan gives the unfused plan's bits.
 * SERVD_PLAN_FUSE=off at capture turns the pass off; a comma-separated list of kinds (rope_kv,
 * gate_up_swiglu) keeps only those. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "op_dispatch.h"
#include "plan-impl.h"
#include "servd/clock.h"
#include "servd/fused.h"
#include "servd/threadpool.h"

enum { MM_COLS = 32, ROPE_KV_SLICE_ELEMS = 8192 };

const char *const plan__fuse_names[PLAN_FUSE_KINDS] = {"", "rope_kv", "gate_up_swiglu"};
const int plan__fuse_len[PLAN_FUSE_KINDS] = {1, 3, 2};

/* One fused group: its slices' views, in the order the slice runs them. */
typedef struct plan_fused {
  int kind, first, n_slices;
  servd_tensor **views; /* [n_slices][FUSED_VIEWS] */
} plan_fused;
enum { FUSED_VIEWS = 5 }; /* rope_kv: q, k, v, positions, slots */

struct plan_fusion {
  plan_fused *groups;
  int n;
  int *at;                       /* [p->n]: the group starting at node i, or -1 */
  bool off[PLAN_FUSE_KINDS];     /* kinds not made (SERVD_PLAN_FUSE) */
  bool differs[PLAN_FUSE_KINDS]; /* kinds with a group that differed from its nodes at first use */
};

void plan__fusion_free(plan_fusion *f) {
  if (!f) return;
  for (int g = 0; g < f->n; g++) {
    for (int j = 0; f->groups[g].views && j < f->groups[g].n_slices * FUSED_VIEWS; j++)
      servd_tensor_release(f->groups[g].views[j]);
    free(f->groups[g].views);
  }
  free(f->groups);
  free(f->at);
  free(f);
}

static bool rows_of(const servd_tensor *t, int64_t rows) { return t && t->ndim >= 1 && t->shape[0] == rows; }

static bool is_rope_kv(const servd_plan *p, int i) {
  if (i + 2 >= p->n) return false;
  const plan_node *q = &p->nodes[i], *k = &p->nodes[i + 1], *w = &p->nodes[i + 2];
  if (q->op != SERVD_OP_rope || k->op != SERVD_OP_rope || w->op != SERVD_OP_kv_write) return false;
  int64_t m = q->t[0] ? q->t[0]->shape[0] : -1;
  return q->t[1] == k->t[1] && memcmp(&q->rope, &k->rope, sizeof q->rope) == 0 && !q->rope.inv_freq_long &&
         w->t[0] == k->t[0] && q->t[0] != k->t[0] && servd_tensor_is_contiguous(q->t[0]) &&
         servd_tensor_is_contiguous(k->t[0]) && w->t[1] != k->t[0] && w->t[1] != q->t[0] && rows_of(q->t[0], m) &&
         rows_of(k->t[0], m) && rows_of(w->t[1], m) && rows_of(w->t[2], m) && rows_of(q->t[1], m) && m > 0;
}

static bool is_gate_up_swiglu(const servd_plan *p, int i) {
  if (i + 1 >= p->n) return false;
  const plan_node *a = &p->nodes[i], *b = &p->nodes[i + 1];
  return a->op == SERVD_OP_matmul_many && a->ival[0] == 2 && b->op == SERVD_OP_swiglu && b->t[0] == a->t[1] &&
         b->t[1] == a->t[1] && b->t[2] == a->t[2] && a->t[3]->ndim == 2 && a->t[4]->ndim == 2 &&
         a->t[3]->shape[0] == a->t[4]->shape[0] && a->t[3]->shape[0] >= 2 * MM_COLS && a->t[1]->ndim == 2 &&
         a->t[2]->ndim == 2 && servd_tensor_is_contiguous(a->t[1]) && servd_tensor_is_contiguous(a->t[2]) &&
         a->t[0] != a->t[1] && a->t[0] != a->t[2];
}

/* rope_kv slices: rows [r0, r1) of q, k, v, positions and slots. */
static int slice_rope_kv(const servd_plan *p, plan_fused *g) {
  const plan_node *q = &p->nodes[g->first], *k = &p->nodes[g->first + 1], *w = &p->nodes[g->first + 2];
  int64_t m = q->t[0]->shape[0], cols = 1;
  for (int d = 1; d < q->t[0]->ndim; d++) cols *= q->t[0]->shape[d];
  int64_t want = m * cols / ROPE_KV_SLICE_ELEMS, threads = servd_threadpool_size();
  int S = (int)(want < 1 ? 1 : want > threads ? threads : want > m ? m : want);
  if (!(g->views = calloc((size_t)S * FUSED_VIEWS, sizeof *g->views))) return -1;
  g->n_slices = S;
  for (int s = 0; s < S; s++) {
    int64_t r0 = m * s / S, r1 = m * (s + 1) / S;
    const servd_tensor *src[FUSED_VIEWS] = {q->t[0], k->t[0], w->t[1], q->t[1], w->t[2]};
    for (int j = 0; j < FUSED_VIEWS; j++)
      if (!(g->views[s * FUSED_VIEWS + j] = servd_tensor_narrow(src[j], 0, r0, r1 - r0))) return -1;
  }
  return 0;
}

static plan_fusion *build(const servd_plan *p, const bool *off) {
  plan_fusion *f = calloc(1, sizeof *f);
  if (!f || !(f->at = malloc(sizeof *f->at * (size_t)p->n)) ||
      !(f->groups = calloc((size_t)p->n / 2 + 1, sizeof *f->groups))) {
    plan__fusion_free(f);
    return NULL;
  }
  memcpy(f->off, off, sizeof f->off);
  for (int i = 0; i < p->n; i++) f->at[i] = -1;
  for (int i = 0; i < p->n;) {
    int kind = !off[PLAN_FUSE_ROPE_KV] && is_rope_kv(p, i)                 ? PLAN_FUSE_ROPE_KV
               : !off[PLAN_FUSE_GATE_UP_SWIGLU] && is_gate_up_swiglu(p, i) ? PLAN_FUSE_GATE_UP_SWIGLU
                                                                           : PLAN_FUSE_NONE;
    if (kind == PLAN_FUSE_NONE) {
      i++;
      continue;
    }
    plan_fused *g = &f->groups[f->n++];
    g->kind = kind;
    g->first = i;
    g->n_slices = 1; /* gate_up_swiglu: one kernel (servd/fused.h) splits its tiles over the pool */
    int rc = kind == PLAN_FUSE_ROPE_KV ? slice_rope_kv(p, g) : 0;
    if (rc != 0) { /* a slice the tensors refuse: the nodes stay apart */
      for (int j = 0; g->views && j < g->n_slices * FUSED_VIEWS; j++) servd_tensor_release(g->views[j]);
      free(g->views);
      f->n--;
      i++;
      continue;
    }
    f->at[i] = f->n - 1;
    i += plan__fuse_len[kind];
  }
  return f;
}

typedef struct fused_job {
  const servd_plan *p;
  const plan_fused *g;
  _Atomic int rc;
  char msg[400];
} fused_job;

static int run_slice(const servd_plan *p, const plan_fused *g, int s) {
  const plan_node *n = &p->nodes[g->first];
  if (g->kind == PLAN_FUSE_ROPE_KV) {
    servd_tensor *const *v = g->views + s * FUSED_VIEWS;
    int rc;
    const plan_node *w = &p->nodes[g->first + 2];
    if ((rc = servd_op__rope(v[0], v[3], &n->rope)) || (rc = servd_op__rope(v[1], v[3], &n->rope))) return rc;
    return servd_op__kv_write(w->obj, w->ival[0], v[1], v[2], v[4]);
  }
  return servd_gate_up_swiglu(n->t[1], n->t[2], n->t[0], n->t[3], n->t[4]);
}

static void fused_task(void *ctx, int64_t b, int64_t e, int thread) {
  (void)thread;
  fused_job *j = ctx;
  for (int64_t s = b; s < e; s++) {
    if (atomic_load_explicit(&j->rc, memory_order_relaxed)) return;
    int rc = run_slice(j->p, j->g, (int)s);
    int expect = 0;
    if (rc < 0 && atomic_compare_exchange_strong(&j->rc, &expect, rc))
      snprintf(j->msg, sizeof j->msg, "%s", servd_last_error());
  }
}

static int run_group(const servd_plan *p, const plan_fused *g) {
  if (g->n_slices == 1) return run_slice(p, g, 0);
  fused_job j = {.p = p, .g = g};
  servd_parallel_for(g->n_slices, 1, fused_task, &j);
  int rc = atomic_load(&j.rc);
  return rc ? servd_fail(rc, "fused %s: %s", plan__fuse_names[g->kind], j.msg) : 0;
}

/* A copy of t's bytes (contiguous), or NULL. */
static void *snapshot(const servd_tensor *t) {
  size_t bytes = servd_tensor_nbytes(t);
  void *c = malloc(bytes ? bytes : 1);
  if (c) memcpy(c, servd_tensor_data(t), bytes);
  return c;
}

/* Group g at its first use: fused, then (its in-place inputs restored) its unfused nodes, whose
 * results stay; 1 when both wrote the same bits to the group's outputs, 0 when not. */
static int check_group(servd_plan *p, const plan_fused *g) {
  const plan_node *n = &p->nodes[g->first];
  const servd_tensor *outs[2] = {n[0].t[0], n[1].t[0]}; /* rope_kv: q, k (in place) */
  if (g->kind == PLAN_FUSE_GATE_UP_SWIGLU) outs[0] = n[0].t[1], outs[1] = n[0].t[2];
  void *in[2] = {0}, *got[2] = {0};
  int rc = 0, same = 0;
  for (int j = 0; j < 2; j++)
    if ((g->kind == PLAN_FUSE_ROPE_KV && !(in[j] = snapshot(outs[j]))))
      rc = servd_fail(SERVD_ENOMEM, "plan: fused check");
  if (rc == 0) rc = run_group(p, g);
  for (int j = 0; rc == 0 && j < 2; j++)
    if (!(got[j] = snapshot(outs[j]))) rc = servd_fail(SERVD_ENOMEM, "plan: fused check");
  for (int j = 0; rc == 0 && j < 2 && in[j]; j++)
    memcpy(servd_tensor_data(outs[j]), in[j], servd_tensor_nbytes(outs[j]));
  for (int i = 0; rc == 0 && i < plan__fuse_len[g->kind]; i++) rc = plan__run_node(p, &n[i]);
  if (rc == 0)
    same = memcmp(got[0], servd_tensor_data(outs[0]), servd_tensor_nbytes(outs[0])) == 0 &&
           memcmp(got[1], servd_tensor_data(outs[1]), servd_tensor_nbytes(outs[1])) == 0;
  for (int j = 0; j < 2; j++) {
    free(in[j]);
    free(got[j]);
  }
  return rc < 0 ? rc : same;
}

/* The serial walk with f's groups (NULL: none), each checked against its parts instead when check
 * is set (a kind that differs is marked in f->differs); time per op and fused kind into p->prof_ns. */
static int walk(servd_plan *p, plan_fusion *f, bool check) {
  for (int i = 0; i < p->n;) {
    int g = f ? f->at[i] : -1;
    int64_t t0 = p->prof_ns ? servd_now_ns() : 0;
    int kind = g >= 0 ? f->groups[g].kind : PLAN_FUSE_NONE;
    int rc;
    if (g < 0) rc = plan__run_node(p, &p->nodes[i]);
    else if (!check) rc = run_group(p, &f->groups[g]);
    else if ((rc = check_group(p, &f->groups[g])) >= 0) {
      if (rc == 0) f->differs[kind] = true;
      rc = 0;
    }
    if (p->prof_ns) p->prof_ns[kind ? SERVD_OP_COUNT + kind : (int)p->nodes[i].op] += servd_now_ns() - t0;
    if (rc < 0) {
      char msg[400]; /* servd_fail writes the buffer servd_last_error returns: copy it first */
      snprintf(msg, sizeof msg, "%s", servd_last_error());
      return servd_fail(rc, "plan replay, op %d (%s): %s", i,
                        kind ? plan__fuse_names[kind] : plan__op_name(p->nodes[i].op), msg);
    }
    i += plan__fuse_len[kind];
  }
  return 0;
}

int plan__fusion_views(const servd_plan *p, const servd_tensor **out) {
  int n = 0;
  for (int g = 0; p->fusion && g < p->fusion->n; g++)
    for (int j = 0; p->fusion->groups[g].views && j < p->fusion->groups[g].n_slices * FUSED_VIEWS; j++, n++)
      if (out) out[n] = p->fusion->groups[g].views[j];
  return n;
}

void plan__fuse(servd_plan *p) {
  bool off[PLAN_FUSE_KINDS] = {0};
  const char *env = p->fuse_env; /* a comma-separated list of kinds keeps only those */
  for (int k = 1; env && k < PLAN_FUSE_KINDS; k++) {
    const char *at = strstr(env, plan__fuse_names[k]);
    size_t len = strlen(plan__fuse_names[k]);
    off[k] = !at || (at != env && at[-1] != ',') || (at[len] && at[len] != ',');
  }
  p->fuse_env = NULL;        /* the environment's string: not kept past capture */
  p->fusion = build(p, off); /* NULL (out of memory): unfused */
}

/* First serial replay: each group is checked against its parts as the walk reaches it (the step's
 * results are the unfused ones); a kind with a group that differs is dropped. */
static int first_replay(servd_plan *p) {
  plan_fusion *f = p->fusion;
  p->fusion_tried = true;
  if (!f || f->n == 0) return walk(p, NULL, false);
  int rc = walk(p, f, true);
  if (rc < 0) return rc;
  bool redo = false, off[PLAN_FUSE_KINDS];
  for (int k = 1; k < PLAN_FUSE_KINDS; k++) {
    off[k] = f->off[k] || f->differs[k];
    if (f->differs[k]) {
      redo = true;
      fprintf(stderr, "servd: step plan: the fused %s differs from its unfused nodes: the plan runs it unfused\n",
              plan__fuse_names[k]);
    }
  }
  if (redo) {
    off[0] = false;
    plan__fusion_free(f);
    p->fusion = build(p, off);
    plan__guard_views(p);
  }
  return 0;
}

int plan__serial_run(servd_plan *p) {
  if (!p->fusion_tried) return first_replay(p);
  return walk(p, p->fusion, false);
}

int plan__fused_at(const servd_plan *p, int i) {
  return p->fusion && p->fusion->at[i] >= 0 ? p->fusion->groups[p->fusion->at[i]].kind : PLAN_FUSE_NONE;
}
