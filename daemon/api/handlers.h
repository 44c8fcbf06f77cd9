/* Every handler of the route table, one declaration each, all of the api_handler type. Included by
 * routes.c (the table) and by each handler's own file, so that the compiler checks the signature;
 * handler files include nothing of the router or of each other. */
#ifndef SERVD_API_HANDLERS_H
#define SERVD_API_HANDLERS_H

#include "api/route.h"

/* health.c */
void api_health_live(servd_api *a, servd_http_req *r, const api_route_args *args);
void api_version(servd_api *a, servd_http_req *r, const api_route_args *args);
void api_health_ready(servd_api *a, servd_http_req *r, const api_route_args *args);

/* openai.c */
void api_oai_embeddings(servd_api *a, servd_http_req *r, const api_route_args *args);
void api_oai_rerank(servd_api *a, servd_http_req *r, const api_route_args *args); /* also /rerank, /v2/rerank */
void api_oai_score(servd_api *a, servd_http_req *r, const api_route_args *args);
void api_oai_completions(servd_api *a, servd_http_req *r, const api_route_args *args);
void api_oai_chat_completions(servd_api *a, servd_http_req *r, const api_route_args *args);
void api_oai_models(servd_api *a, servd_http_req *r, const api_route_args *args);
void api_oai_model(servd_api *a, servd_http_req *r, const api_route_args *args);
/* lora.c: vLLM's runtime LoRA adapter routes */
void api_oai_load_lora(servd_api *a, servd_http_req *r, const api_route_args *args);
void api_oai_unload_lora(servd_api *a, servd_http_req *r, const api_route_args *args);
void api_oai_tokenize(servd_api *a, servd_http_req *r, const api_route_args *args);
void api_oai_detokenize(servd_api *a, servd_http_req *r, const api_route_args *args);

/* responses.c */
void api_oai_responses(servd_api *a, servd_http_req *r, const api_route_args *args);

/* anthropic.c: Anthropic's Messages API */
void api_anthropic_messages(servd_api *a, servd_http_req *r, const api_route_args *args);
void api_anthropic_count_tokens(servd_api *a, servd_http_req *r, const api_route_args *args);

/* ollama.c: Ollama's API */
void api_ollama_chat(servd_api *a, servd_http_req *r, const api_route_args *args);
void api_ollama_generate(servd_api *a, servd_http_req *r, const api_route_args *args);
void api_ollama_embed(servd_api *a, servd_http_req *r, const api_route_args *args);
void api_ollama_tags(servd_api *a, servd_http_req *r, const api_route_args *args);
void api_ollama_show(servd_api *a, servd_http_req *r, const api_route_args *args);
void api_ollama_ps(servd_api *a, servd_http_req *r, const api_route_args *args);
void api_ollama_version(servd_api *a, servd_http_req *r, const api_route_args *args);

/* kserve.c */
void api_kserve_server_meta(servd_api *a, servd_http_req *r, const api_route_args *args);
void api_kserve_model_meta(servd_api *a, servd_http_req *r, const api_route_args *args);
void api_kserve_model_ready(servd_api *a, servd_http_req *r, const api_route_args *args);
void api_kserve_infer(servd_api *a, servd_http_req *r, const api_route_args *args);

/* kserve_config.c, kserve_stats.c: Triton's model configuration and statistics extensions */
void api_kserve_model_config(servd_api *a, servd_http_req *r, const api_route_args *args);
void api_kserve_model_stats(servd_api *a, servd_http_req *r, const api_route_args *args);
void api_kserve_all_stats(servd_api *a, servd_http_req *r, const api_route_args *args);

/* models.c: Triton's repository extension */
void api_repository_index(servd_api *a, servd_http_req *r, const api_route_args *args);
void api_repository_load(servd_api *a, servd_http_req *r, const api_route_args *args);
void api_repository_unload(servd_api *a, servd_http_req *r, const api_route_args *args);

/* metrics.c */
void api_metrics(servd_api *a, servd_http_req *r, const api_route_args *args);

/* sleep.c: vLLM's sleep mode */
void api_sleep(servd_api *a, servd_http_req *r, const api_route_args *args);
void api_wake_up(servd_api *a, servd_http_req *r, const api_route_args *args);
void api_is_sleeping(servd_api *a, servd_http_req *r, const api_route_args *args);

#endif
