/* A ModelInferRequest's input tensors, from typed contents (FP32: fp32_contents, INT32:
 * int_contents) or raw_input_contents (one entry per input, little-endian, row-major, exactly
 * numel * element size bytes). Apart from infer.c so the fuzz target links only the decode path. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grpc/grpc-impl.h"
#include "servd/tensor.h"

static const struct {
  const char *name;
  servd_dtype dt;
} dtypes[] = {{"FP32", SERVD_F32}, {"FP16", SERVD_F16}, {"BF16", SERVD_BF16}, {"INT32", SERVD_I32}};

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
      shape[d] = t->shape[d];
      if (shape[d] < 0) FAIL("input '%s': shape[%zu] is negative", name, d);
      /* Both factors are at most 2^31 here: the product cannot overflow. */
      else if (shape[d] > (1ll << 31) || (numel *= shape[d]) > (1ll << 31)) FAIL("input '%s': too many elements", name);
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

int64_t grpc_infer_deadline(const Inference__ModelInferRequest *q, int64_t timeout_ms, int64_t default_ms) {
  int64_t ms = timeout_ms >= 0 ? timeout_ms : 0;
  for (size_t i = 0; i < q->n_parameters; i++) {
    const Inference__ModelInferRequest__ParametersEntry *e = q->parameters[i];
    if (strcmp(e->key, "timeout") == 0 && e->value &&
        e->value->parameter_choice_case == INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_INT64_PARAM &&
        e->value->int64_param > 0) {
      int64_t t = (e->value->int64_param + 999) / 1000;
      if (ms == 0 || t < ms) ms = t;
    }
  }
  return ms ? ms : default_ms;
}
