/* The host executor's parallel walk: the whole step is one job of the compute pool. Every thread
 * that joins walks the plan's steps in order; a step is either a run of small nodes, which the
 * first thread to reach it runs alone, or one large node split into slices (a matmul's output
 * columns at multiples of 32, which the kernels compute alike however they are grouped; attention
 * by sequences), which the threads claim one at a time. A thread moves on only when every slice of
 * the step is done: the threads meet at a step boundary instead of at a pool dispatch per op.
 * Slices are claimed, never assigned, so a thread the machine did not schedule holds nobody up: the
 * others take its slices (a walk by one thread alone is the serial order).
 *
 * Collectives stay with the serial walk: a rank blocked in an all-reduce inside a pool job would
 * hold the pool's turn that the other ranks need to reach it. */
#include <sched.h>
#include <stdio.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "op_dispatch.h"
#include "plan-impl.h"
#include "servd/threadpool.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

enum { MM_COLS = 32 }; /* the matmul kernels' column tile: slices start on its multiples */

typedef enum step_kind { STEP_SERIAL, STEP_COLS, STEP_SEQS } step_kind;

typedef struct exec_step {
  step_kind kind;
  bool swiglu;            /* STEP_COLS of gate/up: each slice applies the next node's SwiGLU to its columns */
  int first, count;       /* nodes [first, first + count) */
  int n_slices;           /* 1 for STEP_SERIAL */
  servd_tensor **views;   /* [n_slices][PLAN_MAX_TENSORS]: the node's tensors per slice */
  int *seq0;              /* STEP_SEQS: [n_slices + 1] sequence bounds */
  servd_attn_batch *attn; /* STEP_SEQS: [n_slices], set per replay */
  _Atomic int claim, done;
} exec_step;

struct plan_par {
  exec_step *steps;
  int n, threads;
  int32_t *iota; /* q_start of a slice of decode sequences: 0, 1, 2, ... */
};

void plan__par_free(plan_par *x) {
  if (!x) return;
  for (int i = 0; i < x->n; i++) {
    exec_step *s = &x->steps[i];
    for (int j = 0; s->views && j < s->n_slices * PLAN_MAX_TENSORS; j++) servd_tensor_release(s->views[j]);
    free(s->views);
    free(s->seq0);
    free(s->attn);
  }
  free(x->steps);
  free(x->iota);
  free(x);
}

static int64_t cols_of(const servd_tensor *w) { return w && w->ndim == 2 ? w->shape[0] : 0; }

/* Column range of slice s of n columns in S slices, on tile boundaries. */
static void col_range(int64_t n, int s, int S, int64_t *c0, int64_t *len) {
  int64_t tiles = (n + MM_COLS - 1) / MM_COLS, t0 = tiles * s / S, t1 = tiles * (s + 1) / S;
  *c0 = t0 * MM_COLS;
  int64_t c1 = t1 * MM_COLS < n ? t1 * MM_COLS : n;
  *len = c1 - *c0;
}

/* Slices of a matmul (out, x, w) or matmul_many (x, outs..., ws...): each output's columns and its
 * weight's rows. 0 when the node stays whole. */
static int split_cols(const plan_node *n, int S, servd_tensor **views) {
  int count = n->op == SERVD_OP_matmul ? 1 : n->ival[0];
  for (int s = 0; s < S; s++) {
    servd_tensor **v = views + s * PLAN_MAX_TENSORS;
    for (int i = 0; i < count; i++) {
      servd_tensor *out = n->op == SERVD_OP_matmul ? n->t[0] : n->t[1 + i];
      servd_tensor *w = n->op == SERVD_OP_matmul ? n->t[2] : n->t[1 + count + i];
      int64_t c0, len;
      col_range(cols_of(w), s, S, &c0, &len);
      servd_tensor *ov = servd_tensor_narrow(out, out->ndim - 1, c0, len), *wv = servd_tensor_narrow(w, 0, c0, len);
      if (!ov || !wv) {
        servd_tensor_release(ov);
        servd_tensor_release(wv);
        return -1;
      }
      v[n->op == SERVD_OP_matmul ? 0 : 1 + i] = ov;
      v[n->op == SERVD_OP_matmul ? 2 : 1 + count + i] = wv;
    }
    servd_tensor *x = n->op == SERVD_OP_matmul ? n->t[1] : n->t[0];
    servd_tensor_retain(x);
    v[n->op == SERVD_OP_matmul ? 1 : 0] = x;
  }
  return 0;
}

/* How many slices node n splits into (1: none). */
static int slices_of(const servd_plan *p, const plan_node *n, int threads) {
  const int want = 2 * threads;
  if (n->op == SERVD_OP_matmul || n->op == SERVD_OP_matmul_many) {
    int count = n->op == SERVD_OP_matmul ? 1 : n->ival[0];
    int64_t tiles = INT64_MAX;
    for (int i = 0; i < count; i++) {
      int64_t c = cols_of(n->op == SERVD_OP_matmul ? n->t[2] : n->t[1 + count + i]);
      int64_t t = (c + MM_COLS - 1) / MM_COLS;
      if (t < tiles) tiles = t;
    }
    return tiles >= want ? want : tiles >= 2 ? (int)tiles : 1;
  }
  if (n->op == SERVD_OP_attention || n->op == SERVD_OP_attention_window)
    return p->n_seqs >= want ? want : p->n_seqs >= 2 ? p->n_seqs : 1;
  return 1;
}

