"""Sleep and wake (vLLM's POST /sleep?level=1|2, POST /wake_up, GET /is_sleeping) and
--idle-unload-seconds on a running servd with the default model, its resident memory measured:

- the endpoints need the API key; a level other than 1 or 2 is a 400;
- sleep during traffic: the running requests finish whole (none lost), a request arriving while the
  model goes to sleep is answered 503, and POST /sleep answers once the model is asleep;
- level 1 gives the KV cache's pages back (RSS falls by at least half the KV memory the traffic
  touched), the next request runs at once and wakes the model;
- level 2 unloads it (RSS falls by at least half the weights' size more), the model's own readiness
  says so while the server stays ready, the next request is answered 503 with Retry-After and starts
  the reload, and requests are served again once it is loaded;
- servd_model_sleep_level and /is_sleeping follow every step;
- a tiny model idle for --idle-unload-seconds is unloaded and its next request reloads it."""
import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from servd_harness import Servd, check, metric_value, parse_args, skip, tiny_llama  # noqa: E402

a = parse_args()
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
model = os.path.join(ROOT, ".cache", "smollm2-135m-instruct-q4_1.mpk")
if not os.path.exists(model):
    skip(f"the default model package is missing: {model}")
KEY = "sleep-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
WEIGHTS_MIB = os.path.getsize(model) / 2**20
# 256 blocks of 16 tokens; SmolLM2-135M's K/V take 30 layers x 3 heads x 64 x 2 x 2 bytes a token.
KV_MIB = 256 * 16 * 30 * 3 * 64 * 2 * 2 / 2**20

s = Servd(a, ["--model", f"{model}:m", "--api-key", KEY, "--kv-blocks", "256", "--speculative", "off"])


