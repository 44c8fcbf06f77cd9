/* bench_interp: one_python vs multi_python vs plain C, on the example packages.
 *
 *   one_python    one interpreter, N caller threads (its GIL is shared by all of them)
 *   multi_python  N interpreters, one caller thread each (one GIL each)
 *   plain_c       N threads calling the same kernels from C, no Python
 *
 * Models: pure_python (a Python loop of ~2000 iterations, no kernels: the interpreters alone),
 * deep_tiny (Python-heavy: 16 layers x 6 ops on (1, 32) rows) and mlp_classifier (the example
 * generic package). Each item is one predict call with a batch of one row. Every
 * configuration runs `--reps` times for `--seconds`; the table shows the median run. The kernels'
 * compute pool is sized by --pool-threads (default 0: the online CPUs, as servd sizes it; the pool
 * never runs more compute threads than that, so concurrent callers share those slots).
 *
 *   bench_interp [--seconds S] [--reps R] [--pool-threads K] [--threads 1,2,4] [--models a,b] [--markdown]
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "servd/bench-util.h"
#include "interp-impl.h"
#include "mpk/package.h"
#include "servd/interp.h"
#include "servd/ops.h"
#include "servd/threadpool.h"

#ifndef EXAMPLES_BUILD_DIR
#define EXAMPLES_BUILD_DIR "models"
#endif

enum { MODE_C, MODE_ONE, MODE_MULTI, MODE_COUNT };
static const char *mode_names[MODE_COUNT] = {"plain_c", "one_python", "multi_python"};

static size_t rss_bytes(void) {
  FILE *f = fopen("/proc/self/statm", "r");
  unsigned long size = 0, res = 0;
  if (f) {
    if (fscanf(f, "%lu %lu", &size, &res) != 2) res = 0;
    fclose(f);
  }
  return (size_t)res * (size_t)sysconf(_SC_PAGESIZE);
}

static void die(const char *what) {
  fprintf(stderr, "bench_interp: %s: %s\n", what, servd_last_error());
  exit(1);
}

/* ---- plain C versions of the two models, scratch preallocated per thread ---- */

typedef struct model {
  const char *name;
  int pure; /* pure_python: no package, no kernels; an item is one call of a Python loop */
  mpk_package *pkg;
  int d_in;
  /* deep_tiny */
  int n_layers, d, f;
  servd_tensor *norm[64], *gate[64], *up[64], *down[64];
  /* mlp_classifier */
  int hidden, n_classes;
  servd_tensor *m_norm, *m_gate, *m_up, *m_out;
} model;

typedef struct c_scratch {
  servd_tensor *x, *h, *g, *u, *y, *r, *probs, *label;
} c_scratch;

static servd_tensor *ten(int64_t a, int64_t b, servd_dtype dt) {
  int64_t shape[2] = {a, b};
  servd_tensor *t = servd_tensor_new(dt, b ? 2 : 1, shape);
  if (!t) die("tensor");
  return t;
}

static servd_tensor *w(mpk_package *pkg, const char *name) {
  servd_tensor *t = NULL;
  if (mpk_tensor(pkg, name, &t) < 0) die(name);
  return t;
}

static const char *pure_code = "def work():\n"
                               "    s = 0\n"
                               "    for i in range(2000):\n"
                               "        s = (s + i * i) % 1000003\n"
                               "    return s\n";

static void model_open(model *m, const char *name) {
  memset(m, 0, sizeof *m);
  m->name = name;
  if (!strcmp(name, "pure_python")) {
    m->pure = 1;
    m->d_in = 1;
    return;
  }
  char path[512];
  snprintf(path, sizeof path, "%s/%s.mpk", EXAMPLES_BUILD_DIR, name);
  if (mpk_open(path, &m->pkg) < 0) die(path);
  json_t *cfg = mpk_config(m->pkg);
  if (!strcmp(name, "deep_tiny")) {
    m->d = m->d_in = (int)json_integer_value(json_object_get(cfg, "d"));
    m->f = (int)json_integer_value(json_object_get(cfg, "f"));
    m->n_layers = (int)json_integer_value(json_object_get(cfg, "n_layers"));
    for (int i = 0; i < m->n_layers && i < 64; i++) {
      char n[64];
      snprintf(n, sizeof n, "layers.%d.norm", i);
      m->norm[i] = w(m->pkg, n);
      snprintf(n, sizeof n, "layers.%d.gate", i);
      m->gate[i] = w(m->pkg, n);
      snprintf(n, sizeof n, "layers.%d.up", i);
      m->up[i] = w(m->pkg, n);
      snprintf(n, sizeof n, "layers.%d.down", i);
      m->down[i] = w(m->pkg, n);
    }
  } else {
    m->d_in = (int)json_integer_value(json_object_get(cfg, "d_in"));
    m->hidden = (int)json_integer_value(json_object_get(cfg, "hidden"));
    m->n_classes = (int)json_integer_value(json_object_get(cfg, "n_classes"));
    m->m_norm = w(m->pkg, "norm.weight");
    m->m_gate = w(m->pkg, "gate.weight");
    m->m_up = w(m->pkg, "up.weight");
    m->m_out = w(m->pkg, "out.weight");
  }
}

