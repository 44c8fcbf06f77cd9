/* What a device call costs through the executor's ring against the direct call, on the CUDA
 * stand-in (fake_cuda.c): the same small op (a bf16 add of 64 elements, the stand-in runs it on the
 * CPU when the stream is waited for) issued R times then waited for, rounds alternating between the
 * two paths in one run. Prints, per path, the median over rounds of
 *   issue: ops/s the calling thread issues (direct: the launch itself; executor: the enqueue);
 *   total: ops/s from the first call to the end of the final sync (the stand-in's kernel included);
 * and the ratios executor / direct. Not a test: a benchmark (docs/performance.md).
 *
 *   bench_device_executor [ops_per_round] [rounds]
 */
#include <stdio.h>
#include <stdlib.h>

#include "device_internal.h"
#include "fake_cuda.h"
#include "servd/clock.h"
#include "servd/device.h"

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static int round_of(servd_tensor *x, servd_tensor *one, int ops, double *issue, double *total) {
  int64_t t0 = servd_now_ns();
  for (int i = 0; i < ops; i++)
    if (servd_device_add(x, x, one)) return 1;
  int64_t t1 = servd_now_ns();
  if (servd_device_sync(0)) return 1;
  int64_t t2 = servd_now_ns();
  *issue = ops / ((double)(t1 - t0) * 1e-9);
  *total = ops / ((double)(t2 - t0) * 1e-9);
  return 0;
}

int main(int argc, char **argv) {
  const int ops = argc > 1 ? atoi(argv[1]) : 20000, rounds = argc > 2 ? atoi(argv[2]) : 9;
  if (ops < 1 || rounds < 1 || rounds > 100) {
    fprintf(stderr, "usage: bench_device_executor [ops_per_round >= 1] [rounds 1..100]\n");
    return 2;
  }
  fake_cuda_configure(1, (size_t)1 << 30);
  fake_cuda_thread_check(0); /* the direct rounds call the stand-in from this thread */
  servd_tensor *x[2], *one[2];
  int64_t shape[2] = {1, 64};
  double issue[2][100], total[2][100];
  for (int r = 0; r < rounds; r++)
    for (int path = 0; path < 2; path++) { /* 0 direct, 1 executor: alternating, so drift hits both */
      servd__dev_executor_override(path == 1);
      if (r == 0) {
        if (servd_device_tensor_new(0, SERVD_BF16, 2, shape, &x[path]) ||
            servd_device_tensor_new(0, SERVD_BF16, 2, shape, &one[path]))
          return fprintf(stderr, "bench: %s\n", servd_last_error()), 1;
        round_of(x[path], one[path], ops / 10 + 1, &issue[path][0], &total[path][0]); /* warm-up */
      }
      if (round_of(x[path], one[path], ops, &issue[path][r], &total[path][r]))
        return fprintf(stderr, "bench: %s\n", servd_last_error()), 1;
    }
  const double di = median(issue[0], rounds), dt = median(total[0], rounds);
  const double ei = median(issue[1], rounds), et = median(total[1], rounds);
  printf("ops per round %d, rounds %d (medians)\n", ops, rounds);
  printf("direct:   issue %.0f ops/s (%.2f us/op), total %.0f ops/s (%.2f us/op)\n", di, 1e6 / di, dt, 1e6 / dt);
  printf("executor: issue %.0f ops/s (%.2f us/op), total %.0f ops/s (%.2f us/op)\n", ei, 1e6 / ei, et, 1e6 / et);
  printf("ratio executor/direct: issue %.3f, total %.3f\n", ei / di, et / dt);
  for (int path = 0; path < 2; path++) {
    servd__dev_executor_override(path == 1);
    servd_tensor_release(x[path]);
    servd_tensor_release(one[path]);
    servd_device_sync(0);
  }
  servd_device_thread_release();
  servd_device_executors_stop(true);
  return 0;
}
