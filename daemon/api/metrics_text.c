/* Shared by the /metrics families outside metrics.c. */
#include "api/api-impl.h"

/* Label values are model names and routes: escape backslash, quote and newline. */
void api_prom_label(servd_buf *b, const char *v) {
  for (const char *p = v; *p; p++) {
    if (*p == '\\') servd_buf_puts(b, "\\\\");
    else if (*p == '"') servd_buf_puts(b, "\\\"");
    else if (*p == '\n') servd_buf_puts(b, "\\n");
    else servd_buf_append(b, p, 1);
  }
}
