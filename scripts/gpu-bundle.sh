#!/usr/bin/env bash
# Copies servd and what it needs at run time into one relocatable folder, for a machine without
# Debian's packages (the GPU machine: no libpython3.11, no libuv or jansson):
#   scripts/gpu-bundle.sh [--build DIR] [--out DIR] [--no-build] [--cpu] [--max-mib N]
#                         [--servd F] [--modelpkg F] [--bench F] [--pymod F]
# --build DIR   CMake build folder (default build-bundle); configured with -DSERVD_CUDA=ON (--cpu: OFF)
#               and Release when it has no CMakeCache.txt, then servd, modelpkg, servd-bench and the
#               Python module are built in it (--no-build: use what is there)
# --out DIR     the bundle (default DIR/bundle of the build folder; build-* folders are ignored by git)
# --servd ...   take these files instead of the build folder's
# --max-mib N   fail when the bundle is larger (default 46: it travels with the working tree)
#
# Layout: bin/{servd,modelpkg,servd-bench,servd-env}, lib/ (libpython3.11 and the shared libraries
# the programs need beyond glibc, libstdc++ and CUDA), lib/servd/ (the Python module),
# lib/servd/python-deps/ (llguidance, scripts/install-python-deps.sh),
# lib/python3.11/ (a pruned standard library), lib/python3/dist-packages/{jinja2,markupsafe},
# share/servd/models/llama/ (model code modelpkg embeds into packages), BUNDLE.txt.
# bin/servd-env PROGRAM ARGS runs a program with the bundle's libraries and Python and the machine's
# CUDA toolkit, cuBLAS and NCCL (toolkit or nvidia-* Python wheels); CUDA, cuBLAS and NCCL are never
# copied: they must match the machine's driver.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$root/build-bundle
out=""
do_build=1
cuda=ON
max_mib=46
servd="" modelpkg="" bench="" pymod=""

die() { echo "gpu-bundle: $*" >&2; exit 1; }
while (($#)); do
  case "$1" in
    --build) build=$(realpath -m "$2"); shift 2 ;;
    --out) out=$(realpath -m "$2"); shift 2 ;;
    --no-build) do_build=0; shift ;;
    --cpu) cuda=OFF; shift ;;
    --max-mib) max_mib=$2; shift 2 ;;
    --servd) servd=$2; shift 2 ;;
    --modelpkg) modelpkg=$2; shift 2 ;;
    --bench) bench=$2; shift 2 ;;
    --pymod) pymod=$2; shift 2 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
[ -n "$out" ] || out=$build/bundle
pyname=servd.cpython-311-x86_64-linux-gnu.so

if ((do_build)); then
  if [ ! -f "$build/CMakeCache.txt" ]; then
    cmake -S "$root" -B "$build" -DSERVD_CUDA=$cuda -DCMAKE_BUILD_TYPE=Release >/dev/null ||
      die "cmake configure of $build failed"
  fi
  cmake --build "$build" --target servd modelpkg servd-bench servd_pymod -j"$(nproc)" ||
    die "building servd, modelpkg, servd-bench and servd_pymod in $build failed"
fi
[ -n "$servd" ] || servd=$build/daemon/servd
[ -n "$modelpkg" ] || modelpkg=$build/package_format/modelpkg
[ -n "$bench" ] || bench=$build/client/servd-bench
[ -n "$pymod" ] || pymod=$build/python/$pyname
for f in "$servd" "$modelpkg" "$bench" "$pymod"; do
  [ -f "$f" ] || die "$f is missing (build it, or drop --no-build)"
done

# The Python the build was configured with (interp/CMakeLists.txt cache entries), else Debian's.
cache_get() { [ -f "$build/CMakeCache.txt" ] && sed -n "s/^$1:[A-Z]*=//p" "$build/CMakeCache.txt" | head -1; }
libpython=$(cache_get SERVD_LIBPYTHON || true)
stdlib=$(cache_get SERVD_PY_STDLIB || true)
[ -n "$libpython" ] || libpython=/usr/lib/x86_64-linux-gnu/libpython3.11.so.1.0
[ -n "$stdlib" ] || stdlib=/usr/lib/python3.11
distpkg=/usr/lib/python3/dist-packages
[ -f "$libpython" ] || die "$libpython is missing (libpython3.11-dev)"
[ -f "$stdlib/os.py" ] || die "$stdlib is not a Python standard library (no os.py)"
for m in jinja2 markupsafe; do [ -d "$distpkg/$m" ] || die "$distpkg/$m is missing (python3-jinja2)"; done

