"""GGUF rope_freqs.weight (Llama 3.1/3.2 rope scaling as per-dimension factors) -> the config's
rope_scaling. The factors come from an independent numpy transcription of llama.cpp's converter
(rope_freqs_ref.py); the package is read with Python's zipfile/json (pkgread). Checks: the config
says exactly the Hugging Face rope_scaling the factors were made from, the tensor is not stored,
and files whose factors are not a Llama 3 scaling (random, wrong length, wrong type, combined with a
linear factor, off by 1e-5) are refused with one line naming the file and the tensor."""
import os
import sys
import tempfile

import numpy as np

try:
    import gguf
except ImportError as e:  # test-only tools of .venv-test (scripts/install-deps.sh)
    print(f"skipped: {e}")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(__file__))
import modelpkg_cli  # noqa: E402
import pkgread  # noqa: E402
from rope_freqs_ref import llama3_rope_factors  # noqa: E402

CLI = modelpkg_cli.Modelpkg(sys.argv[1])
run, check_fail = CLI.run, CLI.check_fail
rng = np.random.default_rng(11)
VOCAB = 260


def make_gguf(path, head_dim, theta, rope_freqs, heads=2, kv=None):
    """A one-layer llama GGUF (f32) with `rope_freqs` (an array, or None) as rope_freqs.weight.
    kv: extra metadata {key: (value, GGUFValueType)}."""
    dim = heads * head_dim
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(1)
    w.add_context_length(131072)
    w.add_embedding_length(dim)
    w.add_feed_forward_length(2 * dim)
    w.add_head_count(heads)
    w.add_head_count_kv(heads)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(theta)
    w.add_layer_norm_rms_eps(1e-5)
    for key, (value, vtype) in (kv or {}).items():
        w.add_key_value(key, value, vtype)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("llama-bpe")
    w.add_token_list([f"<t{i}>" for i in range(VOCAB)])
    w.add_token_merges([])
    f = lambda *s: (rng.standard_normal(s) * 0.1).astype(np.float32)  # noqa: E731
    w.add_tensor("token_embd.weight", f(VOCAB, dim))
    w.add_tensor("output_norm.weight", f(dim))
    if rope_freqs is not None:
        w.add_tensor("rope_freqs.weight", rope_freqs)
    for n, s in (("attn_norm", (dim,)), ("ffn_norm", (dim,)), ("attn_q", (dim, dim)), ("attn_k", (dim, dim)),
                 ("attn_v", (dim, dim)), ("attn_output", (dim, dim)), ("ffn_gate", (2 * dim, dim)),
                 ("ffn_up", (2 * dim, dim)), ("ffn_down", (dim, 2 * dim))):
        w.add_tensor(f"blk.0.{n}.weight", f(*s))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def hf_scaling(factor, low, high, orig):
    return {"rope_type": "llama3", "factor": factor, "low_freq_factor": low, "high_freq_factor": high,
            "original_max_position_embeddings": orig}


def pack_config(tmp, name, **kw):
    src, out = os.path.join(tmp, name + ".gguf"), os.path.join(tmp, name + ".mpk")
    make_gguf(src, **kw)
    run("pack", src, "-o", out, "--quiet")
    assert run("verify", out).returncode == 0
    man, tensors = pkgread.load(out)
    assert not [n for n in tensors if "rope_freqs" in n], sorted(tensors)  # the config says it instead
    return man["config"]


def main():
    with tempfile.TemporaryDirectory(prefix="mpk-it-rope-freqs-") as tmp:
        check(tmp)


