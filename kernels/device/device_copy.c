/* Host <-> device copies: uploads with dtype conversion on the host, and plain copies in any
 * direction between tensors whose rows may be strided. */
#include <stdlib.h>
#include <string.h>

#include "device_internal.h"

/* Byte offset of outer row r (an index over every dimension but the innermost) of t. */
static int64_t row_offset(const servd_tensor *t, int64_t r) {
  int64_t off = 0;
  for (int i = t->ndim - 2; i >= 0; i--) {
    int64_t n = t->shape[i];
    off += (r % n) * t->strides[i];
    r /= n;
  }
  return off;
}

/* Copies every row of src into dst as 2D slabs of the two innermost dimensions (any direction). */
static int copy_rows(servd_cuda_ctx *c, const servd_tensor *dst, const servd_tensor *src) {
  const int nd = dst->ndim;
  const size_t width =
      nd ? (size_t)servd_dtype_row_bytes(dst->dtype, dst->shape[nd - 1]) : servd_dtype_block_bytes(dst->dtype);
  const int64_t rows = nd >= 2 ? dst->shape[nd - 2] : 1;
  int64_t slabs = 1;
  for (int i = 0; i + 2 < nd; i++) slabs *= dst->shape[i];
  if (width == 0 || rows == 0 || slabs == 0) return SERVD_OK;
  if (servd_tensor_is_contiguous(dst) && servd_tensor_is_contiguous(src)) /* one copy */
    return servd_cuda_copy_2d(c, servd_tensor_data(dst), width, servd_tensor_data(src), width, width,
                              (size_t)(rows * slabs));
  const size_t dpitch = nd >= 2 && rows > 1 ? (size_t)dst->strides[nd - 2] : width;
  const size_t spitch = nd >= 2 && rows > 1 ? (size_t)src->strides[nd - 2] : width;
  char *d0 = servd_tensor_data(dst), *s0 = servd_tensor_data(src);
  for (int64_t s = 0; s < slabs; s++) {
    /* Row index of the slab's first row in the flattened outer dimensions. */
    int64_t r = s * rows;
    int rc =
        servd_cuda_copy_2d(c, d0 + row_offset(dst, r), dpitch, s0 + row_offset(src, r), spitch, width, (size_t)rows);
    if (rc) return rc;
  }
  return SERVD_OK;
}

typedef struct copy_args {
  servd_tensor *dst;
  const servd_tensor *src;
} copy_args;
SERVD__DEV_JOB(copy, servd_device_copy(a->dst, a->src))
typedef struct upload_args {
  int device;
  const servd_tensor *host;
  servd_dtype dtype;
  servd_tensor **out;
} upload_args;
SERVD__DEV_JOB(upload, servd_device_upload(a->device, a->host, a->dtype, a->out))

int servd_device_copy(servd_tensor *dst, const servd_tensor *src) {
  const char *op = "device_copy";
  if (servd__dev_forwarding()) {
    /* Between device tensors it is a launch; from or to host memory the caller waits, as the host
     * bytes are read or written by then. */
    copy_args a = {dst, src};
    const bool launch = dst && src && dst->device >= 0 && src->device >= 0;
    servd_tensor *const hold[] = {dst, (servd_tensor *)src};
    return servd__dev_forward(op, -1, copy_job, &a, sizeof a, launch ? 0 : SERVD__DEV_WAIT, hold, launch ? 2 : 0);
  }
  int rc = servd__dev_check_copy(dst, src);
  if (rc) return rc;
  const int device = dst->device >= 0 ? dst->device : src->device;
  servd_cuda_ctx *c;
  rc = servd__dev_ctx(op, device, &c);
  if (rc) return rc;
  rc = copy_rows(c, dst, src);
  if (!rc && dst->device < 0) rc = servd_cuda_sync(c); /* the caller reads the host copy next */
  return servd__dev_wrap(rc, op);
}

#define STAGING_BYTES ((size_t)8 << 20)

/* Converts rows of host into dtype in a host buffer and copies it to the contiguous device tensor
 * out, a chunk of rows at a time. The buffer is pageable: cudaMemcpyAsync has staged it when it
 * returns, so it can be refilled at once. */
static int upload_converted(servd_cuda_ctx *c, servd_tensor *out, const servd_tensor *host) {
  const int64_t n = host->ndim ? host->shape[host->ndim - 1] : 1;
  const int64_t rows = n ? servd_tensor_numel(host) / n : 0;
  if (rows == 0 || n == 0) return SERVD_OK;
  const size_t out_elem = servd_dtype_block_bytes(out->dtype), out_row = (size_t)n * out_elem;
  int64_t chunk = (int64_t)(STAGING_BYTES / out_row);
  if (chunk < 1) chunk = 1;
  if (chunk > rows) chunk = rows;
  char *stage = malloc((size_t)chunk * out_row);
  float *f = out->dtype == SERVD_F32 ? NULL : malloc((size_t)n * sizeof(float));
  int rc = SERVD_OK;
  if (!stage || (out->dtype != SERVD_F32 && !f)) {
    rc = servd_fail(SERVD_ENOMEM, "device_upload: staging buffer of %zu bytes", (size_t)chunk * out_row);
    goto done;
  }
  const char *base = servd_tensor_data(host);
  char *dev = servd_tensor_data(out);
  for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
    int64_t nr = rows - r0 < chunk ? rows - r0 : chunk;
    for (int64_t r = 0; r < nr; r++) {
      const char *src = base + row_offset(host, r0 + r);
      char *dst = stage + (size_t)r * out_row;
      if (out->dtype == SERVD_F32) {
        rc = servd_row_to_f32(host->dtype, src, (float *)dst, n);
      } else {
        rc = servd_row_to_f32(host->dtype, src, f, n);
        uint16_t *h = (uint16_t *)dst;
        for (int64_t i = 0; !rc && i < n; i++) h[i] = servd_f32_to_bf16(f[i]);
      }
      if (rc) goto done;
    }
    rc = servd_cuda_upload(c, dev + (size_t)r0 * out_row, stage, (size_t)nr * out_row);
    if (rc) goto done;
  }
done:
  free(stage);
  free(f);
  return rc;
}

int servd_device_upload(int device, const servd_tensor *host, servd_dtype dtype, servd_tensor **out) {
  const char *op = "device_upload";
  *out = NULL;
  int rc = servd__dev_check_upload(op, host, dtype);
  if (!rc) rc = servd__dev_valid(op, device);
  if (rc) return rc;
  SERVD__DEV_SYNC(op, device, upload, 0, device, host, dtype, out);
  servd_cuda_ctx *c;
  rc = servd__dev_ctx(op, device, &c);
  if (rc) return rc;
  servd_tensor *t;
  rc = servd__dev_tensor(op, device, dtype, host->ndim, host->shape, false, &t);
  if (rc) return rc;
  /* Same dtype: the rows go as they are (2D copies over strided rows); else converted on the host. */
  rc = host->dtype == dtype ? copy_rows(c, t, host) : upload_converted(c, t, host);
  if (rc) {
    servd_tensor_release(t);
    return servd__dev_wrap(rc, op);
  }
  *out = t;
  return SERVD_OK;
}
