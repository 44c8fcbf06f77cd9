/* A growable byte buffer (malloc'd, reused across requests to avoid per-token allocation) with
 * JSON string escaping for hand-written hot-path JSON such as server-sent event chunks.
 */
#ifndef SERVD_HTTP_BUF_H
#define SERVD_HTTP_BUF_H

#include <stdbool.h>
#include <stddef.h>

typedef struct servd_buf {
  char *data; /* NUL-terminated when len < cap; owned */
  size_t len, cap;
  bool oom; /* an append failed; contents are truncated */
} servd_buf;

void servd_buf_init(servd_buf *b);
void servd_buf_free(servd_buf *b);                 /* accepts a zeroed buffer */
void servd_buf_clear(servd_buf *b);                /* len = 0, keeps capacity */
int servd_buf_reserve(servd_buf *b, size_t extra); /* 0 or -1 */
void servd_buf_append(servd_buf *b, const void *p, size_t n);
void servd_buf_puts(servd_buf *b, const char *s);
void servd_buf_printf(servd_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Appends s as a quoted JSON string; invalid UTF-8 bytes become U+FFFD. */
void servd_buf_json_str(servd_buf *b, const char *s, size_t n);
/* Drops the first n bytes. */
void servd_buf_consume(servd_buf *b, size_t n);

#endif
