/* The binary tensor data extension of KServe v2 over HTTP (Triton's "binary_tensor_data"), apart
 * from the server: the framing of a body and the raw bytes of a tensor.
 *
 * Framing, of requests and responses alike:
 *
 *   body = JSON header (Inference-Header-Content-Length bytes) | tensor bytes | tensor bytes | ...
 *
 * A tensor's bytes are its elements little-endian, row-major, nothing between tensors. An input
 * whose JSON carries parameters.binary_data_size (and no 'data') takes that many bytes from what
 * follows the header, inputs in the order of 'inputs'; the sizes must add up to the bytes there.
 * Outputs asked as binary (their parameters.binary_data, else the request's
 * parameters.binary_data_output) come back the same way, each with parameters.binary_data_size.
 * Without the header a body is all JSON.
 */
#ifndef SERVD_API_KSERVE_BINARY_H
#define SERVD_API_KSERVE_BINARY_H

#include <stdbool.h>
#include <stddef.h>

#include "http/buf.h"
#include "servd/tensor.h"

#define KSERVE_HEADER_LENGTH "Inference-Header-Content-Length"

/* The bytes after a request's JSON header; used counts what the inputs took so far. Borrowed. */
typedef struct kserve_tail {
  const char *p;
  size_t len, used;
} kserve_tail;

/* Splits a body of body_len bytes by the value of its Inference-Header-Content-Length header
 * (NULL: no header, all JSON). Returns 0 with *json_len, or -1 with msg naming what is wrong. */
int kserve_binary_split(const char *header, size_t body_len, size_t *json_len, char *msg, size_t cap);

/* Appends t's elements (host tensor, plain dtype) in row-major order, whatever its strides; returns
 * the bytes appended. */
size_t kserve_binary_put(servd_buf *b, const servd_tensor *t);

#endif
