/* Process isolation, the child's side: `servd isolated-worker FD`. Loads the model named in the HELLO
 * message as an in-process generic model and answers PREDICT messages until the socket ends.
 * See isolated.h. */
#include "engine/engine.h"
#include "engine/isolated.h"
#include "engine/isolated_wire.h"

#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "servd/threadpool.h"

#define MAX_WORKERS 64

typedef struct job {
  struct job *next;
  iso_frame f;
} job;

typedef struct worker_ctx {
  servd_model *m;
  int sock;
  pthread_mutex_t mu, send_mu;
  pthread_cond_t cv;
  job *head, *tail;
  bool quit;
} worker_ctx;

static void answer(worker_ctx *w, uint64_t id, int rc, const servd_model_error *merr, const servd_named_tensor *out,
                   int n_out) {
  iso_status st;
  memset(&st, 0, sizeof st);
  st.rc = rc;
  st.n = rc ? 0 : (uint32_t)n_out;
  if (rc) {
    snprintf(st.error, sizeof st.error, "%s", servd_last_error());
    if (merr) {
      snprintf(st.type, sizeof st.type, "%s", merr->type);
      snprintf(st.message, sizeof st.message, "%s", merr->message);
    }
  }
  pthread_mutex_lock(&w->send_mu);
  int src = iso_send(w->sock, ISO_RESULT, id, &st, sizeof st, rc ? NULL : out, rc ? 0 : n_out);
  pthread_mutex_unlock(&w->send_mu);
  if (src && !rc) { /* e.g. an output on a device: tell servd instead */
    memset(&st, 0, sizeof st);
    st.rc = src;
    snprintf(st.error, sizeof st.error, "predict: %s", servd_last_error());
    pthread_mutex_lock(&w->send_mu);
    iso_send(w->sock, ISO_RESULT, id, &st, sizeof st, NULL, 0);
    pthread_mutex_unlock(&w->send_mu);
  }
}

static void run(worker_ctx *w, iso_frame *f) {
  iso_call_head head;
  if (f->h.len < sizeof head || !f->payload) {
    servd_fail(SERVD_EFORMAT, "predict: a short request");
    answer(w, f->h.id, SERVD_EFORMAT, NULL, NULL, 0);
    return;
  }
  memcpy(&head, f->payload, sizeof head);
  uint64_t id = f->h.id;
  servd_named_tensor *in = NULL, *out = NULL;
  int n_out = 0;
  servd_model_error merr;
  memset(&merr, 0, sizeof merr);
  int rc = iso_take_tensors(f, sizeof head, head.n, &in);
  if (!rc) rc = servd_model_predict(w->m, in, (int)head.n, &out, &n_out, head.deadline_ms, &merr);
  answer(w, id, rc, &merr, out, n_out);
  for (uint32_t i = 0; in && i < head.n; i++) servd_tensor_release(in[i].tensor);
  for (int i = 0; out && i < n_out; i++) servd_tensor_release(out[i].tensor);
  free(in);
  free(out);
}

static void *worker_main(void *arg) {
  worker_ctx *w = arg;
  pthread_mutex_lock(&w->mu);
  for (;;) {
    while (!w->head && !w->quit) pthread_cond_wait(&w->cv, &w->mu);
    if (!w->head) break;
    job *j = w->head;
    w->head = j->next;
    if (!w->head) w->tail = NULL;
    pthread_mutex_unlock(&w->mu);
    run(w, &j->f);
    iso_frame_free(&j->f);
    free(j);
    pthread_mutex_lock(&w->mu);
  }
  pthread_mutex_unlock(&w->mu);
  return NULL;
}

static int jint(json_t *o, const char *k, int def) {
  json_t *v = json_object_get(o, k);
  return json_is_integer(v) ? (int)json_integer_value(v) : def;
}

