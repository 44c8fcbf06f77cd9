"""`modelpkg pack --kind generic`: a code folder + safetensors files written with numpy + a JSON config
-> package, checked with Python's zipfile, json, hashlib and numpy (manifest, alignment, hashes,
tensor bytes, code files), accepted by `modelpkg verify` and `inspect`; bad input fails with one line,
a non-zero exit and nothing left behind."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

try:
    import numpy as np  # noqa: F401
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import generic_fixture as gf  # noqa: E402
import modelpkg_cli  # noqa: E402
import pkgread  # noqa: E402

MODELPKG = sys.argv[1]
CLI = modelpkg_cli.Modelpkg(MODELPKG)
run, check_fail = CLI.run, CLI.check_fail


def main():
    tmp = tempfile.mkdtemp(prefix="mpk-it-generic-")
    code, weights, cfg, expect, _ = gf.make(tmp)
    pkg = os.path.join(tmp, "toy.mpk")
    ep = "toy_model.model:Toy"
    base = ["pack", "--kind", "generic", "--code", code, "--entry-point", ep, "--quiet"]
    run(*base, "--weights", weights[0], "--weights", weights[1], "--config", cfg,
        "--name", "toy", "--model-version", "3", "-o", pkg)

    # Independent reader: CRC, SHA-256 of every entry, files list = archive, 64-byte alignment of
    # every tensor, each weight file's safetensors header agrees with the index.
    man, tensors = pkgread.load(pkg)
    assert man["format_version"] == 1 and man["kind"] == "generic", man
    assert man["name"] == "toy" and man["model_version"] == "3" and man["entry_point"] == ep, man
    assert man["config"] == json.load(open(cfg)), man["config"]
    assert "tokenizer" not in man and "rope_layout" not in man, man
    assert set(tensors) == set(expect), (sorted(tensors), sorted(expect))
    for k, (dt, shape, raw) in expect.items():
        pdt, pshape, pdata = tensors[k]
        assert (pdt, pshape) == (dt, shape) and bytes(pdata) == raw, (k, pdt, pshape)
    w1 = pkgread.to_f32(*tensors["layer1.weight"])
    assert w1.shape == (gf.HIDDEN, gf.D_IN) and float(pkgread.to_f32(*tensors["temperature"])[0]) == 0.75
    z = zipfile.ZipFile(pkg)
    code_entries = sorted(n for n in z.namelist() if n.startswith("code/"))
    assert code_entries == ["code/toy_model/__init__.py", "code/toy_model/labels.txt", "code/toy_model/model.py",
                            "code/toy_model/util/helpers.py"], code_entries  # no __pycache__
    for n in code_entries:
        assert z.read(n) == open(os.path.join(code, n[len("code/toy_model/"):]), "rb").read(), n
    assert all(i.compress_type == zipfile.ZIP_STORED for i in z.infolist())

    # The tools accept it.
    p = run("verify", pkg)
    assert "OK" in p.stdout, p.stdout
    p = run("inspect", pkg)
    assert "kind           generic" in p.stdout and "layer2.weight" in p.stdout and "f16" in p.stdout, p.stdout
    assert json.loads(run("inspect", pkg, "--json").stdout)["entry_point"] == ep

    # Same inputs, same bytes (given in the other order: tensors are sorted by name).
    pkg2 = os.path.join(tmp, "toy2.mpk")
    run(*base, "--weights", weights[1], "--weights", weights[0], "--config", cfg, "--name", "toy",
        "--model-version", "3", "-o", pkg2)
    assert open(pkg, "rb").read() == open(pkg2, "rb").read(), "not reproducible"

    # Defaults: name = code folder name, version "1", config {}; no weights at all is allowed.
    pkg3 = os.path.join(tmp, "bare.mpk")
    run(*base, "-o", pkg3)
    man3, t3 = pkgread.load(pkg3)
    assert man3["name"] == "toy_model" and man3["model_version"] == "1" and man3["config"] == {} and not t3, man3
    run("verify", pkg3)
    # Entry module as a package (__init__.py) and in a subfolder; trailing slash on --code.
    for e in ("toy_model:Toy", "toy_model.util.helpers:twice"):
        run("pack", "--kind", "generic", "--code", code + "/", "--entry-point", e, "-o", pkg3, "--quiet")
        assert pkgread.load(pkg3)[0]["entry_point"] == e

    # "--code ." from inside the folder names the folder itself.
    p = subprocess.run([os.path.abspath(MODELPKG), "pack", "--kind", "generic", "--code", ".", "--entry-point", ep,
                        "-o", pkg3, "--quiet"], cwd=code, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert "code/toy_model/model.py" in zipfile.ZipFile(pkg3).namelist()

    # Bad input: one line on stderr, exit 1, no output (nor temporary file) left.
    out = os.path.join(tmp, "bad", "out.mpk")
    os.makedirs(os.path.dirname(out))
    g = ["pack", "--kind", "generic", "--quiet", "-o", out]
    w = ["--weights", weights[0], "--weights", weights[1]]
    check_fail(g + ["--code", code, "--entry-point", "toy_model.missing:Toy"] + w, "toy_model/missing.py", out)
    check_fail(g + ["--code", code, "--entry-point", "toy_model.util:X"] + w, "not found", out)  # no util/__init__.py
    for bad in ("toy_model.model", "toy_model.model:", ":Toy", "toy_model..model:Toy", "toy_model.model:Toy:X",
                "toy-model.model:Toy", "toy_model.1model:Toy", "toy_model/model:Toy"):
        check_fail(g + ["--code", code, "--entry-point", bad] + w, "expected \"module:callable\"", out)
    check_fail(g + ["--code", code, "--entry-point", "other.model:Toy"] + w, "imported as package \"toy_model\"", out)
    check_fail(g + ["--code", code, "--entry-point", "toy_model_x.model:Toy"] + w, "imported as package", out)
    check_fail(g + ["--code", os.path.join(tmp, "nope"), "--entry-point", "nope.model:M"] + w,
               "code folder does not exist", out)
    check_fail(g + ["--code", weights[0], "--entry-point", "a.model:M"], "not a folder", out)
    inside = os.path.join(code, "util", "out.mpk")
    check_fail(g[:-2] + ["-o", inside, "--code", code, "--entry-point", ep], "must not be inside the code folder", inside)
    dashed = os.path.join(tmp, "toy-model")
    shutil.copytree(code, dashed)
    check_fail(g + ["--code", dashed, "--entry-point", "toy_model.model:Toy"], "must be a Python identifier", out)

    c = ["--code", code, "--entry-point", ep]
    for dt, raw in (("I64", b"\0" * 16), ("I32", b"\0" * 8), ("U8", b"\0" * 2), ("F64", b"\0" * 16), ("BOOL", b"\1\0")):
        f = os.path.join(tmp, f"dt_{dt}.safetensors")
        n = len(raw) // {"I64": 8, "I32": 4, "U8": 1, "F64": 8, "BOOL": 1}[dt]
        gf.write_safetensors(f, {"ok.weight": ("F32", (2,), b"\0" * 8), "ids": (dt, (n,), raw)})
        check_fail(g + c + ["--weights", f], f"dtype {dt} is not supported, expected F32, F16 or BF16", out)
    dup = os.path.join(tmp, "dup.safetensors")
    gf.write_safetensors(dup, {"layer2.weight": ("F32", (1,), b"\0" * 4)})
    check_fail(g + c + w + ["--weights", dup], "tensor \"layer2.weight\" is in both", out)
    check_fail(g + c + ["--weights", weights[0], "--weights", weights[0]], "is in both", out)
    trunc = os.path.join(tmp, "trunc.safetensors")
    open(trunc, "wb").write(open(weights[1], "rb").read()[:-3])
    check_fail(g + c + ["--weights", trunc], "trunc.safetensors", out)
    hdr = os.path.join(tmp, "hdr.safetensors")
    open(hdr, "wb").write(b"\xff" * 8 + b"{}")
    check_fail(g + c + ["--weights", hdr], "header length", out)
    check_fail(g + c + ["--weights", os.path.join(tmp, "absent.safetensors")], "absent.safetensors", out)
    empty = os.path.join(tmp, "empty.safetensors")
    gf.write_safetensors(empty, {"e": ("F32", (0, 4), b"")})
    check_fail(g + c + ["--weights", empty], "empty tensors", out)
    five = os.path.join(tmp, "five.safetensors")
    gf.write_safetensors(five, {"f": ("F32", (1, 1, 1, 1, 2), b"\0" * 8)})
    check_fail(g + c + ["--weights", five], "at most 4", out)
    badname = os.path.join(tmp, "badname.safetensors")
    gf.write_safetensors(badname, {"a/b": ("F32", (1,), b"\0" * 4)})
    check_fail(g + c + ["--weights", badname], "not allowed", out)
    arr = os.path.join(tmp, "arr.json")
    open(arr, "w").write("[1, 2]")
    check_fail(g + c + ["--config", arr], "expected a JSON object", out)
    broken = os.path.join(tmp, "broken.json")
    open(broken, "w").write('{"a": 1,')
    check_fail(g + c + ["--config", broken], "broken.json", out)
    dupkey = os.path.join(tmp, "dupkey.json")
    open(dupkey, "w").write('{"a": 1, "a": 2}')
    check_fail(g + c + ["--config", dupkey], "dupkey.json", out)

    # Usage errors: one line, exit 2.
    check_fail(["pack", "--kind", "generic", "--entry-point", ep, "-o", out], "needs --code", out, code=2)
    check_fail(["pack", "--kind", "generic", "--code", code, "-o", out], "needs --entry-point", out, code=2)
    check_fail(["pack", "--kind", "generic"] + c + ["--dtype", "q8_0", "-o", out], "causal-lm sources only", out, code=2)
    check_fail(["pack", "--kind", "generic"] + c + [tmp, "-o", out], "takes no SRC", out, code=2)
    check_fail(["pack", "--kind", "vision"] + c + ["-o", out], "expected causal-lm or generic", out, code=2)
    check_fail(["pack", tmp, "--weights", weights[0], "-o", out], "--kind generic only", out, code=2)
    check_fail(["pack", "--kind", "generic"] + c, "-o OUT.mpk is required", out, code=2)

    # The help names the generic form.
    p = run("--help")
    assert "--kind generic" in p.stderr and "--weights" in p.stderr, p.stderr
    shutil.rmtree(tmp)
    print("ok")


if __name__ == "__main__":
    main()
