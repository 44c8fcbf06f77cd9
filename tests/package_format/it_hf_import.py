"""Hugging Face folder -> package (incl. sharded safetensors), synth, inspect/list/unpack/verify,
checked with Python's zipfile, hashlib, numpy, gguf-py (Q8_0 reference) and HF tokenizers; and
the CLI's behaviour on malformed folders and packages."""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import zipfile

import numpy as np

try:
    from gguf import GGMLQuantizationType as Q
    from gguf import quants
    import tokenizers  # noqa: F401
except ImportError as e:  # test-only tools of .venv-test (scripts/install-deps.sh)
    print(f"skipped: {e}")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(__file__))
import modelpkg_cli  # noqa: E402
import pkgread  # noqa: E402

MODELPKG = sys.argv[1]
CLI = modelpkg_cli.Modelpkg(MODELPKG)
run, check_fail = CLI.run, CLI.check_fail


def hf_tensors(d):
    files = [f for f in os.listdir(d) if f.endswith(".safetensors")]
    out = {}
    for f in files:
        for k, (dt, shape, data, _) in pkgread.read_safetensors(open(os.path.join(d, f), "rb").read()).items():
            out[k] = (dt, tuple(shape), data)
    return out


def main():
    tmp = tempfile.mkdtemp(prefix="mpk-it-hf-")
    hf = os.path.join(tmp, "tiny-hf")
    env = dict(os.environ, MPK_SYNTH_SHARDS="3")
    p = subprocess.run([MODELPKG, "synth", "tiny", "--seed", "5", "--hf-out", hf, "--quiet"], env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert os.path.exists(os.path.join(hf, "model-00003-of-00003.safetensors"))
    idx = json.load(open(os.path.join(hf, "model.safetensors.index.json")))
    src = hf_tensors(hf)
    assert set(idx["weight_map"]) == set(src)

    pkg = os.path.join(tmp, "tiny.mpk")
    run("pack", hf, "-o", pkg, "--quiet")
    man, tensors = pkgread.load(pkg)  # CRC, SHA-256, file list, alignment, header agreement
    assert man["rope_layout"] == "half" and man["entry_point"] == "llama.model:LlamaModel"
    assert man["config"]["num_hidden_layers"] == 2 and man["config"]["hidden_size"] == 64
    assert man["special_tokens"]["eos_token"] == "<|im_end|>"
    assert set(tensors) == set(src)
    for k, (dt, shape, data) in src.items():
        pdt, pshape, pdata = tensors[k]
        assert pshape == shape and pdt == dt.lower() and bytes(pdata) == bytes(data), k
    z = zipfile.ZipFile(pkg)
    assert "code/llama/model.py" in z.namelist()
    assert z.read("code/llama/model.py") == open(os.path.join(os.environ["SERVD_MODEL_CODE"], "model.py"), "rb").read()
    from tokenizers import Tokenizer
    tok = Tokenizer.from_str(z.read("tokenizer.json").decode())
    e = tok.encode("<|im_start|>the heat<|im_end|>")
    assert e.ids[0] == 1 and e.ids[-1] == 2 and tok.decode(e.ids, skip_special_tokens=True) == "the heat"

    # Same seed, same package bytes (reproducible); another seed differs.
    pkg2 = os.path.join(tmp, "tiny2.mpk")
    run("synth", "tiny", "--seed", "5", "-o", pkg2, "--quiet")
    run("synth", "tiny", "--seed", "5", "-o", pkg2 + ".b", "--quiet")
    assert open(pkg2, "rb").read() == open(pkg2 + ".b", "rb").read()
    run("synth", "tiny", "--seed", "6", "-o", pkg2 + ".c", "--quiet")
    assert pkgread.load(pkg2 + ".c")[1]["lm_head.weight"][2] != pkgread.load(pkg2)[1]["lm_head.weight"][2]

    # --convert-all --dtype q8_0: 2-D weights quantized as ggml does (gguf-py as the reference).
    q8 = os.path.join(tmp, "tiny-q8.mpk")
    run("pack", hf, "-o", q8, "--dtype", "q8_0", "--convert-all", "--quiet")
    _, qt = pkgread.load(q8)
    for k, (dt, shape, data) in src.items():
        if len(shape) != 2:
            assert qt[k][0] == "f32"
            continue
        assert qt[k][0] == "q8_0" and qt[k][1] == shape
        ref = np.frombuffer(data, np.float32).reshape(shape)
        got = quants.dequantize(np.frombuffer(qt[k][2], np.uint8).reshape(shape[0], -1), Q.Q8_0)
        blk = np.abs(ref.reshape(-1, 32)).max(axis=1, keepdims=True)
        assert (np.abs(got.reshape(-1, 32) - ref.reshape(-1, 32)) <= blk / 127 * 0.57 + 1e-7).all(), k

    # --dtype q4_k: rows that are not whole 256-value super-blocks (all of tiny's) stay f32, as rows that
    # are not whole blocks of 32 do for q8_0 (the block size is the dtype's, not 32).
    k4 = os.path.join(tmp, "tiny-q4k.mpk")
    run("pack", hf, "-o", k4, "--dtype", "q4_k", "--convert-all", "--quiet")
    assert all(dt == "f32" for dt, _, _ in pkgread.load(k4)[1].values())

    # inspect, list, unpack, verify
    out = run("inspect", pkg).stdout
    assert "model.layers.1.mlp.down_proj.weight" in out and "total" in out and "causal-lm" in out
    assert json.loads(run("inspect", pkg, "--json").stdout)["name"] == man["name"]
    assert "weights/lm_head.weight.safetensors" in run("list", pkg).stdout
    assert "tiny.mpk" in run("list", tmp).stdout
    un = os.path.join(tmp, "unpacked")
    run("unpack", pkg, un)
    for n in z.namelist():
        assert open(os.path.join(un, n), "rb").read() == z.read(n), n
    assert "OK" in run("verify", pkg).stdout

    # Malformed folders: one line naming the file, exit 1, no output left.
    out = os.path.join(tmp, "bad.mpk")
    bad = os.path.join(tmp, "bad-hf")

    def fresh():
        shutil.rmtree(bad, ignore_errors=True)
        shutil.copytree(hf, bad)

    fresh()
    open(os.path.join(bad, "tokenizer.json"), "w").write("{\"model\": ")
    check_fail(["pack", bad, "-o", out, "--quiet"], "tokenizer.json", out)
    fresh()
    open(os.path.join(bad, "config.json"), "w").write("[1, 2")
    check_fail(["pack", bad, "-o", out, "--quiet"], "config.json", out)
    fresh()
    os.remove(os.path.join(bad, "tokenizer.json"))
    check_fail(["pack", bad, "-o", out, "--quiet"], "tokenizer.json", out)
    fresh()
    ix = json.load(open(os.path.join(bad, "model.safetensors.index.json")))
    ix["weight_map"]["model.extra.weight"] = "model-00001-of-00003.safetensors"
    json.dump(ix, open(os.path.join(bad, "model.safetensors.index.json"), "w"))
    check_fail(["pack", bad, "-o", out, "--quiet"], "model.extra.weight", out)
    fresh()
    ix["weight_map"] = {"x": "../../etc/passwd"}
    json.dump(ix, open(os.path.join(bad, "model.safetensors.index.json"), "w"))
    check_fail(["pack", bad, "-o", out, "--quiet"], "weight_map", out)
    fresh()
    f = os.path.join(bad, "model-00002-of-00003.safetensors")
    raw = open(f, "rb").read()
    open(f, "wb").write(struct.pack("<Q", 1 << 62) + raw[8:])  # header length beyond the file
    check_fail(["pack", bad, "-o", out, "--quiet"], "model-00002-of-00003.safetensors", out)
    fresh()
    open(f, "wb").write(raw[:len(raw) - 3])  # truncated buffer
    check_fail(["pack", bad, "-o", out, "--quiet"], "model-00002-of-00003.safetensors", out)

    # Malformed packages made with Python's zipfile.
    good = zipfile.ZipFile(pkg)

    def rezip(path, mutate, prefix=b""):
        with open(path, "wb") as fh:
            fh.write(prefix)
            with zipfile.ZipFile(fh, "w") as zo:
                mutate(zo)

    contents = [(i.filename, good.read(i.filename)) for i in good.infolist()]

    def copy_all(zo, skip=()):
        for name, data in contents:
            if name not in skip:
                zo.writestr(zipfile.ZipInfo(name), data)  # stored, like the original

    b = os.path.join(tmp, "b.mpk")
    rezip(b, lambda zo: copy_all(zo))  # realigned by zipfile: tensors no longer on 64-byte boundaries
    check_fail(["verify", b], "expected a multiple of 64")
    rezip(b, lambda zo: copy_all(zo), prefix=b"\0" * 64)  # a hole before the first entry
    check_fail(["verify", b], "hole")

    def dup(zo):
        import warnings
        copy_all(zo)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            zo.writestr("tokenizer.json", b"{}")
    rezip(b, dup)
    check_fail(["verify", b], "duplicate entry")

    def bomb(zo):
        copy_all(zo)
        zo.writestr(zipfile.ZipInfo("code/llama/big.py"), b"\0" * (100 << 20), compress_type=zipfile.ZIP_DEFLATED)
    rezip(b, bomb)
    check_fail(["verify", b], "expected at most")

    def evil(zo):
        zo.writestr("../evil.py", b"x")
        copy_all(zo)
    rezip(b, evil)
    check_fail(["verify", b], "..")
    check_fail(["unpack", b, os.path.join(tmp, "u2")], "..")
    assert not os.path.exists(os.path.join(tmp, "evil.py"))

    def nomanifest(zo):
        copy_all(zo, skip=("manifest.json",))
    rezip(b, nomanifest)
    check_fail(["inspect", b], "manifest.json")

    # Hash mismatch in a tensor: open succeeds, verify fails naming the entry.
    raw = bytearray(open(pkg, "rb").read())
    info = zipfile.ZipFile(pkg).getinfo("weights/lm_head.weight.safetensors")
    at = pkgread.data_offset(pkg, info) + info.file_size - 1
    raw[at] ^= 1
    open(b, "wb").write(raw)
    assert run("inspect", b).returncode == 0
    check_fail(["verify", b], "weights/lm_head.weight.safetensors")
    print("ok")


if __name__ == "__main__":
    main()
