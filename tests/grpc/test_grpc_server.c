/* The gRPC listener in-process, against a fake model table (no package, no Python): a client thread
 * speaks HTTP/2 through nghttp2's client session over loopback while the loop thread serves. Covers
 * the answers and statuses, the API key, the message limit, and a call cancelled by RST_STREAM while
 * its prediction runs: the server drops it, counts nothing in flight after, and serves on. Built in
 * the sanitizer builds too, which check the stream and prediction lifetimes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <nghttp2/nghttp2.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "api/api.h"
#include "grpc/grpc-impl.h"
#include "grpc/grpc.h"
#include "servd/status.h"
#include "servd/tensor.h"

/* ---- a fake generic model: y = 2 * x; an input named "slow" waits until released ---- */

struct servd_model {
  char name[32];
};
static atomic_bool slow_running, slow_release;

static void f_options_default(servd_model_options *o) { memset(o, 0, sizeof *o); }
static void f_params_default(servd_gen_params *p) { memset(p, 0, sizeof *p); }
static void f_unload(servd_model *m, int d) {
  (void)d;
  free(m);
}
static const char *f_name(const servd_model *m) { return m->name; }
static servd_model_kind f_kind(const servd_model *m) {
  (void)m;
  return SERVD_MODEL_GENERIC;
}
static bool f_ready(const servd_model *m) {
  (void)m;
  return true;
}
static json_t *f_meta(const servd_model *m) {
  (void)m;
  return json_pack("{s:[{s:s, s:s, s:[i, i]}], s:[]}", "inputs", "name", "x", "datatype", "FP32", "shape", -1, 4,
                   "outputs");
}
static int f_predict(servd_model *m, const servd_named_tensor *in, int n_in, servd_named_tensor **out, int *n_out,
                     int64_t deadline_ms, servd_model_error *err) {
  (void)m;
  (void)deadline_ms;
  (void)err;
  if (strcmp(in[0].name, "slow") == 0) {
    atomic_store(&slow_running, true);
    for (int i = 0; i < 5000 && !atomic_load(&slow_release); i++) usleep(1000);
  }
  if (n_in != 1 || in[0].tensor->dtype != SERVD_F32) return servd_fail(SERVD_EINVAL, "x must be FP32");
  servd_tensor *y = servd_tensor_new(SERVD_F32, in[0].tensor->ndim, in[0].tensor->shape);
  const float *a = servd_tensor_data(in[0].tensor);
  float *b = servd_tensor_data(y);
  for (int64_t i = 0; i < servd_tensor_numel(y); i++) b[i] = 2 * a[i];
  *out = calloc(1, sizeof **out);
  snprintf((*out)[0].name, sizeof(*out)[0].name, "y");
  (*out)[0].tensor = y;
  *n_out = 1;
  return 0;
}
static void f_stats(const servd_model *m, servd_model_stats *s) {
  (void)m;
  memset(s, 0, sizeof *s);
  s->n_interpreters = 2;
}
static const servd_model_ops fake_ops = {.options_default = f_options_default,
                                         .gen_params_default = f_params_default,
                                         .unload = f_unload,
                                         .name = f_name,
                                         .kind = f_kind,
                                         .ready = f_ready,
                                         .metadata = f_meta,
                                         .predict = f_predict,
                                         .get_stats = f_stats};

/* ---- a blocking HTTP/2 client (the client thread) ---- */

/* cmocka's assertions may only fail on the test's thread: the client records its first failure,
 * wakes the loop and ends its thread; the test asserts that nothing failed. */
