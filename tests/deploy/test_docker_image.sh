#!/bin/bash
# Builds deploy/Dockerfile from the repository root (a checkout that has built before: .dockerignore
# must keep build folders and caches out of the context), packs a GGUF file with the image's
# modelpkg, and checks that the image's default command serves the packages of its model folder.
# Skips (77) with the reason when docker (or its daemon) is unavailable.
#   test_docker_image.sh SOURCE_DIR WORK_DIR
set -u
src=$1
work=$2
skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }
command -v docker >/dev/null || skip "docker is not installed"
docker info >/dev/null 2>&1 || skip "the docker daemon is not reachable ($(docker info 2>&1 | grep -m1 -i error))"
py=$src/.venv-test/bin/python
[ -x "$py" ] && "$py" -c "import gguf" 2>/dev/null || skip "gguf-py (.venv-test) is missing: no GGUF file to pack"

tag=servd-test:$$
name=servd-test-$$
rm -rf "$work"
mkdir -p "$work/models"
chmod 0777 "$work/models" # the image runs as an unprivileged user
cleanup() { docker rm -f "$name" >/dev/null 2>&1; docker rmi -f "$tag" >/dev/null 2>&1; }
trap cleanup EXIT

# 1. The build, with the context size it sent.
DOCKER_BUILDKIT=1 docker build --progress=plain -f "$src/deploy/Dockerfile" -t "$tag" "$src" >"$work/build.log" 2>&1 ||
  fail "docker build failed: $(tail -n 30 "$work/build.log")"
ctx=$(grep -o 'transferring context: [0-9.]*[kMG]*B' "$work/build.log" | tail -n1 | grep -o '[0-9.]*[kMG]*B')
echo "build context: ${ctx:-unknown}"
case "$ctx" in *GB) fail "build context of $ctx: .dockerignore does not keep the build folders out" ;; esac
case "$ctx" in *MB) [ "${ctx%%.*}" -lt 100 ] || fail "build context of $ctx (expected the sources only)" ;; esac

# 2. A GGUF file packed by the image's modelpkg (it needs the model code under share/servd/models).
(cd "$src/tests/package_format" && "$py" -c "
import sys; sys.argv = ['x', '/bin/true']
import it_gguf_import as g
g.make_gguf('$work/models/tiny.gguf')") || fail "could not write a GGUF file"
chmod 0666 "$work/models/tiny.gguf"
docker run --rm -v "$work/models:/var/lib/servd/models" "$tag" \
  modelpkg pack /var/lib/servd/models/tiny.gguf -o /var/lib/servd/models/tiny.mpk --quiet >"$work/pack.log" 2>&1 ||
  fail "modelpkg pack in the image: $(cat "$work/pack.log")"
rm -f "$work/models/tiny.gguf"

# 3. The default command serves it under its file name.
docker run -d --name "$name" -p 127.0.0.1::8000 -v "$work/models:/var/lib/servd/models:ro" "$tag" >/dev/null ||
  fail "docker run failed"
port=$(docker port "$name" 8000/tcp | head -n1 | sed 's/.*://')
for _ in $(seq 1 120); do
  curl -fsS "http://127.0.0.1:$port/v2/health/ready" >/dev/null 2>&1 && break
  [ "$(docker inspect -f '{{.State.Running}}' "$name")" = true ] || fail "the container exited: $(docker logs "$name" 2>&1 | tail -n 20)"
  sleep 1
done
curl -fsS "http://127.0.0.1:$port/v2/health/ready" >/dev/null || fail "not ready after 120 s: $(docker logs "$name" 2>&1 | tail -n 20)"
out=$(curl -fsS "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
  -d '{"model": "tiny", "prompt": "a", "max_tokens": 2, "ignore_eos": true}') || fail "completion failed"
echo "$out" | grep -q '"completion_tokens": *2' || fail "unexpected completion: $out"
curl -fsS "http://127.0.0.1:$port/v2/health/live" >/dev/null || fail "liveness"
echo ok
