"""KServe v2 over gRPC with the official clients: tritonclient.grpc (liveness, readiness, metadata,
inference with raw tensors, checked against the HTTP route's answer for the same input), Triton's
own protobuf stubs (typed contents, malformed messages), grpcio-health-checking (Check), the status
codes of bad calls, each followed by a good one, and the API key as `authorization` metadata."""
import json
import os
import signal
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from servd_harness import check, example_package, parse_args, skip  # noqa: E402
from grpc_start import start  # noqa: E402

a = parse_args()
try:
    import grpc
    import tritonclient.grpc as tc
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc
except ImportError as e:
    skip(f"{e.name} is not installed (use .venv-test: scripts/install-deps.sh)")
pkg = example_package(a, "mlp_classifier")
LIMIT = 256 * 1024


def code_of(fn):
    try:
        fn()
    except grpc.RpcError as e:
        return e.code(), e.details()
    except tc.InferenceServerException as e:
        return getattr(grpc.StatusCode, str(e.status()).split(".")[-1]), e.message()
    return grpc.StatusCode.OK, ""


s, gport = start(a, ["--model", f"{pkg}:mlp", "--interpreters", "2", "--grpc-max-message-bytes", str(LIMIT)])
target = f"127.0.0.1:{gport}"
c = tc.InferenceServerClient(target)
check(c.is_server_live(), "ServerLive")
check(c.is_server_ready(), "ServerReady")
check(c.is_model_ready("mlp"), "ModelReady")
check(c.is_model_ready("mlp", "1"), "ModelReady version 1")
meta = c.get_server_metadata()
check(meta.name == "servd" and "model_repository" in meta.extensions, f"ServerMetadata: {meta}")
mm = c.get_model_metadata("mlp")
check(mm.name == "mlp" and list(mm.versions) == ["1"], f"ModelMetadata: {mm}")
cfg = c.get_model_config("mlp").config
check(cfg.name == "mlp" and cfg.backend == "servd" and [i.name for i in cfg.input] == [i.name for i in mm.inputs],
      f"ModelConfig: {cfg}")

# The classifier's input width, from the error its HTTP route gives for a wrong one.
st, body = s.json("POST", "/v2/models/mlp/infer",
                  {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [0.5]}]})
d_in = int(body["error"].split("(batch, ")[1].split(")")[0])
x = np.array([[((i * 7 + j * 3) % 11 - 5) / 5.0 for j in range(d_in)] for i in range(3)], dtype=np.float32)
st, http = s.json("POST", "/v2/models/mlp/infer",
                  {"inputs": [{"name": "x", "shape": [3, d_in], "datatype": "FP32", "data": x.ravel().tolist()}]})
check(st == 200, f"HTTP infer: {st}")
h_out = {o["name"]: o for o in http["outputs"]}


def infer_raw(client=c, model="mlp", outputs=None, **kw):
    i = tc.InferInput("x", list(x.shape), "FP32")
    i.set_data_from_numpy(x)
    req = [tc.InferRequestedOutput(n) for n in outputs] if outputs else None
    return client.infer(model, [i], outputs=req, request_id="rq-1", **kw)


r = infer_raw()
probs, label = r.as_numpy("probs"), r.as_numpy("label")
check(probs.dtype == np.float32 and list(probs.shape) == h_out["probs"]["shape"], f"probs: {probs.shape}")
check(np.allclose(probs.ravel(), np.array(h_out["probs"]["data"], dtype=np.float32), rtol=1e-6, atol=1e-7),
      "gRPC and HTTP probabilities agree")
check(label.dtype == np.int32 and label.tolist() == h_out["label"]["data"], f"label: {label}")
check(np.allclose(probs.sum(axis=1), 1.0, atol=1e-5), "rows sum to 1")
resp = r.get_response()
check(resp.model_name == "mlp" and resp.model_version == "1" and resp.id == "rq-1", f"response ids: {resp.id}")
r = infer_raw(outputs=["label"])
check([o.name for o in r.get_response().outputs] == ["label"], "requested outputs only")

