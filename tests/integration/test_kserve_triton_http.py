"""KServe v2 over HTTP with the official tritonclient.http at its default settings (binary tensor
data on): liveness, readiness, server and model metadata, model configuration, inference with
binary inputs and binary outputs (equal to the JSON route's answer for the same input), outputs
asked by name as binary or JSON, Triton's statistics counting HTTP and gRPC predictions, and bad
binary framing answered 400 with a message naming what is wrong."""
import json
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "grpc"))
from servd_harness import check, example_package, parse_args, skip  # noqa: E402
from grpc_start import start  # noqa: E402

a = parse_args()
try:
    import numpy as np
    import tritonclient.http as th
    from tritonclient.utils import InferenceServerException
except (ImportError, RuntimeError) as e:
    skip(f"tritonclient[http] is not installed (use .venv-test: scripts/install-deps.sh): {e}")
try:
    import tritonclient.grpc as tg
except (ImportError, RuntimeError):
    tg = None
pkg = example_package(a, "mlp_classifier")

s, gport = start(a, ["--model", f"{pkg}:mlp", "--interpreters", "2"])
c = th.InferenceServerClient(f"127.0.0.1:{s.port}")

check(c.is_server_live(), "live")
check(c.is_server_ready(), "ready")
check(c.is_model_ready("mlp"), "model ready")
check(not c.is_model_ready("nope"), "unknown model not ready")
sm = c.get_server_metadata()
check(sm["name"] == "servd" and {"binary_tensor_data", "statistics", "model_configuration"} <= set(sm["extensions"]),
      f"server metadata: {sm}")
meta = c.get_model_metadata("mlp")
check(meta["name"] == "mlp" and "inputs" in meta and "outputs" in meta, f"metadata: {meta}")

# Configuration: the metadata's tensors in Triton's shape.
cfg = c.get_model_config("mlp")
check(cfg["name"] == "mlp" and cfg["max_batch_size"] == 0 and cfg["backend"] == "servd", f"config: {cfg}")
for kind in ("inputs", "outputs"):
    want = [(t["name"], "TYPE_" + t["datatype"], t["shape"]) for t in meta[kind]]
    got = [(t["name"], t["data_type"], t["dims"]) for t in cfg[kind[:-1]]]
    check(got == want, f"config {kind}: {got} != {want}")
try:
    c.get_model_config("nope")
    check(False, "config of an unknown model")
except InferenceServerException as e:
    check("nope" in e.message(), f"config 404 message: {e.message()}")

# The classifier's input width, from the error it gives for a wrong one (its package declares no
# tensor metadata).
st, body = s.json("POST", "/v2/models/mlp/infer",
                  {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [0.5]}]})
check(st == 400, f"wrong width: {st} {body}")
d_in = int(body["error"].split("(batch, ")[1].split(")")[0])
x = np.array([[((i * 7 + j * 3) % 11 - 5) / 5.0 for j in range(d_in)] for i in range(3)], np.float32)

# JSON route: the reference answer.
st, ref = s.json("POST", "/v2/models/mlp/infer",
                 {"inputs": [{"name": "x", "shape": [3, d_in], "datatype": "FP32", "data": x.tolist()}]})
check(st == 200, f"json infer: {st} {ref}")
ref = {o["name"]: np.array(o["data"]).reshape(o["shape"]) for o in ref["outputs"]}

st0 = c.get_inference_statistics("mlp")["model_stats"][0]
check(st0["inference_stats"]["fail"]["count"] >= 1, f"the refused width counts as a failure: {st0}")

# Default settings: a binary input, every output binary (binary_data_output).
inp = th.InferInput("x", list(x.shape), "FP32")
inp.set_data_from_numpy(x)  # binary_data=True by default
r = c.infer("mlp", [inp])
resp = r.get_response()
check(all(o["parameters"]["binary_data_size"] > 0 and "data" not in o for o in resp["outputs"]), f"binary outputs: {resp}")
probs, label = r.as_numpy("probs"), r.as_numpy("label")
check(probs.dtype == np.float32 and label.dtype == np.int32, f"dtypes: {probs.dtype} {label.dtype}")
check(np.array_equal(probs, ref["probs"].astype(np.float32)), f"probs differ from JSON: {probs} {ref['probs']}")
check(np.array_equal(label, ref["label"]), f"label differs from JSON: {label} {ref['label']}")
check(np.allclose(probs.sum(axis=1), 1.0, atol=1e-5) and np.array_equal(label, probs.argmax(axis=1)), "softmax, argmax")

# Outputs by name: one binary, one JSON; and a JSON input with binary outputs.
r = c.infer("mlp", [inp], outputs=[th.InferRequestedOutput("probs", binary_data=True),
                                   th.InferRequestedOutput("label", binary_data=False)])
