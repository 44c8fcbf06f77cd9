/* Tool calling on the OpenAI routes (internal to daemon/api): the request fields (tools, tool_choice,
 * parallel_tool_calls, legacy functions / function_call, tool_calls and tool_call_id in messages), the
 * rendering of the chat with its tools and the grammar that forces a call (on the prep worker), the
 * holding back of streamed text from where a call starts, and the calls parsed from the output.
 * The call format is the model family's, known only to the package's Python (tools.py). */
#ifndef SERVD_API_OPENAI_TOOLS_H
#define SERVD_API_OPENAI_TOOLS_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "api/model_ops.h"
#include "api/params_check.h"

/* Bounds the template's and the grammar's cost (OpenAI's limit on the count, too). */
#define OAI_MAX_TOOLS 128
#define OAI_MAX_TOOLS_BYTES (256 * 1024)

typedef struct oai_tools oai_tools;

/* The tool fields of a chat request into o->tools (NULL when none, or tool_choice "none"). False
 * with a 400 naming the field. Checks against a constraint already in o (a forced call is one). */
bool oai_parse_tools(api_check *v, json_t *body, oai_params *o);
/* One message's tool fields: an assistant's tool_calls, a tool result's tool_call_id, copied into
 * out (the normalized message). param: "messages[i]". */
bool oai_check_message_tools(api_check *v, const char *param, json_t *in, json_t *out);
void oai_tools_free(oai_tools *t); /* accepts NULL */

/* Prep worker: renders messages through the package's render hook (ops->tools_render) with the
 * options object {"tools": tools or null, "chat_template_kwargs": kwargs or null} (models/llama/
 * reasoning.py). *res (new reference): {"prompt", "options": true, "reasoning"?, "markers"?,
 * "family"?}. Code packed before the options object (its result lacks "options") is called as it
 * was: with the tools list, or without tools through ops->apply_chat_template ({"prompt"} only);
 * kwargs it cannot take are a 400. 0 or an engine code. */
int oai_render_call(const servd_model_ops *ops, servd_model *m, json_t *messages, json_t *tools, json_t *kwargs,
                    bool add_gen, json_t **res);

/* Prep worker: renders messages with the tools and kwargs (oai_render_call; *prompt, caller frees;
 * *res: the hook's result, caller releases) and, for a forced call, compiles its grammar (*grammar,
 * caller frees; NULL otherwise). n_gens: the choices to track. 0, or an engine code with *param set
 * to the field at fault. */
int oai_tools_prepare(oai_tools *t, const servd_model_ops *ops, servd_model *m, json_t *messages, json_t *kwargs,
                      bool add_gen, int n_gens, char **prompt, char **grammar, const char **param, json_t **res);

/* Streaming: choice gen's whole text so far is text[0, len); returns how far, from where the last
 * call left off (*from), the text is content that may go out now: up to where a call starts, less
 * what could still become the start of one. */
size_t oai_tools_releasable(oai_tools *t, int gen, const char *text, size_t len, size_t *from);

/* End of choice gen (worker thread): parses its text. 0, or an engine code (the model's hook failed). */
int oai_tools_parse(oai_tools *t, const servd_model_ops *ops, servd_model *m, int gen, const char *text, size_t len);
/* After the parse: its calls ([{id, type, function: {name, arguments}}], borrowed; NULL: none); the
 * content without the calls (borrowed; NULL: none), whether the choice had a call. */
json_t *oai_tools_calls(const oai_tools *t, int gen);
const char *oai_tools_content(const oai_tools *t, int gen);
/* After the parse: the text was a forced call that did not complete (cut by max_tokens), and
 * withheld: the choice has neither calls nor content. */
bool oai_tools_withheld(const oai_tools *t, int gen);
/* Legacy functions: the response carries message.function_call instead of tool_calls. */
bool oai_tools_legacy(const oai_tools *t);

#endif
