"""MLP classifier: RMSNorm -> gated MLP (SiLU(x Wg^T) * x Wu^T) -> linear -> softmax.

inputs  {"x": f32 (batch, d_in)}
outputs {"probs": f32 (batch, n_classes), "label": i32 (batch,)}

Every step is a servd op (the GIL is released while it runs); outputs and scratch are allocated per
call, so one instance may serve calls from several threads at once.
"""
import servd
from servd import ops


class MLPClassifier:
    def __init__(self):
        cfg = servd.package.config
        self.d_in = int(cfg["d_in"])
        self.hidden = int(cfg["hidden"])
        self.n_classes = int(cfg["n_classes"])
        self.eps = float(cfg["eps"])
        self.labels = list(cfg.get("labels", []))
        t = servd.package.tensor
        self.norm = t("norm.weight")      # (d_in,)
        self.w_gate = t("gate.weight")    # (hidden, d_in)
        self.w_up = t("up.weight")        # (hidden, d_in)
        self.w_out = t("out.weight")      # (n_classes, hidden)

    def predict(self, inputs):
        x = inputs.get("x")
        if x is None:
            raise KeyError("input 'x' is required")
        if x.dtype != "f32" or x.ndim != 2 or x.shape[1] != self.d_in:
            raise ValueError(f"x must be f32 (batch, {self.d_in}), got {x.dtype}{list(x.shape)}")
        m = x.shape[0]
        h = servd.empty((m, self.d_in))
        g = servd.empty((m, self.hidden))
        u = servd.empty((m, self.hidden))
        probs = servd.empty((m, self.n_classes))
        label = servd.empty((m,), dtype="i32")
        ops.rmsnorm(h, x, self.norm, self.eps)
        ops.matmul(g, h, self.w_gate)
        ops.matmul(u, h, self.w_up)
        ops.swiglu(g, g, u)
        ops.matmul(probs, g, self.w_out)
        ops.argmax(label, probs)
        ops.softmax(probs)
        return {"probs": probs, "label": label}

    def info(self):
        return {"d_in": self.d_in, "n_classes": self.n_classes, "labels": self.labels}
