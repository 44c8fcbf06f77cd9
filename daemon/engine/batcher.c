/* Dynamic batching of generic predict calls: see batcher.h. */
#include "engine/batcher.h"
#include "engine/model_error.h"
#include "servd/clock.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct job {
  const servd_named_tensor *in;
  int n_in;
  int64_t rows;
  int64_t deadline_ms;
  int64_t t_ns; /* arrival, CLOCK_MONOTONIC */
  servd_named_tensor *out;
  int n_out;
  int rc;
  char err[512];
  servd_model_error merr;
  bool done;
  struct job *next;
} job;

struct servd_batcher {
  servd_pool *pool;
  int max_size, delay_ms;
  pthread_mutex_t mu;
  pthread_cond_t work, done;
  job *head, *tail;
  bool stop;
  int n_workers;
  pthread_t *workers;
};

int servd_predict_direct(servd_pool *pool, const servd_named_tensor *inputs, int n_inputs, servd_named_tensor **outputs,
                         int *n_outputs, int64_t deadline_ms, servd_model_error *merr) {
  *outputs = NULL;
  *n_outputs = 0;
  if (merr) memset(merr, 0, sizeof *merr);
  if (n_inputs < 0 || n_inputs > 1024) return servd_fail(SERVD_EINVAL, "predict: %d inputs", n_inputs);
  const char **names = calloc((size_t)n_inputs + 1, sizeof *names);
  servd_tensor **ts = calloc((size_t)n_inputs + 1, sizeof *ts);
  char **onames = NULL;
  servd_tensor **ots = NULL;
  int n_out = 0, rc = 0;
  if (!names || !ts) {
    rc = servd_fail(SERVD_ENOMEM, "predict: inputs");
    goto done;
  }
  for (int i = 0; i < n_inputs; i++) {
    names[i] = inputs[i].name;
    ts[i] = inputs[i].tensor;
  }
  servd_py_error err;
  memset(&err, 0, sizeof err);
  servd_interp *it = servd_pool_acquire(pool);
  rc = servd_interp_predict(it, n_inputs, names, ts, &n_out, &onames, &ots, deadline_ms, &err);
  servd_pool_release(pool, it);
  if (rc) {
    int code = servd_model_error_code(rc, &err, SERVD_CALL_PREDICT, merr);
    char msg[512]; /* servd_fail writes the buffer servd_last_error returns: copy it first */
    snprintf(msg, sizeof msg, "%s", servd_last_error());
    rc =
        err.type[0] ? servd_fail(code, "predict: %s: %s", err.type, err.message) : servd_fail(code, "predict: %s", msg);
    goto done;
  }
  servd_named_tensor *o = calloc((size_t)n_out + 1, sizeof *o);
  if (!o) {
    for (int i = 0; i < n_out; i++) servd_tensor_release(ots[i]);
    rc = servd_fail(SERVD_ENOMEM, "predict: outputs");
    goto done;
  }
  for (int i = 0; i < n_out; i++) {
    snprintf(o[i].name, sizeof o[i].name, "%s", onames[i]);
    o[i].tensor = ots[i];
  }
  *outputs = o;
  *n_outputs = n_out;
done:
  for (int i = 0; onames && i < n_out; i++) free(onames[i]);
  free(onames);
  free(ots);
  free(names);
  free(ts);
  return rc;
}

/* Whether a job's inputs can be stacked with the batch leader's. */
static bool batchable(const job *j) {
  if (j->n_in < 1) return false;
  for (int i = 0; i < j->n_in; i++) {
    const servd_tensor *t = j->in[i].tensor;
    if (!t || t->ndim < 1 || servd_dtype_is_quantized(t->dtype) || !servd_tensor_is_contiguous(t) ||
        t->shape[0] != j->rows || t->device >= 0)
      return false;
  }
  return true;
}

static bool compatible(const job *a, const job *b) {
  if (!batchable(a) || !batchable(b) || a->n_in != b->n_in) return false;
  for (int i = 0; i < a->n_in; i++) {
    const servd_tensor *x = a->in[i].tensor, *y = b->in[i].tensor;
    if (strcmp(a->in[i].name, b->in[i].name) || x->dtype != y->dtype || x->ndim != y->ndim) return false;
    for (int d = 1; d < x->ndim; d++)
      if (x->shape[d] != y->shape[d]) return false;
  }
  return true;
}

static void fail_job(job *j, int rc, const char *msg) {
  j->rc = rc;
  snprintf(j->err, sizeof j->err, "%s", msg);
}