static int add_step(plan_par *x, step_kind kind, int first, int n_slices) {
  exec_step *s = &x->steps[x->n++];
  memset(s, 0, sizeof *s);
  s->kind = kind;
  s->first = first;
  s->count = 1;
  s->n_slices = n_slices;
  if (kind == STEP_SERIAL) return 0;
  s->views = calloc((size_t)n_slices * PLAN_MAX_TENSORS, sizeof *s->views);
  if (!s->views) return -1;
  if (kind == STEP_SEQS && (!(s->seq0 = calloc((size_t)n_slices + 1, sizeof *s->seq0)) ||
                            !(s->attn = calloc((size_t)n_slices, sizeof *s->attn))))
    return -1;
  return 0;
}

/* Attention over sequences [a, b): rows a..b of q and out (one token per sequence in a decode). */
static int split_seqs(const servd_plan *p, const plan_node *n, exec_step *s) {
  for (int k = 0; k < s->n_slices; k++) {
    int a = p->n_seqs * k / s->n_slices, b = p->n_seqs * (k + 1) / s->n_slices;
    s->seq0[k] = a;
    s->seq0[k + 1] = b;
    servd_tensor **v = s->views + k * PLAN_MAX_TENSORS;
    if (!(v[0] = servd_tensor_narrow(n->t[0], 0, a, b - a)) || !(v[1] = servd_tensor_narrow(n->t[1], 0, a, b - a)))
      return -1;
  }
  return 0;
}

bool plan__fuses_swiglu(const servd_plan *p, int i) {
  if (i + 1 >= p->n) return false;
  const plan_node *a = &p->nodes[i], *b = &p->nodes[i + 1];
  return a->op == SERVD_OP_matmul_many && a->ival[0] == 2 && b->op == SERVD_OP_swiglu && b->t[0] == a->t[1] &&
         b->t[1] == a->t[1] && b->t[2] == a->t[2] && servd_tensor_is_contiguous(a->t[1]);
}

static plan_par *build(servd_plan *p, int threads, bool fuse) {
  plan_par *x = calloc(1, sizeof *x);
  if (!x || !(x->steps = calloc((size_t)p->n, sizeof *x->steps)) ||
      !(x->iota = malloc(sizeof(int32_t) * (size_t)(p->n_seqs > 0 ? p->n_seqs : 1)))) {
    plan__par_free(x);
    return NULL;
  }
  x->threads = threads;
  for (int s = 0; s < p->n_seqs; s++) x->iota[s] = s;
  for (int i = 0; i < p->n; i++) {
    const plan_node *n = &p->nodes[i];
    int S = slices_of(p, n, threads);
    bool attn = n->op == SERVD_OP_attention || n->op == SERVD_OP_attention_window;
    if (S > 1) {
      if (add_step(x, attn ? STEP_SEQS : STEP_COLS, i, S) != 0) goto fail;
      exec_step *st = &x->steps[x->n - 1];
      int rc = attn ? split_seqs(p, n, st) : split_cols(n, S, st->views);
      if (rc == 0 && fuse && !attn && plan__fuses_swiglu(p, i)) {
        st->swiglu = true;
        st->count = 2;
        i++;
      }
      if (rc == 0) continue;
      /* a slice the tensors refuse: this node stays whole */
      for (int j = 0; j < S * PLAN_MAX_TENSORS; j++) servd_tensor_release(st->views[j]);
      free(st->views);
      free(st->seq0);
      free(st->attn);
      x->n--;
    }
    exec_step *last = x->n ? &x->steps[x->n - 1] : NULL;
    if (last && last->kind == STEP_SERIAL) last->count++;
    else if (add_step(x, STEP_SERIAL, i, 1) != 0) goto fail;
  }
  return x;
fail:
  plan__par_free(x);
  return NULL;
}

typedef struct walk {
  servd_plan *p;
  plan_par *x;
  _Atomic int failed;
  int rc;
  char msg[400];
} walk;

static int run_slice(servd_plan *p, const exec_step *s, int k) {
  const plan_node *n = &p->nodes[s->first];
  servd_tensor *const *v = s->views + k * PLAN_MAX_TENSORS;
  switch (n->op) {
  case SERVD_OP_matmul: return servd_op__matmul(v[0], v[1], v[2]);
  case SERVD_OP_matmul_many: {
    int rc = servd_op__matmul_many(n->ival[0], &v[1], v[0], (const servd_tensor *const *)&v[1 + n->ival[0]]);
    return rc < 0 || !s->swiglu ? rc : servd_op__swiglu(v[1], v[1], v[2]);
  }
  case SERVD_OP_attention: return servd_op__attention(v[0], v[1], n->obj, n->ival[0], &s->attn[k], n->ival[1], n->fval);
  case SERVD_OP_attention_window:
    return servd_op__attention_window(v[0], v[1], n->obj, n->ival[0], &s->attn[k], n->ival[1], n->fval, n->ival[2]);
  default: return servd_fail(SERVD_EINVAL, "plan: op %d has no slices", (int)n->op);
  }
}

