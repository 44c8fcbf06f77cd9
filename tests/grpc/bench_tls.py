"""What TLS costs, measured with one C load generator (h2load, Debian's nghttp2-client) against two
servd of the same build serving the same model, one plaintext and one with --tls-cert/--tls-key (a
P-256 certificate made here; TLS 1.3), alternating rounds; medians.

  HTTP: 32 concurrent /v1/completions streams (stream: true, ignore_eos, max_tokens TOKENS) on the
        default model, HTTP/1.1 (ALPN http/1.1 under TLS): completed requests per second.
  gRPC: ModelInfer of the example generic package (mlp_classifier) from 16 h2 connections, h2c
        against h2 via ALPN: calls per second.

Not a ctest test; run it by hand (docs/performance.md):
    .venv-test/bin/python tests/grpc/bench_tls.py --servd build/daemon/servd --examples build/models \
        --example-pack build/models/examples/servd-example-pack [--model=.cache/smollm2-135m-instruct-q4_1.mpk]"""
import json
import os
import re
import shutil
import ssl
import statistics
import subprocess
import sys
import time
import http.client

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
model = next((x.split("=", 1)[1] for x in sys.argv if x.startswith("--model=")),
             os.path.join(root, ".cache", "smollm2-135m-instruct-q4_1.mpk"))
sys.argv = [x for x in sys.argv if not x.startswith("--model=")]
from servd_harness import example_package, fail, parse_args, skip  # noqa: E402

a = parse_args()
if not shutil.which("h2load") or not shutil.which("openssl"):
    skip("h2load (nghttp2-client) and openssl are needed")
if not os.path.exists(model):
    skip(f"{model} is not there (scripts/bench fetches the default model)")
from tritonclient.grpc import service_pb2  # noqa: E402

STREAMS, TOKENS = 32, int(os.environ.get("TOKENS", "32"))
ROUNDS = int(os.environ.get("ROUNDS", "3"))
d = os.path.join(a.work, f"bench-tls-{os.getpid()}")
os.makedirs(d, exist_ok=True)
subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                "-keyout", "key.pem", "-out", "cert.pem", "-days", "2", "-subj", "/CN=127.0.0.1"], cwd=d,
               check=True, capture_output=True)


def start(tls):
    args = [a.servd, "--host", "127.0.0.1", "--port", "0", "--grpc-port", "0", "--access-log", "off", "--model",
            f"{model}:llm", "--model", f"{example_package(a, 'mlp_classifier')}:mlp"]
    if tls:
        args += ["--tls-cert", os.path.join(d, "cert.pem"), "--tls-key", os.path.join(d, "key.pem")]
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=open(os.path.join(d, f"servd-{tls}.log"), "w"),
                         text=True)
    port = gport = None
    while port is None:
        line = p.stdout.readline()
        if not line:
            fail(f"servd did not start: {open(os.path.join(d, f'servd-{tls}.log')).read()}")
        if line.startswith("servd: grpc port "):
            gport = int(line.split()[3])
        elif line.startswith("servd: port "):
            port = int(line.split()[2])
    ctx = ssl._create_unverified_context() if tls else None
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            c = (http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=10) if tls else
                 http.client.HTTPConnection("127.0.0.1", port, timeout=10))
            c.request("GET", "/v2/health/ready")
            if c.getresponse().status == 200:
                return p, port, gport
        except OSError:
            pass
        time.sleep(0.2)
    fail("servd not ready")


servers = {"plain": start(False), "tls": start(True)}
with open(os.path.join(d, "completion.json"), "w") as f:
    json.dump({"model": "llm", "prompt": "Write a story about a lighthouse keeper.", "max_tokens": TOKENS,
               "temperature": 0, "ignore_eos": True, "stream": True}, f)
x = np.linspace(-1, 1, 64, dtype=np.float32).reshape(1, 64)
req = service_pb2.ModelInferRequest(model_name="mlp")
req.inputs.add(name="x", datatype="FP32", shape=[1, 64])
req.raw_input_contents.append(x.tobytes())
msg = req.SerializeToString()
with open(os.path.join(d, "infer.grpc"), "wb") as f:
    f.write(b"\0" + len(msg).to_bytes(4, "big") + msg)


def servd_cpu(pid):
    with open(f"/proc/{pid}/stat") as f:
        v = f.read().rsplit(")", 1)[1].split()
    return (int(v[11]) + int(v[12])) / os.sysconf("SC_CLK_TCK")


def h2load(kind, name, n):
    p, port, gport = servers[name]
    scheme = "https" if name == "tls" else "http"
    if kind == "http":
        args = ["--h1", "-c", str(STREAMS), "-H", "content-type: application/json", "-d",
                os.path.join(d, "completion.json"), f"{scheme}://127.0.0.1:{port}/v1/completions"]
    else:
        args = ["-c", "16", "-H", "content-type: application/grpc", "-H", "te: trailers", "-d",
                os.path.join(d, "infer.grpc"),
                f"{scheme}://127.0.0.1:{gport}/inference.GRPCInferenceService/ModelInfer"]
    c0 = servd_cpu(p.pid)
    r = subprocess.run(["h2load", "-n", str(n), "-m", "1"] + args, capture_output=True, text=True, timeout=900)
    cpu = servd_cpu(p.pid) - c0
    ok = re.search(r"(\d+) succeeded, (\d+) failed", r.stdout)
    rps = re.search(r"finished in [\d.]+\w+, ([\d.]+) req/s", r.stdout)
    if r.returncode != 0 or not ok or int(ok.group(1)) != n or not rps:
        fail(f"h2load {kind} {name}: {r.stdout}\n{r.stderr}")
    proto = re.search(r"Application protocol: (\S+)", r.stdout)
    return float(rps.group(1)), cpu / n * 1e3, proto.group(1) if proto else "?"


for kind, n in (("http", STREAMS * 2), ("grpc", 4000)):
    for name in servers:
        h2load(kind, name, max(STREAMS, n // 4))  # warm-up
    res = {name: [] for name in servers}
    for _ in range(ROUNDS):
        for name in servers:
            res[name].append(h2load(kind, name, n))
    med = {name: (statistics.median(r[0] for r in v), statistics.median(r[1] for r in v), v[0][2])
           for name, v in res.items()}
    unit = f"completions of {TOKENS} tokens/s" if kind == "http" else "calls/s"
    for name, (rps, cpu, proto) in med.items():
        print(f"{kind} {name} ({proto}): {rps:.2f} {unit}, servd CPU {cpu:.2f} ms/request "
              f"(median of {ROUNDS}; rounds {[round(r[0], 2) for r in res[name]]})")
    print(f"{kind}: TLS/plaintext throughput {med['tls'][0] / med['plain'][0]:.3f}x")
for p, _, _ in servers.values():
    p.terminate()
    p.wait(timeout=60)
