#!/usr/bin/env python3
"""How far each KV cache dtype moves log-probabilities on a long prompt, servd next to llama.cpp
with the same cache type (docs/performance.md, "KV cache dtypes and the prefix cache on disk").

A prompt of ~LEN tokens (this repository's docs) is continued greedily by llama-server with each
cache type (-ctk/-ctv, -fa on), which reports the log-probabilities of its top-10 tokens at every
generated position. The float64 forward of the dequantized GGUF (tests/llama/gguf_exact.py) over
prompt + continuation is the reference; servd's logits come from tests/llama/llama_logits on the
package of the same GGUF with --kv-dtype. The error
is |log p - log p_exact| over every (position, top-10 token) pair: mean and max, per cache type.

Usage: scripts/bench/kv_fidelity.py [--llama-server BIN] [--logits BIN] [--gguf F] [--pkg P]
Environment: LEN (2500 prompt tokens), GEN (16), TYPES ("f16 q8_0 q4_0"), PORT (18093), THREADS (2).
Needs .venv-test (numpy, gguf).
"""
import argparse
import glob
import json
import os
import re
import subprocess
import sys
import time
import urllib.request

import numpy as np

root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(root, "tests", "llama"))
from gguf_exact import ExactModel, servd_logprobs  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--llama-server", default=os.path.join(root, ".cache/llama-cpp/bin/llama-server"))
ap.add_argument("--logits", default=os.path.join(root, "build/tests/llama/llama_logits"))
ap.add_argument("--gguf", default=os.path.join(root, ".cache/SmolLM2-135M-Instruct.Q4_1.gguf"))
ap.add_argument("--pkg", default=os.path.join(root, ".cache/smollm2-135m-instruct-q4_1.mpk"))
a = ap.parse_args()
n_len, gen = int(os.environ.get("LEN", 2500)), int(os.environ.get("GEN", 16))
types, port, threads = os.environ.get("TYPES", "f16 q8_0 q4_0").split(), os.environ.get("PORT", "18093"), \
    os.environ.get("THREADS", "2")
text = re.sub(r"\s+", " ", " ".join(open(f).read() for f in sorted(glob.glob(os.path.join(root, "docs", "*.md")))))


def post(path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req, timeout=1800).read())


def llama_run(ctype):
    """(prompt tokens, generated tokens, top-10 [(id, logprob)] per generated position)."""
    srv = subprocess.Popen([a.llama_server, "-m", a.gguf, "--port", port, "-t", threads, "-c", str(n_len + 256),
                            "-fa", "on", "-ctk", ctype, "-ctv", ctype, "--poll", "0", "-np", "1"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                if json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).read())\
                        .get("status") == "ok":
                    break
            except OSError:
                pass
            time.sleep(0.5)
        pt = post("/tokenize", {"content": text, "add_special": True})["tokens"][:n_len]
        res = post("/completion", {"prompt": pt, "n_predict": gen, "temperature": 0, "top_k": 1,
                                   "return_tokens": True, "n_probs": 10, "post_sampling_probs": False,
                                   "cache_prompt": False})
        tops = [[(d["id"], d["logprob"]) for d in p["top_logprobs"]] for p in res["completion_probabilities"]]
        return pt, res["tokens"], tops
    finally:
        srv.terminate()
        srv.wait()


def servd_rows(toks, dtype, keep):
    return servd_logprobs(a.logits, a.pkg, toks, kv_dtype=dtype, keep_last=keep, extra=["--chunk", "512"])[0]


print(f"load average at start: {open('/proc/loadavg').read().split()[:3]}", flush=True)
model = ExactModel(a.gguf)
exact_of = {}
print(f"{'cache':6s} {'servd mean':>11s} {'max':>8s} {'llama.cpp mean':>15s} {'max':>8s}  pairs, prompt tokens")
for ct in types:
    pt, gtoks, tops = llama_run(ct)
    toks = pt + gtoks
    key = tuple(toks)
    if key not in exact_of:
        exact_of[key] = model.logprobs(toks)[len(pt) - 1:]
    exact = exact_of[key]
    ours = servd_rows(toks, ct, len(gtoks) + 1)  # rows of positions len(pt)-1 .. end
    es, el = [], []
    for k in range(len(gtoks)):
        for tid, lp in tops[k]:
            el.append(abs(lp - exact[k, tid]))
            es.append(abs(ours[k, tid] - exact[k, tid]))
    print(f"{ct:6s} {np.mean(es):11.4f} {np.max(es):8.4f} {np.mean(el):15.4f} {np.max(el):8.4f}  {len(es)}, {len(pt)}",
          flush=True)
print(f"load average at end: {open('/proc/loadavg').read().split()[:3]}")
