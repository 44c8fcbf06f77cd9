"""Writes a tiny random-weight Llama as a Hugging Face folder (f32 safetensors, byte-level tokenizer)
and optionally as a GGUF file with q/k rows permuted for interleaved RoPE, the way llama.cpp's
convert_hf_to_gguf.py does.

    python3 make_tiny.py OUT_DIR [--family llama|mistral|qwen2|qwen3] [--llama3-scaling] [--untied]
                         [--gguf OUT.gguf] [--seed N] [--eos ID,ID...]

Families (as transformers' configs and llama.cpp's converter write them):
  mistral  model_type "mistral", sliding_window 64 of max_position_embeddings 256; GGUF architecture
           "llama" with permuted q/k rows (llama.cpp converts Mistral as Llama and keeps no window)
  qwen2    q/k/v biases, rope_theta 1e6, no head_dim key, use_sliding_window false; GGUF "qwen2",
           rows NOT permuted (NEOX RoPE), biases as blk.N.attn_{q,k,v}.bias (--yarn: rope_scaling yarn
           factor 4 of original_max_position_embeddings 64, max_position_embeddings 256; GGUF
           qwen2.rope.scaling.type/factor/original_context_length as the converter writes them)
  qwen3    q_norm/k_norm of head_dim 32 while hidden_size / heads is 16, rope_theta 1e6; GGUF "qwen3",
           not permuted, blk.N.attn_{q,k}_norm.weight
  gemma3   model_type "gemma3_text": 6 layers, hidden 48 (sqrt not exact), head_dim 16 while hidden /
           heads is 12, query_pre_attn_scalar 24, sliding_window 8, pattern 6 (layer 5 global) or
           --layer-types, rope_theta 1e6 / rope_local_base_freq 1e4 (--linear-scaling: factor 8 on
           global layers), norm weights w of (1 + w) near 0; GGUF "gemma3" as llama.cpp's converter
           writes it: every *norm.weight + 1, not permuted, blk.N.post_attention_norm / ffn_norm
           (pre-feedforward) / post_ffw_norm, gemma3.attention.sliding_window
  phi3     model_type "phi3": fused self_attn.qkv_proj (Q, K, V rows) and mlp.gate_up_proj (gate first),
           no head_dim key, sliding_window 8 (Phi-3-mini: 2047 of 4096), untied (--longrope: rope_scaling
           longrope with short/long factors and original_max_position_embeddings 64 of 256); GGUF "phi3"
           as llama.cpp's converter writes it: blk.N.attn_qkv, ffn_up holding gate_up, not permuted,
           phi3.attention.sliding_window, rope_factors_long/short.weight for LongRoPE

The tokenizer maps byte b to id b (no merges), so a prompt's ids are its UTF-8 bytes; ids 256.. are
special tokens. Dimensions are chosen to split over 2 tensor-parallel ranks.
"""
import argparse
import json
import math
import os
import struct
import sys

import numpy as np

# The GGUF's BPE merges: none (bytes are tokens), or with --llama-cpp-merge one merge of two spaces
# into the vocabulary's last id (a reserved token otherwise), because llama.cpp refuses a BPE
# vocabulary without merges. Only the GGUF has it (the benchmarks pack the GGUF for both engines).
GGUF_MERGES = []

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_ref import permute_for_interleaved  # noqa: E402

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


