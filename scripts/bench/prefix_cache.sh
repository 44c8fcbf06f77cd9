#!/usr/bin/env bash
# Prefix caching on against off, in one run (docs/performance.md, "Prefix caching"):
#   1. shared prefix: REQS requests whose prompts start with the same ~PREFIX-token prefix, then
#      TAIL tokens of their own, CONC at a time, OUT tokens out: request throughput, TTFT p50;
#   2. never hitting: random prompts (nothing shared), decode-heavy: output tok/s, the cost of the
#      bookkeeping when the cache never helps.
# Usage: scripts/bench/prefix_cache.sh [BUILD_DIR] [MODEL.mpk]
# Environment: THREADS (2), REQS (24), CONC (8), PREFIX (830), TAIL (32), OUT (32), PORT (18431),
# MISS_REQS (16), MISS_CONC (4), MISS_IN (64), MISS_OUT (96), ROUNDS (1: on then off; each further
# round swaps the order, and the table shows medians over rounds).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
model=${2:-$root/.cache/smollm2-135m-instruct-q4_1.mpk}
threads=${THREADS:-2} reqs=${REQS:-24} conc=${CONC:-8} prefix=${PREFIX:-830} tail=${TAIL:-32}
out=${OUT:-32} port=${PORT:-18431}
rounds=${ROUNDS:-1} miss_reqs=${MISS_REQS:-16} miss_conc=${MISS_CONC:-4} miss_in=${MISS_IN:-64} miss_out=${MISS_OUT:-96}
work=$(mktemp -d /tmp/servd-prefix-bench.XXXXXX)
pid=
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT

# shellcheck source=server-lib.sh
. "$root/scripts/bench/server-lib.sh"
start() { # $1: extra flag ("" or --no-prefix-cache)
  "$build/daemon/servd" --model "$model" --port "$port" --threads "$threads" --access-log off $1 \
    2>"$work/servd.log" &
  pid=$!
  wait_ready "$port" /v2/health/ready "$work/servd.log"
}

bench() { # $1: result name; the rest: servd-bench options
  local name=$1
  shift
  "$build/client/servd-bench" --port "$port" --api completions --no-min-tokens --quiet --json "$work/$name.json" "$@" >/dev/null
}

metric() { grep -E "^$1\{" "$work/metrics" | awk '{s += $2} END {print s + 0}'; }

for round in $(seq 1 "$rounds"); do
  order="on off"
  [ $((round % 2)) = 0 ] && order="off on"
  for mode in $order; do
    flag=
    [ "$mode" = off ] && flag=--no-prefix-cache
    start "$flag"
    bench "shared-$mode-$round" --num-requests "$reqs" --concurrency "$conc" --shared-prefix-len "$prefix" \
      --input-len "$tail" --output-len "$out" --seed "$round"
    bench "miss-$mode-$round" --num-requests "$miss_reqs" --concurrency "$miss_conc" --input-len "$miss_in" \
      --output-len "$miss_out" --seed $((1000 + round))
    curl -sf "http://127.0.0.1:$port/metrics" >"$work/metrics"
    echo "round $round, cache $mode: prefix cache queries $(metric servd_prefix_cache_queries_total) tokens," \
      "hits $(metric servd_prefix_cache_hits_total) tokens; load average $(cut -d' ' -f1 /proc/loadavg)"
    stop
  done
done

python3 - "$work" "$rounds" <<'PY'
import json, statistics, sys
w, rounds = sys.argv[1], int(sys.argv[2])
r = {f"{n}-{m}-{k}": json.load(open(f"{w}/{n}-{m}-{k}.json"))["results"]
     for n in ("shared", "miss") for m in ("on", "off") for k in range(1, rounds + 1)}
def row(name, key, sub=None):
    def med(mode):
        v = [r[f"{name}-{mode}-{k}"][key] for k in range(1, rounds + 1)]
        return statistics.median(x[sub] if sub else x for x in v)
    return med("on"), med("off")
print(f"{'workload':<14}{'metric':<22}{'cache on':>12}{'cache off':>12}{'on/off':>9}")
for name, key, sub, label in (("shared", "duration_s", None, "duration s"),
                              ("shared", "requests_per_s", None, "requests/s"),
                              ("shared", "ttft_ms", "median", "TTFT p50 ms"),
                              ("shared", "e2e_ms", "median", "e2e p50 ms"),
                              ("miss", "output_tokens_per_s", None, "output tok/s"),
                              ("miss", "tpot_ms", "median", "TPOT p50 ms"),
                              ("miss", "ttft_ms", "median", "TTFT p50 ms")):
    on, off = row(name, key, sub)
    print(f"{name:<14}{label:<22}{on:>12.3f}{off:>12.3f}{on / off:>9.3f}")
for n in r:
    if r[n]["failed"]: print(f"{n}: {r[n]['failed']} requests failed", file=sys.stderr)
PY
