/* Attention decode speed as a fraction of the memory read rate measured in the same run.
 *
 * A decode step of a batch of sequences reads every cached K and V row of every sequence once per
 * layer: the bytes are fixed, so the kernel is bandwidth bound when it reads them about as fast as a
 * plain streaming read does. Both sides use the same thread pool and cycle through enough layers that
 * nothing is served from the last-level cache between repetitions. Prints medians: the attention's
 * rate in GB/s of K+V read, the streaming read rate, the paged read rate (below), and the attention's
 * fraction of each. Every repetition times the anchors and the attention call back to back, and the
 * fractions printed are medians of these per-repetition ratios, so that load from other processes
 * (which changes the rates from one repetition to the next on a shared machine) mostly cancels.
 *
 * usage: bench_attention [threads (default 2)] [reps (default 21)] [only this config index, -1: all]
 *                        [block size (default 16)] [tables: 1 scrambled (default), 0 in order]
 *                        [only this isa: 0 scalar, 1 avx2, 2 avx512, -1: all (default)]
 *                        [kv_len (default 512)] [sequences (default 16)] [MiB cycled through (default 512)]
 *                        [paged anchor: prefetch 0 none, 1 as the kernel (default), 2 whole next block;
 *                         3 as the kernel's, all kv heads of a block adjacent (a layout study)] */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../src/ops-impl.h" /* the cache layout, for the anchors over its pages */
#include "servd/bench-util.h"
#include "servd/ops.h"
#include "servd/threadpool.h"

#define FOOTPRINT (512u << 20) /* bytes cycled through per side by default: well above any L3 */

/* ---- the anchor: a plain streaming read (bench_stream_task in bench-util.h) -------------------- */

/* ---- two more anchors over the cache's own pages --------------------------------------------------
 * pool: the layer's K/V bytes read sequentially in their physical order (the same pages, huge or not,
 *   as attention reads), i.e. the best case for this memory.
 * paged: the same bytes in the order attention walks them (per sequence and kv head: the K and V runs
 *   of each block in table order), with the kernel's prefetch (the same offsets ops__attn_pf_blocks
 *   blocks ahead, a line per line read) and no arithmetic. attention / paged is the cost of the
 *   arithmetic, paged / pool that of the access pattern. Other prefetch schemes can be chosen to
 *   compare them (the previous kernel's: the whole next block before reading one), and a layout
 *   study: the same bytes as if all kv heads of a block were adjacent ([block][kv head][K|V]), read
 *   one sequence per item, a block's runs as one contiguous range. */
enum { PF_NONE, PF_ROLLING, PF_BURST, PF_BLOCK_MAJOR };
typedef struct paged_job {
  const servd_kv_cache *c;
  int layer, pf_blocks, blocks_per_seq, scheme;
  const int32_t *const *tables;
  uint64_t sums[64];
} paged_job;

/* The layout study: item = one sequence; each block is n_kv_heads K and V runs in one range of the
 * layer's pool, prefetched about as far ahead as the kernel prefetches (2 * OPS__ATTN_PF_BYTES). */
static void block_major_task(void *ctx, int64_t begin, int64_t end, int thread) {
  paged_job *j = ctx;
  const servd_kv_cache *c = j->c;
  size_t blk = (size_t)c->n_kv_heads * 2 * c->head_bytes, ahead = 2 * OPS__ATTN_PF_BYTES;
  const char *layer = ops__kv_run(c, j->layer, 0, 0, 0);
  uint64_t a = 0, b = 0;
  for (int64_t s = begin; s < end; s++)
    for (int i = 0; i < j->blocks_per_seq; i++) {
      const uint64_t *p = (const uint64_t *)(layer + (size_t)j->tables[s][i] * blk);
      for (size_t o = 0; o < blk; o += 64) {
        size_t f = o + ahead; /* in this block, or the next one of the table */
        if (f < blk) __builtin_prefetch((const char *)p + f);
        else if (i + 1 < j->blocks_per_seq) __builtin_prefetch(layer + (size_t)j->tables[s][i + 1] * blk + (f - blk));
        a ^= p[o / 8];
        b ^= p[o / 8 + 4];
      }
    }
  j->sums[thread & 63] ^= a ^ b;
}