def config(args):
    cfg = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "vocab_size": 272, "max_position_embeddings": 256, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "tie_word_embeddings": not args.untied,
        "bos_token_id": 257, "eos_token_id": 258, "torch_dtype": "float32",
    }
    if args.heads:  # e.g. 6 heads, 3 KV heads: splits over 3 ranks with one KV head each
        hd = cfg["head_dim"] = args.head_dim or cfg["head_dim"]
        cfg.update(num_attention_heads=args.heads, num_key_value_heads=args.kv_heads or args.heads,
                   hidden_size=args.heads * hd, intermediate_size=args.heads * 32)
    fam = getattr(args, "family", "llama")  # callers that build their own Namespace: llama
    if fam == "mistral":
        cfg.update(architectures=["MistralForCausalLM"], model_type="mistral", sliding_window=64)
    elif fam == "qwen2":
        cfg.update(architectures=["Qwen2ForCausalLM"], model_type="qwen2", rope_theta=1000000.0,
                   use_sliding_window=False, sliding_window=256, max_window_layers=2)
        del cfg["head_dim"]  # Qwen2 configs have none: hidden_size / num_attention_heads
        if getattr(args, "yarn", False):  # Qwen2.5's documented form (max_position_embeddings = factor x original)
            cfg["rope_scaling"] = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
    elif fam == "qwen3":
        cfg.update(architectures=["Qwen3ForCausalLM"], model_type="qwen3", rope_theta=1000000.0, head_dim=32,
                   attention_bias=False, use_sliding_window=False, sliding_window=None, max_window_layers=2)
    elif fam == "gemma3":
        cfg.update(architectures=["Gemma3ForCausalLM"], model_type="gemma3_text", num_hidden_layers=6,
                   hidden_size=48, head_dim=16, query_pre_attn_scalar=24, sliding_window=8, sliding_window_pattern=6,
                   rope_theta=1000000.0, rope_local_base_freq=10000.0, rms_norm_eps=1e-6, rope_scaling=None,
                   hidden_activation="gelu_pytorch_tanh", final_logit_softcapping=None, attn_logit_softcapping=None)
        if getattr(args, "layer_types", False):  # other than the pattern's: layers 1 and 3 global
            cfg["layer_types"] = ["full_attention" if i in (1, 3) else "sliding_attention" for i in range(6)]
        if getattr(args, "linear_scaling", False):
            cfg["rope_scaling"] = {"rope_type": "linear", "factor": 8.0}
    elif fam == "phi3":
        cfg.update(architectures=["Phi3ForCausalLM"], model_type="phi3", sliding_window=8, hidden_act="silu",
                   original_max_position_embeddings=cfg["max_position_embeddings"], rope_scaling=None,
                   tie_word_embeddings=False)
        del cfg["head_dim"]  # Phi3Config has none: hidden_size / num_attention_heads
        if getattr(args, "longrope", False):
            half = cfg["hidden_size"] // cfg["num_attention_heads"] // 2
            cfg["original_max_position_embeddings"] = 64
            cfg["rope_scaling"] = {"type": "longrope", "short_factor": [1.0 + 0.05 * i for i in range(half)],
                                   "long_factor": [1.0 + 0.9 * i for i in range(half)]}
    if getattr(args, "dims", None):  # benchmarks: every family at one size (HEADS,KV_HEADS,HEAD_DIM,INTER,LAYERS)
        nh, nkv, hd, inter, layers = (int(x) for x in args.dims.split(","))
        cfg.update(num_attention_heads=nh, num_key_value_heads=nkv, hidden_size=nh * hd, intermediate_size=inter,
                   num_hidden_layers=layers, max_position_embeddings=1024, vocab_size=8192)
        if "head_dim" in cfg:
            cfg["head_dim"] = hd
        if cfg.get("sliding_window"):  # a window as wide as the context: full attention, as the Llama path
            cfg["sliding_window"] = 1024
        if fam == "phi3":
            cfg["original_max_position_embeddings"] = 1024
    if args.llama3_scaling:
        cfg["rope_theta"] = 500000.0
        cfg["rope_scaling"] = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    return cfg


def head_dim(cfg):
    return cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]


def weights(cfg, rng):
    d, f, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    hd, nh, nkv = head_dim(cfg), cfg["num_attention_heads"], cfg["num_key_value_heads"]
    fam = cfg["model_type"]

    def mat(r, c, s=None):
        return (rng.standard_normal((r, c)) * (s or 1.0 / np.sqrt(c))).astype(np.float32)

    w = {"model.embed_tokens.weight": mat(V, d, 0.35),
         "model.norm.weight": (1 + 0.1 * rng.standard_normal(d)).astype(np.float32)}
    if fam == "gemma3_text":
        return gemma3_weights(cfg, rng, mat, w)
    if fam == "phi3":
        return phi3_weights(cfg, rng, mat, w)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = (1 + 0.1 * rng.standard_normal(d)).astype(np.float32)
        w[p + "post_attention_layernorm.weight"] = (1 + 0.1 * rng.standard_normal(d)).astype(np.float32)
        w[p + "self_attn.q_proj.weight"] = mat(nh * hd, d)
        w[p + "self_attn.k_proj.weight"] = mat(nkv * hd, d)
        w[p + "self_attn.v_proj.weight"] = mat(nkv * hd, d)
        w[p + "self_attn.o_proj.weight"] = mat(d, nh * hd)
        w[p + "mlp.gate_proj.weight"] = mat(f, d)
        w[p + "mlp.up_proj.weight"] = mat(f, d)
        w[p + "mlp.down_proj.weight"] = mat(d, f)
        if fam == "qwen2":  # biases large enough that dropping one moves the logits by O(1)
            for n, rows in (("q", nh * hd), ("k", nkv * hd), ("v", nkv * hd)):
                w[p + f"self_attn.{n}_proj.bias"] = (0.5 * rng.standard_normal(rows)).astype(np.float32)
        if fam == "qwen3":
            for n in ("q", "k"):
                w[p + f"self_attn.{n}_norm.weight"] = (1 + 0.3 * rng.standard_normal(hd)).astype(np.float32)
    if not cfg["tie_word_embeddings"]:
        w["lm_head.weight"] = mat(V, d, 0.5)
    return w


