#!/usr/bin/env bash
# The relocatable bundle (scripts/gpu-bundle.sh) serves: bundle this build's programs, move the bundle,
# synthesize the tiny Llama with its modelpkg, run its servd with a clean environment (env -i, minimal
# PATH) and check completions. Where a mount namespace is allowed (root), the system's Python 3.11,
# jinja2 and every library the bundle carries are hidden from servd, as on a machine without Debian's
# packages; everywhere, the files servd maps must come from the bundle or glibc. The bundled servd's
# greedy output must equal the build tree's servd's on the same package (same code; a different
# standard library or chat template engine would show up here).
#   test_bundle.sh --script gpu-bundle.sh --build DIR --servd F --modelpkg F --bench F --pymod F --work DIR
# Exit 0 pass, 1 fail, 77 skip (with the reason).
set -uo pipefail

script="" build="" servd="" modelpkg="" bench="" pymod="" work=""
while (($#)); do
  case "$1" in
    --script) script=$2 ;; --build) build=$2 ;; --servd) servd=$2 ;; --modelpkg) modelpkg=$2 ;;
    --bench) bench=$2 ;; --pymod) pymod=$2 ;; --work) work=$2 ;;
    *) echo "FAIL: unknown argument $1"; exit 1 ;;
  esac
  shift 2
done

skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }

for f in "$servd" "$modelpkg" "$bench" "$pymod"; do [ -f "$f" ] || skip "$f was not built"; done
for t in curl python3 readelf ldd timeout; do command -v $t >/dev/null || skip "$t is not installed"; done
# The run-time overrides (interp/src/paths.c) are what make a relocated Python usable at all.
grep -aq SERVD_LIBPYTHON "$servd" || skip "this servd does not read SERVD_LIBPYTHON (no run-time Python paths)"

[ -n "$work" ] || work=$(mktemp -d)
rm -rf "$work"
mkdir -p "$work"
pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done; }
trap cleanup EXIT

# 1. bundle, then move it: nothing may point back to where it was made
timeout 60 bash "$script" --no-build --build "$build" --out "$work/made" --servd "$servd" --modelpkg "$modelpkg" \
  --bench "$bench" --pymod "$pymod" >"$work/bundle.log" 2>&1 || fail "gpu-bundle.sh failed: $(cat "$work/bundle.log")"
cat "$work/bundle.log"
mv "$work/made" "$work/bundle"
B=$work/bundle
clean_env=(env -i PATH=/usr/bin:/bin HOME="$work" LANG=C)
timeout 30 "${clean_env[@]}" "$B/bin/servd-env" --check >"$work/check.log" 2>&1 ||
  fail "servd-env --check: $(cat "$work/check.log")"

# 2. the tiny model, made by the bundle's modelpkg (its model code comes from the bundle too)
timeout 60 "${clean_env[@]}" "$B/bin/servd-env" modelpkg synth tiny -o "$work/tiny.mpk" --quiet >"$work/synth.log" 2>&1 ||
  fail "bundled modelpkg synth tiny: $(cat "$work/synth.log")"

