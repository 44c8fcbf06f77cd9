"""Independent numpy implementation of the Hugging Face Llama forward pass (test oracle).

Reads a Hugging Face model folder (config.json + *.safetensors) directly with numpy and computes
logits in float64 the way transformers' LlamaForCausalLM does: RMSNorm, half-split RoPE (with Llama 3
rope scaling), grouped-query causal attention, SwiGLU MLP, tied or separate output head. It shares no
code with servd: it is the reference the model code is checked against.

The families written the same way in transformers, with their differences (from their modeling files):
  - MistralForCausalLM: sliding-window attention, a key at position s is seen from t when
    t - s < sliding_window (the mask of transformers' sliding_window_causal mask);
  - Qwen2ForCausalLM: q/k/v_proj with bias; a window only with use_sliding_window, in the layers
    from max_window_layers on; YaRN (rope_scaling "yarn", transformers' _compute_yarn_parameters):
    correction range from beta_fast 32 / beta_slow 1 over original_max_position_embeddings (floor
    and ceil), each inverse frequency the ramp's mix of theta^-(2i/d) and it divided by factor,
    cos/sin times attention_factor, else 0.1 ln(factor) + 1;
  - Qwen3ForCausalLM: q_norm/k_norm, RMSNorm over head_dim of each head after the projection and
    before RoPE; head_dim from the config; a window as Qwen2's.
  - Phi3ForCausalLM (modeling_phi3): self_attn.qkv_proj split into Q, K, V rows in that order,
    mlp.gate_up_proj into gate then up (chunk(2)); a sliding window as Mistral's; RoPE over
    int(head_dim * partial_rotary_factor) dims; LongRoPE (rope_scaling "longrope"/"su"): each inverse
    frequency divided by long_factor[i] when the sequence is longer than
    original_max_position_embeddings, else by short_factor[i], and cos/sin times the attention factor
    (rope_scaling's attention_factor, else sqrt(1 + ln(s) / ln(original)) for s = max_position_embeddings /
    original_max_position_embeddings > 1, else 1).

Gemma 3 (transformers' modeling_gemma3, Gemma3ForCausalLM) differs enough to have its own forward,
forward_gemma3: embeddings times sqrt(hidden_size) (the normalizer in the weights' dtype, f32 here),
RMSNorm times (1 + w), norms after attention and after the MLP as well as before each, q_norm/k_norm,
scores times query_pre_attn_scalar^-0.5, gelu_pytorch_tanh(gate) * up, local layers (sliding window,
RoPE base rope_local_base_freq) and global ones (rope_theta, linear rope_scaling), final logit
soft-capping when configured.
"""
import json
import math
import os
import struct

import numpy as np


def read_safetensors(path):
    """{name: float64 array} of one .safetensors file (F32, F16, BF16)."""
    with open(path, "rb") as f:
        (hlen,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(hlen))
        base = 8 + hlen
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        raw = data[a:b]
        dt = info["dtype"]
        if dt == "F32":
            arr = np.frombuffer(raw, dtype="<f4")
        elif dt == "F16":
            arr = np.frombuffer(raw, dtype="<f2")
        elif dt == "BF16":
            arr = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            raise ValueError(f"{path}: tensor {name}: unsupported dtype {dt}")
        out[name] = arr.astype(np.float64).reshape(info["shape"])
    del base
    return out


def load_folder(folder):
    with open(os.path.join(folder, "config.json")) as f:
        cfg = json.load(f)
    w = {}
    for fn in sorted(os.listdir(folder)):
        if fn.endswith(".safetensors"):
            w.update(read_safetensors(os.path.join(folder, fn)))
    return cfg, w


def inv_freq(cfg, head_dim):
    theta = float(cfg.get("rope_theta", 10000.0))
    inv = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    rs = cfg.get("rope_scaling") or {}
    if rs.get("rope_type", rs.get("type")) == "llama3":
        factor = float(rs["factor"])
        lo = float(rs.get("low_freq_factor", 1.0))
        hi = float(rs.get("high_freq_factor", 4.0))
        old = float(rs.get("original_max_position_embeddings", 8192))
        lo_wl, hi_wl = old / lo, old / hi
        wl = 2 * math.pi / inv
        smooth = (old / wl - lo) / (hi - lo)
        scaled = np.where(wl > lo_wl, inv / factor, inv)
        mid = (wl <= lo_wl) & (wl >= hi_wl)
        scaled = np.where(mid, (1 - smooth) * inv / factor + smooth * inv, scaled)
        inv = scaled
    return inv