def gemma3_weights(cfg, rng, mat, w):
    """Gemma3RMSNorm weights are w of (1 + w): near 0 (as checkpoints hold them), 0.3 spread so that
    a dropped or doubled 1 moves the logits by O(1)."""
    d, f = cfg["hidden_size"], cfg["intermediate_size"]
    hd, nh, nkv = head_dim(cfg), cfg["num_attention_heads"], cfg["num_key_value_heads"]

    def nw(n):
        return (0.3 * rng.standard_normal(n)).astype(np.float32)
    w["model.embed_tokens.weight"] = mat(cfg["vocab_size"], d, 0.1)  # times sqrt(48) in the forward
    w["model.norm.weight"] = nw(d)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        for n in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                  "post_feedforward_layernorm"):
            w[p + n + ".weight"] = nw(d)
        w[p + "self_attn.q_proj.weight"] = mat(nh * hd, d)
        w[p + "self_attn.k_proj.weight"] = mat(nkv * hd, d)
        w[p + "self_attn.v_proj.weight"] = mat(nkv * hd, d)
        w[p + "self_attn.o_proj.weight"] = mat(d, nh * hd)
        w[p + "self_attn.q_norm.weight"] = nw(hd)
        w[p + "self_attn.k_norm.weight"] = nw(hd)
        w[p + "mlp.gate_proj.weight"] = mat(f, d)
        w[p + "mlp.up_proj.weight"] = mat(f, d)
        w[p + "mlp.down_proj.weight"] = mat(d, f)
    if not cfg["tie_word_embeddings"]:
        w["lm_head.weight"] = mat(cfg["vocab_size"], d, 0.5)
    return w


def phi3_weights(cfg, rng, mat, w):
    """Phi-3's tensors: qkv_proj rows Q then K then V, gate_up_proj rows gate then up."""
    d, f = cfg["hidden_size"], cfg["intermediate_size"]
    hd, nh, nkv = head_dim(cfg), cfg["num_attention_heads"], cfg["num_key_value_heads"]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = (1 + 0.1 * rng.standard_normal(d)).astype(np.float32)
        w[p + "post_attention_layernorm.weight"] = (1 + 0.1 * rng.standard_normal(d)).astype(np.float32)
        w[p + "self_attn.qkv_proj.weight"] = mat((nh + 2 * nkv) * hd, d)
        w[p + "self_attn.o_proj.weight"] = mat(d, nh * hd)
        w[p + "mlp.gate_up_proj.weight"] = mat(2 * f, d)
        w[p + "mlp.down_proj.weight"] = mat(d, f)
    w["lm_head.weight"] = mat(cfg["vocab_size"], d, 0.5)
    return w


