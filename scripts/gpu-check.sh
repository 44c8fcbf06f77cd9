#!/usr/bin/env bash
# Builds the CUDA backend, the device layer, the CPU kernels and the GPU checks from source with nvcc
# and gcc alone (the GPU machine may lack CMake's dependencies and Debian's packages), then runs
# gpu_check (the CUDA launchers, a Llama-shaped model, speed) and device_check (servd/device.h).
#   scripts/gpu-check.sh [--quick] [--out FILE.md]
# --quick and --out go to gpu_check; device_check's lines are appended to the same report.
# Exit status: 0 all passed, 1 a check failed (or the build did), 77 skipped: no GPU visible.
# Finds cuBLAS and NCCL in the CUDA toolkit or in the nvidia-* Python wheels of the machine.
set -euo pipefail
out=
prev=
for a in "$@"; do
  [ "$prev" = --out ] && out=$a
  prev=$a
done
cd "$(dirname "$0")/.."
build=${SERVD_GPU_BUILD:-build-gpu}
mkdir -p "$build"
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
cuda_root=$(cd "$(dirname "$NVCC")/.." && pwd)

dirs=("$cuda_root" "$cuda_root/targets/x86_64-linux")
for py in python3 /opt/torch/.venv/bin/python3; do
  extra=$($py - 2>/dev/null <<'PY' || true
import os
try:
    import nvidia
    for p in nvidia.__path__:
        for n in sorted(os.listdir(p)):
            print(os.path.join(p, n))
            print(os.path.join(p, n, "cu13"))
except Exception:
    pass
PY
)
  for d in $extra; do dirs+=("$d"); done
done
incs=()
libs=()
have() { # header, library stem
  for d in "${dirs[@]}"; do
    if [ -f "$d/include/$1" ]; then
      incs+=(-I"$d/include")
      for l in lib lib64; do
        if ls "$d/$l/lib$2".so* >/dev/null 2>&1; then
          [ -e "$d/$l/lib$2.so" ] || ln -sf "$(ls "$d/$l/lib$2".so.* | head -1)" "$build/lib$2.so"
          libs+=(-L"$d/$l" -L"$build" -Xlinker -rpath="$d/$l")
        fi
      done
      return 0
    fi
  done
  echo "gpu-check: $1 not found in: ${dirs[*]}" >&2
  return 1
}
have cuda_runtime_api.h cudart
have cublas_v2.h cublas
have nccl.h nccl

cflags=(-std=c11 -D_GNU_SOURCE -O3 -g -Wall -Wextra -fPIC -Ikernels/include -Ikernels/src)
objs=()
for f in kernels/src/*.c; do
  isa=()
  case "$f" in
    *_avx2.c) isa=(-mavx2 -mfma -mf16c) ;;
    *_avx512vnni.c) isa=(-mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni) ;;
    *_avx512bf16.c) isa=(-mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512bf16) ;;
    *_avx512.c) isa=(-mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -mavx512dq) ;;
  esac
  o="$build/$(basename "$f" .c).o"
  gcc "${cflags[@]}" "${isa[@]}" -c "$f" -o "$o" &
  objs+=("$o")
done
gpu_objs=()
dev_objs=()
for f in tests/gpu/*.c; do
  o="$build/$(basename "$f" .c).o"
  gcc "${cflags[@]}" -c "$f" -o "$o" &
  case "$(basename "$f")" in
    device_check*) dev_objs+=("$o") ;;
    *) gpu_objs+=("$o") ;;
  esac
done
# the device layer over CUDA (device_none.c is the build without CUDA)
for f in kernels/device/device_*.c; do
  [ "$(basename "$f")" = device_none.c ] && continue
  o="$build/$(basename "$f" .c).o"
  gcc "${cflags[@]}" -DSERVD_DEVICE_CUDA -Ikernels/device "${incs[@]}" -c "$f" -o "$o" &
  objs+=("$o")
done
for f in kernels/cuda/*.cu; do
  o="$build/cuda_$(basename "$f" .cu).o"
  "$NVCC" -O3 --use_fast_math -std=c++17 -gencode arch=compute_90,code=sm_90 -gencode arch=compute_80,code=sm_80 \
    -Ikernels/include "${incs[@]}" -c "$f" -o "$o" &
  objs+=("$o")
done
# wait for every compile and fail on any
status=0
for job in $(jobs -p); do wait "$job" || status=1; done
[ $status = 0 ] || { echo "gpu-check: compile failed" >&2; exit 1; }
"$NVCC" -o "$build/gpu_check" "${gpu_objs[@]}" "${objs[@]}" "${libs[@]}" -lcublas -lnccl -lpthread -lm
"$NVCC" -o "$build/device_check" "${dev_objs[@]}" "${objs[@]}" "${libs[@]}" -lcublas -lnccl -lpthread -lm

# device_check first: it is short, and its lines are out even if gpu_check is stopped. Exit 77 from
# a check is "skipped" (no GPU), not a failure.
# device_check runs twice: through the device executors (every CUDA call on one native thread per
# GPU, the default) and with SERVD_DEVICE_EXECUTOR=0 (calls on the caller's threads), the A/B.
rc_dev=0 rc_direct=0
"$build/device_check" 2>&1 | tee "$build/device_check.txt" || rc_dev=$?
SERVD_DEVICE_EXECUTOR=0 "$build/device_check" >"$build/device_check_direct.txt" 2>&1 || rc_direct=$?
echo "device_check with SERVD_DEVICE_EXECUTOR=0: exit $rc_direct"
((rc_dev == 0 && rc_direct != 0 && rc_direct != 77)) && rc_dev=$rc_direct # either way must pass
rc_gpu=0
"$build/gpu_check" "$@" || rc_gpu=$?
if [ -n "$out" ]; then # gpu_check wrote the report (when it ran); the device lines follow
  { printf '\n## Device layer (servd/device.h): device_check, exit %s\n\n```\n' "$rc_dev"
    cat "$build/device_check.txt"
    printf '```\n\nThe same with SERVD_DEVICE_EXECUTOR=0 (direct calls): exit %s\n\n```\n' "$rc_direct"
    tail -5 "$build/device_check_direct.txt"
    printf '```\n'; } >>"$out"
fi
verdict() { case $1 in 0) echo passed ;; 77) echo "skipped (no GPU visible)" ;; *) echo "FAILED (exit $1)" ;; esac; }
echo "gpu-check: gpu_check $(verdict $rc_gpu), device_check $(verdict $rc_dev)"
for rc in $rc_gpu $rc_dev; do
  case $rc in 0 | 77) ;; *) exit 1 ;; esac
done
if [ $rc_gpu = 77 ] && [ $rc_dev = 77 ]; then exit 77; fi
if [ $rc_gpu = 0 ] && [ $rc_dev = 0 ]; then exit 0; fi
echo "gpu-check: one check skipped while the other ran: not a complete check" >&2
exit 1
