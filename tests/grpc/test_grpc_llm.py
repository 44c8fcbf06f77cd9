"""Language models over gRPC as Triton serves TensorRT-LLM, with tritonclient.grpc against the tiny
random Llama: ModelInfer's whole text_output equals /v1/completions' text at temperature 0, and the
pieces of ModelStreamInfer concatenate to it, with triton_final_response true exactly once per
request; two interleaved requests on one stream each complete; bad inputs answer error responses and
the stream goes on; stream=false answers the whole text once; closing the stream mid-generation
cancels its requests in the engine (the running gauges return to 0)."""
import os
import queue
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from servd_harness import check, metric_value, parse_args, skip, tiny_llama  # noqa: E402
from grpc_start import start  # noqa: E402

a = parse_args()
try:
    import tritonclient.grpc as tc
except ImportError as e:
    skip(f"{e.name} is not installed (use .venv-test: scripts/install-deps.sh)")
llama = tiny_llama(a)

s, gport = start(a, ["--model", f"{llama}:tiny"])
c = tc.InferenceServerClient(f"127.0.0.1:{gport}")


def inputs(prompt, max_tokens, shape=(1,), **extra):
    """TensorRT-LLM ensemble inputs: text_input, max_tokens, temperature 0, and extra ones as
    (datatype, value)."""
    txt = tc.InferInput("text_input", list(shape), "BYTES")
    txt.set_data_from_numpy(np.array([prompt.encode()], dtype=object).reshape(shape))
    mt = tc.InferInput("max_tokens", [1], "INT32")
    mt.set_data_from_numpy(np.array([max_tokens], dtype=np.int32))
    out = [txt, mt]
    extra.setdefault("temperature", ("FP32", 0.0))
    for name, (dt, v) in extra.items():
        i = tc.InferInput(name, [1], dt)
        i.set_data_from_numpy(np.array([v], dtype={"FP32": np.float32, "INT32": np.int32, "UINT64": np.uint64,
                                                   "BOOL": bool, "BYTES": object}[dt]))
        out.append(i)
    return out


def text_of(result):
    return b"".join(result.as_numpy("text_output").ravel()).decode("utf-8", "replace")


def completion(prompt, max_tokens):
    st, body = s.json("POST", "/v1/completions",
                      {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0})
    check(st == 200, f"/v1/completions: {st} {body}")
    return body["choices"][0]["text"]


P1, P2, N = "hello there", "the quick brown fox", 24
whole1 = text_of(c.infer("tiny", inputs(P1, N), request_id="u1"))
whole2 = text_of(c.infer("tiny", inputs(P2, N, shape=(1, 1))))
check(whole1 == completion(P1, N), f"ModelInfer and /v1/completions differ: {whole1!r}")
check(whole2 == completion(P2, N) and whole2 != whole1, f"second prompt: {whole2!r}")
check(len(whole1) > 0, "some text was generated")

# ---- ModelStreamInfer ----------------------------------------------------------------------------
events = queue.Queue()
c.start_stream(callback=lambda result, error: events.put((result, error)))


def collect(ids, timeout=120):
    """Reads the stream until every id in ids had its final response: {id: (pieces, n_final)}, errors."""
    got = {i: ([], 0) for i in ids}
    errors = []
    deadline = time.monotonic() + timeout
    while any(n == 0 for _, n in got.values()):
        check(time.monotonic() < deadline, f"stream: no final response in time: {got}")
        result, error = events.get(timeout=timeout)
        if error is not None:
            errors.append(str(error))
            continue
        r = result.get_response()
        check(r.id in got, f"response for an unknown id {r.id!r}")
        pieces, n = got[r.id]
        pieces.append(text_of(result))
        final = r.parameters["triton_final_response"].bool_param
        got[r.id] = (pieces, n + final)
    return got, errors


c.async_stream_infer("tiny", inputs(P1, N), request_id="s1")
got, errors = collect(["s1"])
pieces, n_final = got["s1"]
check(not errors, f"errors: {errors}")
check(n_final == 1 and len(pieces) > 2, f"pieces: {pieces}")
check("".join(pieces) == whole1, f"streamed {''.join(pieces)!r} != unary {whole1!r}")

