#!/usr/bin/env bash
# Real-traffic targets in one run (docs/performance.md, "Real traffic: targets against llama-server"):
#   shared    REQS_SHARED requests sharing a ~PREFIX-token prefix, CONC at a time, 32 tokens of their
#             own, OUT out: servd's request throughput against llama-server's with CONC slots, and
#             servd's TTFT p50 (targets: >= 3x, <= 0.25 s);
#   chat      CONVS conversations x TURNS turns (chat API, each turn resends the history), CONC at
#             a time: servd's request throughput against llama-server's (target >= 2x);
#   streams   STREAMS streams of random IN-token prompts, STREAM_OUT out: servd with --max-step-ms
#             MS against --max-step-ms 0 (targets: ITL p99 <= 3x p50, output tok/s >= 0.9x);
#   miss      random prompts that never share a block, with the prefix cache on against
#             --no-prefix-cache: TPOT p50 on / off (the bookkeeping's cost per decode step, < 2 %);
#             and, finer than this host's noise, the scheduler alone (tests/daemon/
#             bench_prefix_bookkeeping: plan and commit of 32 never-hitting streams, cache on and off)
#             against the decode step (TPOT p50) measured here.
# Every load runs against both of its servers in the same run; with ROUNDS > 1 each further round
# swaps the order, and the ratios are medians over rounds. llama-server comes from LLAMA_BIN (default
# .cache/llama-cpp/bin, built by scripts/bench/build-llama-cpp.sh); without it the comparisons with
# llama.cpp are skipped with a message.
# Usage: scripts/bench/traffic.sh [BUILD_DIR] [MODEL.mpk] [MODEL.gguf]
# Environment: THREADS (2), CONC (8), REQS_SHARED (48), PREFIX (830), OUT (32), CONVS (8), TURNS (6),
# TURN_IN (64), STREAMS (32), STREAM_REQS (64), IN (128), STREAM_OUT (64), MS (100), MISS_REQS (16),
# MISS_CONC (4), MISS_OUT (96), ROUNDS (1), FIRST_ROUND (1: with OUT_DIR, later rounds can be added to
# earlier ones), ONLY (space-separated subset of the four loads), PORT (18441), OUT_DIR (keep the
# JSON results there), LLAMA_ARGS (extra llama-server arguments).
{
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
mpk=${2:-$root/.cache/smollm2-135m-instruct-q4_1.mpk}
gguf=${3:-$root/.cache/SmolLM2-135M-Instruct.Q4_1.gguf}
threads=${THREADS:-2} conc=${CONC:-8} reqs_shared=${REQS_SHARED:-48} prefix=${PREFIX:-830} out=${OUT:-32}
convs=${CONVS:-8} turns=${TURNS:-6} turn_in=${TURN_IN:-64}
streams=${STREAMS:-32} stream_reqs=${STREAM_REQS:-64} in=${IN:-128} stream_out=${STREAM_OUT:-64} ms=${MS:-100}
miss_reqs=${MISS_REQS:-16} miss_conc=${MISS_CONC:-4} miss_out=${MISS_OUT:-96}
rounds=${ROUNDS:-1} only=${ONLY:-shared chat streams miss} port=${PORT:-18441}
llama_server=${LLAMA_BIN:-$root/.cache/llama-cpp/bin}/llama-server
work=${OUT_DIR:-$(mktemp -d /tmp/servd-traffic.XXXXXX)}
mkdir -p "$work"
pid=
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  [ -z "${OUT_DIR:-}" ] && rm -rf "$work"
  return 0
}
trap cleanup EXIT

