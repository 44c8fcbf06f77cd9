"""A small generic model for the `modelpkg pack --kind generic` tests: its code folder, and
safetensors files written here with struct + numpy (independent of servd's writer)."""
import json
import os
import struct

import numpy as np

MODEL_PY = '''"""Two-layer linear model: y = (x W1^T) W2^T * scale, and the config's scale as a tensor."""
import servd
from servd import ops


class Toy:
    def __init__(self):
        cfg = servd.package.config
        self.scale = float(cfg["scale"])
        self.w1 = servd.package.tensor("layer1.weight")   # f32 (hidden, d_in)
        self.w2 = servd.package.tensor("layer2.weight")   # f16 (d_out, hidden)

    def predict(self, inputs):
        x = inputs["x"]
        m = x.shape[0]
        h = servd.empty((m, self.w1.shape[0]))
        y = servd.empty((m, self.w2.shape[0]))
        ops.matmul(h, x, self.w1)
        ops.matmul(y, h, self.w2)
        return {"y": y, "scale": servd.tensor([self.scale])}
'''

D_IN, HIDDEN, D_OUT = 16, 8, 4


def write_safetensors(path, tensors, metadata=None):
    """tensors: {name: (st_dtype, shape, raw bytes)}; written in the given order, packed."""
    hdr, off, blobs = {}, 0, []
    for name, (dt, shape, raw) in tensors.items():
        hdr[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        blobs.append(raw)
    if metadata:
        hdr["__metadata__"] = metadata
    h = json.dumps(hdr).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def bf16_bytes(a):
    """f32 -> bf16 by truncation (exactly representable inputs give exact values)."""
    return (np.asarray(a, np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()


def make(tmp, name="toy_model"):
    """Writes tmp/<name>/ (code), tmp/a.safetensors, tmp/b.safetensors, tmp/config.json.
    Returns (code_dir, [weight files], config path, {tensor: (dtype, shape, bytes)}, numpy weights)."""
    rng = np.random.default_rng(7)
    code = os.path.join(tmp, name)
    os.makedirs(os.path.join(code, "util"), exist_ok=True)
    os.makedirs(os.path.join(code, "__pycache__"), exist_ok=True)
    open(os.path.join(code, "__init__.py"), "w").write('"""Toy generic model."""\n')
    open(os.path.join(code, "model.py"), "w").write(MODEL_PY)
    open(os.path.join(code, "util", "helpers.py"), "w").write("def twice(v):\n    return 2 * v\n")
    open(os.path.join(code, "labels.txt"), "w").write("a\nb\nc\nd\n")
    open(os.path.join(code, "__pycache__", "model.cpython-311.pyc"), "wb").write(b"\0" * 16)

    w1 = rng.uniform(-0.5, 0.5, (HIDDEN, D_IN)).astype(np.float32)
    w2 = rng.uniform(-0.5, 0.5, (D_OUT, HIDDEN)).astype(np.float16)
    emb = rng.uniform(-1, 1, (3, 2, 4)).astype(np.float32)
    tensors = {
        "layer1.weight": ("F32", (HIDDEN, D_IN), w1.tobytes()),
        "layer1.bias": ("BF16", (HIDDEN,), bf16_bytes(rng.uniform(-1, 1, HIDDEN))),
        "temperature": ("F32", (), np.float32(0.75).tobytes()),
    }
    b_tensors = {
        "layer2.weight": ("F16", (D_OUT, HIDDEN), w2.tobytes()),
        "extra.table": ("F32", (3, 2, 4), emb.tobytes()),
    }
    a, b = os.path.join(tmp, "a.safetensors"), os.path.join(tmp, "b.safetensors")
    write_safetensors(a, tensors, {"format": "np"})
    write_safetensors(b, b_tensors)
    cfg = os.path.join(tmp, "config.json")
    json.dump({"scale": 1.5, "labels": ["a", "b", "c", "d"], "nested": {"k": [1, 2]}}, open(cfg, "w"))
    expect = {}
    for k, (dt, shape, raw) in {**tensors, **b_tensors}.items():
        expect[k] = (dt.lower(), tuple(shape) if shape else (1,), raw)  # scalars become (1,)
    return code, [a, b], cfg, expect, (w1, w2)
