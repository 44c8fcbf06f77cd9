"""Seeds of fuzz_lora: PEFT adapters (u32 config length, adapter_config.json, adapter_model.safetensors)
for fuzz_lora.c's base (2 layers, hidden 8, q 8, k/v 4, MLP 16).

    make_lora_seeds.py OUT_DIR
"""
import json
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "llama"))
import lora_adapters as la  # noqa: E402

CFG = {"hidden_size": 8, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 4, "intermediate_size": 16,
       "num_hidden_layers": 2}


def seed(out, name, rank, modules, dtype, extra=None):
    d = os.path.join(out, "tmp-" + name)
    la.write_peft(d, CFG, rank, 2 * rank, modules, seed=len(name), dtype=dtype, extra_config=extra)
    conf = open(os.path.join(d, "adapter_config.json"), "rb").read()
    st = open(os.path.join(d, "adapter_model.safetensors"), "rb").read()
    with open(os.path.join(out, name), "wb") as f:
        f.write(struct.pack("<I", len(conf)) + conf + st)
    for fn in os.listdir(d):
        os.remove(os.path.join(d, fn))
    os.rmdir(d)


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    np.random.seed(0)
    seed(out, "all-f32", 2, la.ALL, "F32")
    seed(out, "qv-f16", 4, ["q_proj", "v_proj"], "F16", {"use_rslora": True})
    seed(out, "mlp-bf16", 1, ["gate_proj", "up_proj", "down_proj"], "BF16")
    seed(out, "dora", 2, ["q_proj"], "F32", {"use_dora": True})
    try:  # a llama.cpp GGUF LoRA file of the first adapter (gguf-py from .venv-test)
        d = os.path.join(out, "tmp-gguf")
        la.write_peft(d, CFG, 2, 4, la.ALL, seed=9)
        la.write_gguf_lora(os.path.join(out, "gguf-f32"), CFG, d)
        for fn in os.listdir(d):
            os.remove(os.path.join(d, fn))
        os.rmdir(d)
    except ImportError:
        print("note: python module gguf missing: no GGUF seed")


if __name__ == "__main__":
    main()