# Never remove a folder that is not an earlier bundle.
if [ -e "$out" ]; then
  if [ -f "$out/BUNDLE.txt" ]; then rm -rf "$out"
  elif [ -d "$out" ] && [ -z "$(ls -A "$out")" ]; then rmdir "$out"
  else die "$out exists and is not a bundle (no BUNDLE.txt): not overwriting it"
  fi
fi
tmp=$out.tmp.$$
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp"/{bin,lib/servd,lib/python3.11,lib/python3/dist-packages,share/servd/models}

copy_bin() { # src dst: stripped copy (symbols are not needed on the target; the CUDA fatbin stays)
  cp -L "$1" "$2"
  if command -v strip >/dev/null; then strip --strip-unneeded "$2" 2>/dev/null || true; fi
}
copy_bin "$servd" "$tmp/bin/servd"
copy_bin "$modelpkg" "$tmp/bin/modelpkg"
copy_bin "$bench" "$tmp/bin/servd-bench"
copy_bin "$pymod" "$tmp/lib/servd/$pyname"
cp -L "$libpython" "$tmp/lib/libpython3.11.so.1.0"

# Standard library without tests, GUI, packaging tools, bytecode caches and the static library.
tar -C "$stdlib" -cf - \
  --exclude=./test --exclude=./idlelib --exclude=./tkinter --exclude=./turtledemo --exclude=./turtle.py \
  --exclude=./ensurepip --exclude=./lib2to3 --exclude=./pydoc_data --exclude=./distutils \
  --exclude='./config-*' --exclude=./dist-packages --exclude=./site-packages --exclude=./sitecustomize.py \
  --exclude=__pycache__ \
  --exclude='./lib-dynload/_test*' --exclude='./lib-dynload/_ctypes_test*' --exclude='./lib-dynload/xxlimited*' \
  --exclude='./lib-dynload/_xxtestfuzz*' --exclude='./lib-dynload/_curses*' --exclude='./lib-dynload/readline*' \
  --exclude='./lib-dynload/nis*' --exclude='./lib-dynload/ossaudiodev*' --exclude='./lib-dynload/_sqlite3*' \
  --exclude='./lib-dynload/_dbm*' --exclude='./lib-dynload/_gdbm*' --exclude='./lib-dynload/_crypt*' \
  --exclude='./lib-dynload/_tkinter*' --exclude='./lib-dynload/audioop*' \
  . | tar -C "$tmp/lib/python3.11" -xf -
# Links into /etc or elsewhere (sysconfigdata): replace with the file, drop dangling ones.
while IFS= read -r l; do
  if t=$(readlink -e "$l"); then rm "$l"; cp "$t" "$l"; else rm "$l"; fi
done < <(find "$tmp/lib/python3.11" -type l)
for m in jinja2 markupsafe; do
  tar -C "$distpkg" -cf - --exclude=__pycache__ "$m" | tar -C "$tmp/lib/python3/dist-packages" -xf -
done
tar -C "$root/models" -cf - --exclude=__pycache__ llama | tar -C "$tmp/share/servd/models" -xf -
# The interpreters' pinned Python packages (the grammar engine llguidance: structured outputs and
# forced tool calls, 501 without it), where servd looks beside itself: lib/servd/python-deps.
"$root/scripts/install-python-deps.sh" "$build/python-deps" >/dev/null ||
  die "scripts/install-python-deps.sh $build/python-deps failed (llguidance from PyPI)"
cp -a "$build/python-deps" "$tmp/lib/servd/python-deps"
find "$tmp/lib/servd/python-deps" -name '__pycache__' -prune -exec rm -rf {} +
if command -v strip >/dev/null; then
  find "$tmp/lib/servd/python-deps" -name '*.so' -exec strip --strip-unneeded {} + 2>/dev/null || true
fi

