"""A numpy stand-in for the `servd` module, to run models/llama outside servd when debugging the
model code (TP ranks as Python threads). Not used by servd; semantics follow docs/python-api.md.

    python3 numpy_servd.py HF_FOLDER [--tp N]   # compares with llama_ref on a short prompt
"""
import json
import os
import sys
import threading
import types

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


class Tensor:
    def __init__(self, a):
        self.a = a

    shape = property(lambda s: tuple(s.a.shape))
    ndim = property(lambda s: s.a.ndim)
    dtype = property(lambda s: "i32" if s.a.dtype == np.int32 else "f32")

    def __len__(self):
        return self.a.shape[0]

    def view(self, *shape):
        v = self.a.view()
        v.shape = shape  # raises for a non-contiguous array, as servd does
        return Tensor(v)

    def narrow(self, dim, start, length):
        idx = [slice(None)] * self.a.ndim
        idx[dim] = slice(start, start + length)
        return Tensor(self.a[tuple(idx)])


class Rope:
    def __init__(self, layout, head_dim, theta, factor=1.0, low_freq_factor=1.0, high_freq_factor=4.0,
                 original_max_positions=8192):
        sys.path.insert(0, HERE)
        import llama_ref
        cfg = {"rope_theta": theta}
        if factor > 1:
            cfg["rope_scaling"] = {"rope_type": "llama3", "factor": factor, "low_freq_factor": low_freq_factor,
                                   "high_freq_factor": high_freq_factor,
                                   "original_max_position_embeddings": original_max_positions}
        self.inv = llama_ref.inv_freq(cfg, head_dim)
        self.layout, self.hd = layout, head_dim


class KV:
    def __init__(self, layers, slots, width):
        self.k = np.zeros((layers, slots, width), np.float32)
        self.v = np.zeros((layers, slots, width), np.float32)


class Comm:
    def __init__(self, world):
        self.world, self.bar, self.buf = world, threading.Barrier(world), [None] * world


def make_module(folder, rank, world, comm, layout):
    sys.path.insert(0, HERE)
    import llama_ref
    cfg, w = llama_ref.load_folder(folder)
    m = types.ModuleType("servd")
    ops = types.ModuleType("servd.ops")
    m.ops = ops
    m.Tensor, m.Rope = Tensor, Rope
    m.rank, m.world_size, m.device = (lambda: rank), (lambda: world), (lambda: "cpu")
    m.empty = lambda shape, dtype="f32", device=None: Tensor(np.zeros(shape, np.float32 if dtype == "f32" else np.int32))
    pkg = types.SimpleNamespace(config=cfg, manifest={"rope_layout": layout},
                                tensor=lambda n: Tensor(w[n].astype(np.float32)),
                                tensor_names=lambda: list(w), read_file=lambda p: open(os.path.join(folder, p), "rb").read())
    m.package = pkg

    def matmul(out, x, wt):
        out.a[...] = x.a @ wt.a.T

    def embedding(out, table, ids, row_offset=0):
        i = ids.a - row_offset
        ok = (i >= 0) & (i < table.a.shape[0])
        out.a[...] = 0
        out.a[ok] = table.a[i[ok]]

    def rmsnorm(out, x, wt, eps):
        out.a[...] = x.a / np.sqrt(np.mean(x.a * x.a, -1, keepdims=True) + eps) * wt.a

    def rope(x, pos, r):
        t = x.a.shape[0]
        v = x.a.reshape(t, -1, r.hd)
        ang = np.outer(pos.a, r.inv)[:, None, :]
        c, s = np.cos(ang), np.sin(ang)
        if r.layout == "half":
            h = r.hd // 2
            x0, x1 = v[..., :h].copy(), v[..., h:].copy()
            v[..., :h], v[..., h:] = x0 * c - x1 * s, x0 * s + x1 * c
        else:
            x0, x1 = v[..., 0::2].copy(), v[..., 1::2].copy()
            v[..., 0::2], v[..., 1::2] = x0 * c - x1 * s, x0 * s + x1 * c

    def swiglu(out, g, u):
        out.a[...] = g.a / (1 + np.exp(-g.a)) * u.a

    def add(out, a, b):
        out.a[...] = a.a + b.a

    def kv_write(kv, layer, k, v, slots):
        kv.k[layer, slots.a] = k.a
        kv.v[layer, slots.a] = v.a

    def attention(out, q, kv, layer, batch, n_heads, scale):
        hd = q.a.shape[1] // n_heads
        nkv = kv.k.shape[2] // hd
        for s in range(len(batch.q_start)):
            qs, ql, kl = batch.q_start[s], batch.q_len[s], batch.kv_len[s]
            slots = batch.slot_of[s][:kl]
            K = kv.k[layer, slots].reshape(kl, nkv, hd)
            V = kv.v[layer, slots].reshape(kl, nkv, hd)
            Q = q.a[qs:qs + ql].reshape(ql, n_heads, hd)
            rep = n_heads // nkv
            K, V = np.repeat(K, rep, 1), np.repeat(V, rep, 1)
            sc = np.einsum("thd,shd->hts", Q, K) * scale
            p0 = kl - ql
            mask = np.arange(kl)[None, :] > (p0 + np.arange(ql))[:, None]
            sc[:, mask] = -np.inf
            sc = np.exp(sc - sc.max(-1, keepdims=True))
            sc /= sc.sum(-1, keepdims=True)
            out.a[qs:qs + ql] = np.einsum("hts,shd->thd", sc, V).reshape(ql, -1)

    def allreduce(x):
        if world == 1:
            return
        comm.buf[rank] = x.a.copy()
        comm.bar.wait()
        total = sum(comm.buf)
        comm.bar.wait()
        x.a[...] = total

    def allgather_cols(out, x):
        comm.buf[rank] = x.a.copy()
        comm.bar.wait()
        out.a[...] = np.concatenate(comm.buf, axis=1)
        comm.bar.wait()

    for f in (matmul, embedding, rmsnorm, rope, swiglu, add, kv_write, attention, allreduce, allgather_cols):
        setattr(ops, f.__name__, f)
    return m, cfg, w


