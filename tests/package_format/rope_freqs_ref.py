"""Test-side pieces for GGUF files that carry Llama 3 rope scaling as rope_freqs.weight: the factors
llama.cpp's converter writes (an independent numpy transcription of convert_hf_to_gguf.py's
LlamaModel.generate_extra_tensors, float32 as it computes with torch), and a GGUF writer hook that adds
the tensor to any gguf.GGUFWriter use."""
import contextlib
import math

import numpy as np


def llama3_rope_factors(head_dim, theta, factor, low_freq_factor, high_freq_factor, original_max_positions):
    """The per-dimension divisors of the inverse frequencies (head_dim/2 float32 values)."""
    f32 = np.float32
    freqs = f32(1.0) / (f32(theta) ** (np.arange(0, head_dim, 2, dtype=np.float32) / f32(head_dim)))
    low_wl = original_max_positions / low_freq_factor
    high_wl = original_max_positions / high_freq_factor
    out = []
    for freq in freqs.astype(np.float32):
        wavelen = f32(2 * math.pi) / freq
        if wavelen < high_wl:
            out.append(1.0)
        elif wavelen > low_wl:
            out.append(factor)
        else:
            smooth = (f32(original_max_positions) / wavelen - f32(low_freq_factor)) / f32(high_freq_factor - low_freq_factor)
            out.append(f32(1) / ((f32(1) - smooth) / f32(factor) + smooth))
    return np.array(out, dtype=np.float32)


@contextlib.contextmanager
def extra_gguf_tensors(gguf_mod, tensors, kv=None):
    """Within the block, every gguf.GGUFWriter also writes `tensors` ({name: array}) and the metadata
    `kv` ({key: (value, GGUFValueType)}) just before its header: a way to extend a maker that
    writes its GGUF itself (tests/llama/make_tiny.py) without copying it."""
    base = gguf_mod.GGUFWriter

    class Writer(base):
        def write_header_to_file(self, *a, **k):
            for key, (value, vtype) in (kv or {}).items():
                self.add_key_value(key, value, vtype)
            for name, arr in tensors.items():
                self.add_tensor(name, arr)
            return super().write_header_to_file(*a, **k)

    gguf_mod.GGUFWriter = Writer
    try:
        yield
    finally:
        gguf_mod.GGUFWriter = base