static atomic_int client_failed;
static uv_async_t *client_done;
#define CK(x) \
  do { \
    if (!(x)) { \
      fprintf(stderr, "%s:%d: client check failed: %s\n", __FILE__, __LINE__, #x); \
      atomic_store(&client_failed, 1); \
      uv_async_send(client_done); \
      pthread_exit(NULL); \
    } \
  } while (0)

typedef struct cli {
  int fd;
  nghttp2_session *h2;
  const uint8_t *req;
  size_t req_len, req_off;
  int32_t sid;
  bool closed;
  int grpc_status; /* -1 until the trailers */
  char message[256];
  uint8_t body[4096];
  size_t body_len;
} cli;

static ssize_t c_send(nghttp2_session *s, const uint8_t *d, size_t n, int fl, void *ud) {
  (void)s;
  (void)fl;
  return write(((cli *)ud)->fd, d, n);
}
static int c_header(nghttp2_session *s, const nghttp2_frame *f, const uint8_t *n, size_t nl, const uint8_t *v,
                    size_t vl, uint8_t fl, void *ud) {
  (void)s;
  (void)f;
  (void)fl;
  cli *c = ud;
  if (nl == 11 && memcmp(n, "grpc-status", 11) == 0) c->grpc_status = atoi((const char *)v);
  if (nl == 12 && memcmp(n, "grpc-message", 12) == 0) snprintf(c->message, sizeof c->message, "%.*s", (int)vl, v);
  return 0;
}
static int c_data(nghttp2_session *s, uint8_t fl, int32_t id, const uint8_t *d, size_t n, void *ud) {
  (void)s;
  (void)fl;
  (void)id;
  cli *c = ud;
  if (c->body_len + n <= sizeof c->body) memcpy(c->body + c->body_len, d, n);
  c->body_len += n;
  return 0;
}
static int c_close(nghttp2_session *s, int32_t id, uint32_t e, void *ud) {
  (void)s;
  (void)e;
  cli *c = ud;
  if (id == c->sid) c->closed = true;
  return 0;
}
static ssize_t c_read(nghttp2_session *s, int32_t id, uint8_t *buf, size_t len, uint32_t *fl, nghttp2_data_source *src,
                      void *ud) {
  (void)s;
  (void)id;
  (void)src;
  cli *c = ud;
  size_t n = c->req_len - c->req_off < len ? c->req_len - c->req_off : len;
  memcpy(buf, c->req + c->req_off, n);
  c->req_off += n;
  if (c->req_off == c->req_len) *fl |= NGHTTP2_DATA_FLAG_EOF;
  return (ssize_t)n;
}

static void cli_open(cli *c, int port) {
  memset(c, 0, sizeof *c);
  c->fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  CK(connect(c->fd, (struct sockaddr *)&sa, sizeof sa) == 0);
  struct timeval tv = {10, 0};
  setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  nghttp2_session_callbacks *cb;
  nghttp2_session_callbacks_new(&cb);
  nghttp2_session_callbacks_set_send_callback(cb, c_send);
  nghttp2_session_callbacks_set_on_header_callback(cb, c_header);
  nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, c_data);
  nghttp2_session_callbacks_set_on_stream_close_callback(cb, c_close);
  nghttp2_session_client_new(&c->h2, cb, c);
  nghttp2_session_callbacks_del(cb);
  nghttp2_submit_settings(c->h2, NGHTTP2_FLAG_NONE, NULL, 0);
}

static void cli_pump(cli *c) {
  nghttp2_session_send(c->h2);
  uint8_t buf[16384];
  ssize_t n = read(c->fd, buf, sizeof buf);
  CK(n > 0);
  CK(nghttp2_session_mem_recv(c->h2, buf, (size_t)n) >= 0);
  nghttp2_session_send(c->h2);
}

