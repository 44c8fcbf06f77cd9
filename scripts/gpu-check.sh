#!/usr/bin/env bash
# Builds the CUDA backend, the CPU kernels and the GPU check from source with nvcc and gcc alone (the
# GPU machine may lack CMake's dependencies and Debian's packages), then runs the check.
#   scripts/gpu-check.sh [--quick] [--out FILE.md]
# Finds cuBLAS and NCCL in the CUDA toolkit or in the nvidia-* Python wheels of the machine.
set -euo pipefail
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
for f in tests/gpu/*.c; do
  o="$build/$(basename "$f" .c).o"
  gcc "${cflags[@]}" -c "$f" -o "$o" &
  objs+=("$o")
done
for f in kernels/cuda/*.cu; do
  o="$build/cuda_$(basename "$f" .cu).o"
  "$NVCC" -O3 --use_fast_math -std=c++17 -gencode arch=compute_90,code=sm_90 -gencode arch=compute_80,code=sm_80 \
    -Ikernels/include "${incs[@]}" -c "$f" -o "$o" &
  objs+=("$o")
done
wait
"$NVCC" -o "$build/gpu_check" "${objs[@]}" "${libs[@]}" -lcublas -lnccl -lpthread -lm
"$build/gpu_check" "$@"
