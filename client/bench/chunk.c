/* What one OpenAI streaming chunk carries: the text of choices[0] (completions: "text"; chat:
 * "delta.content", or "delta.reasoning_content" for servers that stream reasoning apart), an error
 * object, or a usage object. */
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "bench.h"

static void take_text(json_t *v, bench_chunk *out) {
  if (json_is_string(v) && json_string_length(v) > 0 && (!out->text || !out->text_len)) {
    out->text = json_string_value(v);
    out->text_len = json_string_length(v);
  }
}

int bench_chunk_parse(const char *data, size_t len, bench_api api, bench_chunk *out, json_t **json_out) {
  memset(out, 0, sizeof *out);
  out->usage_completion_tokens = -1;
  *json_out = NULL;
  json_error_t jerr;
  /* \u0000 is valid JSON and a model may emit a NUL byte: accept it (jansson refuses by default). */
  json_t *root = json_loadb(data, len, JSON_ALLOW_NUL, &jerr);
  if (!json_is_object(root)) {
    snprintf(out->errmsg, sizeof out->errmsg, "stream chunk is not a JSON object: %.80s",
             root ? "other JSON type" : jerr.text);
    json_decref(root);
    return -1;
  }
  *json_out = root;
  json_t *err = json_object_get(root, "error");
  if (err && !json_is_null(err)) {
    out->is_error = true;
    json_t *msg = json_is_object(err) ? json_object_get(err, "message") : err;
    snprintf(out->errmsg, sizeof out->errmsg, "error in stream: %.100s",
             json_is_string(msg) ? json_string_value(msg) : "(no message)");
    return 0;
  }
  json_t *usage = json_object_get(root, "usage");
  json_t *ct = json_is_object(usage) ? json_object_get(usage, "completion_tokens") : NULL;
  if (json_is_integer(ct)) out->usage_completion_tokens = (long)json_integer_value(ct);

  json_t *choices = json_object_get(root, "choices");
  json_t *c0 = json_is_array(choices) ? json_array_get(choices, 0) : NULL;
  if (!json_is_object(c0)) return 0; /* e.g. the final usage-only chunk */
  if (api == BENCH_API_CHAT) {
    json_t *delta = json_object_get(c0, "delta");
    if (json_is_object(delta)) {
      take_text(json_object_get(delta, "content"), out);
      take_text(json_object_get(delta, "reasoning_content"), out);
    }
  } else {
    take_text(json_object_get(c0, "text"), out);
  }
  return 0;
}
