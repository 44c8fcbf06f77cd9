#!/bin/sh
# The image's entry point.
#   (no arguments)     serve every package in $SERVD_MODELS (default /var/lib/servd/models), each
#                      under its file name, on 0.0.0.0:8000; the folder is also the model repository
#   modelpkg ARGS...   run the packer (e.g. modelpkg pack /var/lib/servd/models/m.gguf -o ...)
#   servd ARGS... | --flag ...   run servd with exactly these arguments
set -eu
models=${SERVD_MODELS:-/var/lib/servd/models}
bin=${SERVD_BIN_DIR:-/usr/local/bin} # tests point it at stand-ins
case "${1-}" in
  modelpkg) shift; exec "$bin/modelpkg" "$@" ;;
  servd) shift; exec "$bin/servd" "$@" ;;
  "") ;;
  *) exec "$bin/servd" "$@" ;;
esac
set -- --host 0.0.0.0 --port 8000 --model-repository "$models"
n=0
for f in "$models"/*.mpk; do
  [ -f "$f" ] || continue
  set -- "$@" --model "$f:$(basename "$f" .mpk)"
  n=$((n + 1))
done
if [ "$n" -eq 0 ]; then
  echo "servd: no packages (*.mpk) in $models: mount a folder of packages there" \
       "(docker run -v /srv/models:$models ...), pack one with 'modelpkg pack', or give servd's flags" >&2
  exit 2
fi
exec "$bin/servd" "$@"
