#!/usr/bin/env python3
"""KV cache dtypes at a long context (docs/performance.md, "KV cache dtypes and the prefix cache on
disk"), all in one run, rounds alternating the order:

  decode   batch-1 decode tok/s at a depth of ~DEPTH tokens (a prompt of this repository's docs):
           servd with each of KV_DTYPES (`servd generate`, speculation off, GEN tokens past EOS),
           BASE_SERVD's f16 cache when given (the servd to be no slower than), and llama.cpp's
           llama-bench on the same GGUF at the same depth, -fa on, with f16 and with q8_0 K/V;
  restart  time to first token of that prompt computed, and after a restart with --prefix-cache-dir
           (the prompt's blocks read back from disk), per dtype.

servd's decode runs get their prompt from the disk tier (each dtype's directory is filled by its
first run), so a round does not pay the prefill again; BASE_SERVD and llama-bench compute theirs.

Usage: scripts/bench/kv_cache_dtype.py [--servd BIN] [--base-servd BIN] [--llama-bench BIN]
Environment: ROUNDS (3), DEPTH (~6000 tokens: the prompt's characters are cut to fit), GEN (128),
THREADS (2), KV_DTYPES ("f16 q8_0"), LLAMA_ARGS (extra llama-bench arguments, default "--poll 0": its
default busy-waiting threads lose most of their time on a shared machine).
"""
import argparse
import glob
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ap = argparse.ArgumentParser()
ap.add_argument("--servd", default=os.path.join(root, "build/daemon/servd"))
ap.add_argument("--base-servd", default=os.environ.get("BASE_SERVD", ""))
ap.add_argument("--llama-bench", default=os.path.join(root, ".cache/llama-cpp/bin/llama-bench"))
ap.add_argument("--model", default=os.path.join(root, ".cache/smollm2-135m-instruct-q4_1.mpk"))
ap.add_argument("--gguf", default=os.path.join(root, ".cache/SmolLM2-135M-Instruct.Q4_1.gguf"))
a = ap.parse_args()
rounds, depth, gen = int(os.environ.get("ROUNDS", 3)), int(os.environ.get("DEPTH", 6000)), int(os.environ.get("GEN", 128))
threads, dtypes = os.environ.get("THREADS", "2"), os.environ.get("KV_DTYPES", "f16 q8_0").split()
work = tempfile.mkdtemp(prefix="servd-kvq-bench.")

text = " ".join(open(f).read() for f in sorted(glob.glob(os.path.join(root, "docs", "*.md"))))
text = re.sub(r"\s+", " ", text)
prompt = text[: int(depth * 3.15)]  # about 3.15 characters per token of these docs


def generate(binary, dtype, prefix_dir=None):
    """(prompt tokens, prompt seconds, decode tok/s) of one `servd generate`."""
    cmd = [binary, "generate", "--model", a.model, "--prompt", prompt, "--max-tokens", str(gen), "--ignore-eos",
           "--speculative", "off", "--quiet", "--threads", threads]
    if dtype != "f16" or prefix_dir:
        cmd += ["--kv-cache-dtype", dtype]
    if prefix_dir:
        cmd += ["--prefix-cache-dir", prefix_dir]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    m = re.search(r"prompt (\d+) tokens in ([0-9.]+) s .*decode ([0-9.]+) tok/s", r.stderr)
    if r.returncode != 0 or not m:
        sys.exit(f"{' '.join(cmd[:3])} ... failed:\n{r.stderr[-2000:]}")
    return int(m.group(1)), float(m.group(2)), float(m.group(3))


def llama_bench(ctype, n_depth):
    cmd = [a.llama_bench, "-m", a.gguf, "-p", "0", "-n", str(gen), "-d", str(n_depth), "-fa", "1", "-t", threads,
           "-r", "1", "-ctk", ctype, "-ctv", ctype, "-o", "json"] + os.environ.get("LLAMA_ARGS", "--poll 0").split()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        sys.exit(f"llama-bench failed:\n{r.stderr[-2000:]}")
    return float(json.loads(r.stdout)[0]["avg_ts"])


load = open("/proc/loadavg").read().split()[:3]
print(f"load average at start: {' '.join(load)}", flush=True)
ttft_computed, ttft_restored = {}, {d: [] for d in dtypes}
n_prompt = 0
for d in dtypes:  # the first run of each dtype computes its prompt and fills its directory
    n_prompt, secs, _ = generate(a.servd, d, os.path.join(work, "pc-" + d))
    ttft_computed[d] = secs
    print(f"{d}: prompt of {n_prompt} tokens computed in {secs:.2f} s", flush=True)
have_llama = os.access(a.llama_bench, os.X_OK) and os.path.exists(a.gguf)
configs = [("servd " + d, d) for d in dtypes]
if a.base_servd:
    configs.append(("base servd f16", "base"))
if have_llama:
    configs += [("llama.cpp f16 -fa on", "llama f16"), ("llama.cpp q8_0 -fa on", "llama q8_0")]
rate = {name: [] for name, _ in configs}
for r in range(rounds):
    order = configs if r % 2 == 0 else configs[::-1]
    for name, what in order:
        if what == "base":
            _, _, tps = generate(a.base_servd, "f16")
        elif what.startswith("llama "):
            tps = llama_bench(what.split()[1], n_prompt)
        else:
            _, secs, tps = generate(a.servd, what, os.path.join(work, "pc-" + what))
            ttft_restored[what].append(secs)
        rate[name].append(tps)
        print(f"round {r + 1}: {name}: {tps:.1f} tok/s", flush=True)
print(f"load average at end: {open('/proc/loadavg').read().split()[:3]}")
med = {k: statistics.median(v) for k, v in rate.items()}
print(f"\nbatch-1 decode at depth {n_prompt}, {threads} threads, median of {rounds} alternating rounds:")
for k, v in med.items():
    print(f"  {k:24s} {v:7.1f} tok/s  ({', '.join(f'{x:.1f}' for x in rate[k])})")
for d in dtypes:
    s = med["servd " + d]
    for k in med:
        if not k.startswith("servd "):
            print(f"  servd {d} / {k}: {s / med[k]:.2f}x")
print("\ntime to first token of that prompt, computed vs. read back after a restart (--prefix-cache-dir):")
for d in dtypes:
    rs = statistics.median(ttft_restored[d])
    print(f"  {d}: computed {ttft_computed[d]:.2f} s, restored {rs:.3f} s: {rs / ttft_computed[d]:.3f}x")
shutil.rmtree(work, ignore_errors=True)
