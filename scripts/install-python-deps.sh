#!/usr/bin/env bash
# Installs the Python packages servd's interpreters use at run time (not the test tools) into a
# directory servd owns, pinned, from PyPI. servd puts that directory on the interpreters' sys.path:
# $SERVD_PY_DEPS, else <build>/python-deps next to a build tree's daemon/servd, else
# <prefix>/lib/servd/python-deps next to an installed bin/servd (daemon/engine/py_deps.h).
#   scripts/install-python-deps.sh [DIR]     (default: build/python-deps)
# Idempotent: a directory that already holds the pinned versions is left alone.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-$here/build/python-deps}

# llguidance: the grammar engine of constrained decoding (structured outputs), a self-contained
# abi3 wheel (no dependencies, no torch).
pins=("llguidance==1.9.1")

have() {
  for p in "${pins[@]}"; do
    name=${p%%==*}; ver=${p##*==}
    [ -d "$dir/$name-$ver.dist-info" ] || return 1
  done
}
if have; then exit 0; fi
mkdir -p "$dir"
py=/usr/bin/python3
# --no-deps: every package servd needs is pinned above, nothing else comes along.
"$py" -m pip install --quiet --disable-pip-version-check --no-deps --no-compile --upgrade --target "$dir" "${pins[@]}"
echo "servd python deps: ${pins[*]} in $dir"
