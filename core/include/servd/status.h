/* servd status codes and the per-thread error message.
 *
 * Every fallible function returns 0 or a negative SERVD_E* code. When it fails it also records a
 * message naming the operation, the shapes and the dtypes involved; servd_last_error() returns it
 * (per thread, valid until the next failing call on that thread). Library code never exits.
 */
#ifndef SERVD_STATUS_H
#define SERVD_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

#define SERVD_API __attribute__((visibility("default")))

enum {
  SERVD_OK = 0,
  SERVD_EINVAL = -1,  /* bad argument: shape mismatch, unsupported dtype pair, misaligned view */
  SERVD_ENOMEM = -2,  /* allocation failed */
  SERVD_EIO = -3,     /* file or device I/O failed */
  SERVD_EFORMAT = -4, /* malformed outside data */
  SERVD_ERANGE = -5,  /* value or index out of range, integer overflow */
  SERVD_EUNSUPPORTED = -6,
  SERVD_EBUSY = -7, /* resource exhausted for now (queue, KV blocks) */
  SERVD_ETIMEDOUT = -8,
  SERVD_ECANCELED = -9,
  SERVD_EDEVICE = -10, /* accelerator error */
  SERVD_EMODEL = -11,  /* the model's own code failed (an exception in package code), not the request */
};

SERVD_API const char *servd_strerror(int code);

/* Message of the last failure on this thread ("" when none). */
SERVD_API const char *servd_last_error(void);

/* Records a formatted message for this thread and returns code, so callers can write
 * `return servd_fail(SERVD_EINVAL, "matmul: ...", ...);` */
SERVD_API int servd_fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#ifdef __cplusplus
}
#endif
#endif
