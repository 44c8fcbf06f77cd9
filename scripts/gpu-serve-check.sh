#!/usr/bin/env bash
# End-to-end check of servd on one GPU, run on the GPU machine from the working tree and a bundle
# (scripts/gpu-bundle.sh; that machine has no Debian packages and no Python 3.11):
#   scripts/gpu-serve-check.sh [--bundle DIR] [--out FILE.md] [--work DIR] [--budget S]
#                              [--copy-bw TBPS | --gpu-check-md FILE] [--skip-gpu] [--layers N] [--keep]
# (a) greedy equality: the same chat request (16 tokens, temperature 0) to `servd` on the CPU and to
#     `servd --gpus 1`, on a synthesized 12-layer model (`modelpkg synth 200mb`, head_dim 64: the
#     tiny model's head_dim 16 has no CUDA attention kernel); tokens compared by their bytes; a
#     difference passes only where the CPU's top-2 logprobs were within NEAR_TIE (bf16 noise), and the
#     first differing position is reported either way;
# (b) a Llama-3.1-8B-shaped bf16 package (vocab 128256, hidden 4096, intermediate 14336, 32 layers,
#     32 heads, 8 KV heads, llama3 RoPE; seeded random weights written here, then `modelpkg pack`),
#     served by `servd --gpus 1` and loaded by servd-bench at concurrency 1 and 64 (128 tokens in and out);
# (b') only when (b) ended in a fatal signal: the crash report's thread, rip and code bytes, then the
#     same package served again with one suspect changed at a time (CUDA called from the rank threads
#     as before the device executors: SERVD_DEVICE_EXECUTOR=0; no cuBLAS in any step: token budget 8;
#     the warp GEMV and no fused kernels; no CUDA graphs), each loaded with a few requests;
# (c) a markdown report: machine, the figures, batch-64/batch-1 decode tokens/s against the 10x
#     target, and batch-1 tokens/s x weight bytes / device copy bandwidth against 85%. The copy
#     bandwidth: --copy-bw (TB/s, read + write), or the "Device copy" line of a gpu_check report
#     (--gpu-check-md, from scripts/gpu-check.sh --out in the same run), else measured with the
#     machine's PyTorch (a 4 GiB device-to-device copy, best of 10, read + write counted).
# --out        report (default $OUT/gpu-serve-check.md where $OUT is set, else build-bundle/); a log
#              beside it (.log)
# --work       where packages go (default: the first of /dev/shm, /tmp, build-serve-check with room
#              for ~35 GB); removed at the end unless --keep
# --budget     seconds for the whole run (default 360); every wait is bounded by what is left, so
#              the run ends within about budget + 15 s
# --skip-gpu   everything on the CPU, for checking this script without a GPU: (a) compares two CPU
#              runs, (b) uses a --layers (default 1) deep package and short benchmark runs
# Exit status: 0 all stages passed and both targets met, 3 stages passed but a target was missed,
# 1 a stage failed (the report says which and why), 2 bad arguments.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bundle=$root/build-bundle/bundle
out="" work="" budget=360 copy_bw="" gpu_check_md="" skip_gpu=0 layers="" keep=0
NEAR_TIE=0.1 # logprob gap (= logit gap) under which bf16 GPU and f32-accumulating CPU may swap the top token

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 2; }
while (($#)); do
  case "$1" in
    --bundle) bundle=$(realpath -m "$2"); shift 2 ;;
    --out) out=$(realpath -m "$2"); shift 2 ;;
    --work) work=$(realpath -m "$2"); shift 2 ;;
    --budget) budget=$2; shift 2 ;;
    --copy-bw) copy_bw=$2; shift 2 ;;
    --gpu-check-md) gpu_check_md=$2; shift 2 ;;
    --skip-gpu) skip_gpu=1; shift ;;
    --layers) layers=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    -h|--help) usage ;;
    *) echo "gpu-serve-check: unknown argument '$1'" >&2; usage ;;
  esac
done
if [ -z "$out" ]; then
  if [ -n "${OUT:-}" ]; then out=$OUT/gpu-serve-check.md; else out=$root/build-bundle/gpu-serve-check.md; fi
fi
mkdir -p "$(dirname "$out")"
logf=${out%.md}.log
: >"$logf"
t0=$(date +%s)
if ((skip_gpu)); then
  layers=${layers:-1}; c_hi=2; n_lo=2; n_hi=4; w_lo=0; w_hi=0; in_len=16; out_len=4
else
  layers=${layers:-32}; c_hi=64; n_lo=8; n_hi=128; w_lo=2; w_hi=64; in_len=128; out_len=128
