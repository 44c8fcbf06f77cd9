#!/usr/bin/env python3
"""Sentence embeddings with all-MiniLM-L6-v2: servd's POST /v1/embeddings against anchors measured in
the same run, alternating rounds, medians:

  - llama-server --embeddings (mean pooling) on the same weights as a GGUF f16 (minilm_gguf.py), when
    .cache/llama-cpp/bin/llama-server exists (scripts/bench/build-llama-cpp.sh);
  - sentence-transformers (PyTorch CPU, batch 32), when it imports;
  - with --numpy, a numpy float32 forward of the same weights in padded batches of 32 (what a
    framework without packing computes; slow: minutes per round).

    scripts/bench/bert_embeddings.py --servd build/daemon/servd --modelpkg build/package_format/modelpkg
        [--sentences 256] [--rounds 5] [--threads 2] [--latency 200]

A round embeds the 256 sentences of 8 to 128 words (the same every run): servd and llama-server as one
request of all inputs, timed to the last byte. Then the latency of one-sentence requests (one at a
time, p50 and p90 over --latency requests). Prints each round, medians, ratios, and the cosine of
every anchor's vectors to servd's (the check that all computed the same thing).
"""
import argparse
import os
import random
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "bert"))
from bench_http import post, wait_http  # noqa: E402
# BLAS threads of the numpy anchor: set before numpy loads
os.environ.setdefault("OPENBLAS_NUM_THREADS", "2")
import numpy as np  # noqa: E402
from bert_ref import read_safetensors  # noqa: E402


def sentences(n, seed=32):
    """n sentences of 8 to 128 words drawn from the GPL's text (English prose), the same every run."""
    with open("/usr/share/common-licenses/GPL-3") as f:
        words = [w for w in f.read().split() if w.isascii()]
    rng = random.Random(seed)
    return [" ".join(rng.choice(words) for _ in range(rng.randint(8, 128))) for _ in range(n)]


