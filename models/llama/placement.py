"""Where the Llama model's tensors live and how its activation buffers are laid out.

The model decides host versus device in one place: LlamaModel.__init__ picks HostMemory or
DeviceMemory (memory_for), and forward only asks it for weights and buffer views. The decisions are
small functions with no dependency on the `servd` module (it is passed in), so they run and are
tested on any machine (tests/llama/test_device_model.py).

Host (CPU): weights are the package's mapped views (zero-copy); buffers f32, grown on demand.
Device (cuda:N): weights are the shared read-only bf16 copies of servd.upload (every interpreter on
that GPU gets the same device memory; the cache is keyed by the host bytes, so a tied output head is
the embedding's copy); activations bf16, logits f32, allocated once at the engine's step capacities
(batch.max_tokens rows, batch.max_seqs logit rows) and never reallocated, because captured CUDA
graphs replay the addresses they saw.
"""

ACTIVATIONS = ("x", "h", "o", "q", "k", "v", "a", "g", "u")  # the order forward unpacks them
LOGITS_DTYPE = "f32"


def on_device(device):
    """True for "cuda:N" (servd.device() of a GPU interpreter), False for "cpu"."""
    return device != "cpu"


def activation_dtype(device):
    # The device kernels take bf16 activations (f32 accumulation); the CPU ops take f32.
    return "bf16" if on_device(device) else "f32"


