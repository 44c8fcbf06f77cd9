"""OpenTelemetry traces from a running servd (--otlp-traces-endpoint), received by a local OTLP/HTTP
collector that decodes them with the opentelemetry-proto package (not with servd's encoder):

- a request with a W3C traceparent header gives a span "llm_request" in that trace, child of the
  caller's span, with the model, request id and the token counts the response reports, and three
  child spans (queue, prefill, decode) inside it, in order, with their token counts;
- a request without one starts a trace of its own (no parent);
- a malformed traceparent is ignored (new trace), never an error;
- a collector that is down or slow never slows requests: they are answered as fast as without
  traces, and the spans it did not take are counted as dropped in /metrics;
- a URL servd cannot use is a startup error (exit status 2) naming it."""
import http.server
import os
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from servd_harness import Servd, check, metric_value, parse_args, skip, tiny_llama  # noqa: E402

try:
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
except ImportError:
    skip("opentelemetry-proto is not installed in .venv-test (scripts/install-deps.sh)")


class Collector:
    """An OTLP/HTTP receiver: POST /v1/traces, protobuf bodies decoded and kept. delay: seconds each
    POST takes before its answer (a slow collector)."""

    def __init__(self, delay=0.0):
        self.spans, self.posts, self.delay = [], 0, delay
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                check(self.path == "/v1/traces", f"collector path {self.path}")
                check(self.headers["Content-Type"] == "application/x-protobuf", "content type")
                req = trace_service_pb2.ExportTraceServiceRequest()
                req.ParseFromString(body)
                time.sleep(outer.delay)
                for rs in req.resource_spans:
                    attrs = {kv.key: kv.value.string_value for kv in rs.resource.attributes}
                    check(attrs.get("service.name") == "servd", f"resource: {attrs}")
                    for ss in rs.scope_spans:
                        outer.spans.extend(ss.spans)
                outer.posts += 1
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()


def attrs(span):
    out = {}
    for kv in span.attributes:
        v = kv.value
        out[kv.key] = getattr(v, v.WhichOneof("value"))
    return out


def wait_spans(col, n, timeout=10):
    deadline = time.monotonic() + timeout
    while len(col.spans) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    check(len(col.spans) >= n, f"{len(col.spans)} spans arrived, expected {n}")


a = parse_args()
llama = tiny_llama(a)
col = Collector()
s = Servd(a, ["--model", f"{llama}:tiny", "--otlp-traces-endpoint", f"http://127.0.0.1:{col.port}/v1/traces"])
TRACE, PARENT = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
body = {"model": "tiny", "prompt": "hello there, tracing", "max_tokens": 5, "temperature": 0}
st, h, data = s.request("POST", "/v1/completions", body,
                        headers={"traceparent": f"00-{TRACE}-{PARENT}-01", "X-Request-Id": "traced-1"})
check(st == 200, f"traced completion: {st}")
import json  # noqa: E402

usage = json.loads(data)["usage"]
wait_spans(col, 4)
root = [x for x in col.spans if x.name == "llm_request"]
check(len(root) == 1, f"root spans: {[x.name for x in col.spans]}")
root = root[0]
check(root.trace_id.hex() == TRACE, f"trace id {root.trace_id.hex()}")
check(root.parent_span_id.hex() == PARENT, f"parent {root.parent_span_id.hex()}")
check(root.kind == 2, f"kind {root.kind} (SERVER is 2)")
ra = attrs(root)
check(ra["gen_ai.request.model"] == "tiny" and ra["gen_ai.request.id"] == "traced-1", f"attributes {ra}")
check(ra["gen_ai.usage.prompt_tokens"] == usage["prompt_tokens"], f"prompt tokens {ra} vs {usage}")
check(ra["gen_ai.usage.completion_tokens"] == usage["completion_tokens"], f"completion tokens {ra} vs {usage}")
check(ra["gen_ai.request.max_tokens"] == 5, f"max_tokens {ra}")
now = time.time_ns()
check(now - 60e9 < root.start_time_unix_nano <= root.end_time_unix_nano <= now, "root span times")
kids = {x.name: x for x in col.spans if x.parent_span_id == root.span_id}
check(set(kids) == {"queue", "prefill", "decode"}, f"child spans: {list(kids)}")
for k in kids.values():
    check(k.trace_id == root.trace_id and k.span_id != root.span_id, f"{k.name}: ids")
    check(root.start_time_unix_nano <= k.start_time_unix_nano <= k.end_time_unix_nano <= root.end_time_unix_nano + 1e6,
          f"{k.name} is not inside the request's span")
