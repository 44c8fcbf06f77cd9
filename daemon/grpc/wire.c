/* gRPC-over-HTTP/2 details that are not nghttp2's: grpc-timeout and grpc-message
 * (grpc/doc/PROTOCOL-HTTP2.md). */
#include <stdio.h>
#include <string.h>

#include "grpc/grpc-impl.h"

int64_t grpc_timeout_parse(const char *v) {
  if (!v) return -1;
  size_t n = strlen(v);
  if (n < 2 || n > 9) return -1; /* TimeoutValue is at most 8 digits */
  int64_t x = 0;
  for (size_t i = 0; i + 1 < n; i++) {
    if (v[i] < '0' || v[i] > '9') return -1;
    x = x * 10 + (v[i] - '0');
  }
  switch (v[n - 1]) {
  case 'H': return x * 3600000;
  case 'M': return x * 60000;
  case 'S': return x * 1000;
  case 'm': return x;
  case 'u': return (x + 999) / 1000;
  case 'n': return (x + 999999) / 1000000;
  default: return -1;
  }
}

void grpc_message_encode(const char *msg, char *out, size_t cap) {
  static const char hex[] = "0123456789ABCDEF";
  size_t o = 0;
  if (cap == 0) return;
  for (const unsigned char *p = (const unsigned char *)msg; *p; p++) {
    if (*p >= 0x20 && *p <= 0x7e && *p != '%') {
      if (o + 1 >= cap) break;
      out[o++] = (char)*p;
    } else {
      if (o + 3 >= cap) break;
      out[o++] = '%';
      out[o++] = hex[*p >> 4];
      out[o++] = hex[*p & 15];
    }
  }
  out[o] = '\0';
}
