"""Synthetic PEFT LoRA adapters for tests and benchmarks, written in PEFT's layout with numpy alone.

    write_peft(folder, cfg, rank, alpha, modules, seed, dtype="F32", rslora=False, layers=None)

writes adapter_config.json and adapter_model.safetensors with
base_model.model.model.layers.N.<self_attn|mlp>.<module>.lora_{A,B}.weight: lora_A (r, in) and
lora_B (out, r), values from a fixed seed (B nonzero, unlike PEFT's initialization, so the adapter
changes the output). merged(cfg, w, folder) returns the base weights with W + scale * B @ A for each
adapted projection: the float64 model the adapter means.
"""
import json
import math
import os
import struct

import numpy as np

PARENT = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
          "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}
ALL = list(PARENT)


def shapes(cfg):
    """(out, in) of each projection."""
    d = cfg["hidden_size"]
    h = cfg["num_attention_heads"]
    kvh = cfg.get("num_key_value_heads", h)
    hd = cfg.get("head_dim") or d // h
    ff = cfg["intermediate_size"]
    return {"q_proj": (h * hd, d), "k_proj": (kvh * hd, d), "v_proj": (kvh * hd, d), "o_proj": (d, h * hd),
            "gate_proj": (ff, d), "up_proj": (ff, d), "down_proj": (d, ff)}


def _bf16_bytes(a):
    u = np.ascontiguousarray(a, dtype="<f4").view("<u4")
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype("<u2").tobytes()


def write_safetensors(path, tensors):
    """tensors: name -> (array, "F32" | "F16" | "BF16")."""
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        a, dt = tensors[name]
        raw = (np.ascontiguousarray(a, dtype="<f4").tobytes() if dt == "F32" else
               np.ascontiguousarray(a, dtype="<f2").tobytes() if dt == "F16" else _bf16_bytes(a))
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def stored(a, dt):
    """The values a file of dtype dt holds for a (what the reader gets back)."""
    if dt == "F32":
        return a.astype(np.float32).astype(np.float64)
    if dt == "F16":
        return a.astype(np.float16).astype(np.float64)
    u = np.ascontiguousarray(a, dtype="<f4").view("<u4")
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return u.astype("<u4").view("<f4").astype(np.float64)


def write_peft(folder, cfg, rank, alpha, modules=ALL, seed=7, dtype="F32", rslora=False, layers=None, scale_b=0.02,
               extra_config=None):
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(seed)
    sh = shapes(cfg)
    tensors = {}
    for li in range(cfg["num_hidden_layers"] if layers is None else layers):
        for m in modules:
            out, inp = sh[m]
            pre = f"base_model.model.model.layers.{li}.{PARENT[m]}.{m}"
            a = rng.standard_normal((rank, inp)) / math.sqrt(inp)
            b = rng.standard_normal((out, rank)) * scale_b
            tensors[pre + ".lora_A.weight"] = (stored(a, dtype), dtype)
            tensors[pre + ".lora_B.weight"] = (stored(b, dtype), dtype)
    conf = {"peft_type": "LORA", "r": rank, "lora_alpha": alpha, "use_rslora": rslora, "target_modules": list(modules),
            "bias": "none", "fan_in_fan_out": False, "base_model_name_or_path": "tiny-llama", "task_type": "CAUSAL_LM"}
    conf.update(extra_config or {})
    with open(os.path.join(folder, "adapter_config.json"), "w") as f:
        json.dump(conf, f)
    write_safetensors(os.path.join(folder, "adapter_model.safetensors"), tensors)
    return folder


def read_safetensors(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    hdr = json.loads(raw[8:8 + n])
    out = {}
    for name, t in hdr.items():
        if name == "__metadata__":
            continue
        b, e = t["data_offsets"]
        buf = raw[8 + n + b:8 + n + e]
        if t["dtype"] == "F32":
            a = np.frombuffer(buf, "<f4")
        elif t["dtype"] == "F16":
            a = np.frombuffer(buf, "<f2")
        else:
            a = (np.frombuffer(buf, "<u2").astype("<u4") << 16).view("<f4")
        out[name] = a.astype(np.float64).reshape(t["shape"])
    return out


def merged(cfg, w, folder):
    """Base weights (llama_ref.load_folder's dict) with each adapted projection W + scale * B @ A."""
    conf = json.load(open(os.path.join(folder, "adapter_config.json")))
    r, alpha = conf["r"], conf["lora_alpha"]
    scale = alpha / math.sqrt(r) if conf.get("use_rslora") else alpha / r
    t = read_safetensors(os.path.join(folder, "adapter_model.safetensors"))
    w = dict(w)
    for name, a in t.items():
        if ".lora_A." not in name:
            continue
        b = t[name.replace(".lora_A.", ".lora_B.")]
        base = name.replace("base_model.model.", "", 1).replace(".lora_A.weight", ".weight")
        w[base] = np.asarray(w[base], dtype=np.float64) + scale * (b @ a)
    return w


GGUF_NAME = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
             "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down"}


def write_gguf_lora(path, cfg, folder, permute=None):
    """The PEFT adapter in folder as llama.cpp's convert_lora_to_gguf.py writes it: general.type
    "adapter", adapter.type "lora", adapter.lora.alpha, blk.N.<name>.weight.lora_a (r, in) and lora_b
    (out, r) in f32; permute(b, n_head): the Q/K row permutation the converter applies to a Llama's
    lora_b (llama_ref.permute_for_interleaved)."""
    import gguf
    conf = json.load(open(os.path.join(folder, "adapter_config.json")))
    t = read_safetensors(os.path.join(folder, "adapter_model.safetensors"))
    g = gguf.GGUFWriter(path, "llama")
    g.add_string("general.type", "adapter")
    g.add_string("adapter.type", "lora")
    g.add_float32("adapter.lora.alpha", float(conf["lora_alpha"]))
    heads = {"q_proj": cfg["num_attention_heads"], "k_proj": cfg.get("num_key_value_heads", cfg["num_attention_heads"])}
    for name in sorted(t):
        if ".lora_A." not in name:
            continue
        parts = name.split(".")
        li, mod = int(parts[4]), parts[6]
        a, b = t[name], t[name.replace(".lora_A.", ".lora_B.")]
        if permute and mod in heads:
            b = permute(b, heads[mod])
        g.add_tensor(f"blk.{li}.{GGUF_NAME[mod]}.weight.lora_a", np.ascontiguousarray(a, np.float32))
        g.add_tensor(f"blk.{li}.{GGUF_NAME[mod]}.weight.lora_b", np.ascontiguousarray(b, np.float32))
    g.write_header_to_file()
    g.write_kv_data_to_file()
    g.write_tensors_to_file()
    g.close()
    return path
