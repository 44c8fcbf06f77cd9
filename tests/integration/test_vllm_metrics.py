"""vLLM's metric names on a running servd: every name vLLM's Grafana dashboard queries
(fixtures/vllm_grafana_metrics.txt) is in /metrics with the model_name label after a few requests,
and the counts moved. X-Request-Id: echoed, generated when absent, and in the access log."""
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from servd_harness import Servd, check, parse_args, tiny_llama  # noqa: E402

a = parse_args()
llama = tiny_llama(a)
here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "fixtures", "vllm_grafana_metrics.txt")) as f:
    names = [l.strip() for l in f if l.strip() and not l.startswith("#")]

s = Servd(a, ["--model", f"{llama}:tiny", "--access-log", "json"])
body = {"model": "tiny", "prompt": "hello there", "max_tokens": 4, "temperature": 0}
for i in range(3):
    st, h, _ = s.request("POST", "/v1/completions", body, headers={"X-Request-Id": f"it-{i}"})
    check(st == 200, f"completion {i}: {st}")
    check(h.get("x-request-id") == f"it-{i}", f"X-Request-Id not echoed: {h}")
st, h, _ = s.request("POST", "/v1/completions", dict(body, stream=True))
check(st == 200 and re.fullmatch(r"[0-9a-f]{32}", h.get("x-request-id", "")), f"generated id: {h}")
generated = h["x-request-id"]

text = s.metrics()
samples = {}
for line in text.splitlines():
    if line.startswith("vllm:"):
        name, rest = line.split("{", 1) if "{" in line else line.split(" ", 1)
        samples.setdefault(name, []).append(line)
for n in names:
    lines = samples.get(n, [])
    check(lines, f"{n} missing from /metrics")
    check(all('model_name="tiny"' in l for l in lines), f"{n} without model_name: {lines[:2]}")


def value(line):
    return float(line.rsplit(" ", 1)[1])


def total(name):
    return sum(value(l) for l in samples.get(name, []))


for n in ["vllm:e2e_request_latency_seconds_count", "vllm:time_to_first_token_seconds_count",
          "vllm:time_per_output_token_seconds_count", "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
          "vllm:request_queue_time_seconds_count", "vllm:request_prefill_time_seconds_count",
          "vllm:request_decode_time_seconds_count", "vllm:prefix_cache_queries_total"]:
    check(total(n) > 0, f"{n} did not move: {samples.get(n)}")
check(total("vllm:e2e_request_latency_seconds_count") == 4, "four requests ended")
check(total("vllm:request_success_total") == 4, f"request_success_total: {samples['vllm:request_success_total']}")
check(total("vllm:generation_tokens_total") >= 4, "generated tokens")
check(total("vllm:request_decode_time_seconds_sum") > 0, "decode time")
check(total("vllm:num_requests_waiting") == 0, "nothing waiting once idle")
check(not [l for l in text.splitlines() if l.startswith("servd_inference_requests_total{")],
      "a language model has no generic inference series")

check(s.stop() == 0, "exit status")
log = [json.loads(l) for l in s.stderr().splitlines() if l.startswith("{")]
ids = {l.get("request_id") for l in log if l.get("path") == "/v1/completions"}
check({"it-0", "it-1", "it-2", generated} <= ids, f"request ids in the access log: {ids}")
print("ok")