def main():
    import argparse
    import importlib.util
    lock = threading.Lock()
    ap = argparse.ArgumentParser()
    ap.add_argument("folder")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--layout", default="half")
    args = ap.parse_args()
    sys.path.insert(0, HERE)
    import llama_ref
    tokens = list(b"Hello, numpy")
    comm = Comm(args.tp)
    results = [None] * args.tp

    def rank_main(r):
        mod, cfg, w = make_module(args.folder, r, args.tp, comm, args.layout)
        with lock:  # model.py binds `servd` at import: give each rank's copy its own module
            sys.modules["servd"], sys.modules["servd.ops"] = mod, mod.ops
            spec = importlib.util.spec_from_file_location(
                f"llama_model_{r}", os.path.join(HERE, "..", "..", "models", "llama", "model.py"))
            code = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(code)
        model = code.LlamaModel()
        hd = model.head_dim
        kv = KV(model.n_layers, 64, model.kv_local * hd)
        # two chunks then two decode steps; block table = identity slots
        out = []
        done = 0
        toks = list(tokens)
        for c in (5, len(tokens) - 5, 1, 1):
            n = c
            b = types.SimpleNamespace(
                n_tokens=n, tokens=Tensor(np.array(toks[done:done + n], np.int32)),
                positions=Tensor(np.arange(done, done + n, dtype=np.int32)),
                slots=Tensor(np.arange(done, done + n, dtype=np.int32)),
                logit_rows=Tensor(np.arange(n, dtype=np.int32)), kv=kv,
                q_start=[0], q_len=[n], kv_len=[done + n], slot_of=[np.arange(64)])
            lg = model.forward(b).a.copy()
            out.append(lg)
            done += n
            if done == len(toks):
                toks.append(int(np.argmax(lg[-1])))
        results[r] = (np.concatenate(out), toks, cfg, w)

    ths = [threading.Thread(target=rank_main, args=(r,)) for r in range(args.tp)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    lg, toks, cfg, w = results[0]
    ref = llama_ref.forward(cfg, w, toks[:lg.shape[0]])
    print("max abs err", np.abs(lg - ref).max(), "scale", np.abs(ref).max(), "tokens", toks[len(tokens):])


if __name__ == "__main__":
    main()
