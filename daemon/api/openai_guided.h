/* Internal to the OpenAI request parser (openai_params.c): the constrained-decoding fields and the
 * refusal of fields servd does not implement (openai_guided.c). */
#ifndef SERVD_API_OPENAI_GUIDED_H
#define SERVD_API_OPENAI_GUIDED_H

#include "api/params_check.h"

/* response_format, guided_json / guided_regex / guided_choice / guided_grammar, structured_outputs,
 * guided_decoding_backend: at most one constraint, into o->guide_*. False with a 400 naming the field. */
bool oai_parse_guided(api_check *v, json_t *body, oai_params *o);
/* A 400 naming the first field set that servd does not implement (a value that asks for what servd
 * does anyway, such as "skip_special_tokens": true, is accepted). */
bool oai_refuse_unimplemented(api_check *v, json_t *body);

#endif
