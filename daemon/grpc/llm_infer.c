/* Language models over KServe v2 gRPC, as Triton serves TensorRT-LLM: ModelInfer answers with the
 * whole text_output; ModelStreamInfer (a bidirectional stream) takes any number of requests, each
 * generated at once beside the others, and answers each with a ModelStreamInferResponse per piece
 * of text, then one with parameters.triton_final_response true (Triton's decoupled convention), or
 * with error_message (the stream stays open). Inputs: llm_inputs.c. The client closing the stream
 * (RST_STREAM, a closed connection) cancels every request of it in the engine. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grpc/grpc-impl.h"

typedef struct llm_stream llm_stream;

/* One generation: of a stream, or a unary ModelInfer (st NULL). */
typedef struct llm_req {
  llm_stream *st;
  grpc_call *c;
  struct llm_req *next, *prev; /* st->reqs */
  servd_api_generation *g;
  char *model, *id;
  bool stream;
  int out_ndim;
  char *text; /* whole text (stream false): the prompt first when the client asked for it */
  size_t len, cap;
} llm_req;

struct llm_stream {
  grpc_call *c;
  llm_req *reqs;
  bool half_closed, draining;
};

static void req_free(llm_req *q) {
  if (q->st) {
    if (q->prev) q->prev->next = q->next;
    else q->st->reqs = q->next;
    if (q->next) q->next->prev = q->prev;
  }
  free(q->model);
  free(q->id);
  free(q->text);
  free(q);
}

static int text_append(llm_req *q, const char *s, size_t n) {
  if (q->len + n > q->cap) {
    size_t nc = q->cap ? q->cap * 2 : 256;
    while (nc < q->len + n) nc *= 2;
    char *nb = realloc(q->text, nc);
    if (!nb) return -1;
    q->text = nb;
    q->cap = nc;
  }
  memcpy(q->text + q->len, s, n);
  q->len += n;
  return 0;
}

/* ---- responses --------------------------------------------------------------------------------- */

/* Sends text as text_output (BYTES: a 4-byte little-endian length, then the bytes). A stream's
 * responses carry triton_final_response. */
