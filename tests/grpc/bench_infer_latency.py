"""ModelInfer latency at one client, gRPC vs HTTP, on the example generic package (mlp_classifier,
batch 1 x 64 FP32), in one run: alternating blocks of calls so both see the same machine state.
Not a ctest test; run it by hand (docs/performance.md):
    .venv-test/bin/python tests/grpc/bench_infer_latency.py --servd build/daemon/servd \
        --examples build/models --example-pack build/models/examples/servd-example-pack [--calls 2000]"""
import http.client
import json
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.argv, calls = [a for a in sys.argv if not a.startswith("--calls=")], next(
    (int(a.split("=")[1]) for a in sys.argv if a.startswith("--calls=")), 2000)
from servd_harness import example_package, parse_args  # noqa: E402
from grpc_start import start  # noqa: E402

import grpc  # noqa: E402
from tritonclient.grpc import service_pb2, service_pb2_grpc  # noqa: E402

a = parse_args()
s, gport = start(a, ["--model", f"{example_package(a, 'mlp_classifier')}:mlp", "--access-log", "off"])
x = np.linspace(-1, 1, 64, dtype=np.float32).reshape(1, 64)
body = json.dumps({"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32", "data": x.ravel().tolist()}]})
req = service_pb2.ModelInferRequest(model_name="mlp")
req.inputs.add(name="x", datatype="FP32", shape=[1, 64])
req.raw_input_contents.append(x.tobytes())
hc = http.client.HTTPConnection("127.0.0.1", s.port)
stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(f"127.0.0.1:{gport}"))


def http_call():
    hc.request("POST", "/v2/models/mlp/infer", body, {"Content-Type": "application/json"})
    r = hc.getresponse()
    r.read()
    assert r.status == 200


def grpc_call():
    stub.ModelInfer(req, timeout=30)


lat = {"http": [], "grpc": []}
for f in (http_call, grpc_call):
    for _ in range(50):  # warm-up
        f()
block = 100
for _ in range(max(1, calls // block)):
    for name, f in (("http", http_call), ("grpc", grpc_call)):
        for _ in range(block):
            t = time.perf_counter_ns()
            f()
            lat[name].append((time.perf_counter_ns() - t) / 1e3)
for name, v in lat.items():
    v.sort()
    print(f"{name}: n={len(v)} p50={statistics.median(v):.0f} us p90={v[int(len(v) * 0.9)]:.0f} us "
          f"p99={v[int(len(v) * 0.99)]:.0f} us")
s.stop()
