"""Llama-style causal LM for servd: Llama 2, Llama 3/3.1, SmolLM2, Mistral, Qwen2/Qwen2.5, Qwen3, Phi-3,
and Gemma 3 text (Gemma3Model, at the end: the same weights and buffers, its own forward).

The families share one decoder; what differs is data the package carries (docs/models.md): Q/K/V
biases (Qwen2: present as tensors), an RMSNorm over each head of Q and K before RoPE (Qwen3: the
q_norm/k_norm tensors), fused Q/K/V and gate/up tensors (Phi-3: taken as row views), head_dim,
rope_theta, the RoPE layout and tied embeddings (the config and the manifest). Mistral's sliding
window is not applied (packages cap their context at it); Phi-3's runs in the attention op.

Runs inside a servd interpreter. Weights are views into the mapped package (never copied); tensor-
parallel rank r of w maps only its slices: column-parallel wq wk wv w1 w3 (output rows), row-parallel
wo w2 (input columns) followed by an all-reduce, vocabulary-parallel embedding (all-reduce of the
zero-padded shards) and output head (all-gather of the logit columns).

Activations live in buffers allocated once per capacity and reused: a step allocates nothing but
the small Python view objects, and those are cached per batch size.

On a GPU interpreter (servd.device() "cuda:N") the same forward runs on the device: placement.py
decides, in one place, where weights and buffers live (shared bf16 weight copies, bf16 activations,
f32 logits, buffers allocated once at the engine's step capacities for CUDA graphs), and the ops
dispatch on their tensors' device.
"""
import math

import servd
from servd import ops


def _add_rmsnorm_parts(x, o, out, weight, eps):
    """servd.ops.add_rmsnorm composed of its parts."""
    ops.add(x, x, o)
    ops.rmsnorm(out, x, weight, eps)


def _matmul_many_parts(x, *pairs):
    """servd.ops.matmul_many composed of its parts."""
    for i in range(0, len(pairs), 2):
        ops.matmul(pairs[i], x, pairs[i + 1])


try:
    from . import placement, rope_scaling
except ImportError:  # model.py loaded as a lone file (tests/llama/numpy_servd.py)
    import importlib.util as _iu
    import os as _os

    def _sibling(name):
        spec = _iu.spec_from_file_location("llama_" + name, _os.path.join(_os.path.dirname(__file__), name + ".py"))
        mod = _iu.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    placement, rope_scaling = _sibling("placement"), _sibling("rope_scaling")

# Hugging Face and GGUF tensor names of the same weight.
_HF = {
    "embed": "model.embed_tokens.weight", "norm": "model.norm.weight", "output": "lm_head.weight",
    "attn_norm": "model.layers.{}.input_layernorm.weight",
    "ffn_norm": "model.layers.{}.post_attention_layernorm.weight",
    "wq": "model.layers.{}.self_attn.q_proj.weight", "wk": "model.layers.{}.self_attn.k_proj.weight",
    "wv": "model.layers.{}.self_attn.v_proj.weight", "wo": "model.layers.{}.self_attn.o_proj.weight",
    "w1": "model.layers.{}.mlp.gate_proj.weight", "w3": "model.layers.{}.mlp.up_proj.weight",
    "w2": "model.layers.{}.mlp.down_proj.weight",
    "bq": "model.layers.{}.self_attn.q_proj.bias", "bk": "model.layers.{}.self_attn.k_proj.bias",
    "bv": "model.layers.{}.self_attn.v_proj.bias",
    "qn": "model.layers.{}.self_attn.q_norm.weight", "kn": "model.layers.{}.self_attn.k_norm.weight",
    # Phi-3: fused Q/K/V rows (Q, then K, then V) and gate/up rows (gate first)
    "wqkv": "model.layers.{}.self_attn.qkv_proj.weight", "w13": "model.layers.{}.mlp.gate_up_proj.weight",
}
_GGUF = {
    "embed": "token_embd.weight", "norm": "output_norm.weight", "output": "output.weight",
    "attn_norm": "blk.{}.attn_norm.weight", "ffn_norm": "blk.{}.ffn_norm.weight",
    "wq": "blk.{}.attn_q.weight", "wk": "blk.{}.attn_k.weight", "wv": "blk.{}.attn_v.weight",
    "wo": "blk.{}.attn_output.weight", "w1": "blk.{}.ffn_gate.weight", "w3": "blk.{}.ffn_up.weight",
    "w2": "blk.{}.ffn_down.weight",
    "bq": "blk.{}.attn_q.bias", "bk": "blk.{}.attn_k.bias", "bv": "blk.{}.attn_v.bias",
    "qn": "blk.{}.attn_q_norm.weight", "kn": "blk.{}.attn_k_norm.weight",
}


