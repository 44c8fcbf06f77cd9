"""GGUF -> package, checked with gguf-py (an independent GGUF reader and dequantizer), numpy,
Hugging Face tokenizers and Python's zipfile. Also the bad-input behaviour of `modelpkg pack`."""
import json
import os
import struct
import sys
import tempfile

import numpy as np

try:
    import gguf
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
rng = np.random.default_rng(7)
H, FF, HEADS, KV, VOCAB = 256, 512, 4, 2, 300


def gpt2_bytes():
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


RANDOM_BLOCKS = (Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.Q2_K, Q.Q3_K, Q.IQ4_NL, Q.IQ4_XS)
SCALES_AT = {Q.Q6_K: (208,), Q.Q2_K: (80, 82), Q.Q3_K: (108,), Q.IQ4_NL: (0,), Q.IQ4_XS: (0,)}  # else d, dmin first


def kquant_bytes(qtype, rows, cols):
    """Random K-quant/IQ4 blocks with sane f16 scales (gguf-py cannot quantize these types)."""
    bs, ts = gguf.GGML_QUANT_SIZES[qtype]
    nb = rows * cols // bs
    raw = rng.integers(0, 256, size=(nb, ts), dtype=np.uint8)
    d = np.full(nb, 0.01, np.float16).view(np.uint8).reshape(nb, 2)
    for o in SCALES_AT.get(qtype, (0, 2)):
        raw[:, o:o + 2] = d
    return raw.reshape(rows, cols // bs * ts)


def make_gguf(path, arch="llama", tok_model="gpt2", drop_types=0, layer1=None):
    w = gguf.GGUFWriter(path, arch)
    w.add_block_count(2)
    w.add_context_length(1024)
    w.add_embedding_length(H)
    w.add_feed_forward_length(FF)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV)
    w.add_rope_freq_base(50000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model(tok_model)
    w.add_tokenizer_pre("smollm")
    b2u = gpt2_bytes()
    toks = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + [b2u[b] for b in range(256)]
    merges = []
    letters = "etaoinshr"
    for a in " " + letters:
        for b in letters:
            if len(toks) < VOCAB:
                toks.append(b2u[ord(a)] + b2u[ord(b)])
                merges.append(b2u[ord(a)] + " " + b2u[ord(b)])
    while len(toks) < VOCAB:
        toks.append(f"<extra_{len(toks)}>")
    types = [3, 3, 3] + [1] * (VOCAB - 3)
    types[-1] = 4  # user-defined: an added, non-special token
    w.add_token_list(toks)
    w.add_token_types(types[:len(types) - drop_types])
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template("{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}")
    ref = {}

    def add(name, arr, qtype=None):
        if qtype is None:
            w.add_tensor(name, arr)
            ref[name] = ("plain", arr)
        elif qtype in RANDOM_BLOCKS or qtype == Q.IQ2_XXS:
            raw = kquant_bytes(qtype, *arr)
            w.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=qtype)
            ref[name] = ("quant", qtype, raw)
        else:
            raw = quants.quantize(arr, qtype)
            w.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=qtype)
            ref[name] = ("quant", qtype, raw)

    f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    add("token_embd.weight", f(VOCAB, H), Q.Q8_0)
    add("output_norm.weight", f(H))
    add("output.weight", f(VOCAB, H).astype(np.float16))
    qt = [[Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q4_K, Q.Q5_K, Q.Q6_K],
          layer1 or [Q.F16, Q.BF16, Q.Q8_0, Q.F32, Q.Q5_0, Q.Q4_K, Q.Q6_K]]
    for i in range(2):
        add(f"blk.{i}.attn_norm.weight", f(H))
        add(f"blk.{i}.ffn_norm.weight", f(H))
        shapes = [(H, H), (KV * 64, H), (KV * 64, H), (H, H), (FF, H), (FF, H), (H, FF)]
        names = ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"]
        for n, s, t in zip(names, shapes, qt[i]):
            if t in RANDOM_BLOCKS or t == Q.IQ2_XXS:
                add(f"blk.{i}.{n}.weight", s, t)
            elif t == Q.F16:
                add(f"blk.{i}.{n}.weight", f(*s).astype(np.float16))
            elif t == Q.F32:
                add(f"blk.{i}.{n}.weight", f(*s))
            else:
                add(f"blk.{i}.{n}.weight", f(*s), t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return ref


HF = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
      "output.weight": "lm_head.weight", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
      "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
      "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}


def hf_name(g):
    if g in HF:
        return HF[g]
    _, i, rest = g.split(".", 2)
    return f"model.layers.{i}.{HF[rest[:-len('.weight')]]}.weight"


def main():
    tmp = tempfile.mkdtemp(prefix="mpk-it-gguf-")
    src = os.path.join(tmp, "m.gguf")
    ref = make_gguf(src)
    reader = gguf.GGUFReader(src)
    gt = {t.name: t for t in reader.tensors}

    for target in ("f32", "q8_0"):
        out = os.path.join(tmp, f"m-{target}.mpk")
        run("pack", src, "-o", out, "--dtype", target, "--quiet")
        assert run("verify", out).returncode == 0
        man, tensors = pkgread.load(out)
        assert man["rope_layout"] == "interleaved" and man["kind"] == "causal-lm"
        c = man["config"]
        assert (c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["num_attention_heads"],
                c["num_key_value_heads"], c["head_dim"], c["vocab_size"]) == (H, FF, 2, HEADS, KV, 64, VOCAB)
        assert c["rope_theta"] == 50000.0 and abs(c["rms_norm_eps"] - 1e-5) < 1e-9 and c["tie_word_embeddings"] is False
        assert c["bos_token_id"] == 1 and c["eos_token_id"] == 2 and c["max_position_embeddings"] == 1024
        assert man["tokenizer"]["pre"] == "smollm"
        assert set(tensors) == {hf_name(n) for n in gt}
        for gname, t in gt.items():
            dt, shape, data = tensors[hf_name(gname)]
            assert shape == tuple(int(x) for x in reversed(t.shape)), (gname, shape, t.shape)  # ne innermost first
            qt = t.tensor_type
            # every GGUF type servd reads is kept as it is, whatever --dtype says: same bytes as gguf-py reads
            assert dt == qt.name.lower(), (gname, dt)
            assert bytes(data) == t.data.tobytes(), gname
        if target == "f32":  # inspect names the block dtypes (one line per dtype with its tensors)
            shown = run("inspect", out).stdout
            for name in ("q5_0", "q5_1", "q4_k", "q8_0"):
                assert name in shown, (name, shown)

    # Tokenizer: the converted tokenizer.json loads in Hugging Face tokenizers and round-trips.
    import zipfile
    from tokenizers import Tokenizer
    z = zipfile.ZipFile(os.path.join(tmp, "m-f32.mpk"))
    tok = Tokenizer.from_str(z.read("tokenizer.json").decode())
    enc = tok.encode("<|im_start|>the rain in spain 123<|im_end|>")
    assert enc.ids[0] == 1 and enc.ids[-1] == 2, enc.ids
    assert tok.decode(enc.ids, skip_special_tokens=False) == "<|im_start|>the rain in spain 123<|im_end|>"
    assert tok.decode(enc.ids, skip_special_tokens=True) == "the rain in spain 123"
    assert [t for t in enc.tokens if t in ("1", "2", "3")] == ["1", "2", "3"]  # smollm splits digits
    tj = json.loads(z.read("tokenizer.json"))
    added = {a["id"]: a for a in tj["added_tokens"]}
    assert added[2]["content"] == "<|im_end|>" and added[2]["special"]
    assert not added[VOCAB - 1]["special"]  # user-defined token type: added, not special
    tc = json.loads(z.read("tokenizer_config.json"))
    assert tc["eos_token"] == "<|im_end|>" and tc["bos_token"] == "<|im_start|>"
    assert z.read("chat_template.jinja").decode() == tc["chat_template"]

    # Bad inputs: one line naming the file, exit 1, nothing left under the output name.
    out = os.path.join(tmp, "bad.mpk")
    raw = open(src, "rb").read()
    for n in (3, 20, 100, len(raw) // 2, len(raw) - 1):
        p = os.path.join(tmp, "trunc.gguf")
        open(p, "wb").write(raw[:n])
        check_fail(["pack", p, "-o", out, "--quiet"], "trunc.gguf", out)
    p = os.path.join(tmp, "count.gguf")
    open(p, "wb").write(raw[:16] + struct.pack("<Q", 1 << 60) + raw[24:])  # n_kv beyond the file
    check_fail(["pack", p, "-o", out, "--quiet"], "n_kv", out)
    p = os.path.join(tmp, "arch.gguf")
    make_gguf(p, arch="gpt2")
    check_fail(["pack", p, "-o", out, "--quiet"], "general.architecture", out)
    make_gguf(p, tok_model="llama")  # a SentencePiece vocabulary needs tokenizer.ggml.scores
    check_fail(["pack", p, "-o", out, "--quiet"], "tokenizer.ggml.model", out)
    make_gguf(p, drop_types=5)  # token_type shorter than the token list
    check_fail(["pack", p, "-o", out, "--quiet"], "tokenizer.ggml.token_type", out)

    # Q2_K, Q3_K, IQ4_NL and IQ4_XS are kept byte for byte too, and inspect names them.
    p = os.path.join(tmp, "lowbit.gguf")
    make_gguf(p, layer1=[Q.Q2_K, Q.Q3_K, Q.IQ4_NL, Q.IQ4_XS, Q.Q3_K, Q.IQ4_XS, Q.Q2_K])
    lb = os.path.join(tmp, "lowbit.mpk")
    run("pack", p, "-o", lb, "--quiet")
    assert run("verify", lb).returncode == 0
    _, tensors = pkgread.load(lb)
    lt = {t.name: t for t in gguf.GGUFReader(p).tensors}
    for gname, t in lt.items():
        dt, _, data = tensors[hf_name(gname)]
        assert dt == t.tensor_type.name.lower() and bytes(data) == t.data.tobytes(), (gname, dt)
    shown = run("inspect", lb).stdout
    for name in ("q2_k", "q3_k", "iq4_nl", "iq4_xs"):
        assert name in shown, (name, shown)
    # A NaN or infinite block scale is refused naming the tensor, the block and the field.
    lraw = bytearray(open(p, "rb").read())
    for gname, at, h, what in (("blk.1.attn_v.weight", 0, 0x7e00, "NaN"), ("blk.1.ffn_down.weight", 82, 0x7c00,
                                                                           "infinite")):
        t = lt[gname]
        bs, ts = gguf.GGML_QUANT_SIZES[t.tensor_type]
        bad = bytearray(lraw)
        struct.pack_into("<H", bad, t.data_offset + 3 * ts + at, h)  # block 3
        q = os.path.join(tmp, "nan.gguf")
        open(q, "wb").write(bad)
        check_fail(["pack", q, "-o", out, "--quiet"], gname, out)
        r = run("pack", q, "-o", out, "--quiet", ok=False)
        assert "block 3" in r.stderr and what in r.stderr, r.stderr
    # A row that is not whole blocks (ne[0] of an IQ4_XS tensor patched from 256 to 128) and a file cut
    # inside the last tensor's blocks are refused naming the tensor.
    name = b"blk.1.ffn_up.weight"
    at = lraw.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)
    assert struct.unpack_from("<I", lraw, at)[0] == 2 and struct.unpack_from("<Q", lraw, at + 4)[0] == H
    bad = bytearray(lraw)
    struct.pack_into("<Q", bad, at + 4, 128)
    q = os.path.join(tmp, "rowlen.gguf")
    open(q, "wb").write(bad)
    check_fail(["pack", q, "-o", out, "--quiet"], "blk.1.ffn_up.weight", out)
    assert "IQ4_XS" in run("pack", q, "-o", out, "--quiet", ok=False).stderr
    open(q, "wb").write(lraw[:-50])
    check_fail(["pack", q, "-o", out, "--quiet"], "rowlen.gguf", out)
    # Other ggml types are refused naming the tensor and the type.
    make_gguf(p, layer1=[Q.Q2_K, Q.IQ2_XXS, Q.IQ4_NL, Q.IQ4_XS, Q.Q3_K, Q.IQ4_XS, Q.Q2_K])
    check_fail(["pack", p, "-o", out, "--quiet"], "blk.1.attn_k.weight", out)
    assert "IQ2_XXS" in run("pack", p, "-o", out, "--quiet", ok=False).stderr
    print("ok")


if __name__ == "__main__":
    main()
