"""Process isolation (daemon/engine/isolated.c): a generic package whose predict segfaults through
ctypes (ctypes.string_at(0)) for a negative first value runs with "isolation": "process" from the
config file. Its crash fails that request with a 500 naming the signal, servd and the other model
(in-process) keep serving, and the isolated model comes back after its restart. Also: answers and
model errors cross the process boundary unchanged (small tensors inline, a 256 KiB one through
shared memory), requests while it restarts get 503, repeated crashes back off, a crash loop (the
model crashes at every start) takes only that model out of service (its readiness 503, the server's
200, the repository index says why, /metrics counts the restarts), and at SIGTERM the child ends
with servd."""
import hashlib
import json
import os
import re
import sys
import time
import zipfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from servd_harness import Servd, check, metric_value, parse_args  # noqa: E402

MODEL_PY = """\
import ctypes
import os

import servd
from servd import ops


class Crashy:
    def __init__(self):
        if os.path.exists("@MARKER@"):
            ctypes.string_at(0)            # crashes at every start while the marker exists

    def predict(self, inputs):
        x = inputs["x"]
        first = memoryview(x).cast("B").cast("f")[0]
        if first < 0:
            ctypes.string_at(0)            # SIGSEGV: only this model's process dies
        if first == 3:
            raise RuntimeError("three breaks the model")
        if first == 5:
            raise ValueError("x: five is not accepted")
        y = servd.empty(x.shape)
        ops.add(y, x, x)
        return {"y": y, "pid": servd.tensor([float(os.getpid())])}
"""


def make_package(path, name, cls, model_py):
    files = {f"code/{name}/__init__.py": b"", f"code/{name}/model.py": model_py.encode()}
    manifest = {"format_version": 1, "name": name, "model_version": "1", "kind": "generic",
                "entry_point": f"{name}.model:{cls}", "config": {}, "tensors": [],
                "files": {n: {"size": len(d), "sha256": hashlib.sha256(d).hexdigest()} for n, d in files.items()}}
    if "ctypes" in model_py:  # native code: the package declares it (docs/interpreters.md, "Capabilities")
        manifest["capabilities"] = ["native"]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for n, d in files.items():
            z.writestr(n, d)
        z.writestr("manifest.json", json.dumps(manifest))


def infer(s, model, first, rows=1, cols=4):
    data = [float(first)] + [float(i % 7) for i in range(1, rows * cols)]
    body = {"inputs": [{"name": "x", "shape": [rows, cols], "datatype": "FP32", "data": data}]}
    st, resp = s.json("POST", f"/v2/models/{model}/infer", body)
    return st, resp, data


def outputs(resp):
    return {o["name"]: o for o in resp.get("outputs", [])}


a = parse_args()
marker = os.path.join(a.work, "crashy.crash-loop")
if os.path.exists(marker):
    os.unlink(marker)
MODEL_PY = MODEL_PY.replace("@MARKER@", marker)
pkg = os.path.join(a.work, "crashy.mpk")
make_package(pkg, "crashy", "Crashy", MODEL_PY)
plain = os.path.join(a.work, "steady.mpk")
make_package(plain, "steady", "Crashy", MODEL_PY.replace("ctypes.string_at(0)", "pass"))
cfg = os.path.join(a.work, "isolation.json")
with open(cfg, "w") as f:
    json.dump({"models": [{"path": pkg, "name": "crashy", "isolation": "process", "interpreters": 2},
                          {"path": plain, "name": "steady", "isolation": "none"}]}, f)  # it declares native
s = Servd(a, ["--config", cfg])

# Answers and model errors cross the boundary unchanged.
st, resp, data = infer(s, "crashy", 1.5)
check(st == 200, f"isolated predict: {st} {resp}")
out = outputs(resp)
check(out["y"]["data"] == [2 * v for v in data], f"isolated y: {out}")
child = int(out["pid"]["data"][0])
check(child != s.proc.pid, f"the isolated model runs in servd's own process ({child})")
st, resp, data = infer(s, "crashy", 2.0, rows=64, cols=1024)  # 256 KiB each way: shared memory
check(st == 200 and outputs(resp)["y"]["data"] == [2 * v for v in data], f"large tensors: {st}")
st, resp, _ = infer(s, "crashy", 3)
check(st == 500 and resp.get("exception") == {"type": "RuntimeError", "message": "three breaks the model"},
      f"RuntimeError through isolation: {st} {resp}")
st, resp, _ = infer(s, "crashy", 5)
check(st == 400 and "five is not accepted" in resp.get("error", ""), f"ValueError through isolation: {st} {resp}")
st, resp, _ = infer(s, "steady", 1.0)
check(st == 200 and int(outputs(resp)["pid"]["data"][0]) == s.proc.pid, f"the other model in-process: {st} {resp}")

