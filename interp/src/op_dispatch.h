/* The ops of the host table (servd_host_api): one servd_op__<name> per row of servd/ops.def, in the
 * same order, each picking the CPU kernel or the device op from where its tensors live. All on the
 * host: the CPU op. All on one GPU: the servd_device_* op. Otherwise SERVD_EINVAL naming the op and
 * both devices ("matmul: out is on the cpu but x is on cuda:0"), so a device pointer never reaches a
 * host kernel and a host pointer never reaches a device kernel.
 *
 * ANY/ANYT rows are dispatched by generated code; HAND rows are written in op_dispatch.c:
 * - softmax, kv_write, attention, allreduce_sum, allgather_cols take host tensors only (a device
 *   tensor is SERVD_EINVAL: "softmax: x is on cuda:0; ..."); the device_* rows take tensors on the
 *   device of their cache or communicator.
 * - add_rmsnorm (x += o, then out = rmsnorm(x) * weight; out must not be x) and matmul_many (1 to
 *   SERVD_MATMUL_MANY_MAX weights): servd_add + servd_rmsnorm and servd_matmul_many on the host, the
 *   fused device ops on a device.
 * - copy: dst <- src, same dtype and shape, any direction: host to host here (rows of plain or block
 *   dtypes), anything that touches a device through servd_device_copy.
 * Internal to servd_interp (not installed). */
#ifndef SERVD_INTERP_OP_DISPATCH_H
#define SERVD_INTERP_OP_DISPATCH_H

#include "servd/device.h"
#include "servd/ops.h"

#define SERVD_OP(name, dispatch, py, sig, names) int servd_op__##name(SERVD__PARAMS(sig, names));
#include "servd/ops.def"
#undef SERVD_OP

#endif