# 3. servd from the bundle; the system's copies hidden where possible
hide=""
if [ "$(id -u)" = 0 ] && unshare -m --propagation private true 2>/dev/null; then
  hide="mount -t tmpfs none /usr/lib/python3.11 && "
  [ -d /usr/lib/python3/dist-packages ] && hide+="mount -t tmpfs none /usr/lib/python3/dist-packages && "
  # libraries that mount itself loads (libpcre2 through libselinux) are hidden last
  mount_libs=" $(ldd "$(command -v mount)" | awk '{ print $1 }' | tr '\n' ' ') "
  late=""
  for l in "$B"/lib/*.so*; do
    n=$(basename "$l")
    for d in /usr/lib/x86_64-linux-gnu /lib/x86_64-linux-gnu; do
      [ -e "$d/$n" ] || continue
      if [[ $mount_libs == *" $n "* ]]; then late+="mount --bind /dev/null $d/$n && "
      else hide+="mount --bind /dev/null $d/$n && "; fi
      break
    done
  done
  hide+=$late
  if unshare -m --propagation private bash -c "${hide}true" 2>"$work/hide.log"; then
    echo "system Python 3.11, jinja2 and the bundled libraries are hidden from the bundled servd"
  else
    echo "hiding the system's files failed ($(head -1 "$work/hide.log")): checking only the files servd maps"
    hide=""
  fi
else
  echo "no mount namespace here: checking only the files servd maps"
fi

# start NAME CMD...: starts servd (stdout/stderr to $work/NAME.*), sets port and pid, waits until ready
start() {
  local name=$1
  shift
  "$@" --host 127.0.0.1 --port 0 --model "$work/tiny.mpk:tiny" >"$work/$name.out" 2>"$work/$name.err" &
  pid=$!
  pids+=("$pid")
  port=""
  for _ in $(seq 300); do
    port=$(awk '/^servd: port /{ print $3; exit }' "$work/$name.out")
    [ -n "$port" ] && break
    kill -0 "$pid" 2>/dev/null || fail "$name servd exited while starting: $(cat "$work/$name.err")"
    sleep 0.1
  done
  [ -n "$port" ] || fail "$name servd printed no port within 30 s: $(cat "$work/$name.err")"
  for _ in $(seq 600); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 "http://127.0.0.1:$port/v2/health/ready")" = 200 ] && return 0
    kill -0 "$pid" 2>/dev/null || fail "$name servd exited while loading: $(cat "$work/$name.err")"
    sleep 0.1
  done
  fail "$name servd not ready within 60 s: $(cat "$work/$name.err")"
}
post() { # PATH BODY -> response body on stdout; fails on a non-200
  local code
  code=$(curl -s -o "$work/resp.json" -w '%{http_code}' --max-time 60 -H 'Content-Type: application/json' \
    -d "$2" "http://127.0.0.1:$port$1") || fail "POST $1: curl failed (exit $?)"
  [ "$code" = 200 ] || fail "POST $1 answered $code: $(cat "$work/resp.json")"
  cat "$work/resp.json"
}
completion='{"model":"tiny","prompt":"the quick brown fox","max_tokens":8,"temperature":0,"ignore_eos":true}'
chat='{"model":"tiny","messages":[{"role":"user","content":"hello there"}],"max_tokens":8,"temperature":0,"ignore_eos":true}'

if [ -n "$hide" ]; then
  start bundled unshare -m --propagation private bash -c "${hide}exec \"\$@\"" servd-in-namespace \
    "${clean_env[@]}" "$B/bin/servd-env" servd
else
  start bundled "${clean_env[@]}" "$B/bin/servd-env" servd
fi
bundled_pid=$pid
b_cmpl=$(post /v1/completions "$completion")
b_chat=$(post /v1/chat/completions "$chat")

# every shared object mapped comes from the bundle, or is glibc's, libstdc++'s, libgcc's or CUDA's
python3 - "$bundled_pid" "$B" <<'PY' || fail "servd maps files from outside the bundle (above)"
import os, re, sys
pid, bundle = sys.argv[1], os.path.realpath(sys.argv[2])
# glibc, the C++ runtime, and CUDA/cuBLAS/NCCL (left to the machine: they must match its driver)
system = re.compile(r"^(ld-linux[\w-]*|lib(c|m|mvec|pthread|dl|rt|util|resolv|nss_\w+|stdc\+\+|gcc_s"
                    r"|cuda|cudart|cublas|cublasLt|nccl|nvidia-[\w-]+|nvrtc[\w-]*|nvJitLink))\.so")
bad = set()
saw_libpython = False
for line in open(f"/proc/{pid}/maps"):
    parts = line.split(None, 5)
    if len(parts) < 6 or not parts[5].startswith("/"):
        continue
    path = parts[5].strip().removesuffix(" (deleted)")
    name = os.path.basename(path)
    if ".so" not in name and "/python3" not in path:
        continue
    if os.path.realpath(path).startswith(bundle + "/"):
        saw_libpython |= name == "libpython3.11.so.1.0"
    elif not system.match(name):
        bad.add(path)
for p in sorted(bad):
    print("  not from the bundle:", p)
if not saw_libpython:
    print("  libpython3.11.so.1.0 of the bundle is not mapped")
sys.exit(1 if bad or not saw_libpython else 0)
PY

# 4. the same requests to the build tree's servd: greedy outputs must be equal
start tree "$servd"
t_cmpl=$(post /v1/completions "$completion")
t_chat=$(post /v1/chat/completions "$chat")

python3 - "$b_cmpl" "$t_cmpl" "$b_chat" "$t_chat" <<'PY' || exit 1
import json, sys
bc, tc, bh, th = (json.loads(a) for a in sys.argv[1:5])
def check(cond, msg):
    if not cond:
        print("FAIL:", msg)
        sys.exit(1)
c = bc["choices"][0]
check(isinstance(c.get("text"), str), f"completion has no text: {bc}")
check(c.get("finish_reason") == "length" and bc["usage"]["completion_tokens"] == 8,
      f"expected 8 tokens and finish_reason length (ignore_eos): {bc}")
m = bh["choices"][0]["message"]
check(m.get("role") == "assistant" and isinstance(m.get("content"), str), f"chat reply malformed: {bh}")
check(bh["usage"]["completion_tokens"] == 8, f"chat: expected 8 tokens: {bh}")
check(c["text"] == tc["choices"][0]["text"], f"completion differs from the build tree's servd: {c['text']!r} vs {tc['choices'][0]['text']!r}")
check(bh["usage"]["prompt_tokens"] == th["usage"]["prompt_tokens"], "chat prompt (template) differs from the build tree's servd")
check(m["content"] == th["choices"][0]["message"]["content"], "chat reply differs from the build tree's servd")
print(f"bundled servd: completion {c['text']!r}, chat {m['content']!r}: equal to the build tree's servd")
PY

# 5. clean shutdown of both
for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
for p in "${pids[@]}"; do
  for _ in $(seq 300); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$p" 2>/dev/null && fail "servd (pid $p) did not exit within 30 s of SIGTERM"
  wait "$p"
  rc=$?
  [ "$rc" = 0 ] || fail "servd (pid $p) exited with $rc after SIGTERM: $(cat "$work"/*.err)"
done
pids=()
echo "PASS: bundle $(du -sh "$B" | cut -f1), servd served from it with a clean environment"
