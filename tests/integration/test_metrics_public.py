"""--metrics-public (config key metrics_public): with an API key set, Prometheus scrapes /metrics
without it while every other route still needs it; without the flag /metrics needs the key."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from servd_harness import Servd, check, parse_args, tiny_llama  # noqa: E402

a = parse_args()
llama = tiny_llama(a)
key = {"SERVD_API_KEY": "scrape-test-key"}
auth = {"Authorization": "Bearer scrape-test-key"}

s = Servd(a, ["--model", f"{llama}:tiny", "--access-log", "off"], env=key)
st, _, _ = s.request("GET", "/metrics")
check(st == 401, f"/metrics without the key and without --metrics-public: {st}")
check(s.request("GET", "/metrics", headers=auth)[0] == 200, "/metrics with the key")
check(s.stop() == 0, "exit status")

cfg = os.path.join(a.work, "metrics-public.json")
with open(cfg, "w") as f:
    json.dump({"metrics_public": True, "access_log": "off", "models": [{"path": llama, "name": "tiny"}]}, f)
for args in (["--model", f"{llama}:tiny", "--metrics-public", "--access-log", "off"], ["--config", cfg]):
    s = Servd(a, args, env=key)
    st, _, body = s.request("GET", "/metrics")
    check(st == 200 and b"servd_model_ready" in body, f"/metrics without the key, {args}: {st}")
    check(s.request("GET", "/v1/models")[0] == 401, f"/v1/models without the key, {args}")
    check(s.request("GET", "/v2/models/tiny")[0] == 401, f"/v2/models/tiny without the key, {args}")
    check(s.request("GET", "/v1/models", headers=auth)[0] == 200, f"/v1/models with the key, {args}")
    check(s.request("GET", "/v2/health/live")[0] == 200, "live")
    check(s.stop() == 0, "exit status")
print("ok")
