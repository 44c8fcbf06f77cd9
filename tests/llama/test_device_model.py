"""The logic of models/llama's GPU path, checked on the CPU. This is no evidence that the GPU computes
correctly (scripts/gpu-check.sh is); it shows that the Python model code, when servd.device() is
"cuda:N", makes the decisions the device layer needs:

  - placement.py's pure functions: dtypes per device, the vocabulary split (the one
    servd_device_allgather_cols requires: n_r = min(P, N - r*P), P = ceil(N/world)), capacities;
  - with a numpy stand-in for the device layer (tests/llama/numpy_servd.py plus device tensors that
    carry a device and a dtype label and hold f32 numbers): every weight goes through servd.upload
    once (a tied output head is the embedding's copy), every op sees tensors of one device and the
    dtypes the device ops take (bf16 activations and weights, i32 ids, f32 logits), contiguous;
    buffers are allocated once, at the first step, at batch.max_tokens / batch.max_seqs rows, and every
    later step only touches them, the uploaded weights and the step inputs (what a replayed CUDA graph
    needs); a step beyond the capacities, or unknown capacities, fails with a clear error;
  - the logits of that path (TP 1, 2, and 3 with an uneven vocabulary split) equal the independent
    float64 reference (llama_ref.py) within test_llama.py's tolerance, 2e-5 of the largest logit: the
    stand-in computes in f32 exactly as the host path, so the same bound applies (observed ~4e-7);
  - the host path under the same stand-in calls none of the device API.

    test_device_model.py --work DIR
"""
import argparse
import importlib.util
import os
import subprocess
import sys
import threading
import types

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, HERE)
import llama_ref  # noqa: E402
import numpy_servd as ns  # noqa: E402

TOL = 2e-5
failures = []


def check(cond, msg):
    print(("ok   " if cond else "FAIL ") + msg, flush=True)
    if not cond:
        failures.append(msg)


def raises(fn, part):
    try:
        fn()
    except RuntimeError as e:
        return part in str(e)
    return False