# Shared libraries: the closure of DT_NEEDED, resolved as ldd resolves it here. Left to the target:
# glibc, libstdc++/libgcc (the target's are newer) and CUDA/cuBLAS/NCCL (must match its driver).
skip_re='^(linux-vdso|ld-linux[a-z0-9_-]*|libc|libm|libmvec|libpthread|libdl|librt|libutil|libresolv|libanl|libnss_[a-z]+|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas|libcublasLt|libnccl|libnvidia-[a-z-]+|libnvrtc[a-z-]*|libnvJitLink|libcudnn[a-z_]*|libcurand|libcusparse|libcusolver|libcufft)\.so'
declare -A have=([libpython3.11.so.1.0]=1)
left_out=()
stub_archive=0
needed() { readelf -d "$1" 2>/dev/null | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'; }
walk() { # an ELF file of the bundle or a library copied into it
  local obj=$1 so path
  local map
  map=$(ldd "$obj" 2>/dev/null || true)
  for so in $(needed "$obj"); do
    [ -z "${have[$so]:-}" ] || continue
    have[$so]=1
    if [[ $so =~ $skip_re ]]; then
      [[ $so =~ ^lib(cuda|cublas|nccl|nvidia|nvrtc|nvJitLink|cudnn|curand|cusparse|cusolver|cufft) ]] && left_out+=("$so")
      continue
    fi
    if [ "$so" = libarchive.so.13 ]; then
      stub_archive=1 # modelpkg unpack only; the real one pulls libxml2 and 32 MB of ICU data
      continue
    fi
    path=$(awk -v s="$so" '$1 == s && $2 == "=>" { print $3 }' <<<"$map")
    [ -n "$path" ] && [ -f "$path" ] || die "$obj needs $so, which ldd does not find here"
    cp -L "$path" "$tmp/lib/$so"
    walk "$tmp/lib/$so"
  done
}
while IFS= read -r f; do walk "$f"; done < <(
  { echo "$tmp/bin/servd"; echo "$tmp/bin/modelpkg"; echo "$tmp/bin/servd-bench"; echo "$tmp/lib/servd/$pyname"
    echo "$tmp/lib/libpython3.11.so.1.0"; find "$tmp/lib/python3.11/lib-dynload" "$tmp/lib/python3/dist-packages" -name '*.so'; })

for f in "$tmp/bin/servd" "$tmp/bin/servd-bench" "$tmp/lib/servd/$pyname"; do
  needed "$f" | grep -qx 'libarchive.so.13' && die "$f needs libarchive: the stand-in here covers only modelpkg unpack"
done
if ((stub_archive)); then
  # libarchive serves only `modelpkg unpack` (pack and synth use servd's own zip writer): a stub with
  # the same soname whose calls fail with a message keeps modelpkg loadable without libxml2 and ICU.
  syms=$(nm -D --undefined-only "$tmp/bin/modelpkg" | awk '$2 ~ /^archive_/ { print $2 }' | sort -u)
  {
    echo '/* generated by scripts/gpu-bundle.sh: stand-in for libarchive (modelpkg unpack is unavailable) */'
    echo 'static char dummy[64];'
    for s in $syms; do
      case "$s" in
        archive_read_new|archive_write_disk_new|archive_write_new) echo "void *$s(void) { return dummy; }" ;;
        archive_error_string) echo "const char *$s(void *a) { (void)a; return \"libarchive is not in this bundle: modelpkg unpack needs a full install\"; }" ;;
        archive_entry_pathname) echo "const char *$s(void *e) { (void)e; return \"\"; }" ;;
        *) echo "long $s(void) { return -30; /* ARCHIVE_FATAL */ }" ;;
      esac
    done
  } >"$tmp/archive_stub.c"
  cc -shared -fPIC -O1 -Wl,-soname,libarchive.so.13 -o "$tmp/lib/libarchive.so.13" "$tmp/archive_stub.c" ||
    die "compiling the libarchive stand-in failed"
  rm "$tmp/archive_stub.c"
fi