# The crash fails its request with a 500 naming the signal; the server and the other model go on.
st, resp, _ = infer(s, "crashy", -1)
check(st == 500, f"segfault under isolation: expected 500, got {st} {resp}")
check(resp.get("exception", {}).get("type") == "ModelProcessDied", f"crash body: {resp}")
check("signal 11 (SIGSEGV)" in resp.get("error", ""), f"crash message names the signal: {resp}")
check(s.proc.poll() is None, "servd died with the isolated model")
for _ in range(3):
    st, resp, data = infer(s, "steady", 1.0)
    check(st == 200 and outputs(resp)["y"]["data"] == [2 * v for v in data], f"other model after the crash: {st}")
check(s.request("GET", "/v2/health/live")[0] == 200, "live after the crash")

# It comes back in a new process; requests meanwhile get 503 (never anything else).
deadline = time.monotonic() + 60
while True:
    st, resp, data = infer(s, "crashy", 1.0)
    if st == 200:
        break
    check(st == 503, f"while restarting: expected 503, got {st} {resp}")
    check(time.monotonic() < deadline, "the isolated model did not come back")
    time.sleep(0.05)
check(outputs(resp)["y"]["data"] == [2 * v for v in data], f"after the restart: {resp}")
check(int(outputs(resp)["pid"]["data"][0]) != child, "the restarted model runs in a new process")
check(s.request("GET", "/v2/models/crashy/ready")[0] == 200, "ready after the restart")

# A second crash right after the first backs off longer.
st, resp, _ = infer(s, "crashy", -1)
check(st == 500 and "SIGSEGV" in resp.get("error", ""), f"second crash: {st} {resp}")
deadline = time.monotonic() + 60
while infer(s, "crashy", 1.0)[0] != 200:
    check(time.monotonic() < deadline, "the isolated model did not come back a second time")
    time.sleep(0.05)
log = s.stderr()
delays = [float(d) for d in re.findall(r"model 'crashy': .*killed by signal 11 \(SIGSEGV\).*restarting in ([0-9.]+) s", log)]
check(len(delays) == 2 and delays[1] > delays[0], f"backoff: {delays}\n{log}")
check(log.count("model 'crashy': restarted") == 2, f"restart log lines:\n{log}")

# A crash loop: every start crashes while the marker exists. Only that model is out of service.
open(marker, "w").close()
st, resp, _ = infer(s, "crashy", -1)
check(st == 500 and "SIGSEGV" in resp.get("error", ""), f"third crash: {st} {resp}")
deadline = time.monotonic() + 30
while "model 'crashy': restart failed" not in s.stderr():
    check(time.monotonic() < deadline, f"no failed restart in the log:\n{s.stderr()}")
    time.sleep(0.05)
check(s.request("GET", "/v2/models/crashy/ready")[0] == 503, "crashy ready in its crash loop")
st, _, body = s.request("GET", "/v2/health/ready")
check(st == 200, f"/v2/health/ready is {st} while an isolated model restarts: {body}")
check(s.request("GET", "/v2/health/live")[0] == 200, "not live while an isolated model restarts")
check(s.request("GET", "/v2/models/steady/ready")[0] == 200, "steady not ready during the crash loop")
st, idx = s.json("POST", "/v2/repository/index", {})
entry = {m["name"]: m for m in idx}.get("crashy", {})
check(st == 200 and entry.get("state") == "UNAVAILABLE" and "SIGSEGV" in entry.get("reason", "")
      and "restart" in entry.get("reason", ""), f"index entry of the crash loop: {entry}")
text = s.metrics()
restarts = metric_value(text, "servd_isolated_model_restarts_total", {"model": "crashy"})
check(restarts is not None and restarts >= 4, f"restart counter: {restarts}")
check(metric_value(text, "servd_isolated_model_restarts_total", {"model": "steady"}) is None,
      "an in-process model has a restart counter")
check("\nservd_engine_quarantined_interpreters 0\n" in text, "quarantined interpreters gauge")
check(metric_value(text, "servd_model_ready", {"model": "crashy"}) == 0, "servd_model_ready of crashy")
st, resp, data = infer(s, "steady", 1.0)
check(st == 200, f"steady during the crash loop: {st} {resp}")
os.unlink(marker)  # the next start succeeds: back to serving, back in the index
deadline = time.monotonic() + 60
while infer(s, "crashy", 1.0)[0] != 200:
    check(time.monotonic() < deadline, f"the isolated model did not come back after its crash loop\n{s.stderr()}")
    time.sleep(0.05)
st, idx = s.json("POST", "/v2/repository/index", {})
entry = {m["name"]: m for m in idx}.get("crashy", {})
check(entry.get("state") == "READY" and "reason" not in entry, f"index entry after the crash loop: {entry}")

last = int(outputs(infer(s, "crashy", 1.0)[1])["pid"]["data"][0])
rc = s.stop()
check(rc == 0, f"SIGTERM: exit status {rc}\n{s.stderr()}")
check(not os.path.exists(f"/proc/{last}") or open(f"/proc/{last}/stat").read().split()[2] == "Z",
      f"the isolated model's process {last} outlived servd")
print("OK")
