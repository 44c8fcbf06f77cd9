/* libFuzzer: the GGUF reader, then every lookup and a dequantized first row of every tensor. */
#include <stdint.h>
#include <stdlib.h>

#include "mpk/gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  mpk_gguf *g = NULL;
  if (mpk_gguf_parse("fuzz.gguf", data, size, &g) != 0) return 0;
  uint64_t u;
  double d;
  bool b;
  const char *s;
  size_t n;
  for (size_t i = 0; i < g->n_kv; i++) {
    const mpk_gguf_kv *kv = &g->kv[i];
    mpk_gguf_get_u64(g, kv->key, &u);
    mpk_gguf_get_f64(g, kv->key, &d);
    mpk_gguf_get_bool(g, kv->key, &b);
    mpk_gguf_get_str(g, kv->key, &s, &n);
    for (uint64_t k = 0; kv->type == MPK_GGUF_ARRAY && k < kv->n && k < 64; k++) {
      if (kv->arr_type == MPK_GGUF_STRING) mpk_gguf_arr_str(g, kv, k, &s, &n);
      else if (kv->arr_type == MPK_GGUF_FLOAT32 || kv->arr_type == MPK_GGUF_FLOAT64) d += mpk_gguf_arr_f64(kv, k);
      else if (kv->arr_type != MPK_GGUF_BOOL) u += (uint64_t)mpk_gguf_arr_int(kv, k);
    }
  }
  for (size_t i = 0; i < g->n_tensors; i++) {
    const mpk_gguf_tensor *t = &g->tensors[i];
    if (t->ne[0] > 4096) continue;
    float *row = malloc((size_t)t->ne[0] * sizeof *row);
    if (row) mpk_ggml_row_to_f32(t->type, g->buf + t->offset, row, t->ne[0]);
    free(row);
  }
  mpk_gguf_free(g);
  return 0;
}