/* Runs jobs[0..n) as one predict and distributes the outputs. */
static void run_batch(servd_batcher *b, job **jobs, int n) {
  if (n == 1) {
    job *j = jobs[0];
    j->rc = servd_predict_direct(b->pool, j->in, j->n_in, &j->out, &j->n_out, j->deadline_ms, &j->merr);
    if (j->rc) fail_job(j, j->rc, servd_last_error());
    return;
  }
  int n_in = jobs[0]->n_in, rc = 0;
  servd_model_error merr;
  memset(&merr, 0, sizeof merr);
  int64_t total = 0, deadline = 0;
  bool unbounded = false;
  for (int k = 0; k < n; k++) {
    total += jobs[k]->rows;
    if (jobs[k]->deadline_ms <= 0) unbounded = true;
    else if (jobs[k]->deadline_ms > deadline) deadline = jobs[k]->deadline_ms;
  }
  if (unbounded) deadline = 0;
  servd_named_tensor *in = calloc((size_t)n_in, sizeof *in), *out = NULL;
  int n_out = 0;
  if (!in) {
    rc = servd_fail(SERVD_ENOMEM, "predict batch: inputs");
    goto done;
  }
  for (int i = 0; i < n_in; i++) {
    const servd_tensor *t0 = jobs[0]->in[i].tensor;
    int64_t shape[SERVD_MAX_DIMS];
    memcpy(shape, t0->shape, sizeof shape);
    shape[0] = total;
    snprintf(in[i].name, sizeof in[i].name, "%s", jobs[0]->in[i].name);
    if (!(in[i].tensor = servd_tensor_new(t0->dtype, t0->ndim, shape))) {
      rc = SERVD_ENOMEM;
      goto done;
    }
    char *dst = servd_tensor_data(in[i].tensor);
    for (int k = 0; k < n; k++) {
      size_t bytes = servd_tensor_nbytes(jobs[k]->in[i].tensor);
      memcpy(dst, servd_tensor_data(jobs[k]->in[i].tensor), bytes);
      dst += bytes;
    }
  }
  if ((rc = servd_predict_direct(b->pool, in, n_in, &out, &n_out, deadline, &merr))) goto done;
  for (int o = 0; o < n_out; o++)
    if (!out[o].tensor || out[o].tensor->ndim < 1 || out[o].tensor->shape[0] != total) {
      rc = servd_fail(SERVD_EFORMAT,
                      "predict batch: output \"%s\" must have the batch's %lld rows first "
                      "(dynamic batching)",
                      out[o].name, (long long)total);
      goto done;
    }
  int64_t off = 0;
  for (int k = 0; k < n; k++) {
    job *j = jobs[k];
    j->out = calloc((size_t)n_out + 1, sizeof *j->out);
    if (!j->out) {
      fail_job(j, SERVD_ENOMEM, "predict batch: outputs");
      off += j->rows;
      continue;
    }
    j->n_out = n_out;
    for (int o = 0; o < n_out; o++) {
      memcpy(j->out[o].name, out[o].name, sizeof j->out[o].name);
      j->out[o].tensor = servd_tensor_narrow(out[o].tensor, 0, off, j->rows);
      if (!j->out[o].tensor) fail_job(j, SERVD_ENOMEM, "predict batch: output view");
    }
    off += j->rows;
  }
done:
  if (rc) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s", servd_last_error());
    for (int k = 0; k < n; k++) {
      fail_job(jobs[k], rc, msg);
      jobs[k]->merr = merr;
    }
  }
  for (int i = 0; in && i < n_in; i++) servd_tensor_release(in[i].tensor);
  for (int o = 0; out && o < n_out; o++) servd_tensor_release(out[o].tensor);
  free(in);
  free(out);
}

static void *worker_main(void *arg) {
  servd_batcher *b = arg;
  pthread_setname_np(pthread_self(), "servd-batch"); /* names in crash reports, top -H, gdb */
  job **batch = calloc((size_t)b->max_size, sizeof *batch);
  pthread_mutex_lock(&b->mu);
  while (batch) {
    while (!b->stop && !b->head) pthread_cond_wait(&b->work, &b->mu);
    if (!b->head) break; /* stopping with nothing queued */
    /* Wait for the batch to fill, at most until the oldest job has waited the delay. */
    for (;;) {
      int n = 0;
      for (job *j = b->head; j && n < b->max_size; j = j->next)
        if (j == b->head || compatible(b->head, j)) n++;
      int64_t until = b->head->t_ns + (int64_t)b->delay_ms * 1000000;
      if (b->stop || n >= b->max_size || servd_now_ns() >= until) break;
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      int64_t wait = until - servd_now_ns();
      ts.tv_sec += wait / 1000000000;
      ts.tv_nsec += wait % 1000000000;
      if (ts.tv_nsec >= 1000000000) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000;
      }
      pthread_cond_timedwait(&b->work, &b->mu, &ts);
      if (!b->head) break;
    }
    if (!b->head) continue;
    /* Take the oldest job and the compatible ones behind it, in order. */
    int n = 0;
    job *lead = b->head, **link = &b->head, *prev = NULL;
    for (job *j = b->head; j && n < b->max_size;) {
      job *next = j->next;
      if (j == lead || compatible(lead, j)) {
        batch[n++] = j;
        *link = next;
        if (b->tail == j) b->tail = prev;
      } else {
        prev = j;
        link = &j->next;
      }
      j = next;
    }
    pthread_mutex_unlock(&b->mu);
    run_batch(b, batch, n);
    pthread_mutex_lock(&b->mu);
    for (int k = 0; k < n; k++) batch[k]->done = true;
    pthread_cond_broadcast(&b->done);
  }
  pthread_mutex_unlock(&b->mu);
  free(batch);
  return NULL;
}

