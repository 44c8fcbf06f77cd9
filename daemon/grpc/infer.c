/* ModelInfer: a ModelInferRequest's tensors (typed contents or raw_input_contents) into the API's
 * prediction queue, the outputs back as raw_output_contents (as Triton answers: little-endian,
 * row-major), on the loop when the prediction ends. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grpc/grpc-impl.h"
#include "servd/tensor.h"

static const struct {
  const char *name;
  servd_dtype dt;
} dtypes[] = {{"FP32", SERVD_F32}, {"FP16", SERVD_F16}, {"BF16", SERVD_BF16}, {"INT32", SERVD_I32}};

static const char *dtype_name(servd_dtype dt) {
  for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
    if (dtypes[i].dt == dt) return dtypes[i].name;
  return NULL;
}

static int dtype_of(const char *name, servd_dtype *dt) {
  for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
    if (strcmp(dtypes[i].name, name) == 0) return *dt = dtypes[i].dt, 0;
  return -1;
}

static void inputs_free(servd_named_tensor *in, int n) {
  for (int i = 0; i < n; i++) servd_tensor_release(in[i].tensor);
  free(in);
}

#define FAIL(...) (snprintf(msg, cap, __VA_ARGS__), rc = GRPC_INVALID_ARGUMENT)

int grpc_infer_inputs(const Inference__ModelInferRequest *req, servd_named_tensor **out, int *n_out, char *msg,
                      size_t cap) {
  *out = NULL;
  *n_out = 0;
  int rc = 0;
  size_t n = req->n_inputs;
  if (n == 0) return FAIL("'inputs' must name at least one tensor");
  if (n > 256) return FAIL("at most 256 inputs, got %zu", n);
  if (req->n_raw_input_contents != 0 && req->n_raw_input_contents != n)
    return FAIL("raw_input_contents has %zu entries for %zu inputs: give one per input or none",
                req->n_raw_input_contents, n);
  servd_named_tensor *in = calloc(n, sizeof *in);
  if (!in) return snprintf(msg, cap, "out of memory"), GRPC_RESOURCE_EXHAUSTED;
  for (size_t i = 0; i < n && rc == 0; i++) {
    const Inference__ModelInferRequest__InferInputTensor *t = req->inputs[i];
    const char *name = t->name;
    if (!name[0] || strlen(name) >= sizeof in[i].name) {
      FAIL("inputs[%zu]: 'name' must be 1 to %zu bytes", i, sizeof in[i].name - 1);
      break;
    }
    for (size_t k = 0; k < i; k++)
      if (strcmp(in[k].name, name) == 0) FAIL("input '%s' is given twice", name);
    if (rc) break;
    servd_dtype dt;
    if (dtype_of(t->datatype, &dt) != 0) {
      FAIL("input '%s': datatype '%.32s' is not supported (FP32, FP16, BF16, INT32)", name, t->datatype);
      break;
    }
    if (t->n_shape > SERVD_MAX_DIMS) {
      FAIL("input '%s': at most %d dimensions, got %zu", name, SERVD_MAX_DIMS, t->n_shape);
      break;
    }
    int64_t shape[SERVD_MAX_DIMS];
    int64_t numel = 1;
    for (size_t d = 0; d < t->n_shape && rc == 0; d++) {
      if (t->shape[d] < 0) FAIL("input '%s': shape[%zu] is negative", name, d);
      shape[d] = t->shape[d];
      if (shape[d] > (1ll << 31) || (numel *= shape[d]) > (1ll << 31)) FAIL("input '%s': too many elements", name);
    }
    if (rc) break;
    size_t es = servd_dtype_block_bytes(dt);
    size_t bytes = (size_t)numel * es;
    const Inference__InferTensorContents *tc = t->contents;
    const void *src = NULL;
    if (req->n_raw_input_contents) {
      if (tc) {
        FAIL("input '%s': give its data in 'contents' or in raw_input_contents, not both", name);
        break;
      }
      if (req->raw_input_contents[i].len != bytes) {
        FAIL("input '%s': raw_input_contents[%zu] holds %zu bytes but %lld %s elements need %zu", name, i,
             req->raw_input_contents[i].len, (long long)numel, t->datatype, bytes);
        break;
      }
      src = req->raw_input_contents[i].data;
    } else if (dt == SERVD_F32) {
      if (!tc || tc->n_fp32_contents != (size_t)numel) {
        FAIL("input '%s': shape holds %lld elements but contents.fp32_contents has %zu", name, (long long)numel,
             tc ? tc->n_fp32_contents : 0);
        break;
      }
      src = tc->fp32_contents;
    } else if (dt == SERVD_I32) {
      if (!tc || tc->n_int_contents != (size_t)numel) {
        FAIL("input '%s': shape holds %lld elements but contents.int_contents has %zu", name, (long long)numel,
             tc ? tc->n_int_contents : 0);
        break;
      }
      src = tc->int_contents;
    } else {
      FAIL("input '%s': %s data must be sent in raw_input_contents", name, t->datatype);
      break;
    }
    servd_tensor *x = servd_tensor_new(dt, (int)t->n_shape, shape);
    if (!x) {
      snprintf(msg, cap, "input '%s': out of memory", name);
      rc = GRPC_RESOURCE_EXHAUSTED;
      break;
    }
    if (bytes) memcpy(servd_tensor_data(x), src, bytes); /* new tensors are contiguous */
    snprintf(in[i].name, sizeof in[i].name, "%s", name);
    in[i].tensor = x;
  }
  if (rc) {
    inputs_free(in, (int)n);
    return rc;
  }
  *out = in;
  *n_out = (int)n;
  return 0;
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

/* The deadline of the call: grpc-timeout, else Triton's "timeout" parameter (microseconds), else the
 * server's default; the earliest when several are given. */
static int64_t deadline_of(grpc_call *c, const Inference__ModelInferRequest *q) {
  int64_t ms = c->timeout_ms >= 0 ? c->timeout_ms : 0;
  for (size_t i = 0; i < q->n_parameters; i++) {
    const Inference__ModelInferRequest__ParametersEntry *e = q->parameters[i];
    if (strcmp(e->key, "timeout") == 0 && e->value &&
        e->value->parameter_choice_case == INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_INT64_PARAM &&
        e->value->int64_param > 0) {
      int64_t t = (e->value->int64_param + 999) / 1000;
      if (ms == 0 || t < ms) ms = t;
    }
  }
  if (ms == 0) ms = servd_api_default_deadline(c->api);
  return ms;
}

void grpc_model_infer(grpc_call *c, const uint8_t *msg, size_t len) {
  Inference__ModelInferRequest *q = inference__model_infer_request__unpack(NULL, len, msg);
  if (!q) {
    grpc_fail(c, GRPC_INVALID_ARGUMENT, "malformed inference.ModelInferRequest message");
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
  int st = servd_api_predict(c->api, q->model_name, q->model_version, in, n_in, deadline_of(c, q), on_done, ic,
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
