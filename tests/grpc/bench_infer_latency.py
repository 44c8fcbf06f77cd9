"""ModelInfer over gRPC against POST /v2/models/mlp/infer over HTTP, on the example generic package
(mlp_classifier, batch 1 x 64 FP32), at 1 and 16 concurrent clients, in one run: alternating blocks
of calls so both see the same machine state; medians. Each client is a thread with its own
connection (http.client keep-alive; a grpcio channel with Triton's stubs, raw_input_contents).
Besides the client-side latency and throughput it reports servd's own CPU time per call (from
/proc), the part of the cost that is servd's rather than the Python clients'.
Not a ctest test; run it by hand (docs/performance.md):
    .venv-test/bin/python tests/grpc/bench_infer_latency.py --servd build/daemon/servd \
        --examples build/models --example-pack build/models/examples/servd-example-pack [--calls=2000]"""
import http.client
import json
import os
import statistics
import sys
import threading
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


def http_client():
    hc = http.client.HTTPConnection("127.0.0.1", s.port)

    def call():
        hc.request("POST", "/v2/models/mlp/infer", body, {"Content-Type": "application/json"})
        r = hc.getresponse()
        r.read()
        assert r.status == 200
    return call


def grpc_client():
    stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(f"127.0.0.1:{gport}"))
    return lambda: stub.ModelInfer(req, timeout=30)


def servd_cpu():
    with open(f"/proc/{s.proc.pid}/stat") as f:
        v = f.read().rsplit(")", 1)[1].split()
    return (int(v[11]) + int(v[12])) / os.sysconf("SC_CLK_TCK")


def block(fns, per_client, lat):
    """per_client calls on each client at once; returns (seconds, servd CPU seconds)."""
    def run(f):
        for _ in range(per_client):
            t = time.perf_counter_ns()
            f()
            lat.append((time.perf_counter_ns() - t) / 1e3)
    ths = [threading.Thread(target=run, args=(f,)) for f in fns]
    c0, t0 = servd_cpu(), time.perf_counter()
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    return time.perf_counter() - t0, servd_cpu() - c0


for n in (1, 16):
    clients = {"http": [http_client() for _ in range(n)], "grpc": [grpc_client() for _ in range(n)]}
    for fns in clients.values():
        block(fns, 20, [])  # warm-up
    per_block = max(1, 100 // n)
    lat = {k: [] for k in clients}
    rate = {k: [] for k in clients}
    cpu = {k: [] for k in clients}
    for _ in range(max(1, calls // (per_block * n))):
        for k, fns in clients.items():
            dt, c = block(fns, per_block, lat[k])
            rate[k].append(per_block * n / dt)
            cpu[k].append(c / (per_block * n) * 1e6)
    for k, v in lat.items():
        v.sort()
        print(f"{n} client(s) {k}: n={len(v)} p50={statistics.median(v):.0f} us p90={v[int(len(v) * 0.9)]:.0f} us "
              f"p99={v[int(len(v) * 0.99)]:.0f} us; {statistics.median(rate[k]):.0f} calls/s (median of "
              f"{len(rate[k])} blocks); servd CPU {statistics.mean(cpu[k]):.0f} us/call")
    print(f"{n} client(s) gRPC/HTTP: p50 {statistics.median(lat['grpc']) / statistics.median(lat['http']):.2f}x, "
          f"throughput {statistics.median(rate['grpc']) / statistics.median(rate['http']):.2f}x, servd CPU "
          f"{statistics.mean(cpu['grpc']) / statistics.mean(cpu['http']):.2f}x")
s.stop()
