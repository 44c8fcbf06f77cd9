/* Fused CPU kernels that step plans use in place of a run of ops (interp/src/plan_fuse.c). Each
 * computes exactly what its ops compute one after the other, bit for bit; they are not ops of the
 * host table (no Python binding, no device op). */
#ifndef SERVD_FUSED_H
#define SERVD_FUSED_H

#include "servd/ops.h"

/* matmul_many(x, gate <- wg, up <- wu) then swiglu(gate, gate, up), in one pass over the pool:
 * x (m,k) f32; wg, wu (n,k) of one dtype; gate, up (m,n) f32, distinct from x. Each 32-column tile
 * of both weights is computed by one thread, which applies SwiGLU to it at once. Shapes and dtypes
 * are checked as by matmul_many and swiglu; 0 or a negative servd status. */
SERVD_API int servd_gate_up_swiglu(servd_tensor *gate, servd_tensor *up, const servd_tensor *x, const servd_tensor *wg,
                                   const servd_tensor *wu);

#endif
