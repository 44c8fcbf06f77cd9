#!/usr/bin/env python3
"""A scripted OpenAI-compatible (and KServe v2) server with known timing, for testing servd-bench.

Streams /v1/completions and /v1/chat/completions as SSE over chunked transfer encoding: it waits
--ttft-ms before the first content chunk, then --itl-ms between chunks, and sends exactly
--tokens content chunks (or max_tokens when --tokens is 0), each holding --words-per-chunk words.
The usage object, when asked for, deliberately claims --usage-extra more tokens than were sent, so
a test can tell counting from the stream apart from trusting the server.

Faults come from --cycle, a comma-separated list applied to requests in arrival order (repeating):
  ok          a normal stream
  429, 500    that HTTP status with a JSON error body
  disconnect  two chunks, then the connection is closed mid-stream
  hang        headers and nothing more for --hang-s seconds
  badjson     a chunk whose data is not JSON
  nodone      a normal stream that ends without "data: [DONE]"
  streamerror a 200 stream carrying an error object
  close       a normal stream with "Connection: close"
  donenoend   a normal stream through "data: [DONE]", then the connection closes without the
              final empty chunk
  eofbody     a normal stream with neither length nor chunking: the body ends when the
              connection closes

GET /stats also returns, for each complete stream, the times the server actually wrote: its
TTFT, the gaps between content chunks and its end-to-end time, measured from reading the request
line. Sleeps overrun under load; these are the values a client must reproduce.

GET /stats also lists every chat request's whole messages array ("messages"), so that a test can
follow a multi-turn conversation's history.

Also: POST /tokenize (whitespace-separated words are tokens), POST /v2/models/{m}/infer (checks the
input tensor, waits --infer-ms), GET /v2/health/ready, GET /stats (requests, connections, prompts).

Prints "PORT <n>" on stdout once listening (use --port 0 for a free port).
Python standard library only.
"""
import argparse
import json
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class State:
    def __init__(self, args):
        self.args = args
        self.cycle = [c.strip() for c in args.cycle.split(",") if c.strip()]
        self.lock = threading.Lock()
        self.requests = 0
        self.connections = 0
        self.scrapes = 0
        self.prompts = []
        self.messages = []  # chat: each request's whole messages array, in arrival order
        self.timings = []  # per finished stream: what the server actually did, in ms

    def record(self, t0, writes, t_end):
        with self.lock:
            self.timings.append({
                "ttft_ms": (writes[0] - t0) * 1e3 if writes else None,
                "gaps_ms": [(b - a) * 1e3 for a, b in zip(writes, writes[1:])],
                "e2e_ms": (t_end - t0) * 1e3})

    def next_fault(self, prompt, messages=None):
        with self.lock:
            if messages is not None:
                self.messages.append(messages)
            fault = self.cycle[self.requests % len(self.cycle)]
            self.requests += 1
            self.prompts.append(prompt)
            return fault


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive by default
    raw_body = False

    def setup(self):
        super().setup()
        # headers and body go out in separate writes; without this, Nagle plus the client's
        # delayed ACK would add ~40 ms to every response
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self.server.state.lock:
            self.server.state.connections += 1

    def log_message(self, fmt, *args):  # quiet
        pass

    # ---- helpers ----
    def send_json(self, status, obj, close=False):
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()

    def chunk(self, data):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def event(self, payload):
        data = payload if isinstance(payload, str) else json.dumps(payload)
        raw = ("data: " + data + "\n\n").encode()
        if self.raw_body:
            self.wfile.write(raw)
            self.wfile.flush()
        else:
            self.chunk(raw)

    def read_body(self):
        n = int(self.headers.get("Content-Length", "0"))
        raw = self.rfile.read(n) if n else b""
        return json.loads(raw) if raw else {}

    # ---- routes ----
    def do_GET(self):
        st = self.server.state
        if self.path == "/v2/health/ready" or self.path == "/health":
            self.send_json(200, {"ready": True})
        elif self.path == "/stats":
            with st.lock:
                self.send_json(200, {"requests": st.requests, "connections": st.connections,
                                     "prompts": st.prompts, "timings": st.timings,
                                     "messages": st.messages, "scrapes": st.scrapes})
        elif self.path == "/metrics":
            # vLLM's speculative decoding counters, as if every request had one verify row of 4
            # drafts of which 3 were accepted, split over two models' series
            with st.lock:
                st.scrapes += 1
                n = st.requests
            lines = []
            for fam, per in (("drafts", 1), ("draft_tokens", 4), ("accepted_tokens", 3)):
                name = "vllm:spec_decode_num_%s_total" % fam
                lines += ["# TYPE %s counter" % name, '%s{model_name="a"} %d' % (name, per * (n - n // 2)),
                          '%s{model_name="b"} %d' % (name, per * (n // 2))]
            body = ("\n".join(lines) + "\n").encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        else:
            self.send_json(404, {"error": "not found"})

    def do_POST(self):
        self.t0 = time.monotonic()
        try:
            body = self.read_body()
        except (ValueError, json.JSONDecodeError):
            self.send_json(400, {"error": {"message": "bad JSON"}})
            return
        if self.path in ("/v1/completions", "/v1/chat/completions"):
            self.stream(body, chat=self.path.endswith("chat/completions"))
        elif self.path == "/tokenize":
            text = body.get("content", body.get("prompt", ""))
            self.send_json(200, {"tokens": list(range(len(text.split())))})
        elif self.path.startswith("/v2/models/") and self.path.endswith("/infer"):
            self.infer(body)
        else:
            self.send_json(404, {"error": {"message": "no route " + self.path}})

    def infer(self, body):
        a = self.server.state.args
        st = self.server.state
        st.next_fault("")
        try:
            inp = body["inputs"][0]
            n = 1
            for d in inp["shape"]:
                n *= d
            if len(inp["data"]) != n or inp["datatype"] != a.expect_datatype:
                raise ValueError("shape/data mismatch")
        except (KeyError, IndexError, TypeError, ValueError) as e:
            self.send_json(400, {"error": "bad input: %s" % e})
            return
        time.sleep(a.infer_ms / 1000.0)
        self.send_json(200, {"model_name": "m", "outputs": [
            {"name": "output", "shape": [1], "datatype": "FP32", "data": [float(n)]}]})
        st.record(self.t0, [], time.monotonic())

    def stream(self, body, chat):
        a = self.server.state.args
        st = self.server.state
        if a.require_key and self.headers.get("Authorization") != "Bearer " + a.require_key:
            st.next_fault("")
            self.send_json(401, {"error": {"message": "bad key"}})
            return
        if chat:
            prompt = body.get("messages", [{}])[0].get("content", "")
        else:
            prompt = body.get("prompt", "")
        fault = st.next_fault(prompt, body.get("messages") if chat else None)
        if fault in ("429", "500"):
            self.send_json(int(fault), {"error": {"message": "scripted " + fault}})
            return
        n = a.tokens if a.tokens > 0 else int(body.get("max_tokens", 16))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.raw_body = fault == "eofbody"
        if not self.raw_body:
            self.send_header("Transfer-Encoding", "chunked")
        if fault in ("close", "eofbody"):
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.flush()
        if fault == "hang":
            time.sleep(a.hang_s)
            self.close_connection = True
            return
        if chat:  # a role-only chunk at once: must not count as the first token
            self.event({"choices": [{"index": 0, "delta": {"role": "assistant"}}]})
        time.sleep(a.ttft_ms / 1000.0)
        words = " ".join(["tok"] * a.words_per_chunk) + " "
        writes = []
        for i in range(n):
            if i:
                time.sleep(a.itl_ms / 1000.0)
            if fault == "disconnect" and i == 2:
                self.close_connection = True
                self.connection.shutdown(2)
                return
            if fault == "badjson" and i == 1:
                self.event("{not json")
                continue
            if chat:
                choice = {"index": 0, "delta": {"content": words}, "finish_reason": None}
            else:
                choice = {"index": 0, "text": words, "finish_reason": None}
            self.event({"id": "x", "object": "chunk", "choices": [choice]})
            writes.append(time.monotonic())
        if fault == "streamerror":
            self.event({"error": {"message": "scripted stream error"}})
        if body.get("stream_options", {}).get("include_usage"):
            self.event({"choices": [], "usage": {"completion_tokens": n + a.usage_extra,
                                                  "prompt_tokens": 1}})
        if fault != "nodone":
            self.event("[DONE]")
        if fault == "donenoend":
            self.close_connection = True
            self.connection.shutdown(2)
            return
        if not self.raw_body:
            self.chunk(b"")  # end of chunked body
        if fault in ("ok", "close", "eofbody"):
            st.record(self.t0, writes, time.monotonic())


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request, client_address):
        # clients that time out or give up on a broken stream close their end: expected here
        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--ttft-ms", type=float, default=100)
    p.add_argument("--itl-ms", type=float, default=20)
    p.add_argument("--tokens", type=int, default=10)
    p.add_argument("--words-per-chunk", type=int, default=1)
    p.add_argument("--usage-extra", type=int, default=5)
    p.add_argument("--cycle", default="ok")
    p.add_argument("--hang-s", type=float, default=5)
    p.add_argument("--infer-ms", type=float, default=30)
    p.add_argument("--expect-datatype", default="FP32")
    p.add_argument("--require-key", default="")
    args = p.parse_args()
    srv = Server(("127.0.0.1", args.port), Handler)
    srv.state = State(args)
    print("PORT %d" % srv.server_address[1], flush=True)
    try:
        srv.serve_forever(poll_interval=0.05)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    sys.exit(main())
