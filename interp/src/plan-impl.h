/* Step plans inside servd_interp: the node list, the recorder the host table's ops append to, and
 * the executor that walks a plan (servd/plan.h). Private to interp/src. */
#ifndef SERVD_INTERP_PLAN_IMPL_H
#define SERVD_INTERP_PLAN_IMPL_H

#include <stdbool.h>

#include "servd/device.h"
#include "servd/ops.h"
#include "servd/plan.h"

/* matmul_many: x, its outputs, its weights */
#define PLAN_MAX_TENSORS (1 + 2 * SERVD_MATMUL_MANY_MAX)

/* The step inputs bound by role: the plan owns a host tensor of each at a fixed address. */
enum { PLAN_IN_TOKENS, PLAN_IN_POSITIONS, PLAN_IN_SLOTS, PLAN_IN_LOGIT_ROWS, PLAN_IN_COUNT };

/* One op call as recorded: its tensors (one reference each, held by the plan) and scalars. */
typedef struct plan_node {
  servd_op_id op;
  int nt;
  servd_tensor *t[PLAN_MAX_TENSORS];
  float fval;   /* eps, scale */
  int64_t lval; /* row_offset */
  int ival[3];  /* topk k; layer, n_heads, window; rank; matmul_many count */
  void *obj;    /* the KV cache or the communicator */
  servd_rope_params rope;
} plan_node;

/* Executors: one per backend. The host one walks the nodes on the calling thread, each op splitting
 * its work over the compute pool; a CUDA executor would enqueue the same nodes to the thread that
 * owns its rank's context (docs/architecture.md, "Step plans"). */
typedef struct plan_executor {
  const char *name;
  int (*run)(servd_plan *p);
} plan_executor;
extern const plan_executor plan__host_executor;
/* The step as one pool job, threads meeting at step boundaries (plan_exec.c); the serial walk where
 * it cannot (one thread, collectives, a layout other than a decode's). Chosen by
 * SERVD_PLAN_EXEC=parallel at capture until it measures faster than the serial walk
 * (docs/performance.md, "Step plans"). */
extern const plan_executor plan__host_parallel_executor;
typedef struct plan_par plan_par;
void plan__par_free(plan_par *x); /* accepts NULL */
/* Whether the parallel executor fuses nodes i (gate/up matmul_many) and i + 1 (their SwiGLU). */
bool plan__fuses_swiglu(const servd_plan *p, int i);

/* Fusions of the serial walk (plan_fuse.c): a group of nodes run as one pool job. */
enum { PLAN_FUSE_NONE, PLAN_FUSE_ROPE_KV, PLAN_FUSE_GATE_UP_SWIGLU, PLAN_FUSE_KINDS };
extern const char *const plan__fuse_names[PLAN_FUSE_KINDS];
extern const int plan__fuse_len[PLAN_FUSE_KINDS]; /* nodes per group */
typedef struct plan_fusion plan_fusion;
void plan__fusion_free(plan_fusion *f); /* accepts NULL */
/* Makes p's fused groups (at capture, unless SERVD_PLAN_FUSE=off); the serial walk's first replay
 * checks each against its nodes. */
void plan__fuse(servd_plan *p);
/* The tensor views the fused groups hold (into out when not NULL); their count. */
int plan__fusion_views(const servd_plan *p, const servd_tensor **out);
/* Counts the fused groups' views per guarded storage (servd_plan_check counts them as the plan's
 * own references); after every change of p->fusion. */
void plan__guard_views(servd_plan *p);
/* The serial walk, with the fused groups. */
int plan__serial_run(servd_plan *p);
/* The kind of the fused group starting at node i (PLAN_FUSE_NONE: none). */
int plan__fused_at(const servd_plan *p, int i);
const char *plan__op_name(servd_op_id op);

struct servd_plan {
  plan_node *nodes;
  int n, cap;
  servd_tensor *in[PLAN_IN_COUNT]; /* owned, i32 */
  int n_tokens, n_logit_rows, n_seqs;
  servd_kv_cache *kv;
  servd_attn_batch attn; /* the running step's layout: set by each replay */
  servd_tensor *logits;  /* what the forward returned (one reference), or NULL */
  const plan_executor *exec;
  plan_par *par;       /* the parallel executor's slices, made at its first replay */
  plan_fusion *fusion; /* the serial walk's fused groups, made at capture, checked at its first replay */
  bool fusion_tried;
  const char *fuse_env; /* SERVD_PLAN_FUSE at capture: NULL or "on" (all kinds), "off", or kinds by name */
  /* SERVD_PLAN_PROFILE=1 at capture: ns per op id, then per fused kind; printed at destroy */
  int64_t *prof_ns;
  int64_t prof_steps;
  /* Guard: the owned tensors the nodes use, each with the references the plan holds on it, and
   * their storages, each with the number of those tensors over it. */
  struct plan_held {
    const servd_tensor *t;
    int mine;
  } * held;
  struct plan_held_storage {
    const servd_storage *s;
    int mine;
    int views; /* the fused groups' views over it (they hold it too) */
  } * held_s;
  int n_held, n_held_s;
};

/* The recording of the calling thread's forward, or NULL (host TLS: each rank records its own). */
typedef struct plan_recorder {
  servd_plan *p;
  const servd_forward_batch *b; /* the step being recorded */
  bool refused;
  char why[256];
} plan_recorder;
extern _Thread_local plan_recorder *plan__rec;

/* A new node of op at the end of r's plan, or NULL (refused or out of memory: r->why says). */
plan_node *plan__rec_node(plan_recorder *r, servd_op_id op);
void plan__rec_tensor(plan_recorder *r, plan_node *n, const servd_tensor *t);
/* Stops the recording: the forward runs on, the plan is dropped, why is logged by the caller. */
void plan__rec_refuse(plan_recorder *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Runs one node as recorded (the serial walk's step). */
int plan__run_node(servd_plan *p, const plan_node *n);

/* The host table's ops: servd_op__<name> (op_dispatch.h), recording when plan__rec is set. */
#define SERVD_OP(name, dispatch, py, sig, names) int servd_plan__##name(SERVD__PARAMS(sig, names));
#include "servd/ops.def"
#undef SERVD_OP

#endif
