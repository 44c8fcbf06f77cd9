#!/usr/bin/env bash
# The GGUF type sweep of the benchmark suite (scripts/bench-suite.sh --gguf sweep): the default model
# requantized by llama.cpp's llama-quantize into each type, packed by modelpkg, then per type, in the
# same run and alternating servd / llama.cpp each round:
#   - package size / GGUF size,
#   - batch-1 decode tok/s: `servd generate` (128 tokens after a 5-token prompt) against llama-bench tg128,
#   - prefill tok/s of a ~512-token prompt: `servd generate` (prompt tokens / time to the first token)
#     against llama-bench pp512.
# Results: OUT/sweep.tsv (type metric system value, one line per measurement), summarised with
# medians and ratios by gguf_sweep_report.py.
#
# Usage: gguf_sweep.sh --servd BIN --modelpkg BIN --llama-bin DIR --base GGUF --out DIR
#                      [--types "Q4_0 Q4_1 ..."] [--rounds N] [--threads N] [--prompt-words N]
# --prompt-words (default 512) sizes the prefill prompt: 512 words are ~512 tokens for SmolLM2's
# tokenizer; a byte-level tokenizer (the synthesized models of tests/llama/make_tiny.py) wants ~100.
# Environment: LLAMA_ARGS (extra llama-bench arguments, e.g. "--poll 0").
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
types="Q4_0 Q4_1 Q8_0 Q4_K_M Q5_K_M Q6_K Q3_K_M Q2_K IQ4_NL IQ4_XS"
rounds=3; threads=2; prompt_words=512; servd=""; modelpkg=""; llama_bin=""; base=""; out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --servd) servd=$2; shift ;;
    --modelpkg) modelpkg=$2; shift ;;
    --llama-bin) llama_bin=$2; shift ;;
    --base) base=$2; shift ;;
    --out) out=$2; shift ;;
    --types) types=$2; shift ;;
    --rounds) rounds=$2; shift ;;
    --threads) threads=$2; shift ;;
    --prompt-words) prompt_words=$2; shift ;;
    *) echo "gguf_sweep: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
for v in servd modelpkg llama_bin base out; do
  [ -n "${!v}" ] || { echo "gguf_sweep: --${v//_/-} is required" >&2; exit 2; }
done
for b in llama-quantize llama-bench; do
  [ -x "$llama_bin/$b" ] || { echo "gguf_sweep: no $b in $llama_bin (scripts/bench/build-llama-cpp.sh)" >&2; exit 1; }
done
mkdir -p "$out"
tsv=$out/sweep.tsv
: >"$tsv"
log() { echo "[gguf-sweep] $*"; }

# A prompt of about 512 tokens (SmolLM2's tokenizer; the report uses the count servd prints).
long_prompt=$(python3 - "$prompt_words" <<'EOF'
import sys
words = ("the quick brown fox jumps over the lazy dog while a model reads every word of a long prompt "
         "and computes its keys and values once for all of them before the first new token appears").split()
print(" ".join(words[i % len(words)] for i in range(int(sys.argv[1]))))
EOF
)

base_type=$(python3 -c 'import re,sys; m=re.search(r"\.(Q\d_[01K]|Q\d_K_[SML]|IQ\d_\w+|F16|BF16)\.gguf$", sys.argv[1]); print(m.group(1) if m else "")' "$base")
for t in $types; do
  g=$out/$t.gguf
  if [ "$t" = "$base_type" ]; then
    cp "$base" "$g"
  elif ! "$llama_bin/llama-quantize" --allow-requantize "$base" "$g" "$t" >"$out/quantize-$t.log" 2>&1; then
    log "FAIL llama-quantize $t (see $out/quantize-$t.log)"; continue
  fi
  if ! "$modelpkg" pack "$g" -o "$out/$t.mpk" --quiet >"$out/pack-$t.log" 2>&1; then
    log "FAIL modelpkg pack $t: $(tail -n 1 "$out/pack-$t.log")"; continue
  fi
  printf '%s\tgguf_bytes\t-\t%s\n%s\tpackage_bytes\t-\t%s\n' "$t" "$(stat -c %s "$g")" "$t" "$(stat -c %s "$out/$t.mpk")" >>"$tsv"
  log "$t: GGUF $(stat -c %s "$g") bytes, package $(stat -c %s "$out/$t.mpk") bytes"
done

servd_run() { # servd_run TYPE PROMPT MAXTOK -> the generate log line
  "$servd" generate --model "$out/$1.mpk" --prompt "$2" --max-tokens "$3" --ignore-eos --quiet \
    --threads "$threads" 2>&1 | tail -n 1
}
for r in $(seq "$rounds"); do
  for t in $types; do
    [ -f "$out/$t.mpk" ] || continue
    # servd decode, llama-bench (pp512 then tg128), servd prefill: each system measured between the
    # other's runs, the order swapped every other round.
    runs=("servd-decode" "llama" "servd-prefill")
    [ $((r % 2)) = 0 ] && runs=("servd-prefill" "llama" "servd-decode")
    for run in "${runs[@]}"; do
      case $run in
        servd-decode)
          line=$(servd_run "$t" "The capital of France is" 128)
          v=$(sed -n 's/.*decode \([0-9.]*\) tok\/s.*/\1/p' <<<"$line")
          [ -n "$v" ] && printf '%s\tdecode\tservd\t%s\n' "$t" "$v" >>"$tsv" || log "FAIL servd decode $t: $line" ;;
        servd-prefill)
          line=$(servd_run "$t" "$long_prompt" 1)
          v=$(sed -n 's/.*prompt \([0-9]*\) tokens in [0-9.]* s (\([0-9.]*\) tok\/s).*/\2 \1/p' <<<"$line")
          [ -n "$v" ] && printf '%s\tprefill\tservd\t%s\n' "$t" "${v% *}" >>"$tsv" &&
            printf '%s\tprompt_tokens\tservd\t%s\n' "$t" "${v#* }" >>"$tsv" || log "FAIL servd prefill $t: $line" ;;
        llama)
          # shellcheck disable=SC2086
          if "$llama_bin/llama-bench" -m "$out/$t.gguf" -p 512 -n 128 -r 1 -t "$threads" -o json ${LLAMA_ARGS:-} \
              >"$out/llama-$t-$r.json" 2>"$out/llama-$t-$r.log"; then
            python3 -c 'import json,sys
for e in json.load(open(sys.argv[1])):
    m = "prefill" if e["n_prompt"] > 0 and e["n_gen"] == 0 else "decode"
    print("%s\t%s\tllama.cpp\t%s" % (sys.argv[2], m, e["avg_ts"]))' "$out/llama-$t-$r.json" "$t" >>"$tsv"
          else
            log "FAIL llama-bench $t (see $out/llama-$t-$r.log)"
          fi ;;
      esac
    done
    log "round $r $t: $(awk -F'\t' -v t="$t" '$1 == t && ($2 == "decode" || $2 == "prefill") {printf "%s/%s %.1f  ", $2, $3, $4}' "$tsv" | tail -c 200)"
  done
done
python3 "$here/gguf_sweep_report.py" "$tsv"
