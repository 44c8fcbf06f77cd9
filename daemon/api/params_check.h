/* Internal to the request-parameter files of daemon/api (openai_params.c, kserve_params.c,
 * params_adopt.c): the checks of one JSON field each, with the message and the field's name that a
 * 400 answers with. The first failure is kept; later ones are ignored. */
#ifndef SERVD_API_PARAMS_CHECK_H
#define SERVD_API_PARAMS_CHECK_H

#include <jansson.h>
#include <stdbool.h>

#include "api/request_params.h"

typedef struct api_check {
  api_param_error *err;
  servd_arena *arena; /* strings adopted from the request */
  const char *where;  /* prefix of field names ("" or "parameters."), borrowed */
  bool failed;
} api_check;

/* Records a 400 naming where + param (param NULL: no field); returns false. */
bool api_check_fail(api_check *c, const char *param, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* "an object", "a string", ... for messages; j may be NULL (a missing field). */
const char *api_json_type(const json_t *j);

/* obj's field key when present and not null (null means absent, as OpenAI's clients send it). */
json_t *api_check_field(json_t *obj, const char *key);

/* How deep a constraint's JSON (a schema, a tool's parameters) may nest: the grammar engine's
 * compile recurses through it (a 2000-deep schema once overflowed the interpreter's recursion limit,
 * a 500); pydantic's deepest models stay far below, their nesting goes through "$defs". */
#define API_MAX_SCHEMA_DEPTH 64
/* Whether j nests at most max containers deep (a scalar is 0, [] or {} 1). */
bool api_json_depth_ok(const json_t *j, int max);

/* An integer, or a real with an integral value (5.0 is 5, as lax JSON schema validators take it). */
bool api_check_as_int(const json_t *j, long long *out);

/* Each: true when the field is absent (*present false, *out untouched) or valid (*out set). */
bool api_check_number(api_check *c, json_t *obj, const char *key, double lo, double hi, bool lo_open, bool *present,
                      double *out);
bool api_check_int(api_check *c, json_t *obj, const char *key, long long lo, long long hi, bool *present,
                   long long *out);
bool api_check_bool(api_check *c, json_t *obj, const char *key, bool *out);

#endif
