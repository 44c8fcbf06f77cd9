"""modelpkg against hostile or inconsistent input: NaN/inf GGUF hyperparameters, shapes that contradict
the config (GGUF and Hugging Face), families no registry row declares, links out of source folders,
unsafe names, symlink entries crafted with Python's zipfile, unpack that must leave nothing on failure,
and the model code found from a relocated executable (no source path baked in)."""
import json
import os
import shutil
import struct
import sys
import tempfile
import zipfile

sys.path.insert(0, os.path.dirname(__file__))
try:
    import it_gguf_import  # noqa: E402  (make_gguf: a tiny llama GGUF written with gguf-py)
except SystemExit:  # gguf-py missing: it printed "skipped"
    sys.exit(77)
import modelpkg_cli  # noqa: E402

MODELPKG = sys.argv[1]
CLI = modelpkg_cli.Modelpkg(MODELPKG)
run, check_fail = CLI.run, CLI.check_fail
CODE = os.environ["SERVD_MODEL_CODE"]


def patch_kv(raw, key, fmt, value):
    """The value of GGUF key `key` (its type already fixed by the writer) replaced in place."""
    k = struct.pack("<Q", len(key)) + key.encode()
    at = raw.index(k) + len(k) + 4  # the 4-byte type follows the key
    return raw[:at] + struct.pack(fmt, value) + raw[at + struct.calcsize(fmt):]


def gguf_cases(tmp):
    src = os.path.join(tmp, "m.gguf")
    it_gguf_import.make_gguf(src)
    raw = open(src, "rb").read()
    out = os.path.join(tmp, "bad.mpk")
    p = os.path.join(tmp, "bad.gguf")
    for key, v in (("llama.attention.layer_norm_rms_epsilon", float("nan")), ("llama.rope.freq_base", float("inf"))):
        open(p, "wb").write(patch_kv(raw, key, "<f", v))
        check_fail(["pack", p, "-o", out, "--quiet"], key, out)
    open(p, "wb").write(patch_kv(raw, "llama.feed_forward_length", "<I", 256))  # the weights have 512
    check_fail(["pack", p, "-o", out, "--quiet"], 'tensor "model.layers.0.mlp.gate_proj.weight": shape (512, 256), expected (256, 256)', out)
    open(p, "wb").write(patch_kv(raw, "llama.block_count", "<I", 3))
    check_fail(["pack", p, "-o", out, "--quiet"], '"model.layers.2.input_layernorm.weight": missing', out)
    it_gguf_import.make_gguf(p, arch="gpt2")
    check_fail(["pack", p, "-o", out, "--quiet"], 'general.architecture "gpt2" is no known architecture; known architectures are: llama', out)
    good = os.path.join(tmp, "good.mpk")
    run("pack", src, "-o", good, "--quiet")
    assert json.loads(zipfile.ZipFile(good).read("manifest.json"))["architecture"] == "llama"
    print("ok   GGUF: NaN/inf hyperparameters, contradicting shapes and unknown families refused")


def hf_cases(tmp):
    hf = os.path.join(tmp, "hf")
    run("synth", "tiny", "--hf-out", hf, "--quiet")
    cfg = json.load(open(os.path.join(hf, "config.json")))
    out = os.path.join(tmp, "bad.mpk")

    def with_cfg(**kw):
        json.dump(dict(cfg, **kw), open(os.path.join(hf, "config.json"), "w"))

    with_cfg(hidden_size=96)
    check_fail(["pack", hf, "-o", out, "--quiet"], 'tensor "model.embed_tokens.weight": shape (320, 64), expected (320, 96)', out)
    with_cfg(model_type="qwen9")
    check_fail(["pack", hf, "-o", out, "--quiet"], 'model_type "qwen9" is no known architecture; known architectures are: llama', out)
    with_cfg(model_type="mistral", architectures=["MistralForCausalLM"])  # same tensors: the llama row accepts it
    run("pack", hf, "-o", os.path.join(tmp, "mistral.mpk"), "--quiet")
    with_cfg()

    # A model folder's files may link anywhere (the Hugging Face hub cache links snapshots/<rev>/* to
    # ../../blobs/), but only to regular files; code folders keep their links inside.
    secret = os.path.join(tmp, "secret.txt")
    open(secret, "w").write("not for packages\n")
    tok = os.path.join(hf, "tokenizer.json")
    os.rename(tok, os.path.join(tmp, "tokenizer.json"))
    os.symlink(os.path.join(tmp, "tokenizer.json"), tok)
    linked = os.path.join(tmp, "linked.mpk")
    run("pack", hf, "-o", linked, "--quiet")
    assert zipfile.ZipFile(linked).read("tokenizer.json") == open(tok, "rb").read()
    os.unlink(tok)
    os.mkfifo(tok)
    check_fail(["pack", hf, "-o", out, "--quiet"], "tokenizer.json: not a regular file", out)
    os.unlink(tok)
    os.rename(os.path.join(tmp, "tokenizer.json"), tok)
    code = os.path.join(tmp, "llama")
    shutil.copytree(CODE, code, ignore=shutil.ignore_patterns("__pycache__"))
    os.symlink(secret, os.path.join(code, "x.py"))
    check_fail(["pack", hf, "-o", out, "--code", code, "--quiet"], "x.py: a symbolic link to", out)
    os.unlink(os.path.join(code, "x.py"))
    os.symlink("model.py", os.path.join(code, "alias.py"))
    ok = os.path.join(tmp, "ok.mpk")
    run("pack", hf, "-o", ok, "--code", code, "--quiet")
    z = zipfile.ZipFile(ok)
    assert z.read("code/llama/alias.py") == z.read("code/llama/model.py")
    os.mkfifo(os.path.join(code, "pipe"))
    check_fail(["pack", hf, "-o", out, "--code", code, "--quiet"], "not a regular file or folder", out)
    os.unlink(os.path.join(code, "pipe"))

    # Names: an explicit unsafe one is refused without echoing escapes; a folder name is made safe.
    p = CLI.run("pack", hf, "-o", out, "--name", "../../etc\n\x1b[31m", "--quiet", ok=False)
    assert p.returncode == 1 and "\x1b" not in p.stderr and p.stderr.count("\n") == 1, p.stderr
    assert "expected 1..64 characters of [A-Za-z0-9._-]" in p.stderr, p.stderr
    odd = os.path.join(tmp, "My Model (v2)")
    shutil.copytree(hf, odd)
    run("pack", odd, "-o", os.path.join(tmp, "odd.mpk"), "--quiet")
    assert json.loads(zipfile.ZipFile(os.path.join(tmp, "odd.mpk")).read("manifest.json"))["name"] == "My-Model--v2-"
    print("ok   Hugging Face: contradicting shapes, unknown model_type, links out of folders, unsafe names refused")
    return ok


