/* Shared by the device_check*.c files: the checks of servd/device.h on a GPU against the CPU ops of
 * servd/ops.h, and the helpers that move values between the two. Every check prints one line,
 * "PASS ..." or "FAIL ...", with its largest error and its tolerance.
 *
 * Tolerances are stated in units of bf16 rounding: bf16 has 8 significant bits, so rounding to
 * nearest moves a value by at most 2^-8 of itself (half a unit in the last place, which is up to
 * 2^-7 of the value). A device op whose inputs are exact bf16 values (the CPU side gets the same
 * values as f32) and that rounds its output to bf16 once is therefore within 2^-8 |ref| plus the
 * effect of a different f32 summation order; each check says how many roundings it allows for and
 * doubles the bound as margin. */
#ifndef SERVD_DEVICE_CHECK_H
#define SERVD_DEVICE_CHECK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "servd/device.h"
#include "servd/ops.h"
#include "servd/tensor.h"

extern int dc_failures; /* checks failed so far */
extern int dc_device;   /* the GPU under test */
extern int dc_devices;  /* visible GPUs */

/* One result line: "PASS name: details" or "FAIL name: details". */
void dc_verdict(bool ok, const char *name, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* A call that returned an error: prints FAIL with the call, the code and servd_last_error(). */
void dc_fail_call(const char *name, const char *call, int rc);

/* Stops the check function on a failed call: needs a `name` and a `done:` label in scope. */
#define TRY(call) \
  do { \
    int rc_ = (call); \
    if (rc_) { \
      dc_fail_call(name, #call, rc_); \
      goto done; \
    } \
  } while (0)
/* Same for a constructor that returns NULL on failure. */
#define NN(expr) \
  do { \
    if (!(expr)) { \
      dc_fail_call(name, #expr, SERVD_ENOMEM); \
      goto done; \
    } \
  } while (0)

/* Compares device results g with the CPU reference r element by element:
 * |g - r| <= atol + atol_i[i] (when atol_i is not NULL) + rtol |r|; NaN is an error. Prints one line
 * with the largest error, the largest error relative to its tolerance and `tol_text`. */
bool dc_expect_close(const char *name, const float *g, const float *r, size_t n, double atol, double rtol,
                     const float *atol_i, const char *tol_text);
bool dc_expect_equal_i32(const char *name, const int32_t *g, const int32_t *r, size_t n);

/* Deterministic pseudo-random numbers: uniform in [-1, 1). */
float dc_frand(void);
uint64_t dc_rand_u64(void);
/* n values uniform in [-scale, scale), rounded to bf16 (so the CPU and the device see the same). */
float *dc_rand_bf16(size_t n, float scale);
float dc_round_bf16(float x);

/* Host tensors (NULL on failure, servd_last_error says why). */
servd_tensor *dc_host_f32(const float *v, int ndim, const int64_t *shape);
servd_tensor *dc_host_i32(const int32_t *v, int64_t n);
/* A host tensor of dtype t (f32, f16, bf16, q8_0, q4_0, q4_1) holding v rounded/quantized to t. */
servd_tensor *dc_host_as(servd_dtype t, const float *v, int ndim, const int64_t *shape);
/* f32 values of a host tensor of any dtype and layout (rows through servd_row_to_f32). */
int dc_host_values(const servd_tensor *h, float *out);

/* Device tensors through the device.h API only. */
int dc_dev_f32(const float *v, int ndim, const int64_t *shape, servd_dtype dtype, servd_tensor **out);
int dc_dev_i32(const int32_t *v, int64_t n, servd_tensor **out);
int dc_dev_new(servd_dtype dtype, int ndim, const int64_t *shape, servd_tensor **out);
/* Downloads a device tensor (f32, bf16 or i32) of any layout as f32 / i32 values. */
int dc_download_f32(const servd_tensor *d, float *out);
int dc_download_i32(const servd_tensor *d, int32_t *out);

double dc_now(void);

/* The groups of checks. */
void dc_check_ops(void);    /* device_check_ops.c */
void dc_check_memory(void); /* device_check_mem.c */
void dc_check_kv(void);     /* device_check_step.c */
void dc_check_graph(void);  /* device_check_step.c */
void dc_check_comm(void);   /* device_check_comm.c */

#endif
