/* Registry row: Mistral (Hugging Face model_type "mistral": Mistral 7B v0.1-v0.3, Mistral Nemo,
 * Ministral-style dense checkpoints). The tensors and the forward are Llama's (code models/llama);
 * what differs is `sliding_window` (v0.1: 4096 of a 32768 context): servd's attention has no window,
 * so packing caps max_position_embeddings at the window, where full causal attention is exact, and a
 * package whose window is smaller than its context is refused at load. GGUF Mistral files say
 * "llama" (llama.cpp converts them as Llama, Q/K rows permuted, no window kept): the llama row. */
#include "arch.h"

static const mpk_dense_opts opts = {.family = "mistral", .window_key = "sliding_window"};

static const char *const hf_types[] = {"mistral", NULL};
static const char *const hf_archs[] = {"MistralForCausalLM", NULL};

const mpk_arch mpk__arch_mistral = {
    .name = "mistral",
    .hf_model_types = hf_types,
    .hf_architectures = hf_archs,
    .gguf_archs = NULL, /* GGUF Mistral is general.architecture "llama" */
    .gguf_names = {NULL, NULL, NULL},
    .hf_names = {NULL, NULL, NULL}, /* Llama's Hugging Face names */
    .rope_layout_gguf = "interleaved",
    .rope_layout_hf = "half",
    .code = "llama",
    .entry_point = "llama.model:LlamaModel",
    .gguf_config = mpk__llama_gguf_config,
    .prepare_config = mpk__dense_cap_window,
    .check_config = mpk__dense_check_config,
    .check_tensors = mpk__dense_check_tensors,
    .dense = &opts,
};
