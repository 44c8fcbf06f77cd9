#!/usr/bin/env bash
# Where servd's CPU time goes under many concurrent streams: starts servd on a model, loads it with
# servd-bench, records the servd process with `perf record -g` during the load and prints the
# samples classified as kernel compute, thread-pool spinning/waiting, Python, and everything else
# (HTTP, libuv, JSON, engine, tokenizer, libc, system calls), with the largest items of the last.
# Also measures output tokens/s at one stream for comparison.
#
# usage: scripts/bench/profile-server.sh [--build DIR] [--model PKG] [--concurrency N]
#          [--duration S] [--input-len N] [--output-len N] [--threads N] [--port P]
#          [--temperature T] [--freq HZ] [--out DIR]
# Without --model, a tiny synthetic model is made with `modelpkg synth tiny`.
# Needs: perf (linux-perf), curl, python3. Prints the table; keeps perf.data and the bench JSON in
# --out (default a new temporary folder).
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
build="$root/build"
model=""
conc=64
duration=20
in_len=32
out_len=64
threads=2
port=18790
temperature=""
freq=1999
out=""

while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --concurrency) conc=$2; shift 2 ;;
    --duration) duration=$2; shift 2 ;;
    --input-len) in_len=$2; shift 2 ;;
    --output-len) out_len=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    --temperature) temperature=$2; shift 2 ;;
    --freq) freq=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h | --help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "profile-server: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done

servd="$build/daemon/servd"
bench="$build/client/servd-bench"
modelpkg="$build/package_format/modelpkg"
for b in "$servd" "$bench"; do
  [ -x "$b" ] || { echo "profile-server: $b not built (cmake --build $build --target servd servd-bench servd_pymod modelpkg)" >&2; exit 2; }
done
command -v perf > /dev/null || { echo "profile-server: perf not found (Debian: linux-perf)" >&2; exit 2; }
[ -n "$out" ] || out=$(mktemp -d /tmp/profile-server.XXXXXX)
mkdir -p "$out"

if [ -z "$model" ]; then
  model="$out/tiny.mpk"
  "$modelpkg" synth tiny -o "$model" --quiet
fi

# cpu-clock works where hardware counters are not exposed (virtual machines, containers).
event=cpu-clock
if perf stat -x, -e cycles true 2>&1 | grep -q '^[0-9]'; then event=cycles; fi

"$servd" --model "$model:m" --port "$port" --threads "$threads" --access-log off > "$out/servd.log" 2>&1 &
servd_pid=$!
cleanup() { kill -TERM "$servd_pid" 2> /dev/null || true; wait "$servd_pid" 2> /dev/null || true; }
trap cleanup EXIT
for _ in $(seq 1 300); do
  curl -sf "http://127.0.0.1:$port/v2/health/ready" > /dev/null 2>&1 && break
  kill -0 "$servd_pid" 2> /dev/null || { cat "$out/servd.log" >&2; exit 1; }
  sleep 0.2
done

bench_args=(--port "$port" --model m --input-len "$in_len" --output-len "$out_len" --quiet)
[ -z "$temperature" ] || bench_args+=(--temperature "$temperature")

# One stream first (also warms the model up).
"$bench" "${bench_args[@]}" --concurrency 1 --warmup 2 --duration 8 --json "$out/bench-1.json" || true

# The profiled run: recording starts after the warm-up and stops before the load does.
"$bench" "${bench_args[@]}" --concurrency "$conc" --warmup "$conc" --duration $((duration + 6)) \
  --json "$out/bench-$conc.json" &
bench_pid=$!
sleep 4
uptime > "$out/uptime.txt"
stat_before=$(cut -d' ' -f14,15 "/proc/$servd_pid/stat")
perf record -q -e "$event" -F "$freq" -g -p "$servd_pid" -o "$out/perf.data" -- sleep "$duration" 2> "$out/perf-record.log"
stat_after=$(cut -d' ' -f14,15 "/proc/$servd_pid/stat")
uptime >> "$out/uptime.txt"
wait "$bench_pid" || true

# Address, name and source file of every function of servd (static ones may share a name).
nm -l -n --defined-only "$servd" 2> /dev/null | awk -F'\t' '{ split($1, a, " "); if (a[2] ~ /^[tTwW]$/) print a[1] "\t" a[3] "\t" (NF >= 2 ? $2 : "?") }' > "$out/symbols.tsv"