fi
SERVD_GPU_ARGS=${SERVD_GPU_ARGS:---max-seqs 64 --max-batch-tokens 2048}

# ---- bookkeeping: every stage appends a row; the report is written however the run ends ---------
rows=()
failed=0
targets_missed=0
machine="(not read)"
perf_md=""
row() { rows+=("| $1 | $2 | $3 |"); write_report; } # written as it goes: a killed run leaves its rows
log() { printf '[%4ds] %s\n' $(($(date +%s) - t0)) "$*" | tee -a "$logf" >&2; }
left() { echo $((budget - ($(date +%s) - t0))); }
tmo() { local l; l=$(($(left) - 10)); ((l < $1)) && echo $((l > 1 ? l : 1)) || echo "$1"; }
stage_fail() { row "$1" "**FAIL**" "$2"; log "FAIL $1: $2"; failed=1; }
servd_pids=()
write_report() {
  {
    echo "# servd end-to-end GPU check, $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo
    echo "Machine: $machine. Bundle: $(sed -n 1p "$bundle/BUNDLE.txt" 2>/dev/null || echo none); $(sed -n 2p "$bundle/BUNDLE.txt" 2>/dev/null)."
    ((skip_gpu)) && echo && echo "**--skip-gpu: every servd ran on the CPU; no GPU figure below is a GPU's.**"
    echo
    echo "| stage | result | detail |"
    echo "|---|---|---|"
    printf '%s\n' "${rows[@]}"
    [ -n "$perf_md" ] && printf '\n%s\n' "$perf_md"
    echo
    echo "Run time $(($(date +%s) - t0)) s of a $budget s budget. Log: $(basename "$logf")."
  } >"$out"
}
cleanup() {
  for p in "${servd_pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  if ((!keep)) && [ -n "${W:-}" ] && [ -d "$W" ]; then rm -rf "$W"; fi
  write_report
}
trap cleanup EXIT
trap 'log "interrupted"; exit 1' INT TERM
abort() { stage_fail "$1" "$2"; exit 1; }
# run SECONDS CMD...: output in $o; 1 when it failed, with $rmsg saying how
run() {
  local t
  t=$(tmo "$1")
  shift
  o=$(timeout -k 5 "$t" "$@" 2>&1)
  local rc=$?
  ((rc == 0)) && return 0
  if ((rc == 124 || rc == 137)); then rmsg="stopped after $t s (its limit, or what was left of the budget)"; else rmsg="exit $rc"; fi
  rmsg="$rmsg: $(tail -3 <<<"$o" | tr '\n' ' ')"
  return 1
}

