"""KServe v2 / Open Inference Protocol over plain HTTP against the example generic package
(mlp_classifier): responses validated against JSON schemas written from the protocol, results checked
independently (probabilities sum to 1, label = argmax), bad input and model failures answered per
request, Triton's repository extension (unload, load)."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from servd_harness import Servd, check, example_package, parse_args, skip  # noqa: E402

a = parse_args()
try:
    import jsonschema
except ImportError:
    skip("jsonschema is not installed (use .venv-test)")
pkg = example_package(a, "mlp_classifier")

# From the Open Inference Protocol (kserve/open-inference-protocol, HTTP/REST section).
TENSOR_META = {"type": "object", "required": ["name", "datatype", "shape"],
               "properties": {"name": {"type": "string"}, "datatype": {"type": "string"},
                              "shape": {"type": "array", "items": {"type": "integer"}}}}
SERVER_META = {"type": "object", "required": ["name", "version", "extensions"],
               "properties": {"name": {"type": "string"}, "version": {"type": "string"},
                              "extensions": {"type": "array", "items": {"type": "string"}}}}
MODEL_META = {"type": "object", "required": ["name", "platform", "inputs", "outputs"],
              "properties": {"name": {"type": "string"}, "versions": {"type": "array", "items": {"type": "string"}},
                             "platform": {"type": "string"}, "inputs": {"type": "array", "items": TENSOR_META},
                             "outputs": {"type": "array", "items": TENSOR_META}}}
OUTPUT = {"type": "object", "required": ["name", "shape", "datatype", "data"],
          "properties": {"name": {"type": "string"}, "shape": {"type": "array", "items": {"type": "integer"}},
                         "datatype": {"type": "string"}, "data": {"type": "array"}, "parameters": {"type": "object"}}}
INFER_RESPONSE = {"type": "object", "required": ["model_name", "outputs"],
                  "properties": {"model_name": {"type": "string"}, "model_version": {"type": "string"},
                                 "id": {"type": "string"}, "parameters": {"type": "object"},
                                 "outputs": {"type": "array", "items": OUTPUT}}}
ERROR = {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}}
READY = {"type": "object", "required": ["ready"], "properties": {"ready": {"type": "boolean"}}}

s = Servd(a, ["--model", f"{pkg}:mlp", "--model-repository", os.path.dirname(pkg), "--interpreters", "2"])

st, body = s.json("GET", "/v2")
check(st == 200, "server metadata")
jsonschema.validate(body, SERVER_META)
st, body = s.json("GET", "/v2/health/live")
check(st == 200, "live")
st, body = s.json("GET", "/v2/health/ready")
check(st == 200, "ready")
jsonschema.validate(body, READY)
st, body = s.json("GET", "/v2/models/mlp/ready")
check(st == 200 and body["ready"] is True, f"model ready: {st} {body}")
st, meta = s.json("GET", "/v2/models/mlp")
check(st == 200, f"model metadata: {st}")
jsonschema.validate(meta, MODEL_META)
check(meta["name"] == "mlp", f"metadata name: {meta}")
# The tensors the package declares (models/examples/mlp_classifier/model.py: x f32 (batch, 64) in;
# probs f32 (batch, 10) and label i32 (batch,) out), written into its manifest by servd-example-pack.
check(meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 64]}], f"metadata inputs: {meta}")
check(meta["outputs"] == [{"name": "probs", "datatype": "FP32", "shape": [-1, 10]},
                          {"name": "label", "datatype": "INT32", "shape": [-1]}], f"metadata outputs: {meta}")
st, cfg = s.json("GET", "/v2/models/mlp/config")
check(st == 200, f"model config: {st} {cfg}")
check(cfg["input"] == [{"name": "x", "data_type": "TYPE_FP32", "dims": [-1, 64]}], f"config input: {cfg}")
check(cfg["output"] == [{"name": "probs", "data_type": "TYPE_FP32", "dims": [-1, 10]},
                        {"name": "label", "data_type": "TYPE_INT32", "dims": [-1]}], f"config output: {cfg}")

# The classifier's input width, from the error it gives for a wrong one.
st, body = s.json("POST", "/v2/models/mlp/infer",
                  {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [0.5]}]})
check(st == 400, f"wrong width: {st} {body}")
jsonschema.validate(body, ERROR)
d_in = int(body["error"].split("(batch, ")[1].split(")")[0])

rows = [[((i * 7 + j * 3) % 11 - 5) / 5.0 for j in range(d_in)] for i in range(3)]
req = {"id": "req-1", "inputs": [{"name": "x", "shape": [3, d_in], "datatype": "FP32", "data": rows}]}
st, body = s.json("POST", "/v2/models/mlp/infer", req)
check(st == 200, f"infer: {st} {body}")
jsonschema.validate(body, INFER_RESPONSE)
check(body["model_name"] == "mlp" and body["id"] == "req-1", f"infer ids: {body}")
out = {o["name"]: o for o in body["outputs"]}
check(set(out) == {"probs", "label"}, f"outputs: {list(out)}")
probs, label = out["probs"], out["label"]
check(probs["datatype"] == "FP32" and probs["shape"][0] == 3, f"probs: {probs['shape']}")
check(label["datatype"] == "INT32" and label["shape"] == [3], f"label: {label}")
n_classes = probs["shape"][1]
p = probs["data"]
check(len(p) == 3 * n_classes, "flat data")
for i in range(3):
    row = p[i * n_classes:(i + 1) * n_classes]
    # softmax output: sums to 1 within f32 rounding of n_classes terms
    check(abs(sum(row) - 1.0) < 1e-5, f"row {i} sums to {sum(row)}")
    check(label["data"][i] == max(range(n_classes), key=lambda k: row[k]), f"label {i} is not argmax")

# Flat data gives the same answer; requesting one output returns only it.
flat = {"inputs": [{"name": "x", "shape": [3, d_in], "datatype": "FP32", "data": sum(rows, [])}],
        "outputs": [{"name": "label"}]}
st, body2 = s.json("POST", "/v2/models/mlp/infer", flat)
check(st == 200 and [o["name"] for o in body2["outputs"]] == ["label"], f"outputs filter: {body2}")
check(body2["outputs"][0]["data"] == label["data"], "flat and nested data agree")

# Bad input: 400 with a message, and the server keeps serving.
for bad in [{"inputs": [{"name": "x", "shape": [2, d_in], "datatype": "FP32", "data": [1.0]}]},
            {"inputs": [{"name": "x", "shape": [1, d_in], "datatype": "INT64", "data": [0] * d_in}]},
            {"inputs": [{"name": "x", "shape": [1, d_in], "datatype": "FP32", "data": ["a"] * d_in}]},
            {"inputs": "x"}, {"nothing": 1}]:
    st, body = s.json("POST", "/v2/models/mlp/infer", bad)
    check(st == 400, f"{json.dumps(bad)[:80]}: {st} {body}")
    jsonschema.validate(body, ERROR)
# The model raising on an input it cannot handle fails that request only.
st, body = s.json("POST", "/v2/models/mlp/infer", {"inputs": [{"name": "y", "shape": [1, d_in], "datatype": "FP32",
                                                              "data": [0.0] * d_in}]})
check(400 <= st < 600 and "KeyError" in body["error"], f"model exception: {st} {body}")
st, _ = s.json("POST", "/v2/models/mlp/infer", req)
check(st == 200, "serving after a model exception")
st, body = s.json("POST", "/v2/models/nope/infer", req)
check(st == 404, f"unknown model: {st}")

# Repository extension: unload, then load again from the repository folder.
st, _, _ = s.request("POST", "/v2/repository/models/mlp/unload")
check(st == 200, f"unload: {st}")
st, body = s.json("GET", "/v2/models/mlp/ready")
check(st != 200 and body["ready"] is False, f"ready after unload: {st}")
st, _ = s.json("POST", "/v2/models/mlp/infer", req)
check(st in (404, 503), f"infer after unload: {st}")
name = os.path.splitext(os.path.basename(pkg))[0]
st, _, data = s.request("POST", f"/v2/repository/models/{name}/load")
check(st == 200, f"load {name}: {st} {data}")
st, body = s.json("GET", f"/v2/models/{name}/ready")
check(st == 200 and body["ready"], f"ready after load: {st} {body}")
st, body = s.json("POST", f"/v2/models/{name}/infer", req)
check(st == 200, f"infer after load: {st}")
st, body = s.json("POST", "/v2/repository/index", {})
check(st == 200 and any(m["name"] == name and m["state"] == "READY" for m in body), f"index: {body}")
st, body = s.json("POST", "/v2/repository/models/absent/load")
check(st == 404, f"load absent: {st}")

check(s.stop() == 0, "exit status after SIGTERM")
print("ok")
