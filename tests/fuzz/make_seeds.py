"""Regenerates the small seed corpus of the fuzz targets (run with .venv-test's Python):
    .venv-test/bin/python tests/fuzz/make_seeds.py build-pkg/package_format/modelpkg"""
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q
from gguf import quants

here = os.path.dirname(os.path.abspath(__file__))
corpus = os.path.join(here, "corpus")


def st_file(tensors):
    hdr, off, blobs = {}, 0, []
    for name, (dt, shape, data) in tensors.items():
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(data)]}
        off += len(data)
        blobs.append(data)
    h = json.dumps(hdr).encode()
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


def main():
    rng = np.random.default_rng(1)
    # GGUF: a few keys of every kind and small tensors of several types.
    tmp = tempfile.mkdtemp()
    # seed3, the low-bit types, draws from its own generator so the seeds before it stay as they were.
    blocks = (Q.Q4_K, Q.Q6_K, Q.Q2_K, Q.Q3_K, Q.IQ4_NL, Q.IQ4_XS)
    lowbit_rng = np.random.default_rng(3)
    for i, types in enumerate([[Q.F32, Q.Q8_0], [Q.Q4_1, Q.Q5_0, Q.F16], [Q.Q4_K, Q.Q6_K],
                               [Q.Q2_K, Q.Q3_K, Q.IQ4_NL, Q.IQ4_XS]]):
        p = os.path.join(tmp, f"{i}.gguf")
        w = gguf.GGUFWriter(p, "llama")
        w.add_block_count(1)
        w.add_tokenizer_model("gpt2")
        w.add_token_list(["a", "b", "ab"])
        w.add_token_types([1, 1, 3])
        w.add_rope_freq_base(10000.0)
        w.add_bool("x.flag", True)
        for j, t in enumerate(types):
            cols = 256 if t in blocks and t != Q.IQ4_NL else 32
            if t in blocks:
                bs, ts = gguf.GGML_QUANT_SIZES[t]
                raw = (lowbit_rng if i == 3 else rng).integers(0, 256, size=(2, ts), dtype=np.uint8)
                w.add_tensor(f"t{j}", raw, raw_shape=raw.shape, raw_dtype=t)
            elif t in (Q.F32, Q.F16):
                w.add_tensor(f"t{j}", rng.standard_normal((2, cols)).astype(np.float32 if t == Q.F32 else np.float16))
            else:
                raw = quants.quantize(rng.standard_normal((2, cols)).astype(np.float32), t)
                w.add_tensor(f"t{j}", raw, raw_shape=raw.shape, raw_dtype=t)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.makedirs(os.path.join(corpus, "gguf"), exist_ok=True)
        os.replace(p, os.path.join(corpus, "gguf", f"seed{i}.gguf"))
    # safetensors
    os.makedirs(os.path.join(corpus, "safetensors"), exist_ok=True)
    f = rng.standard_normal(6).astype(np.float32).tobytes()
    open(os.path.join(corpus, "safetensors", "seed0.safetensors"), "wb").write(
        st_file({"a": ("F32", [2, 3], f), "b": ("BF16", [2], b"\1\2\3\4"), "c": ("U8", [0], b"")}))
    open(os.path.join(corpus, "safetensors", "seed1.safetensors"), "wb").write(st_file({}))
    # package: a micro Llama folder with a one-file code folder.
    modelpkg = sys.argv[1]
    hf, code = os.path.join(tmp, "hf"), os.path.join(tmp, "m")
    os.makedirs(hf)
    os.makedirs(code)
    open(os.path.join(code, "model.py"), "w").write("class M: pass\n")
    json.dump({"model_type": "llama", "hidden_size": 32}, open(os.path.join(hf, "config.json"), "w"))
    open(os.path.join(hf, "tokenizer.json"), "w").write("{}")
    open(os.path.join(hf, "model.safetensors"), "wb").write(
        st_file({"w": ("F32", [2, 32], rng.standard_normal(64).astype(np.float32).tobytes()), "n": ("BF16", [4], bytes(8))}))
    os.makedirs(os.path.join(corpus, "package"), exist_ok=True)
    out = os.path.join(corpus, "package", "seed0.mpk")
    subprocess.check_call([modelpkg, "pack", hf, "-o", out, "--code", code, "--entry-point", "m.model:M", "--quiet"])
    subprocess.check_call([modelpkg, "pack", hf, "-o", os.path.join(corpus, "package", "seed1.mpk"), "--code", code,
                           "--entry-point", "m.model:M", "--dtype", "q8_0", "--convert-all", "--quiet"])


if __name__ == "__main__":
    main()