outs = {o["name"]: o for o in r.get_response()["outputs"]}
check("data" not in outs["probs"] and outs["label"]["data"] == ref["label"].tolist(), f"mixed outputs: {outs}")
check(np.array_equal(r.as_numpy("probs"), probs), "probs of the mixed answer")
jin = th.InferInput("x", list(x.shape), "FP32")
jin.set_data_from_numpy(x, binary_data=False)
r = c.infer("mlp", [jin], outputs=[th.InferRequestedOutput("label")])
check(np.array_equal(r.as_numpy("label"), label) and "data" not in r.get_response()["outputs"][0], "json in, binary out")

# A gRPC prediction goes through the same queue: the statistics count it too.
n_grpc = 0
if tg and gport:
    g = tg.InferenceServerClient(f"127.0.0.1:{gport}")
    gi = tg.InferInput("x", list(x.shape), "FP32")
    gi.set_data_from_numpy(x)
    check(np.array_equal(g.infer("mlp", [gi]).as_numpy("label"), label), "grpc label")
    n_grpc = 1

# Statistics: this test's successful predictions (3 over binary HTTP, 1 over gRPC) and one failure.
bad = th.InferInput("y", list(x.shape), "FP32")
bad.set_data_from_numpy(x)
try:
    c.infer("mlp", [bad])
    check(False, "an input the model refuses")
except InferenceServerException as e:
    check("KeyError" in e.message(), f"model error: {e.message()}")
st1 = c.get_inference_statistics("mlp")["model_stats"][0]
i0, i1 = st0["inference_stats"], st1["inference_stats"]
n = 3 + n_grpc
check(st1["name"] == "mlp" and st1["version"] == "1", f"stats ids: {st1}")
check(st1["inference_count"] - st0["inference_count"] == n and st1["execution_count"] - st0["execution_count"] == n,
      f"counts: {st0} -> {st1}")
check(i1["success"]["count"] - i0["success"]["count"] == n and i1["fail"]["count"] - i0["fail"]["count"] == 1,
      f"success/fail: {i0} -> {i1}")
for k in ("queue", "compute_input", "compute_infer", "compute_output"):
    check(i1[k]["count"] - i0[k]["count"] == n, f"{k} count: {i1[k]}")
check(i1["compute_infer"]["ns"] > i0["compute_infer"]["ns"] and i1["success"]["ns"] >= i1["compute_infer"]["ns"],
      f"durations: {i1}")
check(st1["last_inference"] >= st0["last_inference"] > 0, f"last_inference: {st1['last_inference']}")
every = c.get_inference_statistics()["model_stats"]
check([m["name"] for m in every] == ["mlp"], f"all stats: {every}")

# Bad framing: a 400 naming the problem (raw HTTP, as a client with a wrong length sends it).
def framed(header, tail, length=None):
    h = json.dumps(header).encode()
    return s.request("POST", "/v2/models/mlp/infer", h + tail,
                     {"Inference-Header-Content-Length": str(len(h) if length is None else length),
                      "Content-Type": "application/octet-stream"})


good = {"inputs": [{"name": "x", "shape": [3, d_in], "datatype": "FP32", "parameters": {"binary_data_size": x.nbytes}}]}
st, hdrs, body = framed(good, x.tobytes())
check(st == 200, f"raw framed request: {st} {body[:200]}")
cases = [
    (good, x.tobytes()[:-4], None, "remain"),                       # missing tail bytes
    (good, x.tobytes() + b"\0\0\0\0", None, "add up to"),           # extra tail bytes
    ({"inputs": [dict(good["inputs"][0], parameters={"binary_data_size": 12})]}, x.tobytes(), None, "take"),
    (good, x.tobytes(), 10 ** 9, "Inference-Header-Content-Length"),  # header beyond the body
    (good, x.tobytes(), "abc", "decimal"),
    (good, x.tobytes(), 7, "Inference-Header-Content-Length"),       # header cut inside the JSON
]
for header, tail, length, words in cases:
    st, _, body = framed(header, tail, length)
    msg = json.loads(body).get("error", "")
    check(st == 400 and words in msg, f"bad framing ({words}): {st} {msg}")
# binary_data_size without the framing header.
st, body = s.json("POST", "/v2/models/mlp/infer", good)
check(st == 400 and "Inference-Header-Content-Length" in body["error"], f"no header: {st} {body}")
st, body = s.json("POST", "/v2/models/mlp/infer", dict(good, parameters={"binary_data_output": "yes"}))
check(st == 400 and "binary_data_output" in body["error"], f"binary_data_output type: {st} {body}")
check(c.is_server_live(), "serving after bad framing")

check(s.stop() == 0, "exit status after SIGTERM")
print("ok")