/* Starts a call with one message (framed here); cli_wait finishes it. */
static void cli_start(cli *c, const char *path, const uint8_t *msg, size_t len, const char *auth) {
  static uint8_t framed[1 << 20];
  framed[0] = 0;
  framed[1] = (uint8_t)(len >> 24);
  framed[2] = (uint8_t)(len >> 16);
  framed[3] = (uint8_t)(len >> 8);
  framed[4] = (uint8_t)len;
  memcpy(framed + 5, msg, len);
  c->req = framed;
  c->req_len = len + 5;
  c->req_off = 0;
  c->closed = false;
  c->grpc_status = -1;
  c->message[0] = '\0';
  c->body_len = 0;
  nghttp2_nv h[] = {
      {(uint8_t *)":method", (uint8_t *)"POST", 7, 4, 0},
      {(uint8_t *)":scheme", (uint8_t *)"http", 7, 4, 0},
      {(uint8_t *)":path", (uint8_t *)path, 5, strlen(path), 0},
      {(uint8_t *)":authority", (uint8_t *)"x", 10, 1, 0},
      {(uint8_t *)"content-type", (uint8_t *)"application/grpc", 12, 16, 0},
      {(uint8_t *)"te", (uint8_t *)"trailers", 2, 8, 0},
      {(uint8_t *)"authorization", (uint8_t *)(auth ? auth : ""), 13, auth ? strlen(auth) : 0, 0},
  };
  nghttp2_data_provider prd = {.read_callback = c_read};
  c->sid = nghttp2_submit_request(c->h2, NULL, h, auth ? 7 : 6, &prd, NULL);
  CK(c->sid > 0);
  nghttp2_session_send(c->h2);
}

static void cli_wait(cli *c) {
  while (!c->closed) cli_pump(c);
}

static void cli_call(cli *c, const char *path, const ProtobufCMessage *m, const char *auth) {
  uint8_t buf[65536];
  size_t n = protobuf_c_message_pack(m, buf);
  cli_start(c, path, buf, n, auth);
  cli_wait(c);
}

static void cli_close(cli *c) {
  nghttp2_session_del(c->h2);
  close(c->fd);
}

/* ---- the test: the loop on this thread, the client on another ---- */

#define SVC "/inference.GRPCInferenceService/"

typedef struct fixture {
  uv_loop_t loop;
  uv_async_t done;
  servd_api *api;
  servd_grpc_server *srv;
  int port;
  const char *key;
  void (*client)(struct fixture *f);
  pthread_t t;
  uv_timer_t settle;
  int settle_ticks;
  int inflight_at_end;
} fixture;

static Inference__ModelInferRequest *infer_req(const char *input, const float *x, int n, int64_t *shape,
                                               ProtobufCBinaryData *raw) {
  static Inference__ModelInferRequest r;
  static Inference__ModelInferRequest__InferInputTensor t, *tp;
  Inference__ModelInferRequest r0 = INFERENCE__MODEL_INFER_REQUEST__INIT;
  Inference__ModelInferRequest__InferInputTensor t0 = INFERENCE__MODEL_INFER_REQUEST__INFER_INPUT_TENSOR__INIT;
  r = r0;
  t = t0;
  t.name = (char *)input;
  t.datatype = "FP32";
  t.n_shape = 2;
  t.shape = shape;
  tp = &t;
  r.model_name = "m";
  r.n_inputs = 1;
  r.inputs = &tp;
  raw->data = (uint8_t *)x;
  raw->len = (size_t)n * sizeof(float);
  r.n_raw_input_contents = 1;
  r.raw_input_contents = raw;
  return &r;
}

static void check_echo(cli *c) {
  float x[4] = {1, 2, 3, 4.5f};
  int64_t shape[2] = {1, 4};
  ProtobufCBinaryData raw;
  cli_call(c, SVC "ModelInfer", &infer_req("x", x, 4, shape, &raw)->base, NULL);
  CK(c->grpc_status == 0);
  CK(c->body_len > 5);
  Inference__ModelInferResponse *r = inference__model_infer_response__unpack(NULL, c->body_len - 5, c->body + 5);
  CK(r != NULL);
  CK(r->n_outputs == 1);
  CK(strcmp(r->outputs[0]->name, "y") == 0);
  CK(strcmp(r->outputs[0]->datatype, "FP32") == 0);
  CK(r->n_raw_output_contents == 1);
  CK(r->raw_output_contents[0].len == sizeof x);
  float y[4];
  memcpy(y, r->raw_output_contents[0].data, sizeof y);
  for (int i = 0; i < 4; i++) CK(y[i] == 2 * x[i]);
  inference__model_infer_response__free_unpacked(r, NULL);
}

