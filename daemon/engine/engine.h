/* The engine of one loaded model: what the HTTP layer and `servd generate` talk to.
 *
 * A servd_model is a loaded package (interpreter pool; for causal-lm packages also tokenizer,
 * KV cache, scheduler thread doing continuous batching). Language-model requests are submitted with
 * their prompt tokens and generation parameters; the engine calls back with events from its own
 * thread (the HTTP layer marshals them to its loop with uv_async). Generic packages are called through
 * servd_model_predict. The values these functions take and give (options, generation parameters,
 * events, statistics) are in engine/types.h, which lower engine files include instead of this one.
 */
#ifndef SERVD_ENGINE_H
#define SERVD_ENGINE_H

#include <stdbool.h>
#include <stdint.h>
#include <jansson.h>

#include "engine/types.h"
#include "servd/status.h"
#include "servd/tensor.h"

/* Defaults; the GPU fields come from servd_engine_set_gpu_defaults (none set: CPU, 0.9, graphs on,
 * 64) and step_timeout_s from servd_engine_set_step_timeout (none set: 120), so that every model
 * this process loads, also through the repository API, uses them. */
void servd_model_options_default(servd_model_options *o);
/* Process-wide GPU defaults for servd_model_options_default; call before loading models. */
void servd_engine_set_gpu_defaults(int gpus, double gpu_memory_fraction, bool cuda_graphs, int cuda_graph_max_batch);
/* Process-wide default of step_timeout_s (seconds, 0: none); call before loading models. */
void servd_engine_set_step_timeout(double seconds);
/* Process-wide defaults of speculative and num_speculative_tokens; call before loading models. */
void servd_engine_set_speculation(int mode, int num_speculative_tokens);
/* A KV cache dtype by name (--kv-cache-dtype, the config's kv_cache_dtype): f16, bf16, q8_0, q4_0 or
 * f32; SERVD_EINVAL saying what is expected otherwise. */
int servd_kv_dtype_parse(const char *name, servd_dtype *out);
/* Process-wide --kv-cache-dtype for models whose options leave it to the package (SERVD_DTYPE_COUNT:
 * none, the package's default, else f16); call before loading models. */
void servd_engine_set_kv_dtype(servd_dtype t);
/* Process-wide default of isolation (none set: SERVD_ISOLATION_NONE); call before loading models. */
void servd_engine_set_isolation(servd_isolation isolation);
/* Process-wide defaults of verify_weights and trusted_keys (borrowed: must outlive every load). */
void servd_engine_set_package_checks(bool verify_weights, const char *trusted_keys);
/* Process-wide default of prefix_cache (none set: on). */
void servd_engine_set_prefix_cache(bool on);
/* Process-wide default of max_step_ms (0: no bound; none set: SERVD_DEFAULT_MAX_STEP_MS). */
void servd_engine_set_max_step_ms(int ms);
/* A 32-sequence decode step of the default model takes ~80 ms on a small CPU host: a 100 ms target
 * lets about 20 ms of prefill ride along instead of a 512-token chunk (~700 ms), while on a GPU,
 * where steps take a few ms, it rarely binds. */
#define SERVD_DEFAULT_MAX_STEP_MS 100
/* Process-wide default of load_timeout_s (seconds, 0: none; none set: 300). */
void servd_engine_set_load_timeout(double seconds);
/* Interpreters of abandoned loads in this process (each holds one of the SERVD_INTERP_MAX). */
int servd_engine_quarantined_interpreters(void);
/* Loads the package and starts its interpreters (and scheduler thread). *out owned by the caller. */
int servd_model_load(const servd_model_options *o, servd_model **out);
/* Stops accepting, lets running requests finish until deadline_ms (then cancels them), frees all. */
void servd_model_unload(servd_model *m, int deadline_ms); /* accepts NULL */
/* Sleep, level 1: once nothing runs, empties the prefix cache and gives the KV cache's memory back
 * (engine_sleep.c); the model stays loaded and serves the next request. 0 for other kinds. */
int servd_model_release_kv(servd_model *m);

const char *servd_model_name(const servd_model *m);
servd_model_kind servd_model_get_kind(const servd_model *m);
/* Loaded, scheduler making progress: not stuck, i.e. pending work saw a finished step within the
 * last 60 s, or within the step timeout plus 30 s when that is longer. */
bool servd_model_ready(const servd_model *m);
/* Not ready because its process died and is being restarted (isolation "process"): a condition that
 * mends itself, unlike a stuck engine. why (may be NULL): the cause and the restart's progress. */
bool servd_model_restarting(const servd_model *m, char *why, size_t cap);
json_t *servd_model_metadata(const servd_model *m); /* new ref: KServe v2 model metadata */

