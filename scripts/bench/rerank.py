#!/usr/bin/env python3
"""Reranking throughput: pairs per second of POST /v1/rerank with 1 document per request against 32
documents per request, on a cross-encoder of all-MiniLM-L6-v2's size (its encoder weights from
scripts/fetch-minilm.sh, a random pooler and one-label classifier: the shape of
cross-encoder/ms-marco-MiniLM-L-6-v2, 6 layers of 384), alternating rounds, medians:

    scripts/bench/rerank.py --servd build/daemon/servd --modelpkg build/package_format/modelpkg
        [--docs 64] [--rounds 5] [--threads 2]

A round scores the same query against --docs documents of 20 to 60 words from the GPL's text: once
as --docs requests of one document each (one after another), once as requests of 32 documents. The
scores of both ways must agree (a pair's score does not depend on its batch).
"""
import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "bert"))
from bench_http import post, wait_http  # noqa: E402
import numpy as np  # noqa: E402
from bert_ref import read_safetensors  # noqa: E402
from tiny_bert import write_safetensors  # noqa: E402


def documents(n, seed=7):
    with open("/usr/share/common-licenses/GPL-3") as f:
        words = f.read().split()
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        k = rng.randint(20, 60)
        at = rng.randrange(len(words) - k)
        out.append(" ".join(words[at:at + k]))
    return out


def cross_encoder(mini, out):
    """all-MiniLM-L6-v2's folder as a BertForSequenceClassification folder with a random head."""
    os.makedirs(out, exist_ok=True)
    w = {("bert." + k if not k.startswith("bert.") else k): v for k, v in
         read_safetensors(os.path.join(mini, "model.safetensors")).items() if not k.startswith("pooler.")}
    rng = np.random.default_rng(3)
    H = w["bert.embeddings.word_embeddings.weight"].shape[1]
    w["bert.pooler.dense.weight"] = (rng.standard_normal((H, H)) / np.sqrt(H)).astype(np.float32)
    w["bert.pooler.dense.bias"] = np.zeros(H, np.float32)
    w["classifier.weight"] = (rng.standard_normal((1, H)) / np.sqrt(H)).astype(np.float32)
    w["classifier.bias"] = np.zeros(1, np.float32)
    write_safetensors(os.path.join(out, "model.safetensors"), {k: np.ascontiguousarray(v) for k, v in w.items()})
    cfg = json.load(open(os.path.join(mini, "config.json")))
    cfg["architectures"] = ["BertForSequenceClassification"]
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"))
    for f in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if os.path.exists(os.path.join(mini, f)):
            shutil.copy(os.path.join(mini, f), out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--servd", required=True)
    ap.add_argument("--modelpkg", required=True)
    ap.add_argument("--docs", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    if subprocess.call([os.path.join(ROOT, "scripts", "fetch-minilm.sh")]) != 0:
        sys.exit("all-MiniLM-L6-v2 is not available (scripts/fetch-minilm.sh)")
    work = tempfile.mkdtemp(prefix="servd-rerank-bench-")
    proc = None
    try:
        folder = os.path.join(work, "ce")
        cross_encoder(os.path.join(ROOT, ".cache", "all-MiniLM-L6-v2"), folder)
        mpk = os.path.join(work, "ce.mpk")
        subprocess.check_call([a.modelpkg, "pack", folder, "-o", mpk, "--quiet"])
        port = 18000 + os.getpid() % 1000
        proc = subprocess.Popen([a.servd, "--host", "127.0.0.1", "--port", str(port), "--threads", str(a.threads),
                                 "--model", mpk + ":ce"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_http(port, "/v2/models/ce/ready", proc)
        query = "What may a recipient of the covered work do with its source code?"
        docs = documents(a.docs)

        def one_each():
            return [post(port, "/v1/rerank", {"model": "ce", "query": query, "documents": [d]})["results"][0]
                    ["relevance_score"] for d in docs]

        def batched():
            out = []
            for i in range(0, len(docs), 32):
                r = post(port, "/v1/rerank", {"model": "ce", "query": query, "documents": docs[i:i + 32]})
                out += [x["relevance_score"] for x in sorted(r["results"], key=lambda x: x["index"])]
            return out

        ways = {"1 per request": one_each, "32 per request": batched}
        first = {k: f() for k, f in ways.items()}  # warm-up, and the agreement check
        diff = max(abs(x - y) for x, y in zip(first["1 per request"], first["32 per request"]))
        times = {k: [] for k in ways}
        for r in range(a.rounds):
            for k, f in ways.items():
                t = time.perf_counter()
                f()
                times[k].append(time.perf_counter() - t)
            print(f"round {r + 1}: " + ", ".join(f"{k} {len(docs) / times[k][-1]:.1f} pairs/s" for k in ways))
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"{len(docs)} documents, {a.rounds} rounds, {a.threads} threads; max |score difference| of the two "
              f"ways {diff:.2e}")
        for k in ways:
            print(f"median {k:16s} {len(docs) / med[k]:8.1f} pairs/s ({med[k]:.3f} s)")
        print(f"32 per request / 1 per request: {med['1 per request'] / med['32 per request']:.2f}x")
    finally:
        if proc:
            proc.terminate()
            proc.wait()
        shutil.rmtree(work, ignore_errors=True)


main()