static void paged_task(void *ctx, int64_t begin, int64_t end, int thread) {
  paged_job *j = ctx;
  const servd_kv_cache *c = j->c;
  int nb = j->blocks_per_seq;
  size_t run = c->head_bytes;
  uint64_t a = 0, b = 0;
  for (int64_t it = begin; it < end; it++) { /* item = (sequence, kv head), as attention splits it */
    int s = (int)(it / c->n_kv_heads), g = (int)(it % c->n_kv_heads);
    for (int i = 0; i < nb; i++)
      for (int kv = 0; kv < 2; kv++) {
        const uint64_t *p = (const uint64_t *)ops__kv_run(c, j->layer, kv, j->tables[s][i], g);
        int far = i + (j->scheme == PF_BURST ? 1 : j->pf_blocks);
        const char *pf = j->scheme != PF_NONE && far < nb ? ops__kv_run(c, j->layer, kv, j->tables[s][far], g) : NULL;
        if (j->scheme == PF_BURST && pf) {
          for (size_t o = 0; o < run; o += 64) __builtin_prefetch(pf + o);
          pf = NULL;
        }
        for (size_t w = 0; w < run / 8; w += 8) {
          if (pf) __builtin_prefetch(pf + w * 8);
          a ^= p[w];
          b ^= p[w + 4];
        }
      }
  }
  j->sums[thread & 63] ^= a ^ b;
}

typedef struct config {
  const char *name;
  int n_heads, n_kv, hd;
  servd_dtype dt;
} config;