# ---- servd helpers ----------------------------------------------------------------------------
# start_servd NAME READY_TIMEOUT ARGS... -> $port, $pid; 1 with $why on failure (log tail included)
start_servd() {
  local name=$1 rt
  rt=$(tmo "$2")
  shift 2
  # the machine's environment stays (LD_LIBRARY_PATH may be how its driver is found); the embedded
  # Python ignores PYTHON* variables
  "$B/bin/servd-env" servd --host 127.0.0.1 --port 0 "$@" >"$W/$name.out" 2>"$W/$name.err" &
  pid=$!
  servd_pids+=("$pid")
  port=""
  local deadline=$(($(date +%s) + $(tmo 30)))
  while [ -z "$port" ]; do
    port=$(awk '/^servd: port /{ print $3; exit }' "$W/$name.out")
    [ -n "$port" ] && break
    if ! kill -0 "$pid" 2>/dev/null; then why="servd exited while starting: $(tail -5 "$W/$name.err" | tr '\n' ' ')"; start_failed "$name"; return 1; fi
    if (($(date +%s) >= deadline)); then why="no port printed within 30 s: $(tail -5 "$W/$name.err" | tr '\n' ' ')"; start_failed "$name"; return 1; fi
    sleep 0.2
  done
  deadline=$(($(date +%s) + rt))
  while :; do
    [ "$(http_code "http://127.0.0.1:$port/v2/health/ready")" = 200 ] && break
    if ! kill -0 "$pid" 2>/dev/null; then why="servd exited while loading: $(tail -5 "$W/$name.err" | tr '\n' ' ')"; start_failed "$name"; return 1; fi
    if (($(date +%s) >= deadline)); then why="not ready within $rt s: $(tail -5 "$W/$name.err" | tr '\n' ' ')"; start_failed "$name"; return 1; fi
    sleep 0.5
  done
  log "$name: servd ready on port $port ($(grep -m1 'backend:' "$W/$name.err" | sed 's/^servd: //'))"
  return 0
}
start_failed() { # a servd that did not come up must not hold the GPU for the next stage
  kill -9 "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  { echo "---- $1 servd stderr (did not start)"; cat "$W/$1.err"; } >>"$logf"
  pid=""
}
stop_servd() { # pid name: SIGTERM, up to 30 s (less when the budget is short, at least 5), then SIGKILL
  local p=$1 n
  n=$(tmo 30); ((n < 5)) && n=5
  kill -TERM "$p" 2>/dev/null
  for _ in $(seq $((n * 2))); do kill -0 "$p" 2>/dev/null || break; sleep 0.5; done
  if kill -0 "$p" 2>/dev/null; then log "$2: servd ignored SIGTERM for $n s: killed"; kill -9 "$p"; fi
  wait "$p" 2>/dev/null
  { echo "---- $2 servd stderr"; cat "$W/$2.err"; } >>"$logf"
}
# http_code URL [BODY OUTFILE TIMEOUT]: prints the HTTP status (000 when none); curl where the machine
# has it, else Python's urllib
http_code() {
  if command -v curl >/dev/null; then
    if (($# > 1)); then
      curl -s -o "$3" -w '%{http_code}' --max-time "$4" -H 'Content-Type: application/json' -d "$2" "$1" || true
    else
      curl -s -o /dev/null -w '%{http_code}' --max-time 5 "$1" || true
    fi
    return
  fi
  python3 - "$@" <<'PY'
import sys, urllib.request, urllib.error
url, body, out, t = (sys.argv[1:] + [None, None, "5"])[:4]
req = urllib.request.Request(url, data=body.encode() if body else None, headers={"Content-Type": "application/json"})
try:
    with urllib.request.urlopen(req, timeout=float(t)) as r:
        code, data = r.status, r.read()
except urllib.error.HTTPError as e:
    code, data = e.code, e.read()
except Exception:
    code, data = 0, b""
if out:
    open(out, "wb").write(data)
print(f"{code:03d}")
PY
}
on_gpu() { grep -q 'backend: CUDA' "$W/$1.err"; }
# greedy NAME MODEL -> $W/NAME.json; 1 with $why
greedy() {
  local code
  code=$(http_code "http://127.0.0.1:$port/v1/chat/completions" \
    '{"model":"'"$2"'","messages":[{"role":"user","content":"The capital of France is"}],"max_tokens":16,"temperature":0,"ignore_eos":true,"logprobs":true,"top_logprobs":2}' \
    "$W/$1.json" "$(tmo 120)")
  [ "$code" = 200 ] && return 0
  why="chat request answered ${code:-nothing}: $(head -c 300 "$W/$1.json" 2>/dev/null)"
  return 1
}

# ---- 0. environment ---------------------------------------------------------------------------
log "gpu-serve-check: bundle $bundle, report $out, budget $budget s"
B=$bundle
[ -x "$B/bin/servd-env" ] || abort "bundle" "$B/bin/servd-env missing: run scripts/gpu-bundle.sh (and carry its --out folder)"
for t in python3 awk timeout df; do command -v $t >/dev/null || abort "environment" "$t is not installed"; done
if ((skip_gpu)); then
  machine="$(uname -n), CPU only (--skip-gpu), $(nproc) cores"
else
  command -v nvidia-smi >/dev/null || abort "environment" "nvidia-smi not found: no NVIDIA driver here (use --skip-gpu to check the script on the CPU)"
  smi=$(timeout 20 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1) ||
    abort "environment" "nvidia-smi failed: $smi"
  machine="$(head -1 <<<"$smi" | sed 's/, / \/ /g') (nvidia-smi: name / memory / driver), $(nproc) CPU cores"
fi
log "machine: $machine"
if ! chk=$(timeout "$(tmo 60)" "$B/bin/servd-env" --check 2>&1); then
  abort "bundle" "servd-env --check: $(tr '\n' ' ' <<<"$chk")"
fi
cuda_linked=$(sed -n 's/^cuda backend linked: //p' "$B/BUNDLE.txt")
if ((!skip_gpu)) && [ "$cuda_linked" != yes ]; then
  abort "bundle" "the bundle's servd was built without CUDA (BUNDLE.txt: cuda backend linked: ${cuda_linked:-?}); make it from a -DSERVD_CUDA=ON build"
fi
cuda_libs=$(grep -E 'libcudart|libcublas\.|libnccl' <<<"$chk" | awk '{ print $3 }' | tr '\n' ' ')
row "bundle" "ok" "$(grep -m1 '^size:' "$B/BUNDLE.txt"); servd-env --check found every library; CUDA libraries: ${cuda_libs:-none (servd built without CUDA)}"

# work folder: ~2 x 16 GB for the 8B shape (the Hugging Face folder until packed, and the package)
need_gb=$(( (layers * 437 + 2200) * 2 / 1000 + 4 ))
if [ -z "$work" ]; then
  for d in /dev/shm /tmp "$root/build-serve-check"; do
    mkdir -p "$d" 2>/dev/null || continue
    avail=$(df -Pk "$d" | awk 'NR == 2 { print int($4 / 1048576) }')
    if ((avail >= need_gb)); then work=$d; break; fi
  done
  [ -n "$work" ] || abort "environment" "no folder with $need_gb GB free among /dev/shm, /tmp, build-serve-check (use --work)"
fi
W=$(mktemp -d "$work/servd-serve-check.XXXXXX") || abort "environment" "cannot create a folder in $work"
log "work folder $W (needs about $need_gb GB)"

# ---- copy bandwidth, the anchor of the 85% target: measured now, while the GPU is idle --------------
bw_src=""
if [ -n "$copy_bw" ]; then
  bw_src="given with --copy-bw"
elif [ -n "$gpu_check_md" ]; then
  copy_bw=$(sed -n 's/.*Device copy (read + write): \([0-9.]*\) TB\/s.*/\1/p' "$gpu_check_md" 2>/dev/null | head -1)
  [ -n "$copy_bw" ] && bw_src="gpu_check ($(basename "$gpu_check_md"))"
fi
if [ -z "$copy_bw" ] && ((!skip_gpu)); then
  for py in /opt/torch/.venv/bin/python3 python3; do
    command -v "$py" >/dev/null || continue
    copy_bw=$(timeout "$(tmo 90)" "$py" - 2>>"$logf" <<'PY'
import time, torch
n = 4 << 30
a = torch.empty(n, dtype=torch.uint8, device="cuda")
b = torch.empty_like(a)
b.copy_(a); torch.cuda.synchronize()
best = 1e9
for _ in range(10):
    t = time.perf_counter(); b.copy_(a); torch.cuda.synchronize(); best = min(best, time.perf_counter() - t)
print(f"{2 * n / best / 1e12:.3f}")
PY
) && [ -n "$copy_bw" ] && { bw_src="PyTorch device copy, 4 GiB, best of 10 ($py)"; break; }
    copy_bw=""
  done
  [ -n "$copy_bw" ] || log "no copy bandwidth: PyTorch's device copy failed (see the log); the 85% figure will be UNKNOWN"
fi
[ -n "$copy_bw" ] && log "copy bandwidth $copy_bw TB/s ($bw_src)"

# ---- (a) greedy tokens: CPU vs GPU --------------------------------------------------------------
a_stage="(a) greedy tokens, GPU vs CPU"
if ! run 120 "$B/bin/servd-env" modelpkg synth 200mb --seed 7 -o "$W/small.mpk" --quiet; then
  stage_fail "$a_stage" "modelpkg synth 200mb failed: $rmsg"
else
  a_ok=1
  if start_servd cpu 180 --model "$W/small.mpk:small"; then
    greedy cpu small || { a_ok=0; stage_fail "$a_stage" "CPU: $why"; }
    stop_servd "$pid" cpu
  else
    a_ok=0; stage_fail "$a_stage" "CPU servd: $why"
  fi
  if ((a_ok)); then
    gpu_args=(--gpus 1); ((skip_gpu)) && gpu_args=()
    if start_servd gpu-small 180 "${gpu_args[@]}" --model "$W/small.mpk:small"; then
      if ((!skip_gpu)) && ! on_gpu gpu-small; then a_ok=0; stage_fail "$a_stage" "servd --gpus 1 did not report the CUDA backend"; fi
      greedy gpu-small small || { a_ok=0; stage_fail "$a_stage" "GPU: $why"; }
      stop_servd "$pid" gpu-small
    else
      a_ok=0; stage_fail "$a_stage" "servd --gpus 1: $why"
    fi
  fi
  if ((a_ok)); then
    if res=$(python3 - "$W/cpu.json" "$W/gpu-small.json" "$NEAR_TIE" 2>&1 <<'PY'
import json, sys
cpu, gpu = (json.load(open(p)) for p in sys.argv[1:3])
tie = float(sys.argv[3])
def toks(r):
    lp = r["choices"][0].get("logprobs") or {}
    return lp.get("content") or []
c, g = toks(cpu), toks(gpu)
if len(c) != 16 or len(g) != 16:
    print(f"expected 16 tokens with logprobs, got CPU {len(c)}, GPU {len(g)}")
    sys.exit(1)
key = lambda e: bytes(e.get("bytes") or e["token"].encode())
same = 0
while same < 16 and key(c[same]) == key(g[same]):
    same += 1
if same == 16:
    print("16 of 16 identical")
    sys.exit(0)
top = c[same].get("top_logprobs") or []
gap = top[0]["logprob"] - top[1]["logprob"] if len(top) >= 2 else float("inf")
msg = (f"{same} of 16 identical; first difference at position {same}: CPU {key(c[same])!r}, GPU {key(g[same])!r}, "
       f"CPU top-2 logprob gap {gap:.4f}")
if gap < tie:
    print(msg + f" < {tie}: a near tie (bf16 rounding), accepted")
    sys.exit(0)
print(msg + f" >= {tie}: not a near tie")
sys.exit(1)
PY
    ); then
      row "$a_stage" "PASS" "synth 200mb (12 layers, head_dim 64, bf16), 16 tokens: $res"
      log "(a) $res"
    else
      stage_fail "$a_stage" "$res"
    fi
  fi
fi

# ---- (b) Llama-3.1-8B-shaped package, served on the GPU, loaded by servd-bench -------------------
b_stage="(b) Llama-3.1-8B-shaped package"
mk_start=$(date +%s)
b_ok=1
if ! run 60 "$B/bin/servd-env" modelpkg synth tiny --hf-out "$W/tiny-hf" --quiet; then
  b_ok=0; stage_fail "$b_stage" "modelpkg synth tiny --hf-out (tokenizer template) failed: $rmsg"
fi
# Writes the Hugging Face folder: tiny's tokenizer widened to 128256 ids with reserved filler tokens
# (as modelpkg synth does for large vocabularies), the Llama-3.1-8B config, and bf16 weights that
# repeat a seeded random block (uniform, scaled like modelpkg synth's: std 0.02 embeddings, 1/sqrt(fan-in)
# projections, unit norms); 4 shards written in parallel.
if ((b_ok)) && ! run 240 python3 - "$W/tiny-hf" "$W/big-hf" "$layers" <<'PY'
import json, math, os, random, struct, sys
from array import array
import multiprocessing

src, dst, layers = sys.argv[1], sys.argv[2], int(sys.argv[3])
V, H, I, NH, NKV, HD = 128256, 4096, 14336, 32, 8, 128
os.makedirs(dst, exist_ok=True)
cfg = json.load(open(os.path.join(src, "config.json")))
for k in [k for k in cfg if k.startswith("servd_synth")]:
    del cfg[k]
cfg.update(vocab_size=V, hidden_size=H, intermediate_size=I, num_hidden_layers=layers, num_attention_heads=NH,
           num_key_value_heads=NKV, head_dim=HD, max_position_embeddings=131072, rms_norm_eps=1e-5,
           rope_theta=500000.0, tie_word_embeddings=False, torch_dtype="bfloat16",
           rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192})
json.dump(cfg, open(os.path.join(dst, "config.json"), "w"), indent=2)
tok = json.load(open(os.path.join(src, "tokenizer.json")))
vocab = tok["model"]["vocab"]
for i in range(len(vocab), V):
    vocab[f"<|reserved_{i}|>"] = i
assert len(vocab) == V and max(vocab.values()) == V - 1
json.dump(tok, open(os.path.join(dst, "tokenizer.json"), "w"))
for f in ("tokenizer_config.json", "generation_config.json"):
    with open(os.path.join(src, f)) as a, open(os.path.join(dst, f), "w") as b:
        b.write(a.read())

tensors = [("model.embed_tokens.weight", (V, H), 0.02 * math.sqrt(3)), ("model.norm.weight", (H,), 0),
           ("lm_head.weight", (V, H), 1 / math.sqrt(H))]
for l in range(layers):
    p = f"model.layers.{l}."
    s, si = 1 / math.sqrt(H), 1 / math.sqrt(I)
    tensors += [(p + "input_layernorm.weight", (H,), 0), (p + "post_attention_layernorm.weight", (H,), 0),
                (p + "self_attn.q_proj.weight", (NH * HD, H), s), (p + "self_attn.k_proj.weight", (NKV * HD, H), s),
                (p + "self_attn.v_proj.weight", (NKV * HD, H), s), (p + "self_attn.o_proj.weight", (H, NH * HD), s),
                (p + "mlp.gate_proj.weight", (I, H), s), (p + "mlp.up_proj.weight", (I, H), s),
                (p + "mlp.down_proj.weight", (H, I), si)]
tensors.sort()
nbytes = lambda t: math.prod(t[1]) * (4 if t[2] == 0 else 2)
shards = 4
order = sorted(range(len(tensors)), key=lambda i: -nbytes(tensors[i]))
load, assign = [0] * shards, [[] for _ in range(shards)]
for i in order:  # largest first onto the lightest shard
    k = load.index(min(load))
    assign[k].append(i)
    load[k] += nbytes(tensors[i])

BLOCK = 262147  # values; prime, so rows of 4096 or 14336 do not repeat in step with it
def block(scale, seed):
    r = random.Random(seed)
    f = array("f", (r.uniform(-scale, scale) for _ in range(BLOCK)))
    h = array("H")
    h.frombytes(f.tobytes())
    return h[1::2].tobytes() if sys.byteorder == "little" else h[0::2].tobytes()  # bf16: top half of f32

def write_shard(k):
    names = sorted(assign[k])
    hdr, off = {"__metadata__": {"format": "pt"}}, 0
    for i in names:
        n, shape, scale = tensors[i]
        hdr[n] = {"dtype": "F32" if scale == 0 else "BF16", "shape": list(shape), "data_offsets": [off, off + nbytes(tensors[i])]}
        off += nbytes(tensors[i])
    js = json.dumps(hdr, separators=(",", ":")).encode()
    js += b" " * (-len(js) % 8)
    blocks = {}
    with open(os.path.join(dst, f"model-{k + 1:05d}-of-{shards:05d}.safetensors"), "wb", buffering=0) as f:
        f.write(struct.pack("<Q", len(js)) + js)
        for i in names:
            n, shape, scale = tensors[i]
            left = nbytes(tensors[i])
            if scale == 0:
                f.write(array("f", [1.0]).tobytes() * math.prod(shape))
                continue
            if scale not in blocks:
                blocks[scale] = block(scale, 1000 + int(scale * 1e6)) * 32  # ~16 MiB per write
            b = memoryview(blocks[scale])
            while left:
                left -= f.write(b[:min(left, len(b))])  # unbuffered: may write less than asked

procs = [multiprocessing.get_context("fork").Process(target=write_shard, args=(k,)) for k in range(shards)]
for p in procs:
    p.start()
for p in procs:
    p.join()
if any(p.exitcode for p in procs):
    sys.exit("writing a shard failed")
wmap = {tensors[i][0]: f"model-{k + 1:05d}-of-{shards:05d}.safetensors" for k in range(shards) for i in assign[k]}
json.dump({"metadata": {"total_size": sum(load)}, "weight_map": wmap},
          open(os.path.join(dst, "model.safetensors.index.json"), "w"), indent=2)
# weight bytes one decode step reads: every matrix but the embedding table (one row of it) and the norms
print(sum(nbytes(t) for t in tensors if t[2] != 0 and t[0] != "model.embed_tokens.weight"))
PY
then
  b_ok=0; stage_fail "$b_stage" "writing the Hugging Face folder failed: $rmsg"
fi
wbytes=0
if ((b_ok)); then
  wbytes=$(tail -1 <<<"$o")
  log "(b) Hugging Face folder written in $(($(date +%s) - mk_start)) s; $wbytes weight bytes per decode step"
  if ! run 300 "$B/bin/servd-env" modelpkg pack "$W/big-hf" -o "$W/big.mpk" --dtype bf16 --name llama8b-shape --quiet; then
    b_ok=0; stage_fail "$b_stage" "modelpkg pack failed: $rmsg"
  fi
  rm -rf "$W/big-hf"
fi
if ((b_ok)); then
  pkg_gb=$(awk -v b="$(stat -c %s "$W/big.mpk")" 'BEGIN { printf "%.2f", b / 1e9 }')
  row "$b_stage" "ok" "$layers layers, vocab 128256, hidden 4096, intermediate 14336, 32/8 heads, bf16: $pkg_gb GB package made in $(($(date +%s) - mk_start)) s"
  log "(b) package $W/big.mpk: $pkg_gb GB"
  read -ra gpu_args <<<"$SERVD_GPU_ARGS"
  ((skip_gpu)) || gpu_args=(--gpus 1 "${gpu_args[@]}")
  load_start=$(date +%s)
  if ! start_servd gpu-big 300 "${gpu_args[@]}" --model "$W/big.mpk:llama8b"; then
    b_ok=0; stage_fail "(b) servd --gpus 1 on the 8B shape" "$why"
  elif ((!skip_gpu)) && ! on_gpu gpu-big; then
    b_ok=0; stage_fail "(b) servd --gpus 1 on the 8B shape" "servd did not report the CUDA backend"
  else
    mem=""
    ((skip_gpu)) || mem=$(timeout 20 nvidia-smi --query-gpu=memory.used --format=csv,noheader 2>&1 | head -1)
    row "(b) servd --gpus 1 on the 8B shape" "ok" "ready in $(($(date +%s) - load_start)) s; $(grep -m1 'backend:' "$W/gpu-big.err" | sed 's/^servd: //')${mem:+; GPU memory used $mem}"
    for c in 1 "$c_hi"; do
      n=$n_lo w=$w_lo
      [ "$c" = 1 ] || { n=$n_hi; w=$w_hi; }
      log "(b) servd-bench: concurrency $c, $n requests (+$w warm-up), $in_len tokens in, $out_len out"
      # SIGINT at the end of the budget: servd-bench then reports what finished (marked interrupted)
      t=$(tmo 200)
      o=$(timeout -s INT -k 15 "$t" "$B/bin/servd-env" servd-bench --url "http://127.0.0.1:$port" --model llama8b \
            --concurrency "$c" --num-requests "$n" --warmup "$w" --input-len "$in_len" --output-len "$out_len" \
            --seed 1 --timeout 150 --json "$W/bench-c$c.json" --quiet 2>&1)
      rc=$?
      if ((rc)) && ! python3 -c 'import json, sys; sys.exit(json.load(open(sys.argv[1]))["results"]["completed"] < 1)' \
          "$W/bench-c$c.json" 2>/dev/null; then
        b_ok=0
        stage_fail "(b) servd-bench concurrency $c" "exit $rc$( ((rc == 124)) && echo " (stopped after $t s: time budget)"): $(tail -3 <<<"$o" | tr '\n' ' ')"
        break
      fi
      ((rc)) && log "(b) servd-bench concurrency $c stopped by the time budget after $t s; its partial results are used"
      cp "$W/bench-c$c.json" "$(dirname "$out")/gpu-serve-bench-c$c.json" 2>/dev/null
    done
  fi
  [ -n "${pid:-}" ] && stop_servd "$pid" gpu-big
fi

# ---- (b') when servd died of a fatal signal on the 8B shape: which part of the step brings it -----
# Each variant loads the same package again and runs a few requests: CUDA from the rank threads
# (SERVD_DEVICE_EXECUTOR=0: whether the device executors are what keeps the driver alive), no cuBLAS in any step (token
# budget 8: every matmul is a GEMV), the first GEMV kernel and no fused kernels, no CUDA graphs. The
# crash report's thread, rip and code bytes go into the report.
crash_summary() { # NAME: the fatal-signal lines of its stderr, on one line ('|' escaped for the table)
  {
    grep -A3 -m1 'fatal signal' "$W/$1.err" | head -4
    grep -m1 '^  thread ' "$W/$1.err"
    grep -m1 '    rip ' "$W/$1.err"
    grep -m1 'code at rip' "$W/$1.err"
  } | tr '\n' ' ' | sed 's/|/\\|/g'
}
if ((!b_ok)) && [ -f "$W/gpu-big.err" ] && grep -q 'fatal signal' "$W/gpu-big.err" && [ -f "$W/big.mpk" ]; then
  row "(b') the crash" "report" "$(crash_summary gpu-big | cut -c1-900)"
  read -ra base_args <<<"$SERVD_GPU_ARGS"
  for variant in "no-executor" "no-cublas" "plain-kernels" "no-graphs"; do
    (($(left) < 60)) && { log "(b') $variant: skipped, $(left) s of the budget left"; continue; }
    vargs=("${base_args[@]}")
    ((skip_gpu)) || vargs=(--gpus 1 "${vargs[@]}")
    venv=()
    case $variant in
      no-cublas) vargs+=(--max-batch-tokens 8 --max-seqs 8) ;;
      no-executor) venv=(SERVD_DEVICE_EXECUTOR=0) ;; # CUDA from the rank threads, as before the executors
      plain-kernels) venv=(SERVD_GEMV_TUNE=0 SERVD_FUSED=0) ;;
      no-graphs) vargs+=(--cuda-graphs off) ;;
    esac
    for e in "${venv[@]}"; do export "${e?}"; done
    if ! start_servd "diag-$variant" 240 "${vargs[@]}" --model "$W/big.mpk:llama8b"; then
      row "(b') $variant" "FAIL" "did not start: $why"
    else
      t=$(tmo 60)
      o=$(timeout -s INT -k 10 "$t" "$B/bin/servd-env" servd-bench --url "http://127.0.0.1:$port" --model llama8b \
            --concurrency 2 --num-requests 6 --warmup 1 --input-len "$in_len" --output-len 32 --seed 2 --timeout 60 \
            --quiet 2>&1)
      rc=$?
      sleep 1
      if grep -q 'fatal signal' "$W/diag-$variant.err"; then
        row "(b') $variant" "CRASH" "$(crash_summary "diag-$variant" | cut -c1-700)"
      elif ((rc)); then
        row "(b') $variant" "FAIL" "servd-bench exit $rc: $(tail -2 <<<"$o" | tr '\n' ' ')"
      else
        row "(b') $variant" "ok" "6 requests served without a crash"
      fi
      [ -n "${pid:-}" ] && stop_servd "$pid" "diag-$variant"
    fi
    for e in "${venv[@]}"; do unset "${e%%=*}"; done
  done
