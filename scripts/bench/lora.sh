#!/usr/bin/env bash
# LoRA adapters against the base model alone, in one servd process and one run (docs/performance.md,
# "LoRA adapters"): four synthetic rank-R f16 PEFT adapters on every projection of the default model
# (tests/llama/lora_adapters.py, fixed seeds), then in alternating rounds (the order swaps each round;
# the table shows medians):
#   1. 32 streams: four servd-bench clients of CONC requests in flight each, all naming the base, or
#      each naming its own adapter (every step mixes the four): output tok/s of the four together;
#   2. batch-1 decode: one stream, OUT1 tokens out: output tok/s and TPOT p50, base against adapter a1.
# Usage: scripts/bench/lora.sh [BUILD_DIR] [MODEL.gguf|MODEL.mpk] (default: the default model's GGUF, packed
# here with this build's modelpkg, so that the package's model code is this tree's)
# Environment: THREADS (2), RANK (16), CONC (8), REQS (16 per client), IN (64), OUT (64), REQS1 (4),
# OUT1 (128), ROUNDS (3), PORT (18471).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
model=${2:-$root/.cache/SmolLM2-135M-Instruct.Q4_1.gguf}
threads=${THREADS:-2} rank=${RANK:-16} conc=${CONC:-8} reqs=${REQS:-16} in=${IN:-64} out=${OUT:-64}
reqs1=${REQS1:-4} out1=${OUT1:-128} rounds=${ROUNDS:-3} port=${PORT:-18471}
py=python3
[ -x "$root/.venv-test/bin/python" ] && py=$root/.venv-test/bin/python
work=$(mktemp -d /tmp/servd-lora-bench.XXXXXX)
pid=
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
# shellcheck source=server-lib.sh
. "$root/scripts/bench/server-lib.sh"
if [ "${model%.gguf}" != "$model" ]; then
  "$build/package_format/modelpkg" pack "$model" -o "$work/base.mpk" --quiet
  model=$work/base.mpk
fi

"$py" - "$model" "$work" "$rank" "$root/tests/llama" <<'PY'
import json, os, sys, zipfile
sys.path.insert(0, sys.argv[4])
import lora_adapters as la
cfg = json.loads(zipfile.ZipFile(sys.argv[1]).read("manifest.json"))["config"]
for i in range(4):
    la.write_peft(os.path.join(sys.argv[2], f"a{i + 1}"), cfg, int(sys.argv[3]), 2 * int(sys.argv[3]), seed=100 + i,
                  dtype="F16")
PY
loras=()
for i in 1 2 3 4; do loras+=(--lora "a$i=$work/a$i"); done
"$build/daemon/servd" --model "$model:base" --port "$port" --threads "$threads" --access-log off "${loras[@]}" \
  2>"$work/servd.log" &
pid=$!
wait_ready "$port" /v2/health/ready "$work/servd.log"

bench() { # $1: result name; the rest: servd-bench options
  local name=$1
  shift
  "$build/client/servd-bench" --port "$port" --api completions --no-min-tokens --quiet --json "$work/$name.json" "$@" \
    >/dev/null
}
streams() { # $1: result name; $2..$5: the four clients' models
  local name=$1 k=0 clients=()
  shift
  for m in "$@"; do
    k=$((k + 1))
    bench "$name-c$k" --model "$m" --num-requests "$reqs" --concurrency "$conc" --input-len "$in" --output-len "$out" \
      --seed "$k" &
    clients+=($!)
  done
  wait "${clients[@]}" # not the server
}
bench warm --model a1 --num-requests 2 --input-len "$in" --output-len 8
first_logprobs() { # $1: model: the top logprobs of its first token after a fixed prompt
  curl -sf "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
    -d "{\"model\": \"$1\", \"prompt\": \"The capital of France is\", \"max_tokens\": 1, \"logprobs\": 3}" |
    "$py" -c 'import json, sys; print(json.load(sys.stdin)["choices"][0]["logprobs"]["top_logprobs"][0])'
}
if [ "$(first_logprobs base)" = "$(first_logprobs a1)" ]; then
  echo "adapter a1 does not change the base's logprobs: not applied?" >&2
  exit 1
fi
for round in $(seq 1 "$rounds"); do
  order="base lora"
  [ $((round % 2)) = 0 ] && order="lora base"
  for mode in $order; do
    if [ "$mode" = base ]; then
      streams "s32-base-$round" base base base base
      bench "b1-base-$round" --model base --num-requests "$reqs1" --input-len "$in" --output-len "$out1"
    else
      streams "s32-lora-$round" a1 a2 a3 a4
      bench "b1-lora-$round" --model a1 --num-requests "$reqs1" --input-len "$in" --output-len "$out1"
    fi
  done
  echo "round $round done; load average $(cut -d' ' -f1-3 /proc/loadavg)"
done

"$py" - "$work" "$rounds" <<'PY'
import json, statistics, sys
w, rounds = sys.argv[1], int(sys.argv[2])
def load(n):
    return json.load(open(f"{w}/{n}.json"))["results"]
def s32(mode, k):  # four clients: their output tokens over the longest client's duration
    rs = [load(f"s32-{mode}-{k}-c{c}") for c in range(1, 5)]
    toks = sum(r["output_tokens_per_s"] * r["duration_s"] for r in rs)
    failed = sum(r["failed"] for r in rs)
    return toks / max(r["duration_s"] for r in rs), failed
rows = []
for label, f in (("32 streams, 4 adapters: output tok/s", lambda m, k: s32(m, k)[0]),
                 ("batch-1 decode: output tok/s", lambda m, k: load(f"b1-{m}-{k}")["output_tokens_per_s"]),
                 ("batch-1 decode: TPOT p50 ms", lambda m, k: load(f"b1-{m}-{k}")["tpot_ms"]["median"])):
    base = [f("base", k) for k in range(1, rounds + 1)]
    lora = [f("lora", k) for k in range(1, rounds + 1)]
    ratios = [l / b for l, b in zip(lora, base)]
    rows.append((label, statistics.median(base), statistics.median(lora), statistics.median(ratios)))
print(f"{'workload':<40}{'base':>10}{'LoRA':>10}{'LoRA/base':>11}")
for label, b, l, r in rows:
    print(f"{label:<40}{b:>10.2f}{l:>10.2f}{r:>11.3f}")
failed = sum(s32(m, k)[1] for m in ("base", "lora") for k in range(1, rounds + 1))
failed += sum(load(f"b1-{m}-{k}")["failed"] for m in ("base", "lora") for k in range(1, rounds + 1))
if failed:
    print(f"{failed} requests failed", file=sys.stderr)
PY
