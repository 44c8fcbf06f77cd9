#!/usr/bin/env bash
# Latency-bounded steps on against off, in one run (docs/performance.md, "Latency-bounded steps"):
# random prompts of IN tokens, OUT tokens out, CONC streams, servd with --max-step-ms MS and with 0
# (the token budget only): ITL p50/p99 and their ratio, TTFT p50/p99, output tok/s.
# Usage: scripts/bench/step_bound.sh [BUILD_DIR] [MODEL.mpk]
# Environment: THREADS (2), CONC (32), REQS (64), IN (128), OUT (64), MS (100), PORT (18432).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
model=${2:-$root/.cache/smollm2-135m-instruct-q4_1.mpk}
threads=${THREADS:-2} conc=${CONC:-32} reqs=${REQS:-64} in=${IN:-128} out=${OUT:-64} ms=${MS:-100}
port=${PORT:-18432}
work=$(mktemp -d /tmp/servd-step-bench.XXXXXX)
pid=
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT

for step_ms in "$ms" 0; do
  "$build/daemon/servd" --model "$model" --port "$port" --threads "$threads" --access-log off \
    --max-step-ms "$step_ms" 2>"$work/servd.log" &
  pid=$!
  for _ in $(seq 1 300); do
    curl -sf "http://127.0.0.1:$port/v2/health/ready" >/dev/null 2>&1 && break
    sleep 0.1
  done
  "$build/client/servd-bench" --port "$port" --api completions --no-min-tokens --quiet --warmup 4 \
    --json "$work/r$step_ms.json" --num-requests "$reqs" --concurrency "$conc" --input-len "$in" \
    --output-len "$out" --seed 1 >/dev/null
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  pid=
  python3 - "$work/r$step_ms.json" "$step_ms" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
def find(o, key):
    if isinstance(o, dict):
        if key in o: return o[key]
        for v in o.values():
            x = find(v, key)
            if x is not None: return x
    return None
itl, ttft = find(r, "itl_ms"), find(r, "ttft_ms")
tps = find(r, "output_tokens_per_s")
print(f"max_step_ms {sys.argv[2]:>4}: ITL p50 {itl['median']:.1f} p99 {itl['p99']:.1f} ms (p99/p50 {itl['p99']/itl['median']:.2f}), "
      f"TTFT p50 {ttft['median']:.0f} p99 {ttft['p99']:.0f} ms, output {tps:.1f} tok/s")
PY
done
