#!/usr/bin/env bash
# The main job on a fresh Debian 12 machine: install dependencies, build, fetch and pack the default
# model (SmolLM2-135M-Instruct, Q4_1), and serve it on http://127.0.0.1:${PORT:-8000}.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)"
pkg=$(./scripts/fetch-default-model.sh | tail -n 1)
exec ./build/daemon/servd --model "$pkg:smollm2" --host "${HOST:-127.0.0.1}" --port "${PORT:-8000}" "$@"
