/* Status codes and the per-thread last error message. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "servd/status.h"

static _Thread_local char last_error[512];

const char *servd_strerror(int code) {
  switch (code) {
  case SERVD_OK: return "success";
  case SERVD_EINVAL: return "invalid argument";
  case SERVD_ENOMEM: return "out of memory";
  case SERVD_EIO: return "input/output error";
  case SERVD_EFORMAT: return "malformed data";
  case SERVD_ERANGE: return "value out of range";
  case SERVD_EUNSUPPORTED: return "not supported";
  case SERVD_EBUSY: return "resource busy";
  case SERVD_ETIMEDOUT: return "timed out";
  case SERVD_ECANCELED: return "canceled";
  case SERVD_EDEVICE: return "device error";
  case SERVD_EMODEL: return "model error";
  default: return "unknown error";
  }
}

const char *servd_last_error(void) { return last_error; }

/* Formats into a local buffer first: callers often wrap the previous message, passing
 * servd_last_error() itself as an argument. */
int servd_fail(int code, const char *fmt, ...) {
  char msg[sizeof last_error];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  memcpy(last_error, msg, sizeof msg);
  return code;
}
