"""Streaming throughput of one servd over gRPC (ModelStreamInfer, one stream carrying every request)
and over SSE (/v1/completions with stream: true, a connection per request), same model, prompts and
max_tokens at temperature 0, alternating rounds; medians. Two gRPC clients: Triton's protobuf stubs
on grpcio (each response parsed, its text taken out: the work the SSE client does with json.loads)
and tritonclient.grpc (an InferResult and a numpy decode per piece on top, in its one callback
thread). With h2load (Debian's nghttp2-client) installed, the same two transports are also driven by
one C client, so neither pays a Python client's per-piece cost: one ModelStreamInfer call whose
request body carries all N requests, against N /v1/completions on N HTTP/1.1 connections. Not a
test: prints the numbers for docs/performance.md.

  .venv-test/bin/python tests/grpc/bench_llm_stream.py --servd build/daemon/servd --modelpkg ... [N [TOKENS]]"""
import http.client
import json
import os
import queue
import re
import shutil
import subprocess
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
extra = [x for x in sys.argv[1:] if x.isdigit()]
sys.argv = [x for x in sys.argv if not x.isdigit()]
from servd_harness import parse_args, tiny_llama  # noqa: E402
from grpc_start import start  # noqa: E402
import grpc  # noqa: E402
import tritonclient.grpc as tc  # noqa: E402
from tritonclient.grpc import service_pb2, service_pb2_grpc  # noqa: E402

a = parse_args()
N = int(extra[0]) if extra else 8
TOKENS = int(extra[1]) if len(extra) > 1 else 256
s, gport = start(a, ["--model", f"{tiny_llama(a)}:tiny", "--access-log", "off"])
prompts = [f"request {i}: once upon a time" for i in range(N)]


def grpc_round(c):
    done, pieces, chars = queue.Queue(), [0], [0]

    def cb(result, error):
        r = result.get_response()
        t = result.as_numpy("text_output")[0]
        pieces[0] += 1
        chars[0] += len(t)
        if r.parameters["triton_final_response"].bool_param:
            done.put(r.id)

    c.start_stream(callback=cb)
    t0 = time.perf_counter()
    for i, p in enumerate(prompts):
        ins = [tc.InferInput("text_input", [1], "BYTES"), tc.InferInput("max_tokens", [1], "INT32"),
               tc.InferInput("temperature", [1], "FP32")]
        ins[0].set_data_from_numpy(np.array([p.encode()], dtype=object))
        ins[1].set_data_from_numpy(np.array([TOKENS], dtype=np.int32))
        ins[2].set_data_from_numpy(np.array([0.0], dtype=np.float32))
        c.async_stream_infer("tiny", ins, request_id=str(i))
    for _ in prompts:
        done.get(timeout=300)
    dt = time.perf_counter() - t0
    c.stop_stream()
    return dt, pieces[0] - N, chars[0]


def stub_round(stub):
    def requests():
        for i, p in enumerate(prompts):
            q = service_pb2.ModelInferRequest(model_name="tiny", id=str(i))
            for name, dt, raw in (("text_input", "BYTES", len(p).to_bytes(4, "little") + p.encode()),
                                  ("max_tokens", "INT32", np.int32(TOKENS).tobytes()),
                                  ("temperature", "FP32", np.float32(0).tobytes())):
                q.inputs.add(name=name, datatype=dt, shape=[1])
                q.raw_input_contents.append(raw)
            yield q
        while left[0]:  # the stream stays open until every answer is in
            time.sleep(0.001)

    left, pieces, chars = [N], 0, 0
    t0 = time.perf_counter()
    for r in stub.ModelStreamInfer(requests(), timeout=300):
        q = r.infer_response
        if q.parameters["triton_final_response"].bool_param:
            left[0] -= 1
            if not left[0]:
                break
            continue
        t = q.raw_output_contents[0][4:]
        pieces += bool(t)
        chars += len(t)
    return time.perf_counter() - t0, pieces, chars


def sse_one(p, out):
    conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=300)
    conn.request("POST", "/v1/completions", json.dumps({"model": "tiny", "prompt": p, "max_tokens": TOKENS,
                                                        "temperature": 0, "stream": True}),
                 {"Content-Type": "application/json"})
    r = conn.getresponse()
    n = chars = 0
    for line in r:
        if line.startswith(b"data: {"):
            t = json.loads(line[6:])["choices"][0]["text"]
            n += bool(t)
            chars += len(t.encode())
    out.append((n, chars))
    conn.close()


def sse_round():
    out = []
    ths = [threading.Thread(target=sse_one, args=(p, out)) for p in prompts]
    t0 = time.perf_counter()
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    return time.perf_counter() - t0, sum(n for n, _ in out), sum(c for _, c in out)