def _cfg(cfg, *keys, default=None):
    for k in keys:
        if k in cfg and cfg[k] is not None:
            return cfg[k]
    if default is None:
        raise ValueError(f"llama: model config lacks {keys[0]!r}")
    return default


def _window(cfg):
    """The sliding window that applies (0: none): Mistral's and Phi-3's sliding_window, Qwen's only
    when use_sliding_window is true."""
    w = cfg.get("sliding_window")
    switch = cfg.get("model_type") in ("qwen2", "qwen3")  # transformers' default use_sliding_window: false
    if not w or (switch and not cfg.get("use_sliding_window")):
        return 0
    return int(w)


def _split(n, rank, world, what, align=1):
    """Equal contiguous shard [start, start+len) of n along a parallel dimension."""
    if n % world or (n // world) % align:
        raise ValueError(f"llama: {what}={n} does not split evenly over {world} tensor-parallel ranks"
                         + (f" in multiples of {align}" if align > 1 else ""))
    part = n // world
    return rank * part, part


class LlamaModel:
    GEMMA = False  # Gemma3Model: the window and rope_scaling are its own

    def __init__(self):
        pkg = servd.package
        cfg = dict(pkg.config)
        man = pkg.manifest
        self.rank, self.world = servd.rank(), servd.world_size()
        names = set(pkg.tensor_names())
        self._names = _GGUF if _GGUF["embed"] in names else _HF
        # modelpkg turns a GGUF's rope_freqs into config rope_scaling; a package that still holds the
        # tensor would run with unscaled RoPE.
        stale = names & {"rope_freqs.weight", "model.rope_freqs.weight"}
        if stale:
            raise ValueError(f"llama: the package holds {sorted(stale)[0]} (per-dimension RoPE factors), which "
                             "this model code does not apply: repack the GGUF with this modelpkg, which turns "
                             "it into rope_scaling")

        self.dim = int(_cfg(cfg, "hidden_size", "embedding_length"))
        self.n_layers = int(_cfg(cfg, "num_hidden_layers", "block_count"))
        self.n_heads = int(_cfg(cfg, "num_attention_heads", "head_count"))
        self.n_kv_heads = int(_cfg(cfg, "num_key_value_heads", "head_count_kv", default=self.n_heads))
        self.head_dim = int(_cfg(cfg, "head_dim", default=self.dim // self.n_heads))
        self.eps = float(_cfg(cfg, "rms_norm_eps", "layer_norm_rms_epsilon", default=1e-6))
        self.vocab = int(_cfg(cfg, "vocab_size", default=-1))
        hidden = int(_cfg(cfg, "intermediate_size", "feed_forward_length"))

        layout = man.get("rope_layout") or cfg.get("rope_layout") or (
            "interleaved" if self._names is _GGUF else "half")
        theta = float(_cfg(cfg, "rope_theta", "rope_freq_base", default=10000.0))
        # llama3 by the op's own numbers; YaRN and LongRoPE as per-pair tables (rope_scaling.py).
        rkw = {} if self.GEMMA else rope_scaling.rope_kwargs(cfg, self.head_dim, theta)
        if float(cfg.get("partial_rotary_factor") or 1.0) != 1.0:
            raise ValueError("llama: partial_rotary_factor other than 1.0 is not supported (the rope op rotates "
                             "whole heads)")
        self.rope = servd.Rope(layout=layout, head_dim=self.head_dim, theta=theta, **rkw)

        r, w = self.rank, self.world
        _, self.h_local = _split(self.n_heads, r, w, "num_attention_heads")
        _, self.kv_local = _split(self.n_kv_heads, r, w, "num_key_value_heads")
        hd = self.head_dim
        q0, qn = r * self.h_local * hd, self.h_local * hd
        k0, kn = r * self.kv_local * hd, self.kv_local * hd
        f0, fn = _split(hidden, r, w, "intermediate_size", align=32 if w > 1 else 1)
        self.q_cols, self.kv_cols, self.ff_cols = qn, kn, fn

        def t(key, i=None):
            return pkg.tensor(self._names[key].format(i))

        def rows(x, start, n):  # column-parallel: output features are rows of the nn.Linear weight
            return x if w == 1 else x.narrow(0, start, n)

        def cols(x, start, n):  # row-parallel: input features are the innermost dimension
            return x if w == 1 else x.narrow(1, start, n)

        embed = t("embed")
        if self.vocab < 0:
            self.vocab = embed.shape[0]
        # Vocabulary shards of ceil(vocab/world) rows, the last rank the remainder: the split the
        # device all-gather of the logit columns requires (see placement.vocab_shard).
        self.v0, self.vn = placement.vocab_shard(self.vocab, r, w)

        # Host: the mapped views as they are. GPU: their shared bf16 device copies, uploaded here,
        # at load, so that the engine sizes the device KV cache from what is left.
        self._mem = placement.memory_for(servd, dict(dim=self.dim, q_cols=qn, kv_cols=kn, ff_cols=fn,
                                                      vn=self.vn, vocab=self.vocab, world=w))
        W = self._mem.weight
        self.embed = W(rows(embed, self.v0, self.vn))
        out_name = self._names["output"]
        tied = bool(cfg.get("tie_word_embeddings", False)) or out_name not in names
        # Tied: the same tensor, so a GPU holds one copy.
        self.output = self.embed if tied else W(rows(pkg.tensor(out_name), self.v0, self.vn))
        self.norm = W(t("norm"))

        # Phi-3 holds Q/K/V and gate/up fused: each is a view of its rows (canonical names only:
        # modelpkg renames a GGUF's attn_qkv / ffn_up).
        fused = _HF["wqkv"].format(0) in names
        Qr, KVr = self.n_heads * hd, self.n_kv_heads * hd

        def qkv(i):
            f = pkg.tensor(_HF["wqkv"].format(i))
            return f.narrow(0, q0, qn), f.narrow(0, Qr + k0, kn), f.narrow(0, Qr + KVr + k0, kn)

        def gate_up(i):
            f = pkg.tensor(_HF["w13"].format(i))
            return f.narrow(0, f0, fn), f.narrow(0, hidden + f0, fn)

        self.layers = []
        for i in range(self.n_layers):
            if fused:
                (wq, wk, wv), (w1, w3) = qkv(i), gate_up(i)
            else:
                wq, wk, wv = rows(t("wq", i), q0, qn), rows(t("wk", i), k0, kn), rows(t("wv", i), k0, kn)
                w1, w3 = rows(t("w1", i), f0, fn), rows(t("w3", i), f0, fn)
            self.layers.append((
                W(t("attn_norm", i)), W(wq), W(wk), W(wv), W(cols(t("wo", i), q0, qn)),
                W(t("ffn_norm", i)), W(w1), W(w3), W(cols(t("w2", i), f0, fn)),
            ))
        # Family extras, per layer (None where the package has none): Q/K/V biases as one-row tables
        # (added through ops.embedding, which broadcasts a row, then ops.add) and per-head norms.
        has = lambda key: self._names[key].format(0) in names  # noqa: E731
        self.has_bias, self.has_qk_norm = has("bq"), has("qn")
        self.extras = []
        for i in range(self.n_layers if (self.has_bias or self.has_qk_norm) else 0):
            b = None
            if self.has_bias:
                b = (W(rows(t("bq", i), q0, qn).view(1, qn)), W(rows(t("bk", i), k0, kn).view(1, kn)),
                     W(rows(t("bv", i), k0, kn).view(1, kn)))
            nrm = (W(t("qn", i)), W(t("kn", i))) if self.has_qk_norm else None
            self.extras.append((b, nrm))
        self._extra_views = {}
        self._zero_ids = None
        window = 0 if self.GEMMA else _window(cfg)
        ctx = int(cfg.get("max_position_embeddings") or 2048)
        # Phi-3 runs its window in the attention op (the others' packages cap the context at it).
        self.window = window if fused and window < ctx else 0
        if window and window < ctx and not self.window:
            raise ValueError(f"llama: sliding_window {window} < max_position_embeddings {ctx}: servd's attention has "
                             "no sliding window; repack with modelpkg, which caps the context at the window")
        self.scale = 1.0 / math.sqrt(hd)
        self._ops, self._prof, self._clock = ops, None, None
        # Reused buffer views per step size (host: grown on demand; GPU: allocated once, bounded).
        self._step_views = self._mem.step_views
        self._logit_bufs = self._mem.logit_views

    # ---- forward -------------------------------------------------------------------------------
    def forward(self, batch):
        """Logits f32 (len(batch.logit_rows), vocab) for the requested rows of a mixed batch, or None
        when no row needs them. The returned tensor is a reused buffer: valid until the next call.
        On a GPU every tensor here is on the device, logits included (the engine downloads them)."""
        n = batch.n_tokens
        x, h, o, q, k, v, a, g, u = self._step_views(n, batch)
        tp = self.world > 1
        eps, rope, scale, hl, win = self.eps, self.rope, self.scale, self.h_local, self.window
        kv, pos, slots = batch.kv, batch.positions, batch.slots
        P = self._ops
        matmul, rmsnorm, add, allreduce = P.matmul, P.rmsnorm, P.add, P.allreduce
        rope_op, kv_write, attention, swiglu = P.rope, P.kv_write, P.attention, P.swiglu
        # Fused ops (one launch each on a GPU): the residual add with the norm after it, and the
        # matmuls that share an input. They compute what their parts compute.
        add_rmsnorm = getattr(P, "add_rmsnorm", _add_rmsnorm_parts)  # parts: a servd older than this code
        matmul_many = getattr(P, "matmul_many", _matmul_many_parts)
        layers = self.layers
        last = len(layers) - 1
        t0 = self._clock() if self._prof else 0
        P.embedding(x, self.embed, batch.tokens, self.v0)
        if tp:
            allreduce(x)
        rmsnorm(h, x, layers[0][0], eps)
        extras = self.extras
        if extras:
            zeros, scratch, qh, kh, _ = self._extras_for(n, q, k, g, batch)
        # LoRA adapter groups (batch.lora: rows, scale, ab per layer and projection): each projection's
        # output gets scale * (x A^T) B^T on its group's rows, one lora_sgmv call for all groups.
        lora = getattr(batch, "lora", None)
        if lora:
            lsegs, labs, sgmv = [(f, m, s) for f, m, s, _ in lora], [w for *_, w in lora], P.lora_sgmv
        for li, (an, wq, wk, wv, wo, fnorm, w1, w3, w2) in enumerate(layers):
            matmul_many(h, q, wq, k, wk, v, wv)
            if lora:
                lb = li * 7
                sgmv(q, h, lsegs, [w[lb] for w in labs])
                sgmv(k, h, lsegs, [w[lb + 1] for w in labs])
                sgmv(v, h, lsegs, [w[lb + 2] for w in labs])
            if extras:
                bias, qk_norm = extras[li]
                if bias:  # out += the bias row: broadcast by an embedding of row 0, then added
                    P.embedding(a, bias[0], zeros)
                    add(q, q, a)
                    P.embedding(scratch, bias[1], zeros)
                    add(k, k, scratch)
                    P.embedding(scratch, bias[2], zeros)
                    add(v, v, scratch)
                if qk_norm:  # RMSNorm over each head: rows of head_dim
                    rmsnorm(qh, qh, qk_norm[0], eps)
                    rmsnorm(kh, kh, qk_norm[1], eps)
            rope_op(q, pos, rope)
            rope_op(k, pos, rope)
            kv_write(kv, li, k, v, slots)
            if win:
                attention(a, q, kv, li, batch, hl, scale, win)
            else:
                attention(a, q, kv, li, batch, hl, scale)
            matmul(o, a, wo)
            if lora:
                sgmv(o, a, lsegs, [w[lb + 3] for w in labs])
            if tp:
                allreduce(o)
            add_rmsnorm(x, o, h, fnorm, eps)
            matmul_many(h, g, w1, u, w3)
            if lora:
                sgmv(g, h, lsegs, [w[lb + 4] for w in labs])
                sgmv(u, h, lsegs, [w[lb + 5] for w in labs])
            swiglu(g, g, u)
            matmul(o, g, w2)
            if lora:
                sgmv(o, g, lsegs, [w[lb + 6] for w in labs])
            if tp:
                allreduce(o)
            if li < last:
                add_rmsnorm(x, o, h, layers[li + 1][0], eps)  # the next layer's attention norm
            else:
                add(x, x, o)
        rows = batch.logit_rows
        if len(rows) == 0:  # a prefill chunk that does not reach the end of its prompt
            if self._prof:
                self._prof["forward_ns"] += self._clock() - t0
                self._prof["steps"] += 1
            return None
        sel, lg, full = self._logit_bufs(len(rows), batch)
        P.embedding(sel, x, rows)  # gathers the rows that need logits
        rmsnorm(sel, sel, self.norm, eps)
        if getattr(batch, "hidden", False):  # embeddings: the final-norm hidden rows instead of logits
            return self._mem.hidden_rows(sel)
        matmul(lg, sel, self.output)
        if tp:  # rank r's columns [v0, v0+vn) land at that offset: shards in rank order
            P.allgather_cols(full, lg)
        if self._prof:
            self._prof["forward_ns"] += self._clock() - t0
            self._prof["steps"] += 1
        return full

    def _extras_for(self, n, q, k, g, batch):
        """Views for the family extras at n tokens, made once per n: zero ids (n,) i32, a (n, kv
        cols) scratch in the storage of g (free until the MLP), and q/k as rows of head_dim."""
        v = self._extra_views.get(n)
        if v is None or v[4] is not q:  # made for buffers since replaced (host growth)
            hd, kc = self.head_dim, self.kv_cols
            if self._zero_ids is None or self._zero_ids.shape[0] < n:
                cap = max(n, placement.step_capacity(batch)[0], 16)
                dev = None if not placement.on_device(servd.device()) else servd.device()
                self._zero_ids = servd.empty((cap,), "i32", device=dev)
                self._extra_views = {}
            zeros = self._zero_ids.narrow(0, 0, n)
            if kc > self.ff_cols:
                raise ValueError(f"llama: {kc} key/value columns exceed the {self.ff_cols} MLP columns used as scratch")
            scratch = g.view(n * self.ff_cols).narrow(0, 0, n * kc).view(n, kc)
            v = (zeros, scratch, q.view(n * self.h_local, hd), k.view(n * self.kv_local, hd), q)
            self._extra_views[n] = v
        return v

    # ---- measuring Python's share of a step ----------------------------------------------------
    def profile(self, enable=True):
        """Times every op call (from Python, so call overhead is counted as op time) and each
        forward. profile_stats() then gives the time spent outside ops: Python's share."""
        import time
        self._clock = time.perf_counter_ns
        if not enable:
            self._ops, self._prof = ops, None
            return None
        prof = {"forward_ns": 0, "ops_ns": 0, "op_calls": 0, "steps": 0}
        clock = self._clock

        def timed(fn):
            def call(*a):
                t = clock()
                r = fn(*a)
                prof["ops_ns"] += clock() - t
                prof["op_calls"] += 1
                return r
            return call

        class Timed:
            pass

        t = Timed()
        for name in ("matmul", "rmsnorm", "add", "allreduce", "rope", "kv_write", "attention", "swiglu", "geglu",
                     "embedding", "allgather_cols", "add_rmsnorm", "matmul_many"):
            if hasattr(ops, name):
                setattr(t, name, timed(getattr(ops, name)))
        self._ops, self._prof = t, prof
        return None

    def profile_stats(self):
        return dict(self._prof or {})

    # ---- LoRA adapters ---------------------------------------------------------------------------
    def lora_info(self):
        """Asked by the engine before it registers an adapter: this code adds batch.lora's products
        (a package packed before adapters existed has no such method, and is refused)."""
        return {"batch_lora": True}

    # ---- chat ----------------------------------------------------------------------------------
    def chat_template(self, messages, add_generation_prompt=True):
        from . import chat
        return chat.render(messages, add_generation_prompt)

    # ---- constrained decoding (guided.py) ------------------------------------------------------
    def guide_compile(self, kind, spec, n_vocab, eos_ids):
        from . import guided
        return guided.compile(kind, spec, n_vocab, eos_ids)

    def guide_step(self, rows, free_ids):
        from . import guided
        return guided.step(rows, free_ids)

    # ---- tool calling (tools.py) ---------------------------------------------------------------
    def tool_render(self, messages, add_generation_prompt, tools):
        # tools: the list, or the options object of reasoning.render ({"tools", "chat_template_kwargs"})
        if isinstance(tools, dict):
            from . import reasoning
            return reasoning.render(messages, add_generation_prompt, tools)
        from . import tools as t
        return t.render(messages, add_generation_prompt, tools)

    def tool_parse(self, text, spec):
        from . import tools as t
        return t.parse(text, spec)


# ---- Gemma 3 -------------------------------------------------------------------------------------
_GEMMA_HF = {"in": "model.layers.{}.input_layernorm.weight", "post_attn": "model.layers.{}.post_attention_layernorm.weight",
             "pre_ff": "model.layers.{}.pre_feedforward_layernorm.weight",
             "post_ff": "model.layers.{}.post_feedforward_layernorm.weight"}
_GEMMA_GGUF = {"in": "blk.{}.attn_norm.weight", "post_attn": "blk.{}.post_attention_norm.weight",
               "pre_ff": "blk.{}.ffn_norm.weight", "post_ff": "blk.{}.post_ffw_norm.weight"}


def _round_to(x, dtype):
    """x rounded to dtype's precision (transformers casts the embedding normalizer to the weights' dtype)."""
    import struct
    b = struct.unpack("<I", struct.pack("<f", x))[0]
    if dtype == "bf16":
        b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
        return struct.unpack("<f", struct.pack("<I", b))[0]
    if dtype == "f16":
        return struct.unpack("<e", struct.pack("<e", x))[0]
    return struct.unpack("<f", struct.pack("<f", x))[0]


class Gemma3Model(LlamaModel):
    """Gemma 3 text (transformers' modeling_gemma3): embeddings times sqrt(hidden), RMSNorm times
    (1 + w), a norm before and after attention and the MLP, per-head Q/K norms, queries scaled by
    query_pre_attn_scalar^-0.5, gelu_tanh(gate) * up, local layers (sliding window, RoPE base
    rope_local_base_freq) and global ones (rope_theta, linear rope_scaling).

    Norm weights: a package from Hugging Face holds w (the code adds 1), one from a GGUF 1 + w (llama.cpp's
    converter adds it; the manifest's source.format says which). Both become f32 tensors made once at load. The embedding scale s costs no op: the
    residual stream is kept in units of 1/s (x' = x / s). Every reader of x is an RMSNorm, exact on
    x' with eps / s^2; every writer is a post-norm, whose weight is divided by s. So the hidden
    states differ from transformers' by the factor s, the logits do not."""
    GEMMA = True

    def __init__(self):
        super().__init__()
        pkg = servd.package
        cfg = dict(pkg.config)
        if cfg.get("final_logit_softcapping") or cfg.get("attn_logit_softcapping"):
            raise ValueError("gemma3: logit soft-capping is not supported (Gemma 3 has none)")
        names = _GEMMA_GGUF if self._names is _GGUF else _GEMMA_HF
        # modelpkg renames a GGUF's tensors to the canonical names; the source says what the norms hold
        gguf = self._names is _GGUF or (pkg.manifest.get("source") or {}).get("format") == "gguf"
        shift = 0.0 if gguf else 1.0
        W = self._mem.weight
        emb_dtype = pkg.tensor(self._names["embed"]).dtype
        s = _round_to(math.sqrt(self.dim), emb_dtype if not gguf else "f32")  # llama.cpp: f32 sqrt
        self.embed_scale = s

        def vec(t, div=1.0):  # (shift + w) / div, f32, made once
            return W(servd.tensor([(shift + float(x)) / div for x in t.tolist()], "f32"))
        L = self.n_layers
        self.g_in = [vec(pkg.tensor(names["in"].format(i))) for i in range(L)]
        self.g_pre_ff = [vec(pkg.tensor(names["pre_ff"].format(i))) for i in range(L)]
        self.g_post_attn = [vec(pkg.tensor(names["post_attn"].format(i)), s) for i in range(L)]
        self.g_post_ff = [vec(pkg.tensor(names["post_ff"].format(i)), s) for i in range(L)]
        self.g_qk = [(vec(pkg.tensor(self._names["qn"].format(i))), vec(pkg.tensor(self._names["kn"].format(i))))
                     for i in range(L)]
        self.norm = vec(pkg.tensor(self._names["norm"]))
        self.eps_res = self.eps / (s * s)  # the norms that read the residual stream in units of 1/s

        layout = pkg.manifest.get("rope_layout") or "half"
        hd = self.head_dim
        self.rope_local = servd.Rope(layout=layout, head_dim=hd, theta=float(cfg.get("rope_local_base_freq") or 1e4))
        rs = cfg.get("rope_scaling") or {}
        kind = rs.get("rope_type", rs.get("type"))
        if rs and kind != "linear":
            raise ValueError(f"gemma3: unsupported rope_scaling {rs!r} (supported: linear)")
        factor = float(rs.get("factor", 1.0)) if rs else 1.0
        # Linear scaling (every frequency / factor) is servd.Rope's llama3 scaling with every
        # wavelength above low_freq_factor * original_max_positions = 1.
        rkw = dict(factor=factor, low_freq_factor=1.0, high_freq_factor=4.0, original_max_positions=1) \
            if factor > 1.0 else {}
        self.rope_global = servd.Rope(layout=layout, head_dim=hd, theta=float(cfg.get("rope_theta") or 1e6), **rkw)
        lt = cfg.get("layer_types")
        pattern = int(cfg.get("sliding_window_pattern") or 6)
        self.sliding = [lt[i] == "sliding_attention" if lt else (i + 1) % pattern != 0 for i in range(L)]
        self.window = int(cfg.get("sliding_window") or 4096)
        self.scale = float(cfg.get("query_pre_attn_scalar") or 256) ** -0.5

    def forward(self, batch):
        n = batch.n_tokens
        x, h, o, q, k, v, a, g, u = self._step_views(n, batch)
        _, _, qh, kh, _ = self._extras_for(n, q, k, g, batch)
        tp = self.world > 1
        eps, eps_res, scale, hl, win = self.eps, self.eps_res, self.scale, self.h_local, self.window
        kv, pos, slots = batch.kv, batch.positions, batch.slots
        P = self._ops
        matmul, rmsnorm, add, allreduce = P.matmul, P.rmsnorm, P.add, P.allreduce
        rope_op, kv_write, attention, geglu = P.rope, P.kv_write, P.attention, P.geglu
        add_rmsnorm = getattr(P, "add_rmsnorm", _add_rmsnorm_parts)
        matmul_many = getattr(P, "matmul_many", _matmul_many_parts)
        t0 = self._clock() if self._prof else 0
        P.embedding(x, self.embed, batch.tokens, self.v0)  # x' = embedding / s: no scaling needed
        if tp:
            allreduce(x)
        rmsnorm(h, x, self.g_in[0], eps_res)
        last = self.n_layers - 1
        lora = getattr(batch, "lora", None)  # as LlamaModel.forward
        if lora:
            lsegs, labs, sgmv = [(f, m, s) for f, m, s, _ in lora], [w for *_, w in lora], P.lora_sgmv
        for li, (_, wq, wk, wv, wo, _, w1, w3, w2) in enumerate(self.layers):
            matmul_many(h, q, wq, k, wk, v, wv)
            if lora:
                lb = li * 7
                sgmv(q, h, lsegs, [w[lb] for w in labs])
                sgmv(k, h, lsegs, [w[lb + 1] for w in labs])
                sgmv(v, h, lsegs, [w[lb + 2] for w in labs])
            qn, kn = self.g_qk[li]
            rmsnorm(qh, qh, qn, eps)
            rmsnorm(kh, kh, kn, eps)
            local = self.sliding[li]
            rope = self.rope_local if local else self.rope_global
            rope_op(q, pos, rope)
            rope_op(k, pos, rope)
            kv_write(kv, li, k, v, slots)
            if local:
                attention(a, q, kv, li, batch, hl, scale, win)
            else:
                attention(a, q, kv, li, batch, hl, scale)
            matmul(o, a, wo)
            if lora:
                sgmv(o, a, lsegs, [w[lb + 3] for w in labs])
            if tp:
                allreduce(o)
            rmsnorm(o, o, self.g_post_attn[li], eps)
            add_rmsnorm(x, o, h, self.g_pre_ff[li], eps_res)
            matmul_many(h, g, w1, u, w3)
            if lora:
                sgmv(g, h, lsegs, [w[lb + 4] for w in labs])
                sgmv(u, h, lsegs, [w[lb + 5] for w in labs])
            geglu(g, g, u)
            matmul(o, g, w2)
            if lora:
                sgmv(o, g, lsegs, [w[lb + 6] for w in labs])
            if tp:
                allreduce(o)
            rmsnorm(o, o, self.g_post_ff[li], eps)
            if li < last:
                add_rmsnorm(x, o, h, self.g_in[li + 1], eps_res)
            else:
                add(x, x, o)
        rows = batch.logit_rows
        if len(rows) == 0:
            if self._prof:
                self._prof["forward_ns"] += self._clock() - t0
                self._prof["steps"] += 1
            return None
        sel, lg, full = self._logit_bufs(len(rows), batch)
        P.embedding(sel, x, rows)
        rmsnorm(sel, sel, self.norm, eps_res)
        if getattr(batch, "hidden", False):
            return self._mem.hidden_rows(sel)
        matmul(lg, sel, self.output)
        if tp:
            P.allgather_cols(full, lg)
        if self._prof:
            self._prof["forward_ns"] += self._clock() - t0
            self._prof["steps"] += 1
        return full
