"""BERT-family encoders for servd (package_format/src/arch_bert.c): sentence embeddings (BertModel,
all-MiniLM-L6-v2, bge, e5, gte) and cross-encoders (BertForSequenceClassification: reranking).

transformers' modeling_bert, post-norm blocks:
    x = LayerNorm(word[t] + position[p] + token_type[s])          (s: batch.token_types, a pair's 0/1)
    per layer: a = attention(x Wq + bq, x Wk + bk, x Wv + bv)      (bidirectional, per sequence)
               x = LayerNorm(x + a Wo + bo)
               x = LayerNorm(x + gelu(x Wu + bu) Wd + bd)           (gelu: the erf form)
Sequences of different lengths are packed into one batch without padding: ops.encoder_attention
keeps each row's attention within its own sequence (batch.seq_offsets). The engine schedules an
encoder's sequences whole ("is_causal": false in the config), which batch.whole_seqs confirms.

Runs inside a servd interpreter, on the CPU; weights are views into the mapped package. Buffers
are allocated once per capacity and reused. Embedding steps return the final hidden rows of
batch.logit_rows (the engine pools and normalizes them); this code computes no logits. A
cross-encoder's steps (batch.scores) return its classifier's outputs for those rows (the CLS rows):
    scores = classifier(tanh(pooler.dense(h[CLS])))                 (num_labels values per pair)
"""
import math

import servd
from servd import ops

_N = "model.layers.{}."