def load_placement():
    spec = importlib.util.spec_from_file_location("llama_placement_test",
                                                  os.path.join(ROOT, "models", "llama", "placement.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ---- pure functions ---------------------------------------------------------------------------------
def test_placement(pl):
    check(pl.activation_dtype("cpu") == "f32" and pl.activation_dtype("cuda:1") == "bf16",
          "activations: f32 on the host, bf16 on a GPU")
    check(pl.LOGITS_DTYPE == "f32" and all(dt == "f32" for n, _, dt in pl.logits_layout(8, 5, 10, 2, "cuda:0")
                                           if n != "sel"), "logits f32 on every device")
    check([n for n, _, _ in pl.logits_layout(8, 10, 10, 1, "cuda:0")] == ["sel", "lg"],
          "no all-gather buffer without tensor parallelism")
    ok = True
    for n in (1, 2, 5, 9, 10, 272, 32000, 128256, 151936):
        for w in (1, 2, 3, 4, 8):
            P = -(-n // w)
            shards = [pl.vocab_shard(n, r, w) for r in range(w)]
            # the device all-gather's contract, and contiguous shards covering the vocabulary in rank order
            ok &= all(vn == max(0, min(P, n - r * P)) for r, (_, vn) in enumerate(shards))
            ok &= all(v0 == min(r * P, n) for r, (v0, _) in enumerate(shards))
            ok &= sum(vn for _, vn in shards) == n
    check(ok, "vocab_shard: n_r = min(P, N - r*P), P = ceil(N/world), contiguous, covers N")
    check(pl.vocab_shard(9, 3, 4) == (9, 0), "vocab_shard: a rank past the end holds no rows")
    check(pl.device_capacity(512, 64, "cuda:0") == (512, 64) and pl.device_capacity(4, 64, "cuda:0") == (4, 4),
          "device capacity: max_tokens rows, logit rows min(max_seqs, max_tokens)")
    check(raises(lambda: pl.device_capacity(0, 8, "cuda:0"), "batch.max_tokens=0")
          and raises(lambda: pl.device_capacity(8, 0, "cuda:0"), "batch.max_seqs=0"),
          "device capacity: unknown capacities are a clear error")
    check(pl.step_capacity(types.SimpleNamespace()) == (0, 0)
          and pl.step_capacity(types.SimpleNamespace(max_tokens=7, max_seqs=3)) == (7, 3),
          "step_capacity: a batch without the attributes reads as unknown")
    check(pl.host_growth(3, 0, 16) == 16 and pl.host_growth(17, 16, 16) == 32 and pl.host_growth(100, 16, 16) == 100,
          "host growth: at least double, at least the floor")
    check(raises(lambda: pl.check_fits(9, 8, "tokens", "cuda:0"), "a step of 9 tokens exceeds the 8"),
          "check_fits names the step and the capacity")
    layout = pl.activation_layout(64, 32, 16, 128)
    check(tuple(n for n, _ in layout) == ("x", "h", "o", "q", "k", "v", "a", "g", "u")
          and dict(layout) == dict(x=64, h=64, o=64, q=32, k=16, v=16, a=32, g=128, u=128),
          "activation layout: forward's order and widths")


# ---- a numpy stand-in for the device layer --------------------------------------------------------
class DevTensor(ns.Tensor):
    def __init__(self, a, dtype, device):
        super().__init__(a)
        self._dt, self.device = dtype, device

    dtype = property(lambda s: s._dt)

    def narrow(self, dim, start, length):
        return DevTensor(ns.Tensor.narrow(self, dim, start, length).a, self._dt, self.device)

    def view(self, *shape):
        return DevTensor(ns.Tensor.view(self, *shape).a, self._dt, self.device)


def root(a):
    while a.base is not None:
        a = a.base
    return a


# dtype rules of the device ops (kernels/include/servd/device.h), per argument position
RULES = {
    "matmul": (("bf16", "f32"), ("bf16",), ("bf16",)),
    "embedding": (("bf16",), ("bf16",), ("i32",)),
    "rmsnorm": (("bf16",), ("bf16",), ("bf16",)),
    "rope": (("bf16",), ("i32",)),
    "swiglu": (("bf16",),) * 3,
    "add": (("bf16",),) * 3,
    "kv_write": (None, None, ("bf16",), ("bf16",), ("i32",)),
    "attention": (("bf16",), ("bf16",)),
    "allreduce": (("bf16",),),
    "allgather_cols": (("f32",), ("f32",)),
}


class Stats:
    def __init__(self):
        self.allocs, self.uploads, self.host_empty, self.device_api = [], {}, 0, 0
        self.upload_sources = []
        self.batch_roots, self.errors, self.op_calls = set(), [], 0


def devicify(m, here, rank, world, st):
    """Turns numpy_servd's module m into a stand-in for a GPU interpreter (device "cuda:N"), or, with
    device "cpu", checks that the host path calls none of the device API."""
    host_empty, device = m.empty, here

    def empty(shape, dtype="f32", device=None):
        dev, device = device, here
        if dev in (None, "cpu"):
            st.host_empty += 1
            return host_empty(shape, dtype)
        st.device_api += 1
        if device == "cpu" or dev not in ("cuda", device):
            raise ValueError(f"servd.empty: device {dev!r} on {device}")
        if dtype not in ("bf16", "f32", "i32"):
            raise ValueError(f"servd.empty: dtype {dtype!r} on a device")
        t = DevTensor(np.zeros(shape, np.int32 if dtype == "i32" else np.float32), dtype, device)
        st.allocs.append(t.a)
        return t

    def upload(t):
        device = here
        st.device_api += 1
        if device == "cpu":
            raise RuntimeError("servd.upload: this interpreter runs on the CPU")
        if isinstance(t, DevTensor):
            raise ValueError("servd.upload: expected a host tensor")
        key = (t.a.__array_interface__["data"][0], t.a.shape, t.a.strides)
        if key not in st.uploads:  # shared per host bytes, as servd_device_weight
            st.uploads[key] = DevTensor(np.ascontiguousarray(t.a, np.float32), "bf16", device)
            # servd's weights are mapped for the model's life, so their addresses never come back;
            # here a host array could be freed and its address reused by another: keep it alive.
            st.upload_sources.append(t.a)
        return st.uploads[key]

    m.device = lambda: device
    m.empty, m.upload = empty, upload
    if device == "cpu":
        return m
    weight_roots = lambda: {id(root(u.a)) for u in st.uploads.values()}  # noqa: E731

    def wrap(name, fn):
        rule = RULES[name]

        def call(*args):
            st.op_calls += 1
            ts = [a for a in args if isinstance(a, ns.Tensor)]
            devs = {getattr(t, "device", "cpu") for t in ts}
            if devs != {device}:
                st.errors.append(f"ops.{name}: tensors on {sorted(devs)}, expected all on {device}")
            for i, a in enumerate(args[:len(rule)]):
                if rule[i] and isinstance(a, ns.Tensor) and a.dtype not in rule[i]:
                    st.errors.append(f"ops.{name}: argument {i} is {a.dtype}, the device op takes {rule[i]}")
            allowed = {id(a) for a in st.allocs} | weight_roots() | st.batch_roots
            for t in ts:
                if not t.a.flags.c_contiguous:
                    st.errors.append(f"ops.{name}: a non-contiguous {t.shape} tensor")
                if id(root(t.a)) not in allowed:
                    st.errors.append(f"ops.{name}: a {t.shape} tensor that is no buffer, weight or step input")
            if name == "allgather_cols":
                N, n = args[0].shape[1], args[1].shape[1]
                P = -(-N // world)
                if n != max(0, min(P, N - rank * P)):
                    st.errors.append(f"allgather_cols: rank {rank} gives {n} of {N} columns, the device "
                                     f"collective takes min(P, N - r*P) = {min(P, N - rank * P)}")
            return fn(*args)
        return call

    for name in RULES:
        setattr(m.ops, name, wrap(name, getattr(m.ops, name)))
    return m


_load_lock = threading.Lock()


def load_model(mod, tag):
    with _load_lock:  # model.py binds `servd` at import: each rank loads its own copy
        sys.modules["servd"], sys.modules["servd.ops"] = mod, mod.ops
        spec = importlib.util.spec_from_file_location(f"llama_model_{tag}",
                                                      os.path.join(ROOT, "models", "llama", "model.py"))
        code = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(code)
    return code.LlamaModel()


PROMPT = list(b"Hello, device path!")
# (tokens, which rows want logits): a chunk that does not reach the end of its prompt, a chunk
# wanting every row, the rest of the prompt wanting its last row, then decode steps.
CHUNKS = [(4, "none"), (5, "all"), (len(PROMPT) - 9, "last"), (1, "last"), (1, "last"), (1, "last")]


def run_rank(folder, rank, world, comm, device, caps, out):
    st = Stats()
    mod, cfg, w = ns.make_module(folder, rank, world, comm, "half")
    devicify(mod, device, rank, world, st)
    model = load_model(mod, f"{device.replace(':', '_')}_{rank}_{world}")
    on_dev = device != "cpu"
    kv = ns.KV(model.n_layers, 64, model.kv_local * model.head_dim)
    toks, done, got, allocs_after_first = list(PROMPT), 0, [], None

    def t32(vals):
        a = np.array(vals, np.int32)
        if not on_dev:
            return ns.Tensor(a)
        st.batch_roots.add(id(a))
        return DevTensor(a, "i32", device)

    for n, want in CHUNKS:
        lr = {"none": [], "all": list(range(n)), "last": [n - 1]}[want]
        b = types.SimpleNamespace(
            n_tokens=n, tokens=t32(toks[done:done + n]), positions=t32(range(done, done + n)),
            slots=t32(range(done, done + n)), logit_rows=t32(lr), kv=kv,
            q_start=[0], q_len=[n], kv_len=[done + n], slot_of=[np.arange(64)])
        if caps is not None:
            b.max_tokens, b.max_seqs = caps
        lg = model.forward(b)
        if allocs_after_first is None:
            allocs_after_first = len(st.allocs)
        if not lr:
            got.append((done, [], None if lg is None else "not None"))
        else:
            if on_dev and not (isinstance(lg, DevTensor) and lg.device == device and lg.dtype == "f32"):
                st.errors.append(f"forward returned {lg!r}, expected f32 logits on {device}")
            got.append((done, lr, lg.a.copy()))
        done += n
        if done >= len(toks):
            toks.append(int(np.argmax(lg.a[-1])))
    out[rank] = dict(model=model, st=st, got=got, toks=toks, cfg=cfg, w=w, mod=mod, kv=kv,
                     allocs_first=allocs_after_first)


def run(folder, world, device, caps=(16, 8)):
    comm = ns.Comm(world)
    out = [None] * world
    errs = []

    def body(r):
        try:
            run_rank(folder, r, world, comm, device, caps, out)
        except BaseException as e:  # noqa: BLE001
            errs.append(e)
            comm.bar.abort()

    ths = [threading.Thread(target=body, args=(r,)) for r in range(world)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    if errs:
        raise errs[0]
    return out


def compare(name, res):
    r0 = res[0]
    toks = r0["toks"]
    ref = llama_ref.forward(r0["cfg"], r0["w"], toks[:len(toks) - 1])
    scale = max(1.0, np.abs(ref).max())
    err, none_ok = 0.0, True
    for start, lr, lg in r0["got"]:
        if not lr:
            none_ok &= lg is None
            continue
        err = max(err, np.abs(lg - ref[[start + i for i in lr]]).max() / scale)
    check(none_ok, f"{name}: a chunk without logit rows returns None")
    check(err <= TOL, f"{name}: logits vs the float64 reference, max relative error {err:.1e} (<= {TOL})")
    greedy = [int(np.argmax(ref[i])) for i in range(len(PROMPT) - 1, len(toks) - 1)]
    check(toks[len(PROMPT):] == greedy, f"{name}: greedy tokens {toks[len(PROMPT):]} == reference {greedy}")


def device_checks(name, res, world, tied, extra_allocs=0, per_layer=9):
    for r, d in enumerate(res):
        st, model = d["st"], d["model"]
        check(not st.errors, f"{name} rank {r}: every op on one device with the device dtypes, contiguous, "
              f"touching only buffers, weights and step inputs ({st.op_calls} calls)"
              + ("" if not st.errors else ": " + "; ".join(sorted(set(st.errors))[:4])))
        n_act, n_logit = 9 + extra_allocs, 2 + (world > 1)
        check(d["allocs_first"] == n_act + n_logit and len(st.allocs) == n_act + n_logit,
              f"{name} rank {r}: {n_act + n_logit} device buffers allocated at the first step, none after "
              f"(got {d['allocs_first']} then {len(st.allocs)})")
        rows = sorted({a.shape[0] for a in st.allocs})
        check(rows == sorted({16, 8}), f"{name} rank {r}: buffer rows {rows}: max_tokens 16 and max_seqs 8")
        expect = 1 + (not tied) + 1 + per_layer * model.n_layers
        check(len(st.uploads) == expect and st.host_empty == 0,
              f"{name} rank {r}: {expect} weights uploaded once each ({len(st.uploads)}), no host buffers "
              f"({st.host_empty})")
        if tied:
            check(model.output is model.embed, f"{name} rank {r}: the tied output head is the embedding's copy")


def test_device(folders):
    res = run(folders["tied"], 1, "cuda:0")
    compare("cuda TP1 tied", res)
    device_checks("cuda TP1 tied", res, 1, True)
    res = run(folders["untied"], 1, "cuda:0")
    compare("cuda TP1 untied", res)
    device_checks("cuda TP1 untied", res, 1, False)
    res = run(folders["tied"], 2, "cuda:0")
    compare("cuda TP2", res)
    device_checks("cuda TP2", res, 2, True)
    res = run(folders["three"], 3, "cuda:0")
    vn = [d["model"].vn for d in res]
    check(vn == [91, 91, 90], f"TP3 over a vocabulary of 272: shards {vn}")
    compare("cuda TP3 uneven vocabulary", res)
    device_checks("cuda TP3", res, 3, True)

    # Other families (docs/models.md): Qwen2's Q/K/V biases (3 more weights per layer, broadcast by an
    # embedding of zero ids: one more buffer) and Qwen3's per-head norms (2 more per layer).
    for fam, per_layer in (("qwen2", 12), ("qwen3", 11)):
        for world in (1, 2):
            res = run(folders[fam], world, "cuda:0")
            compare(f"cuda TP{world} {fam}", res)
            device_checks(f"cuda TP{world} {fam}", res, world, True, extra_allocs=1, per_layer=per_layer)

    # Beyond the capacities: a clear error, not a reallocation.
    d = run(folders["tied"], 1, "cuda:0")[0]
    model, st = d["model"], d["st"]
    n_allocs = len(st.allocs)
    big = types.SimpleNamespace(n_tokens=17, tokens=None, positions=None, slots=None, logit_rows=None,
                                kv=d["kv"], max_tokens=16, max_seqs=8)
    check(raises(lambda: model.forward(big), "a step of 17 tokens (batch.max_tokens) exceeds the 16"),
          "a step of more tokens than batch.max_tokens fails clearly")
    check(len(st.allocs) == n_allocs, "... and allocates nothing")
    check(raises(lambda: model._logit_bufs(9, big), "a step of 9 logit rows (batch.max_seqs) exceeds the 8"),
          "more logit rows than batch.max_seqs fail clearly")
    try:
        run(folders["tied"], 1, "cuda:0", caps=None)
        check(False, "a device step without batch.max_tokens fails")
    except RuntimeError as e:
        check("batch.max_tokens=0" in str(e), f"a device step without batch.max_tokens fails clearly: {e}")


def test_host(folders):
    res = run(folders["tied"], 1, "cpu", caps=None)
    compare("cpu TP1 (no capacities on the batch)", res)
    st = res[0]["st"]
    check(st.device_api == 0 and st.host_empty > 0, f"cpu: no device API called ({st.device_api}), host buffers")
    res = run(folders["tied"], 2, "cpu", caps=None)
    compare("cpu TP2", res)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", required=True)
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    folders = {}
    for key, extra in (("tied", []), ("untied", ["--untied"]), ("three", ["--heads", "6", "--kv-heads", "3"]),
                       ("qwen2", ["--family", "qwen2"]), ("qwen3", ["--family", "qwen3"])):
        folders[key] = os.path.join(args.work, key)
        subprocess.run([sys.executable, os.path.join(HERE, "make_tiny.py"), folders[key]] + extra,
                       check=True, capture_output=True)
    test_placement(load_placement())
    test_device(folders)
    test_host(folders)
    print(f"{len(failures)} failure(s)")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