int servd_isolated_worker_main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "servd isolated-worker: started by servd for a model with \"isolation\": \"process\"\n");
    return 2;
  }
  int sock = atoi(argv[1]);
  /* Signals for the process group (Ctrl-C, a service manager's SIGTERM) are servd's to handle: it
   * drains, then ends this process by closing the socket. */
  signal(SIGINT, SIG_IGN);
  signal(SIGTERM, SIG_IGN);
  signal(SIGHUP, SIG_IGN);
  signal(SIGPIPE, SIG_IGN);
  prctl(PR_SET_NAME, "servd-isolated");
  iso_frame f;
  if (iso_recv(sock, &f) || f.h.type != ISO_HELLO || !f.payload) {
    fprintf(stderr, "servd isolated-worker: no options from servd: %s\n", servd_last_error());
    return 2;
  }
  json_t *o = json_loadb(f.payload, f.h.len, 0, NULL);
  iso_frame_free(&f);
  servd_model_options mo;
  servd_model_options_default(&mo);
  const char *path = json_string_value(json_object_get(o, "path"));
  mo.path = path;
  mo.name = json_string_value(json_object_get(o, "name"));
  mo.interpreters = jint(o, "interpreters", 1);
  mo.max_batch_size = jint(o, "max_batch_size", 1);
  mo.max_batch_delay_ms = jint(o, "max_batch_delay_ms", 0);
  mo.max_queue = jint(o, "max_queue", mo.max_queue);
  mo.extra_sys_path = json_string_value(json_object_get(o, "extra_sys_path"));
  /* servd's --load-timeout: the import here is bounded as an in-process load is (servd kills this
   * process if no answer comes a few seconds after it). */
  json_t *lt = json_object_get(o, "load_timeout");
  if (json_is_number(lt)) mo.load_timeout_s = json_number_value(lt);
  mo.isolation = SERVD_ISOLATION_NONE; /* this process is the isolation */
  servd_model *m = NULL;
  int rc = path ? servd_threadpool_init(jint(o, "threads", 0)) : servd_fail(SERVD_EINVAL, "no package path");
  if (!rc) rc = servd_model_load(&mo, &m);
  iso_status st;
  memset(&st, 0, sizeof st);
  st.rc = rc;
  if (rc) snprintf(st.error, sizeof st.error, "%s", servd_last_error());
  if (iso_send(sock, ISO_READY, 0, &st, sizeof st, NULL, 0) || rc) {
    servd_model_unload(m, 0);
    json_decref(o);
    return 1;
  }

  worker_ctx w = {.m = m, .sock = sock};
  pthread_mutex_init(&w.mu, NULL);
  pthread_mutex_init(&w.send_mu, NULL);
  pthread_cond_init(&w.cv, NULL);
  /* Enough callers for every interpreter, and for full dynamic batches on each. */
  int n_workers = mo.interpreters * (mo.max_batch_size > 1 ? mo.max_batch_size : 1);
  if (n_workers > MAX_WORKERS) n_workers = MAX_WORKERS;
  pthread_t threads[MAX_WORKERS];
  int started = 0;
  while (started < n_workers && !pthread_create(&threads[started], NULL, worker_main, &w)) started++;
  for (;;) {
    job *j = calloc(1, sizeof *j);
    if (!j || iso_recv(sock, &j->f)) { /* servd closed the socket (stop) or is gone */
      free(j);
      break;
    }
    if (j->f.h.type != ISO_PREDICT) {
      iso_frame_free(&j->f);
      free(j);
      continue;
    }
    pthread_mutex_lock(&w.mu);
    if (w.tail) w.tail->next = j;
    else w.head = j;
    w.tail = j;
    pthread_cond_signal(&w.cv);
    pthread_mutex_unlock(&w.mu);
  }
  pthread_mutex_lock(&w.mu);
  w.quit = true;
  pthread_cond_broadcast(&w.cv);
  pthread_mutex_unlock(&w.mu);
  for (int i = 0; i < started; i++) pthread_join(threads[i], NULL);
  servd_model_unload(m, 0);
  json_decref(o);
  return 0;
}
