#!/usr/bin/env python3
"""Recorded check: greedy tokens of each family's tiny GGUF, servd against llama.cpp on the same file.

For every family (tests/llama/make_tiny.py --family F --gguf: llama, Mistral as GGUF "llama", Qwen2,
Qwen2 with YaRN, Qwen3, Gemma 3, Phi-3, Phi-3 with LongRoPE short and long) the GGUF is packed with modelpkg and
run by llama_logits (the engine's path: paged KV cache, greedy); llama.cpp's llama-server runs the
same file, one /completion request per prompt with the prompt as token ids (no tokenizer in the
way), temperature 0, n_predict N. The greedy ids must be equal. Prints a Markdown table; --record
writes it into docs/models.md between "<!-- check-families-llama-cpp:begin -->" and
"<!-- check-families-llama-cpp:end -->". Exit status 0 when every family agrees, 1 otherwise, 77
(skipped) when llama.cpp is absent.

    scripts/check-families-llama-cpp.py --build build-NAME [--llama-bin .cache/llama-cpp/bin]
        [--tokens 16] [--record] [--work /tmp/families-llama-cpp]
"""
import argparse
import datetime
import json
import os
import struct
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts", "bench"))
from bench_http import free_port  # noqa: E402
PROMPTS = [list(b"The quick brown fox, 12345!"), list(b"Hello there, how are you?"), list(b"def f(x):\n  return")]
LONG = [(p * 4)[:80] for p in PROMPTS]  # beyond the tiny Phi-3's original context of 64
# (name, make_tiny args, the GGUF's original context for LongRoPE (None: make_tiny's 64), prompts).
# LongRoPE: llama.cpp takes the long factors when its context (512 here; it pads smaller ones) exceeds
# the original one, servd (as transformers) when the sequence does. An original context of 512 keeps
# both on the short factors; 64 with 80-token prompts puts both on the long ones.
VARIANTS = [("llama", ["--untied"], None, PROMPTS), ("mistral", [], None, PROMPTS),
            ("qwen2", ["--untied"], None, PROMPTS), ("qwen2-yarn", ["--yarn"], None, PROMPTS),
            ("qwen3", ["--untied"], None, PROMPTS), ("gemma3", [], None, PROMPTS), ("phi3", [], None, PROMPTS),
            ("phi3-longrope-short", ["--longrope"], 512, PROMPTS), ("phi3-longrope-long", ["--longrope"], None, LONG)]


def servd_greedy(build, pkg, prompt, n, work):
    out = os.path.join(work, "logits.bin")
    subprocess.run([os.path.join(build, "tests", "llama", "llama_logits"), pkg, out, "--tokens",
                    ",".join(map(str, prompt)), "--decode", str(n)], check=True, capture_output=True)
    raw = open(out, "rb").read()
    rows, vocab = struct.unpack("<ii", raw[:8])
    off = 8 + 4 * rows * vocab
    k = struct.unpack("<i", raw[off:off + 4])[0]
    return list(struct.unpack(f"<{k}i", raw[off + 4:off + 4 + 4 * k]))


