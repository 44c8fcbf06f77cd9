/* servd_now_ns: CLOCK_MONOTONIC in nanoseconds (a vDSO call, ~20 ns). */
#include <time.h>

#include "servd/clock.h"

int64_t servd_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}