static void model_close(model *m) {
  if (m->pure) return;
  for (int i = 0; i < m->n_layers; i++) {
    servd_tensor_release(m->norm[i]);
    servd_tensor_release(m->gate[i]);
    servd_tensor_release(m->up[i]);
    servd_tensor_release(m->down[i]);
  }
  servd_tensor_release(m->m_norm);
  servd_tensor_release(m->m_gate);
  servd_tensor_release(m->m_up);
  servd_tensor_release(m->m_out);
  mpk_close(m->pkg);
}

static void c_scratch_init(const model *m, c_scratch *s) {
  memset(s, 0, sizeof *s);
  if (m->pure) return;
  s->x = ten(1, m->d_in, SERVD_F32);
  float *xv = servd_tensor_data(s->x);
  for (int j = 0; j < m->d_in; j++) xv[j] = (float)sin(0.37 * j);
  if (m->n_layers) {
    s->h = ten(1, m->d, SERVD_F32);
    s->y = ten(1, m->d, SERVD_F32);
    s->r = ten(1, m->d, SERVD_F32);
    s->g = ten(1, m->f, SERVD_F32);
    s->u = ten(1, m->f, SERVD_F32);
  } else {
    s->h = ten(1, m->d_in, SERVD_F32);
    s->g = ten(1, m->hidden, SERVD_F32);
    s->u = ten(1, m->hidden, SERVD_F32);
    s->probs = ten(1, m->n_classes, SERVD_F32);
    s->label = ten(1, 0, SERVD_I32);
  }
}

static void c_scratch_free(c_scratch *s) {
  servd_tensor *all[] = {s->x, s->h, s->g, s->u, s->y, s->r, s->probs, s->label};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) servd_tensor_release(all[i]);
}

static int c_forward(const model *m, c_scratch *s) {
  int rc = 0;
  if (m->n_layers) {
    memcpy(servd_tensor_data(s->r), servd_tensor_data(s->x), sizeof(float) * (size_t)m->d);
    for (int l = 0; l < m->n_layers && rc == 0; l++) {
      rc |= servd_rmsnorm(s->h, s->r, m->norm[l], 1e-5f);
      rc |= servd_matmul(s->g, s->h, m->gate[l]);
      rc |= servd_matmul(s->u, s->h, m->up[l]);
      rc |= servd_swiglu(s->g, s->g, s->u);
      rc |= servd_matmul(s->y, s->g, m->down[l]);
      rc |= servd_add(s->r, s->r, s->y);
    }
  } else {
    rc |= servd_rmsnorm(s->h, s->x, m->m_norm, 1e-5f);
    rc |= servd_matmul(s->g, s->h, m->m_gate);
    rc |= servd_matmul(s->u, s->h, m->m_up);
    rc |= servd_swiglu(s->g, s->g, s->u);
    rc |= servd_matmul(s->probs, s->g, m->m_out);
    rc |= servd_argmax(s->label, s->probs);
    rc |= servd_softmax(s->probs, 1.0f);
  }
  return rc;
}

/* ---- runner ---- */

typedef struct worker {
  _Alignas(64) const model *m;
  int mode;
  servd_interp *it;
  c_scratch cs;
  atomic_int *go, *stop;
  double *lat; /* seconds per item */
  size_t n, cap;
  int failed;
} worker;

static void *worker_main(void *arg) {
  worker *wk = arg;
  const char *in_names[1] = {"x"};
  while (!atomic_load(wk->go))
    ;
  while (!atomic_load_explicit(wk->stop, memory_order_relaxed)) {
    double t0 = bench_now_s();
    if (wk->m->pure) {
      json_t *r = NULL;
      servd_py_error err;
      if (servd_interp__eval_json(wk->it, "work()", &r, 0, &err) < 0) {
        fprintf(stderr, "work: %s: %s\n", err.type, err.message);
        wk->failed = 1;
        break;
      }
      json_decref(r);
    } else if (wk->mode == MODE_C) {
      if (c_forward(wk->m, &wk->cs) < 0) wk->failed = 1;
    } else {
      int n_out;
      char **names;
      servd_tensor **outs;
      servd_py_error err;
      if (servd_interp_predict(wk->it, 1, in_names, &wk->cs.x, &n_out, &names, &outs, 0, &err) < 0) {
        fprintf(stderr, "predict: %s: %s\n%s\n", err.type, err.message, err.traceback);
        wk->failed = 1;
        break;
      }
      for (int i = 0; i < n_out; i++) {
        free(names[i]);
        servd_tensor_release(outs[i]);
      }
      free(names);
      free(outs);
    }
    if (wk->n < wk->cap) wk->lat[wk->n] = bench_now_s() - t0;
    wk->n++;
  }
  return NULL;
}

