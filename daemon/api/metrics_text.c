/* Shared by the /metrics families outside metrics.c: label escaping and the histograms that
 * models.c, metrics_vllm.c, metrics_generic.c and the front ends fill. */
#include "api/api-impl.h"

#include <string.h>

void api_hist_init(api_hist *h, const double *bounds, int n) {
  memset(h, 0, sizeof(*h));
  h->bounds = bounds;
  h->n = n > API_HIST_MAX ? API_HIST_MAX : n;
}

void api_hist_observe(api_hist *h, double v) {
  int i = 0;
  while (i < h->n && v > h->bounds[i]) i++;
  h->counts[i]++;
  h->sum += v;
  h->count++;
}

/* Label values are model names and routes: escape backslash, quote and newline. */
void api_prom_label(servd_buf *b, const char *v) {
  for (const char *p = v; *p; p++) {
    if (*p == '\\') servd_buf_puts(b, "\\\\");
    else if (*p == '"') servd_buf_puts(b, "\\\"");
    else if (*p == '\n') servd_buf_puts(b, "\\n");
    else servd_buf_append(b, p, 1);
  }
}
