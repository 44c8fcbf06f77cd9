"""Triton's statistics and model repository extensions over gRPC with tritonclient.grpc:
ModelStatistics counts the calls this test made (successes over gRPC and HTTP alike, a refused
input as a failure) and equals what GET /v2/models/mlp/stats reports; RepositoryIndex lists the
served model and the packages of the repository folder; RepositoryModelUnload and
RepositoryModelLoad take a model out of service and back, answering when done; bad calls get their
status codes (unknown model, a package not in the repository, load parameters, a malformed
message) and the server goes on."""
import os
import shutil
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from servd_harness import check, example_package, parse_args, skip  # noqa: E402
from grpc_start import start  # noqa: E402

a = parse_args()
try:
    import grpc
    import tritonclient.grpc as tc
    from tritonclient.grpc import service_pb2, service_pb2_grpc
except ImportError as e:
    skip(f"{e.name} is not installed (use .venv-test: scripts/install-deps.sh)")

repo = os.path.join(a.work, f"grpc-repo-{os.getpid()}")
os.makedirs(repo, exist_ok=True)
shutil.copy(example_package(a, "mlp_classifier"), os.path.join(repo, "classifier.mpk"))
shutil.copy(example_package(a, "mlp_classifier"), os.path.join(repo, "spare.mpk"))
s, gport = start(a, ["--model", f"{os.path.join(repo, 'classifier.mpk')}:mlp", "--model-repository", repo])
c = tc.InferenceServerClient(f"127.0.0.1:{gport}")


def code_of(fn):
    try:
        fn()
    except tc.InferenceServerException as e:
        return str(e.status()).split(".")[-1], e.message()
    except grpc.RpcError as e:
        return e.code().name, e.details()
    return "OK", ""


# ---- ModelStatistics ---------------------------------------------------------------------------
zero = c.get_inference_statistics("mlp").model_stats
check(len(zero) == 1 and zero[0].name == "mlp" and zero[0].version == "1" and zero[0].inference_count == 0,
      f"statistics before any call: {zero}")
bad = tc.InferInput("x", [1, 1], "FP32")
bad.set_data_from_numpy(np.array([[0.5]], dtype=np.float32))
code, msg = code_of(lambda: c.infer("mlp", [bad]))
check(code == "INVALID_ARGUMENT", f"a wrong input width: {code} {msg}")
d_in = int(msg.split("(batch, ")[1].split(")")[0])
x = np.linspace(-1, 1, 2 * d_in, dtype=np.float32).reshape(2, d_in)
good = tc.InferInput("x", list(x.shape), "FP32")
good.set_data_from_numpy(x)
N_GRPC = 5
for _ in range(N_GRPC):
    c.infer("mlp", [good])
st, _ = s.json("POST", "/v2/models/mlp/infer",
               {"inputs": [{"name": "x", "shape": [2, d_in], "datatype": "FP32", "data": x.ravel().tolist()}]})
check(st == 200, f"HTTP infer: {st}")

ms = c.get_inference_statistics("mlp").model_stats[0]
i = ms.inference_stats
check(ms.inference_count == N_GRPC + 1 and ms.execution_count == N_GRPC + 1, f"counts: {ms}")
check(i.success.count == N_GRPC + 1 and i.fail.count == 1, f"success and fail: {i}")
for name in ("queue", "compute_infer", "compute_output"):
    d = getattr(i, name)
    check(d.count == N_GRPC + 1 and d.ns > 0, f"{name}: {d}")
check(i.success.ns >= i.compute_infer.ns, "a whole request lasts at least its compute")
check(ms.last_inference > 1.7e12, f"last_inference is a unix time in ms: {ms.last_inference}")
# The HTTP route reports the same counters (no call ran in between).
st, body = s.json("GET", "/v2/models/mlp/stats")
h = body["model_stats"][0]
check(st == 200 and h["inference_count"] == ms.inference_count and h["last_inference"] == ms.last_inference,
      f"HTTP stats: {h}")
for name in ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output"):
    g = getattr(i, name)
    check([g.count, g.ns] == [h["inference_stats"][name]["count"], h["inference_stats"][name]["ns"]],
          f"{name}: gRPC {g} HTTP {h['inference_stats'][name]}")
every = c.get_inference_statistics().model_stats
check([m.name for m in every] == ["mlp"], f"every model's statistics: {every}")
code, msg = code_of(lambda: c.get_inference_statistics("nope"))
check(code == "NOT_FOUND" and "nope" in msg, f"statistics of an unknown model: {code} {msg}")
code, msg = code_of(lambda: c.get_inference_statistics("mlp", "7"))
check(code == "NOT_FOUND", f"statistics of an unknown version: {code} {msg}")

# ---- Repository --------------------------------------------------------------------------------
index = {m.name: m.state for m in c.get_model_repository_index().models}
check(index.get("mlp") == "READY" and index.get("spare") == "UNAVAILABLE", f"index: {index}")
ready = [m.name for m in c.get_model_repository_index().models if m.state == "READY"]
stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(f"127.0.0.1:{gport}"))
only_ready = stub.RepositoryIndex(service_pb2.RepositoryIndexRequest(ready=True), timeout=30)
check([m.name for m in only_ready.models] == ready == ["mlp"], f"index of ready models: {only_ready}")

c.unload_model("mlp")
code, msg = code_of(lambda: check(not c.is_model_ready("mlp"), "ready after unload"))
check(code in ("OK", "NOT_FOUND"), f"ready after unload: {code} {msg}")
check(code_of(lambda: c.infer("mlp", [good]))[0] in ("UNAVAILABLE", "NOT_FOUND"), "infer after unload")
index = {m.name: m.state for m in c.get_model_repository_index().models}
check(index.get("mlp") == "UNAVAILABLE", f"index after unload: {index}")
c.unload_model("mlp")  # unloading an unloaded model is a success, as over HTTP

c.load_model("spare")  # answers once loaded
check(c.is_model_ready("spare"), "spare is ready after its load returned")
check(c.infer("spare", [good]).as_numpy("label").shape[0] == 2, "infer on the loaded model")
c.load_model("spare")  # loading a ready model is a success

code, msg = code_of(lambda: c.load_model("absent"))
check(code == "NOT_FOUND" and "absent" in msg, f"load of a package not in the repository: {code} {msg}")
code, msg = code_of(lambda: c.load_model("spare", config='{"max_batch_size": 4}'))
check(code == "INVALID_ARGUMENT" and "config" in msg, f"load with a config override: {code} {msg}")
code, msg = code_of(lambda: c.unload_model("nope"))
check(code == "NOT_FOUND", f"unload of an unknown model: {code} {msg}")
raw = grpc.insecure_channel(f"127.0.0.1:{gport}").unary_unary("/inference.GRPCInferenceService/RepositoryModelLoad")
code, msg = code_of(lambda: raw(b"\x12\xff\xff\xff\xff\x0f", timeout=30))
check(code == "INVALID_ARGUMENT", f"malformed load request: {code} {msg}")
check(c.infer("spare", [good]).as_numpy("label").shape[0] == 2, "serving after the bad calls")

c.close()
check(s.stop() == 0, "exit status after SIGTERM")
print("ok")
