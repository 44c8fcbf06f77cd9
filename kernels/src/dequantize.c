/* dequantize: out f32 (..., n) = the values of x (..., n) in a GGUF block dtype (servd/blocks.h),
 * block by block. The scalar kernel is the reference for the device one (kernels/cuda/dequantize.cu);
 * matmul never calls it (it computes on the blocks), it is for the code that needs the values:
 * checks, conversions, ops without a quantized path. */
#include "ops-impl.h"

#include "servd/blocks.h"
#include "servd/dtype_traits.h"
#include "servd/threadpool.h"

int servd__check_dequantize(servd_tensor *out, const servd_tensor *x) {
  char bo[96], bx[96];
  bool ok =
      out && x && out->dtype == SERVD_F32 && servd_dtype_is_quantized(x->dtype) && x->ndim >= 1 && out->ndim == x->ndim;
  for (int i = 0; ok && i < x->ndim; i++) ok = out->shape[i] == x->shape[i];
  if (!ok) {
    char names[160];
    return servd_fail(SERVD_EINVAL, "dequantize: expected x (..., n) %s and out f32 of its shape; got out %s, x %s",
                      servd_dtype_list(names, sizeof names, servd_dtype_quantized_name, "/", "/"),
                      ops__desc(out, bo, sizeof bo), ops__desc(x, bx, sizeof bx));
  }
  return 0;
}

static inline float f16(uint16_t h) { return servd_f16_to_f32(h); }

/* One block of SERVD_QK values into y. */
static void block_q8_0(float *y, const void *blk) {
  const servd_block_q8_0 *b = blk;
  const float d = f16(b->d);
  for (int i = 0; i < SERVD_QK; i++) y[i] = d * (float)b->qs[i];
}

/* Nibble i < 16 is the low half of qs[i], nibble i + 16 the high half (ggml's order). */
static void block_q4_0(float *y, const void *blk) {
  const servd_block_q4_0 *b = blk;
  const float d = f16(b->d);
  for (int i = 0; i < SERVD_QK / 2; i++) {
    y[i] = d * (float)((b->qs[i] & 15) - 8);
    y[i + SERVD_QK / 2] = d * (float)((b->qs[i] >> 4) - 8);
  }
}

static void block_q4_1(float *y, const void *blk) {
  const servd_block_q4_1 *b = blk;
  const float d = f16(b->d), m = f16(b->m);
  for (int i = 0; i < SERVD_QK / 2; i++) {
    y[i] = d * (float)(b->qs[i] & 15) + m;
    y[i + SERVD_QK / 2] = d * (float)(b->qs[i] >> 4) + m;
  }
}

/* 5-bit values: nibbles as q4, bit 4 of element i in bit i of qh. */
static void block_q5_0(float *y, const void *blk) {
  const servd_block_q5_0 *b = blk;
  const float d = f16(b->d);
  for (int i = 0; i < SERVD_QK; i++) y[i] = d * (float)(servd_q5_at(b->qh, b->qs, i) - 16);
}

static void block_q5_1(float *y, const void *blk) {
  const servd_block_q5_1 *b = blk;
  const float d = f16(b->d), m = f16(b->m);
  for (int i = 0; i < SERVD_QK; i++) y[i] = d * (float)servd_q5_at(b->qh, b->qs, i) + m;
}

/* The blocks of 32 decoded here one block at a time; every other block dtype goes a row at a time
 * through its reference decoder (servd_row_to_f32), so a new dtype needs no row here. */
static void (*const block_decoders[SERVD_DTYPE_COUNT])(float *y, const void *blk) = {
    [SERVD_Q8_0] = block_q8_0, [SERVD_Q4_0] = block_q4_0, [SERVD_Q4_1] = block_q4_1,
    [SERVD_Q5_0] = block_q5_0, [SERVD_Q5_1] = block_q5_1,
};

typedef struct dq_job {
  const servd_tensor *out, *x;
  int64_t cols;
} dq_job;

/* Byte offset of outer row r (an index over every dimension but the innermost) of t: any outer
 * strides, so views (narrowed rows, slices of a middle dimension) need no copy. */
static int64_t row_offset(const servd_tensor *t, int64_t r) {
  int64_t off = 0;
  for (int i = t->ndim - 2; i >= 0; i--) {
    off += (r % t->shape[i]) * t->strides[i];
    r /= t->shape[i];
  }
  return off;
}

static void dq_task(void *ctx, int64_t begin, int64_t end, int thread) {
  (void)thread;
  const dq_job *j = ctx;
  const servd_dtype dt = j->x->dtype;
  void (*const decode)(float *y, const void *blk) = block_decoders[dt];
  const int64_t nb = j->cols / SERVD_QK;
  const size_t bb = servd_dtype_block_bytes(dt);
  const char *x0 = servd_tensor_data(j->x);
  char *o0 = servd_tensor_data(j->out);
  for (int64_t r = begin; r < end; r++) {
    const char *src = x0 + row_offset(j->x, r);
    float *dst = (float *)(o0 + row_offset(j->out, r));
    if (!decode) {
      servd_row_to_f32(dt, src, dst, j->cols);
      continue;
    }
    for (int64_t b = 0; b < nb; b++, src += bb, dst += SERVD_QK) decode(dst, src);
  }
}

int servd_dequantize(servd_tensor *out, const servd_tensor *x) {
  int rc = servd__check_dequantize(out, x);
  if (rc < 0) return rc;
  dq_job j = {out, x, x->shape[x->ndim - 1]};
  int64_t rows = j.cols ? servd_tensor_numel(x) / j.cols : 0;
  if (rows == 0 || j.cols == 0) return 0;
  int64_t grain = j.cols >= 8192 ? 1 : 8192 / j.cols;
  servd_parallel_for(rows, grain, dq_task, &j);
  return 0;
}
