#!/usr/bin/env bash
# Builds llama.cpp's llama-bench, llama-server and llama-quantize from the llama.cpp sources vendored in the
# llama-cpp-python sdist, so the benchmark suite can compare servd with it on the same machine.
# Nothing here is committed: the sdist and the build live under .cache/llama-cpp/.
#
# Usage: scripts/bench/build-llama-cpp.sh [VERSION]
# Prints the directory holding the binaries on its last line (.cache/llama-cpp/bin).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cache="$root/.cache/llama-cpp"
ver=${1:-}
mkdir -p "$cache/sdist" "$cache/bin"

tools="llama-bench llama-server llama-quantize"
have=1
for b in $tools; do [ -x "$cache/bin/$b" ] || have=0; done
if [ "$have" = 1 ]; then
  echo "$cache/bin"
  exit 0
fi

pip=pip3
command -v "$pip" >/dev/null || pip="python3 -m pip"
spec=llama-cpp-python
[ -n "$ver" ] && spec="llama-cpp-python==$ver"
if ! ls "$cache"/sdist/llama_cpp_python-*.tar.gz >/dev/null 2>&1; then
  # Only llama-cpp-python itself as source: with :all: pip would also build its build backend and
  # every dependency of that from source just to read the metadata (tens of minutes).
  $pip download --no-deps --no-binary llama-cpp-python --dest "$cache/sdist" "$spec"
fi
tarball=$(ls "$cache"/sdist/llama_cpp_python-*.tar.gz | sort -V | tail -n 1)
src="$cache/src"
if [ ! -f "$src/.extracted" ]; then
  rm -rf "$src"; mkdir -p "$src"
  tar -xzf "$tarball" -C "$src" --strip-components=1
  touch "$src/.extracted"
fi
llama="$src/vendor/llama.cpp"
[ -f "$llama/CMakeLists.txt" ] || { echo "build-llama-cpp: no vendor/llama.cpp in $tarball" >&2; exit 1; }

jobs=$(nproc 2>/dev/null || echo 2)
cmake -S "$llama" -B "$cache/build" -DCMAKE_BUILD_TYPE=Release \
  -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF
cmake --build "$cache/build" --target $tools -j"$jobs"
for b in $tools; do
  f=$(find "$cache/build" -type f -name "$b" -perm -u+x | head -n 1)
  [ -n "$f" ] || { echo "build-llama-cpp: $b was not built" >&2; exit 1; }
  cp "$f" "$cache/bin/$b"
done
echo "$cache/bin"