def longrope(cfg, head_dim, seq_len):
    """Phi-3's LongRoPE (transformers' _compute_longrope_parameters and its dynamic update): the
    inverse frequencies and the attention factor for a sequence of seq_len positions."""
    rs = cfg["rope_scaling"]
    orig = int(cfg.get("original_max_position_embeddings") or cfg["max_position_embeddings"])
    factor = cfg["max_position_embeddings"] / orig
    mscale = rs.get("attention_factor")
    if mscale is None:
        mscale = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(orig))
    ext = np.asarray(rs["long_factor"] if seq_len > orig else rs["short_factor"], dtype=np.float64)
    base = float(cfg.get("rope_theta", 10000.0))
    return 1.0 / (ext * base ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)), float(mscale)


def yarn(cfg, head_dim):
    """YaRN's inverse frequencies and attention factor (float64)."""
    rs = cfg["rope_scaling"]
    base = float(cfg.get("rope_theta", 10000.0))
    factor = float(rs["factor"])
    orig = int(rs.get("original_max_position_embeddings") or cfg["max_position_embeddings"])
    fast, slow = float(rs.get("beta_fast") or 32), float(rs.get("beta_slow") or 1)
    mscale = rs.get("attention_factor")
    if mscale is None:
        mscale = 1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0

    def dim_of(rotations):  # the pair index whose wavelength fits `rotations` times in orig
        return head_dim * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(base))
    lo, hi = max(math.floor(dim_of(fast)), 0), min(math.ceil(dim_of(slow)), head_dim - 1)
    if lo == hi:
        hi += 0.001
    extra = 1.0 / base ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    keep = 1.0 - np.clip((np.arange(head_dim // 2, dtype=np.float64) - lo) / (hi - lo), 0.0, 1.0)
    return extra / factor * (1.0 - keep) + extra * keep, float(mscale)


def split_fused(cfg, w):
    """Phi-3's fused projections as the separate ones (a copy of w with q/k/v and gate/up added)."""
    nh = cfg["num_attention_heads"]
    nkv = cfg.get("num_key_value_heads", nh)
    hd = cfg.get("head_dim") or cfg["hidden_size"] // nh
    w = dict(w)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        qkv = w.pop(p + "self_attn.qkv_proj.weight")
        w[p + "self_attn.q_proj.weight"] = qkv[:nh * hd]
        w[p + "self_attn.k_proj.weight"] = qkv[nh * hd:(nh + nkv) * hd]
        w[p + "self_attn.v_proj.weight"] = qkv[(nh + nkv) * hd:]
        gate, up = np.split(w.pop(p + "mlp.gate_up_proj.weight"), 2, axis=0)
        w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"] = gate, up
    return w


def rmsnorm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope_half(x, pos, inv):
    # x (T, H, D); HF rotate_half: pairs (i, i + D/2)
    ang = np.outer(pos, inv)  # (T, D/2)
    cos = np.concatenate([np.cos(ang)] * 2, axis=-1)[:, None, :]
    sin = np.concatenate([np.sin(ang)] * 2, axis=-1)[:, None, :]
    h = x.shape[-1] // 2
    rot = np.concatenate([-x[..., h:], x[..., :h]], axis=-1)
    return x * cos + rot * sin


def window_of(cfg, layer):
    """Keys older than this many positions are masked in `layer` (None: no window)."""
    mt = cfg.get("model_type", "llama")
    win = cfg.get("sliding_window")
    if mt in ("mistral", "phi3"):
        return win or None
    if mt in ("qwen2", "qwen3") and cfg.get("use_sliding_window") and win:
        return win if layer >= cfg.get("max_window_layers", 0) else None
    return None


def forward(cfg, w, tokens, kv_round=None):
    """Logits (T, vocab) float64 for one sequence of token ids, positions 0..T-1. kv_round (optional):
    applied to each layer's K (after RoPE) and V, (T, kv heads, head_dim), as a KV cache stores them."""
    if cfg.get("model_type") == "gemma3_text":
        return forward_gemma3(cfg, w, tokens)
    d = cfg["hidden_size"]
    nh = cfg["num_attention_heads"]
    nkv = cfg.get("num_key_value_heads", nh)
    hd = cfg.get("head_dim") or d // nh
    eps = float(cfg.get("rms_norm_eps", 1e-6))
    L = cfg["num_hidden_layers"]
    T = len(tokens)
    pos = np.arange(T, dtype=np.float64)
    inv, mscale = inv_freq(cfg, hd), 1.0
    if (cfg.get("rope_scaling") or {}).get("rope_type", (cfg.get("rope_scaling") or {}).get("type")) == "yarn":
        inv, mscale = yarn(cfg, hd)
    rd = int(hd * float(cfg.get("partial_rotary_factor") or 1.0))  # Phi-3: rotary dims
    if cfg.get("model_type") == "phi3":
        w = split_fused(cfg, w)
        rs = cfg.get("rope_scaling") or {}
        if rs.get("rope_type", rs.get("type")) in ("longrope", "su"):
            inv, mscale = longrope(cfg, rd, T)
        else:
            inv = inv_freq(cfg, rd)

    def rope(y):  # the first rd dims rotated (half-split), cos and sin times mscale
        return np.concatenate([rope_half(y[..., :rd], pos, inv) * mscale, y[..., rd:]], axis=-1)
    x = w["model.embed_tokens.weight"][np.asarray(tokens)]
    causal = np.triu(np.full((T, T), -np.inf), 1)
    age = np.arange(T)[:, None] - np.arange(T)[None, :]  # t - s
    for i in range(L):
        p = f"model.layers.{i}."
        win = window_of(cfg, i)
        mask = causal if not win else np.where(age >= win, -np.inf, causal)
        h = rmsnorm(x, w[p + "input_layernorm.weight"], eps)

        def proj(name, heads):
            y = h @ w[p + f"self_attn.{name}_proj.weight"].T
            if p + f"self_attn.{name}_proj.bias" in w:
                y = y + w[p + f"self_attn.{name}_proj.bias"]
            y = y.reshape(T, heads, hd)
            if p + f"self_attn.{name}_norm.weight" in w:
                y = rmsnorm(y, w[p + f"self_attn.{name}_norm.weight"], eps)
            return y
        q, k, v = proj("q", nh), proj("k", nkv), proj("v", nkv)
        q = rope(q)
        k = rope(k)
        if kv_round:
            k, v = kv_round(k), kv_round(v)
        rep = nh // nkv
        k = np.repeat(k, rep, axis=1)
        v = np.repeat(v, rep, axis=1)
        s = np.einsum("thd,shd->hts", q, k) / math.sqrt(hd) + mask
        s = np.exp(s - s.max(axis=-1, keepdims=True))
        s /= s.sum(axis=-1, keepdims=True)
        a = np.einsum("hts,shd->thd", s, v).reshape(T, nh * hd)
        x = x + a @ w[p + "self_attn.o_proj.weight"].T
        h = rmsnorm(x, w[p + "post_attention_layernorm.weight"], eps)
        g = h @ w[p + "mlp.gate_proj.weight"].T
        u = h @ w[p + "mlp.up_proj.weight"].T
        x = x + ((g / (1 + np.exp(-g))) * u) @ w[p + "mlp.down_proj.weight"].T
    x = rmsnorm(x, w["model.norm.weight"], eps)
    head = w.get("lm_head.weight")
    if head is None or cfg.get("tie_word_embeddings", False) and "lm_head.weight" not in w:
        head = w["model.embed_tokens.weight"]
    return x @ head.T


def gemma3_is_sliding(cfg, layer):
    """transformers' Gemma3TextConfig: layer_types, else every layer but each pattern-th is local."""
    lt = cfg.get("layer_types")
    if lt:
        return lt[layer] == "sliding_attention"
    return (layer + 1) % int(cfg.get("sliding_window_pattern", 6)) != 0


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def forward_gemma3(cfg, w, tokens):
    d = cfg["hidden_size"]
    nh = cfg["num_attention_heads"]
    nkv = cfg.get("num_key_value_heads", nh)
    hd = cfg.get("head_dim") or 256
    eps = float(cfg.get("rms_norm_eps", 1e-6))
    T = len(tokens)
    pos = np.arange(T, dtype=np.float64)

    def norm(x, wt):  # Gemma3RMSNorm: (1 + w)
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * (1.0 + wt)

    def inv(theta, factor=1.0):
        return 1.0 / (theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd)) / factor
    rs = cfg.get("rope_scaling") or {}
    factor = float(rs.get("factor", 1.0)) if rs.get("rope_type", rs.get("type")) == "linear" else 1.0
    inv_global = inv(float(cfg.get("rope_theta", 1e6)), factor)
    inv_local = inv(float(cfg.get("rope_local_base_freq", 1e4)))
    scale = float(cfg.get("query_pre_attn_scalar", 256)) ** -0.5
    win = int(cfg.get("sliding_window") or 4096)
    norm_scale = float(np.float32(math.sqrt(d)))
    if cfg.get("torch_dtype") == "bfloat16":  # Gemma3TextScaledWordEmbedding: scale.to(weight.dtype)
        u = np.array([norm_scale], dtype="<f4").view("<u4").astype(np.uint64)
        norm_scale = float(np.array([((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16], dtype="<u4").view("<f4")[0])
    x = w["model.embed_tokens.weight"][np.asarray(tokens)] * norm_scale
    causal = np.triu(np.full((T, T), -np.inf), 1)
    age = np.arange(T)[:, None] - np.arange(T)[None, :]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        local = gemma3_is_sliding(cfg, i)
        mask = np.where(age >= win, -np.inf, causal) if local else causal
        iv = inv_local if local else inv_global
        h = norm(x, w[p + "input_layernorm.weight"])

        def proj(name, heads):
            return (h @ w[p + f"self_attn.{name}_proj.weight"].T).reshape(T, heads, hd)
        q = rope_half(norm(proj("q", nh), w[p + "self_attn.q_norm.weight"]), pos, iv)
        k = rope_half(norm(proj("k", nkv), w[p + "self_attn.k_norm.weight"]), pos, iv)
        v = proj("v", nkv)
        k = np.repeat(k, nh // nkv, axis=1)
        v = np.repeat(v, nh // nkv, axis=1)
        s = np.einsum("thd,shd->hts", q, k) * scale + mask
        s = np.exp(s - s.max(axis=-1, keepdims=True))
        s /= s.sum(axis=-1, keepdims=True)
        a = np.einsum("hts,shd->thd", s, v).reshape(T, nh * hd)
        x = x + norm(a @ w[p + "self_attn.o_proj.weight"].T, w[p + "post_attention_layernorm.weight"])
        h = norm(x, w[p + "pre_feedforward_layernorm.weight"])
        m = gelu_tanh(h @ w[p + "mlp.gate_proj.weight"].T) * (h @ w[p + "mlp.up_proj.weight"].T)
        x = x + norm(m @ w[p + "mlp.down_proj.weight"].T, w[p + "post_feedforward_layernorm.weight"])
    x = norm(x, w["model.norm.weight"])
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    logits = x @ head.T
    cap = cfg.get("final_logit_softcapping")
    return np.tanh(logits / cap) * cap if cap else logits


def greedy(cfg, w, prompt, n):
    toks = list(prompt)
    for _ in range(n):
        toks.append(int(np.argmax(forward(cfg, w, toks)[-1])))
    return toks[len(prompt):]


def permute_for_interleaved(weight, n_head):
    """Row permutation llama.cpp's convert_hf_to_gguf applies to q/k projections (half -> pairs)."""
    return (weight.reshape(n_head, 2, weight.shape[0] // n_head // 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))