/* ---- causal-lm -------------------------------------------------------------------------------- */
int servd_model_tokenize(servd_model *m, const char *text, size_t len, bool add_special, int32_t **ids, int *n);
int servd_model_detokenize(servd_model *m, const int32_t *ids, int n, char **text); /* caller frees */
/* A text pair (a cross-encoder's query and document) through the tokenizer's pair template
 * ([CLS] a [SEP] b [SEP]), cut LongestFirst to max_len ids when max_len > 0. *pair_split: the first
 * position of the second segment (servd_gen_params.pair_split; 0 where the template gives every
 * token type 0). SERVD_EUNSUPPORTED when the tokenizer has no pair template. *ids: caller frees. */
int servd_model_tokenize_pair(servd_model *m, const char *a, size_t alen, const char *b, size_t blen, int max_len,
                              int32_t **ids, int *n, int *pair_split);
/* Renders the package's chat template over messages (a JSON array of {role, content}). */
int servd_model_apply_chat_template(servd_model *m, json_t *messages, bool add_generation_prompt, char **text);
int servd_model_context_length(const servd_model *m);

/* Checks a constraint in the model's grammar engine and translates it into *grammar (caller frees)
 * for servd_gen_params.guide. SERVD_EINVAL with a message naming the problem for an invalid or
 * unsupported constraint; SERVD_EUNSUPPORTED when the model's package has no guided decoding hooks;
 * SERVD_EMODEL when the grammar engine itself fails (not installed). Runs on the interpreter thread. */
int servd_model_guide_compile(servd_model *m, servd_guide_kind kind, const char *spec, char **grammar);

/* Tool calling (tool_hooks.c, the package's tools.py), on the interpreter thread. Render: the chat
 * with tools (OpenAI form) in the package's template, *out = {"prompt", "markers", "family"}. Parse:
 * the output of a request, spec = {"tools", "parallel", "family"}, *out = {"content", "calls":
 * [{"name", "arguments"}]}. *out: a new reference. SERVD_EINVAL: the client's input is at fault. */
int servd_model_tools_render(servd_model *m, json_t *messages, json_t *tools, bool add_generation_prompt, json_t **out);
int servd_model_tools_parse(servd_model *m, const char *text, json_t *spec, json_t **out);

/* SERVD_EUNSUPPORTED for a model that is not a causal LM. */
int servd_model_embedding_info(const servd_model *m, servd_embedding_info *out);

void servd_gen_params_default(servd_gen_params *p);
/* The defaults of m's requests: servd_gen_params_default, then the package's generation_config.json
 * (temperature, top_p, top_k, min_p, repetition_penalty), as vLLM applies them to requests that omit
 * those fields. */
void servd_model_gen_params_default(const servd_model *m, servd_gen_params *p);
int servd_model_vocab_size(const servd_model *m);

/* Queues a request (copies prompt and params). SERVD_EBUSY when the queue is full, SERVD_EINVAL for
 * bad parameters or a prompt longer than the context, SERVD_ECANCELED while unloading. */
int servd_model_submit(servd_model *m, const int32_t *prompt, int n_prompt, const servd_gen_params *p,
                       servd_event_cb cb, void *ud, servd_request **out);
/* Asks to stop the request at the next step; its KV blocks are freed and a final event
 * (finish_reason "cancelled") follows unless one was already delivered. */
void servd_request_cancel(servd_request *r);
/* Drops the caller's handle; call once, after the final event (or instead of waiting for it after
 * cancel: the engine then frees the request itself). */
void servd_request_release(servd_request *r);

/* ---- generic ------------------------------------------------------------------------------------ */
/* inputs/outputs: names and tensors. outputs are new references the caller releases. A Python
 * exception in predict returns SERVD_EINVAL (bad input) or SERVD_EMODEL by the rule at
 * servd_model_error (engine/types.h), with err (may be NULL) filled; other failures clear err->type. */
int servd_model_predict(servd_model *m, const servd_named_tensor *inputs, int n_inputs, servd_named_tensor **outputs,
                        int *n_outputs, int64_t deadline_ms, servd_model_error *err);

/* ---- stats for /metrics ------------------------------------------------------------------------- */
void servd_model_get_stats(const servd_model *m, servd_model_stats *s);

/* LoRA adapters of a language model (engine_lora.c, engine/lora_registry.h). load: reads the PEFT
 * folder or adapter package at path, checks it against this model and registers it as name (a
 * request picks it by servd_gen_params.lora); SERVD_EINVAL when the name is taken or the adapter does
 * not fit, SERVD_EUNSUPPORTED for a model that takes none (tensor parallelism, GPUs). unload: new
 * requests can no longer pick it; running ones finish with it. */
int servd_model_lora_load(servd_model *m, const char *name, const char *path);
int servd_model_lora_unload(servd_model *m, const char *name);
bool servd_model_has_lora(servd_model *m, const char *name);
/* Up to cap adapters into out; returns how many are registered. *max_loras (may be NULL): the
 * resident limit. */
int servd_model_lora_list(servd_model *m, servd_lora_info *out, int cap, int *max_loras);
/* The engine-wide default of servd_model_options.max_loras (servd --max-loras). */
void servd_engine_set_max_loras(int n);

#endif
