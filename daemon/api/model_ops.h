/* The calls the API layer makes on a model, as a table of functions with engine.h's signatures.
 *
 * servd_engine_model_ops forwards each to daemon/engine/engine.h; tests substitute a table of their
 * own to drive the HTTP and API layers without loading a package.
 */
#ifndef SERVD_API_MODEL_OPS_H
#define SERVD_API_MODEL_OPS_H

#include "engine/engine.h"

typedef struct servd_model_ops {
  void (*options_default)(servd_model_options *o);
  void (*gen_params_default)(servd_gen_params *p);
  int (*load)(const servd_model_options *o, servd_model **out);
  void (*unload)(servd_model *m, int deadline_ms);
  const char *(*name)(const servd_model *m);
  servd_model_kind (*kind)(const servd_model *m);
  bool (*ready)(const servd_model *m);
  json_t *(*metadata)(const servd_model *m);
  int (*tokenize)(servd_model *m, const char *text, size_t len, bool add_special, int32_t **ids, int *n);
  int (*detokenize)(servd_model *m, const int32_t *ids, int n, char **text);
  int (*apply_chat_template)(servd_model *m, json_t *messages, bool add_generation_prompt, char **text);
  int (*context_length)(const servd_model *m);
  int (*submit)(servd_model *m, const int32_t *prompt, int n_prompt, const servd_gen_params *p, servd_event_cb cb,
                void *ud, servd_request **out);
  void (*cancel)(servd_request *r);
  void (*release)(servd_request *r);
  int (*predict)(servd_model *m, const servd_named_tensor *inputs, int n_inputs, servd_named_tensor **outputs,
                 int *n_outputs, int64_t deadline_ms, servd_model_error *err);
  void (*get_stats)(const servd_model *m, servd_model_stats *s);
  /* Appended; NULL: the model has no constrained decoding (a constrained request is a 400). */
  int (*guide_compile)(servd_model *m, servd_guide_kind kind, const char *spec, char **grammar);
  /* Appended; NULL: never (the model is ready or not, nothing in between). */
  bool (*restarting)(const servd_model *m, char *why, size_t cap);
  /* Appended; NULL: none. servd_engine_quarantined_interpreters. */
  int (*quarantined_interpreters)(void);
  /* Appended; NULL: no tool calling (a request with tools is a 400). servd_model_tools_*. */
  int (*tools_render)(servd_model *m, json_t *messages, json_t *tools, bool add_generation_prompt, json_t **out);
  int (*tools_parse)(servd_model *m, const char *text, json_t *spec, json_t **out);
  /* Appended; NULL: gen_params_default for every model, and no vocabulary check of logit_bias. */
  void (*model_gen_params_default)(const servd_model *m, servd_gen_params *p);
  int (*vocab_size)(const servd_model *m);
  /* Appended; NULL: no embeddings (POST /v1/embeddings answers 400). servd_model_embedding_info. */
  int (*embedding_info)(const servd_model *m, servd_embedding_info *out);
  /* Appended; NULL: no limit known (metrics and readiness leave it out). servd_interp_namespaces_free:
   * the interpreter namespaces (of 15 per process) a load could still take. */
  int (*interpreter_namespaces_free)(void);
  /* Appended; NULL: no LoRA adapters (a request naming one is a 404, loading one a 400).
   * servd_model_lora_*, servd_model_has_lora. */
  int (*lora_load)(servd_model *m, const char *name, const char *path);
  int (*lora_unload)(servd_model *m, const char *name);
  bool (*has_lora)(servd_model *m, const char *name);
  int (*lora_list)(servd_model *m, servd_lora_info *out, int cap, int *max_loras);
  /* Appended; NULL: sleep level 1 frees nothing (the model stays as it is). servd_model_release_kv. */
  int (*release_kv)(servd_model *m);
  /* Appended; NULL: no text pairs (/v1/rerank and /v1/score answer 400). servd_model_tokenize_pair. */
  int (*tokenize_pair)(servd_model *m, const char *a, size_t alen, const char *b, size_t blen, int max_len,
                       int32_t **ids, int *n, int *pair_split);
} servd_model_ops;

/* The engine's implementation (daemon/api/engine_ops.c). */
extern const servd_model_ops servd_engine_model_ops;

#endif
