"""Float64 numpy forward of a Gemma 3 GGUF (test oracle for real files, e.g. Gemma 3 270M Q4_K_M).

The weights are dequantized by gguf-py (gguf.quants.dequantize, shared with no servd code) and held in
float64; every product and sum is float64. The forward is transformers' modeling_gemma3
(Gemma3ForCausalLM) read with llama.cpp's GGUF conventions (convert_hf_to_gguf, Gemma3Model):
  - every *norm.weight in the file is the Hugging Face weight plus one, so Gemma3RMSNorm's
    x / rms(x) * (1 + w) is x / rms(x) * w_file here;
  - Q/K rows are not permuted (Gemma uses half-split RoPE, like the Hugging Face code);
  - no rope_local_base_freq or layer-type key: as llama.cpp does, local (sliding-window) layers use
    base 10000 and every sliding_window_pattern-th (6th) layer is global with gemma3.rope.freq_base;
  - the output head is token_embd (tied) unless the file has output.weight.
Embeddings times sqrt(hidden) (exact, float64), q_norm/k_norm over each head before RoPE, scores
times query_pre_attn_scalar^-0.5 (= key_length^-0.5, transformers' default for Gemma 3 text models
of this size: 256), keys older than the window masked in local layers (t - s >= window), post-norms
after attention and the MLP, gelu_pytorch_tanh(gate) * up, final logit soft-capping when the file
sets gemma3.final_logit_softcapping.

Decode keeps a KV cache and steps all prompts at once (one matrix product per weight per step); logits()
gives every position of one sequence in one pass.
"""
import math

import numpy as np

LOCAL_ROPE_BASE = 10000.0
SLIDING_WINDOW_PATTERN = 6


def _field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    v = f.contents()
    return v


