"""Independent reader of servd packages for tests: Python's zipfile, json, hashlib and numpy only."""
import hashlib
import json
import struct
import zipfile

import numpy as np

ST_DT = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "U8": np.uint8, "I32": np.int32, "F64": np.float64}


def data_offset(path, info):
    """Absolute offset of an entry's data, from its local header."""
    with open(path, "rb") as f:
        f.seek(info.header_offset)
        h = f.read(30)
        assert h[:4] == b"PK\x03\x04"
        nlen, elen = struct.unpack("<HH", h[26:30])
        return info.header_offset + 30 + nlen + elen


def read_safetensors(raw):
    n = struct.unpack("<Q", raw[:8])[0]
    hdr = json.loads(raw[8:8 + n])
    hdr.pop("__metadata__", None)
    out = {}
    for k, v in hdr.items():
        b, e = v["data_offsets"]
        out[k] = (v["dtype"], v["shape"], raw[8 + n + b:8 + n + e], 8 + n + b)
    return out


def load(path):
    """Returns (manifest, {name: (dtype, shape, bytes)}) after checking hashes and alignment."""
    z = zipfile.ZipFile(path)
    assert z.testzip() is None, "CRC mismatch"
    man = json.loads(z.read("manifest.json"))
    names = {i.filename for i in z.infolist()}
    assert set(man["files"]) == names - {"manifest.json"}, "files list differs from the archive"
    for name, f in man["files"].items():
        data = z.read(name)
        assert len(data) == f["size"]
        assert hashlib.sha256(data).hexdigest() == f["sha256"], name
    tensors = {}
    for t in man["tensors"]:
        info = z.getinfo(t["file"])
        assert info.compress_type == zipfile.ZIP_STORED
        raw = z.read(t["file"])
        st = read_safetensors(raw)
        dt, shape, data, off = st[t["name"]]
        assert off == t["offset"] and len(data) == t["nbytes"]
        assert (data_offset(path, info) + off) % 64 == 0, "tensor not 64-byte aligned: " + t["name"]
        tensors[t["name"]] = (t["dtype"], tuple(t["shape"]), data)
    return man, tensors


def to_f32(dtype, shape, data):
    """Plain dtypes to float32 numpy (bf16 by shifting)."""
    if dtype == "f32":
        return np.frombuffer(data, np.float32).reshape(shape)
    if dtype == "f16":
        return np.frombuffer(data, np.float16).astype(np.float32).reshape(shape)
    if dtype == "bf16":
        return (np.frombuffer(data, np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(shape)
    raise ValueError(dtype)
