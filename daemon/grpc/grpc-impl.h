/* Internal to daemon/grpc: one call (an HTTP/2 stream) as the method handlers see it, and the wire
 * helpers (wire.c) the tests and the fuzz target use too. */
#ifndef SERVD_GRPC_IMPL_H
#define SERVD_GRPC_IMPL_H

#include <protobuf-c/protobuf-c.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "api/frontend.h"
#include "grpc/grpc.h"
#include "grpc_service.pb-c.h" /* generated from proto/grpc_service.proto */

/* gRPC status codes (grpc/status.h). */
enum {
  GRPC_OK = 0,
  GRPC_CANCELLED = 1,
  GRPC_UNKNOWN = 2,
  GRPC_INVALID_ARGUMENT = 3,
  GRPC_DEADLINE_EXCEEDED = 4,
  GRPC_NOT_FOUND = 5,
  GRPC_RESOURCE_EXHAUSTED = 8,
  GRPC_FAILED_PRECONDITION = 9,
  GRPC_UNIMPLEMENTED = 12,
  GRPC_INTERNAL = 13,
  GRPC_UNAVAILABLE = 14,
  GRPC_UNAUTHENTICATED = 16,
};

typedef struct grpc_call grpc_call;

struct grpc_call {
  servd_api *api;
  uv_loop_t *loop;
  const char *authorization; /* metadata value or NULL; valid until the call ends */
  int64_t timeout_ms;        /* from grpc-timeout; -1: none */
  /* Set by an asynchronous handler: called once when the stream goes away (RST_STREAM, a closed
   * connection, or the end of a streaming call) unless the handler cleared it first (before its
   * answer); the handler must then drop the call. */
  void (*on_cancel)(grpc_call *c);
  /* Set by a long-lived handler: called when the server starts draining (stops accepting). */
  void (*on_drain)(grpc_call *c);
  /* Client streaming methods: set by the handler when the call opens; on_message gets each request
   * message as it arrives (valid only during the call), on_half_close the client's END_STREAM. */
  void (*on_message)(grpc_call *c, const uint8_t *msg, size_t len);
  void (*on_half_close)(grpc_call *c);
  void *ctx;
  void *stream_; /* internal */
};

/* A method: `/package.Service/Method` and its handler. The handler answers now or later (on the
 * loop) with grpc_reply or grpc_fail (a streaming handler: grpc_send, then grpc_fail); msg (the request message, unframed) is valid
 * only during the call. A client streaming method's handler is called when the request headers
 * arrive, with msg NULL: it sets on_message and on_half_close, and ends the call with grpc_fail
 * (GRPC_OK for a normal end). */
typedef void (*grpc_handler)(grpc_call *c, const uint8_t *msg, size_t len);
typedef struct grpc_method {
  const char *path;
  bool is_public; /* answers without the API key (health probes) */
  grpc_handler handler;
  bool client_streaming; /* any number of request messages (ModelStreamInfer) */
} grpc_method;

/* servd_grpc_server_create (grpc.h) with a method table (borrowed: it outlives the server):
 * methods.c calls it with its table. */
int grpc_server_create(uv_loop_t *loop, servd_api *api, const servd_grpc_limits *limits, const grpc_method *methods,
                       size_t n_methods, servd_grpc_server **out);

/* Answers with one message (packed here); c is invalid afterwards. */
void grpc_reply(grpc_call *c, const ProtobufCMessage *m);
/* Server streaming: sends one message and keeps the call open (packed here). The call ends with
 * grpc_fail (GRPC_OK for a normal end) or when the client cancels (on_cancel). */
void grpc_send(grpc_call *c, const ProtobufCMessage *m);
/* A call that lives as long as the client wants (a watch): it does not hold up draining. */
void grpc_call_background(grpc_call *c);
/* Answers with a status (after any messages sent); c is invalid afterwards. */
void grpc_fail(grpc_call *c, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* The gRPC code for an API status (frontend.h's HTTP statuses). */
int grpc_code_for_status(int http_status);

/* ---- wire helpers (wire.c) ---- */

/* grpc-timeout ("1..8 digits" then H M S m u n) in milliseconds, rounded up; -1 when malformed. */
int64_t grpc_timeout_parse(const char *v);
/* grpc-message: percent-encodes bytes outside 0x20-0x7e and '%' into out (NUL-terminated, cut to cap). */
void grpc_message_encode(const char *msg, char *out, size_t cap);

/* The method handlers' request decoding (service.c, infer.c), also the fuzz target's entry: unpacks
 * a ModelInferRequest and builds its input tensors. Returns 0 with *in / *n_in (malloc'd, tensors
 * owned) or a gRPC code with msg. */
int grpc_infer_inputs(const Inference__ModelInferRequest *req, servd_named_tensor **in, int *n_in, char *msg,
                      size_t cap);

/* A language-model request (llm_inputs.c): TensorRT-LLM's ensemble inputs as generation parameters. */
typedef struct grpc_llm_request {
  const uint8_t *prompt; /* text_input, borrowed from the request message */
  size_t prompt_len;
  servd_gen_params gp; /* gp.stop points at stop[] */
  bool stream;         /* send the text as it comes (the input 'stream', else the method's default) */
  bool exclude_input;  /* exclude_input_in_output (default true); false: the prompt leads a whole text */
  int out_ndim;        /* text_output's shape: [1] or [1, 1], as text_input's */
  int32_t end_id;
  char *stop[16];
} grpc_llm_request;
/* Decodes q over defaults (servd_api_generate_defaults). Returns 0 or a gRPC code with msg; free r
 * with grpc_llm_request_free whatever the outcome. */
int grpc_llm_inputs(const Inference__ModelInferRequest *q, const servd_gen_params *defaults, bool stream_default,
                    grpc_llm_request *r, char *msg, size_t cap);
void grpc_llm_request_free(grpc_llm_request *r);

/* The deadline of an inference (ms; 0: none): the call's grpc-timeout (timeout_ms, -1: none), else
 * Triton's "timeout" parameter (microseconds), else default_ms (the server's default); the earliest
 * when several are given (infer_inputs.c, beside the rest of the request's decoding). */
int64_t grpc_infer_deadline(const Inference__ModelInferRequest *q, int64_t timeout_ms, int64_t default_ms);
/* ModelInfer of a language model (llm_infer.c): q is read during the call only. */
void grpc_llm_infer(grpc_call *c, const Inference__ModelInferRequest *q);

#endif
