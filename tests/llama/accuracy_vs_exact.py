"""How close servd and llama.cpp each come to the exact model (a tool for docs/llama.md, not a test).

Dequantizes a llama GGUF with the gguf package (test-only, .venv-test), runs the float64 reference
(llama_ref.py) on prompts continued greedily by llama.cpp's llama-server, and compares the
log-probabilities of llama.cpp's top-10 tokens at every generated position: llama.cpp's own, and
servd's (tests/llama/llama_logits on the package of the same GGUF, f32 KV cache).

    accuracy_vs_exact.py GGUF PKG LLAMA_LOGITS_BIN [--port 18089]   (llama-server must be running)
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import urllib.request

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_ref as R  # noqa: E402

PROMPTS = ["SELECT name, age FROM users WHERE", "The three primary colors are", "Les fleurs du printemps",
           "A good night's sleep helps"]


def load_gguf(path):
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


def lsm(x):
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("gguf")
    ap.add_argument("pkg")
    ap.add_argument("llama_logits")
    ap.add_argument("--port", default="18089")
    a = ap.parse_args()

    def post(path, body):
        req = urllib.request.Request(f"http://127.0.0.1:{a.port}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        return json.loads(urllib.request.urlopen(req, timeout=300).read())
    cfg, w = load_gguf(a.gguf)
    es, el = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for p in PROMPTS:
            pt = post("/tokenize", {"content": p, "add_special": True})["tokens"]
            res = post("/completion", {"prompt": p, "n_predict": 16, "temperature": 0, "top_k": 1,
                                       "return_tokens": True, "n_probs": 10, "post_sampling_probs": False,
                                       "cache_prompt": False})
            gen = res["tokens"]
            toks = pt + gen
            exact = lsm(R.forward(cfg, w, toks))
            out = os.path.join(tmp, "l.bin")
            subprocess.run([a.llama_logits, a.pkg, out, "--tokens", ",".join(map(str, toks))], check=True)
            raw = open(out, "rb").read()
            n, v = np.frombuffer(raw[:8], "<i4")
            ours = lsm(np.frombuffer(raw[8:8 + 4 * n * v], "<f4").reshape(n, v).astype(np.float64))
            for k in range(len(gen)):
                row = len(pt) - 1 + k
                for d in res["completion_probabilities"][k]["top_logprobs"]:
                    el.append(abs(d["logprob"] - exact[row, d["id"]]))
                    es.append(abs(ours[row, d["id"]] - exact[row, d["id"]]))
    print(f"log-prob error vs the exact float64 model over {len(es)} (position, top-10 token) pairs: "
          f"servd mean {np.mean(es):.4f} max {np.max(es):.4f}; llama.cpp mean {np.mean(el):.4f} max {np.max(el):.4f}")


if __name__ == "__main__":
    main()
