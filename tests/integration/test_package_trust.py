"""What servd checks in a package before it serves it: a code entry changed after packing is refused
(the message names the entry), a flipped weight byte is refused with --verify-weights, and with
--trusted-keys only packages signed (modelpkg sign) by one of those keys load. The load log line
gives the load time, the package size and the KV cache."""
import os
import shutil
import subprocess
import sys
import time
import zipfile
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from servd_harness import Servd, check, fail, parse_args, skip, tiny_llama  # noqa: E402

a = parse_args()
base = tiny_llama(a)
work = os.path.join(a.work, "trust")
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)


def tampered(name, entry, at, fix_crc=True):
    """A copy of the tiny package with one byte of `entry` flipped; with fix_crc the CRC-32 in both
    zip headers is rewritten, as a careful attacker would, so only the manifest's SHA-256 tells."""
    out = os.path.join(work, name)
    shutil.copy(base, out)
    with zipfile.ZipFile(out) as z:
        info = z.getinfo(entry)
    with open(out, "r+b") as f:
        f.seek(info.header_offset + 26)
        nlen, elen = (int.from_bytes(f.read(2), "little") for _ in range(2))
        data_at = info.header_offset + 30 + nlen + elen
        f.seek(data_at)
        data = bytearray(f.read(info.file_size))
        data[at if at >= 0 else len(data) + at] ^= 0x01
        f.seek(data_at)
        f.write(data)
        if fix_crc:
            crc = zlib.crc32(data).to_bytes(4, "little")
            f.seek(info.header_offset + 14)
            f.write(crc)
            f.flush()
            blob = open(out, "rb").read()
            # the central record of `entry`: its name follows the 46-byte fixed part
            pos = blob.find(b"PK\x01\x02")
            while pos >= 0:
                n = int.from_bytes(blob[pos + 28:pos + 30], "little")
                if blob[pos + 46:pos + 46 + n] == entry.encode():
                    f.seek(pos + 16)
                    f.write(crc)
                    break
                pos = blob.find(b"PK\x01\x02", pos + 4)
    return out


def refused(pkg, extra, *want):
    s = Servd(a, ["--model", f"{pkg}:tiny", "--access-log", "off"] + extra, wait_ready=False)
    deadline = time.monotonic() + 120
    while s.proc.poll() is None and time.monotonic() < deadline:
        try:
            if s.request("GET", "/v2/health/ready")[0] == 200:
                s.stop()
                fail(f"servd served {os.path.basename(pkg)} with {extra}:\n{s.stderr()}")
        except OSError:
            pass
        time.sleep(0.05)
    rc = s.stop(sig=None, timeout=10)
    err = s.stderr()
    check(rc == 1, f"servd exited with {rc} on {os.path.basename(pkg)} with {extra}, expected 1:\n{err}")
    for w in want:
        check(w in err, f"the refusal does not say {w!r}:\n{err}")
    return err


def serves(pkg, extra):
    s = Servd(a, ["--model", f"{pkg}:tiny", "--access-log", "off"] + extra)
    st, body = s.json("POST", "/v1/completions", {"model": "tiny", "prompt": "a", "max_tokens": 2, "ignore_eos": True})
    check(st == 200, f"completion: {st} {body}")
    check(s.stop() == 0, "exit status")
    return s.stderr()


# A code file changed after packing: refused at load, naming the entry; the weights need no flag.
code = tampered("code.mpk", "code/llama/model.py", 10)
refused(code, [], "code/llama/model.py", "sha256")
refused(tampered("code-crc.mpk", "code/llama/model.py", 10, fix_crc=False), [], "code/llama/model.py", "CRC-32")

# A flipped weight byte: served without --verify-weights (the weights are not read at load),
# refused with it.
w = tampered("weight.mpk", "weights/model.norm.weight.safetensors", -1)
log = serves(w, [])
check("weights not checked" in log, f"the load line does not say the weights were not checked:\n{log}")
refused(w, ["--verify-weights"], "weights/model.norm.weight.safetensors")

# The load line: time, package size, KV cache, what was checked.
log = serves(base, ["--verify-weights"])
line = next((x for x in log.splitlines() if "model 'tiny': loaded in" in x), "")
for part in (" s: package ", "tensors", "KV cache", "blocks x", "integrity: unsigned", "weights included"):
    check(part in line, f"load line lacks {part!r}: {line!r}")

# Signatures.
if not shutil.which("openssl"):
    skip("openssl (the command) is missing: no keys for the signature half of the test")
keys, other = os.path.join(work, "keys"), os.path.join(work, "other")
os.makedirs(keys)
os.makedirs(other)
for name, d in (("ops", keys), ("intruder", other)):
    priv = os.path.join(work, f"{name}.key")
    subprocess.run(["openssl", "genpkey", "-algorithm", "ed25519", "-out", priv], check=True, capture_output=True)
    subprocess.run(["openssl", "pkey", "-in", priv, "-pubout", "-out", os.path.join(d, f"{name}.pem")], check=True,
                   capture_output=True)
signed = os.path.join(work, "signed.mpk")
r = subprocess.run([a.modelpkg, "sign", "--key", os.path.join(work, "ops.key"), base, "-o", signed],
                   capture_output=True, text=True)
check(r.returncode == 0, f"modelpkg sign: {r.stderr}")
r = subprocess.run([a.modelpkg, "verify", "--key", keys, signed], capture_output=True, text=True)
check(r.returncode == 0 and "signature by ops.pem" in r.stdout, f"modelpkg verify --key: {r.stdout} {r.stderr}")
r = subprocess.run([a.modelpkg, "verify", "--key", other, signed], capture_output=True, text=True)
check(r.returncode == 1 and "does not verify" in r.stderr, f"verify with the wrong key: {r.returncode} {r.stderr}")
# An independent verifier: OpenSSL over the manifest's bytes.
with zipfile.ZipFile(signed) as z:
    open(os.path.join(work, "manifest.json"), "wb").write(z.read("manifest.json"))
    open(os.path.join(work, "sig.bin"), "wb").write(z.read("signature.ed25519"))
r = subprocess.run(["openssl", "pkeyutl", "-verify", "-pubin", "-inkey", os.path.join(keys, "ops.pem"), "-rawin",
                    "-in", os.path.join(work, "manifest.json"), "-sigfile", os.path.join(work, "sig.bin")],
                   capture_output=True, text=True)
check(r.returncode == 0, f"openssl does not verify the signature: {r.stdout} {r.stderr}")

log = serves(signed, ["--trusted-keys", keys])
check("signed by ops.pem" in log, f"the load line does not name the key:\n{log}")
refused(base, ["--trusted-keys", keys], "unsigned package")
refused(signed, ["--trusted-keys", other], "does not verify with the trusted key intruder.pem")
# A signed package whose code changed afterwards: the signature holds, the hash does not.
shutil.copy(signed, os.path.join(work, "signed-code.mpk"))
base_saved, base = base, signed
refused(tampered("signed-code.mpk", "code/llama/model.py", 10), ["--trusted-keys", keys], "code/llama/model.py")
base = base_saved
# A bad --trusted-keys is a configuration error (exit 2) at startup.
empty = os.path.join(work, "empty")
os.makedirs(empty)
p = subprocess.run([a.servd, "--port", "0", "--model", f"{signed}:tiny", "--trusted-keys", empty], capture_output=True,
                   text=True, timeout=60)
check(p.returncode == 2 and "no *.pem public keys" in p.stderr, f"empty --trusted-keys: {p.returncode} {p.stderr}")
print("ok")