def vocab_shard(vocab, rank, world):
    """Rows [v0, v0 + vn) of the vocabulary that rank r holds of the embedding and the output head.

    P = ceil(vocab / world) rows per rank, the last rank(s) the remainder (possibly none). This is the
    split the device all-gather of logit columns requires (servd_device_allgather_cols: rank r gives
    n_r = min(P, N - r*P) columns), and the one the CPU all-gather accepts."""
    per = -(-vocab // world)
    v0 = min(rank * per, vocab)
    return v0, min(per, vocab - v0)


def activation_layout(dim, q_cols, kv_cols, ff_cols):
    """Columns of each per-token activation buffer, in ACTIVATIONS order."""
    cols = dict(x=dim, h=dim, o=dim, q=q_cols, k=kv_cols, v=kv_cols, a=q_cols, g=ff_cols, u=ff_cols)
    return tuple((name, cols[name]) for name in ACTIVATIONS)


def logits_layout(dim, vn, vocab, world, device):
    """(name, cols, dtype) of the buffers of the logits tail: the gathered rows (sel), this rank's
    logit columns (lg) and, with tensor parallelism, the all-gathered full vocabulary (full; without
    it full is lg itself)."""
    out = [("sel", dim, activation_dtype(device)), ("lg", vn, LOGITS_DTYPE)]
    if world > 1:
        out.append(("full", vocab, LOGITS_DTYPE))
    return tuple(out)


def host_growth(n, cap, floor):
    """New host capacity when n rows do not fit cap: at least double, so growth is rare."""
    return max(n, 2 * cap, floor)


def step_capacity(batch):
    """(max_tokens, max_seqs) the engine states on the batch; 0 where unknown or not provided."""
    return int(getattr(batch, "max_tokens", 0) or 0), int(getattr(batch, "max_seqs", 0) or 0)


def device_capacity(max_tokens, max_seqs, device):
    """Rows of the device buffers: (token rows, logit rows). Both must be known up front."""
    if max_tokens <= 0 or max_seqs <= 0:
        raise RuntimeError(
            f"llama: on {device} the step capacities must be known before the first step (batch.max_tokens="
            f"{max_tokens}, batch.max_seqs={max_seqs}; expected both >= 1): device buffers are allocated "
            "once because CUDA graphs replay their addresses")
    # A step has at most one logit row per token.
    return max_tokens, min(max_seqs, max_tokens)


def check_fits(n, cap, what, device):
    if n > cap:
        raise RuntimeError(
            f"llama: a step of {n} {what} exceeds the {cap} the buffers on {device} were allocated for at "
            "the first step; they cannot grow while CUDA graphs may reference them (raise the engine's "
            "step capacity and reload the model)")


class RowViews:
    """Views of the first n rows of the step's buffers (_buf) and of the logits tail's (_lbuf), made
    once per n and kept; a subclass makes the buffers fit first (_ensure_step, _ensure_logits), which
    may replace them and drop the views kept so far."""

    def step_views(self, n, batch):
        v = self._views.get(n)
        if v is None:
            self._ensure_step(n, batch)
            v = tuple(b.narrow(0, 0, n) for b in self._buf)
            self._views[n] = v
        return v

    def hidden_rows(self, sel):
        """The final-norm hidden rows as embeddings take them: f32 on the host (here, as they are)."""
        return sel

    def logit_views(self, r, batch):
        v = self._logit_views.get(r)
        if v is None:
            self._ensure_logits(r, batch)
            v = tuple(b.narrow(0, 0, r) for b in self._lbuf)
            self._logit_views[r] = v
        return v


class HostMemory(RowViews):
    """CPU: the package's weight views as they are; f32 buffers grown on demand."""

    def __init__(self, servd, dims):
        self._empty = servd.empty
        self._dims = dims  # dict: dim q_cols kv_cols ff_cols vn vocab world
        self._cap = 0
        self._views = {}
        self._rcap = 0
        self._logit_views = {}

    def weight(self, t):
        return t

    def _alloc(self, cap):
        d, e = self._dims, self._empty
        layout = activation_layout(d["dim"], d["q_cols"], d["kv_cols"], d["ff_cols"])
        self._buf = tuple(e((cap, cols)) for _, cols in layout)
        self._cap = cap
        self._views = {}

    def _ensure_step(self, n, batch):
        if n > self._cap:
            self._alloc(host_growth(n, self._cap, 16))

    def _ensure_logits(self, r, batch):
        if r > self._rcap:
            d, e = self._dims, self._empty
            cap = host_growth(r, self._rcap, 8)
            bufs = [e((cap, cols)) for _, cols, _ in logits_layout(d["dim"], d["vn"], d["vocab"], d["world"], "cpu")]
            self._lbuf = (bufs[0], bufs[1], bufs[2] if len(bufs) > 2 else bufs[1])
            self._rcap = cap
            self._logit_views = {}


class DeviceMemory(RowViews):
    """A GPU: shared bf16 weight copies; every buffer allocated once, at the first step."""

    def __init__(self, servd, dims, device):
        self._servd = servd
        self._dims = dims
        self.device = device
        self._cap = self._rcap = 0
        self._views = {}
        self._logit_views = {}

    def weight(self, t):
        return self._servd.upload(t)

    def _alloc(self, batch):
        d, e, dev = self._dims, self._servd.empty, self.device
        cap, rcap = device_capacity(*step_capacity(batch), dev)
        act = activation_dtype(dev)
        self._buf = tuple(e((cap, cols), act, device=dev)
                          for _, cols in activation_layout(d["dim"], d["q_cols"], d["kv_cols"], d["ff_cols"]))
        bufs = [e((rcap, cols), dt, device=dev)
                for _, cols, dt in logits_layout(d["dim"], d["vn"], d["vocab"], d["world"], dev)]
        self._lbuf = (bufs[0], bufs[1], bufs[2] if len(bufs) > 2 else bufs[1])
        self._cap, self._rcap = cap, rcap

    def _ensure_step(self, n, batch):
        if not self._cap:
            self._alloc(batch)
        check_fits(n, self._cap, "tokens (batch.max_tokens)", self.device)

    def _ensure_logits(self, r, batch):
        check_fits(r, self._rcap, "logit rows (batch.max_seqs)", self.device)

    def hidden_rows(self, sel):
        """Embeddings take f32 rows on the host, and the GPU's activations are bf16: the rows are
        copied to the host and widened there (a bf16 is the upper half of an f32: its two bytes
        become bytes 2 and 3 of each little-endian f32, the zeroed lower two stay)."""
        h = sel.to_host()
        if h.dtype != "bf16":
            return h
        out = self._servd.empty(tuple(h.shape))
        dst, src = memoryview(out).cast("B"), memoryview(h).cast("B")
        dst[2::4] = src[0::2]
        dst[3::4] = src[1::2]
        return out


def memory_for(servd, dims):
    device = servd.device()
    return DeviceMemory(servd, dims, device) if on_device(device) else HostMemory(servd, dims)