typedef struct result {
  double items_s, p50_us, p95_us;
} result;

static result run_once(const model *m, int mode, int threads, servd_pool *pool, double seconds) {
  worker *wk = aligned_alloc(64, sizeof(worker) * (size_t)threads);
  pthread_t *th = calloc((size_t)threads, sizeof *th);
  atomic_int go = 0, stop = 0;
  for (int i = 0; i < threads; i++) {
    memset(&wk[i], 0, sizeof wk[i]);
    wk[i].m = m;
    wk[i].mode = mode;
    wk[i].it = mode == MODE_ONE ? servd_pool_get(pool, 0) : mode == MODE_MULTI ? servd_pool_get(pool, i) : NULL;
    c_scratch_init(m, &wk[i].cs);
    wk[i].go = &go;
    wk[i].stop = &stop;
    wk[i].cap = 1u << 21;
    wk[i].lat = malloc(sizeof(double) * wk[i].cap);
    pthread_create(&th[i], NULL, worker_main, &wk[i]);
  }
  atomic_store(&go, 1);
  usleep(200000); /* warm-up, not counted */
  size_t start_n[16];
  for (int i = 0; i < threads; i++) start_n[i] = wk[i].n;
  double t0 = bench_now_s();
  usleep((useconds_t)(seconds * 1e6));
  size_t end_n[16];
  for (int i = 0; i < threads; i++) end_n[i] = wk[i].n;
  double dt = bench_now_s() - t0;
  atomic_store(&stop, 1);
  size_t total = 0, nl = 0;
  for (int i = 0; i < threads; i++) {
    pthread_join(th[i], NULL);
    total += end_n[i] - start_n[i];
    nl += (end_n[i] < wk[i].cap ? end_n[i] : wk[i].cap) - (start_n[i] < wk[i].cap ? start_n[i] : wk[i].cap);
  }
  double *all = malloc(sizeof(double) * (nl ? nl : 1));
  size_t k = 0;
  for (int i = 0; i < threads; i++) {
    for (size_t j = start_n[i]; j < end_n[i] && j < wk[i].cap; j++) all[k++] = wk[i].lat[j];
    if (wk[i].failed) die("a call failed");
    c_scratch_free(&wk[i].cs);
    free(wk[i].lat);
  }
  qsort(all, k, sizeof(double), bench_cmp_d);
  result r = {(double)total / dt, k ? all[k / 2] * 1e6 : 0, k ? all[(size_t)(k * 0.95)] * 1e6 : 0};
  free(all);
  free(wk);
  free(th);
  return r;
}

static void *c_spin(void *v) {
  double until = bench_now_s() + 0.2;
  volatile unsigned long x = 0;
  while (bench_now_s() < until) x = x * 2654435761u + 1;
  (void)v;
  return NULL;
}

/* CPU time / wall time of two busy threads: how many cores this process gets now (shared machine). */
static double machine_cores(void) {
  struct timespec c0, c1;
  pthread_t a, b;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
  double t0 = bench_now_s();
  pthread_create(&a, NULL, c_spin, NULL);
  pthread_create(&b, NULL, c_spin, NULL);
  pthread_join(a, NULL);
  pthread_join(b, NULL);
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
  double cpu = (double)(c1.tv_sec - c0.tv_sec) + (c1.tv_nsec - c0.tv_nsec) * 1e-9;
  return cpu / (bench_now_s() - t0);
}

static int cmp_result(const void *a, const void *b) {
  return bench_cmp_d(&((const result *)a)->items_s, &((const result *)b)->items_s);
}

/* RSS added per interpreter: n fresh interpreters of a package, each having built its entry. */
static double interp_overhead_mb(const model *m, int n, double *create_ms) {
  size_t before = rss_bytes();
  servd_pool_options o = {.n_interpreters = n, .world_size = 1};
  servd_pool *p = NULL;
  double t0 = bench_now_s();
  if (servd_pool_create(m->pkg, &o, &p) < 0) die("pool");
  *create_ms = (bench_now_s() - t0) * 1e3 / n;
  size_t after = rss_bytes();
  servd_pool_destroy(p);
  return (double)(after - before) / n / 1e6;
}