static void send_text(llm_req *q, const char *text, size_t len, bool final) {
  uint8_t small[4 + 512], *raw = len <= 512 ? small : malloc(4 + len);
  if (!raw) {
    if (q->st) return; /* a piece lost rather than the stream */
    grpc_fail(q->c, GRPC_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  raw[0] = (uint8_t)len;
  raw[1] = (uint8_t)(len >> 8);
  raw[2] = (uint8_t)(len >> 16);
  raw[3] = (uint8_t)(len >> 24);
  if (len) memcpy(raw + 4, text, len);
  int64_t shape[2] = {1, 1};
  Inference__ModelInferResponse__InferOutputTensor out = INFERENCE__MODEL_INFER_RESPONSE__INFER_OUTPUT_TENSOR__INIT;
  Inference__ModelInferResponse__InferOutputTensor *outs[1] = {&out};
  out.name = "text_output";
  out.datatype = "BYTES";
  out.n_shape = (size_t)q->out_ndim;
  out.shape = shape;
  ProtobufCBinaryData rc = {4 + len, raw};
  Inference__InferParameter fv = INFERENCE__INFER_PARAMETER__INIT;
  fv.parameter_choice_case = INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_BOOL_PARAM;
  fv.bool_param = final;
  Inference__ModelInferResponse__ParametersEntry fe = INFERENCE__MODEL_INFER_RESPONSE__PARAMETERS_ENTRY__INIT;
  fe.key = "triton_final_response";
  fe.value = &fv;
  Inference__ModelInferResponse__ParametersEntry *params[1] = {&fe};
  Inference__ModelInferResponse r = INFERENCE__MODEL_INFER_RESPONSE__INIT;
  r.model_name = q->model;
  r.model_version = "1";
  r.id = q->id;
  r.n_outputs = 1;
  r.outputs = outs;
  r.n_raw_output_contents = 1;
  r.raw_output_contents = &rc;
  if (q->st) {
    r.n_parameters = 1;
    r.parameters = params;
    Inference__ModelStreamInferResponse sr = INFERENCE__MODEL_STREAM_INFER_RESPONSE__INIT;
    sr.infer_response = &r;
    grpc_send(q->st->c, &sr.base);
  } else {
    grpc_reply(q->c, &r.base);
  }
  if (raw != small) free(raw);
}

/* An error of one request of a stream: error_message, and the request's id for clients that read
 * the raw responses; the stream goes on. */
static void send_error(llm_stream *st, const char *model, const char *id, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void send_error(llm_stream *st, const char *model, const char *id, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  Inference__ModelInferResponse r = INFERENCE__MODEL_INFER_RESPONSE__INIT;
  r.model_name = (char *)(model ? model : "");
  r.model_version = "1";
  r.id = (char *)(id ? id : "");
  Inference__ModelStreamInferResponse sr = INFERENCE__MODEL_STREAM_INFER_RESPONSE__INIT;
  sr.error_message = msg;
  sr.infer_response = &r;
  grpc_send(st->c, &sr.base);
}

/* ---- the stream -------------------------------------------------------------------------------- */

/* The call ends once the client has sent its last request and every request has its answer (or
 * when draining, once none runs). */
static void stream_maybe_end(llm_stream *st) {
  if (st->reqs || (!st->half_closed && !st->draining)) return;
  grpc_call *c = st->c;
  c->on_cancel = NULL;
  c->on_message = NULL;
  c->on_half_close = NULL;
  c->on_drain = NULL;
  if (st->half_closed) grpc_fail(c, GRPC_OK, "%s", "");
  else grpc_fail(c, GRPC_UNAVAILABLE, "the server is draining");
  free(st);
}

static void on_gen(void *ud, const servd_api_gen_event *ev) {
  llm_req *q = ud;
  if (!ev->final) {
    if (q->stream) send_text(q, ev->text, ev->len, false);
    else if (text_append(q, ev->text, ev->len) != 0) {
      if (q->c) q->c->on_cancel = NULL;
      servd_api_generate_cancel(q->g); /* the final event will not come: answered here */
      q->g = NULL;
      if (q->st) send_error(q->st, q->model, q->id, "out of memory");
      else grpc_fail(q->c, GRPC_RESOURCE_EXHAUSTED, "out of memory");
      goto done;
    }
    return;
  }
  q->g = NULL;
  if (q->c) q->c->on_cancel = NULL;
  if (ev->status != 200) {
    if (q->st) send_error(q->st, q->model, q->id, "%s", ev->message ? ev->message : "the generation failed");
    else grpc_fail(q->c, grpc_code_for_status(ev->status), "%s", ev->message ? ev->message : "the generation failed");
  } else if (q->stream) {
    send_text(q, "", 0, true);
  } else {
    send_text(q, q->text ? q->text : "", q->len, true);
  }
done:;
  llm_stream *st = q->st;
  req_free(q);
  if (st) stream_maybe_end(st);
}

static void on_unary_cancel(grpc_call *c) {
  llm_req *q = c->ctx;
  servd_api_generate_cancel(q->g);
  req_free(q);
}

/* Starts q's generation from the decoded request; 0, or a gRPC code with msg (q not started). */
static int start(llm_req *q, grpc_call *c, const Inference__ModelInferRequest *m, bool stream_default, char *msg,
                 size_t cap) {
  servd_gen_params defaults;
  servd_api_generate_defaults(c->api, m->model_name, &defaults);
  grpc_llm_request r;
  int code = grpc_llm_inputs(m, &defaults, stream_default, &r, msg, cap);
  if (code == 0) {
    q->stream = r.stream && q->st;
    q->out_ndim = r.out_ndim;
    r.gp.deadline_ms = grpc_infer_deadline(m, c->timeout_ms, servd_api_default_deadline(c->api));
    if (!r.exclude_input && !q->stream && text_append(q, (const char *)r.prompt, r.prompt_len) != 0) {
      snprintf(msg, cap, "out of memory");
      code = GRPC_RESOURCE_EXHAUSTED;
    }
  }
  if (code == 0) {
    int st = servd_api_generate(c->api, m->model_name, m->model_version, (const char *)r.prompt, r.prompt_len, &r.gp,
                                on_gen, q, &q->g, msg, cap);
    if (st != 0) code = grpc_code_for_status(st);
  }
  grpc_llm_request_free(&r);
  return code;
}

static llm_req *req_new(llm_stream *st, grpc_call *c, const Inference__ModelInferRequest *m) {
  llm_req *q = calloc(1, sizeof *q);
  if (!q) return NULL;
  q->st = st;
  q->c = st ? NULL : c;
  if (!(q->model = strdup(m->model_name)) || !(q->id = strdup(m->id))) {
    req_free(q);
    return NULL;
  }
  return q;
}

static void on_message(grpc_call *c, const uint8_t *msg, size_t len) {
  llm_stream *st = c->ctx;
  Inference__ModelInferRequest *m = inference__model_infer_request__unpack(NULL, len, msg);
  if (!m) {
    send_error(st, NULL, NULL, "malformed inference.ModelInferRequest message");
    return;
  }
  char err[1200];
  llm_req *q = NULL;
  if (st->draining) {
    send_error(st, m->model_name, m->id, "the server is draining");
  } else if (!servd_api_is_language_model(c->api, m->model_name)) {
    char why[512];
    int s = servd_api_model_status(c->api, m->model_name, m->model_version, why, sizeof why);
    if (s != 200) send_error(st, m->model_name, m->id, "%s", why);
    else
      send_error(st, m->model_name, m->id,
                 "model '%s' is not a language model: ModelStreamInfer serves "
                 "language models (call ModelInfer)",
                 m->model_name);
  } else if (!(q = req_new(st, c, m))) {
    send_error(st, m->model_name, m->id, "out of memory");
  } else {
    q->next = st->reqs;
    if (st->reqs) st->reqs->prev = q;
    st->reqs = q;
    if (start(q, c, m, true, err, sizeof err) != 0) {
      send_error(st, m->model_name, m->id, "%s", err);
      req_free(q);
    }
  }
  inference__model_infer_request__free_unpacked(m, NULL);
}

static void on_half_close(grpc_call *c) {
  llm_stream *st = c->ctx;
  st->half_closed = true;
  stream_maybe_end(st);
}

static void on_drain(grpc_call *c) {
  llm_stream *st = c->ctx;
  st->draining = true;
  stream_maybe_end(st);
}

static void on_stream_cancel(grpc_call *c) {
  llm_stream *st = c->ctx;
  while (st->reqs) {
    servd_api_generate_cancel(st->reqs->g);
    req_free(st->reqs);
  }
  free(st);
}

void grpc_model_stream_infer(grpc_call *c, const uint8_t *msg, size_t len) {
  (void)msg;
  (void)len;
  llm_stream *st = calloc(1, sizeof *st);
  if (!st) {
    grpc_fail(c, GRPC_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  st->c = c;
  c->ctx = st;
  c->on_message = on_message;
  c->on_half_close = on_half_close;
  c->on_cancel = on_stream_cancel;
  c->on_drain = on_drain;
}

void grpc_llm_infer(grpc_call *c, const Inference__ModelInferRequest *m) {
  char err[1200];
  llm_req *q = req_new(NULL, c, m);
  if (!q) {
    grpc_fail(c, GRPC_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  int code = start(q, c, m, false, err, sizeof err);
  if (code != 0) {
    grpc_fail(c, code, "%s", err);
    req_free(q);
    return;
  }
  c->ctx = q;
  c->on_cancel = on_unary_cancel;
}
