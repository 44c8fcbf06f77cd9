/* geglu: out = gelu_tanh(gate) * up, element-wise over rows (Gemma's MLP); f32 rows per ISA
 * (geglu_avx2.c, geglu_avx512.c), and bf16 rows as the device computes them. The scalar kernel is
 * the reference for the device one (kernels/cuda/geglu.cu). */
#include "geglu-impl.h"
#include "ops-impl.h"

#include <math.h>

#include "servd/threadpool.h"

int servd__check_geglu(servd_tensor *out, const servd_tensor *gate, const servd_tensor *up) {
  char bo[96], bg[96], bu[96];
  bool ok = out && gate && up && (out->dtype == SERVD_F32 || out->dtype == SERVD_BF16) && gate->dtype == out->dtype &&
            up->dtype == out->dtype && out->ndim == gate->ndim && out->ndim == up->ndim;
  for (int i = 0; ok && i < out->ndim; i++) ok = out->shape[i] == gate->shape[i] && out->shape[i] == up->shape[i];
  if (!ok)
    return servd_fail(SERVD_EINVAL,
                      "geglu: expected out, gate, up of one shape and one dtype (f32, bf16 on a device); got "
                      "out %s, gate %s, up %s",
                      ops__desc(out, bo, sizeof bo), ops__desc(gate, bg, sizeof bg), ops__desc(up, bu, sizeof bu));
  return 0;
}

/* The tanh form of transformers' gelu_pytorch_tanh, in f32 as torch computes it for f32 tensors. */
static inline float geglu1(float x, float u) {
  const float k = 0.7978845608028654f; /* sqrt(2/pi) */
  return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x))) * u;
}

void servd__geglu_scalar(float *out, const float *g, const float *u, int64_t n) {
  for (int64_t i = 0; i < n; i++) out[i] = geglu1(g[i], u[i]);
}

/* bf16 rows (what the device kernel computes: f32 inside, rounded once), for the CUDA stand-in. */
static void geglu_row_bf16(uint16_t *out, const uint16_t *g, const uint16_t *u, int64_t n) {
  for (int64_t i = 0; i < n; i++) out[i] = servd_f32_to_bf16(geglu1(servd_bf16_to_f32(g[i]), servd_bf16_to_f32(u[i])));
}

typedef void (*geglu_fn)(float *out, const float *g, const float *u, int64_t n);

typedef struct geglu_job {
  ops__rows o, g, u;
  bool bf16;
  geglu_fn fn;
} geglu_job;

static void geglu_task(void *ctx, int64_t begin, int64_t end, int thread) {
  (void)thread;
  const geglu_job *j = ctx;
  for (int64_t r = begin; r < end; r++)
    if (j->bf16)
      geglu_row_bf16((uint16_t *)(j->o.data + r * j->o.stride), (const uint16_t *)(j->g.data + r * j->g.stride),
                     (const uint16_t *)(j->u.data + r * j->u.stride), j->o.cols);
    else
      j->fn((float *)(j->o.data + r * j->o.stride), (const float *)(j->g.data + r * j->g.stride),
            (const float *)(j->u.data + r * j->u.stride), j->o.cols);
}

int servd_geglu(servd_tensor *out, const servd_tensor *gate, const servd_tensor *up) {
  char bo[96];
  geglu_job j;
  int rc = servd__check_geglu(out, gate, up);
  if (rc) return rc;
  if (ops__as_rows(out, &j.o) || ops__as_rows(gate, &j.g) || ops__as_rows(up, &j.u))
    return servd_fail(SERVD_EINVAL, "geglu: out, gate, up must have contiguous rows; got out %s",
                      ops__desc(out, bo, sizeof bo));
  static const geglu_fn fns[SERVD_ISA_COUNT] = {servd__geglu_scalar, servd__geglu_avx2, servd__geglu_avx512};
  j.bf16 = out->dtype == SERVD_BF16;
  j.fn = fns[ops__isa()];
  if (j.o.rows == 0 || j.o.cols == 0) return 0;
  /* exp and a divide cost ~20x an add: ~2k elements per task keeps decode rows on the caller thread */
  int64_t grain = j.o.cols >= 2048 ? 1 : 2048 / j.o.cols;
  servd_parallel_for(j.o.rows, grain, geglu_task, &j);
  return 0;
}
