"""A model exception is a true 500 from a real servd process, bad input a 400, and the server keeps
serving: a generic package whose predict raises RuntimeError for 3-row inputs (the model's failure)
and ValueError for 5-row inputs (the input's fault, by the rule in daemon/engine/engine.h), and
doubles its input otherwise (oracle: 2 * x, exact in f32). The package imports `logging` (which
imports `threading`) at import time: SIGTERM must still unload it promptly."""
import hashlib
import json
import os
import sys
import zipfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from servd_harness import Servd, check, parse_args  # noqa: E402

MODEL_PY = """\
import logging

import servd
from servd import ops


class Flaky:
    def predict(self, inputs):
        x = inputs["x"]
        if x.shape[0] == 3:
            raise RuntimeError("three rows break the model")
        if x.shape[0] == 5:
            raise ValueError("x: expected at most 4 rows")
        y = servd.empty(x.shape)
        ops.add(y, x, x)
        return {"y": y}
"""


def make_package(path):
    """The package format (docs/package-format.md): stored entries, manifest.json last."""
    files = {"code/flaky/__init__.py": b"", "code/flaky/model.py": MODEL_PY.encode()}
    manifest = {"format_version": 1, "name": "flaky", "model_version": "1", "kind": "generic",
                "entry_point": "flaky.model:Flaky", "config": {}, "tensors": [],
                "files": {n: {"size": len(d), "sha256": hashlib.sha256(d).hexdigest()} for n, d in files.items()}}
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for n, d in files.items():
            z.writestr(n, d)
        z.writestr("manifest.json", json.dumps(manifest))


def infer(s, rows):
    data = [float(i) * 0.5 for i in range(rows * 4)]
    body = {"inputs": [{"name": "x", "shape": [rows, 4], "datatype": "FP32", "data": data}]}
    st, resp = s.json("POST", "/v2/models/flaky/infer", body)
    return st, resp, data


a = parse_args()
pkg = os.path.join(a.work, "flaky.mpk")
make_package(pkg)
s = Servd(a, ["--model", pkg, "--interpreters", "2"])

for attempt in range(3):
    st, resp, data = infer(s, 3)
    check(st == 500, f"RuntimeError in predict: expected 500, got {st} {resp}")
    check(resp.get("type") == "model_error", f"500 body: {resp}")
    check(resp.get("exception") == {"type": "RuntimeError", "message": "three rows break the model"},
          f"500 exception: {resp}")
    check("three rows break the model" in resp.get("error", ""), f"500 message: {resp}")

    st, resp, _ = infer(s, 5)
    check(st == 400, f"ValueError in predict: expected 400, got {st} {resp}")
    check("expected at most 4 rows" in resp.get("error", ""), f"400 message: {resp}")

    # The server keeps serving, with right answers.
    st, resp, data = infer(s, 2)
    check(st == 200, f"after the failures: {st} {resp}")
    out = {o["name"]: o for o in resp["outputs"]}
    check(out["y"]["shape"] == [2, 4] and out["y"]["data"] == [2 * v for v in data], f"y: {out}")

check(s.request("GET", "/v2/health/ready")[0] == 200, "ready after model failures")
check(s.request("GET", "/v2/models/flaky/ready")[0] == 200, "model ready after model failures")
rc = s.stop()
check(rc == 0, f"SIGTERM: exit status {rc}")
check("did not unload" not in s.stderr(), f"the model did not unload:\n{s.stderr()}")
print("OK")
