"""Several models in one server from a JSON config file, with flags overriding the file."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from servd_harness import Servd, check, example_package, parse_args, tiny_llama  # noqa: E402

a = parse_args()
llama = tiny_llama(a)
mlp = example_package(a, "mlp_classifier")
cfg = os.path.join(a.work, "servd-config.json")
with open(cfg, "w") as f:
    json.dump({"port": 1, "access_log": "off", "max_queue": 8, "drain_timeout": 10,
               "models": [{"path": llama, "name": "chat", "max_seqs": 4},
                          {"path": mlp, "name": "clf", "interpreters": 2}]}, f)
# --port 0 (from the harness) overrides the file's port 1.
s = Servd(a, ["--config", cfg])
st, body = s.json("GET", "/v1/models")
check(st == 200 and sorted(m["id"] for m in body["data"]) == ["chat", "clf"], f"models: {body}")
st, body = s.json("POST", "/v1/completions", {"model": "chat", "prompt": "a", "max_tokens": 3, "ignore_eos": True})
check(st == 200 and body["usage"]["completion_tokens"] == 3, f"chat model: {st} {body}")
st, body = s.json("GET", "/v2/models/clf/ready")
check(st == 200, f"clf ready: {st}")
m = s.metrics()
check('servd_interpreter_busy_seconds_total{model="clf",interpreter="1"}' in m, "two interpreters for clf")
check(s.stop() == 0, "exit status")
check("POST /v1/completions" not in s.stderr(), "access_log off still logged requests")
print("ok")