# Typed contents (fp32_contents) through Triton's own stubs.
ch = grpc.insecure_channel(target)
stub = service_pb2_grpc.GRPCInferenceServiceStub(ch)
req = service_pb2.ModelInferRequest(model_name="mlp")
inp = req.inputs.add(name="x", datatype="FP32", shape=list(x.shape))
inp.contents.fp32_contents.extend(x.ravel().tolist())
resp = stub.ModelInfer(req, timeout=30)
names = [o.name for o in resp.outputs]
got = np.frombuffer(resp.raw_output_contents[names.index("probs")], dtype=np.float32)
check(np.allclose(got, probs.ravel(), rtol=1e-6), "typed contents give the same answer")

# grpc.health.v1
hs = health_pb2_grpc.HealthStub(ch)
check(hs.Check(health_pb2.HealthCheckRequest()).status == health_pb2.HealthCheckResponse.SERVING, "Health Check")
check(hs.Check(health_pb2.HealthCheckRequest(service="inference.GRPCInferenceService")).status ==
      health_pb2.HealthCheckResponse.SERVING, "Health Check of the service")
code, _ = code_of(lambda: hs.Check(health_pb2.HealthCheckRequest(service="nope")))
check(code == grpc.StatusCode.NOT_FOUND, f"Health Check of an unknown service: {code}")

# Bad calls: each answered with its code, and the next good call is served.
raw_call = ch.unary_unary("/inference.GRPCInferenceService/ModelInfer")
wrong_size = service_pb2.ModelInferRequest(model_name="mlp")
wrong_size.inputs.add(name="x", datatype="FP32", shape=[3, d_in])
wrong_size.raw_input_contents.append(b"\0" * (3 * d_in * 4 - 4))
big = service_pb2.ModelInferRequest(model_name="mlp")
big.inputs.add(name="x", datatype="FP32", shape=[1, LIMIT // 4 + 16])
big.raw_input_contents.append(b"\0" * (LIMIT + 64))
bad_dtype = service_pb2.ModelInferRequest(model_name="mlp")
bad_dtype.inputs.add(name="x", datatype="INT64", shape=[1]).contents.int64_contents.append(1)
cases = [
    ("malformed protobuf", lambda: raw_call(b"\x0a\xff\xff\xff\xff\x0f", timeout=30), grpc.StatusCode.INVALID_ARGUMENT),
    ("unknown model", lambda: infer_raw(model="nope"), grpc.StatusCode.NOT_FOUND),
    ("unknown model ready", lambda: stub.ModelReady(service_pb2.ModelReadyRequest(name="nope")),
     grpc.StatusCode.NOT_FOUND),
    ("unknown model config", lambda: c.get_model_config("nope"), grpc.StatusCode.NOT_FOUND),
    ("unknown version", lambda: stub.ModelMetadata(service_pb2.ModelMetadataRequest(name="mlp", version="7")),
     grpc.StatusCode.NOT_FOUND),
    ("wrong raw byte size", lambda: stub.ModelInfer(wrong_size, timeout=30), grpc.StatusCode.INVALID_ARGUMENT),
    ("unsupported datatype", lambda: stub.ModelInfer(bad_dtype, timeout=30), grpc.StatusCode.INVALID_ARGUMENT),
    ("message over the limit", lambda: stub.ModelInfer(big, timeout=30), grpc.StatusCode.RESOURCE_EXHAUSTED),
    ("unknown method", lambda: ch.unary_unary("/inference.GRPCInferenceService/Nope")(b"", timeout=30),
     grpc.StatusCode.UNIMPLEMENTED),
    ("model raising", lambda: stub.ModelInfer(service_pb2.ModelInferRequest(
        model_name="mlp", inputs=[service_pb2.ModelInferRequest.InferInputTensor(
            name="y", datatype="FP32", shape=[1], contents=service_pb2.InferTensorContents(fp32_contents=[1.0]))]),
        timeout=30), None),
]
for what, fn, want in cases:
    code, msg = code_of(fn)
    if want is None:
        check(code not in (grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE) and "KeyError" in msg, f"{what}: {code} {msg}")
    else:
        check(code == want, f"{what}: {code} {msg}")
    check(msg or want is grpc.StatusCode.OK, f"{what}: no message")
    r = infer_raw()
    check(r.as_numpy("label").tolist() == h_out["label"]["data"], f"serving after {what}")

# Concurrent calls on one connection, and a cancelled one (RST_STREAM) in their midst.
with ThreadPoolExecutor(8) as ex:
    futs = [ex.submit(infer_raw) for _ in range(16)]
    f = stub.ModelInfer.future(service_pb2.ModelInferRequest(
        model_name="mlp", inputs=[service_pb2.ModelInferRequest.InferInputTensor(
            name="x", datatype="FP32", shape=list(x.shape),
            contents=service_pb2.InferTensorContents(fp32_contents=x.ravel().tolist()))]))
    f.cancel()
    for fu in futs:
        check(fu.result().as_numpy("label").tolist() == h_out["label"]["data"], "concurrent calls")
check(infer_raw().as_numpy("label").tolist() == h_out["label"]["data"], "serving after a cancelled call")
ch.close()
c.close()
check(s.stop() == 0, "exit status after SIGTERM")

# The API key: ServerLive and health answer without it, everything else needs `authorization: Bearer`.
s, gport = start(a, ["--model", f"{pkg}:mlp", "--api-key", "sekret"])
target = f"127.0.0.1:{gport}"
c = tc.InferenceServerClient(target)
check(c.is_server_live(), "ServerLive without the key")
code, _ = code_of(lambda: infer_raw(client=c))
check(code == grpc.StatusCode.UNAUTHENTICATED, f"no key: {code}")
code, _ = code_of(lambda: infer_raw(client=c, headers={"authorization": "Bearer wrong"}))
check(code == grpc.StatusCode.UNAUTHENTICATED, f"wrong key: {code}")
r = infer_raw(client=c, headers={"authorization": "Bearer sekret"})
check(r.as_numpy("label").tolist() == h_out["label"]["data"], "with the key")
c.close()

# Health/Watch: SERVING now, NOT_SERVING as soon as the server drains (SIGTERM), without the key.
ch = grpc.insecure_channel(target)
w = health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest(), timeout=30)
check(next(w).status == health_pb2.HealthCheckResponse.SERVING, "Watch: SERVING")
u = health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest(service="nope"), timeout=30)
check(next(u).status == health_pb2.HealthCheckResponse.SERVICE_UNKNOWN, "Watch of an unknown service")
u.cancel()
s.proc.send_signal(signal.SIGTERM)
check(next(w).status == health_pb2.HealthCheckResponse.NOT_SERVING, "Watch: NOT_SERVING while draining")
w.cancel()
ch.close()
check(s.stop(None) == 0, "exit status after SIGTERM")

