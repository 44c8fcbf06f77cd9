/* A language-model request from a ModelInferRequest, with the inputs of TensorRT-LLM's Triton
 * ensemble, so that a client written for it works unchanged: text_input (BYTES, one element),
 * max_tokens, stream, temperature, top_p, top_k, random_seed, repetition_penalty,
 * presence_penalty, frequency_penalty, end_id, stop_words, bad_words (empty only), beam_width (1
 * only), exclude_input_in_output, and pad_id and the return_* flags when false (accepted, unused).
 * Values come as typed contents or raw_input_contents (BYTES raw: 4-byte little-endian length, then
 * the bytes, per element). Any other input is INVALID_ARGUMENT, as Triton answers an unknown input. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grpc/grpc-impl.h"

#define MAX_STOP 16

typedef const Inference__ModelInferRequest__InferInputTensor in_tensor;

/* One input as its values are read: the tensor and its raw bytes, if given that way. */
typedef struct in_ref {
  in_tensor *t;
  const ProtobufCBinaryData *raw;
  int64_t numel;
} in_ref;

#define FAIL(...) (snprintf(msg, cap, __VA_ARGS__), GRPC_INVALID_ARGUMENT)

static uint32_t le32(const uint8_t *p) {
  return p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t le64(const uint8_t *p) { return le32(p) | (uint64_t)le32(p + 4) << 32; }

/* A scalar input: one element whatever its shape ([1], [1, 1]). */
static int scalar_check(const in_ref *r, size_t esize, size_t n_typed, char *msg, size_t cap) {
  if (r->numel != 1) return FAIL("input '%s' must hold one element (shape [1] or [1, 1])", r->t->name);
  if (r->raw ? r->raw->len != esize : n_typed != 1)
    return FAIL("input '%s': %s holds the wrong number of bytes or elements", r->t->name,
                r->raw ? "raw_input_contents" : "contents");
  return 0;
}

static int read_f32(const in_ref *r, float *v, char *msg, size_t cap) {
  if (strcmp(r->t->datatype, "FP32") != 0) return FAIL("input '%s' must be FP32", r->t->name);
  int rc = scalar_check(r, 4, r->t->contents ? r->t->contents->n_fp32_contents : 0, msg, cap);
  if (rc) return rc;
  if (r->raw) {
    uint32_t b = le32(r->raw->data);
    memcpy(v, &b, 4);
  } else {
    *v = r->t->contents->fp32_contents[0];
  }
  if (!isfinite(*v)) return FAIL("input '%s' must be a finite number", r->t->name);
  return 0;
}

/* INT32, INT64, UINT32 or UINT64; *v is the value's 64 bits (UINT64 beyond INT64_MAX reads negative). */
static int read_int(const in_ref *r, int64_t *v, char *msg, size_t cap) {
  const char *dt = r->t->datatype;
  const Inference__InferTensorContents *tc = r->t->contents;
  int rc;
  if (!strcmp(dt, "INT32") || !strcmp(dt, "UINT32")) {
    bool u = dt[0] == 'U';
    if ((rc = scalar_check(r, 4, tc ? (u ? tc->n_uint_contents : tc->n_int_contents) : 0, msg, cap))) return rc;
    if (r->raw) *v = u ? (int64_t)le32(r->raw->data) : (int64_t)(int32_t)le32(r->raw->data);
    else *v = u ? (int64_t)tc->uint_contents[0] : tc->int_contents[0];
    return 0;
  }
  if (!strcmp(dt, "INT64") || !strcmp(dt, "UINT64")) {
    bool u = dt[0] == 'U';
    if ((rc = scalar_check(r, 8, tc ? (u ? tc->n_uint64_contents : tc->n_int64_contents) : 0, msg, cap))) return rc;
    if (r->raw) *v = (int64_t)le64(r->raw->data);
    else *v = u ? (int64_t)tc->uint64_contents[0] : tc->int64_contents[0];
    return 0;
  }
  return FAIL("input '%s' must be an integer (INT32, INT64, UINT32 or UINT64)", r->t->name);
}

static int read_bool(const in_ref *r, bool *v, char *msg, size_t cap) {
  if (strcmp(r->t->datatype, "BOOL") != 0) return FAIL("input '%s' must be BOOL", r->t->name);
  int rc = scalar_check(r, 1, r->t->contents ? r->t->contents->n_bool_contents : 0, msg, cap);
  if (rc) return rc;
  *v = r->raw ? r->raw->data[0] != 0 : r->t->contents->bool_contents[0];
  return 0;
}

/* BYTES elements: up to max of them into s[] / n[] (borrowed from the request); *k their count. */
static int read_bytes(const in_ref *r, const uint8_t **s, size_t *n, int max, int *k, char *msg, size_t cap) {
  if (strcmp(r->t->datatype, "BYTES") != 0) return FAIL("input '%s' must be BYTES", r->t->name);
  if (r->numel > max) return FAIL("input '%s': at most %d elements, got %lld", r->t->name, max, (long long)r->numel);
  *k = (int)r->numel;
  if (!r->raw) {
    const Inference__InferTensorContents *tc = r->t->contents;
    if ((tc ? (int64_t)tc->n_bytes_contents : 0) != r->numel)
      return FAIL("input '%s': contents holds the wrong number of elements", r->t->name);
    for (int i = 0; i < *k; i++) {
      s[i] = tc->bytes_contents[i].data;
      n[i] = tc->bytes_contents[i].len;
    }
    return 0;
  }
  size_t off = 0, len = r->raw->len;
  for (int i = 0; i < *k; i++) {
    if (len - off < 4) return FAIL("input '%s': raw_input_contents is truncated", r->t->name);
    uint32_t l = le32(r->raw->data + off);
    off += 4;
    if (len - off < l) return FAIL("input '%s': raw_input_contents is truncated", r->t->name);
    s[i] = r->raw->data + off;
    n[i] = l;
    off += l;
  }
  if (off != len) return FAIL("input '%s': raw_input_contents holds bytes past its elements", r->t->name);
  return 0;
}

void grpc_llm_request_free(grpc_llm_request *r) {
  for (int i = 0; i < r->gp.n_stop; i++) free(r->stop[i]);
  r->gp.n_stop = 0;
}

int grpc_llm_inputs(const Inference__ModelInferRequest *q, const servd_gen_params *defaults, bool stream_default,
                    grpc_llm_request *r, char *msg, size_t cap) {
  memset(r, 0, sizeof *r);
  r->gp = *defaults;
  r->gp.stop = (const char *const *)r->stop;
  r->gp.n_stop = 0;
  r->gp.stop_token_ids = NULL;
  r->gp.n_stop_token_ids = 0;
  r->stream = stream_default;
  r->exclude_input = true;
  r->out_ndim = 1;
  if (q->n_raw_input_contents != 0 && q->n_raw_input_contents != q->n_inputs)
    return FAIL("raw_input_contents has %zu entries for %zu inputs: give one per input or none",
                q->n_raw_input_contents, q->n_inputs);
  bool have_text = false;
  int rc = 0;
  for (size_t i = 0; i < q->n_inputs && rc == 0; i++) {
    in_ref in = {q->inputs[i], q->n_raw_input_contents ? &q->raw_input_contents[i] : NULL, 1};
    const char *name = in.t->name;
    for (size_t d = 0; d < in.t->n_shape; d++) {
      if (in.t->shape[d] < 0 || in.t->shape[d] > 1024) return FAIL("input '%s': bad shape", name);
      in.numel *= in.t->shape[d];
    }
    for (size_t k = 0; k < i; k++)
      if (strcmp(q->inputs[k]->name, name) == 0) return FAIL("input '%s' is given twice", name);
    int64_t iv;
    float fv;
    bool bv;
    const uint8_t *s[MAX_STOP];
    size_t n[MAX_STOP];
    int k;
    if (!strcmp(name, "text_input")) {
      if ((rc = read_bytes(&in, s, n, 1, &k, msg, cap))) break;
      if (k != 1) return FAIL("input 'text_input' must hold one string (shape [1] or [1, 1])");
      r->prompt = s[0];
      r->prompt_len = n[0];
      r->out_ndim = in.t->n_shape == 2 ? 2 : 1;
      have_text = true;
    } else if (!strcmp(name, "max_tokens")) {
      if ((rc = read_int(&in, &iv, msg, cap))) break;
      if (iv < 1 || iv > 16777216) return FAIL("input 'max_tokens' must be in [1, 16777216], got %lld", (long long)iv);
      r->gp.max_tokens = (int)iv;
    } else if (!strcmp(name, "stream")) {
      rc = read_bool(&in, &r->stream, msg, cap);
    } else if (!strcmp(name, "exclude_input_in_output")) {
      rc = read_bool(&in, &r->exclude_input, msg, cap);
    } else if (!strcmp(name, "temperature")) {
      if ((rc = read_f32(&in, &fv, msg, cap))) break;
      if (fv < 0 || fv > 100) return FAIL("input 'temperature' must be in [0, 100], got %g", fv);
      r->gp.temperature = fv;
    } else if (!strcmp(name, "top_p")) {
      if ((rc = read_f32(&in, &fv, msg, cap))) break;
      if (fv <= 0 || fv > 1) return FAIL("input 'top_p' must be in (0, 1], got %g", fv);
      r->gp.top_p = fv;
    } else if (!strcmp(name, "top_k")) {
      if ((rc = read_int(&in, &iv, msg, cap))) break;
      if (iv < 0 || iv > 1048576) return FAIL("input 'top_k' must be in [0, 1048576], got %lld", (long long)iv);
      r->gp.top_k = (int)iv;
    } else if (!strcmp(name, "random_seed") || !strcmp(name, "seed")) {
      if ((rc = read_int(&in, &iv, msg, cap))) break;
      r->gp.has_seed = true;
      r->gp.seed = (uint64_t)iv;
    } else if (!strcmp(name, "repetition_penalty")) {
      if ((rc = read_f32(&in, &fv, msg, cap))) break;
      if (fv <= 0 || fv > 10) return FAIL("input 'repetition_penalty' must be in (0, 10], got %g", fv);
      r->gp.repetition_penalty = fv;
    } else if (!strcmp(name, "presence_penalty") || !strcmp(name, "frequency_penalty")) {
      if ((rc = read_f32(&in, &fv, msg, cap))) break;
      if (fv < -2 || fv > 2) return FAIL("input '%s' must be in [-2, 2], got %g", name, fv);
      *(name[0] == 'p' ? &r->gp.presence_penalty : &r->gp.frequency_penalty) = fv;
    } else if (!strcmp(name, "end_id")) {
      if ((rc = read_int(&in, &iv, msg, cap))) break;
      if (iv < 0 || iv > INT32_MAX) return FAIL("input 'end_id' must be a token id, got %lld", (long long)iv);
      r->end_id = (int32_t)iv;
      r->gp.stop_token_ids = &r->end_id;
      r->gp.n_stop_token_ids = 1;
    } else if (!strcmp(name, "stop_words")) {
      if ((rc = read_bytes(&in, s, n, MAX_STOP, &k, msg, cap))) break;
      for (int j = 0; j < k; j++) {
        if (n[j] == 0) continue;
        if (!(r->stop[r->gp.n_stop] = strndup((const char *)s[j], n[j]))) {
          snprintf(msg, cap, "out of memory");
          return GRPC_RESOURCE_EXHAUSTED;
        }
        r->gp.n_stop++;
      }
    } else if (!strcmp(name, "bad_words")) {
      if ((rc = read_bytes(&in, s, n, MAX_STOP, &k, msg, cap))) break;
      for (int j = 0; j < k; j++)
        if (n[j]) return FAIL("input 'bad_words' is not supported (give it empty or leave it out)");
    } else if (!strcmp(name, "beam_width")) {
      if ((rc = read_int(&in, &iv, msg, cap))) break;
      if (iv != 1) return FAIL("input 'beam_width' must be 1 (beam search is not supported)");
    } else if (!strcmp(name, "pad_id")) {
      rc = read_int(&in, &iv, msg, cap); /* padding is the engine's business */
    } else if (!strncmp(name, "return_", 7)) {
      if ((rc = read_bool(&in, &bv, msg, cap))) break;
      if (bv) return FAIL("input '%s' is not supported (false only)", name);
    } else {
      return FAIL("unexpected input '%s' for a language model (text_input, max_tokens, stream, temperature, top_p, "
                  "top_k, random_seed, stop_words, ...)",
                  name);
    }
  }
  if (rc) return rc;
  if (!have_text) return FAIL("a language model needs the input 'text_input' (BYTES, shape [1])");
  return 0;
}
