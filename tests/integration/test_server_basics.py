"""servd without models: flags and config errors, health, auth, bad input, access log, /metrics
checked by promtool, SIGTERM exit status."""
import json
import os
import signal
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from servd_harness import Servd, check, fail, parse_args  # noqa: E402

a = parse_args()

# Startup errors are clear and exit 2.
r = subprocess.run([a.servd, "--gpus", "1024"], capture_output=True, text=True, timeout=60)
check(r.returncode == 2, f"--gpus 1024: exit {r.returncode}")
check("GPU" in r.stderr and "--gpus 0" in r.stderr, f"--gpus 1024: unclear message: {r.stderr}")
r = subprocess.run([a.servd, "--no-such-flag"], capture_output=True, text=True, timeout=60)
check(r.returncode == 2 and "--no-such-flag" in r.stderr, f"unknown flag: {r.returncode} {r.stderr}")
r = subprocess.run([a.servd, "--port", "99999"], capture_output=True, text=True, timeout=60)
check(r.returncode == 2 and "--port" in r.stderr, f"bad port: {r.returncode} {r.stderr}")
cfg = os.path.join(a.work, "bad-config.json")
with open(cfg, "w") as f:
    json.dump({"port": 8000, "max_qeue": 3}, f)
r = subprocess.run([a.servd, "--config", cfg], capture_output=True, text=True, timeout=60)
check(r.returncode == 2 and "max_qeue" in r.stderr, f"config typo: {r.returncode} {r.stderr}")
r = subprocess.run([a.servd, "--help"], capture_output=True, text=True, timeout=60)
check(r.returncode == 0 and "--model PATH[:NAME]" in r.stdout, "--help")

KEY = "test-key-123"
s = Servd(a, ["--api-key", KEY, "--access-log", "json", "--max-body-bytes", "65536"])
auth = {"Authorization": f"Bearer {KEY}"}

# Health is exempt from the key; everything else needs it.
check(s.request("GET", "/v2/health/live")[0] == 200, "live")
check(s.request("GET", "/v2/health/ready")[0] == 200, "ready with no models")
st, body = s.json("GET", "/v1/models")
check(st == 401 and body["error"]["code"] == "invalid_api_key", f"no key: {st} {body}")
st, body = s.json("GET", "/v1/models", headers={"Authorization": "Bearer wrong"})
check(st == 401, f"wrong key: {st}")
st, body = s.json("GET", "/v1/models", headers=auth)
check(st == 200 and body == {"object": "list", "data": []}, f"models: {st} {body}")
st, body = s.json("GET", "/v2", headers=auth)
check(st == 200 and body["name"] == "servd", f"/v2: {body}")

# Bad input: 4xx with a clear message, in the right error shape.
st, body = s.json("POST", "/v1/completions", body="{not json", headers=auth)
check(st == 400 and "malformed JSON" in body["error"]["message"], f"malformed: {st} {body}")
st, body = s.json("POST", "/v1/chat/completions", body={"model": "nope", "messages": []}, headers=auth)
check(st in (400, 404) and "error" in body, f"unknown model: {st} {body}")
st, body = s.json("POST", "/v1/completions", body={"model": "nope", "prompt": "x"}, headers=auth)
check(st == 404 and body["error"]["code"] == "model_not_found", f"unknown model: {st} {body}")
st, body = s.json("POST", "/v1/completions", body="x" * 100000, headers=auth)
check(st == 413 and body["error"]["message"], f"huge body: {st} {body}")
st, _, data = s.request("GET", "/v1/models", headers=dict(auth, **{"X-Huge": "y" * 40000}))
check(st == 431, f"huge header: {st}")
st, body = s.json("POST", "/v2/models/nope/infer", body={"inputs": []}, headers=auth)
check(st == 404 and isinstance(body["error"], str), f"kserve unknown model: {st} {body}")
st, body = s.json("GET", "/nowhere", headers=auth)
check(st == 404, f"unknown route: {st}")
st, body = s.json("GET", "/v1/completions", headers=auth)
check(st == 405, f"wrong method: {st}")

# /metrics in Prometheus' exposition format.
text = s.metrics(headers=auth)
check('servd_http_requests_total{route="/v1/completions",status="400"} 1' in text, "request counters")
promtool = shutil.which("promtool")
if promtool:
    r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    check(r.returncode == 0, f"promtool check metrics: {r.stdout} {r.stderr}")
else:
    print("note: promtool not installed; exposition format not checked by it")

rc = s.stop()
check(rc == 0, f"exit status after SIGTERM: {rc}\n{s.stderr()}")
log = s.stderr()
lines = [json.loads(l) for l in log.splitlines() if l.startswith("{")]
check(any(l["path"] == "/v1/models" and l["status"] == 401 for l in lines), f"json access log:\n{log}")
check("draining" in log, "drain message")

# The backend: the CPU without --gpus (with the reason); --gpus N where fewer GPUs are visible fails
# at startup with a clear message; --tp must equal --gpus (one rank per GPU) wherever GPUs exist.
check("servd: backend: CPU (" in log, f"no backend line:\n{log}")
no_gpu = " GPU visible" not in log and " GPUs visible" not in log
if no_gpu:
    r = subprocess.run([a.servd, "--gpus", "1"], capture_output=True, text=True, timeout=60)
    check(r.returncode == 2, f"--gpus 1 without a GPU: exit {r.returncode}")
    check("--gpus 1 asks for 1 GPU but 0 are available" in r.stderr and "--gpus 0" in r.stderr,
          f"--gpus 1 without a GPU: unclear message: {r.stderr}")
r = subprocess.run([a.servd, "--tp", "2", "--gpus", "1"], capture_output=True, text=True, timeout=60)
check(r.returncode == 2 and "--tp 2 with --gpus 1" in r.stderr and "one rank per GPU" in r.stderr,
      f"--tp 2 --gpus 1: {r.returncode} {r.stderr}")
r = subprocess.run([a.servd, "--gpu-memory-fraction", "1.5"], capture_output=True, text=True, timeout=60)
check(r.returncode == 2 and "--gpu-memory-fraction" in r.stderr, f"bad fraction: {r.returncode} {r.stderr}")
# The text access log escapes what a client controls: a decoded %0a in the path cannot forge a line.
t = Servd(a, ["--access-log", "text"])
st = t.request("GET", "/v1/models%0aFORGED%20200%22")[0]
check(st == 404 or st == 200, f"path with an encoded newline: {st}")
check(t.stop() == 0, "text-log servd exit")
tlog = t.stderr()
check(not any(l.startswith("FORGED") for l in tlog.splitlines()), f"forged access-log line:\n{tlog}")
check("/v1/models\\x0aFORGED\\x20200\\x22" in tlog, f"escaped path missing from the access log:\n{tlog}")
# A fatal signal leaves a report: the signal and a backtrace of file+offset frames for addr2line.
c = Servd(a, [])
# It re-executed itself (namespace tunables) under its own name, so ps, top and pkill find it.
comm = open(f"/proc/{c.proc.pid}/comm").read().strip()
check(comm == os.path.basename(a.servd)[:15], f"process name after the re-exec: {comm!r}")
os.kill(c.proc.pid, signal.SIGSEGV)
c.proc.wait(timeout=60)
clog = c.stderr()
check(c.proc.returncode == -signal.SIGSEGV, f"servd after SIGSEGV: exit {c.proc.returncode}")
check("servd: fatal signal 11 (SIGSEGV)" in clog and "/servd+0x" in clog, f"no crash report:\n{clog}")
check("  registers:\n    rip 0x" in clog and "code at rip-" in clog, f"no registers in the crash report:\n{clog}")
print("ok")
