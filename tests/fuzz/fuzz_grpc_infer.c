/* libFuzzer: the gRPC ModelInfer decode path, as daemon/grpc runs it on a request message: protobuf-c
 * unpacking of inference.ModelInferRequest, then the input checks and tensor building of
 * grpc_infer_inputs (raw_input_contents sizes, typed contents counts, shapes, names). Also the
 * other request messages the service unpacks, and the grpc-timeout parser on the first bytes. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "grpc/grpc-impl.h"
#include "health.pb-c.h"
#include "servd/tensor.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char tmo[10];
  size_t k = size < sizeof tmo - 1 ? size : sizeof tmo - 1;
  memcpy(tmo, data, k);
  tmo[k] = '\0';
  (void)grpc_timeout_parse(tmo);

  Inference__ModelInferRequest *q = inference__model_infer_request__unpack(NULL, size, data);
  if (q) {
    servd_named_tensor *in = NULL;
    int n = 0;
    char msg[1200];
    if (grpc_infer_inputs(q, &in, &n, msg, sizeof msg) == 0) {
      volatile uint8_t sink = 0;
      for (int i = 0; i < n; i++) {
        size_t nb = servd_tensor_nbytes(in[i].tensor);
        if (nb) sink ^= ((const uint8_t *)servd_tensor_data(in[i].tensor))[nb - 1];
        servd_tensor_release(in[i].tensor);
      }
      free(in);
      (void)sink;
    } else {
      char enc[1024];
      grpc_message_encode(msg, enc, sizeof enc);
    }
    inference__model_infer_request__free_unpacked(q, NULL);
  }
  /* The repository requests carry a map of oneof messages (their parameters). */
  static const ProtobufCMessageDescriptor *const others[] = {
      &inference__model_metadata_request__descriptor,        &grpc__health__v1__health_check_request__descriptor,
      &inference__model_statistics_request__descriptor,      &inference__repository_index_request__descriptor,
      &inference__repository_model_load_request__descriptor, &inference__repository_model_unload_request__descriptor,
  };
  for (size_t i = 0; i < sizeof others / sizeof others[0]; i++) {
    ProtobufCMessage *m = protobuf_c_message_unpack(others[i], NULL, size, data);
    if (m) protobuf_c_message_free_unpacked(m, NULL);
  }
  return 0;
}
