#!/usr/bin/env bash
# Installs dependencies, builds servd and runs every test.
#   scripts/test.sh              release build in build/, all tests
#   scripts/test.sh --sanitize   ASan+UBSan build in build-asan/, unit tests only
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh

jobs=$(nproc)
if [ "${1:-}" = "--sanitize" ]; then
  cmake -S . -B build-asan -DSERVD_SANITIZE=ON -DSERVD_CUDA=OFF -DCMAKE_BUILD_TYPE=Debug
  cmake --build build-asan -j"$jobs"
  # Interpreters load libpython with dlmopen, which ASan cannot follow; their tests run in the
  # release build. Leaks are checked by valgrind-free LSan at exit of each unit test.
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir build-asan -L unit -LE no-sanitize --output-on-failure -j"$jobs"
else
  cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo
  cmake --build build -j"$jobs"
  ctest --test-dir build --output-on-failure -j"$jobs"
fi