int servd_batcher_create(servd_pool *pool, int max_batch_size, int max_batch_delay_ms, servd_batcher **out) {
  *out = NULL;
  if (!pool || max_batch_size < 2 || max_batch_size > 4096 || max_batch_delay_ms < 0 || max_batch_delay_ms > 60000)
    return servd_fail(SERVD_EINVAL,
                      "batcher: max_batch_size=%d (expected 2..4096), max_batch_delay_ms=%d "
                      "(expected 0..60000)",
                      max_batch_size, max_batch_delay_ms);
  servd_batcher *b = calloc(1, sizeof *b);
  if (!b) return servd_fail(SERVD_ENOMEM, "batcher: allocation");
  b->pool = pool;
  b->max_size = max_batch_size;
  b->delay_ms = max_batch_delay_ms;
  pthread_mutex_init(&b->mu, NULL);
  pthread_cond_init(&b->work, NULL);
  pthread_cond_init(&b->done, NULL);
  int n = servd_pool_size(pool);
  b->workers = calloc((size_t)n, sizeof *b->workers);
  if (!b->workers) {
    servd_batcher_destroy(b);
    return servd_fail(SERVD_ENOMEM, "batcher: workers");
  }
  for (int i = 0; i < n; i++) {
    if (pthread_create(&b->workers[i], NULL, worker_main, b)) {
      servd_batcher_destroy(b);
      return servd_fail(SERVD_ENOMEM, "batcher: starting worker %d", i);
    }
    b->n_workers++;
  }
  *out = b;
  return 0;
}

void servd_batcher_destroy(servd_batcher *b) {
  if (!b) return;
  pthread_mutex_lock(&b->mu);
  b->stop = true;
  pthread_cond_broadcast(&b->work);
  pthread_mutex_unlock(&b->mu);
  /* Workers finish what is queued, then leave. */
  for (int i = 0; i < b->n_workers; i++) pthread_join(b->workers[i], NULL);
  free(b->workers);
  pthread_mutex_destroy(&b->mu);
  pthread_cond_destroy(&b->work);
  pthread_cond_destroy(&b->done);
  free(b);
}

int servd_batcher_predict(servd_batcher *b, const servd_named_tensor *inputs, int n_inputs,
                          servd_named_tensor **outputs, int *n_outputs, int64_t deadline_ms, servd_model_error *err) {
  *outputs = NULL;
  *n_outputs = 0;
  if (err) memset(err, 0, sizeof *err);
  if (n_inputs < 0 || n_inputs > 1024) return servd_fail(SERVD_EINVAL, "predict: %d inputs", n_inputs);
  job j = {.in = inputs, .n_in = n_inputs, .deadline_ms = deadline_ms, .t_ns = servd_now_ns()};
  j.rows = n_inputs > 0 && inputs[0].tensor && inputs[0].tensor->ndim > 0 ? inputs[0].tensor->shape[0] : 0;
  pthread_mutex_lock(&b->mu);
  if (b->stop) {
    pthread_mutex_unlock(&b->mu);
    return servd_fail(SERVD_ECANCELED, "predict: the model is unloading");
  }
  if (b->tail) b->tail->next = &j;
  else b->head = &j;
  b->tail = &j;
  pthread_cond_broadcast(&b->work);
  while (!j.done) pthread_cond_wait(&b->done, &b->mu);
  pthread_mutex_unlock(&b->mu);
  if (j.rc) {
    for (int o = 0; j.out && o < j.n_out; o++) servd_tensor_release(j.out[o].tensor);
    free(j.out);
    if (err) *err = j.merr;
    return servd_fail(j.rc, "%s", j.err);
  }
  *outputs = j.out;
  *n_outputs = j.n_out;
  return 0;
}
