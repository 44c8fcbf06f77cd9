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


def make_package(path, name, model_py, capabilities=None):
    files = {f"code/{name}/__init__.py": b"", f"code/{name}/model.py": model_py.encode()}
    manifest = {"format_version": 1, "name": name, "model_version": "1", "kind": "generic",
                "entry_point": f"{name}.model:Guarded", "config": {}, "tensors": [],
                "files": {n: {"size": len(d), "sha256": hashlib.sha256(d).hexdigest()} for n, d in files.items()}}
    if capabilities is not None:
        manifest["capabilities"] = capabilities
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for n, d in files.items():
            z.writestr(n, d)
        z.writestr("manifest.json", json.dumps(manifest))


def infer(s, k, model="guarded"):
    data = [float(k), 1.0, 2.0, 3.0]
    body = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": data}]}
    st, resp = s.json("POST", f"/v2/models/{model}/infer", body)
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

# Capabilities (docs/interpreters.md): a package that does not declare "native" cannot reach native
# code through ctypes, nor, without "fd", close or write descriptors it did not open (closing the
# server's sockets over a range aborted servd in libuv, exit 134): PermissionError, a 500 naming the
# capability, and servd serves on. Declared, the harmless ones of the same calls work.
CAP_CALLS = [  # (capability, code, harmless: run by the package that declares it too)
    ("native", "import ctypes; assert ctypes.CDLL('libm.so.6').cos", True),
    ("native", "import ctypes; ctypes.c_int.from_address(8).value", False),
    ("fd", "import os; os.closerange(3, 1024)", False),
    ("fd", "import os\nfor fd in range(3, 1024): os.close(fd)", False),
    ("fd", "import os\nwith open('/dev/null', 'wb') as f: os.write(f.fileno(), b'x')", True),
    ("fd", "import os\nr, w = os.pipe(); os.write(w, b'x'); os.close(r); os.close(w)", None),  # its own: always
]
CAP_MODEL_PY = MODEL_PY.replace("CALLS = %r" % (CALLS,), "CALLS = %r" % ([(c, code) for c, code, _ in CAP_CALLS],))
make_package(os.path.join(a.work, "undeclared.mpk"), "undeclared", CAP_MODEL_PY)
make_package(os.path.join(a.work, "declared.mpk"), "declared", CAP_MODEL_PY, ["native", "fd"])
s = Servd(a, ["--model", os.path.join(a.work, "undeclared.mpk"), "--model", os.path.join(a.work, "declared.mpk")])
# Declared native code runs in a process of its own unless the operator says otherwise.
check("model 'declared' declares native code" in s.stderr(), f"no isolation line for 'declared':\n{s.stderr()}")
check("model 'undeclared' declares native code" not in s.stderr(), "'undeclared' was isolated")
for k, (cap, code, harmless) in enumerate(CAP_CALLS):
    st, resp, data = infer(s, k, "undeclared")
    exc = resp.get("exception", {}) if isinstance(resp, dict) else {}
    if harmless is None:
        check(st == 200, f"undeclared, its own descriptors: {st} {resp}")
    else:
        check(st == 500 and exc.get("type") == "PermissionError" and
              f'"capabilities": ["{cap}"]' in exc.get("message", ""), f"undeclared {code!r}: {st} {resp}")
    st, resp, data = infer(s, -1, "undeclared")
    check(st == 200 and resp["outputs"][0]["data"] == [2 * v for v in data], f"after {code!r}: {st} {resp}")
    if harmless is not False:
        st, resp, data = infer(s, k, "declared")
        check(st == 200, f"declared {code!r}: {st} {resp}")
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
