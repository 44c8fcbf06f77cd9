"""End to end: a generic package made by `modelpkg pack --kind generic` (code folder + safetensors files
written with numpy), served by servd and called through KServe v2 POST /v2/models/{name}/infer with
urllib; the outputs are checked against numpy. Skipped (77) when servd is not built ($SERVD_BIN)."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

try:
    import numpy as np
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import generic_fixture as gf  # noqa: E402

MODELPKG = sys.argv[1]
SERVD = os.environ.get("SERVD_BIN", "")


def http(url, body=None, timeout=60):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def main():
    if not SERVD or not os.access(SERVD, os.X_OK):
        print(f"skipped: the servd binary is not built ({SERVD or 'SERVD_BIN unset'}); build the servd target")
        sys.exit(77)
    tmp = tempfile.mkdtemp(prefix="mpk-it-generic-serve-")
    code, weights, cfg, _, (w1, w2) = gf.make(tmp)
    pkg = os.path.join(tmp, "toy.mpk")
    p = subprocess.run([MODELPKG, "pack", "--kind", "generic", "--code", code, "--entry-point", "toy_model.model:Toy",
                        "--weights", weights[0], "--weights", weights[1], "--config", cfg, "-o", pkg, "--quiet"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr

    log = open(os.path.join(tmp, "servd.log"), "w")
    proc = subprocess.Popen([SERVD, "--host", "127.0.0.1", "--port", "0", "--model", f"{pkg}:toy", "--threads", "2"],
                            stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        port = None
        deadline = time.monotonic() + 60
        while port is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            if line.startswith("servd: port "):
                port = int(line.split()[2])
        assert port, "servd did not report its port: " + open(log.name).read()
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, "servd exited: " + open(log.name).read()
            try:
                if http(url + "/v2/models/toy/ready")[0] == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "model not ready: " + open(log.name).read()
            time.sleep(0.1)

        x = np.random.default_rng(3).uniform(-1, 1, (3, gf.D_IN)).astype(np.float32)
        req = {"id": "g1", "inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32",
                                       "data": x.ravel().tolist()}]}
        st, body = http(url + "/v2/models/toy/infer", req)
        assert st == 200, (st, body)
        assert body["model_name"] == "toy" and body["id"] == "g1", body
        out = {o["name"]: o for o in body["outputs"]}
        assert set(out) == {"y", "scale"}, out
        y = out["y"]
        assert y["datatype"] == "FP32" and y["shape"] == [3, gf.D_OUT], y
        # numpy reference in float64 from the exact stored weights (f16 widens exactly).
        ref = (x.astype(np.float64) @ w1.astype(np.float64).T) @ w2.astype(np.float64).T
        got = np.array(y["data"], np.float64).reshape(3, gf.D_OUT)
        # f32 accumulation over 16 then 8 terms of magnitude <= 1: rounding error ~1e-6; 1e-4 leaves
        # margin for a different summation order or f32 activations between the layers, and still
        # catches a wrong tensor, transposition or dtype decoding (errors of order 0.1).
        err = np.abs(got - ref).max()
        assert err < 1e-4, (err, got, ref)
        assert out["scale"]["data"] == [1.5], out["scale"]  # the manifest config reached the model
        # A wrong input gives a per-request error, not a crash.
        st, body = http(url + "/v2/models/toy/infer", {"inputs": [{"name": "z", "shape": [1], "datatype": "FP32",
                                                                   "data": [0.0]}]})
        assert 400 <= st < 600 and "error" in body, (st, body)
        assert http(url + "/v2/models/toy/ready")[0] == 200
        print(f"ok (max abs error {err:.2e})")
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
    shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
