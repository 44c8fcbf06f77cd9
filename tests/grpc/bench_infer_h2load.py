"""ModelInfer over gRPC against POST /v2/models/mlp/infer over HTTP/1.1 with one C load generator for
both, h2load (Debian's nghttp2-client), so neither side pays a Python client's cost: the example
generic package (mlp_classifier, batch 1 x 64 FP32; JSON for HTTP, raw_input_contents for gRPC),
1 and 16 concurrent clients (a connection each, one call at a time), alternating rounds in one
servd; medians of the per-round p50 latency (h2load's per-request log) and throughput, and servd's
CPU time per call (/proc). Not a ctest test; run it by hand (docs/performance.md):
    .venv-test/bin/python tests/grpc/bench_infer_h2load.py --servd build/daemon/servd \
        --examples build/models --example-pack build/models/examples/servd-example-pack [--calls=4000]"""
import json
import os
import re
import shutil
import statistics
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.argv, calls = [a for a in sys.argv if not a.startswith("--calls=")], next(
    (int(a.split("=")[1]) for a in sys.argv if a.startswith("--calls=")), 4000)
from servd_harness import example_package, fail, parse_args, skip  # noqa: E402
from grpc_start import start  # noqa: E402

a = parse_args()
if not shutil.which("h2load"):
    skip("h2load is not installed (apt-get install nghttp2-client)")
import grpc  # noqa: E402
from tritonclient.grpc import service_pb2  # noqa: E402

s, gport = start(a, ["--model", f"{example_package(a, 'mlp_classifier')}:mlp", "--access-log", "off"])
d = os.path.join(a.work, f"h2load-{os.getpid()}")
os.makedirs(d, exist_ok=True)
x = np.linspace(-1, 1, 64, dtype=np.float32).reshape(1, 64)
with open(os.path.join(d, "body.json"), "w") as f:
    json.dump({"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32", "data": x.ravel().tolist()}]}, f)
req = service_pb2.ModelInferRequest(model_name="mlp")
req.inputs.add(name="x", datatype="FP32", shape=[1, 64])
req.raw_input_contents.append(x.tobytes())
msg = req.SerializeToString()
with open(os.path.join(d, "body.grpc"), "wb") as f:
    f.write(b"\0" + len(msg).to_bytes(4, "big") + msg)
# The same message answers through a real gRPC client (h2load checks only the :status).
with grpc.insecure_channel(f"127.0.0.1:{gport}") as ch:
    ch.unary_unary("/inference.GRPCInferenceService/ModelInfer")(msg, timeout=30)

runs = {
    "http": ["--h1", "-H", "content-type: application/json", "-d", os.path.join(d, "body.json"),
             f"http://127.0.0.1:{s.port}/v2/models/mlp/infer"],
    "grpc": ["-H", "content-type: application/grpc", "-H", "te: trailers", "-d", os.path.join(d, "body.grpc"),
             f"http://127.0.0.1:{gport}/inference.GRPCInferenceService/ModelInfer"],
}


def servd_cpu():
    with open(f"/proc/{s.proc.pid}/stat") as f:
        v = f.read().rsplit(")", 1)[1].split()
    return (int(v[11]) + int(v[12])) / os.sysconf("SC_CLK_TCK")


def run(kind, clients, n):
    log = os.path.join(d, f"{kind}.log")
    c0 = servd_cpu()
    r = subprocess.run(["h2load", "-n", str(n), "-c", str(clients), "-m", "1", "--log-file", log] + runs[kind],
                       capture_output=True, text=True, timeout=600)
    cpu = servd_cpu() - c0
    ok = re.search(r"(\d+) succeeded, (\d+) failed", r.stdout)
    rps = re.search(r"finished in [\d.]+\w+, ([\d.]+) req/s", r.stdout)
    if r.returncode != 0 or not ok or int(ok.group(1)) != n or not rps:
        fail(f"h2load {kind}: {r.stdout}\n{r.stderr}")
    with open(log) as f:
        lat = [int(ln.split()[2]) for ln in f if ln.strip()]
    return statistics.median(lat), float(rps.group(1)), cpu / n * 1e6


ROUNDS = int(os.environ.get("ROUNDS", "5"))
for clients in (1, 16):
    for kind in runs:
        run(kind, clients, 200)  # warm-up
    res = {k: [] for k in runs}
    for _ in range(ROUNDS):
        for kind in runs:
            res[kind].append(run(kind, clients, calls // ROUNDS))
    med = {k: [statistics.median(r[i] for r in v) for i in range(3)] for k, v in res.items()}
    for k, (p50, rps, cpu) in med.items():
        print(f"{clients} client(s) {k}: p50 {p50:.0f} us, {rps:.0f} calls/s, servd CPU {cpu:.0f} us/call "
              f"(medians of {ROUNDS} rounds of {calls // ROUNDS} calls; p50s {[round(r[0]) for r in res[k]]})")
    print(f"{clients} client(s) gRPC/HTTP: p50 {med['grpc'][0] / med['http'][0]:.2f}x, throughput "
          f"{med['grpc'][1] / med['http'][1]:.2f}x, servd CPU {med['grpc'][2] / med['http'][2]:.2f}x")
s.stop()
