#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan) in build-fuzz/ and runs each for a bounded
# time from its seed corpus (tests/fuzz/corpus/<target>/), with tests/fuzz/<target>.dict when there is
# one. Exits non-zero on the first crash.
#   scripts/fuzz.sh [--seconds N] [target ...]     (default: every tests/fuzz/fuzz_<target>.c)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
secs=20
targets=()
while (($#)); do
  case "$1" in
    --seconds) secs="$2"; shift 2 ;;
    -h|--help) sed -n '2,6p' "$0"; exit 0 ;;
    *) targets+=("$1"); shift ;;
  esac
done
if ((${#targets[@]} == 0)); then
  for f in "$root"/tests/fuzz/fuzz_*.c; do
    t=$(basename "$f" .c)
    targets+=("${t#fuzz_}")
  done
fi
build="$root/build-fuzz"
CC=clang cmake -S "$root" -B "$build" -DSERVD_FUZZ=ON -DSERVD_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" --target "${targets[@]/#/fuzz_}" -j"$(nproc)" >/dev/null
for t in "${targets[@]}"; do
  work="$build/corpus-$t" # grows across runs; the seeds stay untouched
  mkdir -p "$work" "$build/artifacts-$t"
  echo "fuzz_$t: ${secs}s"
  log="$build/fuzz_$t.log"
  set +e
  seeds=()
  [ -d "$root/tests/fuzz/corpus/$t" ] && seeds=("$root/tests/fuzz/corpus/$t")
  dict=()
  [ -f "$root/tests/fuzz/$t.dict" ] && dict=(-dict="$root/tests/fuzz/$t.dict")
  "$build/tests/fuzz/fuzz_$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
    "${dict[@]}" -artifact_prefix="$build/artifacts-$t/" -print_final_stats=1 "$work" "${seeds[@]}" >"$log" 2>&1
  rc=$?
  set -e
  grep -E "^(stat::number_of_executed_units|stat::peak_rss_mb)|ERROR|SUMMARY|Done" "$log" || true
  if ((rc != 0)); then
    echo "fuzz_$t: failed (exit $rc); reproducer in $build/artifacts-$t/, log $log" >&2
    tail -40 "$log" >&2
    exit 1
  fi
done
echo "fuzz: all targets ran ${secs}s without a finding"
