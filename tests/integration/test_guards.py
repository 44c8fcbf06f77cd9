"""Process-wide calls in model code raise instead of ending the server (interp/pymod/bootstrap.py,
install_guards): a generic package whose predict makes call number int(x[0]) of CALLS gets a 500
naming the call for each, and the server keeps serving right answers after every one of them. A
package whose import calls os._exit fails to load with a log line naming the call (before the guards
servd ended silently, status 3)."""
import hashlib
import json
import os
import subprocess
import sys
import zipfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from servd_harness import Servd, check, parse_args  # noqa: E402

CALLS = [
    ("os._exit()", "import os; os._exit(3)"),
    ("os.abort()", "import os; os.abort()"),
    ("os.kill(", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"),
    ("os.killpg(", "import os, signal; os.killpg(os.getpgrp(), signal.SIGTERM)"),
    ("signal.signal()", "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN)"),
    ("signal.alarm()", "import signal; signal.alarm(1)"),
    ("signal.setitimer()", "import signal; signal.setitimer(signal.ITIMER_REAL, 0.2)"),
    ("signal.pthread_kill(", "import signal, threading; signal.pthread_kill(threading.get_ident(), 15)"),
    ("os.fork()", "import os; os.fork()"),
    ("os.exec*()", "import os; os.execv('/bin/true', ['true'])"),
    ("os.posix_spawn()", "import os; os.posix_spawn('/bin/true', ['true'], {})"),
    ("subprocess.Popen()", "import subprocess; subprocess.run(['true'])"),
    ("faulthandler.enable()", "import faulthandler; faulthandler.enable()"),
    ("faulthandler._sigsegv()", "import faulthandler; faulthandler._sigsegv()"),
    ("ctypes access to abort()", "import ctypes; ctypes.CDLL(None).abort()"),
]

MODEL_PY = """\
import servd
from servd import ops

CALLS = %r


class Guarded:
    def predict(self, inputs):
        x = inputs["x"]
        k = int(x.tolist()[0][0])
        if k >= 0:
            exec(CALLS[k][1])
        y = servd.empty(x.shape)
        ops.add(y, x, x)
        return {"y": y}
""" % (CALLS,)


def make_package(path, name, model_py):
    files = {f"code/{name}/__init__.py": b"", f"code/{name}/model.py": model_py.encode()}
    manifest = {"format_version": 1, "name": name, "model_version": "1", "kind": "generic",
                "entry_point": f"{name}.model:Guarded", "config": {}, "tensors": [],
                "files": {n: {"size": len(d), "sha256": hashlib.sha256(d).hexdigest()} for n, d in files.items()}}
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for n, d in files.items():
            z.writestr(n, d)
        z.writestr("manifest.json", json.dumps(manifest))


def infer(s, k):
    data = [float(k), 1.0, 2.0, 3.0]
    body = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": data}]}
    st, resp = s.json("POST", "/v2/models/guarded/infer", body)
    return st, resp, data


a = parse_args()
pkg = os.path.join(a.work, "guarded.mpk")
make_package(pkg, "guarded", MODEL_PY)
s = Servd(a, ["--model", pkg])
for k, (name, _) in enumerate(CALLS):
    st, resp, _ = infer(s, k)
    check(st == 500, f"{name}: expected 500, got {st} {resp}")
    msg = resp.get("exception", {}).get("message", "")
    check(resp.get("exception", {}).get("type") == "RuntimeError" and name in msg and
          "is not allowed in servd model code" in msg, f"{name}: {resp}")
    st, resp, data = infer(s, -1)
    check(st == 200 and resp["outputs"][0]["data"] == [2 * v for v in data], f"after {name}: {st} {resp}")
check(s.proc.poll() is None, "servd is still running")
rc = s.stop()
check(rc == 0, f"SIGTERM: exit status {rc}")

# At import time: the load fails with the reason in the log, and servd exits 1 (a startup failure).
bad = os.path.join(a.work, "exits.mpk")
make_package(bad, "exits", "import os\nos._exit(3)\n\nclass Guarded:\n    pass\n")
r = subprocess.run([a.servd, "--port", "0", "--model", bad], capture_output=True, text=True, timeout=120)
check(r.returncode == 1, f"import calling os._exit: exit status {r.returncode}\n{r.stderr}")
check("os._exit() is not allowed in servd model code" in r.stderr, f"no log line naming the call:\n{r.stderr}")
print("OK")
