/* Reasoning output on the chat machinery: the chat rendered with chat_template_kwargs through the
 * package's render hook, which names the family's thought markers (models/llama/reasoning.py); each
 * choice's output split into its thought and its answer as it streams (api/reasoning.h). The thought
 * goes out as chat's reasoning_content (delta.reasoning_content when streaming, vLLM's and
 * DeepSeek's field) or through the route's sink (thinking blocks, Ollama's thinking, reasoning
 * items); the answer continues down the chat path as if it were the whole output, so tool calls
 * after a thought are parsed from the answer alone. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/openai-impl.h"
#include "api/openai_tools.h"
#include "api/reasoning.h"
#include "servd/status.h"

typedef struct rgen {
  api_think t;
  servd_buf text; /* the thought so far */
  int tokens;     /* tokens of the thought, its markers included */
} rgen;

struct oai_reasoning {
  int n;
  rgen *g;
  servd_buf answer; /* scratch: one event's answer text */
};

void oai_reasoning_free(oai_reasoning *r) {
  if (!r) return;
  for (int i = 0; i < r->n; i++) {
    api_think_free(&r->g[i].t);
    servd_buf_free(&r->g[i].text);
  }
  free(r->g);
  servd_buf_free(&r->answer);
  free(r);
}

/* From the hook's {"start", "end", "opened"}; NULL when there is none or it cannot be used. */
static oai_reasoning *reasoning_new(json_t *spec, int n) {
  const char *start = json_string_value(json_object_get(spec, "start"));
  const char *end = json_string_value(json_object_get(spec, "end"));
  bool opened = json_is_true(json_object_get(spec, "opened"));
  if (!end || n < 1) return NULL;
  oai_reasoning *r = calloc(1, sizeof *r);
  if (!r || !(r->g = calloc((size_t)n, sizeof *r->g))) {
    free(r);
    return NULL;
  }
  servd_buf_init(&r->answer);
  for (int i = 0; i < n; i++) {
    servd_buf_init(&r->g[i].text);
    if (!api_think_init(&r->g[i].t, opened ? "" : start, end, opened)) { /* markers beyond the splitter's */
      r->n = i + 1;
      oai_reasoning_free(r);
      return NULL;
    }
  }
  r->n = n;
  return r;
}

int oai_chat_render(oai *o, char **prompt, char **grammar, const char **param) {
  const servd_model_ops *ops = o->a->ops;
  servd_model *m = o->am->m;
  *prompt = *grammar = NULL;
  *param = "messages";
  int n = o->n_prompts * o->n;
  json_t *res = NULL;
  int rc = o->tools ? oai_tools_prepare(o->tools, ops, m, o->messages, o->template_kwargs, o->add_generation_prompt, n,
                                        prompt, grammar, param, &res)
                    : oai_render_call(ops, m, o->messages, NULL, o->template_kwargs, o->add_generation_prompt, &res);
  if (rc == 0 && !o->tools) {
    json_t *p = json_object_get(res, "prompt");
    *prompt = json_is_string(p) ? strdup(json_string_value(p)) : NULL;
    if (!*prompt) rc = servd_fail(SERVD_EFORMAT, "chat template: the render hook gave no prompt");
  }
  if (rc == 0 && o->mode == OAI_CHAT && json_is_object(json_object_get(res, "reasoning")))
    o->reasoning = reasoning_new(json_object_get(res, "reasoning"), n);
  json_decref(res);
  return rc;
}

/* ---- the output, on the loop -------------------------------------------------------------------- */

typedef struct emit_ctx {
  oai *o;
  gen *g;
  rgen *rg;
} emit_ctx;

static void on_piece(void *ud, bool thinking, const char *s, size_t n) {
  emit_ctx *c = ud;
  oai *o = c->o;
  if (!thinking) {
    servd_buf_append(&o->reasoning->answer, s, n);
    return;
  }
  servd_buf_append(&c->rg->text, s, n);
  if (!o->stream || !o->req) return;
  if (!o->sink) o->reasoning_chunk(o, c->g, s, n);
  else if (o->sink->stream_reasoning) o->sink->stream_reasoning(o, c->g, s, n);
}

void oai_reasoning_token(oai *o, gen *g, api_event *ev) {
  oai_reasoning *r = o->reasoning;
  rgen *rg = &r->g[g->index];
  if (rg->t.done) return; /* the held answer of oai_reasoning_end, or text after the end */
  bool before = api_think_thinking(&rg->t);
  emit_ctx c = {o, g, rg};
  servd_buf_clear(&r->answer);
  api_think_feed(&rg->t, ev->text ? ev->text : "", ev->text_len, false, on_piece, &c);
  if (ev->token >= 0 && (before || api_think_thinking(&rg->t))) rg->tokens++;
  /* The event goes on with the answer's text: the chat path never sees the thought. The event owns
   * its text buffer (text_cap bytes, recycled by api.c), so it may grow here. */
  size_t n = r->answer.oom ? 0 : r->answer.len;
  if (n > ev->text_cap) {
    char *t = realloc(ev->text, n);
    if (!t) n = 0;
    else ev->text = t, ev->text_cap = n;
  }
  if (n) memcpy(ev->text, r->answer.data, n);
  ev->text_len = n;
}

const char *oai_reasoning_end(oai *o, gen *g, const api_event *ev, size_t *len) {
  oai_reasoning *r = o->reasoning;
  rgen *rg = &r->g[g->index];
  *len = 0;
  if (rg->t.done) return NULL;
  emit_ctx c = {o, g, rg};
  servd_buf_clear(&r->answer);
  api_think_feed(&rg->t, NULL, 0, true, on_piece, &c);
  if (!r->answer.len || r->answer.oom || ev->kind == SERVD_EVENT_ERROR || !o->req) return NULL;
  *len = r->answer.len;
  return r->answer.data;
}

const char *oai_reasoning_text(const oai *o, int gen, size_t *len) {
  const oai_reasoning *r = o->reasoning;
  *len = 0;
  if (!r || gen < 0 || gen >= r->n || !r->g[gen].t.thought) return NULL;
  *len = r->g[gen].text.len;
  return r->g[gen].text.data ? r->g[gen].text.data : "";
}

int oai_reasoning_tokens(const oai *o, int gen) {
  const oai_reasoning *r = o->reasoning;
  return r && gen >= 0 && gen < r->n ? r->g[gen].tokens : 0;
}