perf script -i "$out/perf.data" -F tid,period,ip,sym,dso --no-inline 2> /dev/null > "$out/script.txt"

python3 - "$out" "$conc" "$duration" "$stat_before" "$stat_after" "$(getconf CLK_TCK)" "$event" "$root" << 'EOF'
import bisect, collections, json, os, re, sys

out, conc, duration = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
ticks = int(sys.argv[6])
cpu_s = sum(int(b) - int(a) for a, b in zip(sys.argv[4].split(), sys.argv[5].split())) / ticks
event = sys.argv[7]

root = sys.argv[8].rstrip("/") + "/"
# servd's functions by address -> (component, source file); the component is the source folder.
addrs, srcs = [], []
for line in open(os.path.join(out, "symbols.tsv")):
    a, sym, path = line.rstrip("\n").split("\t")
    path = path.rsplit(":", 1)[0]
    rel = path[len(root):] if path.startswith(root) else path
    parts = rel.split("/")
    if rel.startswith("kernels/"): comp = "kernels"
    elif rel.startswith("daemon/engine/"): comp = "engine"
    elif rel.startswith("daemon/"): comp = "http"
    else: comp = parts[0]
    addrs.append(int(a, 16)); srcs.append((comp, parts[-1]))

def srcof(ip):
    i = bisect.bisect_right(addrs, ip) - 1
    return srcs[i] if i >= 0 else ("servd", "?")

# Samples: a header "tid period", then frames "addr sym (dso)", leaf first, then a blank line.
samples = []
frame_re = re.compile(r"^\s*([0-9a-f]+)\s+(.*?)\s+\((.*)\)$")
cur = None
for line in open(os.path.join(out, "script.txt"), errors="replace"):
    if not line.strip():
        if cur: samples.append(cur)
        cur = None
        continue
    if cur is None:
        f = line.split()
        cur = {"tid": int(f[0]), "period": int(f[1]), "frames": []}
        continue
    m = frame_re.match(line)
    if m:
        sym, dso = m.group(2), os.path.basename(m.group(3))
        sym = re.sub(r"\+0x[0-9a-f]+$", "", sym)
        src = srcof(int(m.group(1), 16)) if dso == "servd" else None
        cur["frames"].append((sym, dso, src))
if cur: samples.append(cur)
if not samples:
    sys.exit("profile-server: no samples recorded (see perf-record.log)")

def is_sys(dso):  # frames that only run on behalf of a caller
    return dso.startswith("[kernel") or dso.startswith("libc.so") or dso == "[vdso]" or dso.startswith("ld-linux")

# Pool worker threads: only ever compute kernel chunks or wait for work.
workers = {s["tid"] for s in samples for sym, dso, src in s["frames"]
           if sym == "worker_main" and src and src[1] == "threadpool.c"}

MALLOC = re.compile(r"malloc|free|_int_|realloc|calloc|tcache|arena|sysmalloc|unlink_chunk")

def classify(s):
    """-> (class, item) for one sample, by its leaf and, for system frames, the first caller."""
    fr = s["frames"] or [("[unknown]", "[unknown]", None)]
    sym, dso, src = fr[0]
    first_user = next(((f, d, x) for f, d, x in fr if not d.startswith("[kernel")), ("[unknown]", "[unknown]", None))
    owner = next(((f, d, x) for f, d, x in fr if not is_sys(d)), None)  # first frame outside libc/kernel
    if dso == "servd":
        lib, obj = src
        if obj == "threadpool.c":
            return "pool", "threadpool: " + sym
        if lib == "kernels":
            return "kernels", sym
        if lib == "interp":
            return "other", "interp host (" + obj + "): " + sym
        return "other", lib + " (" + obj + "): " + sym
    if dso.startswith("libm.so") or dso.startswith("libopenblas"):
        return "kernels", dso + ": " + sym
    if dso.startswith("perf-") or dso.startswith("[JIT]"):  # anonymous executable memory: PCRE2's JIT
        return "other", "JIT code (PCRE2, tokenizer regex)"
    if dso.startswith("libpython") or ".cpython-" in dso:
        return "python", dso.split(".so")[0] + ": " + sym
    if dso.startswith("[kernel") and first_user[1] != "[unknown]" and not is_sys(first_user[1]):
        # Not a system call: an interrupt or preemption of user code, charged to that code's class.
        c, it = classify({"tid": s["tid"], "frames": [first_user]})
        return c, "kernel, interrupting " + it
    if is_sys(dso):
        # Waiting of the pool: anything on a worker thread, and the callers' sched_yield.
        if s["tid"] in workers or "sched_yield" in first_user[0]:
            return "pool", ("kernel: " if dso.startswith("[kernel") else dso + ": ") + first_user[0]
        if owner and owner[1] == "servd" and owner[2][1] == "threadpool.c":
            return "pool", "system, from threadpool: " + first_user[0]
        if owner and (owner[1].startswith("libpython") or ".cpython-" in owner[1]):
            return "python", "system, from Python: " + first_user[0]
        if dso.startswith("[kernel"):
            return "other", "kernel: syscall " + first_user[0] if first_user[1] != "[unknown]" else "kernel: " + sym
        if dso.startswith("libc") and MALLOC.search(sym):
            return "other", "libc malloc/free: " + sym
        return "other", dso.split(".so")[0] + ": " + sym
    return "other", dso.split(".so")[0] + ": " + sym