def write_gguf_phi3(path, cfg, w):
    """As llama.cpp's convert_hf_to_gguf.py (Phi3MiniModel) writes a Phi-3: fused tensors kept (ffn_up is
    gate_up), rows not permuted, LongRoPE factors as rope_factors_long/short.weight."""
    import gguf
    g = gguf.GGUFWriter(path, "phi3")
    hd = head_dim(cfg)
    g.add_name("tiny-phi3")
    g.add_context_length(cfg["max_position_embeddings"])
    g.add_rope_scaling_orig_ctx_len(cfg["original_max_position_embeddings"])
    g.add_embedding_length(cfg["hidden_size"])
    g.add_feed_forward_length(cfg["intermediate_size"])
    g.add_block_count(cfg["num_hidden_layers"])
    g.add_head_count(cfg["num_attention_heads"])
    g.add_head_count_kv(cfg["num_key_value_heads"])
    g.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    g.add_rope_dimension_count(hd)
    g.add_rope_freq_base(cfg["rope_theta"])
    g.add_file_type(0)
    g.add_sliding_window(cfg["sliding_window"])
    toks = tokens(cfg)
    g.add_tokenizer_model("gpt2")
    g.add_tokenizer_pre("gpt-2")
    g.add_token_list(toks)
    g.add_token_types(token_types(toks))
    g.add_token_merges(GGUF_MERGES)
    g.add_bos_token_id(cfg["bos_token_id"])
    g.add_eos_token_id(cfg["eos_token_id"])
    g.add_add_bos_token(False)
    g.add_chat_template(CHAT_TEMPLATE)
    rs = cfg.get("rope_scaling")
    if rs:
        scale = cfg["max_position_embeddings"] / cfg["original_max_position_embeddings"]
        g.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(cfg["original_max_position_embeddings"])))
        g.add_tensor("rope_factors_long.weight", np.asarray(rs["long_factor"], np.float32))
        g.add_tensor("rope_factors_short.weight", np.asarray(rs["short_factor"], np.float32))
    g.add_tensor("token_embd.weight", w["model.embed_tokens.weight"])
    names = [("attn_norm", "input_layernorm"), ("ffn_norm", "post_attention_layernorm"), ("attn_qkv", "self_attn.qkv_proj"),
             ("attn_output", "self_attn.o_proj"), ("ffn_up", "mlp.gate_up_proj"), ("ffn_down", "mlp.down_proj")]
    for i in range(cfg["num_hidden_layers"]):
        for gn, hn in names:
            g.add_tensor(f"blk.{i}.{gn}.weight", w[f"model.layers.{i}.{hn}.weight"])
    g.add_tensor("output_norm.weight", w["model.norm.weight"])
    g.add_tensor("output.weight", w["lm_head.weight"])
    g.write_header_to_file()
    g.write_kv_data_to_file()
    g.write_tensors_to_file()
    g.close()


def write_gguf_gemma3(path, cfg, w):
    """As llama.cpp's convert_hf_to_gguf.py (Gemma3Model) writes a Gemma 3 text model."""
    import gguf
    g = gguf.GGUFWriter(path, "gemma3")
    hd = head_dim(cfg)
    g.add_name("tiny-gemma3")
    g.add_context_length(cfg["max_position_embeddings"])
    g.add_embedding_length(cfg["hidden_size"])
    g.add_block_count(cfg["num_hidden_layers"])
    g.add_feed_forward_length(cfg["intermediate_size"])
    g.add_head_count(cfg["num_attention_heads"])
    g.add_head_count_kv(cfg["num_key_value_heads"])
    g.add_key_length(hd)
    g.add_value_length(hd)
    g.add_rope_freq_base(cfg["rope_theta"])
    g.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    g.add_sliding_window(cfg["sliding_window"])
    rs = cfg.get("rope_scaling")
    if rs:
        g.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        g.add_rope_scaling_factor(rs["factor"])
    g.add_file_type(0)
    toks = tokens(cfg)
    g.add_tokenizer_model("gpt2")
    g.add_tokenizer_pre("gpt-2")
    g.add_token_list(toks)
    g.add_token_types(token_types(toks))
    g.add_token_merges(GGUF_MERGES)
    g.add_bos_token_id(cfg["bos_token_id"])
    g.add_eos_token_id(cfg["eos_token_id"])
    g.add_add_bos_token(False)
    g.add_chat_template(CHAT_TEMPLATE)

    def norm(a):  # the converter's norm_shift: GGUF norms hold 1 + w
        return (a + 1).astype(np.float32)
    g.add_tensor("token_embd.weight", w["model.embed_tokens.weight"])
    names = [("attn_norm", "input_layernorm"), ("post_attention_norm", "post_attention_layernorm"),
             ("ffn_norm", "pre_feedforward_layernorm"), ("post_ffw_norm", "post_feedforward_layernorm"),
             ("attn_q_norm", "self_attn.q_norm"), ("attn_k_norm", "self_attn.k_norm"),
             ("attn_q", "self_attn.q_proj"), ("attn_k", "self_attn.k_proj"), ("attn_v", "self_attn.v_proj"),
             ("attn_output", "self_attn.o_proj"), ("ffn_gate", "mlp.gate_proj"), ("ffn_up", "mlp.up_proj"),
             ("ffn_down", "mlp.down_proj")]
    for i in range(cfg["num_hidden_layers"]):
        for gn, hn in names:
            a = w[f"model.layers.{i}.{hn}.weight"]
            g.add_tensor(f"blk.{i}.{gn}.weight", norm(a) if gn.endswith("norm") else a)
    g.add_tensor("output_norm.weight", norm(w["model.norm.weight"]))
    if "lm_head.weight" in w:
        g.add_tensor("output.weight", w["lm_head.weight"])
    g.write_header_to_file()
    g.write_kv_data_to_file()
    g.write_tensors_to_file()
    g.close()


