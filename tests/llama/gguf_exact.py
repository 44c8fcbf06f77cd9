"""The exact model of a GGUF file, and servd's logits of a token sequence, for the tools that measure how
close an engine comes to it (scripts/bench/fidelity.py, scripts/bench/kv_fidelity.py) and the tests that
compare quantized packages with their dequantized weights (test_llama.py, test_lora.py).

"Exact" means float64 throughout on the weights as gguf-py dequantizes them (test-only, .venv-test; it
shares no code with servd): the quantization is part of the model, every rounding after it is an engine's.
  - llama-family files (general.architecture "llama": SmolLM2, ...) run llama_ref.py's Hugging Face
    forward after Q/K rows are unpermuted back to half-split order (load_llama_gguf);
  - gemma3 files run gemma3_gguf_ref.py (Gemma3Ref), which reads llama.cpp's conventions itself.
servd's side is tests/llama/llama_logits (build/tests/llama/llama_logits), which runs a package through the
interpreters exactly as the engine does.
"""
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_ref as R  # noqa: E402


def log_softmax(x):
    """Log-probabilities along the last axis (float64 in, float64 out)."""
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def architecture(path):
    from gguf import GGUFReader

    f = GGUFReader(path).fields["general.architecture"]
    return bytes(f.parts[f.data[0]]).decode()


def load_llama_gguf(path):
    """(Hugging Face config, {HF name: float64 array}) of a llama-architecture GGUF."""
    from gguf import GGUFReader
    from gguf.quants import dequantize
    r = GGUFReader(path)
    f = {x.name: x for x in r.fields.values()}

    def val(k):
        x = f[k]
        return x.parts[x.data[0]].tolist()[0]
    cfg = dict(hidden_size=val("llama.embedding_length"), num_hidden_layers=val("llama.block_count"),
               num_attention_heads=val("llama.attention.head_count"),
               num_key_value_heads=val("llama.attention.head_count_kv"),
               rms_norm_eps=val("llama.attention.layer_norm_rms_epsilon"), rope_theta=val("llama.rope.freq_base"),
               intermediate_size=val("llama.feed_forward_length"), tie_word_embeddings=True)
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]

    def unpermute(a, n):  # GGUF interleaved Q/K rows back to Hugging Face's half-split order
        return a.reshape(n, a.shape[0] // n // 2, 2, *a.shape[1:]).swapaxes(1, 2).reshape(a.shape)
    top = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
           "output.weight": "lm_head.weight"}
    blk = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm", "attn_q": "self_attn.q_proj",
           "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
           "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
    w = {}
    for t in r.tensors:
        a = dequantize(t.data, t.tensor_type).astype(np.float64).reshape([int(x) for x in reversed(t.shape.tolist())])
        if t.name.startswith("blk."):
            _, i, k, _ = t.name.split(".")
            a = unpermute(a, nh) if k == "attn_q" else unpermute(a, nkv) if k == "attn_k" else a
            w[f"model.layers.{i}.{blk[k]}.weight"] = a
        else:
            w[top[t.name]] = a
    return cfg, w


class ExactModel:
    """The float64 model of a llama or gemma3 GGUF: logprobs(tokens) -> (T, vocab) log-probabilities of the
    next token at every position of one sequence (positions 0..T-1)."""

    def __init__(self, path):
        self.arch = architecture(path)
        if self.arch == "llama":
            self._cfg, self._w = load_llama_gguf(path)
        elif self.arch == "gemma3":
            from gemma3_gguf_ref import Gemma3Ref
            self._gemma = Gemma3Ref(path)
        else:
            raise ValueError(f"{path}: no float64 reference for general.architecture {self.arch!r} "
                             "(llama and gemma3 have one)")

    def logprobs(self, tokens):
        if self.arch == "llama":
            return log_softmax(R.forward(self._cfg, self._w, list(tokens)))
        return log_softmax(self._gemma.logits(list(tokens)))


def servd_logprobs(llama_logits, pkg, tokens, decode=0, tp=1, kv_dtype=None, keep_last=0, env=None, extra=()):
    """servd's log-probabilities (float64) of every position of `tokens` followed by `decode` greedy tokens
    (the last `keep_last` rows when set), and those greedy ids: llama_logits on the package `pkg`.
    env: the process environment (SERVD_ISA, ...); a failure raises RuntimeError with llama_logits' stderr."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "logits.bin")
        cmd = [llama_logits, pkg, out, "--tokens", ",".join(map(str, tokens)), "--decode", str(decode),
               "--tp", str(tp)]
        if kv_dtype:
            cmd += ["--kv-dtype", kv_dtype]
        if keep_last:
            cmd += ["--keep-last", str(keep_last)]
        r = subprocess.run(cmd + list(extra), capture_output=True, text=True, env=env)
        if r.returncode != 0:
            raise RuntimeError(f"llama_logits (tp {tp}) failed ({r.returncode}): {r.stderr.strip()[-1500:]}")
        raw = open(out, "rb").read()
    n, v = (int(x) for x in np.frombuffer(raw[:8], "<i4"))
    rows = np.frombuffer(raw[8:8 + 4 * n * v], "<f4").reshape(n, v).astype(np.float64)
    k = int(np.frombuffer(raw[8 + 4 * n * v:12 + 4 * n * v], "<i4")[0])
    ids = np.frombuffer(raw[12 + 4 * n * v:12 + 4 * n * v + 4 * k], "<i4").tolist()
    return log_softmax(rows), ids
