#!/usr/bin/env python3
"""Soak test of servd (benchmark suite, not CI): a long run under abuse, then the damage report.

Starts servd with a language model ("lm"), a generic model that segfaults on request and runs with
"isolation": "process" ("crashy"), and a model repository holding a small generic model ("cycler").
For --duration seconds it then runs, all at once:
  - servd-bench on /v1/completions (streaming) at --concurrency (default 32: twice the 16 streams
    where servd's throughput levels off, docs/performance.md "Server"),
  - clients that disconnect at random: mid-stream, mid-header, right after sending,
  - bad requests: malformed JSON, wrong types, unknown models, ragged tensors, bad framing,
  - repository cycles: load cycler, infer on it, unload it,
  - crashes of the isolated model (a negative input segfaults its process), with calls between.
Afterwards (idle) it reads /metrics and reports, in --out/soak.json and on stdout:
  daemon crashes (must be 0: servd alive at the end and exit 0 at SIGTERM), leaked KV blocks (blocks
  in use once idle; must be 0), servd's RSS drift after the warm-up (%), and outcomes by kind (the
  expected ones: 4xx for bad requests, 500 ModelProcessDied and 503 for the crashing model; the
  unexpected ones must be 0), and whether the crashing model serves again once left alone (45 s at
  most). Exit status 1 when a must-be-0 is not 0 or the model did not come back.

Usage: scripts/bench/soak.py [--duration S] [--concurrency N] [--model PKG] [--build DIR] [--out DIR]
  Full soak: nice -n 10 scripts/bench/soak.py --duration 1800
  --model defaults to .cache/smollm2-135m-instruct-q4_1.mpk (scripts/fetch-default-model.sh), else a
  synthetic tiny Llama.
Standard library only.
"""
import argparse
import collections
import hashlib
import http.client
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import zipfile

from bench_http import listening_port

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

GENERIC_PY = """\
import ctypes

import servd
from servd import ops


class Model:
    def predict(self, inputs):
        x = inputs["x"]
        if memoryview(x).cast("B").cast("f")[0] < 0:
            ctypes.string_at(0)  # SIGSEGV: ends only this model's process
        y = servd.empty(x.shape)
        ops.add(y, x, x)
        return {"y": y}
"""


def make_generic(path, name):
    files = {f"code/{name}/__init__.py": b"", f"code/{name}/model.py": GENERIC_PY.encode()}
    manifest = {"format_version": 1, "name": name, "model_version": "1", "kind": "generic",
                "entry_point": f"{name}.model:Model", "config": {}, "tensors": [],
                "files": {n: {"size": len(d), "sha256": hashlib.sha256(d).hexdigest()} for n, d in files.items()}}
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for n, d in files.items():
            z.writestr(n, d)
        z.writestr("manifest.json", json.dumps(manifest))


def find_bin(build, name):
    for d, _, files in os.walk(build):
        if name in files and os.access(os.path.join(d, name), os.X_OK):
            return os.path.join(d, name)
    sys.exit(f"soak: no {name} under {build} (build it first)")


class Tally:
    """Outcomes by kind, from every thread."""

    def __init__(self):
        self.mu = threading.Lock()
        self.expected = collections.Counter()
        self.unexpected = collections.Counter()
        self.first = {}

    def add(self, kind, ok, detail=""):
        with self.mu:
            (self.expected if ok else self.unexpected)[kind] += 1
            if not ok and kind not in self.first:
                self.first[kind] = str(detail)[:300]