int main(int argc, char **argv) {
  if (servd_interp_early_init(argc, argv) < 0) die("early init");
  double seconds = 1.0;
  int reps = 3, pool_threads = 0, markdown = 0;
  int tcounts[8] = {1, 2, 4}, nt = 3;
  const char *only = NULL; /* --models a,b: run only these */
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--seconds") && i + 1 < argc) seconds = atof(argv[++i]);
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--pool-threads") && i + 1 < argc) pool_threads = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--models") && i + 1 < argc) only = argv[++i];
    else if (!strcmp(argv[i], "--markdown")) markdown = 1;
    else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
      nt = 0;
      for (char *s = strtok(argv[++i], ","); s && nt < 8; s = strtok(NULL, ",")) tcounts[nt++] = atoi(s);
    } else {
      fprintf(stderr,
              "usage: %s [--seconds S] [--reps R] [--pool-threads K] [--threads 1,2,4] [--models a,b] "
              "[--markdown]\n",
              argv[0]);
      return 2;
    }
  }
  if (reps < 1 || reps > 15 || seconds <= 0) die("bad --reps/--seconds");
  if (servd_threadpool_init(pool_threads) < 0) die("threadpool");
  int max_t = 1;
  for (int i = 0; i < nt; i++) {
    if (tcounts[i] < 1 || tcounts[i] > 14) {
      fprintf(stderr, "thread counts must be 1..14\n");
      return 2;
    }
    if (tcounts[i] > max_t) max_t = tcounts[i];
  }

  const char *models[3] = {"pure_python", "deep_tiny", "mlp_classifier"};
  printf("# bench_interp: %.1f s x %d reps per row (median shown), kernel pool %d thread(s), %ld CPUs\n", seconds, reps,
         pool_threads, sysconf(_SC_NPROCESSORS_ONLN));
  {
    /* fresh namespaces first: a finalized interpreter's namespace keeps its pages for the next one */
    model m;
    model_open(&m, "mlp_classifier");
    double create_ms;
    double with_pkg = interp_overhead_mb(&m, 4, &create_ms);
    printf("# memory: %.1f MB RSS per interpreter serving mlp_classifier (fresh namespace: libpython, stdlib "
           "imports, model code, entry object); %.1f ms to start each\n",
           with_pkg, create_ms);
    model_close(&m);
  }
  printf("# machine: two busy threads get %.2f cores at the start\n", machine_cores());
  if (markdown)
    printf(
        "\n| model | mode | threads | items/s | vs 1 thread | p50 us | p95 us |\n|---|---|---:|---:|---:|---:|---:|\n");
  else printf("%-15s %-13s %7s %10s %8s %9s %9s\n", "model", "mode", "threads", "items/s", "x1thr", "p50_us", "p95_us");
  for (int mi = 0; mi < 3; mi++) {
    if (only && !strstr(only, models[mi])) continue;
    model m;
    model_open(&m, models[mi]);
    servd_pool_options o1 = {.n_interpreters = 1, .world_size = 1}, on = {.n_interpreters = max_t, .world_size = 1};
    servd_pool *one = NULL, *multi = NULL;
    if (servd_pool_create(m.pkg, &o1, &one) < 0 || servd_pool_create(m.pkg, &on, &multi) < 0) die("pool");
    if (m.pure) {
      servd_py_error err;
      for (int i = 0; i < servd_pool_size(one); i++)
        if (servd_interp__exec(servd_pool_get(one, i), pure_code, 0, &err) < 0) die("pure_python code");
      for (int i = 0; i < servd_pool_size(multi); i++)
        if (servd_interp__exec(servd_pool_get(multi, i), pure_code, 0, &err) < 0) die("pure_python code");
    }
    for (int mode = m.pure ? MODE_ONE : 0; mode < MODE_COUNT; mode++) {
      double base = 0;
      for (int ti = 0; ti < nt; ti++) {
        result rs[15];
        for (int r = 0; r < reps; r++) rs[r] = run_once(&m, mode, tcounts[ti], mode == MODE_ONE ? one : multi, seconds);
        qsort(rs, (size_t)reps, sizeof rs[0], cmp_result);
        result med = rs[reps / 2];
        if (tcounts[ti] == 1) base = med.items_s;
        double rel = base > 0 ? med.items_s / base : 0;
        if (markdown)
          printf("| %s | %s | %d | %.0f | %.2fx | %.1f | %.1f |\n", m.name, mode_names[mode], tcounts[ti], med.items_s,
                 rel, med.p50_us, med.p95_us);
        else
          printf("%-15s %-13s %7d %10.0f %7.2fx %9.1f %9.1f\n", m.name, mode_names[mode], tcounts[ti], med.items_s, rel,
                 med.p50_us, med.p95_us);
        fflush(stdout);
      }
    }
    servd_pool_destroy(one);
    servd_pool_destroy(multi);
    model_close(&m);
  }
  printf("# machine: two busy threads get %.2f cores at the end\n", machine_cores());
  fflush(stdout);
  return 0;
}