static void *client_main(void *p) {
  fixture *f = p;
  f->client(f);
  uv_async_send(&f->done);
  return NULL;
}

static void on_unloaded(void *ud) {
  fixture *f = ud;
  servd_api_close(f->api, NULL, NULL);
}

/* Predictions of cancelled calls still run: wait (bounded) until none is in flight, then close. */
static void settle_tick(uv_timer_t *t) {
  fixture *f = t->data;
  f->inflight_at_end = servd_api_inflight(f->api);
  if (f->inflight_at_end > 0 && ++f->settle_ticks < 500) return;
  uv_close((uv_handle_t *)t, NULL);
  servd_api_unload_all(f->api, 0, on_unloaded, f);
}

static void on_done(uv_async_t *a) {
  fixture *f = a->data;
  pthread_join(f->t, NULL);
  uv_close((uv_handle_t *)&f->done, NULL);
  servd_grpc_server_close(f->srv, NULL, NULL);
  uv_timer_init(&f->loop, &f->settle);
  f->settle.data = f;
  uv_timer_start(&f->settle, settle_tick, 0, 10);
}

static void run(void (*client)(fixture *), const char *key, size_t max_message) {
  fixture f;
  memset(&f, 0, sizeof f);
  f.client = client;
  f.key = key;
  uv_loop_init(&f.loop);
  servd_api_options o;
  servd_api_options_default(&o);
  o.ops = &fake_ops;
  o.api_key = key;
  o.log = fopen("/dev/null", "w");
  assert_int_equal(servd_api_create(&f.loop, &o, &f.api), 0);
  servd_model *m = calloc(1, sizeof *m);
  snprintf(m->name, sizeof m->name, "m");
  assert_int_equal(servd_api_add_model(f.api, m), 0);
  servd_grpc_limits lim;
  servd_grpc_limits_default(&lim);
  if (max_message) lim.max_message_bytes = max_message;
  assert_int_equal(servd_grpc_server_create(&f.loop, f.api, &lim, &f.srv), 0);
  assert_int_equal(servd_grpc_server_listen(f.srv, "127.0.0.1", 0), 0);
  f.port = servd_grpc_server_port(f.srv);
  uv_async_init(&f.loop, &f.done, on_done);
  f.done.data = &f;
  client_done = &f.done;
  atomic_store(&client_failed, 0);
  pthread_create(&f.t, NULL, client_main, &f);
  uv_run(&f.loop, UV_RUN_DEFAULT);
  assert_int_equal(atomic_load(&client_failed), 0);
  assert_int_equal(f.inflight_at_end, 0);
  assert_int_equal(uv_loop_close(&f.loop), 0);
  fclose(o.log);
}

static void client_basics(fixture *f) {
  cli c;
  cli_open(&c, f->port);
  Inference__ServerLiveRequest lq = INFERENCE__SERVER_LIVE_REQUEST__INIT;
  cli_call(&c, SVC "ServerLive", &lq.base, NULL);
  CK(c.grpc_status == 0);
  Inference__ServerLiveResponse *lr = inference__server_live_response__unpack(NULL, c.body_len - 5, c.body + 5);
  CK(lr != NULL);
  CK(lr->live);
  inference__server_live_response__free_unpacked(lr, NULL);
  check_echo(&c);
  /* Statuses, each followed by a good call on the same connection. */
  cli_start(&c, SVC "ModelInfer", (const uint8_t *)"\x0a\xff\xff\xff\xff\x0f", 6, NULL);
  cli_wait(&c);
  CK(c.grpc_status == GRPC_INVALID_ARGUMENT);
  check_echo(&c);
  cli_call(&c, SVC "NoSuchMethod", &lq.base, NULL);
  CK(c.grpc_status == GRPC_UNIMPLEMENTED);
  Inference__ModelReadyRequest mq = INFERENCE__MODEL_READY_REQUEST__INIT;
  mq.name = "absent";
  cli_call(&c, SVC "ModelReady", &mq.base, NULL);
  CK(c.grpc_status == GRPC_NOT_FOUND);
  CK(strstr(c.message, "absent") != NULL);
  float x[3] = {1, 2, 3};
  int64_t shape[2] = {1, 4}; /* 4 elements, 12 bytes */
  ProtobufCBinaryData raw;
  cli_call(&c, SVC "ModelInfer", &infer_req("x", x, 3, shape, &raw)->base, NULL);
  CK(c.grpc_status == GRPC_INVALID_ARGUMENT);
  check_echo(&c);
  cli_close(&c);
}

