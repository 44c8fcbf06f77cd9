/* ModelInfer: a ModelInferRequest's tensors (infer_inputs.c) into the API's prediction queue, the
 * outputs back as raw_output_contents (as Triton answers: little-endian,
 * row-major), on the loop when the prediction ends. A language model's request is llm_infer.c's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grpc/grpc-impl.h"
#include "servd/tensor.h"

static const struct {
  const char *name;
  servd_dtype dt;
} dtypes[] = {{"FP32", SERVD_F32}, {"FP16", SERVD_F16}, {"BF16", SERVD_BF16}, {"INT32", SERVD_I32}};

static void inputs_free(servd_named_tensor *in, int n) {
  for (int i = 0; i < n; i++) servd_tensor_release(in[i].tensor);
  free(in);
}

static const char *dtype_name(servd_dtype dt) {
  for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
    if (dtypes[i].dt == dt) return dtypes[i].name;
  return NULL;
}

/* ---- the call ---------------------------------------------------------------------------------- */

typedef struct infer_call {
  grpc_call *c;
  servd_api_prediction *p;
  char *model, *id;
  char **wanted; /* requested outputs; NULL: all */
  size_t n_wanted;
} infer_call;

static void call_free(infer_call *ic) {
  free(ic->model);
  free(ic->id);
  for (size_t i = 0; i < ic->n_wanted; i++) free(ic->wanted[i]);
  free(ic->wanted);
  free(ic);
}

static void on_cancel(grpc_call *c) {
  infer_call *ic = c->ctx;
  servd_api_predict_abandon(ic->p);
  call_free(ic);
}

static bool is_wanted(const infer_call *ic, const char *name) {
  if (!ic->wanted) return true;
  for (size_t i = 0; i < ic->n_wanted; i++)
    if (strcmp(ic->wanted[i], name) == 0) return true;
  return false;
}

/* Row-major copy of t (outer strides may be anything; the innermost dimension is contiguous). */
static void copy_out(const servd_tensor *t, uint8_t *dst) {
  size_t es = servd_dtype_block_bytes(t->dtype);
  if (t->ndim == 0) {
    memcpy(dst, servd_tensor_data(t), es);
    return;
  }
  size_t row = (size_t)t->shape[t->ndim - 1] * es;
  int64_t rows = servd_tensor_numel(t) / (t->shape[t->ndim - 1] ? t->shape[t->ndim - 1] : 1);
  if (t->shape[t->ndim - 1] == 0) return;
  const uint8_t *base = servd_tensor_data(t);
  int64_t idx[SERVD_MAX_DIMS] = {0};
  for (int64_t r = 0; r < rows; r++) {
    size_t off = 0;
    for (int d = 0; d + 1 < t->ndim; d++) off += (size_t)(idx[d] * t->strides[d]);
    memcpy(dst + (size_t)r * row, base + off, row);
    for (int d = t->ndim - 2; d >= 0; d--) {
      if (++idx[d] < t->shape[d]) break;
      idx[d] = 0;
    }
  }
}

