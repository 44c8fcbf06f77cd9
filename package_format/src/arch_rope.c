/* The rope_scaling checks that need more than a type and a factor: YaRN (Qwen2/2.5) and LongRoPE
 * (Phi-3/3.5). The model code (models/llama/rope_scaling.py) reads exactly these keys; each is
 * checked here so that a bad value is refused at pack time and at load, naming the key. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "arch.h"
#include "mpk-impl.h"
#include "servd/status.h"

const char *mpk__rope_type(const json_t *c) {
  json_t *rs = json_object_get(c, "rope_scaling");
  if (!json_is_object(rs) || json_object_size(rs) == 0) return NULL;
  json_t *ty = json_object_get(rs, "rope_type");
  if (!ty) ty = json_object_get(rs, "type");
  return json_is_string(ty) ? json_string_value(ty) : "";
}

/* rope_scaling.key absent or null, or a finite number >= min (> min when strict). */
static int num(const char *what, const json_t *rs, const char *key, double min, bool strict) {
  json_t *v = json_object_get(rs, key);
  if (!v || json_is_null(v)) return 0;
  double x = json_number_value(v);
  if (json_is_number(v) && isfinite(x) && (strict ? x > min : x >= min)) return 0;
  return servd_fail(SERVD_EFORMAT, "%s: config: \"rope_scaling.%s\": expected a finite number %s %g", what, key,
                    strict ? ">" : ">=", min);
}

int mpk__cfg_rope_yarn(const char *what, const json_t *c) {
  const json_t *rs = json_object_get(c, "rope_scaling");
  int rc;
  if (!json_is_number(json_object_get(rs, "factor")))
    return servd_fail(SERVD_EFORMAT, "%s: config: \"rope_scaling.factor\": missing, expected a number >= 1 (yarn)",
                      what);
  if ((rc = num(what, rs, "factor", 1, false)) || (rc = num(what, rs, "beta_fast", 0, true)) ||
      (rc = num(what, rs, "beta_slow", 0, true)) || (rc = num(what, rs, "attention_factor", 0, true)) ||
      (rc = num(what, rs, "mscale", 0, false)) || (rc = num(what, rs, "mscale_all_dim", 0, false)))
    return rc;
  int64_t orig;
  if ((rc = mpk__cfg_int(what, rs, "original_max_position_embeddings", false, 1, &orig))) return rc;
  json_t *t = json_object_get(rs, "truncate");
  if (t && !json_is_boolean(t) && !json_is_null(t))
    return servd_fail(SERVD_EFORMAT, "%s: config: \"rope_scaling.truncate\": expected true or false", what);
  return 0;
}

int mpk__cfg_rope_longrope(const char *what, const json_t *c, int64_t head_dim) {
  const json_t *rs = json_object_get(c, "rope_scaling");
  static const char *const keys[] = {"short_factor", "long_factor"};
  for (int k = 0; k < 2; k++) {
    json_t *a = json_object_get(rs, keys[k]);
    if (!json_is_array(a) || (int64_t)json_array_size(a) * 2 != head_dim)
      return servd_fail(SERVD_EFORMAT,
                        "%s: config: \"rope_scaling.%s\": expected a list of head_dim/2 = %lld numbers%s", what,
                        keys[k], (long long)(head_dim / 2), json_is_array(a) ? "" : " (missing)");
    for (size_t i = 0; i < json_array_size(a); i++) {
      double x = json_number_value(json_array_get(a, i));
      if (!json_is_number(json_array_get(a, i)) || !isfinite(x) || x <= 0)
        return servd_fail(SERVD_EFORMAT, "%s: config: \"rope_scaling.%s\"[%zu]: expected a finite number > 0", what,
                          keys[k], i);
    }
  }
  int rc;
  int64_t orig, rs_orig;
  if ((rc = num(what, rs, "attention_factor", 0, true)) || (rc = num(what, rs, "factor", 0, true)) ||
      (rc = mpk__cfg_int(what, c, "original_max_position_embeddings", false, 1, &orig)) ||
      (rc = mpk__cfg_int(what, rs, "original_max_position_embeddings", false, 1, &rs_orig)))
    return rc;
  return 0;
}
