/* gate/up + SwiGLU (servd/fused.h): the two matmuls share one quantized x and one pool job whose
 * items are 32-column tiles of both weights; the thread that computed a tile of gate and of up
 * applies SwiGLU to those columns while they are in its cache. The matmul kernels compute a column
 * alike whatever range they are given, and SwiGLU is elementwise with tiles on its vector width,
 * so this is matmul_many then swiglu bit for bit (tests/kernels/test_fused_gate_up.c). */
#include "matmul-impl.h"
#include "ops-impl.h"
#include "servd/fused.h"
#include "servd/threadpool.h"

enum { TILE = 32, MAX_ROWS = 128 }; /* more x rows (a prefill): the unfused ops, which block rows */

typedef void (*swiglu_row_fn)(float *out, const float *g, const float *u, int64_t n);

typedef struct gate_up_job {
  servd__mm g, u;
  servd__mm_fn fn;
  swiglu_row_fn swiglu;
} gate_up_job;

static void gate_up_task(void *ctx, int64_t b, int64_t e, int thread) {
  (void)thread;
  const gate_up_job *j = ctx;
  const int64_t j0 = b * TILE, j1 = e * TILE < j->g.n ? e * TILE : j->g.n;
  j->fn(&j->g, j0, j1);
  j->fn(&j->u, j0, j1);
  for (int64_t r = 0; r < j->g.m; r++) {
    float *g = (float *)(j->g.out + r * j->g.ldo) + j0;
    j->swiglu(g, g, (const float *)(j->u.out + r * j->u.ldo) + j0, j1 - j0);
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
  gate_up_job j;
  int rc;
  if ((rc = servd__mm_setup(&j.g, gate, x, wg)) || (rc = servd__mm_setup(&j.u, up, x, wu)))
    return servd_fail(rc, "gate_up_swiglu: %s", servd_last_error());
  if (gate == up || gate->storage == x->storage || up->storage == x->storage)
    return servd_fail(SERVD_EINVAL, "gate_up_swiglu: gate, up and x must be distinct buffers");
  if (j.g.n != j.u.n || j.g.wt != j.u.wt || j.g.m == 0 || j.g.n == 0 || j.g.k == 0 || j.g.m > MAX_ROWS)
    return unfused(gate, up, x, wg, wu); /* its own checks name what is wrong */
  if ((rc = servd__mm_prepare(&j.g, &j.fn))) return rc;
  j.u.xq = j.g.xq;
  j.u.xk = j.g.xk;
  j.u.xeo = j.g.xeo;
  j.u.ldxeo = j.g.ldxeo;
  j.swiglu = swiglu[ops__isa()];
  const int64_t tiles = (j.g.n + TILE - 1) / TILE, macs = 2 * j.g.m * j.g.k * TILE;
  servd_parallel_for(tiles, (1 << 16) / macs + 1, gate_up_task, &j);
  return 0;
}