def zip_cases(tmp, pkg):
    """A symlink entry (Unix mode 0120777 in the central directory, as zipfile writes it): refused by
    verify, inspect and unpack; unpack leaves nothing behind."""
    raw = bytearray(open(pkg, "rb").read())
    name = b"code/llama/model.py"
    at = raw.index(b"PK\x01\x02" + b"", raw.index(b"PK\x01\x02"))
    while raw[at + 46:at + 46 + len(name)] != name or struct.unpack_from("<H", raw, at + 28)[0] != len(name):
        at = raw.index(b"PK\x01\x02", at + 4)
    struct.pack_into("<I", raw, at + 38, 0o120777 << 16)
    bad = os.path.join(tmp, "link.mpk")
    open(bad, "wb").write(raw)
    info = zipfile.ZipFile(bad).getinfo("code/llama/model.py")
    assert info.external_attr >> 16 == 0o120777  # an independent reader sees a symlink entry
    for cmd in (["verify", bad], ["inspect", bad]):
        check_fail(cmd, 'entry "code/llama/model.py": mode 0120777 is a symbolic link')
    dest = os.path.join(tmp, "unpacked")
    check_fail(["unpack", bad, dest], "symbolic link")
    assert not [f for f in os.listdir(tmp) if f.startswith("unpacked")], "unpack left files behind"
    run("unpack", pkg, dest)
    assert all(not os.path.islink(os.path.join(r, f)) for r, _, fs in os.walk(dest) for f in fs)
    check_fail(["unpack", pkg, dest], "not an empty folder")
    print("ok   zip: symlink entries refused by verify/inspect/unpack; unpack all or nothing")


def relocated(tmp, hf_pkg_src):
    """modelpkg copied to PREFIX/bin finds PREFIX/share/servd/models/llama with no environment."""
    prefix = os.path.join(tmp, "prefix")
    os.makedirs(os.path.join(prefix, "bin"))
    exe = os.path.join(prefix, "bin", "modelpkg")
    shutil.copy2(MODELPKG, exe)
    env = {k: v for k, v in os.environ.items() if k != "SERVD_MODEL_CODE"}
    out = os.path.join(tmp, "rel.mpk")
    p = modelpkg_cli.Modelpkg(exe).run("pack", hf_pkg_src, "-o", out, "--quiet", ok=False, env=env)
    assert p.returncode == 1 and "share/servd/models/llama" in p.stderr, p.stderr
    code = os.path.join(prefix, "share", "servd", "models", "llama")
    shutil.copytree(CODE, code, ignore=shutil.ignore_patterns("__pycache__"))
    open(os.path.join(code, "installed_marker.py"), "w").write("# from the install\n")
    modelpkg_cli.Modelpkg(exe).run("pack", hf_pkg_src, "-o", out, "--quiet", env=env)
    assert "code/llama/installed_marker.py" in zipfile.ZipFile(out).namelist()
    print("ok   relocated install: the model code found under <prefix>/share/servd/models")


def main():
    with tempfile.TemporaryDirectory() as tmp:
        gguf_cases(tmp)
        pkg = hf_cases(tmp)
        zip_cases(tmp, pkg)
        relocated(tmp, os.path.join(tmp, "hf"))
    print("ok")


if __name__ == "__main__":
    main()
