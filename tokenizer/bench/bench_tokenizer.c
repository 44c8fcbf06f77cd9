/* Tokenizer encode throughput against Hugging Face `tokenizers` on the same corpus, one thread,
 * rounds interleaved (servd, then the anchor) so that machine noise hits both; medians reported.
 *   bench_tokenizer TOKENIZER_JSON CORPUS [ROUNDS] [PYTHON] [whole]
 * The corpus is split into documents at blank lines and each document is one encode call on both
 * sides (with "whole": the corpus is one call). The anchor is hf_anchor.py next to this file, run with PYTHON (.venv-test by default). */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "servd/bench-util.h"
#include "servd/tokenizer.h"

#ifndef ANCHOR_SCRIPT
#define ANCHOR_SCRIPT "hf_anchor.py"
#endif

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, bench_cmp_d);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s TOKENIZER_JSON CORPUS [ROUNDS] [PYTHON]\n", argv[0]);
    return 2;
  }
  int rounds = argc > 3 ? atoi(argv[3]) : 5;
  const char *py = argc > 4 ? argv[4] : ".venv-test/bin/python";
  bool whole = argc > 5 && !strcmp(argv[5], "whole");
  if (rounds < 1 || rounds > 100) rounds = 5;
  servd_tokenizer *t;
  if (servd_tokenizer_load_file(argv[1], &t)) {
    fprintf(stderr, "%s\n", servd_last_error());
    return 1;
  }
  FILE *f = fopen(argv[2], "rb");
  if (!f) {
    perror(argv[2]);
    return 1;
  }
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *text = malloc((size_t)size + 1);
  if (!text || fread(text, 1, (size_t)size, f) != (size_t)size) return 1;
  fclose(f);
  text[size] = 0;
  /* documents: split at "\n\n" exactly as the anchor does */
  size_t n_docs = 0, cap = 1024;
  size_t *off = malloc(cap * sizeof *off), *len = malloc(cap * sizeof *len);
  for (size_t s = 0;;) {
    char *e = whole ? NULL : memmem(text + s, (size_t)size - s, "\n\n", 2);
    size_t end = e ? (size_t)(e - text) : (size_t)size;
    if (n_docs == cap) {
      cap *= 2;
      off = realloc(off, cap * sizeof *off);
      len = realloc(len, cap * sizeof *len);
    }
    off[n_docs] = s, len[n_docs] = end - s, n_docs++;
    if (!e) break;
    s = end + 2;
  }
  double *ours = calloc((size_t)rounds, sizeof(double)), *theirs = calloc((size_t)rounds, sizeof(double));
  long tokens = 0, their_tokens = 0;
  for (int r = 0; r < rounds; r++) {
    /* a fresh tokenizer each round (empty word cache), warmed like the anchor's */
    servd_tokenizer_free(t);
    if (servd_tokenizer_load_file(argv[1], &t)) return 1;
    {
      int32_t *ids;
      int n;
      servd_tokenizer_encode(t, text, (size_t)(size < 100000 ? size : 100000), false, &ids, &n);
      free(ids);
    }
    double t0 = bench_now_s();
    tokens = 0;
    for (size_t d = 0; d < n_docs; d++) {
      int32_t *ids;
      int n;
      if (servd_tokenizer_encode(t, text + off[d], len[d], false, &ids, &n)) {
        fprintf(stderr, "%s\n", servd_last_error());
        return 1;
      }
      tokens += n;
      free(ids);
    }
    ours[r] = bench_now_s() - t0;
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "%s %s '%s' '%s' 1 %s", py, ANCHOR_SCRIPT, argv[1], argv[2], whole ? "whole" : "docs");
    FILE *p = popen(cmd, "r");
    if (!p || fscanf(p, "%lf %ld", &theirs[r], &their_tokens) != 2) {
      fprintf(stderr, "anchor failed: %s\n", cmd);
      return 1;
    }
    pclose(p);
    fprintf(stderr, "round %d: servd %.3f s, tokenizers %.3f s\n", r, ours[r], theirs[r]);
  }
  double mo = median(ours, rounds), mt = median(theirs, rounds);
  printf("corpus: %ld bytes, %zu documents, %ld tokens (tokenizers: %ld)%s\n", size, n_docs, tokens, their_tokens,
         tokens == their_tokens ? "" : "  TOKEN COUNTS DIFFER");
  printf("servd      encode: median %.3f s  %.2f MB/s  %.0f tokens/s\n", mo, size / mo / 1e6, tokens / mo);
  printf("tokenizers encode: median %.3f s  %.2f MB/s  %.0f tokens/s\n", mt, size / mt / 1e6, their_tokens / mt);
  printf("ratio (servd / tokenizers throughput): %.2fx over %d interleaved rounds\n", mt / mo, rounds);
  free(ours), free(theirs), free(off), free(len), free(text);
  servd_tokenizer_free(t);
  return 0;
}
