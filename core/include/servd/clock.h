/* The process's one clock for durations, deadlines and timestamps that are compared with each other. */
#ifndef SERVD_CLOCK_H
#define SERVD_CLOCK_H

#include <stdint.h>

#include "servd/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Nanoseconds of CLOCK_MONOTONIC: never jumps with the wall clock, the same clock as libuv's
 * uv_hrtime() and as pthread waits configured with CLOCK_MONOTONIC, so values from any of them compare. */
SERVD_API int64_t servd_now_ns(void);

#ifdef __cplusplus
}
#endif
#endif