def rss_mib():
    with open(f"/proc/{s.proc.pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def complete(prompt, max_tokens, out=None):
    body = {"model": "m", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    st, h, raw = s.request("POST", "/v1/completions", body, headers=AUTH)
    data = json.loads(raw) if raw else None
    if out is not None:
        out.append((st, data))
    return st, h, data


def sleep_level():
    text = s.metrics(headers=AUTH)
    return metric_value(text, "servd_model_sleep_level", {"model": "m"})


def is_sleeping():
    st, body = s.json("GET", "/is_sleeping", headers=AUTH)
    check(st == 200, f"/is_sleeping: {st} {body}")
    return body


for method, path in [("POST", "/sleep"), ("POST", "/wake_up"), ("GET", "/is_sleeping")]:
    st, _, _ = s.request(method, path)
    check(st == 401, f"{method} {path} without the API key: {st}")
st, _, data = s.request("POST", "/sleep?level=3", headers=AUTH)
check(st == 400 and b"level" in data, f"level 3: {st} {data}")
check(is_sleeping()["is_sleeping"] is False and sleep_level() == 0, "awake at start")

# Traffic that touches the KV cache: distinct prompts of ~450 tokens fill most of its 4096 tokens.
for i in range(8):
    st, _, body = complete(f"Document {i}: " + " ".join(f"word{i}x{k}" for k in range(150)), 4)
    check(st == 200, f"warm-up {i}: {st} {body}")
rss_awake = rss_mib()

# Sleep during traffic: three requests running when POST /sleep arrives.
results, sleep_answer = [], []
runners = [threading.Thread(target=complete, args=(f"Story {i}: once upon a time", 160, results)) for i in range(3)]
for t in runners:
    t.start()
time.sleep(0.5)
sleeper = threading.Thread(target=lambda: sleep_answer.append(s.request("POST", "/sleep?level=1", headers=AUTH)))
sleeper.start()
time.sleep(0.2)
st_during, h_during, _ = complete("late request", 4)
sleeper.join(120)
for t in runners:
    t.join(120)
check(sleep_answer and sleep_answer[0][0] == 200, f"POST /sleep?level=1: {sleep_answer}")
check([st for st, _ in results] == [200] * 3, f"requests running during sleep: {results}")
check(all(d["usage"]["completion_tokens"] == 160 for _, d in results), "a running request was cut short")
check(st_during == 503, f"a request while going to sleep: {st_during}")
body = is_sleeping()
check(body["is_sleeping"] is True and body["models"]["m"]["level"] == 1, f"/is_sleeping: {body}")
check(sleep_level() == 1, "servd_model_sleep_level after level 1")
rss_l1 = rss_mib()
print(f"RSS awake after traffic {rss_awake:.0f} MiB, level 1 {rss_l1:.0f} MiB (KV cache {KV_MIB:.0f} MiB)")
check(rss_awake - rss_l1 >= KV_MIB / 2, f"level 1 freed {rss_awake - rss_l1:.0f} MiB of a {KV_MIB:.0f} MiB cache")

# Level 1 wakes on the next request, which runs at once.
st, _, body = complete("after level 1", 4)
check(st == 200, f"request after level 1: {st} {body}")
check(is_sleeping()["is_sleeping"] is False and sleep_level() == 0, "awake after a request")

# Level 2: unloaded.
st, _, data = s.request("POST", "/sleep?level=2", headers=AUTH)
check(st == 200, f"POST /sleep?level=2: {st} {data}")
check(sleep_level() == 2 and is_sleeping()["models"]["m"]["level"] == 2, "level 2 reported")
rss_l2 = rss_mib()
print(f"RSS level 2 {rss_l2:.0f} MiB (weights {WEIGHTS_MIB:.0f} MiB)")
check(rss_l1 - rss_l2 >= WEIGHTS_MIB / 2, f"level 2 freed {rss_l1 - rss_l2:.0f} MiB of {WEIGHTS_MIB:.0f} MiB weights")
st, _, _ = s.request("GET", "/v2/models/m/ready", headers=AUTH)
check(st != 200, f"the sleeping model's own readiness: {st}")
st, _, _ = s.request("GET", "/v2/health/ready")
check(st == 200, f"server readiness while a model sleeps: {st}")

# The next request starts the reload and is answered 503 with Retry-After; then the model serves.
st, h, body = complete("wake up", 4)
check(st == 503 and h.get("retry-after"), f"request to a level-2 sleeper: {st} {h} {body}")
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    st, _, body = complete("wake up", 4)
    if st == 200:
        break
    check(st == 503, f"while waking: {st} {body}")
    time.sleep(0.2)
check(st == 200, "served again after the reload")
check(sleep_level() == 0 and is_sleeping()["is_sleeping"] is False, "awake after the reload")
st, _, _ = s.request("POST", "/wake_up", headers=AUTH)
check(st == 200, f"POST /wake_up when awake: {st}")
check(s.stop() == 0, "exit status")

# Idle unload: a tiny model idle for a second is unloaded, and its next request brings it back.
t = Servd(a, ["--model", f"{tiny_llama(a)}:tiny", "--idle-unload-seconds", "1"])
body = {"model": "tiny", "prompt": "hi", "max_tokens": 2}
st, _, _ = t.request("POST", "/v1/completions", body)
check(st == 200, "tiny: first request")
deadline = time.monotonic() + 30
while time.monotonic() < deadline and t.json("GET", "/is_sleeping")[1]["models"]["tiny"]["level"] != 2:
    time.sleep(0.1)
check(t.json("GET", "/is_sleeping")[1]["models"]["tiny"]["level"] == 2, "idle model not unloaded")
# Without "model" (the server's one model is asleep): that model, waking.
st, h, _ = t.request("POST", "/v1/completions", {"prompt": "hi", "max_tokens": 2})
check(st == 503 and h.get("retry-after"), f"tiny: request to the unloaded model: {st}")
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    st, _, _ = t.request("POST", "/v1/completions", body)
    if st == 200:
        break
    time.sleep(0.1)
check(st == 200, "tiny: served after the idle reload")
check(t.stop() == 0, "tiny: exit status")
print("ok")