by_class = collections.Counter()
items = collections.defaultdict(collections.Counter)
per_thread = collections.defaultdict(collections.Counter)
total = 0
for s in samples:
    c, it = classify(s)
    by_class[c] += s["period"]
    items[c][it] += s["period"]
    per_thread[s["tid"]][c] += s["period"]
    total += s["period"]

def pct(x): return 100.0 * x / total

def find(obj, key):
    if isinstance(obj, dict):
        if key in obj and isinstance(obj[key], (int, float)): return obj[key]
        for v in obj.values():
            r = find(v, key)
            if r is not None: return r
    return None

tps = {}
for n in (1, conc):
    try:
        tps[n] = find(json.load(open(os.path.join(out, "bench-%d.json" % n))), "output_tokens_per_s")
    except (OSError, ValueError):
        tps[n] = None

names = {"kernels": "kernels (compute)", "pool": "thread pool spinning/waiting",
         "python": "Python (libpython, servd module)", "other": "everything else"}
print("servd CPU during %.0f s at %d streams: %.2f cores (from /proc), %d samples of %s"
      % (duration, conc, cpu_s / duration, len(samples), event))
print("uptime: " + " | ".join(l.strip() for l in open(os.path.join(out, "uptime.txt"))))
print()
print("| class | share of servd CPU samples |")
print("|---|---:|")
for c in ("kernels", "pool", "python", "other"):
    print("| %s | %.1f%% |" % (names[c], pct(by_class[c])))
print()
outside = by_class["pool"] + by_class["other"]
print("outside kernel compute and Python: %.1f%% (thread pool %.1f%% + everything else %.1f%%); target < 10%%"
      % (pct(outside), pct(by_class["pool"]), pct(by_class["other"])))
print()
print("largest items outside kernels and Python (share of all samples):")
print()
print("| item | share |")
print("|---|---:|")
rest = collections.Counter()
rest.update({"[pool] " + k: v for k, v in items["pool"].items()})
rest.update({k: v for k, v in items["other"].items()})
for it, v in rest.most_common(25):
    print("| %s | %.2f%% |" % (it.replace("|", "\\|"), pct(v)))
print()
groups = collections.Counter()
for it, v in items["other"].items():
    groups["kernel interrupts" if it.startswith("kernel, interrupting") else it.split(":")[0].split(" (")[0]] += v
print("everything else by component: " + ", ".join("%s %.1f%%" % (g, pct(v)) for g, v in groups.most_common()
                                                   if pct(v) >= 0.05))
print()
print("per thread (samples; w = pool worker):")
for tid, cnt in sorted(per_thread.items(), key=lambda kv: -sum(kv[1].values())):
    t = sum(cnt.values())
    print("  %d%s: %.1f%% of samples; %s" % (tid, " w" if tid in workers else "", pct(t),
          ", ".join("%s %.0f%%" % (c, 100.0 * v / t) for c, v in cnt.most_common())))
print()
if tps.get(1) and tps.get(conc):
    print("output tokens/s: 1 stream %.0f, %d streams %.0f (%.2fx)" % (tps[1], conc, tps[conc], tps[conc] / tps[1]))
print("files: " + out)
EOF
