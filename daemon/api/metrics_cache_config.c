/* vllm:cache_config_info, the info gauge the inference extension's prefix-cache scorer reads
 * (the model-server protocol, gateway-api-inference-extension docs/proposals/003: labels block_size
 * and num_gpu_blocks). As vLLM's, its value is 1 and what it says is in the labels; servd adds
 * model_name, since one servd may serve several models. num_gpu_blocks is the KV blocks of the
 * model's cache wherever it lives (host memory on a CPU model), the capacity the scorer sizes its
 * view of the replica's cache with. */
#include "api/api-impl.h"

void api_vllm_cache_config_head(servd_buf *b) {
  servd_buf_puts(b, "# HELP vllm:cache_config_info Information of the LLM engine's KV cache (the value is 1).\n"
                    "# TYPE vllm:cache_config_info gauge\n");
}

void api_vllm_cache_config(servd_buf *b, const api_model *am, const servd_model_stats *s) {
  int block_size = am->opts.block_size > 0 ? am->opts.block_size : 16; /* the engine's default */
  servd_buf_puts(b, "vllm:cache_config_info{model_name=\"");
  api_prom_label(b, am->name);
  servd_buf_printf(b,
                   "\",block_size=\"%d\",num_gpu_blocks=\"%d\",enable_prefix_caching=\"%s\","
                   "cache_dtype=\"auto\"} 1\n",
                   block_size, s->kv_blocks_total, am->opts.prefix_cache ? "True" : "False");
}
