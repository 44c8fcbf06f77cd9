"""A deep, narrow residual MLP: the Python-heavy benchmark model.

Per layer: r += W_down (SiLU(W_gate rmsnorm(r)) * W_up rmsnorm(r)), six ops on (batch, 32) rows, so
the interpreter's dispatch costs as much as the arithmetic (the case where one GIL would limit a
process).

inputs {"x": f32 (batch, d)}  outputs {"y": f32 (batch, d)}
"""
import servd
from servd import ops


class DeepTiny:
    def __init__(self):
        cfg = servd.package.config
        self.d = int(cfg["d"])
        self.f = int(cfg["f"])
        self.eps = float(cfg["eps"])
        t = servd.package.tensor
        self.layers = [
            (t(f"layers.{i}.norm"), t(f"layers.{i}.gate"), t(f"layers.{i}.up"), t(f"layers.{i}.down"))
            for i in range(int(cfg["n_layers"]))
        ]

    def predict(self, inputs):
        x = inputs["x"]
        if x.dtype != "f32" or x.ndim != 2 or x.shape[1] != self.d:
            raise ValueError(f"x must be f32 (batch, {self.d}), got {x.dtype}{list(x.shape)}")
        m = x.shape[0]
        r = servd.empty((m, self.d))
        h = servd.empty((m, self.d))
        y = servd.empty((m, self.d))
        g = servd.empty((m, self.f))
        u = servd.empty((m, self.f))
        ops.add(r, x, r)  # r = x (r is zeroed)
        for norm, gate, up, down in self.layers:
            ops.rmsnorm(h, r, norm, self.eps)
            ops.matmul(g, h, gate)
            ops.matmul(u, h, up)
            ops.swiglu(g, g, u)
            ops.matmul(y, g, down)
            ops.add(r, r, y)
        return {"y": r}
