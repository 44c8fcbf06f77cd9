/* gate/up + SwiGLU (servd/fused.h): the two matmuls share one quantized x and one pool job whose
 * items are matmul_many's (32-column tiles of gate, then of up, so the weights stream in the same
 * order); the thread that completes the second half of a column tile applies SwiGLU to it at once,
 * while the tile is still in cache, instead of a second pass (and pool hand-off) over both outputs.
 * The matmul kernels compute a column alike whatever range they are given, and SwiGLU is
 * elementwise, so this is matmul_many then swiglu bit for bit (tests/kernels/test_fused_gate_up.c). */
#include <stdatomic.h>
#include <stdlib.h>

#include "matmul-impl.h"
#include "ops-impl.h"
#include "servd/fused.h"
#include "servd/threadpool.h"

enum { TILE = 32, MAX_ROWS = 128, MAX_TILES = 4096 }; /* beyond: the unfused ops */

typedef void (*swiglu_row_fn)(float *out, const float *g, const float *u, int64_t n);

typedef struct gate_up_job {
  servd__mm g, u;
  servd__mm_fn fn;
  swiglu_row_fn swiglu;
  int64_t tiles;
  atomic_uchar *halves; /* [tiles]: how many of the tile's gate and up columns are done */
} gate_up_job;

static void swiglu_tile(const gate_up_job *j, int64_t t) {
  const int64_t j0 = t * TILE, n = (t + 1) * TILE < j->g.n ? TILE : j->g.n - j0;
  for (int64_t r = 0; r < j->g.m; r++) {
    float *g = (float *)(j->g.out + r * j->g.ldo) + j0;
    j->swiglu(g, g, (const float *)(j->u.out + r * j->u.ldo) + j0, n);
  }
}

/* Items [b, e): tiles of gate (items < tiles), then of up. */
static void gate_up_task(void *ctx, int64_t b, int64_t e, int thread) {
  (void)thread;
  const gate_up_job *j = ctx;
  for (int64_t it = b; it < e;) {
    const bool up = it >= j->tiles;
    const int64_t t0 = up ? it - j->tiles : it, end = up || e <= j->tiles ? e : j->tiles;
    const int64_t t1 = up ? end - j->tiles : end;
    servd__mm_run(j->fn, up ? &j->u : &j->g, t0 * TILE, t1 * TILE < j->g.n ? t1 * TILE : j->g.n);
    /* the thread that finishes a tile's second half applies SwiGLU (acq_rel: it sees the first) */
    for (int64_t t = t0; t < t1; t++)
      if (atomic_fetch_add_explicit(&j->halves[t], 1, memory_order_acq_rel) == 1) swiglu_tile(j, t);
    it = end;
  }
}

static int unfused(servd_tensor *gate, servd_tensor *up, const servd_tensor *x, const servd_tensor *wg,
                   const servd_tensor *wu) {
  servd_tensor *outs[2] = {gate, up};
  const servd_tensor *ws[2] = {wg, wu};
  int rc = servd_matmul_many(2, outs, x, ws);
  return rc ? rc : servd_swiglu(gate, gate, up);
}

int servd_gate_up_swiglu(servd_tensor *gate, servd_tensor *up, const servd_tensor *x, const servd_tensor *wg,
                         const servd_tensor *wu) {
  static const swiglu_row_fn swiglu[SERVD_ISA_COUNT] = {servd__swiglu_scalar, servd__swiglu_avx2, servd__swiglu_avx512};
  static _Thread_local atomic_uchar halves[MAX_TILES];
  gate_up_job j;
  int rc;
  if ((rc = servd__mm_setup(&j.g, gate, x, wg)) || (rc = servd__mm_setup(&j.u, up, x, wu)))
    return servd_fail(rc, "gate_up_swiglu: %s", servd_last_error());
  if (gate == up || gate->storage == x->storage || up->storage == x->storage)
    return servd_fail(SERVD_EINVAL, "gate_up_swiglu: gate, up and x must be distinct buffers");
  j.tiles = (j.g.n + TILE - 1) / TILE;
  if (j.g.n != j.u.n || j.g.wt != j.u.wt || j.g.m == 0 || j.g.n == 0 || j.g.k == 0 || j.g.m > MAX_ROWS ||
      j.tiles > MAX_TILES)
    return unfused(gate, up, x, wg, wu); /* its own checks name what is wrong */
  if ((rc = servd__mm_prepare(&j.g, &j.fn))) return rc;
  servd__mm_share_x(&j.u, &j.g);
  j.swiglu = swiglu[ops__isa()];
  j.halves = halves; /* the caller's: a nested call runs inline on this thread, after this job */
  for (int64_t t = 0; t < j.tiles; t++) atomic_store_explicit(&halves[t], 0, memory_order_relaxed);
  /* matmul_many's grain: items of one weight's tile, about 64k multiply-adds per chunk */
  servd_parallel_for(2 * j.tiles, (1 << 16) / (j.g.m * j.g.k * TILE) + 1, gate_up_task, &j);
  return 0;
}