# No gRPC listener unless one is asked for; the config file's keys ask as the flags do.
s, gport = start(a, [], grpc_flag=False)
check(gport is None, "a gRPC listener without --grpc-port")
check(s.stop() == 0, "exit status after SIGTERM")
conf = os.path.join(a.work, "grpc.json")
with open(conf, "w") as f:
    json.dump({"grpc_port": 0, "grpc_max_message_bytes": 4096}, f)
s, gport = start(a, ["--config", conf, "--model", f"{pkg}:mlp"], grpc_flag=False)
check(gport is not None, "grpc_port from the config file")
c = tc.InferenceServerClient(f"127.0.0.1:{gport}")
check(c.is_server_live(), "ServerLive on the port of the config file")
over = service_pb2.ModelInferRequest(model_name="mlp")
over.inputs.add(name="x", datatype="FP32", shape=[1, 2048]).contents.fp32_contents.extend([0.0] * 2048)
ch = grpc.insecure_channel(f"127.0.0.1:{gport}")
code, _ = code_of(lambda: service_pb2_grpc.GRPCInferenceServiceStub(ch).ModelInfer(over, timeout=30))
ch.close()
check(code == grpc.StatusCode.RESOURCE_EXHAUSTED, f"grpc_max_message_bytes from the config file: {code}")
c.close()
check(s.stop() == 0, "exit status after SIGTERM")
print("ok")
