"""The inference extension's model-server protocol (gateway-api-inference-extension,
docs/proposals/003-model-server-protocol) on a running servd: /metrics parsed by prometheus_client's
text parser, as an endpoint picker scrapes it. Each metric has the protocol's type, and its value means
what the protocol says while requests are queued and running: TotalQueuedRequests
(vllm:num_requests_waiting) counts the requests waiting, TotalRunningRequests
(vllm:num_requests_running) those being generated, KVCacheUtilization (vllm:kv_cache_usage_perc and
its older name vllm:gpu_cache_usage_perc) is a fraction in [0, 1] that rises with the running
requests' blocks, and vllm:cache_config_info carries block_size and num_gpu_blocks as labels."""
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from servd_harness import Servd, check, parse_args, skip, tiny_llama_long  # noqa: E402

try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:
    skip("prometheus_client is not installed in .venv-test (scripts/install-deps.sh)")

a = parse_args()
llama = tiny_llama_long(a, "tiny-4k")  # long generations keep requests running while we look
BLOCK, BLOCKS, SEQS = 16, 512, 2  # BLOCK: the engine's default block size
# No speculation: the tiny model's repetitive text would be drafted and the requests end too soon.
s = Servd(a, ["--model", f"{llama}:tiny", "--kv-blocks", str(BLOCKS), "--max-seqs", str(SEQS), "--speculative", "off"])


def scrape():
    fams = {f.name: f for f in text_string_to_metric_families(s.metrics())}

    def one(name, typ):
        f = fams.get(name)
        check(f is not None, f"{name} missing from /metrics")
        check(f.type == typ, f"{name}: type {f.type}, the protocol says {typ}")
        got = [x for x in f.samples if x.labels.get("model_name") == "tiny"]
        check(len(got) == 1, f"{name}: {len(got)} samples for model_name=tiny: {f.samples}")
        return got[0]

    return {
        "queued": one("vllm:num_requests_waiting", "gauge").value,
        "running": one("vllm:num_requests_running", "gauge").value,
        "kv": one("vllm:kv_cache_usage_perc", "gauge").value,
        "kv_old": one("vllm:gpu_cache_usage_perc", "gauge").value,
        "config": one("vllm:cache_config_info", "gauge"),
    }


idle = scrape()
check(idle["queued"] == 0 and idle["running"] == 0, f"idle: {idle}")
check(idle["kv"] == 0 and idle["kv_old"] == 0, f"idle KV usage: {idle}")
cfg = idle["config"]
check(cfg.value == 1, f"cache_config_info value {cfg.value}")
check(int(cfg.labels["block_size"]) == BLOCK, f"block_size label: {cfg.labels}")
check(int(cfg.labels["num_gpu_blocks"]) == BLOCKS, f"num_gpu_blocks label: {cfg.labels}")

# Five long requests on two sequence slots: two run, three wait, until they end.
N = 5
results = []


def one_request(i):
    body = {"model": "tiny", "prompt": f"request {i} " * 6, "max_tokens": 3000, "temperature": 0,
            "ignore_eos": True}
    st, _, _ = s.request("POST", "/v1/completions", body)
    results.append(st)


threads = [threading.Thread(target=one_request, args=(i,)) for i in range(N)]
for t in threads:
    t.start()
busy = None
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    m = scrape()
    if m["running"] == SEQS and m["queued"] == N - SEQS:
        busy = m
        break
    time.sleep(0.02)
check(busy is not None, f"never saw {SEQS} running and {N - SEQS} queued: last {m}")
check(0 < busy["kv"] <= 1, f"KV usage while running: {busy}")
check(busy["kv"] == busy["kv_old"], f"the two KV usage names differ: {busy}")
# The two running sequences hold at least their prompts' blocks (and at most all of them).
check(busy["kv"] >= 2 / BLOCKS, f"KV usage {busy['kv']} below two sequences' blocks")
for t in threads:
    t.join()
check(results == [200] * N, f"statuses: {results}")
end = scrape()
check(end["queued"] == 0 and end["running"] == 0 and end["kv"] == 0, f"after the requests: {end}")
check(s.stop() == 0, "exit status")
print("ok")