check(kids["queue"].end_time_unix_nano <= kids["prefill"].start_time_unix_nano + 1
      and kids["prefill"].end_time_unix_nano <= kids["decode"].start_time_unix_nano + 1, "phases out of order")
check(attrs(kids["prefill"])["gen_ai.usage.prompt_tokens"] == usage["prompt_tokens"], "prefill tokens")
check(attrs(kids["decode"])["gen_ai.usage.completion_tokens"] == usage["completion_tokens"], "decode tokens")

# No traceparent, and a malformed one: each a trace of its own, no parent.
for hdr in [{}, {"traceparent": "00-zzzz-bad"}, {"traceparent": f"00-{'0' * 32}-{PARENT}-01"}]:
    before = len(col.spans)
    st, _, _ = s.request("POST", "/v1/completions", body, headers=hdr)
    check(st == 200, f"completion with {hdr}: {st}")
    wait_spans(col, before + 4)
    r = [x for x in col.spans[before:] if x.name == "llm_request"][0]
    check(r.trace_id.hex() != TRACE and r.trace_id != bytes(16) and not r.parent_span_id, f"{hdr}: {r}")
text = s.metrics()
check(metric_value(text, "servd_otlp_spans_exported_total", {}) is None, "a labelled series")
exported = [float(l.split()[1]) for l in text.splitlines() if l.startswith("servd_otlp_spans_exported_total ")]
check(exported and exported[0] == 4, f"exported records: {exported}")
check(s.stop() == 0, "exit status")
col.close()


def timed_requests(srv, n=20):
    t0 = time.monotonic()
    for _ in range(n):
        st, _, _ = srv.request("POST", "/v1/completions", body)
        check(st == 200, "completion")
    return time.monotonic() - t0


def counter(srv, name):
    for line in srv.metrics().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


# A collector that is down: requests as fast as without traces, drops counted.
with socket.socket() as sk:
    sk.bind(("127.0.0.1", 0))
    dead = sk.getsockname()[1]
base = Servd(a, ["--model", f"{llama}:tiny"])
t_base = timed_requests(base)
check(base.stop() == 0, "exit status")
down = Servd(a, ["--model", f"{llama}:tiny", "--otlp-traces-endpoint", f"http://127.0.0.1:{dead}"])
t_down = timed_requests(down)
deadline = time.monotonic() + 10
while time.monotonic() < deadline and (counter(down, "servd_otlp_spans_dropped_total") or 0) < 20:
    time.sleep(0.1)
check(counter(down, "servd_otlp_spans_dropped_total") == 20, "drops with the collector down")
check(down.stop() == 0, "exit status")
# A collector that takes 3 s per POST.
slow = Collector(delay=3.0)
sl = Servd(a, ["--model", f"{llama}:tiny", "--otlp-traces-endpoint", f"http://127.0.0.1:{slow.port}"])
t_slow = timed_requests(sl)
print(f"20 requests: {t_base:.3f} s without traces, {t_down:.3f} s collector down, {t_slow:.3f} s collector slow")
check(t_down < t_base * 1.5 + 0.5 and t_slow < t_base * 1.5 + 0.5, "a bad collector slowed the requests")
check(sl.stop() == 0, "exit status")
slow.close()

# A URL servd cannot use.
r = subprocess.run([a.servd, "--port", "0", "--model", f"{llama}:tiny", "--otlp-traces-endpoint", "grpc://x:4317"],
                   capture_output=True, text=True, timeout=60)
check(r.returncode == 2 and "--otlp-traces-endpoint 'grpc://x:4317'" in r.stderr, f"bad URL: {r.returncode} {r.stderr}")
print("ok")
