/* Private helpers shared by the CPU kernels: ISA dispatch, per-thread scratch, 2-D views.
 *
 * Dispatch: every op picks its implementation with servd__isa() at call time, e.g.
 *   switch (servd__isa()) { case SERVD_ISA_AVX512: ...; case SERVD_ISA_AVX2: ...; default: scalar }
 * Code in *_avx512.c is compiled with -mavx512f/bw/vl/dq only; VNNI and BF16 live in
 * *_avx512vnni.c / *_avx512bf16.c and are called only when servd__cpu_has_vnni()/_bf16() say so
 * (both false when the active ISA is below AVX-512, so a forced ISA never reaches them).
 *
 * Threads: split an op with servd_parallel_for(n, grain, fn, ctx) (servd/threadpool.h). Pick grain
 * so that one chunk is worth ~10 us of work; smaller jobs then run inline on the caller with no
 * synchronisation. Inside fn, per-thread buffers come from servd__scratch() (each pool thread and
 * each caller has its own), so kernels never allocate per call.
 */
#ifndef SERVD_CPU_IMPL_H
#define SERVD_CPU_IMPL_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "servd/blocks.h"
#include "servd/ops.h"
#include "servd/tensor.h"

/* The ISA every op uses now: the forced one, else the best this CPU supports. Cheap (one load). */
servd_isa servd__isa(void);
/* AVX-512 extensions, true only while the active ISA is AVX-512 and the CPU has them. */
bool servd__cpu_has_vnni(void);
bool servd__cpu_has_bf16(void);

/* A per-thread 64-byte aligned buffer of at least `bytes`, grown on demand and kept for the life of the
 * thread (freed at thread exit). `slot` in [0, SERVD__SCRATCH_SLOTS) selects independent buffers, so
 * one op can hold several. Borrowed: valid until the next call with the same slot on this thread.
 * NULL on allocation failure. Slots 0, 1 and 2 are used by matmul's kernels, 4 by its residual
 * activation level (matmul.c); ops outside matmul use 2 and 3. */
#define SERVD__SCRATCH_SLOTS 5
void *servd__scratch(int slot, size_t bytes);

/* A tensor seen as a matrix: rows = product of all outer dims, cols = innermost dim, each row
 * contiguous, row r at base + r*row_stride. Fails (false) when outer dims cannot be merged into one
 * stride (e.g. a permuted view). */
typedef struct servd__mat {
  char *base;
  int64_t rows, cols;
  int64_t row_stride; /* bytes */
} servd__mat;
bool servd__as_matrix(const servd_tensor *t, servd__mat *m);

/* GGUF block layouts (servd/blocks.h), under the names the kernels use. */
typedef servd_block_q8_0 servd__block_q8_0;
typedef servd_block_q4_0 servd__block_q4_0;
typedef servd_block_q4_1 servd__block_q4_1;

/* Nearest integer, ties away from zero (roundf, as ggml's reference quantizers). v must be finite
 * and within int range. */
static inline int servd__round(float v) { return (int)roundf(v); }

#endif
