"""Float64 numpy forward of a BERT encoder from its Hugging Face folder (model.safetensors with
transformers' names, config.json, 1_Pooling / modules.json), written from transformers'
modeling_bert independently of servd: the reference servd's encoder is tested against.

    ref = BertRef(folder)
    ref.hidden(ids, type_ids=None)   -> (len(ids), hidden) float64, the last layer's output
    ref.embed(ids)                   -> the pooled (mean / cls) and, when the folder says so, L2-normalized vector
    ref.score(ids, type_ids)         -> the classifier's logits of a cross-encoder (pooler tanh, then classifier)
"""
import json
import os
import struct

import numpy as np
from math import erf, sqrt

try:
    from scipy.special import erf as _ERF  # vectorized, to double precision
except ImportError:  # python3-scipy (scripts/install-deps.sh); math.erf element by element is slower
    _ERF = np.vectorize(erf, otypes=[float])


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    hdr = json.loads(raw[8:8 + n])
    hdr.pop("__metadata__", None)
    dt = {"F32": np.float32, "F16": np.float16, "I64": np.int64, "F64": np.float64}
    out = {}
    for k, v in hdr.items():
        b, e = v["data_offsets"]
        out[k] = np.frombuffer(raw[8 + n + b:8 + n + e], dt[v["dtype"]]).reshape(v["shape"])
    return out


class BertRef:
    def __init__(self, folder):
        with open(os.path.join(folder, "config.json")) as f:
            self.cfg = json.load(f)
        w = read_safetensors(os.path.join(folder, "model.safetensors"))
        # a cross-encoder keeps the encoder under "bert."
        self.w = {(k[5:] if k.startswith("bert.") else k): v.astype(np.float64) for k, v in w.items()
                  if v.dtype != np.int64}
        self.eps = float(self.cfg.get("layer_norm_eps", 1e-12))
        self.heads = int(self.cfg["num_attention_heads"])
        self.layers = int(self.cfg["num_hidden_layers"])
        self.pooling, self.normalize = "cls", False
        pool = os.path.join(folder, "1_Pooling", "config.json")
        if os.path.exists(pool):
            with open(pool) as f:
                p = json.load(f)
            self.pooling = "mean" if p.get("pooling_mode_mean_tokens") else "cls"
        mods = os.path.join(folder, "modules.json")
        if os.path.exists(mods):
            with open(mods) as f:
                self.normalize = any(m.get("type") == "sentence_transformers.models.Normalize" for m in json.load(f))

    def _ln(self, x, name):
        m = x.mean(-1, keepdims=True)
        v = ((x - m) ** 2).mean(-1, keepdims=True)
        return (x - m) / np.sqrt(v + self.eps) * self.w[name + ".weight"] + self.w[name + ".bias"]

    def _lin(self, x, name):
        return x @ self.w[name + ".weight"].T + self.w[name + ".bias"]

    def hidden(self, ids, type_ids=None):
        ids = np.asarray(ids)
        n = len(ids)
        types = np.zeros(n, int) if type_ids is None else np.asarray(type_ids)
        w = self.w
        x = (w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][:n] +
             w["embeddings.token_type_embeddings.weight"][types])
        x = self._ln(x, "embeddings.LayerNorm")
        H = x.shape[1]
        hd = H // self.heads
        for i in range(self.layers):
            p = f"encoder.layer.{i}."
            q = self._lin(x, p + "attention.self.query").reshape(n, self.heads, hd).transpose(1, 0, 2)
            k = self._lin(x, p + "attention.self.key").reshape(n, self.heads, hd).transpose(1, 0, 2)
            v = self._lin(x, p + "attention.self.value").reshape(n, self.heads, hd).transpose(1, 0, 2)
            s = q @ k.transpose(0, 2, 1) / sqrt(hd)
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            a = (s @ v).transpose(1, 0, 2).reshape(n, H)
            x = self._ln(x + self._lin(a, p + "attention.output.dense"), p + "attention.output.LayerNorm")
            u = self._lin(x, p + "intermediate.dense")
            u = 0.5 * u * (1.0 + _ERF(u / sqrt(2.0)))
            x = self._ln(x + self._lin(u, p + "output.dense"), p + "output.LayerNorm")
        return x

    def embed(self, ids):
        h = self.hidden(ids)
        v = h.mean(0) if self.pooling == "mean" else h[0]
        return v / np.linalg.norm(v) if self.normalize else v

    def score(self, ids, type_ids):
        h = self.hidden(ids, type_ids)
        pooled = np.tanh(self._lin(h[0], "pooler.dense"))
        return self._lin(pooled, "classifier")