# Two requests interleaved on the stream.
c.async_stream_infer("tiny", inputs(P1, N), request_id="a")
c.async_stream_infer("tiny", inputs(P2, N, shape=(1, 1)), request_id="b")
got, errors = collect(["a", "b"])
check(not errors, f"errors: {errors}")
check("".join(got["a"][0]) == whole1 and "".join(got["b"][0]) == whole2, f"interleaved: {got}")
check(got["a"][1] == 1 and got["b"][1] == 1, "one final response each")

# stream=false: one response with the whole text.
c.async_stream_infer("tiny", inputs(P1, N, stream=("BOOL", False)), request_id="w")
got, errors = collect(["w"])
check(got["w"] == ([whole1], 1), f"stream=false: {got['w']}")

# Bad inputs: an error response each; the stream stays open for the next request.
bad = [
    ("no text_input", [i for i in inputs(P1, N) if i.name() != "text_input"], "text_input"),
    ("bad_words", inputs(P1, N, bad_words=("BYTES", b"foo")), "bad_words"),
    ("temperature type", inputs(P1, N, temperature=("INT32", 1)), "FP32"),
    ("unknown input", inputs(P1, N, nope=("INT32", 1)), "nope"),
]
for what, ins, word in bad:
    c.async_stream_infer("tiny", ins, request_id="bad")
    result, error = events.get(timeout=60)
    check(error is not None and word in str(error), f"{what}: {result} {error}")
c.async_stream_infer("nope", inputs(P1, N), request_id="bad")
result, error = events.get(timeout=60)
check(error is not None and "nope" in str(error), f"unknown model: {error}")
c.async_stream_infer("tiny", inputs(P2, N, stop_words=("BYTES", b"")), request_id="after")
got, errors = collect(["after"])
check(not errors and "".join(got["after"][0]) == whole2, f"after errors: {got} {errors}")
c.stop_stream()

# Closing the stream mid-generation cancels its requests: nothing keeps running. The tiny model may
# finish one of them before the cancel arrives: every request ends, and those that did not end on
# their own ended as aborted (vLLM's finished_reason "abort"), at least the one still generating.
def finished():
    m = s.metrics()
    return {r: metric_value(m, "vllm:request_success_total", {"model_name": "tiny", "finished_reason": r}) or 0
            for r in ("abort", "length", "stop")}


finished_before = finished()
events = queue.Queue()
c.start_stream(callback=lambda result, error: events.put((result, error)))
for i in range(2):
    c.async_stream_infer("tiny", inputs(P1 * 4, 450, temperature=("FP32", 1.0), random_seed=("UINT64", 7 + i)),
                         request_id=f"long{i}")
result, error = events.get(timeout=60)
check(error is None, f"long: {error}")
deadline = time.monotonic() + 30  # both in the engine before the stream closes
while metric_value(s.metrics(), "vllm:num_requests_running", {"model_name": "tiny"}) != 2:
    ended_early = sum(finished().values()) - sum(finished_before.values())
    check(ended_early > 0 or time.monotonic() < deadline, "the two long requests never ran together")
    if ended_early > 0:
        break
    time.sleep(0.005)
c.stop_stream(cancel_requests=True)
deadline = time.monotonic() + 30
while True:
    m = s.metrics()
    running = metric_value(m, "vllm:num_requests_running", {"model_name": "tiny"})
    waiting = metric_value(m, "vllm:num_requests_waiting", {"model_name": "tiny"})
    if running == 0 and waiting == 0:
        break
    check(time.monotonic() < deadline, f"requests still running after the stream closed: {running} {waiting}")
    time.sleep(0.1)
ended = {r: n - finished_before[r] for r, n in finished().items()}
check(sum(ended.values()) == 2 and ended["abort"] >= 1,
      f"both requests ended, the unfinished ones cancelled in the engine: {ended}")

# The server still serves after all this.
check(text_of(c.infer("tiny", inputs(P1, N))) == whole1, "ModelInfer after a cancelled stream")
c.close()
s.stop()
print("ok")