def write_safetensors(path, tensors, bf16=()):
    """F32 tensors, those named in bf16 as BF16 (rounded to nearest even)."""
    header, off, blobs = {}, 0, []
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name], dtype="<f4")
        dt = "F32"
        if name in bf16:
            u = a.view("<u4").astype(np.uint64)
            a = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2")
            dt = "BF16"
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        blobs.append(a.tobytes())
        off += a.nbytes
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)


def tokens(cfg):
    b2u = bytes_to_unicode()
    toks = [b2u[b] for b in range(256)] + SPECIALS
    toks += [f"<|reserved_{i}|>" for i in range(cfg["vocab_size"] - len(toks))]
    if GGUF_MERGES:
        toks[-1] = "".join(GGUF_MERGES[0].split(" "))
    return toks


def token_types(toks):
    """GGUF token types: bytes and merged tokens normal (1), the others control (3)."""
    return [1 if i < 256 or not t.startswith("<|") else 3 for i, t in enumerate(toks)]


def tokenizer_json(cfg):
    toks = tokens(cfg)
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, t in enumerate(toks) if i >= 256]
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": False, "vocab": {t: i for i, t in enumerate(toks) if i < 256}, "merges": []},
    }


def write_gguf(path, cfg, w, quant=None):
    if cfg["model_type"] == "gemma3_text":
        return write_gguf_gemma3(path, cfg, w)
    if cfg["model_type"] == "phi3":
        return write_gguf_phi3(path, cfg, w)
    import gguf
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    fam = cfg["model_type"]
    arch = fam if fam in ("qwen2", "qwen3") else "llama"  # llama.cpp writes Mistral as "llama"
    permute = arch == "llama"  # convert_hf_to_gguf permutes q/k for LlamaModel only
    g = gguf.GGUFWriter(path, arch)
    qtype = {"q4_1": gguf.GGMLQuantizationType.Q4_1, "q8_0": gguf.GGMLQuantizationType.Q8_0,
             "q4_0": gguf.GGMLQuantizationType.Q4_0}.get(quant)
    add_plain = g.add_tensor

    def add(name, a):  # matrices in the requested GGML block type, vectors in f32
        if qtype is None or a.ndim != 2:
            return add_plain(name, a)
        return add_plain(name, gguf.quants.quantize(a.astype(np.float32), qtype), raw_dtype=qtype)
    g.add_tensor = add
    g.add_name("tiny-llama")
    g.add_context_length(cfg["max_position_embeddings"])
    g.add_embedding_length(cfg["hidden_size"])
    g.add_block_count(cfg["num_hidden_layers"])
    g.add_feed_forward_length(cfg["intermediate_size"])
    g.add_head_count(nh)
    g.add_head_count_kv(nkv)
    g.add_rope_dimension_count(head_dim(cfg))
    g.add_key_length(head_dim(cfg))
    g.add_value_length(head_dim(cfg))
    g.add_rope_freq_base(cfg["rope_theta"])
    g.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    g.add_vocab_size(cfg["vocab_size"])
    g.add_file_type(0 if qtype is None else {"q4_1": 3, "q8_0": 7, "q4_0": 2}[quant])
    rs = cfg.get("rope_scaling")
    if rs and rs.get("type") == "yarn":  # convert_hf_to_gguf.py (Qwen2Model): type, factor, original context
        g.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        g.add_rope_scaling_factor(rs["factor"])
        g.add_rope_scaling_orig_ctx_len(rs["original_max_position_embeddings"])
    elif rs:
        raise ValueError("GGUF variant: llama3 rope scaling goes in rope_freqs; not generated here")
    toks = tokens(cfg)
    g.add_tokenizer_model("gpt2")
    g.add_tokenizer_pre("qwen2" if arch != "llama" else "gpt-2")  # llama.cpp's name for Qwen's regex
    g.add_token_list(toks)
    g.add_token_types(token_types(toks))
    g.add_token_merges(GGUF_MERGES)
    g.add_bos_token_id(cfg["bos_token_id"])
    g.add_eos_token_id(cfg["eos_token_id"])
    g.add_add_bos_token(False)
    g.add_chat_template(CHAT_TEMPLATE)
    g.add_tensor("token_embd.weight", w["model.embed_tokens.weight"])
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        g.add_tensor(f"blk.{i}.attn_norm.weight", w[p + "input_layernorm.weight"])
        g.add_tensor(f"blk.{i}.ffn_norm.weight", w[p + "post_attention_layernorm.weight"])
        perm = permute_for_interleaved if permute else (lambda a, n: a)
        g.add_tensor(f"blk.{i}.attn_q.weight", perm(w[p + "self_attn.q_proj.weight"], nh))
        g.add_tensor(f"blk.{i}.attn_k.weight", perm(w[p + "self_attn.k_proj.weight"], nkv))
        for n in ("q", "k", "v"):
            if p + f"self_attn.{n}_proj.bias" in w:
                g.add_tensor(f"blk.{i}.attn_{n}.bias", w[p + f"self_attn.{n}_proj.bias"])
        for n in ("q", "k"):
            if p + f"self_attn.{n}_norm.weight" in w:
                g.add_tensor(f"blk.{i}.attn_{n}_norm.weight", w[p + f"self_attn.{n}_norm.weight"])
        g.add_tensor(f"blk.{i}.attn_v.weight", w[p + "self_attn.v_proj.weight"])
        g.add_tensor(f"blk.{i}.attn_output.weight", w[p + "self_attn.o_proj.weight"])
        g.add_tensor(f"blk.{i}.ffn_gate.weight", w[p + "mlp.gate_proj.weight"])
        g.add_tensor(f"blk.{i}.ffn_up.weight", w[p + "mlp.up_proj.weight"])
        g.add_tensor(f"blk.{i}.ffn_down.weight", w[p + "mlp.down_proj.weight"])
    g.add_tensor("output_norm.weight", w["model.norm.weight"])
    if "lm_head.weight" in w:
        g.add_tensor("output.weight", w["lm_head.weight"])
    g.write_header_to_file()
    g.write_kv_data_to_file()
    g.write_tensors_to_file()
    g.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--llama3-scaling", action="store_true")
    ap.add_argument("--untied", action="store_true")
    ap.add_argument("--gguf")
    ap.add_argument("--gguf-quant", choices=["q4_1", "q8_0", "q4_0"])
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--heads", type=int)
    ap.add_argument("--kv-heads", type=int)
    ap.add_argument("--head-dim", type=int)
    ap.add_argument("--family", choices=["llama", "mistral", "qwen2", "qwen3", "gemma3", "phi3"], default="llama")
    ap.add_argument("--layer-types", action="store_true", help="gemma3: a layer_types list other than the pattern")
    ap.add_argument("--linear-scaling", action="store_true", help="gemma3: rope_scaling linear 8 on global layers")
    ap.add_argument("--longrope", action="store_true", help="phi3: rope_scaling longrope (short and long factors)")
    ap.add_argument("--yarn", action="store_true", help="qwen2: rope_scaling yarn (factor 4 of 64 positions)")
    ap.add_argument("--dims", help="HEADS,KV_HEADS,HEAD_DIM,INTER,LAYERS for any family, context 1024, vocabulary "
                    "8192 (benchmarks)")
    ap.add_argument("--llama-cpp-merge", action="store_true", help="one GGUF merge, so that llama.cpp loads the file")
    ap.add_argument("--eos", help="comma-separated eos_token_id of generation_config.json (several: a list)")
    args = ap.parse_args()
    if args.llama_cpp_merge:
        GGUF_MERGES.append("\u0120 \u0120")
    cfg = config(args)
    w = weights(cfg, np.random.default_rng(args.seed))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    write_safetensors(os.path.join(args.out, "model.safetensors"), w)
    with open(os.path.join(args.out, "tokenizer.json"), "w") as f:
        json.dump(tokenizer_json(cfg), f, ensure_ascii=False)
    with open(os.path.join(args.out, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "chat_template": CHAT_TEMPLATE}, f)
    with open(os.path.join(args.out, "generation_config.json"), "w") as f:
        eos = [int(e) for e in args.eos.split(",")] if args.eos else [cfg["eos_token_id"]]
        json.dump({"bos_token_id": cfg["bos_token_id"], "eos_token_id": eos if len(eos) > 1 else eos[0]}, f)
    if args.gguf:
        write_gguf(args.gguf, cfg, w, args.gguf_quant)


if __name__ == "__main__":
    main()
