"""Seeds of fuzz_gguf_import: the smallest GGUFs of the families whose metadata readers differ
(Qwen2 with YaRN, Phi-3 with LongRoPE factor tensors, Gemma 3), written by tests/llama/make_tiny.py's
writers at 2 heads of head_dim 4, one layer; and a BERT encoder (bert.* metadata, a WordPiece
vocabulary) from tests/bert/tiny_bert.py through scripts/bench/minilm_gguf.py.

    python3 tests/fuzz/make_gguf_import_seeds.py tests/fuzz/corpus/gguf_import
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "llama"))
import make_tiny  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    out = ap.parse_args().out
    os.makedirs(out, exist_ok=True)
    for fam, extra in (("qwen2", ["--yarn"]), ("phi3", ["--longrope"]), ("gemma3", [])):
        args = make_tiny.argparse.Namespace(family=fam, untied=True, llama3_scaling=False, heads=None, kv_heads=None,
                                            head_dim=None, layer_types=False, linear_scaling=False,
                                            longrope="--longrope" in extra, yarn="--yarn" in extra, dims="2,1,4,8,1")
        cfg = make_tiny.config(args)
        cfg["vocab_size"] = 272
        if fam == "phi3":
            cfg["rope_scaling"]["short_factor"] = cfg["rope_scaling"]["short_factor"][:2]
            cfg["rope_scaling"]["long_factor"] = cfg["rope_scaling"]["long_factor"][:2]
            cfg["original_max_position_embeddings"] = 64
        w = make_tiny.weights(cfg, np.random.default_rng(1))
        make_tiny.write_gguf(os.path.join(out, f"{fam}.gguf"), cfg, w)
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    sys.path.insert(0, os.path.join(root, "tests", "bert"))
    import tiny_bert
    with tempfile.TemporaryDirectory() as d:
        tiny_bert.make_folder(d, tiny_bert.bert_tensors(np.random.default_rng(1)), ["BertModel"])
        subprocess.check_call([sys.executable, os.path.join(root, "scripts", "bench", "minilm_gguf.py"), d,
                               os.path.join(out, "bert.gguf")])


if __name__ == "__main__":
    main()
