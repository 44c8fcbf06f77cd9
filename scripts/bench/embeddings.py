#!/usr/bin/env python3
"""Embeddings throughput: servd's POST /v1/embeddings against llama-server's on the same model file,
the same batch of inputs, in the same run, alternating rounds (servd, llama-server, servd, ...).

    scripts/bench/embeddings.py --servd build/daemon/servd [--llama-server .cache/llama-cpp/bin/llama-server]
        [--mpk .cache/smollm2-135m-instruct-q4_1.mpk] [--gguf .cache/SmolLM2-135M-Instruct.Q4_1.gguf]
        [--inputs 64] [--rounds 7] [--threads 2]

Both pool the last token and normalize (llama-server --embeddings --pooling last). A round sends the
whole batch as one request and times it to the last byte; tokens per second is the batch's prompt
tokens (servd's usage.prompt_tokens) over that time. Prints each round, the medians, their ratio
(servd / llama-server) and the cosine similarity of the two servers' vectors (a check that both
computed the same thing: the same weights, different kernels).

--anchor prefill measures instead against servd's own /v1/completions of the same inputs with
max_tokens 1 (one request per input, all at once): the same prompts computed as generation
prefills, which also compute their last row's logits, for where llama-server is not built.
"""
import concurrent.futures
import argparse
import os
import random
import statistics
import subprocess
import sys
import time

from bench_http import post, wait_http

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORDS = ("retrieval augmented generation stores passages as vectors and finds the nearest ones to a "
         "question before the model answers it with those passages in its context window so that "
         "the answer can cite sources which were not part of its training data").split()


def inputs(n, seed=7):
    """n passages of 20 to 200 words, the same every run."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 200))) for _ in range(n)]


def completions_batch(port, batch):
    """Every input as a max_tokens 1 completion, all in flight at once."""
    with concurrent.futures.ThreadPoolExecutor(len(batch)) as ex:
        list(ex.map(lambda p: post(port, "/v1/completions", {"model": "m", "prompt": p, "max_tokens": 1}), batch))


def prefill_anchor(a):
    batch = inputs(a.inputs)
    sp = 18931
    servd = subprocess.Popen([a.servd, "--host", "127.0.0.1", "--port", str(sp), "--no-prefix-cache", "--model",
                              a.mpk + ":m"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_http(sp, "/v2/health/ready", servd)
        body = {"model": "m", "input": batch}
        tokens = post(sp, "/v1/embeddings", body)["usage"]["prompt_tokens"]
        completions_batch(sp, batch[:4])
        times = {"embeddings": [], "prefill": []}
        for r in range(a.rounds):
            for name in ("embeddings", "prefill") if r % 2 == 0 else ("prefill", "embeddings"):
                t0 = time.perf_counter()
                if name == "embeddings":
                    post(sp, "/v1/embeddings", body)
                else:
                    completions_batch(sp, batch)
                dt = time.perf_counter() - t0
                times[name].append(dt)
                print(f"round {r} {name:10s} {dt:7.3f} s  {tokens / dt:8.1f} tok/s", flush=True)
        me, mp = statistics.median(times["embeddings"]), statistics.median(times["prefill"])
        print(f"inputs {len(batch)}, prompt tokens {tokens}, rounds {a.rounds}")
        print(f"median embeddings {tokens / me:.1f} tok/s ({me:.3f} s), completions prefill {tokens / mp:.1f} tok/s "
              f"({mp:.3f} s), ratio {mp / me:.2f}")
    finally:
        servd.terminate()
        servd.wait(timeout=30)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--servd", required=True)
    ap.add_argument("--llama-server", default=os.path.join(ROOT, ".cache/llama-cpp/bin/llama-server"))
    ap.add_argument("--mpk", default=os.path.join(ROOT, ".cache/smollm2-135m-instruct-q4_1.mpk"))
    ap.add_argument("--gguf", default=os.path.join(ROOT, ".cache/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--inputs", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--slots", type=int, default=8, help="llama-server parallel slots (-np)")
    ap.add_argument("--anchor", choices=("llama-server", "prefill"), default="llama-server")
    a = ap.parse_args()
    if a.anchor == "prefill":
        return prefill_anchor(a)
    if not os.access(a.llama_server, os.X_OK):
        sys.exit(f"no llama-server at {a.llama_server} (scripts/bench/build-llama-cpp.sh)")
    batch = inputs(a.inputs)
    sp, lp = 18931, 18932
    servd = subprocess.Popen([a.servd, "--host", "127.0.0.1", "--port", str(sp), "--model", a.mpk + ":m"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    llama = subprocess.Popen([a.llama_server, "-m", a.gguf, "--host", "127.0.0.1", "--port", str(lp), "--embeddings",
                              "--pooling", "last", "-t", str(a.threads), "-np", str(a.slots), "-c",
                              str(512 * a.slots), "-b", "2048", "-ub", "512"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_http(sp, "/v2/health/ready", servd)
        wait_http(lp, "/health", llama)
        body = {"model": "m", "input": batch}
        warm_s = post(sp, "/v1/embeddings", body)
        warm_l = post(lp, "/v1/embeddings", body)
        tokens = warm_s["usage"]["prompt_tokens"]
        cos = []
        for x, y in zip(warm_s["data"], warm_l["data"]):
            u, v = x["embedding"], y["embedding"]
            dot = sum(p * q for p, q in zip(u, v))
            nu, nv = sum(p * p for p in u) ** 0.5, sum(q * q for q in v) ** 0.5
            cos.append(dot / (nu * nv))
        times = {"servd": [], "llama-server": []}
        for r in range(a.rounds):
            for name, port in (("servd", sp), ("llama-server", lp)) if r % 2 == 0 else \
                    (("llama-server", lp), ("servd", sp)):
                t0 = time.perf_counter()
                post(port, "/v1/embeddings", body)
                dt = time.perf_counter() - t0
                times[name].append(dt)
                print(f"round {r} {name:12s} {dt:7.3f} s  {tokens / dt:8.1f} tok/s", flush=True)
        ms, ml = statistics.median(times["servd"]), statistics.median(times["llama-server"])
        print(f"inputs {len(batch)}, prompt tokens {tokens}, rounds {a.rounds}")
        print(f"median servd {tokens / ms:.1f} tok/s ({ms:.3f} s), llama-server {tokens / ml:.1f} tok/s ({ml:.3f} s), "
              f"ratio servd/llama-server {ml / ms:.2f}")
        print(f"cosine(servd, llama-server) min {min(cos):.4f} median {statistics.median(cos):.4f}")
    finally:
        for p in (servd, llama):
            p.terminate()
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()


if __name__ == "__main__":
    main()
