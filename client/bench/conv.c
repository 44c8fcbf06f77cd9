/* Multi-turn chat: each conversation asks its turns one after another, and every turn resends the
 * whole history, as a chat UI does: the shared prefix (when set) as the system prompt, each earlier
 * user turn with the answer the server streamed for it, then the new user turn. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

int bench_conv_init(bench_conv *c, const bench_config *cfg, int index) {
  memset(c, 0, sizeof *c);
  c->index = index;
  c->answers = calloc((size_t)cfg->turns, sizeof *c->answers);
  c->answer_tokens = calloc((size_t)cfg->turns, sizeof *c->answer_tokens);
  return c->answers && c->answer_tokens ? 0 : -1;
}

void bench_conv_free(bench_conv *c, const bench_config *cfg) {
  if (c->answers)
    for (int i = 0; i < cfg->turns; i++) free(c->answers[i]);
  free(c->answers);
  free(c->answer_tokens);
  memset(c, 0, sizeof *c);
}

char *bench_conv_user(const bench_config *cfg, int conv, int turn, int *tokens) {
  int n = cfg->input_len > 0 ? cfg->input_len : 1;
  *tokens = n;
  return bench_random_words(bench_mix(bench_mix(bench_mix(cfg->seed, 0xc0417ULL), (uint64_t)conv), (uint64_t)turn), n);
}

/* The system prompt of a conversation (its shared prefix), or NULL without one. */
static char *system_prompt(const bench_config *cfg, const bench_conv *c) {
  if (cfg->shared_prefix_len <= 0) return NULL;
  uint64_t k = (uint64_t)c->index % (uint64_t)(cfg->prefixes > 0 ? cfg->prefixes : 1);
  return bench_random_words(bench_prefix_seed(cfg, k), cfg->shared_prefix_len);
}

static int add_message(json_t *msgs, const char *role, const char *content) {
  return json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", role, "content", content));
}

/* Appends s to a growing transcript. */
static int put(char **buf, size_t *len, size_t *cap, const char *s) {
  size_t n = strlen(s);
  if (*len + n + 1 > *cap) {
    size_t nc = *cap ? *cap * 2 : 4096;
    while (nc < *len + n + 1) nc *= 2;
    char *b = realloc(*buf, nc);
    if (!b) return -1;
    *buf = b;
    *cap = nc;
  }
  memcpy(*buf + *len, s, n + 1);
  *len += n;
  return 0;
}

char *bench_body_turn(const bench_config *cfg, const bench_conv *c, int *in_tokens) {
  int turn = c->next_turn;
  char *sys = system_prompt(cfg, c);
  int tokens = sys ? cfg->shared_prefix_len : 0;
  json_t *msgs = json_array();
  char *text = NULL; /* completions: the transcript */
  size_t len = 0, cap = 0;
  char *body = NULL;
  int rc = msgs ? 0 : -1;
  if (sys) {
    if (cfg->api == BENCH_API_CHAT) rc |= add_message(msgs, "system", sys);
    else rc |= put(&text, &len, &cap, sys) | put(&text, &len, &cap, "\n\n");
  }
  for (int t = 0; t <= turn && rc == 0; t++) {
    int ut = 0;
    char *user = bench_conv_user(cfg, c->index, t, &ut);
    if (!user) {
      rc = -1;
      break;
    }
    tokens += ut;
    const char *answer = t < turn && c->answers[t] ? c->answers[t] : "";
    if (t < turn) tokens += c->answer_tokens[t];
    if (cfg->api == BENCH_API_CHAT) {
      rc |= add_message(msgs, "user", user);
      if (t < turn) rc |= add_message(msgs, "assistant", answer);
    } else {
      rc |= put(&text, &len, &cap, "User: ") | put(&text, &len, &cap, user) | put(&text, &len, &cap, "\nAssistant:");
      if (t < turn) rc |= put(&text, &len, &cap, answer) | put(&text, &len, &cap, "\n");
    }
    free(user);
  }
  if (rc == 0) {
    if (cfg->api == BENCH_API_CHAT) body = bench_body_chat_messages(cfg, msgs, cfg->output_len);
    else body = bench_body_openai(cfg, text, cfg->output_len);
  }
  json_decref(msgs);
  free(text);
  free(sys);
  *in_tokens = tokens;
  return body;
}

int bench_conv_answer(bench_conv *c, const char *text, size_t len, int tokens) {
  char *a = malloc(len + 1);
  if (!a) return -1;
  if (len) memcpy(a, text, len);
  a[len] = '\0';
  free(c->answers[c->next_turn]);
  c->answers[c->next_turn] = a;
  c->answer_tokens[c->next_turn] = tokens;
  c->next_turn++;
  return 0;
}