cat >"$tmp/bin/servd-env" <<'ENV'
#!/usr/bin/env bash
# Runs PROGRAM (a program of this bundle, or any command) with the bundle's libraries and Python and
# the machine's CUDA, cuBLAS and NCCL.
#   servd-env PROGRAM ARGS...    servd-env --print    servd-env --check
# CUDA library folders: $SERVD_CUDA_LIB_DIRS (colon-separated) if set, else the CUDA toolkit of nvcc
# (or /usr/local/cuda) and the nvidia-* wheels of python3 and /opt/torch/.venv/bin/python3, as
# scripts/gpu-check.sh finds them.
set -euo pipefail
here=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)
cuda_dirs() {
  local cands=() d py nvcc root
  nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
  root=$(cd "$(dirname "$nvcc")/.." 2>/dev/null && pwd || echo /usr/local/cuda)
  cands+=("$root/lib64" "$root/lib" "$root/targets/x86_64-linux/lib" /usr/local/nvidia/lib64 /usr/local/nvidia/lib)
  for py in python3 /opt/torch/.venv/bin/python3; do
    command -v "$py" >/dev/null 2>&1 || continue
    while IFS= read -r d; do cands+=("$d"); done < <("$py" -c '
import os
try:
    import nvidia
    for p in nvidia.__path__:
        for n in sorted(os.listdir(p)):
            print(os.path.join(p, n, "lib")); print(os.path.join(p, n, "cu13", "lib"))
except Exception:
    pass' 2>/dev/null || true)
  done
  local out="" seen=":"
  for d in "${cands[@]}"; do
    [ -d "$d" ] || continue
    d=$(cd "$d" && pwd -P)
    case "$seen" in *":$d:"*) continue ;; esac
    seen="$seen$d:"
    if compgen -G "$d/libcudart.so*" >/dev/null || compgen -G "$d/libcublas.so*" >/dev/null ||
       compgen -G "$d/libnccl.so*" >/dev/null || compgen -G "$d/libcuda.so*" >/dev/null; then
      out="$out${out:+:}$d"
    fi
  done
  echo "$out"
}
cuda=${SERVD_CUDA_LIB_DIRS-$(cuda_dirs)}
export LD_LIBRARY_PATH="$here/lib${cuda:+:$cuda}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="$here/bin:${PATH:-/usr/bin:/bin}"
export SERVD_LIBPYTHON="$here/lib/libpython3.11.so.1.0"
export SERVD_PY_STDLIB="$here/lib/python3.11"
export SERVD_PY_ALLOW_DIR="$here/lib/python3/dist-packages"
export SERVD_PYMOD="$here/lib/servd/servd.cpython-311-x86_64-linux-gnu.so"
export SERVD_PYMOD_PATH="$SERVD_PYMOD"
export SERVD_MODEL_CODE="${SERVD_MODEL_CODE:-$here/share/servd/models/llama}"
case "${1:-}" in
  ""|-h|--help) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
  --print)
    env | grep -E '^(LD_LIBRARY_PATH|SERVD_[A-Z_]+)=' | sort; exit 0 ;;
  --check) # every program and module of the bundle finds all its libraries
    bad=0
    for f in "$here"/bin/servd "$here"/bin/modelpkg "$here"/bin/servd-bench "$here"/lib/servd/*.so; do
      if ldd "$f" | grep -q 'not found'; then echo "servd-env: $f: $(ldd "$f" | grep 'not found' | tr -s ' \t\n' ' ')" >&2; bad=1; fi
    done
    ldd "$here/bin/servd" | grep -E 'libcudart|libcublas|libnccl' || echo "servd-env: servd links no CUDA library (built without CUDA)"
    exit $bad ;;
esac
prog=$1; shift
if [[ $prog != */* ]] && [ -x "$here/bin/$prog" ]; then prog=$here/bin/$prog; fi
exec "$prog" "$@"
ENV
chmod +x "$tmp/bin/servd-env"

cuda_linked=no
needed "$tmp/bin/servd" | grep -qE '^libcudart' && cuda_linked=yes
size=$(du -sb "$tmp" | cut -f1)
{
  echo "servd bundle (scripts/gpu-bundle.sh), made $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n)"
  echo "source: $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown) (working tree at bundling time)"
  echo "servd: $servd"
  echo "cuda backend linked: $cuda_linked"
  echo "left to the machine: glibc, libstdc++, libgcc_s${left_out[*]:+, ${left_out[*]}}"
  echo "grammar engine: $(cd "$tmp/lib/servd/python-deps" && ls -d llguidance-*.dist-info 2>/dev/null | sed 's/.dist-info//')"
  echo "libarchive: $( ((stub_archive)) && echo 'stand-in (modelpkg unpack unavailable)' || echo 'not needed')"
  echo "size: $size bytes"
  echo "run: bin/servd-env servd --model PKG ...   (bin/servd-env --check lists missing libraries)"
} >"$tmp/BUNDLE.txt"

if ((size > max_mib * 1024 * 1024)); then
  die "the bundle is $((size / 1024 / 1024)) MiB, over --max-mib $max_mib"
fi
mv "$tmp" "$out"
trap - EXIT
echo "gpu-bundle: $out: $(awk "BEGIN { printf \"%.1f\", $size / 1048576 }") MiB, cuda backend linked: $cuda_linked"
