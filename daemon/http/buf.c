#include "http/buf.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void servd_buf_init(servd_buf *b) { memset(b, 0, sizeof(*b)); }

void servd_buf_free(servd_buf *b) {
  free(b->data);
  memset(b, 0, sizeof(*b));
}

void servd_buf_clear(servd_buf *b) {
  b->len = 0;
  b->oom = false;
  if (b->data) b->data[0] = '\0';
}

int servd_buf_reserve(servd_buf *b, size_t extra) {
  if (b->oom) return -1;
  if (extra > SIZE_MAX / 2 - b->len) goto fail;
  size_t need = b->len + extra + 1;
  if (need <= b->cap) return 0;
  size_t cap = b->cap ? b->cap : 256;
  while (cap < need) cap *= 2;
  char *d = realloc(b->data, cap);
  if (!d) goto fail;
  b->data = d;
  b->cap = cap;
  return 0;
fail:
  b->oom = true;
  return -1;
}

void servd_buf_append(servd_buf *b, const void *p, size_t n) {
  if (servd_buf_reserve(b, n) != 0) return;
  if (n) memcpy(b->data + b->len, p, n);
  b->len += n;
  b->data[b->len] = '\0';
}

void servd_buf_puts(servd_buf *b, const char *s) { servd_buf_append(b, s, strlen(s)); }

void servd_buf_printf(servd_buf *b, const char *fmt, ...) {
  char small[256];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(small, sizeof small, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if ((size_t)n < sizeof small) {
    servd_buf_append(b, small, (size_t)n);
    return;
  }
  if (servd_buf_reserve(b, (size_t)n) != 0) return;
  va_start(ap, fmt);
  vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
  va_end(ap);
  b->len += (size_t)n;
}

/* Length of the valid UTF-8 sequence at s (1..4), or 0 when invalid. */
static size_t utf8_seq(const unsigned char *s, size_t n) {
  unsigned char c = s[0];
  size_t len;
  uint32_t cp;
  if (c < 0x80) return 1;
  if ((c & 0xE0) == 0xC0) len = 2, cp = c & 0x1F;
  else if ((c & 0xF0) == 0xE0) len = 3, cp = c & 0x0F;
  else if ((c & 0xF8) == 0xF0) len = 4, cp = c & 0x07;
  else return 0;
  if (len > n) return 0;
  for (size_t i = 1; i < len; i++) {
    if ((s[i] & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (s[i] & 0x3F);
  }
  if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) || cp > 0x10FFFF ||
      (cp >= 0xD800 && cp <= 0xDFFF))
    return 0;
  return len;
}

void servd_buf_json_str(servd_buf *b, const char *s, size_t n) {
  static const char hex[] = "0123456789abcdef";
  if (servd_buf_reserve(b, n + 2) != 0) return;
  servd_buf_append(b, "\"", 1);
  const unsigned char *u = (const unsigned char *)s;
  size_t i = 0;
  while (i < n) {
    unsigned char c = u[i];
    if (c == '"' || c == '\\') {
      char e[2] = {'\\', (char)c};
      servd_buf_append(b, e, 2);
      i++;
    } else if (c < 0x20) {
      const char *e = NULL;
      switch (c) {
      case '\n': e = "\\n"; break;
      case '\r': e = "\\r"; break;
      case '\t': e = "\\t"; break;
      case '\b': e = "\\b"; break;
      case '\f': e = "\\f"; break;
      }
      if (e) {
        servd_buf_append(b, e, 2);
      } else {
        char x[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15]};
        servd_buf_append(b, x, 6);
      }
      i++;
    } else if (c < 0x80) {
      size_t j = i;
      while (j < n && u[j] >= 0x20 && u[j] < 0x80 && u[j] != '"' && u[j] != '\\') j++;
      servd_buf_append(b, s + i, j - i);
      i = j;
    } else {
      size_t len = utf8_seq(u + i, n - i);
      if (len == 0) {
        servd_buf_append(b, "\xEF\xBF\xBD", 3);
        i++;
      } else {
        servd_buf_append(b, s + i, len);
        i += len;
      }
    }
  }
  servd_buf_append(b, "\"", 1);
}

void servd_buf_consume(servd_buf *b, size_t n) {
  if (n >= b->len) {
    servd_buf_clear(b);
    return;
  }
  memmove(b->data, b->data + n, b->len - n);
  b->len -= n;
  b->data[b->len] = '\0';
}
