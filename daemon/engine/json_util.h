/* Reading integer fields of a model config (JSON). */
#ifndef SERVD_ENGINE_JSON_UTIL_H
#define SERVD_ENGINE_JSON_UTIL_H

#include <jansson.h>

/* obj[key] when it is an integer, else dflt (obj may be NULL). Nest calls for alternative keys:
 * servd_json_int(cfg, "hidden_size", servd_json_int(cfg, "embedding_length", 0)). */
static inline int servd_json_int(json_t *obj, const char *key, int dflt) {
  json_t *v = obj ? json_object_get(obj, key) : NULL;
  return json_is_integer(v) ? (int)json_integer_value(v) : dflt;
}

#endif