fi

# ---- (c) the report ----------------------------------------------------------------------------
if ((b_ok)); then
  res=$(python3 - "$W/bench-c1.json" "$W/bench-c$c_hi.json" "$c_hi" "$wbytes" "${copy_bw:-0}" "$bw_src" 2>&1 <<'PY'
import json, sys
lo, hi = (json.load(open(p))["results"] for p in sys.argv[1:3])
c_hi, wbytes, bw, bw_src = int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]) * 1e12, sys.argv[6]
bad = [f"concurrency {c}: {r['failed']} of {r['failed'] + r['completed']} requests failed ({r['first_error']})"
       for c, r in ((1, lo), (c_hi, hi)) if r["failed"] or not r["completed"]]
if bad:
    print("; ".join(bad))
    sys.exit(1)
def dec(r, c):  # decode tokens/s: concurrent streams x 1 / median time per output token
    return c * 1000.0 / r["tpot_ms"]["median"] if r["tpot_ms"]["median"] > 0 else 0.0
d1, dh = dec(lo, 1), dec(hi, c_hi)
out = ["| concurrency | requests | decode tokens/s | output tokens/s | TTFT median ms | TTFT p90 ms | TPOT median ms |",
       "|---|---|---|---|---|---|---|"]
for c, r, d in ((1, lo, d1), (c_hi, hi, dh)):
    out.append(f"| {c} | {r['completed']}{' (interrupted by the time budget)' if r['interrupted'] else ''} | {d:.1f} | {r['output_tokens_per_s']:.1f} | {r['ttft_ms']['median']:.1f} | "
               f"{r['ttft_ms']['p90']:.1f} | {r['tpot_ms']['median']:.2f} |")