def llama_cpp_greedy(bin_dir, gguf, ctx, prompts, n, work):
    port = free_port()
    log = open(os.path.join(work, "server.log"), "w")
    srv = subprocess.Popen([os.path.join(bin_dir, "llama-server"), "-m", gguf, "-t", "2", "-c", str(ctx), "--port",
                            str(port), "--host", "127.0.0.1", "-np", "1"], stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(240):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except Exception:
                if srv.poll() is not None:
                    return None, open(os.path.join(work, "server.log")).read()[-300:]
                time.sleep(0.5)
        outs = []
        for p in prompts:
            body = json.dumps({"prompt": p, "n_predict": n, "temperature": 0, "top_k": 1, "cache_prompt": False,
                               "return_tokens": True, "ignore_eos": True}).encode()
            req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", body,
                                         {"Content-Type": "application/json"})
            outs.append(json.loads(urllib.request.urlopen(req, timeout=120).read())["tokens"])
        return outs, ""
    finally:
        srv.terminate()
        srv.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--llama-bin", default=os.path.join(ROOT, ".cache", "llama-cpp", "bin"))
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--record", action="store_true")
    ap.add_argument("--work", default="/tmp/families-llama-cpp")
    args = ap.parse_args()
    if not os.access(os.path.join(args.llama_bin, "llama-server"), os.X_OK):
        print(f"skipped: no llama-server in {args.llama_bin} (scripts/bench/build-llama-cpp.sh builds it)")
        return 77
    os.makedirs(args.work, exist_ok=True)
    py = os.path.join(ROOT, ".venv-test", "bin", "python")
    py = py if os.path.exists(py) else sys.executable
    lines = ["| family | prompts | servd == llama.cpp | first differing ids (servd / llama.cpp) |", "|---|---|---|---|"]
    ok_all = True
    for name, extra, orig, prompts in VARIANTS:
        fam = name.split("-")[0]
        folder, gguf, pkg = (os.path.join(args.work, name + s) for s in ("", ".gguf", ".mpk"))
        # llama.cpp refuses a BPE vocabulary without merges ("cannot find tokenizer merges"): one merge of
        # two spaces is added; the prompts are token ids, so no tokenization depends on it. It also sets
        # token attributes by model name ("phi3" needs Phi-3's own special tokens): the name is neutral.
        # And it runs Phi-3 without its sliding window, which servd applies (docs/models.md): the
        # window written is wider than the context, so both attend to every earlier token.
        subprocess.run([py, "-c", "import sys, gguf; sys.path.insert(0, sys.argv[1]); orig = int(sys.argv[2]); "
                        "m = gguf.GGUFWriter.add_token_merges; n = gguf.GGUFWriter.add_name; "
                        "gguf.GGUFWriter.add_token_merges = lambda self, x: m(self, list(x) or ['\u0120 \u0120']); "
                        "gguf.GGUFWriter.add_name = lambda self, x: n(self, 'tiny-model'); "
                        "w = gguf.GGUFWriter.add_sliding_window; "
                        "gguf.GGUFWriter.add_sliding_window = lambda self, x: w(self, 4096); "
                        "o = gguf.GGUFWriter.add_rope_scaling_orig_ctx_len; "
                        "gguf.GGUFWriter.add_rope_scaling_orig_ctx_len = lambda self, x: o(self, orig or x); "
                        "import make_tiny; sys.argv = ['make_tiny.py'] + sys.argv[3:]; make_tiny.main()",
                        os.path.join(ROOT, "tests", "llama"), str(orig or 0), folder, "--family", fam, "--gguf", gguf]
                       + extra,
                       check=True)
        subprocess.run([os.path.join(args.build, "package_format", "modelpkg"), "pack", gguf, "-o", pkg, "--quiet"],
                       check=True)
        ours = [servd_greedy(args.build, pkg, p, args.tokens, args.work) for p in prompts]
        theirs, err = llama_cpp_greedy(args.llama_bin, gguf, 512, prompts, args.tokens, args.work)
        if theirs is None:
            lines.append(f"| {name} | {len(prompts)} | llama.cpp did not load it | {err.strip().splitlines()[-1]} |")
            ok_all = False
            continue
        same = sum(a == b for a, b in zip(ours, theirs))
        diff = next((f"{a} / {b}" for a, b in zip(ours, theirs) if a != b), "")
        ok_all &= same == len(prompts)
        lines.append(f"| {name} | {len(prompts)} | {same} of {len(prompts)} | {diff} |")
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    table = "\n".join([f"Recorded {stamp}: {args.tokens} greedy tokens per prompt, prompts as token ids.", ""] + lines)
    print(table)
    if args.record:
        doc = os.path.join(ROOT, "docs", "models.md")
        text = open(doc).read()
        b, e = "<!-- check-families-llama-cpp:begin -->", "<!-- check-families-llama-cpp:end -->"
        if b in text and e in text:
            text = text[:text.index(b) + len(b)] + "\n" + table + "\n" + text[text.index(e):]
        else:
            text += f"\n{b}\n{table}\n{e}\n"
        open(doc, "w").write(text)
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
