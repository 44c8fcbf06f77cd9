/* The binary tensor data extension's framing and raw tensor bytes (kserve_binary.h). */
#include "api/kserve_binary.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* Raw bytes are copied as they lie in memory: the wire is little-endian. */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "binary tensor data assumes a little-endian host");

int kserve_binary_split(const char *header, size_t body_len, size_t *json_len, char *msg, size_t cap) {
  *json_len = body_len;
  if (!header) return 0;
  char *end = NULL;
  errno = 0;
  unsigned long long n = header[0] >= '0' && header[0] <= '9' ? strtoull(header, &end, 10) : 0;
  if (!end || *end || errno) {
    snprintf(msg, cap, KSERVE_HEADER_LENGTH " must be a decimal byte count, got '%.40s'", header);
    return -1;
  }
  if (n == 0 || n > body_len) {
    snprintf(msg, cap,
             KSERVE_HEADER_LENGTH " is %llu but the body has %zu bytes: the JSON header must be 1 to %zu bytes", n,
             body_len, body_len);
    return -1;
  }
  *json_len = (size_t)n;
  return 0;
}

size_t kserve_binary_put(servd_buf *b, const servd_tensor *t) {
  size_t es = servd_dtype_block_bytes(t->dtype);
  int64_t n = servd_tensor_numel(t);
  const char *base = servd_tensor_data(t);
  if (t->ndim == 0 || n == 0) {
    if (n) servd_buf_append(b, base, es);
    return n ? es : 0;
  }
  /* Rows of the innermost dimension are contiguous (tensor.h): one append per row. */
  int last = t->ndim - 1;
  size_t row = (size_t)t->shape[last] * es;
  int64_t idx[SERVD_MAX_DIMS] = {0};
  for (int64_t k = 0; k < n; k += t->shape[last]) {
    size_t off = 0;
    for (int d = 0; d < last; d++) off += (size_t)(idx[d] * t->strides[d]);
    servd_buf_append(b, base + off, row);
    for (int d = last - 1; d >= 0; d--) {
      if (++idx[d] < t->shape[d]) break;
      idx[d] = 0;
    }
  }
  return (size_t)n * es;
}