ratio = dh / d1 if d1 else 0.0
missed = 0
out += ["", "Decode tokens/s = concurrency x 1000 / median TPOT (time per output token after the first); "
        "output tokens/s = servd-bench's end-to-end throughput, prefill included.", "",
        "| figure | value | target | result |", "|---|---|---|---|"]
ok = ratio >= 10
missed += not ok
out.append(f"| batch {c_hi} / batch 1 decode tokens/s | {ratio:.1f}x | 10x | {'met' if ok else 'MISSED'} |")
if bw > 0:
    frac = d1 * wbytes / bw
    ok = frac >= 0.85
    missed += not ok
    out.append(f"| batch-1 weight streaming: {d1:.1f} tokens/s x {wbytes / 1e9:.2f} GB / {bw / 1e12:.2f} TB/s copy "
               f"bandwidth ({bw_src}) | {100 * frac:.0f}% | 85% | {'met' if ok else 'MISSED'} |")
else:
    missed += 1
    out.append(f"| batch-1 weight streaming ({d1:.1f} tokens/s x {wbytes / 1e9:.2f} GB) | no copy bandwidth measured | 85% | UNKNOWN |")
print("\n".join(out))
sys.exit(3 if missed else 0)
PY
  )
  rc=$?
  if [ $rc = 0 ]; then
    perf_md="## Decode speed, Llama-3.1-8B shape (bf16, synthesized weights), $in_len tokens in, $out_len out"$'\n\n'"$res"
    row "(c) report" "ok" "both targets met"
  elif [ $rc = 3 ]; then
    perf_md="## Decode speed, Llama-3.1-8B shape (bf16, synthesized weights), $in_len tokens in, $out_len out"$'\n\n'"$res"
    row "(c) report" "ok" "a target was missed (below)"
    targets_missed=1
  else
    stage_fail "(c) report" "$res"
  fi
fi
log "report: $out"
if ((failed)); then exit 1; fi
if ((targets_missed)); then exit 3; fi
exit 0
