"""A repository load whose package import never returns must not wedge the server (--load-timeout).

Packages (generic, in a --model-repository folder): `spin` loops at import (pure Python: interrupted
by TimeoutError at the load timeout), `sleeper` sleeps at import (inside C: cannot be interrupted, so
the load is abandoned and its interpreter quarantined), `good` doubles its input and is also given
at startup. Each bad load answers 400 within the timeout (plus the 2 s grace), the model is FAILED
with the reason, the server stays ready because its configured model serves, unload and reload
work, and SIGTERM during a load in progress exits promptly. Under --isolation process the child's
import is bounded the same way, and a child that stops altogether (`stopper` sends itself SIGSTOP
while importing) is killed 5 s after the load timeout, its load FAILED with the reason."""
import hashlib
import json
import os
import platform
import signal
import sys
import threading
import time
import zipfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from servd_harness import Servd, check, parse_args  # noqa: E402

GOOD_PY = """\
import servd
from servd import ops


class Model:
    def predict(self, inputs):
        x = inputs["x"]
        y = servd.empty(x.shape)
        ops.add(y, x, x)
        return {"y": y}
"""
SPIN_PY = "while True:\n    pass\n"
SLEEPER_PY = "import time\ntime.sleep(3600)\n"
# A process that never answers again: kill(getpid(), SIGSTOP) as a raw system call (62: x86-64's kill).
STOPPER_PY = ("import ctypes\nimport os\nimport signal\n"
              "ctypes.CDLL('libc.so.6').syscall(62, os.getpid(), int(signal.SIGSTOP))\n")

LOAD_TIMEOUT = 1.0
ABANDON_AFTER = LOAD_TIMEOUT + 2.0  # the engine's grace before it abandons an import


def make_package(path, name, model_py):
    """The package format (docs/package-format.md): stored entries, manifest.json last."""
    files = {f"code/{name}/__init__.py": b"", f"code/{name}/model.py": model_py.encode()}
    manifest = {"format_version": 1, "name": name, "model_version": "1", "kind": "generic",
                "entry_point": f"{name}.model:Model", "config": {}, "tensors": [],
                "files": {n: {"size": len(d), "sha256": hashlib.sha256(d).hexdigest()} for n, d in files.items()}}
    if "ctypes" in model_py:  # native code: the package declares it (docs/interpreters.md, "Capabilities")
        manifest["capabilities"] = ["native"]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for n, d in files.items():
            z.writestr(n, d)
        z.writestr("manifest.json", json.dumps(manifest))


def index(s):
    st, body = s.json("POST", "/v2/repository/index", {})
    check(st == 200, f"index: {st} {body}")
    return {m["name"]: m for m in body}


