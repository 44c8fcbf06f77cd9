"""LoRA adapters against the float64 model they mean (tests/llama/lora_adapters.py, llama_ref.py).

On a tiny random-weight Llama packed with modelpkg, with PEFT adapters synthesized from fixed seeds:
  - an adapter's logits (prompt in chunks, then greedy decoding) equal the float64 forward with merged
    weights W + scale * B @ A within test_llama.py's tolerance, for f32 / f16 / bf16 adapters, all
    seven projections or some, alpha/r and rsLoRA scaling, and on Q8_0 weights (the quantized base's
    own float64 model, within the quantized tolerance);
  - a mixed batch (two sequences in the same steps: one adapter and another, or one and none) gives
    each sequence bit for bit what its adapter gives alone;
  - the same adapter as llama.cpp's GGUF LoRA file, or as an adapter package (modelpkg pack --lora),
    gives the PEFT folder's logits bit for bit; a package made for another base is refused;
  - bad adapters are refused naming the file and the tensor: a rank or shape that does not fit the
    base, an unknown module, NaN, a missing lora_B, a truncated file, an unsupported config.

    test_lora.py --logits BIN --modelpkg BIN --work DIR
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import llama_ref  # noqa: E402
import lora_adapters as la  # noqa: E402

TOL = 2e-5  # test_llama.py's: f32 rounding against float64
PROMPT = list("The quick brown fox, 12345!".encode())
DECODE = 8
failures = []


def check(cond, msg):
    print(("ok   " if cond else "FAIL ") + msg, flush=True)
    if not cond:
        failures.append(msg)


def run(cmd, ok=True):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if ok and r.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r


def logits(args, pkg, out, lora=None, pair=False, lora2=None, chunk=5):
    cmd = [args.logits, pkg, out, "--tokens", ",".join(map(str, PROMPT)), "--chunk", str(chunk), "--decode",
           str(DECODE)]
    if lora:
        cmd += ["--lora", lora]
    if pair:
        cmd += ["--pair"]
    if lora2 is not None:
        cmd += ["--lora2", lora2]
    run(cmd)
    raw = open(out, "rb").read()
    n, vocab = np.frombuffer(raw[:8], dtype="<i4")
    off = 8
    rows = np.frombuffer(raw[off:off + 4 * n * vocab], dtype="<f4").reshape(n, vocab)
    off += 4 * n * vocab
    k = int(np.frombuffer(raw[off:off + 4], dtype="<i4")[0])
    off += 4
    gen = np.frombuffer(raw[off:off + 4 * k], dtype="<i4").tolist()
    off += 4 * k
    second = np.frombuffer(raw[off:off + 4 * n * vocab], dtype="<f4").reshape(n, vocab) if pair else None
    return rows, gen, second


def against_reference(name, args, pkg, cfg, w, folder, tol=TOL):
    rows, gen, _ = logits(args, pkg, os.path.join(args.work, os.path.basename(folder) + ".bin"), lora=folder)
    wm = la.merged(cfg, w, folder)
    ref = llama_ref.forward(cfg, wm, PROMPT + gen)
    scale = max(1.0, np.abs(ref).max())
    err = np.abs(rows - ref).max() / scale
    base = llama_ref.forward(cfg, w, PROMPT + gen)
    moved = np.abs(base - ref).max() / scale
    check(err <= tol and moved > 100 * tol,
          f"{name}: logits of {len(PROMPT) + len(gen)} positions against the merged float64 model, max relative "
          f"error {err:.2e} (<= {tol:.0e}); the adapter moves them by {moved:.2e}")
    ref_greedy = [int(np.argmax(ref[len(PROMPT) - 1 + i])) for i in range(len(gen))]
    check(gen == ref_greedy, f"{name}: greedy tokens {gen} == merged reference {ref_greedy}")
    return rows, gen


def refused(args, pkg, name, folder, *needles):
    r = run([args.logits, pkg, os.path.join(args.work, "bad.bin"), "--tokens", "1,2,3", "--lora", folder], ok=False)
    msg = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""
    check(r.returncode != 0 and all(n in r.stderr for n in needles),
          f"bad adapter ({name}) refused naming {', '.join(needles)}: {msg[:300]}")


def bad_adapters(args, pkg, cfg):
    good = la.write_peft(os.path.join(args.work, "good"), cfg, 4, 8, ["q_proj", "v_proj"], seed=3)
    st = os.path.join(good, "adapter_model.safetensors")

    def variant(name):
        d = os.path.join(args.work, "bad-" + name)
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(good, d)
        return d

    # rank mismatch with the config, shape mismatch with the base (wrong in features)
    d = variant("rank")
    conf = json.load(open(os.path.join(d, "adapter_config.json")))
    conf["r"] = 8
    json.dump(conf, open(os.path.join(d, "adapter_config.json"), "w"))
    refused(args, pkg, "rank 4 tensors, r 8 in the config", d, "adapter_model.safetensors",
            "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight", "expected [8, ")
    d = variant("shape")
    t = la.read_safetensors(st)
    t["base_model.model.model.layers.1.self_attn.v_proj.lora_A.weight"] = np.zeros((4, cfg["hidden_size"] + 1))
    la.write_safetensors(os.path.join(d, "adapter_model.safetensors"), {k: (v, "F32") for k, v in t.items()})
    refused(args, pkg, "in features off by one", d, "layers.1.self_attn.v_proj.lora_A.weight", "input features")
    d = variant("module")
    t = la.read_safetensors(st)
    t["base_model.model.lm_head.lora_A.weight"] = np.zeros((4, cfg["hidden_size"]))
    la.write_safetensors(os.path.join(d, "adapter_model.safetensors"), {k: (v, "F32") for k, v in t.items()})
    refused(args, pkg, "lm_head", d, "base_model.model.lm_head.lora_A.weight", "not a LoRA weight")
    d = variant("target")
    conf = json.load(open(os.path.join(d, "adapter_config.json")))
    conf["target_modules"] = ["q_proj", "embed_tokens"]
    json.dump(conf, open(os.path.join(d, "adapter_config.json"), "w"))
    refused(args, pkg, "target module embed_tokens", d, "adapter_config.json", "embed_tokens")
    d = variant("nan")
    t = la.read_safetensors(st)
    t["base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"][3, 1] = np.nan
    la.write_safetensors(os.path.join(d, "adapter_model.safetensors"), {k: (v, "F32") for k, v in t.items()})
    refused(args, pkg, "NaN", d, "layers.0.self_attn.q_proj.lora_B.weight", "NaN")
    d = variant("half")
    t = la.read_safetensors(st)
    del t["base_model.model.model.layers.1.self_attn.q_proj.lora_B.weight"]
    la.write_safetensors(os.path.join(d, "adapter_model.safetensors"), {k: (v, "F32") for k, v in t.items()})
    refused(args, pkg, "lora_A without lora_B", d, "layer 1's q_proj", "no lora_B")
    d = variant("truncated")
    raw = open(st, "rb").read()
    open(os.path.join(d, "adapter_model.safetensors"), "wb").write(raw[:len(raw) - 100])
    refused(args, pkg, "truncated file", d, "adapter_model.safetensors")
    d = variant("layer")
    t = la.read_safetensors(st)
    t["base_model.model.model.layers.9.self_attn.q_proj.lora_A.weight"] = np.zeros((4, cfg["hidden_size"]))
    la.write_safetensors(os.path.join(d, "adapter_model.safetensors"), {k: (v, "F32") for k, v in t.items()})
    refused(args, pkg, "a layer the base lacks", d, "layers.9.self_attn.q_proj.lora_A.weight", "layers")
    d = variant("dora")
    conf = json.load(open(os.path.join(d, "adapter_config.json")))
    conf["use_dora"] = True
    json.dump(conf, open(os.path.join(d, "adapter_config.json"), "w"))
    refused(args, pkg, "DoRA", d, "adapter_config.json", "use_dora")
    d = variant("rank65")
    conf = json.load(open(os.path.join(d, "adapter_config.json")))
    conf["r"] = 65
    json.dump(conf, open(os.path.join(d, "adapter_config.json"), "w"))
    refused(args, pkg, "rank above the limit", d, "adapter_config.json", "1..64")
    refused(args, pkg, "no such folder", os.path.join(args.work, "missing"), "missing")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--logits", required=True)
    ap.add_argument("--modelpkg", required=True)
    ap.add_argument("--work", required=True)
    args = ap.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    py = sys.executable

    folder = os.path.join(args.work, "hf")
    run([py, os.path.join(HERE, "make_tiny.py"), folder, "--untied"])
    cfg, w = llama_ref.load_folder(folder)
    pkg = os.path.join(args.work, "tiny.mpk")
    run([args.modelpkg, "pack", folder, "-o", pkg])

    a1 = la.write_peft(os.path.join(args.work, "a1"), cfg, 4, 8, seed=11)  # every projection, f32
    a2 = la.write_peft(os.path.join(args.work, "a2"), cfg, 8, 16, ["q_proj", "v_proj", "down_proj"], seed=12,
                       dtype="F16", rslora=True)
    a3 = la.write_peft(os.path.join(args.work, "a3"), cfg, 16, 4, ["k_proj", "o_proj", "gate_proj", "up_proj"], seed=13,
                       dtype="BF16")
    r1, g1 = against_reference("a1 rank 4 all projections f32", args, pkg, cfg, w, a1)
    r2, g2 = against_reference("a2 rank 8 rsLoRA f16 q/v/down", args, pkg, cfg, w, a2)
    r3, g3 = against_reference("a3 rank 16 bf16 k/o/gate/up", args, pkg, cfg, w, a3)
    base, gb, _ = logits(args, pkg, os.path.join(args.work, "base.bin"))

    # Mixed batches: each sequence bit for bit what its adapter gives alone.
    m1, mg1, m2 = logits(args, pkg, os.path.join(args.work, "mix12.bin"), lora=a1, pair=True, lora2=a2)
    check(np.array_equal(m1, r1) and np.array_equal(m2, r2),
          "mixed batch a1 + a2: each sequence's logits equal its adapter alone, bit for bit")
    m1, _, m2 = logits(args, pkg, os.path.join(args.work, "mix1b.bin"), lora=a1, pair=True, lora2="-")
    check(np.array_equal(m1, r1) and np.array_equal(m2, base),
          "mixed batch a1 + base: the adapted sequence equals a1 alone, the other the base alone, bit for bit")
    m1, _, m2 = logits(args, pkg, os.path.join(args.work, "mix33.bin"), lora=a3, pair=True)
    check(np.array_equal(m1, r3) and np.array_equal(m2, r3),
          "two sequences of one adapter in one batch (one group): both equal a3 alone, bit for bit")

    # A quantized base (Q8_0 weights from a GGUF): against its own float64 model with the adapter merged.
    try:
        import gguf  # noqa: F401
        import gguf_exact
        gg = os.path.join(args.work, "q8.gguf")
        run([py, os.path.join(HERE, "make_tiny.py"), os.path.join(args.work, "q8"), "--untied", "--gguf", gg,
             "--gguf-quant", "q8_0"])
        qpkg = os.path.join(args.work, "q8.mpk")
        run([args.modelpkg, "pack", gg, "-o", qpkg])
        qcfg, qw = gguf_exact.load_llama_gguf(gg)
        rows, gen, _ = logits(args, qpkg, os.path.join(args.work, "q8-a1.bin"), lora=a1)
        brows, bgen, _ = logits(args, qpkg, os.path.join(args.work, "q8-base.bin"))
        ref = llama_ref.forward(qcfg, la.merged(qcfg, qw, a1), PROMPT + gen)
        bref = llama_ref.forward(qcfg, qw, PROMPT + bgen)
        e = float(np.sqrt(np.mean((rows - ref) ** 2)))
        eb = float(np.sqrt(np.mean((brows - bref) ** 2)))
        check(e <= 1.5 * eb + 1e-4,
              f"q8_0 base with a1: RMS logit error against its merged float64 model {e:.5f}, the base alone "
              f"against its own {eb:.5f} (the adapter adds no error of its own)")
        # a1 as llama.cpp's GGUF LoRA (lora_b's Q/K rows permuted as its converter does): the same bits
        ga1 = la.write_gguf_lora(os.path.join(args.work, "a1.gguf"), qcfg, a1, llama_ref.permute_for_interleaved)
        grows, ggen, _ = logits(args, qpkg, os.path.join(args.work, "q8-a1-gguf.bin"), lora=ga1)
        check(np.array_equal(grows, rows) and ggen == gen,
              "a1 as a GGUF LoRA file on the q8_0 base: logits equal the PEFT folder's, bit for bit")
    except ImportError:
        print("note: python module gguf missing: the quantized base is skipped")

    # An adapter package (modelpkg pack --lora): the folder's bits on its base, refused on another.
    apkg = os.path.join(args.work, "a1.mpk")
    run([args.modelpkg, "pack", "--lora", a1, "--base", pkg, "-o", apkg, "--name", "a1", "--quiet"])
    prows, pgen, _ = logits(args, pkg, os.path.join(args.work, "a1-pkg.bin"), lora=apkg)
    check(np.array_equal(prows, r1) and pgen == g1, "a1 as an adapter package: logits equal the folder's, bit for bit")
    other = os.path.join(args.work, "hf-other")
    run([py, os.path.join(HERE, "make_tiny.py"), other, "--untied", "--seed", "99"])
    opkg = os.path.join(args.work, "other.mpk")
    run([args.modelpkg, "pack", other, "-o", opkg])
    refused(args, opkg, "an adapter package on another base of the same shapes", apkg, "made for the base", "a1.mpk")

    bad_adapters(args, pkg, cfg)
    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print("all LoRA checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
