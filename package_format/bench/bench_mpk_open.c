/* Open a package and take a view of every tensor (what a loader does), against an anchor in the
 * same run: reading every tensor byte once (what a copying loader would at least do).
 *   bench_mpk_open PKG [runs]
 * Prints medians; the ratio shows that opening does not touch the weights. */
#include <stdio.h>
#include <stdlib.h>

#include "servd/bench-util.h"
#include "mpk/package.h"

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: bench_mpk_open PKG [runs]\n");
    return 2;
  }
  int runs = argc > 2 ? atoi(argv[2]) : 21;
  if (runs < 1 || runs > 1000) runs = 21;
  double *t_open = calloc((size_t)runs, sizeof(double)), *t_read = calloc((size_t)runs, sizeof(double));
  uint64_t bytes = 0;
  int ntensors = 0;
  volatile uint64_t sink = 0;
  for (int r = 0; r < runs; r++) {
    double t0 = bench_now_s();
    mpk_package *p;
    if (mpk_open(argv[1], &p)) {
      fprintf(stderr, "bench_mpk_open: %s\n", servd_last_error());
      return 1;
    }
    ntensors = mpk_tensor_count(p);
    servd_tensor **ts = calloc((size_t)ntensors, sizeof *ts);
    for (int i = 0; i < ntensors; i++)
      if (mpk_tensor(p, mpk_tensor_name(p, i), &ts[i])) return 1;
    t_open[r] = bench_now_s() - t0;
    /* anchor: touch every byte of every tensor once (page cache warm after the first run) */
    t0 = bench_now_s();
    bytes = 0;
    for (int i = 0; i < ntensors; i++) {
      const uint64_t *d = servd_tensor_data(ts[i]);
      size_t n = servd_tensor_nbytes(ts[i]) / 8;
      uint64_t acc = 0;
      for (size_t k = 0; k < n; k++) acc += d[k];
      sink += acc;
      bytes += servd_tensor_nbytes(ts[i]);
    }
    t_read[r] = bench_now_s() - t0;
    for (int i = 0; i < ntensors; i++) servd_tensor_release(ts[i]);
    free(ts);
    mpk_close(p);
  }
  (void)sink; /* written only to keep the anchor's loads; clang's -Wunused-but-set-variable */
  double mo = bench_median(t_open, runs), mr = bench_median(t_read, runs);
  printf("package %s: %d tensors, %.1f MB of weights, %d runs (medians)\n", argv[1], ntensors, (double)bytes / 1e6,
         runs);
  printf("  open + view every tensor: %8.3f ms\n", mo * 1e3);
  printf("  read every tensor byte:   %8.3f ms (anchor, %.1f GB/s)\n", mr * 1e3, (double)bytes / mr / 1e9);
  printf("  ratio open/read:          %8.4f\n", mo / mr);
  free(t_open);
  free(t_read);
  return 0;
}