static void walk_task(void *ctx, int64_t b, int64_t e, int thread) {
  (void)b;
  (void)e;
  (void)thread;
  walk *w = ctx;
  for (int i = 0; i < w->x->n; i++) {
    exec_step *s = &w->x->steps[i];
    int k;
    while ((k = atomic_fetch_add_explicit(&s->claim, 1, memory_order_acq_rel)) < s->n_slices) {
      int rc = 0;
      if (!atomic_load_explicit(&w->failed, memory_order_acquire)) {
        if (s->kind == STEP_SERIAL)
          for (int j = s->first; rc == 0 && j < s->first + s->count; j++) rc = plan__run_node(w->p, &w->p->nodes[j]);
        else rc = run_slice(w->p, s, k);
      }
      if (rc < 0) {
        int expect = 0;
        if (atomic_compare_exchange_strong(&w->failed, &expect, 1)) {
          w->rc = rc;
          snprintf(w->msg, sizeof w->msg, "%s", servd_last_error());
        }
      }
      atomic_fetch_add_explicit(&s->done, 1, memory_order_release);
    }
    /* slices other threads still run: spin briefly, then yield the core (a loaded machine may
     * have descheduled the thread the others wait for) */
    for (int spins = 0; atomic_load_explicit(&s->done, memory_order_acquire) < s->n_slices; spins++) {
      if (spins < 2000) cpu_relax();
      else sched_yield();
    }
  }
}

/* Each fused step against its parts, on the data its input holds now (the outputs are this step's
 * scratch, written before they are read): gate/up + SwiGLU slice by slice must give the bits of the
 * whole matmul_many then the whole swiglu. 0: all equal; 1: one differs (its name in what). */
static int check_fused(servd_plan *p, plan_par *x, const char **what) {
  for (int i = 0; i < x->n; i++) {
    exec_step *s = &x->steps[i];
    if (!s->swiglu) continue;
    const servd_tensor *g = p->nodes[s->first].t[1];
    size_t bytes = servd_tensor_nbytes(g);
    float *want = malloc(bytes ? bytes : 1);
    int rc = want ? 0 : servd_fail(SERVD_ENOMEM, "plan: fused check of %zu bytes", bytes);
    if (rc == 0) rc = plan__run_node(p, &p->nodes[s->first]);
    if (rc == 0) rc = plan__run_node(p, &p->nodes[s->first + 1]);
    if (rc == 0) memcpy(want, servd_tensor_data(g), bytes);
    for (int k = 0; rc == 0 && k < s->n_slices; k++) rc = run_slice(p, s, k);
    bool same = rc == 0 && memcmp(want, servd_tensor_data(g), bytes) == 0;
    free(want);
    if (rc < 0) return rc;
    if (!same) {
      *what = "gate/up matmul + SwiGLU";
      return 1;
    }
  }
  return 0;
}

static int par_run(servd_plan *p) {
  int threads = servd_threadpool_size();
  bool collective = false, decode = true;
  for (int i = 0; i < p->n && !collective; i++)
    collective = p->nodes[i].op == SERVD_OP_allreduce_sum || p->nodes[i].op == SERVD_OP_allgather_cols;
  for (int s = 0; s < p->attn.n_seqs && decode; s++) decode = p->attn.q_start[s] == s && p->attn.q_len[s] == 1;
  if (threads < 2 || collective || !decode) return plan__host_executor.run(p);
  if (!p->par) {
    if (!(p->par = build(p, threads, true))) return plan__host_executor.run(p);
    const char *what = NULL;
    int rc = check_fused(p, p->par, &what);
    if (rc < 0) return rc;
    if (rc > 0) {
      fprintf(stderr, "servd: step plan: the fused %s differs from its parts: the plan runs it unfused\n", what);
      plan__par_free(p->par);
      if (!(p->par = build(p, threads, false))) return plan__host_executor.run(p);
    }
  }
  plan_par *x = p->par;
  for (int i = 0; i < x->n; i++) {
    exec_step *s = &x->steps[i];
    atomic_store_explicit(&s->claim, 0, memory_order_relaxed);
    atomic_store_explicit(&s->done, 0, memory_order_relaxed);
    for (int k = 0; s->kind == STEP_SEQS && k < s->n_slices; k++) {
      int a = s->seq0[k];
      s->attn[k] = (servd_attn_batch){.n_seqs = s->seq0[k + 1] - a,
                                      .q_start = x->iota,
                                      .q_len = p->attn.q_len + a,
                                      .kv_len = p->attn.kv_len + a,
                                      .block_tables = p->attn.block_tables + a};
    }
  }
  walk w = {.p = p, .x = x};
  servd_parallel_for(x->threads, 1, walk_task, &w);
  if (atomic_load(&w.failed)) return servd_fail(w.rc, "plan replay: %s", w.msg);
  return 0;
}

const plan_executor plan__host_parallel_executor = {"host-parallel", par_run};