class Soak:
    def __init__(self, a):
        self.a = a
        self.port = None
        self.tally = Tally()
        self.stop = threading.Event()
        self.rss = []  # (seconds since start, kB, KV blocks touched so far)
        self.kv_high = 0  # most KV blocks ever held (in use + cached): pages touched at least once

    def request(self, method, path, body=None, timeout=60):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            hdr = {}
            if isinstance(body, (dict, list)):
                body = json.dumps(body)
                hdr["Content-Type"] = "application/json"
            c.request(method, path, body=body, headers=hdr)
            r = c.getresponse()
            return r.status, r.read()
        finally:
            c.close()

    def infer(self, model, first):
        body = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [float(first), 1.0, 2.0, 3.0]}]}
        return self.request("POST", f"/v2/models/{model}/infer", body)

    # ---- the abusers ------------------------------------------------------------------------
    def disconnects(self):
        body = json.dumps({"model": "lm", "prompt": "Tell me a long story about servers.", "max_tokens": 64,
                           "stream": True, "ignore_eos": True}).encode()
        head = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        while not self.stop.is_set():
            how = random.choice(["mid-stream", "mid-header", "after-send", "mid-body"])
            try:
                s = socket.create_connection(("127.0.0.1", self.port), timeout=30)
                if how == "mid-header":
                    s.sendall(head[:random.randrange(1, len(head))])
                elif how == "mid-body":
                    s.sendall(head + body[:random.randrange(1, len(body))])
                else:
                    s.sendall(head + body)
                    if how == "mid-stream":
                        s.recv(random.randrange(200, 4000))
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST
                s.close()
                self.tally.add(f"disconnect {how}", True)
            except OSError as e:
                self.tally.add(f"disconnect {how}: {type(e).__name__}", False, e)
            time.sleep(random.uniform(0.05, 0.4))

    BAD = [
        ("POST", "/v1/completions", b"{not json"),
        ("POST", "/v1/completions", b'{"model": "lm", "prompt": 5}'),
        ("POST", "/v1/completions", b'{"model": "lm", "prompt": "x", "temperature": "hot"}'),
        ("POST", "/v1/completions", b'{"model": "nope", "prompt": "x"}'),
        ("POST", "/v1/chat/completions", b'{"model": "lm", "messages": [{"role": "wizard", "content": "x"}]}'),
        ("POST", "/v2/models/crashy/infer", b'{"inputs": [{"name": "x", "shape": [2, 2], "datatype": "FP32", '
                                           b'"data": [[1, 2, 3], [4]]}]}'),
        ("POST", "/v2/models/crashy/infer", b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP64", "data": [1]}]}'),
        ("POST", "/v2/models/nope/infer", b'{"inputs": []}'),
        ("GET", "/v2/models/crashy/infer", None),
        ("POST", "/v2/repository/models/..%2Fetc/load", b""),
    ]

    def bad_requests(self):
        while not self.stop.is_set():
            method, path, body = random.choice(self.BAD)
            try:
                st, data = self.request(method, path, body)
                self.tally.add(f"bad request {st}", 400 <= st < 500, data[:200])
            except OSError as e:
                self.tally.add(f"bad request: {type(e).__name__}", False, e)
            try:  # broken framing on a raw socket: answered 4xx, then closed
                s = socket.create_connection(("127.0.0.1", self.port), timeout=30)
                s.sendall(random.choice([b"BREW / HTTP/1.1\r\n\r\n", b"GET / HTTP/9.9\r\n\r\n",
                                         b"POST /v1/completions HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
                                         b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\n\r\n"]))
                line = s.recv(64).split(b"\r\n")[0]
                s.close()
                st = int(line.split()[1]) if line.startswith(b"HTTP/1.1 ") else 0
                self.tally.add(f"bad framing {st}", 400 <= st < 600 and st != 500, line)
            except (OSError, ValueError, IndexError) as e:
                self.tally.add(f"bad framing: {type(e).__name__}", False, e)
            time.sleep(random.uniform(0.05, 0.3))

    def repository_cycles(self):
        while not self.stop.is_set():
            for step in ("load", "infer", "unload"):
                try:
                    if step == "infer":
                        st, data = self.infer("cycler", 1.0)
                    else:
                        st, data = self.request("POST", f"/v2/repository/models/cycler/{step}", b"", timeout=120)
                    self.tally.add(f"repository {step} {st}", st == 200, data[:200])
                except OSError as e:
                    self.tally.add(f"repository {step}: {type(e).__name__}", False, e)
            time.sleep(random.uniform(0.5, 2.0))

    def crashes(self):
        while not self.stop.is_set():
            crash = random.random() < 0.15
            try:
                st, data = self.infer("crashy", -1.0 if crash else 1.0)
                if crash:
                    ok = st == 503 or (st == 500 and b"ModelProcessDied" in data)
                    self.tally.add(f"crashy crash {st}", ok, data[:200])
                else:
                    self.tally.add(f"crashy infer {st}", st in (200, 503), data[:200])
            except OSError as e:
                self.tally.add(f"crashy: {type(e).__name__}", False, e)
            time.sleep(random.uniform(0.2, 1.0))

    def sample_rss(self, pid, t0):
        while not self.stop.is_set():
            try:
                text = self.request("GET", "/metrics")[1].decode()
                held = (metric(text, "servd_kv_cache_blocks_used", "lm") or 0) + \
                    (metric(text, "servd_kv_cache_blocks_cached", "lm") or 0)
                self.kv_high = max(self.kv_high, int(held))
                with open(f"/proc/{pid}/status") as f:
                    kb = next(int(l.split()[1]) for l in f if l.startswith("VmRSS:"))
                self.rss.append((round(time.monotonic() - t0, 1), kb, self.kv_high))
            except (OSError, StopIteration):
                return
            self.stop.wait(2.0)


def metric(text, name, model=None):
    want = f'{name}{{model="{model}"}}' if model else name
    for line in text.splitlines():
        if line.split(" ")[0] == want:
            return float(line.rsplit(" ", 1)[1])
    return None


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=float, default=1800, help="seconds of load (default 1800)")
    p.add_argument("--concurrency", type=int, default=32, help="servd-bench streams (default 32)")
    p.add_argument("--warmup-fraction", type=float, default=0.2, help="RSS drift is measured after it")
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--model", help="the language model package")
    p.add_argument("--build", default=os.environ.get("BUILD_DIR", os.path.join(ROOT, "build")))
    p.add_argument("--out", default=None, help="work folder (default BUILD/soak)")
    p.add_argument("--threads", type=int, default=0, help="servd --threads (0: its default)")
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    random.seed(a.seed)
    out = a.out or os.path.join(a.build, "soak")
    os.makedirs(os.path.join(out, "repo"), exist_ok=True)
    servd, bench = find_bin(a.build, "servd"), find_bin(a.build, "servd-bench")
    model = a.model
    for cand in ([] if model else [os.path.join(ROOT, ".cache", "smollm2-135m-instruct-q4_1.mpk"),
                                   os.path.join(ROOT, ".cache", "smollm2", "smollm2-135m-instruct-q4_1.mpk")]):
        if os.path.exists(cand):
            model = cand
            break
    if not model:
        model = os.path.join(out, "tiny.mpk")
        subprocess.run([find_bin(a.build, "modelpkg"), "synth", "tiny", "-o", model, "--quiet"], check=True)
    make_generic(os.path.join(out, "crashy.mpk"), "crashy")
    make_generic(os.path.join(out, "repo", "cycler.mpk"), "cycler")
    cfg = os.path.join(out, "soak.json.cfg")
    with open(cfg, "w") as f:
        json.dump({"model_repository": [os.path.join(out, "repo")],
                   "models": [{"path": model, "name": "lm"},
                              {"path": os.path.join(out, "crashy.mpk"), "name": "crashy", "isolation": "process"}]}, f)
    argv = [servd, "--config", cfg, "--host", "127.0.0.1", "--port", "0", "--access-log", "off"]
    if a.threads:
        argv += ["--threads", str(a.threads)]
    log = open(os.path.join(out, "servd.log"), "w")
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, text=True)
    s = Soak(a)
    s.port = listening_port(proc)
    if s.port is None:
        sys.exit(f"soak: servd did not start (see {out}/servd.log)")
    deadline = time.monotonic() + 300
    while True:
        try:
            if s.request("GET", "/v2/health/ready")[0] == 200:
                break
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            sys.exit(f"soak: servd not ready (see {out}/servd.log)")
        time.sleep(0.2)

    print(f"soak: servd pid {proc.pid} port {s.port}; {a.duration:.0f} s at concurrency {a.concurrency}, "
          f"model {os.path.basename(model)}", flush=True)
    t0 = time.monotonic()
    bench_json = os.path.join(out, "bench.json")
    bench_proc = subprocess.Popen([bench, "--url", f"http://127.0.0.1:{s.port}", "--api", "completions", "--model", "lm",
                                   "--concurrency", str(a.concurrency), "--duration", str(a.duration),
                                   "--input-len", str(a.input_len), "--output-len", str(a.output_len),
                                   "--timeout", "600", "--seed", str(a.seed), "--no-min-tokens", "--json", bench_json],
                                  stdout=open(os.path.join(out, "bench.log"), "w"), stderr=subprocess.STDOUT)
    threads = [threading.Thread(target=f, daemon=True) for f in
               (s.disconnects, s.bad_requests, s.repository_cycles, s.crashes)]
    threads.append(threading.Thread(target=s.sample_rss, args=(proc.pid, t0), daemon=True))
    for t in threads:
        t.start()
    bench_rc = bench_proc.wait()
    load_end = time.monotonic() - t0
    s.stop.set()
    for t in threads:
        t.join(180)

    # Idle: every request has ended; what is still held is leaked.
    alive = proc.poll() is None
    leaked = running = None
    text = ""
    idle_deadline = time.monotonic() + 30
    while alive and time.monotonic() < idle_deadline:
        time.sleep(2)
        st, data = s.request("GET", "/metrics")
        text = data.decode()
        leaked = metric(text, "servd_kv_cache_blocks_used", "lm")
        running = (metric(text, "servd_requests_running", "lm") or 0) + (metric(text, "servd_requests_waiting", "lm") or 0)
        if leaked == 0 and running == 0 and metric(text, "servd_api_requests_in_flight") == 0:
            break
    # The crashing model must come back once left alone (its backoff is 30 s at most).
    recovered_s = None
    t_rec = time.monotonic()
    while alive and recovered_s is None and time.monotonic() - t_rec < 45:
        try:
            if s.infer("crashy", 1.0)[0] == 200:
                recovered_s = round(time.monotonic() - t_rec, 1)
        except OSError:
            pass
        time.sleep(0.5)
    idle_rss = None
    if alive:
        with open(f"/proc/{proc.pid}/status") as f:
            idle_rss = next(int(l.split()[1]) for l in f if l.startswith("VmRSS:"))
    with open(os.path.join(out, "servd.log")) as f:
        text_log = f.read()
    warm = [(kb, kv) for t, kb, kv in s.rss if t >= a.warmup_fraction * load_end]
    drift = 100.0 * (warm[-1][0] - warm[0][0]) / warm[0][0] if len(warm) >= 2 else None
    # The KV cache is mapped at load and its pages become resident when first written: with prefix
    # caching, freed blocks stay cached and new ones are taken until the pool is full, so RSS grows by
    # a block's bytes per block touched for the first time until then. That growth is not a leak.
    kv_line = re.search(r"model 'lm': .*KV cache (\d+) blocks .*?([0-9.]+) (GB|MB)", text_log)
    block_kb = None
    if kv_line:
        size = float(kv_line.group(2)) * (1e9 if kv_line.group(3) == "GB" else 1e6)  # servd prints decimal units
        block_kb = size / 1024 / int(kv_line.group(1))
    drift_ex = None
    if drift is not None and block_kb:
        first_touch = (warm[-1][1] - warm[0][1]) * block_kb
        drift_ex = 100.0 * (warm[-1][0] - warm[0][0] - first_touch) / warm[0][0]
    exit_rc = None
    if alive:
        proc.send_signal(signal.SIGTERM)
        try:
            exit_rc = proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
            exit_rc = "hung at SIGTERM"
    log.close()
    with open(os.path.join(out, "servd.log")) as f:
        text_log = f.read()  # with whatever the shutdown wrote
    # The isolated model's process writes its crash reports into servd's log too: servd logs each death.
    child_deaths = text_log.count("model 'crashy': the model's process")
    crash_reports = max(0, text_log.count("servd: fatal signal") - child_deaths)
    crashes = (0 if alive else 1) + (0 if exit_rc == 0 else 1 if alive else 0)
    bench_res = {}
    try:
        with open(bench_json) as f:
            bench_res = json.load(f)["results"]
    except (OSError, ValueError, KeyError):
        pass
    report = {
        "duration_s": round(load_end, 1), "concurrency": a.concurrency, "model": os.path.basename(model),
        "daemon_crashes": crashes, "daemon_crash_reports_in_log": crash_reports, "exit_status": exit_rc,
        "isolated_model_deaths": child_deaths,
        "leaked_kv_blocks": leaked, "requests_left_running": running,
        "kv_blocks_cached_idle": metric(text, "servd_kv_cache_blocks_cached", "lm"),
        "rss_kb": {"after_warmup": warm[0][0] if warm else None, "end_of_load": warm[-1][0] if warm else None,
                   "idle": idle_rss, "max": max((kb for _, kb, _ in s.rss), default=None)},
        "rss_drift_after_warmup_pct": None if drift is None else round(drift, 2),
        "kv_blocks_touched": {"after_warmup": warm[0][1] if warm else None, "end_of_load": s.kv_high,
                              "capacity": int(kv_line.group(1)) if kv_line else None,
                              "kb_per_block": None if block_kb is None else round(block_kb, 1)},
        "rss_drift_after_warmup_less_kv_first_touch_pct": None if drift_ex is None else round(drift_ex, 2),
        "rss_series": s.rss,
        "isolated_restarts": metric(text, "servd_isolated_model_restarts_total", "crashy"),
        "isolated_model_back_after_s": recovered_s,
        "quarantined_interpreters": metric(text, "servd_engine_quarantined_interpreters"),
        "bench": {"exit": bench_rc, "completed": bench_res.get("completed"), "failed": bench_res.get("failed"),
                  "errors": bench_res.get("errors"), "output_tokens_per_s": bench_res.get("output_tokens_per_s")},
        "outcomes_expected": dict(sorted(s.tally.expected.items())),
        "errors_unexpected": dict(sorted(s.tally.unexpected.items())),
        "first_unexpected": s.tally.first,
    }
    with open(os.path.join(out, "soak.json"), "w") as f:
        json.dump(report, f, indent=1)
    print(json.dumps(report, indent=1))
    bad = (crashes or crash_reports or leaked != 0 or running != 0 or s.tally.unexpected or bench_rc != 0
           or recovered_s is None)
    print(f"soak: {'FAILED' if bad else 'OK'} (report {out}/soak.json, log {out}/servd.log)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
