"""Signals a process manager sends, with the tiny Llama: SIGHUP, SIGUSR1 and SIGUSR2 mid-stream are
logged and change nothing (the stream ends with its final chunk, the server keeps serving); SIGQUIT
drains like SIGTERM (a running stream finishes, then servd exits 0)."""
import http.client
import json
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from servd_harness import Servd, check, fail, parse_args, tiny_llama  # noqa: E402

a = parse_args()
pkg = tiny_llama(a)
s = Servd(a, ["--model", f"{pkg}:tiny", "--drain-timeout", "60"])
N = 300


def start_stream():
    c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)
    body = json.dumps({"model": "tiny", "prompt": "signals", "max_tokens": N, "ignore_eos": True, "stream": True})
    c.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
    r = c.getresponse()
    check(r.status == 200, f"stream answered {r.status}")
    events = 0
    while events < 2:  # the stream is running
        line = r.readline()
        check(line, "stream ended before its second event")
        events += line.startswith(b"data: ")
    return c, r, events


def finish_stream(c, r, events):
    """Reads the rest; http.client raises IncompleteRead when the chunked body ends without its last chunk."""
    try:
        rest = r.read()
    except (http.client.IncompleteRead, OSError) as e:
        fail(f"stream cut after {events} events: {e!r}\n{s.stderr()}")
    c.close()
    lines = [ln for ln in rest.split(b"\n") if ln.startswith(b"data: ")]
    check(lines and lines[-1] == b"data: [DONE]", f"no [DONE] at the stream's end: {rest[-200:]!r}")
    last = json.loads(lines[-2][len(b"data: "):]) if len(lines) >= 2 else {}
    reasons = [ch.get("finish_reason") for ch in last.get("choices", [])]
    check(reasons == ["length"], f"the stream did not run to max_tokens: {lines[-2:]!r}")


c, r, events = start_stream()
for sig in (signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
    s.proc.send_signal(sig)
    time.sleep(0.02)
finish_stream(c, r, events)
check(s.proc.poll() is None, f"servd exited with {s.proc.returncode} after SIGHUP/SIGUSR1/SIGUSR2:\n{s.stderr()}")
st, _, _ = s.request("GET", "/v2/health/ready")
check(st == 200, f"not ready after the signals: {st}")
st, _, body = s.request("POST", "/v1/completions", {"model": "tiny", "prompt": "after", "max_tokens": 4})
check(st == 200, f"serving after the signals: {st} {body[:200]!r}")
log = s.stderr()
for name in ("Hangup", "User defined signal 1", "User defined signal 2"):
    check(f"servd: {name}: nothing to reload" in log, f"no log line for {name}:\n{log}")

# SIGQUIT drains: the running stream finishes, then servd exits 0.
c, r, events = start_stream()
s.proc.send_signal(signal.SIGQUIT)
finish_stream(c, r, events)
rc = s.stop(sig=None)
check(rc == 0, f"servd exited {rc} after SIGQUIT:\n{s.stderr()}")
check("no longer accepting connections" in s.stderr(), "SIGQUIT did not drain")
print("ok")