static void on_done(void *ud, int status, const char *message, servd_named_tensor *out, int n_out) {
  infer_call *ic = ud;
  grpc_call *c = ic->c;
  c->on_cancel = NULL;
  Inference__ModelInferResponse r = INFERENCE__MODEL_INFER_RESPONSE__INIT;
  Inference__ModelInferResponse__InferOutputTensor *ts = NULL, **tp = NULL;
  ProtobufCBinaryData *raw = NULL;
  if (status != 200) {
    grpc_fail(c, grpc_code_for_status(status), "%s", message);
    goto done;
  }
  for (size_t i = 0; i < ic->n_wanted; i++) {
    bool found = false;
    for (int k = 0; k < n_out; k++) found |= strcmp(out[k].name, ic->wanted[i]) == 0;
    if (!found) {
      grpc_fail(c, GRPC_INVALID_ARGUMENT, "requested output '%s' is not produced by model '%s'", ic->wanted[i],
                ic->model);
      goto done;
    }
  }
  ts = calloc((size_t)n_out + 1, sizeof *ts);
  tp = calloc((size_t)n_out + 1, sizeof *tp);
  raw = calloc((size_t)n_out + 1, sizeof *raw);
  if (!ts || !tp || !raw) {
    grpc_fail(c, GRPC_RESOURCE_EXHAUSTED, "out of memory");
    goto done;
  }
  size_t k = 0;
  for (int i = 0; i < n_out; i++) {
    servd_tensor *t = out[i].tensor;
    if (!is_wanted(ic, out[i].name)) continue;
    const char *dn = t ? dtype_name(t->dtype) : NULL;
    if (!dn || t->device >= 0) {
      grpc_fail(c, GRPC_INTERNAL, "model '%s' returned output '%s' of a type the protocol cannot carry", ic->model,
                out[i].name);
      goto done;
    }
    Inference__ModelInferResponse__InferOutputTensor init = INFERENCE__MODEL_INFER_RESPONSE__INFER_OUTPUT_TENSOR__INIT;
    ts[k] = init;
    ts[k].name = out[i].name;
    ts[k].datatype = (char *)dn;
    ts[k].n_shape = (size_t)t->ndim;
    ts[k].shape = (int64_t *)t->shape;
    size_t bytes = (size_t)servd_tensor_numel(t) * servd_dtype_block_bytes(t->dtype);
    raw[k].len = bytes;
    raw[k].data = malloc(bytes ? bytes : 1);
    if (!raw[k].data) {
      grpc_fail(c, GRPC_RESOURCE_EXHAUSTED, "out of memory");
      goto done;
    }
    copy_out(t, raw[k].data);
    tp[k] = &ts[k];
    k++;
  }
  r.model_name = ic->model;
  r.model_version = "1";
  r.id = ic->id;
  r.n_outputs = k;
  r.outputs = tp;
  r.n_raw_output_contents = k;
  r.raw_output_contents = raw;
  grpc_reply(c, &r.base);
done:
  for (int i = 0; raw && i <= n_out; i++) free(raw[i].data);
  free(raw);
  free(tp);
  free(ts);
  for (int i = 0; i < n_out; i++) servd_tensor_release(out[i].tensor);
  free(out);
  call_free(ic);
}

void grpc_model_infer(grpc_call *c, const uint8_t *msg, size_t len) {
  Inference__ModelInferRequest *q = inference__model_infer_request__unpack(NULL, len, msg);
  if (!q) {
    grpc_fail(c, GRPC_INVALID_ARGUMENT, "malformed inference.ModelInferRequest message");
    return;
  }
  if (servd_api_is_language_model(c->api, q->model_name)) { /* text_input to text_output: llm_infer.c */
    grpc_llm_infer(c, q);
    inference__model_infer_request__free_unpacked(q, NULL);
    return;
  }
  char err[1200];
  servd_named_tensor *in = NULL;
  int n_in = 0;
  infer_call *ic = NULL;
  int code = grpc_infer_inputs(q, &in, &n_in, err, sizeof err);
  if (code != 0) {
    grpc_fail(c, code, "%s", err);
    goto done;
  }
  ic = calloc(1, sizeof *ic);
  if (!ic || !(ic->model = strdup(q->model_name)) || !(ic->id = strdup(q->id))) goto oom;
  if (q->n_outputs) {
    if (!(ic->wanted = calloc(q->n_outputs, sizeof *ic->wanted))) goto oom;
    for (; ic->n_wanted < q->n_outputs; ic->n_wanted++)
      if (!(ic->wanted[ic->n_wanted] = strdup(q->outputs[ic->n_wanted]->name))) goto oom;
  }
  ic->c = c;
  int st = servd_api_predict(c->api, q->model_name, q->model_version, in, n_in,
                             grpc_infer_deadline(q, c->timeout_ms, servd_api_default_deadline(c->api)), on_done, ic,
                             &ic->p, err, sizeof err);
  in = NULL; /* taken whatever the outcome */
  if (st != 0) {
    grpc_fail(c, grpc_code_for_status(st), "%s", err);
    goto done;
  }
  c->ctx = ic;
  c->on_cancel = on_cancel;
  ic = NULL;
  goto done;
oom:
  grpc_fail(c, GRPC_RESOURCE_EXHAUSTED, "out of memory");
done:
  if (in) inputs_free(in, n_in);
  if (ic) call_free(ic);
  inference__model_infer_request__free_unpacked(q, NULL);
}