wait_ready() { # $1: URL
  for _ in $(seq 1 600); do
    curl -sf "$1" >/dev/null 2>&1 && return 0
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  echo "server not ready at $1; its log:" >&2
  tail -20 "$work/server.log" >&2
  exit 1
}
start_servd() { # servd flags
  "$build/daemon/servd" --model "$mpk" --port "$port" --threads "$threads" --access-log off "$@" >"$work/server.log" 2>&1 &
  pid=$!
  wait_ready "http://127.0.0.1:$port/v2/health/ready"
}
start_llama() { # $1: slots, $2: context per slot
  # shellcheck disable=SC2086
  "$llama_server" -m "$gguf" --host 127.0.0.1 --port "$port" -t "$threads" -np "$1" -c $(($1 * $2)) \
    ${LLAMA_ARGS:-} >"$work/server.log" 2>&1 &
  pid=$!
  wait_ready "http://127.0.0.1:$port/health"
}
stop() {
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  pid=
}
bench() { # $1: result name; the rest: servd-bench options
  local name=$1
  shift
  "$build/client/servd-bench" --port "$port" --no-min-tokens --quiet --json "$work/$name.json" "$@" >/dev/null
  echo "  $name: $(python3 "$root/scripts/bench/traffic_report.py" --one "$work/$name.json")"
}
has_llama() {
  [ -x "$llama_server" ] && return 0
  echo "  (skipped against llama.cpp: no $llama_server; scripts/bench/build-llama-cpp.sh builds it)"
  return 1
}

echo "traffic: $(date -u +%FT%TZ), $threads threads, load average $(cut -d' ' -f1-3 /proc/loadavg)"
for round in $(seq "${FIRST_ROUND:-1}" "$rounds"); do
  swap=$((round % 2 == 0))
  for load in $only; do
    case $load in
    shared)
      args=(--api completions --num-requests "$reqs_shared" --concurrency "$conc" --shared-prefix-len "$prefix"
        --input-len 32 --output-len "$out" --seed "$round")
      sides="servd llama"
      [ $swap = 1 ] && sides="llama servd"
      for side in $sides; do
        if [ $side = servd ]; then
          start_servd
        else
          has_llama || continue
          start_llama "$conc" $((prefix + 32 + out + 128))
        fi
        bench "shared-$side-$round" "${args[@]}"
        stop
      done
      ;;
    chat)
      args=(--api chat --conversations "$convs" --turns "$turns" --concurrency "$conc" --input-len "$turn_in"
        --output-len "$out" --seed "$round")
      sides="servd llama"
      [ $swap = 1 ] && sides="llama servd"
      for side in $sides; do
        if [ $side = servd ]; then
          start_servd
        else
          has_llama || continue
          start_llama "$conc" $(((turn_in + out) * turns + 256))
        fi
        bench "chat-$side-$round" "${args[@]}"
        stop
      done
      ;;
    streams)
      steps="$ms 0"
      [ $swap = 1 ] && steps="0 $ms"
      for step in $steps; do
        start_servd --max-step-ms "$step"
        bench "streams-ms$step-$round" --api completions --num-requests "$stream_reqs" --concurrency "$streams" \
          --warmup 4 --input-len "$in" --output-len "$stream_out" --seed "$round"
        stop
      done
      ;;
    miss)
      modes="on off"
      [ $swap = 1 ] && modes="off on"
      for mode in $modes; do
        if [ $mode = on ]; then start_servd; else start_servd --no-prefix-cache; fi
        bench "miss-$mode-$round" --api completions --num-requests "$miss_reqs" --concurrency "$miss_conc" \
          --warmup 2 --input-len 64 --output-len "$miss_out" --seed $((1000 + round))
        stop
      done
      if [ -x "$build/tests/daemon/bench_prefix_bookkeeping" ]; then
        "$build/tests/daemon/bench_prefix_bookkeeping" 20000 7 >"$work/book-$round.txt"
        echo "  book-$round: $(tr '\n' ' ' <"$work/book-$round.txt")"
      fi
      ;;
    *)
      echo "unknown load '$load' in ONLY (shared chat streams miss)" >&2
      exit 2
      ;;
    esac
  done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 "$root/scripts/bench/traffic_report.py" --ms "$ms" "$work"
[ -n "${OUT_DIR:-}" ] && echo "results: $work"
exit 0
}
