/* The route table: adding an endpoint is its handler (declared in handlers.h) and one row here.
 * Rows are tried in order; the first whose pattern and method match serves the request. */
#include "api/handlers.h"

#define V "/versions/{version}"

const api_route api_routes[] = {
    /* Health probes answer without a key: orchestrators probe them. */
    {API_GET | API_HEAD, "/health", "/health", API_ROUTE_PUBLIC, api_health_live},
    {API_GET | API_HEAD, "/v2/health/live", "/v2/health/live", API_ROUTE_PUBLIC, api_health_live},
    {API_GET | API_HEAD, "/v2/health/ready", "/v2/health/ready", API_ROUTE_PUBLIC, api_health_ready},

    /* OpenAI-compatible, and vLLM's tokenizer routes. */
    {API_POST, "/v1/completions", "/v1/completions", API_ROUTE_OAI, api_oai_completions},
    {API_POST, "/v1/chat/completions", "/v1/chat/completions", API_ROUTE_OAI, api_oai_chat_completions},
    {API_POST, "/v1/responses", "/v1/responses", API_ROUTE_OAI, api_oai_responses},
    {API_POST, "/v1/embeddings", "/v1/embeddings", API_ROUTE_OAI, api_oai_embeddings},
    /* Cross-encoders: Jina's and Cohere's rerank (vLLM serves the three paths, llama-server the first
     * two; Cohere's v2 client posts to /v2/rerank), vLLM's score. */
    {API_POST, "/v1/rerank", "/v1/rerank", API_ROUTE_OAI, api_oai_rerank},
    {API_POST, "/rerank", "/rerank", API_ROUTE_OAI, api_oai_rerank},
    {API_POST, "/v2/rerank", "/v2/rerank", API_ROUTE_OAI, api_oai_rerank},
    {API_POST, "/v1/score", "/v1/score", API_ROUTE_OAI, api_oai_score},
    {API_GET, "/v1/models", "/v1/models", API_ROUTE_OAI, api_oai_models},
    {API_GET, "/v1/models/{model}", "/v1/models/{model}", API_ROUTE_OAI, api_oai_model},
    {API_POST, "/tokenize", "/tokenize", API_ROUTE_OAI, api_oai_tokenize},
    {API_POST, "/detokenize", "/detokenize", API_ROUTE_OAI, api_oai_detokenize},
    {API_POST, "/v1/load_lora_adapter", "/v1/load_lora_adapter", API_ROUTE_OAI, api_oai_load_lora},
    {API_POST, "/v1/unload_lora_adapter", "/v1/unload_lora_adapter", API_ROUTE_OAI, api_oai_unload_lora},

    /* Anthropic's Messages API: errors in its shape; x-api-key is taken as the key. */
    {API_POST, "/v1/messages", "/v1/messages", API_ROUTE_ANTHROPIC, api_anthropic_messages},
    {API_POST, "/v1/messages/count_tokens", "/v1/messages/count_tokens", API_ROUTE_ANTHROPIC,
     api_anthropic_count_tokens},

    /* Ollama's API: errors are {"error": "..."}, KServe's shape; its version is public, as /version. */
    {API_POST, "/api/chat", "/api/chat", 0, api_ollama_chat},
    {API_POST, "/api/generate", "/api/generate", 0, api_ollama_generate},
    {API_POST, "/api/embed", "/api/embed", 0, api_ollama_embed},
    {API_GET, "/api/tags", "/api/tags", 0, api_ollama_tags},
    {API_POST, "/api/show", "/api/show", 0, api_ollama_show},
    {API_GET, "/api/ps", "/api/ps", 0, api_ollama_ps},
    {API_GET, "/api/version", "/api/version", API_ROUTE_PUBLIC, api_ollama_version},

    /* KServe v2 / Open Inference Protocol; the versioned paths share their template's label. */
    {API_GET, "/v2", "/v2", 0, api_kserve_server_meta},
    {API_GET, "/v2/", "/v2", 0, api_kserve_server_meta},
    /* Before {model}: Triton's path for every model's statistics (a model named "stats" keeps its
     * other routes). */
    {API_GET, "/v2/models/stats", "/v2/models/stats", 0, api_kserve_all_stats},
    {API_GET, "/v2/models/{model}", "/v2/models/{model}", API_ROUTE_MODEL, api_kserve_model_meta},
    {API_GET, "/v2/models/{model}" V, "/v2/models/{model}", API_ROUTE_MODEL, api_kserve_model_meta},
    {API_GET, "/v2/models/{model}/ready", "/v2/models/{model}/ready", API_ROUTE_MODEL, api_kserve_model_ready},
    {API_GET, "/v2/models/{model}" V "/ready", "/v2/models/{model}/ready", API_ROUTE_MODEL, api_kserve_model_ready},
    {API_POST, "/v2/models/{model}/infer", "/v2/models/{model}/infer", API_ROUTE_MODEL, api_kserve_infer},
    {API_POST, "/v2/models/{model}" V "/infer", "/v2/models/{model}/infer", API_ROUTE_MODEL, api_kserve_infer},
    {API_GET, "/v2/models/{model}/config", "/v2/models/{model}/config", API_ROUTE_MODEL, api_kserve_model_config},
    {API_GET, "/v2/models/{model}" V "/config", "/v2/models/{model}/config", API_ROUTE_MODEL, api_kserve_model_config},
    {API_GET, "/v2/models/{model}/stats", "/v2/models/{model}/stats", API_ROUTE_MODEL, api_kserve_model_stats},
    {API_GET, "/v2/models/{model}" V "/stats", "/v2/models/{model}/stats", API_ROUTE_MODEL, api_kserve_model_stats},

    /* Triton's repository extension: load takes names not served yet, so no API_ROUTE_MODEL. */
    {API_POST | API_GET, "/v2/repository/index", "/v2/repository/index", 0, api_repository_index},
    {API_POST, "/v2/repository/models/{model}/load", "/v2/repository/models/{model}/load", 0, api_repository_load},
    {API_POST, "/v2/repository/models/{model}/unload", "/v2/repository/models/{model}/unload", 0,
     api_repository_unload},

    /* Sleep and wake (vLLM's admin endpoints, behind the API key): sleep.c. */
    {API_POST, "/sleep", "/sleep", 0, api_sleep},
    {API_POST, "/wake_up", "/wake_up", 0, api_wake_up},
    {API_GET, "/is_sleeping", "/is_sleeping", 0, api_is_sleeping},

    {API_GET, "/metrics", "/metrics", API_ROUTE_METRICS, api_metrics},
    {API_GET, "/version", "/version", API_ROUTE_PUBLIC, api_version},
};

const size_t api_n_routes = sizeof api_routes / sizeof api_routes[0];