class BertModel:
    def __init__(self):
        if servd.device() != "cpu":
            raise RuntimeError(f"bert: encoders run on the CPU (this interpreter is on {servd.device()})")
        if servd.world_size() != 1:
            raise RuntimeError("bert: encoders run without tensor parallelism (world size 1)")
        pkg = servd.package
        cfg = dict(pkg.config)
        t = pkg.tensor
        self.dim = int(cfg["hidden_size"])
        self.heads = int(cfg["num_attention_heads"])
        self.head_dim = self.dim // self.heads
        self.inter = int(cfg["intermediate_size"])
        self.eps = float(cfg.get("layer_norm_eps") or 1e-12)
        self.word = t("model.embed_tokens.weight")
        self.pos = t("model.embed_positions.weight")
        self.types = t("model.embed_token_types.weight")
        self.embed_norm = (t("model.embed_norm.weight"), t("model.embed_norm.bias"))
        self.head = None  # a cross-encoder's pooler (H, H) and classifier (num_labels, H)
        if "classifier.weight" in set(pkg.tensor_names()):
            self.head = (t("pooler.dense.weight"), t("pooler.dense.bias"), t("classifier.weight"),
                         t("classifier.bias"))
        self.labels = self.head[2].shape[0] if self.head else 0
        self.layers = []
        for i in range(int(cfg["num_hidden_layers"])):
            p = _N.format(i)

            def wb(name):
                return t(p + name + ".weight"), t(p + name + ".bias")

            self.layers.append((wb("self_attn.q_proj"), wb("self_attn.k_proj"), wb("self_attn.v_proj"),
                                wb("self_attn.o_proj"), wb("post_attention_layernorm"), wb("mlp.up_proj"),
                                wb("mlp.down_proj"), wb("post_feedforward_layernorm")))
        self.cap = 0
        self._views = {}

    def _grow(self, n):
        """Buffers for n tokens (grown to the next power of two, at least the engine's capacity)."""
        cap = max(n, 64)
        cap = 1 << (cap - 1).bit_length()
        H, I = self.dim, self.inter
        self.x = servd.empty((cap, H))
        self.tmp = servd.empty((cap, H))
        self.q = servd.empty((cap, H))
        self.k = servd.empty((cap, H))
        self.v = servd.empty((cap, H))
        self.a = servd.empty((cap, H))
        self.u = servd.empty((cap, I))
        self.hid = servd.empty((cap, H))
        self.zeros = servd.empty((cap,), "i32")
        if self.head:
            self.pooled = servd.empty((cap, H))
            self.scores = servd.empty((cap, self.labels))
        self.cap = cap
        self._views = {}

    def _step(self, n, n_rows):
        key = (n, n_rows)
        v = self._views.get(key)
        if v is None:
            hd, heads = self.head_dim, self.heads
            cut = lambda b: b.narrow(0, 0, n)  # noqa: E731
            q, k, vv = cut(self.q), cut(self.k), cut(self.v)
            v = (cut(self.x), cut(self.tmp), q, k, vv, q.view(n, heads, hd), k.view(n, heads, hd),
                 vv.view(n, heads, hd), cut(self.a), cut(self.u), self.hid.narrow(0, 0, n_rows), cut(self.zeros))
            if len(self._views) > 256:
                self._views.clear()
            self._views[key] = v
        return v

    def forward(self, batch):
        """The final hidden rows f32 (len(batch.logit_rows), hidden_size) of an embedding step (a
        reused buffer, valid until the next call)."""
        if not batch.hidden:
            raise ValueError("bert: an encoder computes embeddings, not logits: serve it for /v1/embeddings")
        if bool(batch.scores) != bool(self.head):
            raise ValueError("bert: a cross-encoder computes scores (/v1/rerank, /v1/score), an embedding model "
                             "embeddings (/v1/embeddings): this package is " +
                             ("a cross-encoder" if self.head else "an embedding model"))
        if not batch.whole_seqs:
            raise ValueError("bert: a step holds part of a sequence; an encoder needs each sequence whole "
                             "(the package's config must say \"is_causal\": false)")
        n = batch.n_tokens
        if n > self.cap:
            self._grow(n)
        rows = batch.logit_rows
        x, tmp, q, k, v, q3, k3, v3, a, u, hid, zeros = self._step(n, len(rows))
        eps, off = self.eps, batch.seq_offsets
        ops.embedding(x, self.word, batch.tokens)
        ops.embedding(tmp, self.pos, batch.positions)
        ops.add(x, x, tmp)
        types = batch.token_types
        ops.embedding(tmp, self.types, zeros if types is None else types)  # a pair's second text: type 1
        ops.add(x, x, tmp)
        ops.layernorm(x, x, self.embed_norm[0], self.embed_norm[1], eps)
        for (wq, bq), (wk, bk), (wv, bv), (wo, bo), (n1w, n1b), (wu, bu), (wd, bd), (n2w, n2b) in self.layers:
            ops.matmul_many(x, q, wq, k, wk, v, wv)
            ops.add_bias(q, q, bq)
            ops.add_bias(k, k, bk)
            ops.add_bias(v, v, bv)
            ops.encoder_attention(a, q3, k3, v3, off)
            ops.matmul(tmp, a, wo)
            ops.add_bias(tmp, tmp, bo)
            ops.add(tmp, tmp, x)
            ops.layernorm(x, tmp, n1w, n1b, eps)
            ops.matmul(u, x, wu)
            ops.bias_gelu(u, u, bu)
            ops.matmul(tmp, u, wd)
            ops.add_bias(tmp, tmp, bd)
            ops.add(tmp, tmp, x)
            ops.layernorm(x, tmp, n2w, n2b, eps)
        ops.embedding(hid, x, rows)  # the rows the engine pools: a gather of x's rows
        return self._scores(hid) if self.head else hid

    def _scores(self, hid):
        """The classifier's outputs f32 (rows, num_labels) of the CLS rows hid: transformers' BertPooler
        (tanh of a Linear) then the classifier Linear."""
        pw, pb, cw, cb = self.head
        n = hid.shape[0]
        pooled, scores = self.pooled.narrow(0, 0, n), self.scores.narrow(0, 0, n)
        ops.matmul(pooled, hid, pw)
        ops.add_bias(pooled, pooled, pb)
        # tanh in Python: rows x hidden values per step (no kernel op for it), small next to the encoder
        flat = memoryview(pooled.view(n * self.dim))
        for i in range(n * self.dim):
            flat[i] = math.tanh(flat[i])
        ops.matmul(scores, pooled, cw)
        ops.add_bias(scores, scores, cb)
        return scores
