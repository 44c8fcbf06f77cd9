/* The KV cache's dtype: option, package default, f16 (kv_dtype.h). */
#include <stdio.h>
#include <string.h>

#include "engine/engine.h"
#include "engine/engine_impl.h"
#include "engine/kv_dtype.h"
#include "mpk/package.h"

int servd_kv_dtype_parse(const char *name, servd_dtype *out) {
  servd_dtype t;
  if (!name || servd_dtype_from_name(name, &t) != 0 || !servd_kv_cache_dtype_ok(t))
    return servd_fail(SERVD_EINVAL, "expected f16, bf16, q8_0, q4_0 or f32, got '%s'", name ? name : "");
  *out = t;
  return 0;
}

/* Set once at startup (servd_engine_set_kv_dtype), before any model loads: what the models the
 * repository API loads get when their options leave the dtype to the package. */
static servd_dtype process_default = SERVD_DTYPE_COUNT;

void servd_engine_set_kv_dtype(servd_dtype t) { process_default = servd_kv_cache_dtype_ok(t) ? t : SERVD_DTYPE_COUNT; }

int servd__kv_dtype_resolve(servd_model *m, int head_dim) {
  if (m->o.kv_dtype == SERVD_DTYPE_COUNT) m->o.kv_dtype = process_default;
  bool asked = m->o.kv_dtype != SERVD_DTYPE_COUNT;
  servd_dtype t = asked ? m->o.kv_dtype : SERVD_F16;
  const char *from = "--kv-cache-dtype";
  json_t *v = json_object_get(mpk_manifest(m->pkg), "kv_cache_dtype");
  if (!asked && v) {
    from = "the package's kv_cache_dtype";
    if (!json_is_string(v) || servd_kv_dtype_parse(json_string_value(v), &t) != 0)
      return servd_fail(SERVD_EINVAL,
                        "%s: manifest kv_cache_dtype: expected \"f16\", \"bf16\", \"q8_0\", \"q4_0\" or "
                        "\"f32\"",
                        mpk_path(m->pkg));
  }
  if (m->o.gpus > 0 && t != SERVD_F16) {
    if (asked)
      return servd_fail(SERVD_EINVAL,
                        "%s: --kv-cache-dtype %s: a GPU KV cache is f16 only (the quantized caches run on the CPU)",
                        mpk_path(m->pkg), servd_dtype_name(t));
    fprintf(stderr, "servd: model '%s': %s is %s; the GPU KV cache is f16\n", m->name, from, servd_dtype_name(t));
    t = SERVD_F16;
  }
  if ((t == SERVD_Q8_0 || t == SERVD_Q4_0) && head_dim % 32 != 0)
    return servd_fail(SERVD_EINVAL,
                      "%s: %s %s quantizes blocks of 32 dims, and this model's head_dim is %d: use f16 or bf16",
                      mpk_path(m->pkg), from, servd_dtype_name(t), head_dim);
  m->o.kv_dtype = t;
  return 0;
}

void servd__kv_stats(const servd_model *m, servd_model_stats *s) {
  if (!m->kv[0]) return;
  int blocks = servd_kv_cache_n_blocks(m->kv[0]), bs = servd_kv_cache_block_size(m->kv[0]);
  bool gpu = m->gpus > 0;
  snprintf(s->kv_cache_dtype, sizeof s->kv_cache_dtype, "%s", servd_dtype_name(gpu ? SERVD_F16 : m->o.kv_dtype));
  s->kv_block_size = bs;
  s->kv_cache_tokens = (uint64_t)blocks * (uint64_t)bs;
  s->kv_cache_bytes =
      gpu ? (uint64_t)m->gpu_kv_bytes * (uint64_t)m->tp
          : (uint64_t)servd_kv_cache_block_bytes(m->n_layers, m->kv_heads, m->head_dim, bs, m->o.kv_dtype) *
                (uint64_t)blocks * (uint64_t)m->tp;
}
