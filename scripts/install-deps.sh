#!/usr/bin/env bash
# Installs every build and test dependency of servd from Debian 12's packages, plus the test-only
# Python tools from PyPI into a virtual environment under .venv-test. Idempotent.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)

pkgs=(
  build-essential cmake pkg-config git ca-certificates
  clang libclang-rt-14-dev clang-format
  libuv1-dev libjansson-dev libarchive-dev libpcre2-dev libcmocka-dev libssl-dev
  libhttp-parser-dev libopenblas-dev libnghttp2-dev libprotobuf-c-dev protobuf-c-compiler
  libpython3.11-dev python3 python3-jinja2 python3-numpy python3-venv python3-pip python3-yaml
  prometheus curl gnuplot-nox linux-perf
  libzmq3-dev libmsgpack-dev
  libutf8proc-dev python3-scipy
)

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends "${missing[@]}"
fi

# Test-only tools (never used by servd at run time): the official openai client, Hugging Face
# tokenizers as the tokenizer oracle, gguf to read/write GGUF files in tests.
venv="$here/.venv-test"
if [ ! -x "$venv/bin/python" ]; then
  /usr/bin/python3 -m venv --system-site-packages "$venv"
fi
"$venv/bin/python" -c "import openai, tokenizers, gguf, sentencepiece" 2>/dev/null ||
  "$venv/bin/pip" install --quiet "openai>=1.0" "tokenizers>=0.15" "gguf>=0.6" "jsonschema" "sentencepiece"
# The official KServe/Triton clients (tests of the gRPC listener and of KServe over HTTP, binary
# tensors included) and grpc's health-checking stubs.
"$venv/bin/python" -c "import tritonclient.grpc, tritonclient.http, grpc_health.v1" 2>/dev/null ||
  "$venv/bin/pip" install --quiet "tritonclient[grpc,http]" "grpcio-health-checking"
# The agent and gateway frameworks users put in front of an OpenAI-compatible server.
"$venv/bin/python" -c "import langchain_openai, litellm" 2>/dev/null ||
  "$venv/bin/pip" install --quiet "langchain-openai>=0.3" "litellm>=1.60"

# The official Anthropic and Ollama clients (tests of /v1/messages and of Ollama's /api routes).
"$venv/bin/python" -c "import anthropic, ollama" 2>/dev/null ||
  "$venv/bin/pip" install --quiet "anthropic>=0.40" "ollama>=0.4"
# Cohere's client (its rerank call against /v1/rerank, test_rerank.py).
"$venv/bin/python" -c "import cohere" 2>/dev/null || "$venv/bin/pip" install --quiet "cohere>=5"

# Readers of what servd exports for Kubernetes serving stacks: the Prometheus text parser (the
# model-server protocol's metrics), a ZeroMQ + msgpack subscriber and CBOR for llm-d's block hashes
# (KV-cache events), OpenTelemetry's protobuf messages (an OTLP collector for the trace tests), and
# the Kubernetes schema validator with its bundled schemas (deploy/ checked offline).
"$venv/bin/python" -c "import prometheus_client, zmq, msgpack, cbor2, opentelemetry.proto, kubernetes_validate" \
  2>/dev/null || "$venv/bin/pip" install --quiet "prometheus_client" "pyzmq" "msgpack" "cbor2" "opentelemetry-proto" \
  "kubernetes-validate"

# Python packages servd's interpreters use at run time (llguidance: structured outputs), pinned,
# into the directory a build tree's servd puts on sys.path (build/python-deps).
"$here/scripts/install-python-deps.sh" "$here/build/python-deps"
