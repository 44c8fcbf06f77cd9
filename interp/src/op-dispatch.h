/* The ops of the host table (servd_host_api): each picks the CPU kernel or the device op from where
 * its tensors live. All on the host: the CPU op. All on one GPU: the servd_device_* op. Otherwise
 * SERVD_EINVAL naming the op and both devices ("matmul: out is on the cpu but x is on cuda:0"), so a
 * device pointer never reaches a host kernel and a host pointer never reaches a device kernel.
 * Internal to servd_interp (not installed). */
#ifndef SERVD_INTERP_OP_DISPATCH_H
#define SERVD_INTERP_OP_DISPATCH_H

#include "servd/device.h"
#include "servd/ops.h"

int servd_op__matmul(servd_tensor *out, const servd_tensor *x, const servd_tensor *w);
int servd_op__embedding(servd_tensor *out, const servd_tensor *table, const servd_tensor *ids, int64_t row_offset);
int servd_op__rmsnorm(servd_tensor *out, const servd_tensor *x, const servd_tensor *weight, float eps);
int servd_op__rope(servd_tensor *x, const servd_tensor *positions, const servd_rope_params *p);
int servd_op__swiglu(servd_tensor *out, const servd_tensor *gate, const servd_tensor *up);
int servd_op__add(servd_tensor *out, const servd_tensor *a, const servd_tensor *b);
int servd_op__argmax(servd_tensor *out, const servd_tensor *x);
int servd_op__topk(servd_tensor *values, servd_tensor *indices, const servd_tensor *x, int k);
/* Fused: x += o, then out = rmsnorm(x) * weight (out must not be x); and outs[i] = x @ ws[i]^T for
 * 1..SERVD_MATMUL_MANY_MAX weights: servd_add + servd_rmsnorm and servd_matmul_many on the host, the
 * fused device ops on a device. */
int servd_op__add_rmsnorm(servd_tensor *x, const servd_tensor *o, servd_tensor *out, const servd_tensor *weight,
                          float eps);
int servd_op__matmul_many(int count, servd_tensor *const *outs, const servd_tensor *x, const servd_tensor *const *ws);

/* Host-only ops: a device tensor is SERVD_EINVAL ("softmax: x is on cuda:0; this op runs on the host"). */
int servd_op__softmax(servd_tensor *x, float scale);
int servd_op__kv_write(servd_kv_cache *c, int layer, const servd_tensor *k, const servd_tensor *v,
                       const servd_tensor *slots);
int servd_op__attention(servd_tensor *out, const servd_tensor *q, const servd_kv_cache *c, int layer,
                        const servd_attn_batch *b, int n_heads, float scale);
int servd_op__allreduce_sum(servd_comm *c, int rank, servd_tensor *x);
int servd_op__allgather_cols(servd_comm *c, int rank, servd_tensor *out, const servd_tensor *x);

/* Device-only ops: every tensor on the device of the cache (or of the first tensor). */
int servd_op__device_kv_write(servd_device_kv *kv, int layer, const servd_tensor *k, const servd_tensor *v,
                              const servd_tensor *slots);
int servd_op__device_attention(servd_tensor *out, const servd_tensor *q, const servd_device_kv *kv, int layer,
                               const servd_device_batch *db, int n_heads, float scale);
int servd_op__device_allreduce_sum(servd_device_comm *c, int rank, servd_tensor *x);
int servd_op__device_allgather_cols(servd_device_comm *c, int rank, servd_tensor *out, const servd_tensor *x);

/* dst <- src, same dtype and shape, any direction: host to host here (rows of plain or block dtypes),
 * anything that touches a device through servd_device_copy. */
int servd_op__copy(servd_tensor *dst, const servd_tensor *src);

#endif