class Gemma3Ref:
    def __init__(self, path):
        import gguf
        from gguf.quants import dequantize

        r = gguf.GGUFReader(path)
        arch = _field(r, "general.architecture")
        if arch != "gemma3":
            raise ValueError(f"{path}: general.architecture is {arch!r}, expected 'gemma3'")
        k = "gemma3."
        self.d = int(_field(r, k + "embedding_length"))
        self.L = int(_field(r, k + "block_count"))
        self.nh = int(_field(r, k + "attention.head_count"))
        self.nkv = int(_field(r, k + "attention.head_count_kv", self.nh))
        self.hd = int(_field(r, k + "attention.key_length", 256))
        self.eps = float(_field(r, k + "attention.layer_norm_rms_epsilon", 1e-6))
        self.window = int(_field(r, k + "attention.sliding_window", 4096))
        self.theta = float(_field(r, k + "rope.freq_base", 1e6))
        self.cap = _field(r, k + "final_logit_softcapping")
        self.scale = float(self.hd) ** -0.5
        self.w = {}
        for t in r.tensors:
            a = dequantize(t.data, t.tensor_type).astype(np.float64)
            self.w[t.name] = a.reshape([int(x) for x in reversed(t.shape)]) if a.ndim > 1 or len(t.shape) > 1 else a
        self.head = self.w.get("output.weight", self.w["token_embd.weight"])

    def _inv(self, layer):
        base = self.theta if self.is_global(layer) else LOCAL_ROPE_BASE
        return 1.0 / base ** (np.arange(0, self.hd, 2, dtype=np.float64) / self.hd)

    def is_global(self, layer):
        return (layer + 1) % SLIDING_WINDOW_PATTERN == 0

    def _norm(self, x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def _rope(self, y, pos, inv):  # y (..., T, heads, hd), pos (T,)
        ang = pos[:, None] * inv[None, :]
        cos = np.concatenate([np.cos(ang)] * 2, axis=-1)[:, None, :]
        sin = np.concatenate([np.sin(ang)] * 2, axis=-1)[:, None, :]
        h = self.hd // 2
        rot = np.concatenate([-y[..., h:], y[..., :h]], axis=-1)
        return y * cos + rot * sin

    def _step(self, rows, caches, positions):
        """rows: token ids (one per sequence, or a prompt for one sequence when len(caches) == 1);
        positions: per row its position; caches: per sequence [k, v] lists per layer. Returns the
        last hidden state of each row (float64)."""
        w = self.w
        x = w["token_embd.weight"][np.asarray(rows)] * math.sqrt(self.d)
        pos = np.asarray(positions, dtype=np.float64)
        n = len(rows)
        for i in range(self.L):
            p = f"blk.{i}."
            inv = self._inv(i)
            h = self._norm(x, w[p + "attn_norm.weight"])
            q = self._norm((h @ w[p + "attn_q.weight"].T).reshape(n, self.nh, self.hd), w[p + "attn_q_norm.weight"])
            k = self._norm((h @ w[p + "attn_k.weight"].T).reshape(n, self.nkv, self.hd), w[p + "attn_k_norm.weight"])
            v = (h @ w[p + "attn_v.weight"].T).reshape(n, self.nkv, self.hd)
            q = self._rope(q, pos, inv)
            k = self._rope(k, pos, inv)
            out = np.empty((n, self.nh * self.hd))
            if len(caches) == 1:  # prefill of one sequence: rows are its positions
                ck, cv = caches[0][i]
                ck.extend(k)
                cv.extend(v)
                rows_of = [(t, 0, int(positions[t])) for t in range(n)]
            else:  # decode: row j is sequence j's next position
                for j in range(n):
                    caches[j][i][0].append(k[j])
                    caches[j][i][1].append(v[j])
                rows_of = [(j, j, int(positions[j])) for j in range(n)]
            for t, seq, at in rows_of:
                K = np.stack(caches[seq][i][0][: at + 1])  # (S, nkv, hd)
                V = np.stack(caches[seq][i][1][: at + 1])
                age = at - np.arange(at + 1)
                rep = self.nh // self.nkv
                Kh = np.repeat(K, rep, axis=1)
                Vh = np.repeat(V, rep, axis=1)
                s = np.einsum("hd,shd->hs", q[t], Kh) * self.scale
                if not self.is_global(i):
                    s = np.where(age[None, :] >= self.window, -np.inf, s)
                s = np.exp(s - s.max(axis=-1, keepdims=True))
                s /= s.sum(axis=-1, keepdims=True)
                out[t] = np.einsum("hs,shd->hd", s, Vh).reshape(-1)
            x = x + self._norm(out @ w[p + "attn_output.weight"].T, w[p + "post_attention_norm.weight"])
            h = self._norm(x, w[p + "ffn_norm.weight"])
            g = h @ w[p + "ffn_gate.weight"].T
            gelu = 0.5 * g * (1 + np.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g ** 3)))
            m = gelu * (h @ w[p + "ffn_up.weight"].T)
            x = x + self._norm(m @ w[p + "ffn_down.weight"].T, w[p + "post_ffw_norm.weight"])
        return self._norm(x, w["output_norm.weight"])

    def _logits(self, hidden):
        logits = hidden @ self.head.T
        return np.tanh(logits / self.cap) * self.cap if self.cap else logits

    def logits(self, tokens):
        """(T, vocab) float64 logits at every position of one sequence of ids (positions 0..T-1)."""
        cache = [[[], []] for _ in range(self.L)]
        return self._logits(self._step(list(tokens), [cache], list(range(len(tokens)))))

    def greedy(self, prompts, n, margins=None):
        """n greedy token ids after each prompt (lists of ids), all prompts stepped together. margins (a
        list) receives, per prompt, each step's gap between the top two logits (a near-tie is small)."""
        caches, last, lens = [], [], []
        for pr in prompts:
            c = [[[], []] for _ in range(self.L)]
            hid = self._step(list(pr), [c], list(range(len(pr))))
            caches.append(c)
            last.append(hid[-1])
            lens.append(len(pr))
        outs, gaps = [[] for _ in prompts], [[] for _ in prompts]
        for step in range(n):
            logits = self._logits(np.stack(last) if step == 0 else hid)
            top2 = np.sort(np.partition(logits, -2, axis=-1)[:, -2:], axis=-1)
            nxt = np.argmax(logits, axis=-1)
            for j, t in enumerate(nxt):
                outs[j].append(int(t))
                gaps[j].append(float(top2[j, 1] - top2[j, 0]))
            if step == n - 1:
                break
            hid = self._step([int(t) for t in nxt], caches, [lens[j] + step for j in range(len(prompts))])
        if margins is not None:
            margins.extend(gaps)
        return outs
