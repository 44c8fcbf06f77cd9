#!/usr/bin/env bash
# What KV-cache events and OpenTelemetry traces cost a busy server (docs/performance.md, "Kubernetes
# serving: KV-cache events and traces"): STREAMS concurrent streams of shared-prefix prompts (so the
# prefix cache stores and evicts blocks all the time), servd without them ("off") and with both
# ("on": --kv-events-endpoint with a subscriber reading every batch, --otlp-traces-endpoint with a
# local collector taking every POST), alternating the order each round; medians of the rounds' output
# tokens/s, and their ratio.
# Usage: scripts/bench/k8s_overhead.sh [BUILD_DIR] [MODEL.mpk]
# Environment: THREADS (2), ROUNDS (5), STREAMS (32), REQS (96), OUT (64), IN (64), PREFIX (256),
# PREFIXES (8), KV_BLOCKS (1024), PORT (18451), EVENTS_PORT (18452), OTLP_PORT (18453).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
model=${2:-$root/.cache/smollm2-135m-instruct-q4_1.mpk}
threads=${THREADS:-2} rounds=${ROUNDS:-5} streams=${STREAMS:-32} reqs=${REQS:-96} out=${OUT:-64}
in_len=${IN:-64} prefix=${PREFIX:-256} prefixes=${PREFIXES:-8} kv_blocks=${KV_BLOCKS:-1024}
port=${PORT:-18451} events_port=${EVENTS_PORT:-18452} otlp_port=${OTLP_PORT:-18453}
py=$root/.venv-test/bin/python
[ -x "$py" ] || py=python3
work=$(mktemp -d /tmp/servd-k8s-bench.XXXXXX)
pid= sinks=
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  [ -n "$sinks" ] && kill "$sinks" 2>/dev/null && wait "$sinks" 2>/dev/null
  rm -rf "$work"
  true
}
trap cleanup EXIT

# The subscriber and the collector: count what arrives, so the "on" runs publish to real readers.
"$py" - "$events_port" "$otlp_port" "$work/sinks.txt" <<'PY' &
import http.server, sys, threading, time, zmq
ev_port, otlp_port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
counts = {"batches": 0, "posts": 0}
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        counts["posts"] += 1
        self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers()
    def log_message(self, *a): pass
srv = http.server.ThreadingHTTPServer(("127.0.0.1", otlp_port), H)
threading.Thread(target=srv.serve_forever, daemon=True).start()
sub = zmq.Context().socket(zmq.SUB)
sub.connect(f"tcp://127.0.0.1:{ev_port}")
sub.setsockopt(zmq.SUBSCRIBE, b"")
last = time.monotonic()
while True:
    if sub.poll(200):
        sub.recv_multipart()
        counts["batches"] += 1
    if time.monotonic() - last > 1:
        open(out, "w").write(f"{counts['batches']} {counts['posts']}\n")
        last = time.monotonic()
PY
sinks=$!

# shellcheck source=server-lib.sh
. "$root/scripts/bench/server-lib.sh"
start_servd() { # $1: off or on
  local extra=()
  [ "$1" = on ] && extra=(--kv-events-endpoint "tcp://*:$events_port"
    --otlp-traces-endpoint "http://127.0.0.1:$otlp_port/v1/traces")
  "$build/daemon/servd" --model "$model" --port "$port" --threads "$threads" --access-log off \
    --kv-blocks "$kv_blocks" "${extra[@]}" 2>"$work/server.log" &
  pid=$!
  wait_ready "$port" /v2/health/ready "$work/server.log"
}

for round in $(seq 1 "$rounds"); do
  order="off on"
  [ $((round % 2)) = 0 ] && order="on off"
  for mode in $order; do
    start_servd "$mode"
    "$build/client/servd-bench" --port "$port" --quiet --json "$work/streams.$mode.$round.json" --api completions \
      --num-requests "$reqs" --concurrency "$streams" --input-len "$in_len" --shared-prefix-len "$prefix" \
      --prefixes "$prefixes" --output-len "$out" --no-min-tokens --seed $((3000 + round)) >/dev/null
    if [ "$mode" = on ]; then
      curl -sf "http://127.0.0.1:$port/metrics" | grep -E '^servd_(kv_events|otlp)_[a-z_]+(\{| )' \
        >"$work/counters.$round.txt" || true
      # CPU time of the publisher and exporter threads against the whole process's (clock ticks).
      for task in /proc/"$pid"/task/*; do
        printf '%s %s\n' "$(cat "$task/comm")" "$(sed 's/^.*) //' "$task/stat" | awk '{print $12 + $13}')"
      done >"$work/threads.$round.txt"
    fi
    echo "round $round, $mode done; load average $(cut -d' ' -f1 /proc/loadavg)"
    stop
  done
done
sleep 1.5
echo "subscriber batches and collector POSTs received: $(cat "$work/sinks.txt" 2>/dev/null)"
echo "counters of the last 'on' run:"
sed 's/^/  /' "$work/counters.$rounds.txt"

"$py" - "$work" <<'PY'
import glob, json, os, statistics, sys
res = {}
for f in glob.glob(f"{sys.argv[1]}/streams.*.json"):
    _, mode, _ = os.path.basename(f)[:-5].split(".")
    r = json.load(open(f))["results"]
    if r["failed"]:
        print(f"{f}: {r['failed']} requests failed", file=sys.stderr)
    res.setdefault(mode, []).append(r)
tps = {m: statistics.median(r["output_tokens_per_s"] for r in rs) for m, rs in res.items()}
ttft = {m: statistics.median(r["ttft_ms"]["median"] for r in rs) for m, rs in res.items()}
paired = sorted(
    json.load(open(f"{sys.argv[1]}/streams.on.{k}.json"))["results"]["output_tokens_per_s"] /
    json.load(open(f"{sys.argv[1]}/streams.off.{k}.json"))["results"]["output_tokens_per_s"]
    for k in range(1, len(res["on"]) + 1))
cpu = []
for f in sorted(glob.glob(f"{sys.argv[1]}/threads.*.txt")):
    rows = [l.rsplit(" ", 1) for l in open(f).read().splitlines() if l.strip()]
    total = sum(int(t) for _, t in rows)
    mine = sum(int(t) for name, t in rows if name in ("servd-kvevents", "servd-otlp"))
    cpu.append(mine / total if total else 0.0)
for m in ("off", "on"):
    rounds = ", ".join("%.1f" % r["output_tokens_per_s"] for r in res[m])
    print(f"{m:>4}: output {tps[m]:8.2f} tok/s (rounds: {rounds}), TTFT median {ttft[m]:.0f} ms")
print(f"on / off: {tps['on'] / tps['off']:.4f} (medians); per round (same round, back to back): "
      f"{', '.join('%.3f' % r for r in paired)}, median {statistics.median(paired):.4f}")
if cpu:
    print(f"publisher + exporter threads: {', '.join('%.3f%%' % (100 * c) for c in cpu)} of servd's CPU time "
          f"(median {100 * statistics.median(cpu):.3f}%)")
PY
