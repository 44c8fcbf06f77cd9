/* Registry row: Qwen3 dense (model_type "qwen3", GGUF "qwen3"). Llama's decoder (code models/llama)
 * plus an RMSNorm over each head of Q and of K (weights of head_dim, the model's rms_norm_eps) after
 * the projections and before RoPE; head_dim is a config key of its own (128 for every size, not
 * hidden_size / heads); no Q/K/V bias. Conventions relied on:
 *  - transformers' Qwen3Attention: q_norm(q_proj(x).view(..., head_dim)), k_norm likewise, then RoPE.
 *  - llama.cpp's converter (Qwen3Model, a Qwen2Model) does not permute Q/K rows; NEOX RoPE.
 *  - gguf-py names blk.N.attn_q_norm.weight / attn_k_norm.weight; qwen3.attention.key_length is head_dim. */
#include "arch.h"

static const mpk_dense_opts opts = {
    .family = "qwen3", .qk_norm = true, .window_key = "sliding_window", .window_switch = "use_sliding_window"};

static const char *const hf_types[] = {"qwen3", NULL};
static const char *const hf_archs[] = {"Qwen3ForCausalLM", NULL};
static const char *const gguf_archs[] = {"qwen3", NULL};

static const mpk_name_pair gguf_block[] = {
    {"attn_norm.weight", "input_layernorm.weight"},    {"ffn_norm.weight", "post_attention_layernorm.weight"},
    {"attn_q.weight", "self_attn.q_proj.weight"},      {"attn_k.weight", "self_attn.k_proj.weight"},
    {"attn_v.weight", "self_attn.v_proj.weight"},      {"attn_output.weight", "self_attn.o_proj.weight"},
    {"attn_q_norm.weight", "self_attn.q_norm.weight"}, {"attn_k_norm.weight", "self_attn.k_norm.weight"},
    {"ffn_gate.weight", "mlp.gate_proj.weight"},       {"ffn_up.weight", "mlp.up_proj.weight"},
    {"ffn_down.weight", "mlp.down_proj.weight"},       {NULL, NULL}};

const mpk_arch mpk__arch_qwen3 = {
    .name = "qwen3",
    .hf_model_types = hf_types,
    .hf_architectures = hf_archs,
    .gguf_archs = gguf_archs,
    .gguf_names = {"blk.", mpk__gguf_llama_global, gguf_block},
    .hf_names = {NULL, NULL, NULL},
    .rope_layout_gguf = "half",
    .rope_layout_hf = "half",
    .code = "llama",
    .entry_point = "llama.model:LlamaModel",
    .gguf_config = mpk__llama_gguf_config,
    .prepare_config = mpk__dense_cap_window,
    .check_config = mpk__dense_check_config,
    .check_tensors = mpk__dense_check_tensors,
    .dense = &opts,
};