/* RST_STREAM while the prediction runs: dropped, and the next call is served. */
static void client_cancel(fixture *f) {
  cli c;
  cli_open(&c, f->port);
  float x[4] = {1, 2, 3, 4};
  int64_t shape[2] = {1, 4};
  ProtobufCBinaryData raw;
  uint8_t buf[1024];
  size_t n = protobuf_c_message_pack(&infer_req("slow", x, 4, shape, &raw)->base, buf);
  cli_start(&c, SVC "ModelInfer", buf, n, NULL);
  for (int i = 0; i < 5000 && !atomic_load(&slow_running); i++) usleep(1000);
  CK(atomic_load(&slow_running));
  nghttp2_submit_rst_stream(c.h2, NGHTTP2_FLAG_NONE, c.sid, NGHTTP2_CANCEL);
  nghttp2_session_send(c.h2);
  usleep(50 * 1000); /* the server handles the reset while the prediction still runs */
  atomic_store(&slow_release, true);
  check_echo(&c);
  cli_close(&c);
}

static void client_key(fixture *f) {
  cli c;
  cli_open(&c, f->port);
  Inference__ServerLiveRequest lq = INFERENCE__SERVER_LIVE_REQUEST__INIT;
  cli_call(&c, SVC "ServerLive", &lq.base, NULL); /* a probe: no key needed */
  CK(c.grpc_status == 0);
  Inference__ServerMetadataRequest sq = INFERENCE__SERVER_METADATA_REQUEST__INIT;
  cli_call(&c, SVC "ServerMetadata", &sq.base, NULL);
  CK(c.grpc_status == GRPC_UNAUTHENTICATED);
  cli_call(&c, SVC "ServerMetadata", &sq.base, "Bearer wrong");
  CK(c.grpc_status == GRPC_UNAUTHENTICATED);
  cli_call(&c, SVC "ServerMetadata", &sq.base, "Bearer k3y");
  CK(c.grpc_status == 0);
  cli_close(&c);
}

static void client_limit(fixture *f) {
  cli c;
  cli_open(&c, f->port);
  static float x[2048];
  int64_t shape[2] = {1, 2048};
  ProtobufCBinaryData raw;
  cli_call(&c, SVC "ModelInfer", &infer_req("x", x, 2048, shape, &raw)->base, NULL);
  CK(c.grpc_status == GRPC_RESOURCE_EXHAUSTED);
  CK(strstr(c.message, "over the limit") != NULL);
  check_echo(&c);
  cli_close(&c);
}

static void test_basics(void **st) {
  (void)st;
  run(client_basics, NULL, 0);
}
static void test_cancel(void **st) {
  (void)st;
  run(client_cancel, NULL, 0);
}
static void test_key(void **st) {
  (void)st;
  run(client_key, "k3y", 0);
}
static void test_limit(void **st) {
  (void)st;
  run(client_limit, NULL, 4096);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_basics),
      cmocka_unit_test(test_cancel),
      cmocka_unit_test(test_key),
      cmocka_unit_test(test_limit),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
