#!/usr/bin/env bash
# Speculative decoding, --speculative auto against off, in one run (docs/performance.md,
# "Speculative decoding"):
#   copy     copy-heavy chat requests (scripts/bench/copy_workload.py: code edits, quoting,
#            reformatting of this repository's sources and docs), greedy, batch 1, answers of their
#            natural length up to COPY_OUT tokens;
#   random   random prompts, nothing to copy, batch 1, RAND_OUT tokens;
#   streams  STREAMS concurrent streams of random prompts, STREAM_OUT tokens each.
# With LLAMA_SERVER (a llama-server binary, e.g. from scripts/bench/build-llama-cpp.sh) and GGUF (the
# same model's GGUF), the copy workload also runs against llama-server without speculation and with
# each n-gram mode it has (LLAMA_SPEC_MODES, default "ngram-simple ngram-map-k ngram-mod").
# Usage: scripts/bench/speculative.sh [BUILD_DIR] [MODEL.mpk]
# Environment: THREADS (2), ROUNDS (3; each round swaps the order), COPY_REQS (8), COPY_OUT (400),
# RAND_REQS (6), RAND_OUT (128), STREAMS (32), STREAM_REQS (64), STREAM_OUT (64), PORT (18441),
# MODES ("off auto").
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
model=${2:-$root/.cache/smollm2-135m-instruct-q4_1.mpk}
threads=${THREADS:-2} rounds=${ROUNDS:-3} port=${PORT:-18441}
copy_reqs=${COPY_REQS:-8} copy_out=${COPY_OUT:-400} rand_reqs=${RAND_REQS:-6} rand_out=${RAND_OUT:-128}
streams=${STREAMS:-32} stream_reqs=${STREAM_REQS:-64} stream_out=${STREAM_OUT:-64}
modes=${MODES:-off auto}
llama_server=${LLAMA_SERVER:-} gguf=${GGUF:-$root/.cache/SmolLM2-135M-Instruct.Q4_1.gguf}
llama_modes=${LLAMA_SPEC_MODES:-ngram-simple ngram-map-k ngram-mod}
work=$(mktemp -d /tmp/servd-spec-bench.XXXXXX)
pid=
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT

python3 "$root/scripts/bench/copy_workload.py" "$work/copy.jsonl" --n "$copy_reqs"

# shellcheck source=server-lib.sh
. "$root/scripts/bench/server-lib.sh"
start_servd() { # $1: --speculative mode
  "$build/daemon/servd" --model "$model" --port "$port" --threads "$threads" --access-log off --speculative "$1" \
    2>"$work/server.log" &
  pid=$!
  wait_ready "$port" /v2/health/ready "$work/server.log"
}
start_llama() { # $@: extra llama-server flags
  "$llama_server" -m "$gguf" --port "$port" -t "$threads" -c 4096 -np 1 "$@" >"$work/server.log" 2>&1 &
  pid=$!
  wait_ready "$port" /health "$work/server.log"
}

bench() { # $1: result name; the rest: servd-bench options
  local name=$1
  shift
  "$build/client/servd-bench" --port "$port" --quiet --json "$work/$name.json" "$@" >/dev/null
}
copy() { bench "$1" --api chat --dataset "$work/copy.jsonl" --num-requests "$copy_reqs" --output-len "$copy_out" \
  --no-ignore-eos --temperature 0; }

for round in $(seq 1 "$rounds"); do
  order=$modes
  [ $((round % 2)) = 0 ] && order=$(echo "$modes" | tr ' ' '\n' | tac | tr '\n' ' ')
  for mode in $order; do
    start_servd "$mode"
    copy "copy.$mode.$round"
    bench "random.$mode.$round" --api completions --num-requests "$rand_reqs" --input-len 64 --output-len "$rand_out" \
      --no-min-tokens --seed $((1000 + round))
    bench "streams.$mode.$round" --api completions --num-requests "$stream_reqs" --concurrency "$streams" \
      --input-len 64 --output-len "$stream_out" --no-min-tokens --seed $((2000 + round))
    echo "round $round, servd --speculative $mode done; load average $(cut -d' ' -f1 /proc/loadavg)"
    stop
  done
  if [ -n "$llama_server" ]; then
    start_llama
    copy "copy.llama.$round"
    stop
    for lm in $llama_modes; do
      if start_llama --spec-type "$lm" 2>/dev/null; then
        copy "copy.llama_$lm.$round"
        stop
      fi
    done
    echo "round $round, llama-server done"
  fi
done

python3 - "$work" "$rounds" "$modes" <<'PY'
import glob, json, os, statistics, sys
w, rounds, modes = sys.argv[1], int(sys.argv[2]), sys.argv[3].split()
res = {}
for f in glob.glob(f"{w}/*.json"):
    name = os.path.basename(f)[:-5]
    wl, mode, k = name.split(".")
    r = json.load(open(f))["results"]
    if r["failed"]:
        print(f"{name}: {r['failed']} requests failed", file=sys.stderr)
    res.setdefault((wl, mode), []).append(r)
def med(rs, f):
    return statistics.median(f(r) for r in rs)
out_tps = lambda r: r["output_tokens_per_s"]
dec_tps = lambda r: 1000.0 / r["tpot_ms"]["median"] if r["tpot_ms"]["median"] else 0.0
acc = lambda r: (r.get("speculation") or {}).get("acceptance_rate", 0.0)
print(f"{'workload':<10}{'server':<28}{'output tok/s':>13}{'decode tok/s':>13}{'x off (out)':>12}{'x off (dec)':>12}{'accepted':>10}")
for wl in ("copy", "random", "streams"):
    base = res.get((wl, "off"))
    for (w2, mode), rs in sorted(res.items(), key=lambda kv: kv[0][1]):
        if w2 != wl:
            continue
        label = f"servd --speculative {mode}" if not mode.startswith("llama") else \
            ("llama-server" if mode == "llama" else "llama-server " + mode.split("_", 1)[1])
        o, d = med(rs, out_tps), med(rs, dec_tps)
        ro = o / med(base, out_tps) if base else float("nan")
        rd = d / med(base, dec_tps) if base else float("nan")
        print(f"{wl:<10}{label:<28}{o:>13.2f}{d:>13.2f}{ro:>12.3f}{rd:>12.3f}{med(rs, acc):>10.2f}")
PY
