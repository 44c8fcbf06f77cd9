#!/usr/bin/env bash
# pack throughput against cp of the same bytes, in one run (see docs/performance.md, "Packages").
#   package_format/bench/bench_pack.sh MODELPKG [config] [runs]     config: small-1b (default), 200mb, tiny
# Synthesizes the Hugging Face folder once (bf16), then alternates `cp model.safetensors` and
# `modelpkg pack` (both from a warm page cache, both to the same folder, output removed between runs)
# and prints the medians in MB/s and their ratio. BENCH_KIND=generic packs the same safetensors file
# with `pack --kind generic` (a one-file code folder) instead of the Hugging Face import.
set -euo pipefail
modelpkg=${1:?usage: bench_pack.sh MODELPKG [config] [runs]}
cfg=${2:-small-1b}
runs=${3:-3}
work=${BENCH_DIR:-$(mktemp -d /var/tmp/mpk-bench-XXXXXX)}
hf="$work/hf-$cfg"
[ -s "$hf/model.safetensors" ] || "$modelpkg" synth "$cfg" --seed 1 --hf-out "$hf" --quiet
bytes=$(stat -c %s "$hf/model.safetensors")
cat "$hf/model.safetensors" >/dev/null # warm the page cache for both
kind=${BENCH_KIND:-causal-lm}
if [ "$kind" = generic ]; then
  mkdir -p "$work/bench_code" && echo "class M: pass" >"$work/bench_code/model.py"
  pack_args=(pack --kind generic --code "$work/bench_code" --entry-point bench_code.model:M
             --weights "$hf/model.safetensors" --config "$hf/config.json")
else
  pack_args=(pack "$hf")
fi
t() { local s e; s=$(date +%s.%N); "$@"; sync; e=$(date +%s.%N); echo "$e - $s" | bc -l; }
cps=(); packs=()
for ((i = 0; i < runs; i++)); do
  cps+=("$(t cp "$hf/model.safetensors" "$work/copy.safetensors")"); rm -f "$work/copy.safetensors"
  packs+=("$(t "$modelpkg" "${pack_args[@]}" -o "$work/out.mpk" --quiet)"); rm -f "$work/out.mpk"
done
med() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
mc=$(med "${cps[@]}"); mp=$(med "${packs[@]}")
printf 'weights %s (%s): %.0f MB; median of %d runs (incl. sync)\n' "$cfg" "$kind" "$(echo "$bytes/1000000" | bc -l)" "$runs"
printf '  cp:   %6.2f s  %7.0f MB/s\n' "$mc" "$(echo "$bytes/1000000/$mc" | bc -l)"
printf '  pack: %6.2f s  %7.0f MB/s  (pack/cp throughput %.2f)\n' "$mp" "$(echo "$bytes/1000000/$mp" | bc -l)" "$(echo "$mc/$mp" | bc -l)"
[ -n "${BENCH_DIR:-}" ] || rm -rf "$work"