int main(int argc, char **argv) {
  int threads = argc > 1 ? atoi(argv[1]) : 2, reps = argc > 2 ? atoi(argv[2]) : 21;
  int only = argc > 3 ? atoi(argv[3]) : -1, scrambled = argc > 5 ? atoi(argv[5]) : 1;
  int only_isa = argc > 6 ? atoi(argv[6]) : -1;
  /* a small cache with no cycling ("256 1 0": one sequence of 256 tokens, 0 MiB) stays in L2 and
   * measures the arithmetic alone */
  int kv_len = argc > 7 ? atoi(argv[7]) : 512, n_seqs = argc > 8 ? atoi(argv[8]) : 16;
  double footprint = argc > 9 ? atof(argv[9]) * (1 << 20) : FOOTPRINT;
  int scheme = argc > 10 ? atoi(argv[10]) : PF_ROLLING;
  if (reps < 1) reps = 1;
  const int bs = argc > 4 ? atoi(argv[4]) : 16;
  if (bs < 1 || kv_len < bs || kv_len % bs != 0 || n_seqs < 1 || n_seqs > 16) {
    fprintf(stderr, "block size must divide kv_len %d, and 1 <= n_seqs (%d) <= 16\n", kv_len, n_seqs);
    return 1;
  }
  if (servd_threadpool_init(threads) != 0) {
    fprintf(stderr, "threadpool_init: %s\n", servd_last_error());
    return 1;
  }
  const config cfgs[] = {
      {"32/8/128 (Llama-3-8B-like)", 32, 8, 128, SERVD_F32}, {"32/8/128 (Llama-3-8B-like)", 32, 8, 128, SERVD_F16},
      {"9/3/64 (SmolLM2-135M)", 9, 3, 64, SERVD_F32},        {"9/3/64 (SmolLM2-135M)", 9, 3, 64, SERVD_F16},
      {"9/3/64 (SmolLM2-135M)", 9, 3, 64, SERVD_BF16},       {"9/3/64 (SmolLM2-135M)", 9, 3, 64, SERVD_Q8_0},
      {"9/3/64 (SmolLM2-135M)", 9, 3, 64, SERVD_Q4_0},       {"32/8/128 (Llama-3-8B-like)", 32, 8, 128, SERVD_Q8_0},
  };
  printf("attention decode: %d sequences x %d cached tokens, block %d, tables %s, %d threads, median of %d\n", n_seqs,
         kv_len, bs, scrambled ? "scrambled" : "in order", servd_threadpool_size(), reps);
  printf("%-28s %-4s %-7s %8s %8s %8s %8s %8s %8s %8s %8s\n", "heads/kv/dim", "kv", "isa", "ms", "GB/s", "stream",
         "pool", "paged", "/stream", "/pool", "/paged");
  for (size_t ci = 0; ci < sizeof cfgs / sizeof cfgs[0]; ci++) {
    const config *cf = &cfgs[ci];
    if (only >= 0 && (size_t)only != ci) continue;
    /* K and V read per call, in the dtype's layout (a quantized block keeps its scales beside its codes) */
    double kv_bytes = (double)servd_kv_cache_block_bytes(1, cf->n_kv, cf->hd, bs, cf->dt) * n_seqs * (kv_len / bs);
    int layers = (int)ceil(footprint / kv_bytes);
    if (layers < 1) layers = 1;
    int blocks_per_seq = kv_len / bs, n_blocks = n_seqs * blocks_per_seq;
    servd_kv_cache *c = NULL;
    if (servd_kv_cache_create(&c, layers, cf->n_kv, cf->hd, bs, n_blocks, cf->dt) != 0) {
      fprintf(stderr, "%s\n", servd_last_error());
      return 1;
    }
    int32_t *ids = malloc((size_t)n_blocks * sizeof *ids);
    servd_kv_cache_alloc(c, n_blocks, ids);
    srand(7);
    for (int i = n_blocks - 1; scrambled && i > 0; i--) { /* scrambled tables, as after a while of serving */
      int j = rand() % (i + 1), x = ids[i];
      ids[i] = ids[j];
      ids[j] = x;
    }
    int32_t q_start[16], q_len[16], kvl[16];
    const int32_t *tables[16];
    for (int s = 0; s < n_seqs; s++) {
      q_start[s] = s;
      q_len[s] = 1;
      kvl[s] = kv_len;
      tables[s] = ids + s * blocks_per_seq;
    }
    /* fill every layer's K/V */
    int64_t w = (int64_t)cf->n_kv * cf->hd, tok = (int64_t)n_seqs * kv_len;
    int64_t sh[2] = {tok, w}, one = tok;
    servd_tensor *k = servd_tensor_new(SERVD_F32, 2, sh), *v = servd_tensor_new(SERVD_F32, 2, sh);
    servd_tensor *slots = servd_tensor_new(SERVD_I32, 1, &one);
    float *kd = servd_tensor_data(k), *vd = servd_tensor_data(v);
    for (int64_t i = 0; i < tok * w; i++) {
      kd[i] = (float)((i * 7919) % 1000) * 1e-3f - 0.5f;
      vd[i] = (float)((i * 104729) % 1000) * 1e-3f - 0.5f;
    }
    int32_t *sl = servd_tensor_data(slots);
    for (int s = 0; s < n_seqs; s++)
      for (int p = 0; p < kv_len; p++) sl[s * kv_len + p] = tables[s][p / bs] * bs + p % bs;
    for (int l = 0; l < layers; l++) servd_kv_write(c, l, k, v, slots);
    int64_t qsh[2] = {n_seqs, (int64_t)cf->n_heads * cf->hd};
    servd_tensor *q = servd_tensor_new(SERVD_F32, 2, qsh), *out = servd_tensor_new(SERVD_F32, 2, qsh);
    for (int64_t i = 0; i < qsh[0] * qsh[1]; i++) ((float *)servd_tensor_data(q))[i] = (float)(i % 13) * 0.05f;
    servd_attn_batch b = {n_seqs, q_start, q_len, kvl, tables};
    float scale = 1.0f / sqrtf((float)cf->hd);

    /* the anchor buffer: the same bytes per repetition, cycled the same way */
    size_t chunk_bytes = BENCH_STREAM_CHUNK * 8, per_call = ((size_t)kv_bytes + chunk_bytes - 1) / chunk_bytes;
    size_t total = per_call * chunk_bytes * (size_t)layers;
    uint64_t *buf = aligned_alloc(64, total);
    memset(buf, 1, total);
    /* a layer's runs are exactly the bytes one call reads (every block is in some table) */
    size_t pool_chunks = (size_t)kv_bytes / chunk_bytes;
    double *r_stream = malloc((size_t)reps * sizeof(double)), *r_pool = malloc((size_t)reps * sizeof(double));
    double *r_paged = malloc((size_t)reps * sizeof(double)), *t_attn = malloc((size_t)reps * sizeof(double));
    double *g_stream = malloc((size_t)reps * sizeof(double)), *g_pool = malloc((size_t)reps * sizeof(double));
    double *g_paged = malloc((size_t)reps * sizeof(double));

    /* one untimed pass over every layer and the whole read buffer: first touches are not steady state */
    for (int l = 0; l < layers; l++) servd_attention(out, q, c, l, &b, cf->n_heads, scale);
    {
      bench_stream_job sj = {.p = buf};
      servd_parallel_for((int64_t)(per_call * (size_t)layers), 1, bench_stream_task, &sj);
    }
    for (int isa = SERVD_ISA_COUNT - 1; isa >= 0; isa--) {
      if ((only_isa >= 0 && isa != only_isa) || servd_cpu_force_isa((servd_isa)isa) != 0) continue;
      bench_stream_job sj = {0};
      for (int r = -2; r < reps; r++) { /* interleaved, so all sides see the same machine */
        int l = (r + 2) % layers, la = (l + 1) % layers, lp = (l + 2) % layers, lq = (l + 3) % layers;
        sj.p = (const uint64_t *)((const char *)buf + (size_t)l * per_call * chunk_bytes);
        double t0 = bench_now_s();
        servd_parallel_for((int64_t)per_call, 1, bench_stream_task, &sj);
        double t1 = bench_now_s();
        if (servd_attention(out, q, c, la, &b, cf->n_heads, scale) != 0) {
          fprintf(stderr, "%s\n", servd_last_error());
          return 1;
        }
        double t2 = bench_now_s();
        bench_stream_job pj0 = {.p = (const uint64_t *)ops__kv_run(c, lp, 0, 0, 0)};
        if (pool_chunks > 0) servd_parallel_for((int64_t)pool_chunks, 1, bench_stream_task, &pj0);
        double t3 = bench_now_s();
        paged_job pj = {.c = c,
                        .layer = lq,
                        .pf_blocks = ops__attn_pf_blocks(c),
                        .blocks_per_seq = blocks_per_seq,
                        .scheme = scheme,
                        .tables = tables};
        if (scheme == PF_BLOCK_MAJOR) servd_parallel_for(n_seqs, 1, block_major_task, &pj);
        else servd_parallel_for((int64_t)n_seqs * cf->n_kv, 1, paged_task, &pj);
        double t4 = bench_now_s();
        if (r >= 0) {
          double ts = (t1 - t0) * (double)kv_bytes / (double)(per_call * chunk_bytes);
          double tpool = pool_chunks ? (t3 - t2) * (double)kv_bytes / (double)(pool_chunks * chunk_bytes) : NAN;
          t_attn[r] = t2 - t1;
          r_stream[r] = ts / t_attn[r];
          r_pool[r] = tpool / t_attn[r];
          r_paged[r] = (t4 - t3) / t_attn[r];
          g_stream[r] = kv_bytes / ts * 1e-9;
          g_pool[r] = kv_bytes / tpool * 1e-9;
          g_paged[r] = kv_bytes / (t4 - t3) * 1e-9;
        }
      }
      double ta = bench_median(t_attn, reps);
      printf("%-28s %-4s %-7s %8.3f %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f\n", cf->name, servd_dtype_name(cf->dt),
             servd_isa_name((servd_isa)isa), ta * 1e3, kv_bytes / ta * 1e-9, bench_median(g_stream, reps),
             bench_median(g_pool, reps), bench_median(g_paged, reps), bench_median(r_stream, reps),
             bench_median(r_pool, reps), bench_median(r_paged, reps));
      fflush(stdout);
    }
    servd_cpu_force_isa(SERVD_ISA_COUNT);
    free(r_stream);
    free(r_pool);
    free(r_paged);
    free(t_attn);
    free(g_stream);
    free(g_pool);
    free(g_paged);
    free(buf);
    free(ids);
    servd_tensor_release(k);
    servd_tensor_release(v);
    servd_tensor_release(slots);
    servd_tensor_release(q);
    servd_tensor_release(out);
    servd_kv_cache_destroy(c);
  }
  return 0;
}
