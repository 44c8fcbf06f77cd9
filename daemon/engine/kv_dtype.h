/* Which dtype a model's KV cache is kept in: the option (--kv-cache-dtype, the config's
 * kv_cache_dtype), else the package's default (the manifest's kv_cache_dtype), else f16. Internal
 * to the engine. */
#ifndef SERVD_ENGINE_KV_DTYPE_H
#define SERVD_ENGINE_KV_DTYPE_H

#include "engine/types.h"

/* Sets m->o.kv_dtype, once the package is open and before the cache is made; head_dim is the
 * model's. SERVD_EINVAL naming the source when the dtype cannot hold this model's cache (q8_0 or
 * q4_0 with head_dim not a multiple of 32, a manifest value that is not a cache dtype, anything but
 * f16 asked for a GPU cache). */
int servd__kv_dtype_resolve(servd_model *m, int head_dim);

/* The cache's dtype, block size, tokens and bytes into s (servd_model_get_stats). */
void servd__kv_stats(const servd_model *m, servd_model_stats *s);

#endif
