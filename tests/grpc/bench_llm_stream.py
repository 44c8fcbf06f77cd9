"""Streaming throughput of one servd over gRPC (ModelStreamInfer, one stream carrying every request)
and over SSE (/v1/completions with stream: true, a connection per request), same model, prompts and
max_tokens at temperature 0, alternating rounds. Not a test: prints the numbers for
docs/performance.md.

  .venv-test/bin/python tests/grpc/bench_llm_stream.py --servd build/daemon/servd --modelpkg ... [N [TOKENS]]"""
import http.client
import json
import os
import queue
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
import tritonclient.grpc as tc  # noqa: E402

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
sse_round()  # warm-up
res = {"grpc": [], "sse": []}
for _ in range(3):
    res["grpc"].append(grpc_round(c))
    res["sse"].append(sse_round())
for k, v in res.items():
    best = min(v)
    print(f"{k}: {N} requests x {TOKENS} tokens: best {best[0]:.3f} s, {best[1] / best[0]:.0f} pieces/s, "
          f"{best[2]} bytes of text; all rounds {[round(x[0], 3) for x in v]}")
c.close()
s.stop()