c = tc.InferenceServerClient(f"127.0.0.1:{gport}")
stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(f"127.0.0.1:{gport}"))
sse_round()  # warm-up
stub_round(stub)
ROUNDS = int(os.environ.get("ROUNDS", "5"))
res = {"grpc-stub": [], "sse": [], "grpc-tritonclient": []}
cpu = {k: [] for k in res}
writes = {k: [] for k in res}


def servd_cpu():
    """servd's user + system CPU seconds so far (its share of the work, apart from the client's)."""
    with open(f"/proc/{s.proc.pid}/stat") as f:
        v = f.read().rsplit(")", 1)[1].split()
    return (int(v[11]) + int(v[12])) / os.sysconf("SC_CLK_TCK")


def servd_writes():
    """servd's write system calls so far (sockets included)."""
    with open(f"/proc/{s.proc.pid}/io") as f:
        return next(int(ln.split()[1]) for ln in f if ln.startswith("syscw:"))


def h2load_files():
    """The bodies h2load sends: every request of a round framed into one ModelStreamInfer body, and
    one /v1/completions body per connection."""
    stream = b""
    for i, p in enumerate(prompts):
        q = service_pb2.ModelInferRequest(model_name="tiny", id=str(i))
        for name, dt, raw in (("text_input", "BYTES", len(p).to_bytes(4, "little") + p.encode()),
                              ("max_tokens", "INT32", np.int32(TOKENS).tobytes()),
                              ("temperature", "FP32", np.float32(0).tobytes())):
            q.inputs.add(name=name, datatype=dt, shape=[1])
            q.raw_input_contents.append(raw)
        m = q.SerializeToString()
        stream += b"\0" + len(m).to_bytes(4, "big") + m
    d = os.path.join(a.work, f"bench-llm-{os.getpid()}")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "stream.grpc"), "wb") as f:
        f.write(stream)
    with open(os.path.join(d, "completion.json"), "w") as f:
        json.dump({"model": "tiny", "prompt": prompts[0], "max_tokens": TOKENS, "temperature": 0, "stream": True}, f)
    return d


def h2load_round(kind, d):
    if kind == "h2load-grpc":
        args = ["-n", "1", "-c", "1", "-H", "content-type: application/grpc", "-H", "te: trailers", "-d",
                os.path.join(d, "stream.grpc"),
                f"http://127.0.0.1:{gport}/inference.GRPCInferenceService/ModelStreamInfer"]
    else:
        args = ["--h1", "-n", str(N), "-c", str(N), "-H", "content-type: application/json", "-d",
                os.path.join(d, "completion.json"), f"http://127.0.0.1:{s.port}/v1/completions"]
    t0 = time.perf_counter()
    r = subprocess.run(["h2load", "-m", "1"] + args, capture_output=True, text=True, timeout=300)
    dt = time.perf_counter() - t0
    ok = re.search(r"(\d+) succeeded", r.stdout)
    body = re.search(r"traffic: .*\(([\d]+)\) data", r.stdout)
    if r.returncode != 0 or not ok or int(ok.group(1)) == 0:
        raise SystemExit(f"h2load {kind}: {r.stdout}{r.stderr}")
    return dt, N * TOKENS, int(body.group(1)) if body else 0


rounds = [("grpc-stub", lambda: stub_round(stub)), ("sse", sse_round), ("grpc-tritonclient", lambda: grpc_round(c))]
if shutil.which("h2load"):
    hd = h2load_files()
    for k in ("h2load-grpc", "h2load-sse"):
        res[k] = []
        cpu[k] = []
        writes[k] = []
        rounds.append((k, lambda k=k: h2load_round(k, hd)))
for _ in range(ROUNDS):
    for k, f in rounds:
        c0, w0 = servd_cpu(), servd_writes()
        res[k].append(f())
        cpu[k].append(servd_cpu() - c0)
        writes[k].append(servd_writes() - w0)
med = {k: sorted(v)[len(v) // 2] for k, v in res.items()}


def ref(k):
    """The SSE figures a row is compared with: the ones from the same client."""
    return med["h2load-sse"] if k.startswith("h2load") else med["sse"]


cpu_med = {k: sorted(v)[len(v) // 2] for k, v in cpu.items()}
writes_med = {k: sorted(v)[len(v) // 2] for k, v in writes.items()}
for k, v in res.items():
    m = med[k]
    print(f"{k}: {N} requests x {TOKENS} tokens: median {m[0]:.3f} s, {m[1] / m[0]:.0f} pieces/s, "
          f"{m[2]} bytes, {ref(k)[0] / m[0]:.2f}x SSE's throughput, servd CPU {cpu_med[k]:.2f} s, "
          f"{writes_med[k]} writes; "
          f"rounds {[round(x[0], 3) for x in v]}")
c.close()
s.stop()
