/* Tool calling in the engine: the calls into the package's Python hooks (models/llama/tools.py, via
 * the entry object's tool_render / tool_parse) that render a chat with tools and parse the model's
 * output into calls. Both run on the interpreter thread that renders chat templates, like them. */
#include <stdlib.h>
#include <string.h>

#include "engine/engine_impl.h"
#include "engine/model_error.h"

typedef struct tool_job {
  servd_model *m;
  const char *method;
  json_t *args, *res;
  servd_py_error err;
} tool_job;

static int tool_job_run(void *arg) {
  tool_job *j = arg;
  return servd_interp_call_json(servd_pool_get(j->m->pool, j->m->chat_interp), j->method, j->args, &j->res, 10000,
                                &j->err);
}

/* Calls method(args...) (steals args); *res: a new reference. */
static int tool_call(servd_model *m, const char *method, json_t *args, json_t **res) {
  *res = NULL;
  if (m->kind != SERVD_MODEL_CAUSAL_LM || m->chat_interp < 0 || !m->ithread)
    return json_decref(args), servd_fail(SERVD_EUNSUPPORTED, "tool calling: model %s is not a language model", m->name);
  if (!args) return servd_fail(SERVD_ENOMEM, "tool calling: arguments");
  tool_job j = {.m = m, .method = method, .args = args};
  memset(&j.err, 0, sizeof j.err);
  pthread_mutex_lock(&m->chat_mu);
  int rc = servd_interp_thread_run(m->ithread, tool_job_run, &j);
  pthread_mutex_unlock(&m->chat_mu);
  json_decref(args);
  if (rc) {
    json_decref(j.res);
    /* A package packed before these hooks existed: the request asks for what this model lacks. */
    if (!strcmp(j.err.type, "AttributeError") && strstr(j.err.message, method))
      return servd_fail(SERVD_EUNSUPPORTED,
                        "tool calling: the package of model %s has no tool-calling hooks "
                        "(repack it with this servd's model code)",
                        m->name);
    int code = servd_model_error_code(rc, &j.err, SERVD_CALL_TEMPLATE, NULL);
    if (!j.err.type[0]) {
      char msg[512]; /* servd_fail writes the buffer servd_last_error returns: copy it first */
      snprintf(msg, sizeof msg, "%s", servd_last_error());
      return servd_fail(code, "tool calling: %s", msg);
    }
    return servd_fail(code, "tool calling: %s: %s", j.err.type, j.err.message);
  }
  if (!json_is_object(j.res)) {
    json_decref(j.res);
    return servd_fail(SERVD_EFORMAT, "tool calling: %s() returned no object", method);
  }
  *res = j.res;
  return 0;
}

int servd_model_tools_render(servd_model *m, json_t *messages, json_t *tools, bool add_generation_prompt,
                             json_t **out) {
  return tool_call(m, "tool_render", json_pack("[O, b, O]", messages, add_generation_prompt, tools), out);
}

int servd_model_tools_parse(servd_model *m, const char *text, json_t *spec, json_t **out) {
  return tool_call(m, "tool_parse", json_pack("[s, O]", text, spec), out);
}
