/* Package checks at load and the load summary line. Hashing the code and the small entries costs
 * about a millisecond per MB, so it always runs; hashing the weights reads the whole model
 * (SmolLM2-135M Q4_1, 96.6 MB: tens of milliseconds; 16 GB: seconds on several threads), so it runs
 * only when asked (--verify-weights). */
#include <stdio.h>
#include <string.h>

#include "engine/engine_impl.h"
#include "engine/package_checks.h"
#include "mpk/integrity.h"
#include "mpk/package.h"
#include "servd/clock.h"

/* Set once at startup (servd_engine_set_package_checks), before any model loads. */
static struct {
  bool verify_weights;
  const char *trusted_keys;
} checks_default;

void servd_engine_set_package_checks(bool verify_weights, const char *trusted_keys) {
  checks_default.verify_weights = verify_weights;
  checks_default.trusted_keys = trusted_keys && trusted_keys[0] ? trusted_keys : NULL;
}

void servd__package_checks_default(servd_model_options *o) {
  o->verify_weights = checks_default.verify_weights;
  o->trusted_keys = checks_default.trusted_keys;
}

int servd__model_check_package(servd_model *m, char *report, size_t report_len) {
  mpk_load_checks c = {.verify_weights = m->o.verify_weights, .trusted_keys = m->o.trusted_keys};
  int rc = mpk_load_check(m->pkg, &c, report, report_len);
  /* The family's config and shape checks, as at pack time: a package whose tensors contradict its
   * config is refused here, instead of loading and failing every request. */
  if (!rc) rc = mpk_check_model(m->pkg);
  if (rc) return servd_fail(rc, "refusing the package: %s", servd_last_error());
  return 0;
}

/* "12.3 MB", "4.19 GB", "512 kB": three significant figures or so, whatever the size. */
static const char *human(double bytes, char *buf, size_t n) {
  if (bytes >= 1e9) snprintf(buf, n, "%.2f GB", bytes / 1e9);
  else if (bytes >= 1e6) snprintf(buf, n, "%.1f MB", bytes / 1e6);
  else snprintf(buf, n, "%.0f kB", bytes / 1e3);
  return buf;
}

void servd__model_log_loaded(const servd_model *m, int64_t started_ns, const char *report) {
  double secs = (double)(servd_now_ns() - started_ns) / 1e9;
  uint64_t wbytes = 0;
  for (int i = 0; i < mpk_tensor_count(m->pkg); i++) {
    mpk_tensor_info ti;
    if (mpk_tensor_info_at(m->pkg, i, &ti) == 0) wbytes += ti.nbytes;
  }
  char kv[200] = "";
  if (m->kind == SERVD_MODEL_CAUSAL_LM && m->kv[0]) {
    int blocks = servd_kv_cache_n_blocks(m->kv[0]), bs = servd_kv_cache_block_size(m->kv[0]);
    /* K and V per layer, kv_heads x head_dim values per token per rank, in the dtype's layout */
    double bytes = m->gpus > 0
                       ? (double)m->gpu_kv_bytes * m->tp
                       : (double)servd_kv_cache_block_bytes(m->n_layers, m->kv_heads, m->head_dim, bs, m->o.kv_dtype) *
                             blocks * m->tp;
    char b[32];
    snprintf(kv, sizeof kv, "; KV cache %d blocks x %d tokens = %lld tokens, %s (%s, %d rank%s)", blocks, bs,
             (long long)blocks * bs, human(bytes, b, sizeof b), m->gpus > 0 ? "GPU" : servd_dtype_name(m->o.kv_dtype),
             m->tp, m->tp == 1 ? "" : "s");
  }
  char pb[32], wb[32];
  fprintf(stderr, "servd: model '%s': loaded in %.2f s: package %s (%d tensors, %s of weights)%s; integrity: %s\n",
          m->name, secs, human((double)mpk_size(m->pkg), pb, sizeof pb), mpk_tensor_count(m->pkg),
          human((double)wbytes, wb, sizeof wb), kv, report);
}
