"""Clients that go away in the middle of a shared prefill leave nothing behind: six streaming requests
share a ~1900-token prompt beginning on the tiny Llama, prefilled 2 tokens a step (so the first one
computes the common blocks over some 950 steps while the others wait for them); three clients close
their connection while that goes on (they asked for 1000 tokens, so they cannot have finished: the
metrics count them as aborted). The other three finish with [DONE], and then the engine is idle again
by its metrics: nothing running or waiting, no KV block held (vllm:kv_cache_usage_perc 0). The blocks
computed before the cancellations stay cached: a later request with the same beginning finds them
(usage.prompt_tokens_details.cached_tokens) and the engine returns to idle after it too."""
import json
import os
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from servd_harness import Servd, check, fail, metric_value, parse_args, tiny_llama_long  # noqa: E402

a = parse_args()
llama = tiny_llama_long(a, "tiny-4k", context=4096)
s = Servd(a, ["--model", f"{llama}:tiny", "--max-batch-tokens", "2", "--max-step-ms", "0"])
prefix = "a shared system prompt that every request starts with, " * 50  # ~1900 tokens


def send(i, max_tokens):
    body = json.dumps({"model": "tiny", "prompt": prefix + f"question {i}", "max_tokens": max_tokens, "temperature": 0,
                       "ignore_eos": True, "stream": True}).encode()
    sock = socket.create_connection(("127.0.0.1", s.port), timeout=60)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    return sock


def idle(text):
    m = {"model_name": "tiny"}
    return (metric_value(text, "vllm:num_requests_running", m) == 0 and
            metric_value(text, "vllm:num_requests_waiting", m) == 0 and
            metric_value(text, "vllm:kv_cache_usage_perc", m) == 0)


def wait_idle(what):
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        t = s.metrics()
        if idle(t):
            return t
        time.sleep(0.1)
    fail(f"{what}: not idle: " + " ".join(l for l in t.splitlines()
                                          if l.startswith(("vllm:num_requests", "vllm:kv_cache_usage"))))


socks = [send(i, 1000 if i % 2 == 0 else 8) for i in range(6)]
time.sleep(0.1)  # the requests are read and queued; the first is computing the common blocks
for i in (0, 2, 4):  # the one computing the prefix first (it arrived first), and two waiting for it
    socks[i].close()
for i in (1, 3, 5):
    got = b""
    while b"data: [DONE]" not in got:
        chunk = socks[i].recv(65536)
        if not chunk:
            fail(f"request {i} ended without [DONE]: {got[-300:]!r}")
        got += chunk
    check(b" 200 " in got.split(b"\r\n", 1)[0], f"request {i}: {got[:100]!r}")
    socks[i].close()
t = wait_idle("after the cancellations")


def finished(t, reason):
    return metric_value(t, "vllm:request_success_total", {"model_name": "tiny", "finished_reason": reason})


check(finished(t, "abort") == 3 and finished(t, "length") == 3,
      f"3 aborted and 3 finished: abort {finished(t, 'abort')}, length {finished(t, 'length')}")

st, _, raw = s.request("POST", "/v1/completions", {"model": "tiny", "prompt": prefix + "question 9",
                                                    "max_tokens": 4, "temperature": 0})
check(st == 200, f"a request after the cancellations: {st} {raw[:200]!r}")
usage = json.loads(raw)["usage"]
cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
check(cached >= usage["prompt_tokens"] - 64, f"the common blocks stayed cached: {usage}")
wait_idle("after the last request")
check(s.stop() == 0, "exit status")
print("ok")