class NumpyBert:
    """float32 BERT forward, padded batches with an attention mask (the framework way)."""

    def __init__(self, folder):
        import json
        from tokenizers import Tokenizer
        from scipy.special import erf
        self.erf = erf
        cfg = json.load(open(os.path.join(folder, "config.json")))
        self.heads, self.layers = cfg["num_attention_heads"], cfg["num_hidden_layers"]
        self.eps = cfg.get("layer_norm_eps", 1e-12)
        self.w = {k: v.astype(np.float32) for k, v in read_safetensors(os.path.join(folder, "model.safetensors")).items()
                  if v.dtype != np.int64}
        self.tok = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
        self.tok.no_truncation()
        self.tok.enable_padding(pad_id=0)

    def _ln(self, x, n):
        m = x.mean(-1, keepdims=True)
        v = ((x - m) ** 2).mean(-1, keepdims=True)
        return (x - m) / np.sqrt(v + self.eps) * self.w[n + ".weight"] + self.w[n + ".bias"]

    def _lin(self, x, n):
        return x @ self.w[n + ".weight"].T + self.w[n + ".bias"]

    def embed(self, texts, batch=32):
        out = []
        for i in range(0, len(texts), batch):
            enc = self.tok.encode_batch(texts[i:i + batch])
            ids = np.array([e.ids for e in enc])
            mask = np.array([e.attention_mask for e in enc], np.float32)
            b, n = ids.shape
            w = self.w
            x = w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][:n] + \
                w["embeddings.token_type_embeddings.weight"][0]
            x = self._ln(x, "embeddings.LayerNorm")
            H = x.shape[-1]
            hd = H // self.heads
            bias = (1.0 - mask)[:, None, None, :] * -1e9
            for li in range(self.layers):
                p = f"encoder.layer.{li}."
                q, k, v = (self._lin(x, p + f"attention.self.{s}").reshape(b, n, self.heads, hd).transpose(0, 2, 1, 3)
                           for s in ("query", "key", "value"))
                s = q @ k.transpose(0, 1, 3, 2) / np.float32(np.sqrt(hd)) + bias
                s = np.exp(s - s.max(-1, keepdims=True))
                s /= s.sum(-1, keepdims=True)
                a = (s @ v).transpose(0, 2, 1, 3).reshape(b, n, H)
                x = self._ln(x + self._lin(a, p + "attention.output.dense"), p + "attention.output.LayerNorm")
                u = self._lin(x, p + "intermediate.dense")
                u = 0.5 * u * (1.0 + self.erf(u / np.float32(np.sqrt(2.0))))
                x = self._ln(x + self._lin(u, p + "output.dense"), p + "output.LayerNorm")
            e = (x * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
            out.extend(e / np.linalg.norm(e, axis=1, keepdims=True))
        return np.array(out)


def cosines(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--servd", required=True)
    ap.add_argument("--modelpkg", required=True)
    ap.add_argument("--llama-server", default=os.path.join(ROOT, ".cache/llama-cpp/bin/llama-server"))
    ap.add_argument("--sentences", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--latency", type=int, default=200)
    ap.add_argument("--work", default="/tmp/bert-bench")
    ap.add_argument("--numpy", action="store_true", help="also the numpy float32 padded-batch anchor")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    if subprocess.call([os.path.join(ROOT, "scripts", "fetch-minilm.sh")]):
        sys.exit("all-MiniLM-L6-v2 cannot be fetched")
    folder = os.path.join(ROOT, ".cache", "all-MiniLM-L6-v2")
    mpk = os.path.join(a.work, "minilm.mpk")
    subprocess.check_call([a.modelpkg, "pack", folder, "-o", mpk, "--quiet"])
    texts = sentences(a.sentences)
    procs = []
    sp = 18941
    procs.append(subprocess.Popen([a.servd, "--host", "127.0.0.1", "--port", str(sp), "--threads", str(a.threads),
                                   "--model", mpk + ":m"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    runners = {}
    try:
        wait_http(sp, "/v2/health/ready", procs[0])
        body = {"model": "m", "input": texts}
        warm = post(sp, "/v1/embeddings", body)
        ref = [d["embedding"] for d in warm["data"]]
        tokens = warm["usage"]["prompt_tokens"]
        runners["servd"] = lambda: post(sp, "/v1/embeddings", body)
        checks = {}
        if os.access(a.llama_server, os.X_OK):
            gguf = os.path.join(a.work, "minilm-f16.gguf")
            subprocess.check_call([sys.executable, os.path.join(HERE, "minilm_gguf.py"), folder, gguf])
            lp = 18942
            procs.append(subprocess.Popen([a.llama_server, "-m", gguf, "--host", "127.0.0.1", "--port", str(lp),
                                           "--embeddings", "--pooling", "mean", "-t", str(a.threads), "-c", "8192",
                                           "-b", "8192", "-ub", "8192", "-np", "32"],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            wait_http(lp, "/health", procs[-1])
            got = post(lp, "/v1/embeddings", body)
            checks["llama-server"] = cosines(ref, [d["embedding"] for d in got["data"]])
            runners["llama-server"] = lambda: post(lp, "/v1/embeddings", body)
        else:
            print(f"SKIP llama-server: none at {a.llama_server}")
        try:
            import torch
            from sentence_transformers import SentenceTransformer
            torch.set_num_threads(a.threads)
            st = SentenceTransformer(folder, device="cpu")
            checks["sentence-transformers"] = cosines(ref, st.encode(texts, batch_size=32))
            runners["sentence-transformers"] = lambda: st.encode(texts, batch_size=32)
        except ImportError as e:
            print(f"SKIP sentence-transformers: {e}")
        if a.numpy:
            nb = NumpyBert(folder)
            checks["numpy-f32-padded"] = cosines(ref, nb.embed(texts))
            runners["numpy-f32-padded"] = lambda: nb.embed(texts)
        for name, c in checks.items():
            print(f"cosine(servd, {name}): min {c.min():.6f} median {np.median(c):.6f}")
        times = {k: [] for k in runners}
        names = list(runners)
        for r in range(a.rounds):
            for name in (names if r % 2 == 0 else names[::-1]):
                t0 = time.perf_counter()
                runners[name]()
                dt = time.perf_counter() - t0
                times[name].append(dt)
                print(f"round {r} {name:22s} {dt:7.3f} s  {len(texts) / dt:8.1f} embeddings/s", flush=True)
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"{len(texts)} sentences, {tokens} tokens (servd's count), {a.rounds} rounds, {a.threads} threads")
        for k in names:
            print(f"median {k:22s} {len(texts) / med[k]:8.1f} embeddings/s ({med[k]:.3f} s); servd / {k}: "
                  f"{med[k] / med['servd']:.2f}x")
        one = {"model": "m", "input": "The quick brown fox jumps over the lazy dog near the river bank."}
        lat = []
        for _ in range(a.latency):
            t0 = time.perf_counter()
            post(sp, "/v1/embeddings", one)
            lat.append((time.perf_counter() - t0) * 1e3)
        lat.sort()
        print(f"one-sentence latency over {a.latency} requests: p50 {lat[len(lat) // 2]:.2f} ms, "
              f"p90 {lat[int(len(lat) * 0.9)]:.2f} ms")
    finally:
        for p in procs:
            p.terminate()
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()


if __name__ == "__main__":
    main()
