"""End to end: a tiny Llama whose GGUF carries Llama 3 rope scaling as rope_freqs.weight (as llama.cpp's
converter writes it) gives the same logits under servd as the same weights packed from the Hugging
Face folder whose config.json has the equivalent rope_scaling, and both match the independent numpy
reference (tests/llama/llama_ref.py) with that scaling, while plain RoPE would be far off.

The model is tests/llama/make_tiny.py's (head_dim 16, tied embeddings) with rope_theta 10000 and
rope_scaling (factor 8, low 1, high 4, original 2048): of the 8 frequency pairs, 4 and 5 lie between
the two wavelength bounds (smoothed) and 6 and 7 beyond (divided by 8), so the scaling changes the
logits already at the first positions. No rope.scaling metadata is written: the importer has only the
tensor.

Tolerance, as in tests/llama/test_llama.py: servd computes in f32 against a float64 reference and
the interleaved (GGUF) and half-split (HF) layouts sum in different orders; observed errors are
below 1e-6 of the largest logit, we allow 2e-5 * max(1, max|ref|), while ignoring the scaling moves
the logits by more than 100 times that (checked).

    it_gguf_rope_e2e.py MODELPKG   (SERVD_LLAMA_LOGITS: tests/llama's llama_logits; skipped without)
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

try:
    import gguf
except ImportError as e:  # test-only tools of .venv-test (scripts/install-deps.sh)
    print(f"skipped: {e}")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "llama"))
import llama_ref  # noqa: E402
import make_tiny  # noqa: E402
from rope_freqs_ref import extra_gguf_tensors, llama3_rope_factors  # noqa: E402

MODELPKG = sys.argv[1]
LOGITS = os.environ.get("SERVD_LLAMA_LOGITS", "")
if not LOGITS or not os.path.exists(LOGITS):
    print("skipped: SERVD_LLAMA_LOGITS (tests/llama's llama_logits) is not built")
    sys.exit(77)

TOL = 2e-5
PROMPT = list("The quick brown fox, 12345!".encode())
SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
           "original_max_position_embeddings": 2048}


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if r.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r


def servd_logits(pkg, out):
    run([LOGITS, pkg, out, "--tokens", ",".join(map(str, PROMPT)), "--chunk", "5", "--decode", "8"])
    raw = open(out, "rb").read()
    n, vocab = np.frombuffer(raw[:8], dtype="<i4")
    rows = np.frombuffer(raw[8:8 + 4 * n * vocab], dtype="<f4").reshape(n, vocab).astype(np.float64)
    off = 8 + 4 * n * vocab
    k = int(np.frombuffer(raw[off:off + 4], dtype="<i4")[0])
    return rows, np.frombuffer(raw[off + 4:off + 4 + 4 * k], dtype="<i4").tolist()


def main():
    with tempfile.TemporaryDirectory(prefix="mpk-it-rope-e2e-") as tmp:
        check(tmp)


def check(tmp):
    folder = os.path.join(tmp, "hf")
    os.makedirs(folder)
    a = argparse.Namespace(llama3_scaling=False, untied=False, heads=None, kv_heads=None, head_dim=None)
    cfg = make_tiny.config(a)
    cfg["rope_theta"] = 10000.0
    w = make_tiny.weights(cfg, np.random.default_rng(99))
    hd = cfg["head_dim"]

    # GGUF: as llama.cpp converts it, the scaling only as rope_freqs.weight.
    gg = os.path.join(tmp, "m.gguf")
    ff = llama3_rope_factors(hd, cfg["rope_theta"], SCALING["factor"], SCALING["low_freq_factor"],
                             SCALING["high_freq_factor"], SCALING["original_max_position_embeddings"])
    assert (ff == 1).sum() == 4 and (ff == 8).sum() == 2, ff  # pairs 0-3 kept, 4-5 smoothed, 6-7 scaled
    with extra_gguf_tensors(gguf, {"rope_freqs.weight": ff}):
        make_tiny.write_gguf(gg, cfg, w)

    # Hugging Face folder: the same weights, rope_scaling in config.json.
    cfg["rope_scaling"] = dict(SCALING)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    make_tiny.write_safetensors(os.path.join(folder, "model.safetensors"), w)
    with open(os.path.join(folder, "tokenizer.json"), "w") as f:
        json.dump(make_tiny.tokenizer_json(cfg), f, ensure_ascii=False)

    pk_g, pk_h = os.path.join(tmp, "gguf.mpk"), os.path.join(tmp, "hf.mpk")
    run([MODELPKG, "pack", gg, "-o", pk_g, "--quiet"])
    run([MODELPKG, "pack", folder, "-o", pk_h, "--quiet"])
    import zipfile
    cg = json.loads(zipfile.ZipFile(pk_g).read("manifest.json"))["config"]
    ch = json.loads(zipfile.ZipFile(pk_h).read("manifest.json"))["config"]
    assert cg["rope_scaling"] == ch["rope_scaling"] == SCALING, (cg["rope_scaling"], ch["rope_scaling"])
    assert cg["rope_theta"] == ch["rope_theta"] == 10000.0
    print(f"ok   GGUF and HF configs agree: rope_scaling {cg['rope_scaling']}")

    rows_g, gen_g = servd_logits(pk_g, os.path.join(tmp, "g.bin"))
    rows_h, gen_h = servd_logits(pk_h, os.path.join(tmp, "h.bin"))
    assert gen_g == gen_h, (gen_g, gen_h)
    toks = PROMPT + gen_h
    ref = llama_ref.forward(cfg, {k: v.astype(np.float64) for k, v in w.items()}, toks)
    scale = max(1.0, np.abs(ref).max())
    plain = dict(cfg, rope_scaling=None)
    ref_plain = llama_ref.forward(plain, {k: v.astype(np.float64) for k, v in w.items()}, toks)
    e_gh = np.abs(rows_g - rows_h).max() / scale
    e_g = np.abs(rows_g - ref).max() / scale
    e_h = np.abs(rows_h - ref).max() / scale
    e_plain = np.abs(ref_plain - ref).max() / scale
    print(f"     max relative error: GGUF vs HF {e_gh:.2e}, GGUF vs reference {e_g:.2e}, HF vs reference "
          f"{e_h:.2e}; plain RoPE vs scaled {e_plain:.2e}")
    assert e_plain > 100 * TOL, "the scaling must matter for this model, or the test proves nothing"
    assert e_gh <= TOL and e_g <= TOL and e_h <= TOL, (e_gh, e_g, e_h)
    ref_greedy = [int(np.argmax(ref[len(PROMPT) - 1 + i])) for i in range(len(gen_g))]
    assert gen_g == ref_greedy, (gen_g, ref_greedy)
    print(f"ok   {len(toks)} positions, greedy {gen_g}")


if __name__ == "__main__":
    main()