def infer_good(s):
    body = {"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [1.5, -2.0]}]}
    st, resp = s.json("POST", "/v2/models/good/infer", body)
    check(st == 200 and resp["outputs"][0]["data"] == [3.0, -4.0], f"infer good: {st} {resp}")


def load(s, name, out):
    t0 = time.monotonic()
    try:
        st, _, data = s.request("POST", f"/v2/repository/models/{name}/load", timeout=30)
        out.update(status=st, body=data.decode(errors="replace"))
    except OSError as e:  # no answer in 30 s: wedged (or the connection closed at shutdown)
        out.update(status=None, body=repr(e))
    out["took"] = time.monotonic() - t0


def failing_load(s, name, max_took, reason_part):
    """Loads `name` in the background; while it runs the server stays ready and serves `good`."""
    out = {}
    t = threading.Thread(target=load, args=(s, name, out))
    t.start()
    time.sleep(0.3)
    check(index(s)[name]["state"] == "LOADING", f"{name}: not loading: {index(s)}")
    st = s.request("GET", "/v2/health/ready")[0]
    check(st == 200, f"{name}: /v2/health/ready is {st} during a repository load")
    infer_good(s)
    t.join(40)
    check(out.get("status") == 400, f"{name}: load answered {out}")
    check(out["took"] < max_took, f"{name}: load answered after {out['took']:.1f} s (limit {max_took} s)")
    check("load timeout" in out["body"] and reason_part in out["body"], f"{name}: load error: {out['body']}")
    m = index(s)[name]
    check(m["state"] == "FAILED" and reason_part in m.get("reason", ""), f"{name}: index entry {m}")
    check(s.request("GET", "/v2/health/ready")[0] == 200, f"{name}: not ready after the failed load")
    check(s.request("GET", f"/v2/models/{name}/ready")[0] != 200, f"{name}: reported ready")
    return out


a = parse_args()
repo = os.path.join(a.work, "load-timeout-repo")
os.makedirs(repo, exist_ok=True)
for name, code in (("good", GOOD_PY), ("spin", SPIN_PY), ("sleeper", SLEEPER_PY), ("stopper", STOPPER_PY)):
    make_package(os.path.join(repo, f"{name}.mpk"), name, code)

# In-process (the packages that use ctypes declare native code, which would otherwise run them in a
# process of their own): the quarantine of interpreters is what this part checks.
s = Servd(a, ["--model", os.path.join(repo, "good.mpk") + ":good", "--model-repository", repo,
              "--load-timeout", str(LOAD_TIMEOUT), "--interpreters", "1", "--isolation", "none"])
infer_good(s)

# Interruptible: TimeoutError in the import at the load timeout.
failing_load(s, "spin", LOAD_TIMEOUT + 2.0, "interrupted")
# Not interruptible (blocked in C): abandoned after the grace, its interpreter quarantined.
failing_load(s, "sleeper", ABANDON_AFTER + 2.0, "abandoned")
check("quarantined" in s.stderr(), f"no quarantine in the log:\n{s.stderr()}")

# Unload and reload work on a failed model (it fails again, as promptly), and on a healthy one.
st, _, data = s.request("POST", "/v2/repository/models/spin/unload")
check(st == 200, f"unload of the failed model: {st} {data}")
failing_load(s, "spin", LOAD_TIMEOUT + 2.0, "interrupted")
st, _, data = s.request("POST", "/v2/repository/models/good/unload")
check(st == 200, f"unload good: {st} {data}")
check(s.request("GET", "/v2/health/ready")[0] == 200, "not ready after unloading on purpose")
st, _, data = s.request("POST", "/v2/repository/models/good/load")
check(st == 200, f"reload good: {st} {data}")
infer_good(s)

# SIGTERM while an import that cannot be interrupted is loading: the load is not waited for.
out = {}
t = threading.Thread(target=load, args=(s, "sleeper", out))
t.start()
time.sleep(0.5)
t0 = time.monotonic()
rc = s.stop(signal.SIGTERM, timeout=30)
took = time.monotonic() - t0
t.join(10)
log = s.stderr()
check(rc == 0, f"SIGTERM: exit status {rc}\n{log}")
check(took < 5.0, f"SIGTERM took {took:.1f} s with a load in progress\n{log}")
check(out.get("status") in (503, None), f"the pending load got {out}")
check("did not unload" not in log, f"models did not unload:\n{log}")

# Process isolation: the child gets the load timeout; servd kills a child that never answers.
s = Servd(a, ["--model", os.path.join(repo, "good.mpk") + ":good", "--model-repository", repo,
              "--load-timeout", str(LOAD_TIMEOUT), "--interpreters", "1", "--isolation", "process"])
infer_good(s)
check("isolated in process" in s.stderr(), f"good is not isolated:\n{s.stderr()}")
failing_load(s, "spin", LOAD_TIMEOUT + 4.0, "interrupted")
failing_load(s, "sleeper", ABANDON_AFTER + 4.0, "abandoned")
if platform.machine() == "x86_64":  # the system call number above
    failing_load(s, "stopper", LOAD_TIMEOUT + 5.0 + 4.0, "killed")
check(s.request("GET", "/v2/health/ready")[0] == 200, "not ready after the isolated loads failed")
infer_good(s)
rc = s.stop(signal.SIGTERM, timeout=30)
check(rc == 0, f"SIGTERM (isolated): exit status {rc}\n{s.stderr()}")
print(f"OK (spin and sleeper failed in time, in-process and isolated; stopper killed; exit {took:.2f} s after SIGTERM)")
