/* Why: the CUDA driver (580, H200) crashed loading kernel modules once interpreter namespaces
 * (dlmopen) existed in the process: cuBLAS loads its kernels lazily at a shape's first GEMM, which
 * in a step is inside an interpreter's call. So servd creates each GPU's context at startup (with
 * CUDA_MODULE_LOADING=EAGER: a module loads whole) and here runs, still before any namespace,
 * one GEMM of every weight shape of the model for every row count a step can have (every 8th past
 * 256), so that every cuBLAS kernel library a step can pick is loaded (about a second on an H200).
 * Then it gives the scratch memory back. It also chooses, by measuring, the GEMV kernel of each
 * weight shape for decode steps (gemv_tune.cu), and turns on the fused kernels that pass their check. */
#include "engine/gpu_prewarm.h"
#include "engine/model_geometry.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "mpk/package.h"
#include "servd/clock.h"
#include "servd/device.h"

/* out (m, n) = x (m, k) @ w (n, k)^T for every m in rows, with bf16 and f32 outputs. */
static int gemms(int device, int n, int k, const int *rows, int n_rows) {
  int rc = 0;
  int m_max = rows[n_rows - 1];
  servd_tensor *w = NULL, *x = NULL, *ob = NULL, *of = NULL;
  if ((rc = servd_device_tensor_new(device, SERVD_BF16, 2, (int64_t[]){n, k}, &w)) ||
      (rc = servd_device_tensor_new(device, SERVD_BF16, 2, (int64_t[]){m_max, k}, &x)) ||
      (rc = servd_device_tensor_new(device, SERVD_BF16, 2, (int64_t[]){m_max, n}, &ob)) ||
      (rc = servd_device_tensor_new(device, SERVD_F32, 2, (int64_t[]){m_max, n}, &of)))
    goto out;
  for (int i = 0; i < n_rows && !rc; i++) {
    servd_tensor *xv = servd_tensor_narrow(x, 0, 0, rows[i]);
    servd_tensor *bv = servd_tensor_narrow(ob, 0, 0, rows[i]);
    servd_tensor *fv = servd_tensor_narrow(of, 0, 0, rows[i]);
    if (!xv || !bv || !fv) rc = SERVD_ENOMEM;
    else if (!(rc = servd_device_matmul(bv, xv, w))) rc = servd_device_matmul(fv, xv, w);
    servd_tensor_release(xv);
    servd_tensor_release(bv);
    servd_tensor_release(fv);
  }
  if (!rc) rc = servd_device_sync(device);
out:
  servd_tensor_release(w);
  servd_tensor_release(x);
  servd_tensor_release(ob);
  servd_tensor_release(of);
  return rc;
}

