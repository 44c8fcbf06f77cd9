/* Registry row: Qwen2 / Qwen2.5 (model_type "qwen2", GGUF "qwen2"). Llama's decoder (code
 * models/llama) plus biases on the Q, K and V projections; embeddings tied (0.5B-3B) or not; rope_theta
 * 1e6 from the config. Conventions relied on:
 *  - transformers' Qwen2Attention: q/k/v_proj with bias=True, o_proj without; rotate_half RoPE.
 *  - llama.cpp's convert_hf_to_gguf.py (Qwen2Model) does not permute Q/K rows (only LlamaModel does)
 *    and llama.cpp runs qwen2 with LLAMA_ROPE_TYPE_NEOX: half-split pairs in both sources.
 *  - gguf-py names: blk.N.attn_{q,k,v}.bias; metadata qwen2.* with Llama's keys.
 *  - Sliding window only when use_sliding_window is true (the released models say false). */
#include "arch.h"

static const mpk_dense_opts opts = {
    .family = "qwen2", .qkv_bias = true, .window_key = "sliding_window", .window_switch = "use_sliding_window"};

static const char *const hf_types[] = {"qwen2", NULL};
static const char *const hf_archs[] = {"Qwen2ForCausalLM", NULL};
static const char *const gguf_archs[] = {"qwen2", NULL};

static const mpk_name_pair gguf_block[] = {{"attn_norm.weight", "input_layernorm.weight"},
                                           {"ffn_norm.weight", "post_attention_layernorm.weight"},
                                           {"attn_q.weight", "self_attn.q_proj.weight"},
                                           {"attn_k.weight", "self_attn.k_proj.weight"},
                                           {"attn_v.weight", "self_attn.v_proj.weight"},
                                           {"attn_output.weight", "self_attn.o_proj.weight"},
                                           {"attn_q.bias", "self_attn.q_proj.bias"},
                                           {"attn_k.bias", "self_attn.k_proj.bias"},
                                           {"attn_v.bias", "self_attn.v_proj.bias"},
                                           {"ffn_gate.weight", "mlp.gate_proj.weight"},
                                           {"ffn_up.weight", "mlp.up_proj.weight"},
                                           {"ffn_down.weight", "mlp.down_proj.weight"},
                                           {NULL, NULL}};

const mpk_arch mpk__arch_qwen2 = {
    .name = "qwen2",
    .hf_model_types = hf_types,
    .hf_architectures = hf_archs,
    .gguf_archs = gguf_archs,
    .gguf_names = {"blk.", mpk__gguf_llama_global, gguf_block},
    .hf_names = {NULL, NULL, NULL},
    .rope_layout_gguf = "half", /* not permuted by the converter; NEOX RoPE in llama.cpp */
    .rope_layout_hf = "half",
    .code = "llama",
    .entry_point = "llama.model:LlamaModel",
    .gguf_config = mpk__llama_gguf_config,
    .prepare_config = mpk__dense_cap_window,
    .check_config = mpk__dense_check_config,
    .check_tensors = mpk__dense_check_tensors,
    .dense = &opts,
};
