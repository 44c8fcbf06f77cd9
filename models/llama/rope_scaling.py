"""The rope_scaling of a config as servd.Rope keyword arguments.

Llama 3 scaling is computed by the rope op from its four numbers. YaRN and LongRoPE change each
pair's frequency in ways the op does not know, so their inverse frequencies are computed here, once
at load, as transformers' rope init functions compute them (modeling_rope_utils: _compute_yarn_parameters,
_compute_longrope_parameters, in f32 where it works in f32), and handed to the op as a table with the
attention factor that multiplies cos and sin.

  - yarn (Qwen2/2.5): factor, original_max_position_embeddings (else max_position_embeddings),
    beta_fast 32, beta_slow 1, truncate true; attention_factor, else 0.1 ln(factor) + 1 (or the
    mscale / mscale_all_dim ratio). The factor is rope_scaling's, as llama.cpp and vLLM read it.
  - longrope / su (Phi-3, Phi-3.5): short_factor and long_factor divide the frequencies of each pair;
    the long ones apply to a forward whose largest position is >= original_max_position_embeddings
    (transformers' dynamic update: seq_len > original), passed to the op as long_from; the
    attention factor is sqrt(1 + ln(s) / ln(original)) for s = max_position_embeddings / original > 1.

Plain Python (no numpy: the serving path stays free of it).
"""
import math
import struct

SUPPORTED = "llama3, yarn, longrope"


def _f32(x):
    return struct.unpack("f", struct.pack("f", x))[0]


def _base_freqs(theta, dim):
    """theta ** (2i / dim) for the dim/2 pairs, in f32 as torch computes it."""
    return [_f32(_f32(theta) ** _f32(2 * i / dim)) for i in range(dim // 2)]


def _yarn(cfg, rs, dim, theta):
    factor = float(rs["factor"])
    orig = int(rs.get("original_max_position_embeddings") or cfg.get("max_position_embeddings") or 2048)
    beta_fast = float(rs.get("beta_fast") or 32)
    beta_slow = float(rs.get("beta_slow") or 1)

    def mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0
    attn = rs.get("attention_factor")
    if attn is None:
        m, m_all = rs.get("mscale"), rs.get("mscale_all_dim")
        attn = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)

    def corr_dim(rot):
        return dim * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(theta))
    low, high = corr_dim(beta_fast), corr_dim(beta_slow)
    if rs.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    inv = []
    for i, pf in enumerate(_base_freqs(theta, dim)):
        extrap, interp = _f32(1.0 / pf), _f32(1.0 / _f32(factor * pf))
        e = _f32(1.0 - min(1.0, max(0.0, _f32((i - low) / (high - low)))))  # 1: extrapolated (fast pairs)
        inv.append(_f32(_f32(interp * _f32(1.0 - e)) + _f32(extrap * e)))
    return dict(inv_freq=inv, attn_factor=float(attn))


def _longrope(cfg, rs, dim, theta):
    short, long_ = rs.get("short_factor"), rs.get("long_factor")
    if not isinstance(short, list) or not isinstance(long_, list) or len(short) != dim // 2 or len(long_) != dim // 2:
        raise ValueError(f"longrope: short_factor and long_factor must be lists of head_dim/2 = {dim // 2} numbers")
    max_pos = int(cfg.get("max_position_embeddings") or 4096)
    orig = cfg.get("original_max_position_embeddings") or rs.get("original_max_position_embeddings")
    factor = max_pos / int(orig) if orig else float(rs.get("factor") or 1.0)
    orig = int(orig or max_pos)
    attn = rs.get("attention_factor")
    if attn is None:
        attn = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(orig))
    pf = _base_freqs(theta, dim)
    table = lambda ext: [_f32(1.0 / _f32(_f32(x) * p)) for x, p in zip(ext, pf)]  # noqa: E731
    return dict(inv_freq=table(short), inv_freq_long=table(long_), long_from=orig, attn_factor=float(attn))


def rope_kwargs(cfg, head_dim, theta, family="llama"):
    """servd.Rope keyword arguments (besides layout, head_dim, theta) for cfg's rope_scaling;
    ValueError naming the type when it is none of SUPPORTED."""
    rs = cfg.get("rope_scaling") or {}
    if not rs:
        return {}
    kind = rs.get("rope_type", rs.get("type"))
    if kind == "llama3":
        return dict(factor=float(rs["factor"]), low_freq_factor=float(rs.get("low_freq_factor", 1.0)),
                    high_freq_factor=float(rs.get("high_freq_factor", 4.0)),
                    original_max_positions=int(rs.get("original_max_position_embeddings", 8192)))
    if kind == "yarn":
        return _yarn(cfg, rs, head_dim, theta)
    if kind in ("longrope", "su"):
        return _longrope(cfg, rs, head_dim, theta)
    raise ValueError(f"{family}: unsupported rope_scaling {rs!r} (supported: {SUPPORTED})")