int servd_gpu_prewarm(const servd_model_options *o) {
  if (o->gpus <= 0 || !o->path) return 0;
  mpk_package *pkg = NULL;
  int rc = mpk_open(o->path, &pkg);
  if (rc) return 0; /* the load reports it */
  servd_model_geometry g;
  servd_model_geometry_read(mpk_config(pkg), &g);
  int dim = g.dim, heads = g.n_heads, kv = g.n_kv_heads, hd = g.head_dim, ff = g.ffn_dim, vocab = g.vocab;
  int tp = o->tp > 0 ? o->tp : 1;
  if (dim <= 0 || heads <= 0 || kv <= 0 || hd <= 0 || ff <= 0 || heads % tp || kv % tp || ff % tp) {
    mpk_close(pkg);
    return 0;
  }
  if (vocab <= 0) vocab = 32000;
  int max_tokens = o->max_batch_tokens > 9 ? o->max_batch_tokens : 512;
  int max_seqs = o->max_seqs > 9 ? o->max_seqs : 9;
  /* cuBLAS serves m > 8 (a GEMV kernel the rest) and picks kernels, from kernel libraries it loads
   * on first use, by m: every m up to 256, every 8th beyond, and the budget itself. */
  int cap = 256 + (max_tokens > 256 ? (max_tokens - 256) / 8 + 2 : 1);
  int *rows = malloc(sizeof *rows * (size_t)cap), *logit_rows = malloc(sizeof *rows * (size_t)cap);
  if (!rows || !logit_rows) {
    free(rows);
    free(logit_rows);
    mpk_close(pkg);
    return SERVD_ENOMEM;
  }
  int n_rows = 0, n_logit = 0;
  for (int m = 9; m < max_tokens; m += m < 256 ? 1 : 8) rows[n_rows++] = m;
  rows[n_rows++] = max_tokens;
  for (int i = 0; i < n_rows && rows[i] <= max_seqs; i++) logit_rows[n_logit++] = rows[i];
  if (n_logit == 0) logit_rows[n_logit++] = 9;
  const int q = heads / tp * hd, kvc = kv / tp * hd, f = ff / tp, v = (vocab + tp - 1) / tp;
  const int shapes[][2] = {{q, dim}, {kvc, dim}, {dim, q}, {f, dim}, {dim, f}};
  const int64_t t0 = servd_now_ns();
  for (int r = 0; r < tp && !rc; r++) {
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes && !rc; s++)
      rc = gemms(r, shapes[s][0], shapes[s][1], rows, n_rows);
    if (!rc) rc = gemms(r, v, dim, logit_rows, n_logit);
  }
  /* Decode steps (up to 8 rows) run a GEMV kernel: pick, on each GPU, the fastest of its variants
   * for each weight shape, measured here (tens of milliseconds); Q/K/V and gate/up, which run as one
   * launch over their weights, by their rows together. */
  const int tuned[][2] = {{q, dim}, {kvc, dim}, {dim, q},           {f, dim},
                          {dim, f}, {v, dim},   {q + 2 * kvc, dim}, {2 * f, dim}};
  for (int r = 0; r < tp && !rc; r++)
    for (size_t s = 0; s < sizeof tuned / sizeof *tuned; s++) {
      bool seen = false; /* a shape twice (q and o when square) is measured once */
      for (size_t p = 0; p < s; p++) seen |= tuned[p][0] == tuned[s][0] && tuned[p][1] == tuned[s][1];
      char report[512];
      if (seen) continue;
      if (servd_device_matmul_tune(r, tuned[s][0], tuned[s][1], report, sizeof report) == 0)
        fprintf(stderr, "servd: cuda:%d GEMV %s\n", r, report);
      else /* the shape keeps the warp-per-column kernel */
        fprintf(stderr, "servd: warning: cuda:%d GEMV choice for %d x %d: %s\n", r, tuned[s][0], tuned[s][1],
                servd_last_error());
    }
  /* The fused kernels (residual add + norm; several matmuls in one launch) run once they agree with
   * their parts on this GPU; otherwise the parts run. */
  for (int r = 0; r < tp && !rc; r++) {
    char report[256];
    if (servd_device_fused_check(r, report, sizeof report) == 0)
      fprintf(stderr, "servd: cuda:%d fused kernels %s\n", r, report);
    else fprintf(stderr, "servd: warning: cuda:%d fused kernels off: %s\n", r, servd_last_error());
  }
  free(rows);
  free(logit_rows);
  mpk_close(pkg);
  servd_device_weights_trim(); /* gives the allocator's idle blocks back */
  const int64_t t1 = servd_now_ns();
  if (rc) fprintf(stderr, "servd: warning: cuBLAS warm-up of %s: %s\n", o->path, servd_last_error());
  else
    fprintf(stderr, "servd: cuBLAS warm-up of %s: %d row counts x 6 weight shapes on %d GPU%s in %.2f s\n", o->path,
            n_rows, tp, tp == 1 ? "" : "s", (double)(t1 - t0) / 1e9);
  return rc;
}

int servd_gpu_start_contexts(int gpus) {
  for (int d = 0; d < gpus; d++) {
    int rc = servd_device_sync(d);
    if (rc) return servd_fail(rc, "cuda:%d: cannot start CUDA: %s", d, servd_last_error());
  }
  return 0;
}
