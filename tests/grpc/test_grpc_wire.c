/* The gRPC wire helpers and ModelInferRequest decoding, without a socket: grpc-timeout units and
 * rounding, grpc-message percent-encoding, and the input checks (raw sizes, typed counts, datatypes,
 * names, shapes) on messages packed by protobuf-c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "grpc/grpc-impl.h"
#include "servd/tensor.h"

static void test_timeout(void **st) {
  (void)st;
  assert_int_equal(grpc_timeout_parse("5S"), 5000);
  assert_int_equal(grpc_timeout_parse("2M"), 120000);
  assert_int_equal(grpc_timeout_parse("1H"), 3600000);
  assert_int_equal(grpc_timeout_parse("250m"), 250);
  assert_int_equal(grpc_timeout_parse("1u"), 1); /* rounded up: never 0 for a positive timeout */
  assert_int_equal(grpc_timeout_parse("1500000n"), 2);
  assert_int_equal(grpc_timeout_parse("0m"), 0);
  assert_int_equal(grpc_timeout_parse("99999999S"), 99999999000ll);
  assert_int_equal(grpc_timeout_parse("123456789S"), -1); /* more than 8 digits */
  assert_int_equal(grpc_timeout_parse("S"), -1);
  assert_int_equal(grpc_timeout_parse("5"), -1);
  assert_int_equal(grpc_timeout_parse("5x"), -1);
  assert_int_equal(grpc_timeout_parse("-5S"), -1);
  assert_int_equal(grpc_timeout_parse(NULL), -1);
}

static void test_message_encode(void **st) {
  (void)st;
  char out[64];
  grpc_message_encode("model 'm' is 100% done\n", out, sizeof out);
  assert_string_equal(out, "model 'm' is 100%25 done%0A");
  grpc_message_encode("\xc3\xa9", out, sizeof out);
  assert_string_equal(out, "%C3%A9");
  grpc_message_encode("abcdef", out, 4); /* cut, still terminated */
  assert_string_equal(out, "abc");
  grpc_message_encode("a\nb", out, 4); /* an escape is never split */
  assert_string_equal(out, "a");
}

/* A request with one input x of shape (2, 3) and datatype dt. */
typedef struct req {
  Inference__ModelInferRequest r;
  Inference__ModelInferRequest__InferInputTensor t, *tp;
  Inference__InferTensorContents c;
  int64_t shape[2];
  float f[6];
  ProtobufCBinaryData raw;
} req;

static void req_init(req *q, const char *dt) {
  Inference__ModelInferRequest r0 = INFERENCE__MODEL_INFER_REQUEST__INIT;
  Inference__ModelInferRequest__InferInputTensor t0 = INFERENCE__MODEL_INFER_REQUEST__INFER_INPUT_TENSOR__INIT;
  Inference__InferTensorContents c0 = INFERENCE__INFER_TENSOR_CONTENTS__INIT;
  memset(q, 0, sizeof *q);
  q->r = r0;
  q->t = t0;
  q->c = c0;
  q->shape[0] = 2;
  q->shape[1] = 3;
  for (int i = 0; i < 6; i++) q->f[i] = (float)i + 0.5f;
  q->t.name = "x";
  q->t.datatype = (char *)dt;
  q->t.n_shape = 2;
  q->t.shape = q->shape;
  q->tp = &q->t;
  q->r.model_name = "m";
  q->r.n_inputs = 1;
  q->r.inputs = &q->tp;
}

/* Packs and unpacks q, as the wire does, and decodes its inputs. */
static int decode(req *q, servd_named_tensor **in, int *n, char *msg) {
  size_t len = protobuf_c_message_get_packed_size(&q->r.base);
  uint8_t *buf = malloc(len + 1);
  protobuf_c_message_pack(&q->r.base, buf);
  Inference__ModelInferRequest *u = inference__model_infer_request__unpack(NULL, len, buf);
  assert_non_null(u);
  int rc = grpc_infer_inputs(u, in, n, msg, 512);
  inference__model_infer_request__free_unpacked(u, NULL);
  free(buf);
  return rc;
}

static void free_inputs(servd_named_tensor *in, int n) {
  for (int i = 0; i < n; i++) servd_tensor_release(in[i].tensor);
  free(in);
}

static void test_inputs_raw_and_typed(void **st) {
  (void)st;
  req q;
  servd_named_tensor *in;
  int n;
  char msg[512];
  req_init(&q, "FP32");
  q.raw.data = (uint8_t *)q.f;
  q.raw.len = sizeof q.f;
  q.r.n_raw_input_contents = 1;
  q.r.raw_input_contents = &q.raw;
  assert_int_equal(decode(&q, &in, &n, msg), 0);
  assert_int_equal(n, 1);
  assert_string_equal(in[0].name, "x");
  assert_int_equal(in[0].tensor->ndim, 2);
  assert_int_equal(in[0].tensor->shape[1], 3);
  assert_memory_equal(servd_tensor_data(in[0].tensor), q.f, sizeof q.f);
  free_inputs(in, n);

  q.raw.len = sizeof q.f - 4; /* one element short */
  assert_int_equal(decode(&q, &in, &n, msg), GRPC_INVALID_ARGUMENT);
  assert_non_null(strstr(msg, "holds 20 bytes"));

  req_init(&q, "FP32");
  q.c.n_fp32_contents = 6;
  q.c.fp32_contents = q.f;
  q.t.contents = &q.c;
  assert_int_equal(decode(&q, &in, &n, msg), 0);
  assert_memory_equal(servd_tensor_data(in[0].tensor), q.f, sizeof q.f);
  free_inputs(in, n);
  q.c.n_fp32_contents = 5;
  assert_int_equal(decode(&q, &in, &n, msg), GRPC_INVALID_ARGUMENT);
  assert_non_null(strstr(msg, "6 elements"));
}

static void test_inputs_refused(void **st) {
  (void)st;
  req q;
  servd_named_tensor *in;
  int n;
  char msg[512];
  req_init(&q, "INT64");
  assert_int_equal(decode(&q, &in, &n, msg), GRPC_INVALID_ARGUMENT);
  assert_non_null(strstr(msg, "FP32, FP16, BF16, INT32"));
  req_init(&q, "FP16"); /* no typed field carries FP16 */
  assert_int_equal(decode(&q, &in, &n, msg), GRPC_INVALID_ARGUMENT);
  assert_non_null(strstr(msg, "raw_input_contents"));
  req_init(&q, "FP32");
  q.shape[0] = -1;
  assert_int_equal(decode(&q, &in, &n, msg), GRPC_INVALID_ARGUMENT);
  req_init(&q, "FP32");
  q.shape[0] = 1ll << 20;
  q.shape[1] = 1ll << 20;
  assert_int_equal(decode(&q, &in, &n, msg), GRPC_INVALID_ARGUMENT);
  assert_non_null(strstr(msg, "too many elements"));
  req_init(&q, "FP32");
  q.r.n_inputs = 0;
  assert_int_equal(decode(&q, &in, &n, msg), GRPC_INVALID_ARGUMENT);
  req_init(&q, "FP32");
  q.t.name = "";
  assert_int_equal(decode(&q, &in, &n, msg), GRPC_INVALID_ARGUMENT);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_timeout),
      cmocka_unit_test(test_message_encode),
      cmocka_unit_test(test_inputs_raw_and_typed),
      cmocka_unit_test(test_inputs_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
