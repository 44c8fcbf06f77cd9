/* Checks of single JSON fields for the request-parameter files (see api/params_check.h). */
#include "api/params_check.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>

bool api_check_fail(api_check *c, const char *param, const char *fmt, ...) {
  if (c->failed) return false;
  c->failed = true;
  char msg[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  c->err->status = 400;
  if (param) snprintf(c->err->param, sizeof c->err->param, "%s%s", c->where ? c->where : "", param);
  else c->err->param[0] = '\0';
  snprintf(c->err->message, sizeof c->err->message, "%s", msg[0] ? msg : "invalid request");
  api_utf8_fix(c->err->message);
  return false;
}

const char *api_json_type(const json_t *j) {
  if (!j) return "nothing (the field is missing)"; /* json_typeof reads through its argument */
  switch (json_typeof(j)) {
  case JSON_OBJECT: return "an object";
  case JSON_ARRAY: return "an array";
  case JSON_STRING: return "a string";
  case JSON_INTEGER: return "an integer";
  case JSON_REAL: return "a number";
  case JSON_TRUE:
  case JSON_FALSE: return "a boolean";
  default: return "null";
  }
}

json_t *api_check_field(json_t *obj, const char *key) {
  json_t *j = json_object_get(obj, key);
  return j && !json_is_null(j) ? j : NULL;
}

bool api_check_as_int(const json_t *j, long long *out) {
  if (json_is_integer(j)) {
    *out = json_integer_value(j);
    return true;
  }
  if (json_is_real(j)) {
    double d = json_real_value(j);
    if (isfinite(d) && d == floor(d) && fabs(d) < 9.0e15) {
      *out = (long long)d;
      return true;
    }
  }
  return false;
}

bool api_check_number(api_check *c, json_t *obj, const char *key, double lo, double hi, bool lo_open, bool *present,
                      double *out) {
  json_t *j = api_check_field(obj, key);
  if (present) *present = j != NULL;
  if (!j) return true;
  const char *w = c->where ? c->where : "";
  if (!json_is_number(j)) return api_check_fail(c, key, "'%s%s' must be a number, got %s", w, key, api_json_type(j));
  double d = json_number_value(j);
  if (!isfinite(d) || d < lo || d > hi || (lo_open && d == lo))
    return api_check_fail(c, key, "'%s%s' must be in %s%g, %g], got %g", w, key, lo_open ? "(" : "[", lo, hi, d);
  *out = d;
  return true;
}

bool api_check_int(api_check *c, json_t *obj, const char *key, long long lo, long long hi, bool *present,
                   long long *out) {
  json_t *j = api_check_field(obj, key);
  if (present) *present = j != NULL;
  if (!j) return true;
  const char *w = c->where ? c->where : "";
  long long x;
  if (!api_check_as_int(j, &x))
    return api_check_fail(c, key, "'%s%s' must be an integer, got %s", w, key, api_json_type(j));
  if (x < lo || x > hi) return api_check_fail(c, key, "'%s%s' must be in [%lld, %lld], got %lld", w, key, lo, hi, x);
  *out = x;
  return true;
}

bool api_check_bool(api_check *c, json_t *obj, const char *key, bool *out) {
  json_t *j = api_check_field(obj, key);
  if (!j) return true;
  if (!json_is_boolean(j))
    return api_check_fail(c, key, "'%s%s' must be a boolean, got %s", c->where ? c->where : "", key, api_json_type(j));
  *out = json_is_true(j);
  return true;
}

bool api_json_depth_ok(const json_t *j, int max) {
  if (!json_is_object(j) && !json_is_array(j)) return true;
  if (max <= 0) return false;
  size_t i;
  const char *k;
  json_t *e;
  if (json_is_array(j)) {
    json_array_foreach(j, i, e) if (!api_json_depth_ok(e, max - 1)) return false;
  } else {
    json_object_foreach((json_t *)j, k, e) if (!api_json_depth_ok(e, max - 1)) return false;
  }
  return true;
}