def check(tmp):
    U = gguf.GGUFValueType.UINT32

    # Llama 3.1 8B (head_dim 128) and Llama 3.2 1B/3B (head_dim 64), theta 500000, no metadata.
    for name, hd, params in (("llama31", 128, (8.0, 1.0, 4.0, 8192)), ("llama32", 64, (32.0, 1.0, 4.0, 8192)),
                             ("llama32_hd128", 128, (32.0, 1.0, 4.0, 8192))):
        ff = llama3_rope_factors(hd, 500000.0, *params)
        assert 1.0 < ff[hd // 4] < params[0] or (ff > 1).sum() < hd // 2, "factors cover the three regions"
        c = pack_config(tmp, name, head_dim=hd, theta=500000.0, rope_freqs=ff)
        assert c["rope_scaling"] == hf_scaling(*params), (name, c["rope_scaling"])
        assert c["rope_theta"] == 500000.0 and c["head_dim"] == hd
        print(f"ok   {name}: rope_scaling {c['rope_scaling']}")

    # Other parameters of the search. (orig, low, high) and (orig/2, low/2, high/2) give the same
    # factors: (8, 2, 8, 4096) is found as its equivalent (8, 1, 4, 2048), the first candidate that
    # reproduces them.
    for params, want in (((16.0, 1.0, 8.0, 2048), None), ((4.0, 0.5, 2.0, 32768), None),
                         ((8.0, 0.5, 8.0, 4096), None), ((8.0, 2.0, 8.0, 4096), (8.0, 1.0, 4.0, 2048))):
        ff = llama3_rope_factors(128, 500000.0, *params)
        c = pack_config(tmp, "search", head_dim=128, theta=500000.0, rope_freqs=ff)
        rs = c["rope_scaling"]
        assert rs == hf_scaling(*(want or params)), (params, rs)
        again = llama3_rope_factors(128, 500000.0, rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"],
                                    rs["original_max_position_embeddings"])
        np.testing.assert_allclose(again, ff, rtol=1e-6)
        print(f"ok   search {params} -> {want or params}")

    # An original context outside the candidates, given by llama.rope.scaling.original_context_length.
    ff = llama3_rope_factors(16, 10000.0, 8.0, 1.0, 4.0, 64)
    c = pack_config(tmp, "hint", head_dim=16, theta=10000.0, rope_freqs=ff,
                    kv={"llama.rope.scaling.original_context_length": (64, U)})
    assert c["rope_scaling"] == hf_scaling(8.0, 1.0, 4.0, 64), c["rope_scaling"]
    print("ok   original_context_length metadata")

    # All factors 1: plain RoPE.
    c = pack_config(tmp, "ones", head_dim=64, theta=500000.0, rope_freqs=np.ones(32, np.float32))
    assert c["rope_scaling"] is None, c["rope_scaling"]
    print("ok   all-ones rope_freqs -> rope_scaling null")

    # Refusals: exit 1, one line naming the file and the tensor, no package left behind.
    out = os.path.join(tmp, "bad.mpk")
    good = llama3_rope_factors(64, 500000.0, 32.0, 1.0, 4.0, 8192)
    mid = int(np.flatnonzero((good > 1) & (good < 32))[0])  # a factor between the two plateaus
    bad = {
        "random": (dict(rope_freqs=rng.uniform(1.0, 8.0, 32).astype(np.float32)), "match no Llama-3 rope scaling"),
        "offby": (dict(rope_freqs=good * np.where(np.arange(32) == mid, 1 + 1e-5, 1).astype(np.float32)),
                  "match no Llama-3 rope scaling"),
        "short": (dict(rope_freqs=good[:31].copy()), "expected head_dim/2 = 32"),
        "long": (dict(rope_freqs=np.concatenate([good, good])), "expected head_dim/2 = 32"),
        "matrix": (dict(rope_freqs=np.stack([good, good])), "expected head_dim/2 = 32"),
        "f16": (dict(rope_freqs=good.astype(np.float16)), "expected F32"),
        "negative": (dict(rope_freqs=-good), "expected positive finite"),
        "nan": (dict(rope_freqs=np.where(np.arange(32) == 3, np.nan, good).astype(np.float32)), "expected positive finite"),
        "linear": (dict(rope_freqs=good, kv={"llama.rope.scaling.factor": (4.0, gguf.GGUFValueType.FLOAT32)}),
                   "combined are not supported"),
    }
    for name, (kw, msg) in bad.items():
        p = os.path.join(tmp, name + ".gguf")
        make_gguf(p, head_dim=64, theta=500000.0, **kw)
        check_fail(["pack", p, "-o", out, "--quiet"], msg, out)
        line = run("pack", p, "-o", out, "--quiet", ok=False).stderr.strip()
        assert name + ".gguf" in line and "rope_freqs.weight" in line, line
        print(f"ok   refused {name}: {line}")

    # A file cut inside the rope_freqs data: the reader refuses it before the fit looks at it.
    p = os.path.join(tmp, "trunc.gguf")
    make_gguf(p, head_dim=64, theta=500000.0, rope_freqs=good)
    raw = open(p, "rb").read()
    rf = [t for t in gguf.GGUFReader(p).tensors if t.name == "rope_freqs.weight"][0]
    open(p, "wb").write(raw[:int(rf.data_offset) + 10])
    check_fail(["pack", p, "-o", out, "--quiet"], "trunc.gguf", out)
    print("ok")


if __name__ == "__main__":
    main()
