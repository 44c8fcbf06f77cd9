#!/usr/bin/env python3
"""servd-bench against a scripted fake server with known delays, token counts and faults.

The fake server (fake_openai_server.py) sleeps a scripted TTFT before the first content chunk and a
scripted gap between chunks, and records when it actually wrote each chunk (a sleep can overrun on
a loaded machine). The scripted delays are lower bounds for what the client reports; the server's
own record is the reference the client's figures must match. Tolerances:
  - TTFT and end-to-end medians: within max(20 ms, 15 %). The machine is shared and has 2 cores;
    a Python server thread's sleep can wake late by a scheduler tick or a GIL hand-off (several ms,
    occasionally tens), and both the client and server processes compete with other builds.
  - ITL and TPOT medians: within max(6 ms, 15 %) (about 40 ms gaps): a median is robust to the
    odd late wake-up of the client, and TPOT averages over 7 gaps.
  - throughput: within 15 % of requests / (rounds * end-to-end), since it derives from durations.
  - Lower bounds are strict (minus 1 ms for clock granularity): a server sleep can only be
    longer than asked, so a TTFT below the scripted delay would be a measuring bug.
Counts (requests, tokens, errors by kind) must be exact.
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import unittest
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = None
SCHEMA = None


def percentile(values, p):
    """numpy.percentile's default (linear between the ranks around p/100 * (n - 1))."""
    v = sorted(values)
    rank = p / 100 * (len(v) - 1)
    lo = int(rank)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (rank - lo)


def within(value, expected, abs_tol, rel_tol):
    return abs(value - expected) <= max(abs_tol, rel_tol * expected)


class FakeServer:
    def __init__(self, *args):
        self.args = list(args)

    def __enter__(self):
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "fake_openai_server.py"), "--port", "0"] + self.args,
            stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("PORT "):
            self.proc.kill()
            raise RuntimeError("fake server did not start: %r" % line)
        self.port = int(line.split()[1])
        return self

    def stats(self):
        with urllib.request.urlopen("http://127.0.0.1:%d/stats" % self.port, timeout=10) as r:
            return json.load(r)

    def __exit__(self, *exc):
        self.proc.terminate()
        self.proc.wait(timeout=10)
        self.proc.stdout.close()


class BenchTest(unittest.TestCase):
    def run_bench(self, port, *args, expect_rc=0):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "r.json")
            p = subprocess.run([BENCH, "--port", str(port), "--json", out] + list(args),
                               capture_output=True, text=True, timeout=60)
            self.assertEqual(p.returncode, expect_rc, p.stdout + p.stderr)
            with open(out) as f:
                doc = json.load(f)
        self.validate(doc)
        return doc, p.stdout

    def validate(self, doc):
        with open(SCHEMA) as f:
            schema = json.load(f)
        try:
            import jsonschema
        except ImportError:  # hand checks of the main structure
            for k in schema["required"]:
                self.assertIn(k, doc)
            for k in schema["properties"]["results"]["required"]:
                self.assertIn(k, doc["results"])
            return
        jsonschema.validate(doc, schema, cls=jsonschema.Draft202012Validator)

    def assertWithin(self, value, expected, abs_tol, rel_tol, what):
        self.assertTrue(within(value, expected, abs_tol, rel_tol),
                        "%s = %.2f, expected %.2f within max(%g, %g%%)"
                        % (what, value, expected, abs_tol, rel_tol * 100))

    def test_timing_matches_script(self):
        ttft, itl, n, conc, reqs = 100.0, 40.0, 8, 4, 8
        with FakeServer("--ttft-ms", str(ttft), "--itl-ms", str(itl), "--tokens", str(n),
                        "--usage-extra", "5") as srv:
            doc, table = self.run_bench(srv.port, "--concurrency", str(conc), "--num-requests",
                                        str(reqs), "--warmup", "2", "--usage", "--input-len", "32",
                                        "--output-len", str(n), "--per-request")
            st = srv.stats()
        r = doc["results"]
        self.assertEqual(r["completed"], reqs)
        self.assertEqual(r["failed"], 0)
        self.assertEqual(r["output_tokens"], reqs * n)   # counted from the stream ...
        self.assertEqual(r["usage_output_tokens"], reqs * (n + 5))  # ... not the server's claim
        self.assertEqual(r["input_tokens"], reqs * 32)
        self.assertEqual(st["requests"], reqs + 2)       # warm-up sent but not reported
        self.assertEqual(len(doc["requests"]), reqs)
        # keep-alive: the /stats call is one connection, the /metrics scrapes before and after one each
        self.assertEqual(st["scrapes"], 2)
        self.assertEqual(st["connections"] - 1 - st["scrapes"], conc)
        # speculation over the run (warm-up included), summed over the models' series
        self.assertEqual(r["speculation"], {"drafts": reqs + 2, "draft_tokens": 4 * (reqs + 2),
                                            "accepted_tokens": 3 * (reqs + 2), "acceptance_rate": 0.75})
        self.assertIn("Speculation (server):", table)
        self.assertIn("%d of %d drafts accepted (75.0%%)" % (3 * (reqs + 2), 4 * (reqs + 2)), table)
        for p in st["prompts"]:
            self.assertEqual(len(p.split()), 32)
        # the scripted delays are lower bounds (a sleep can only overrun) ...
        self.assertGreaterEqual(r["ttft_ms"]["min"], ttft - 1)
        self.assertGreaterEqual(r["itl_ms"]["median"], itl - 1)
        # ... and what the server actually did, timed on its side, is the reference
        tm = [t for t in st["timings"]]
        self.assertEqual(len(tm), reqs + 2)
        srv_ttft = statistics.median(t["ttft_ms"] for t in tm)
        srv_gap = statistics.median(g for t in tm for g in t["gaps_ms"])
        srv_e2e = statistics.median(t["e2e_ms"] for t in tm)
        srv_tpot = statistics.median((t["e2e_ms"] - t["ttft_ms"]) / (n - 1) for t in tm)
        self.assertWithin(r["ttft_ms"]["median"], srv_ttft, 20, 0.15, "TTFT median")
        self.assertWithin(r["itl_ms"]["median"], srv_gap, 6, 0.15, "ITL median")
        self.assertEqual(r["itl_ms"]["count"], reqs * (n - 1))
        self.assertWithin(r["tpot_ms"]["median"], srv_tpot, 6, 0.15, "TPOT median")
        self.assertWithin(r["e2e_ms"]["median"], srv_e2e, 20, 0.15, "E2E median")
        rounds = reqs // conc
        self.assertWithin(r["requests_per_s"], reqs / (rounds * srv_e2e / 1000), 0, 0.15, "req/s")
        self.assertWithin(r["output_tokens_per_s"], reqs * n / (rounds * srv_e2e / 1000), 0, 0.15,
                          "output tok/s")
        for q in doc["requests"]:
            self.assertTrue(q["ok"])
            self.assertEqual(len(q["itl_ms"]), n - 1)
            self.assertEqual(q["output_tokens"], n)
            # TPOT's definition, checked on each request: (e2e - ttft) / (n - 1) ~ mean ITL
            tpot = (q["e2e_ms"] - q["ttft_ms"]) / (n - 1)
            self.assertLess(abs(tpot - sum(q["itl_ms"]) / len(q["itl_ms"])), 5)
        self.assertIn("TTFT", table)
        self.assertIn("Output token throughput", table)

    def test_chat_role_chunk_and_tokenize_counting(self):
        with FakeServer("--ttft-ms", "60", "--itl-ms", "10", "--tokens", "5",
                        "--words-per-chunk", "3") as srv:
            doc, _ = self.run_bench(srv.port, "--api", "chat", "--concurrency", "2",
                                    "--num-requests", "4", "--input-len", "20",
                                    "--count-tokens", "tokenize")
            srv_ttft = statistics.median(t["ttft_ms"] for t in srv.stats()["timings"])
        r = doc["results"]
        self.assertEqual(r["completed"], 4)
        self.assertEqual(r["output_chunks"], 4 * 5)
        self.assertEqual(r["output_tokens"], 4 * 5 * 3)  # the fake /tokenize counts words
        self.assertEqual(r["output_tokens_counted_by"], "tokenize")
        self.assertEqual(r["input_tokens"], 4 * 20)
        self.assertEqual(r["input_tokens_source"], "tokenize")
        # the role-only chunk comes at once; TTFT waits for content
        self.assertGreaterEqual(r["ttft_ms"]["min"], 59)
        self.assertWithin(r["ttft_ms"]["median"], srv_ttft, 20, 0.15, "chat TTFT median")

    def test_faults_are_counted_not_fatal(self):
        cycle = "ok,429,500,disconnect,hang,badjson,nodone,streamerror,close,eofbody,donenoend,ok"
        with FakeServer("--ttft-ms", "20", "--itl-ms", "5", "--tokens", "6", "--cycle", cycle,
                        "--hang-s", "3") as srv:
            doc, table = self.run_bench(srv.port, "--concurrency", "1", "--num-requests", "12",
                                        "--timeout", "1", "--per-request")
        r = doc["results"]
        e = r["errors"]
        self.assertEqual(r["completed"], 5)  # ok, close, eofbody, donenoend, ok
        self.assertEqual(r["failed"], 7)
        self.assertEqual(e["http"], 2)
        self.assertEqual(e["http_status"], {"429": 1, "500": 1})
        self.assertEqual(e["disconnect"], 1)
        self.assertEqual(e["timeout"], 1)
        self.assertEqual(e["parse"], 2)  # bad JSON chunk, stream without [DONE]
        self.assertEqual(e["stream"], 1)
        self.assertEqual(e["connect"], 0)
        self.assertEqual(r["output_tokens"], 5 * 6)  # failed requests' tokens are not counted
        kinds = [q["error"] for q in doc["requests"]]
        self.assertEqual(kinds, [None, "http", "http", "disconnect", "timeout", "parse", "parse",
                                 "stream", None, None, None, None])
        self.assertIn("429", r["first_error"])
        self.assertIn("disconnect 1", table)

    def test_connect_failures(self):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()  # nothing listens there now
        doc, _ = self.run_bench(port, "--concurrency", "3", "--num-requests", "9", expect_rc=1)
        self.assertEqual(doc["results"]["errors"]["connect"], 9)
        self.assertEqual(doc["results"]["completed"], 0)
        self.assertEqual(doc["results"]["ttft_ms"]["count"], 0)

    def test_rate_mode_and_seed(self):
        def run(seed):
            with FakeServer("--ttft-ms", "5", "--itl-ms", "2", "--tokens", "4") as srv:
                doc, _ = self.run_bench(srv.port, "--request-rate", "100", "--num-requests", "20",
                                        "--seed", str(seed), "--input-len", "12", "--per-request")
                return doc, sorted(srv.stats()["prompts"])
        a, pa = run(7)
        b, pb = run(7)
        c, pc = run(8)
        self.assertEqual(a["results"]["completed"], 20)
        self.assertEqual(a["config"]["load"], "rate")
        self.assertEqual(pa, pb)
        self.assertNotEqual(pa, pc)
        self.assertEqual(sorted(q["prompt_index"] for q in a["requests"]), list(range(20)))
        # 19 exponential gaps of mean 10 ms: far below the 1 s a serial run would need
        self.assertLess(a["results"]["duration_s"], 1.0)

    def test_shared_prefix(self):
        with FakeServer("--ttft-ms", "1", "--itl-ms", "1", "--tokens", "2") as srv:
            doc, _ = self.run_bench(srv.port, "--concurrency", "2", "--num-requests", "6", "--seed", "3",
                                    "--shared-prefix-len", "40", "--prefixes", "2", "--input-len", "5")
            prompts = srv.stats()["prompts"]
        self.assertEqual(doc["config"]["shared_prefix_len"], 40)
        self.assertEqual(doc["config"]["prefixes"], 2)
        self.assertEqual(doc["results"]["input_tokens"], 6 * 45)
        words = [p.split() for p in prompts]
        self.assertTrue(all(len(w) == 45 for w in words))
        heads = {" ".join(w[:40]) for w in words}
        self.assertEqual(len(heads), 2)  # request i takes prefix i mod 2
        self.assertEqual(len({" ".join(w[40:]) for w in words}), 6)  # own parts differ

    def test_multi_turn_chat_resends_history(self):
        convs, turns, n_in, n_prefix, n_out = 3, 4, 5, 6, 3
        with FakeServer("--ttft-ms", "2", "--itl-ms", "1", "--tokens", str(n_out)) as srv:
            doc, table = self.run_bench(srv.port, "--api", "chat", "--conversations", str(convs), "--turns",
                                        str(turns), "--concurrency", "2", "--input-len", str(n_in),
                                        "--shared-prefix-len", str(n_prefix), "--output-len", str(n_out),
                                        "--seed", "5", "--per-request")
            st = srv.stats()
        self.assertIn("3 conversations x 4 turns", table)
        self.assertEqual(doc["config"]["multi_turn"], {"conversations": convs, "turns": turns, "think_time_s": 0})
        self.assertEqual(doc["results"]["completed"], convs * turns)
        self.assertEqual(st["requests"], convs * turns)
        answer = "tok " * n_out  # what the fake server streams, chunk by chunk
        by_conv = {}
        for pos, msgs in enumerate(st["messages"]):
            self.assertEqual(msgs[0]["role"], "system")
            self.assertEqual(len(msgs[0]["content"].split()), n_prefix)
            by_conv.setdefault(msgs[1]["content"], []).append((pos, msgs))
        self.assertEqual(len(by_conv), convs)
        self.assertEqual(len({m[0]["content"] for m in st["messages"]}), 1)  # one shared system prompt
        users = set()
        for reqs in by_conv.values():
            self.assertEqual(len(reqs), turns)
            # turns go out one after another, each with the whole history so far
            reqs.sort(key=lambda pm: len(pm[1]))
            self.assertEqual([pm[0] for pm in reqs], sorted(pm[0] for pm in reqs))
            prev = None
            for k, (_, msgs) in enumerate(reqs):
                self.assertEqual(len(msgs), 1 + 2 * k + 1)
                self.assertEqual([m["role"] for m in msgs[1:]], ["user", "assistant"] * k + ["user"])
                if prev is not None:
                    self.assertEqual(msgs[:len(prev)], prev)
                    self.assertEqual(msgs[len(prev)], {"role": "assistant", "content": answer})
                self.assertEqual(len(msgs[-1]["content"].split()), n_in)
                users.add(msgs[-1]["content"])
                prev = msgs
        self.assertEqual(len(users), convs * turns)  # every user turn is new
        seen = sorted((q["conversation"], q["turn"]) for q in doc["requests"])
        self.assertEqual(seen, [(c, t) for c in range(convs) for t in range(turns)])
        for q in doc["requests"]:
            # the history's estimate: system prompt, every user turn so far, every earlier answer
            self.assertEqual(q["input_tokens"], n_prefix + n_in * (q["turn"] + 1) + n_out * q["turn"])
            self.assertEqual(q["prompt_index"], q["conversation"] * turns + q["turn"])

    def test_multi_turn_completions_and_think_time(self):
        turns, think = 3, 0.25
        with FakeServer("--ttft-ms", "2", "--itl-ms", "1", "--tokens", "2") as srv:
            doc, _ = self.run_bench(srv.port, "--conversations", "1", "--turns", str(turns), "--input-len", "4",
                                    "--output-len", "2", "--think-time", str(think), "--per-request")
            prompts = srv.stats()["prompts"]
        self.assertEqual(len(prompts), turns)
        for prev, cur in zip(prompts, prompts[1:]):
            # the transcript so far, the answer to its last turn, then a new user turn
            self.assertTrue(cur.startswith(prev + "tok tok \nUser: "), (prev, cur))
            self.assertTrue(cur.endswith("\nAssistant:"))
        busy = sum(q["e2e_ms"] for q in doc["requests"]) / 1e3
        # a think time between each answer and the next turn (sleeps only overrun)
        self.assertGreaterEqual(doc["results"]["duration_s"], busy + (turns - 1) * think - 0.002)

    def test_goodput_and_percentiles(self):
        slo_ttft, slo_tpot = 10000.0, 10000.0
        with FakeServer("--ttft-ms", "20", "--itl-ms", "5", "--tokens", "4", "--cycle", "ok,disconnect,ok") as srv:
            doc, table = self.run_bench(srv.port, "--concurrency", "2", "--num-requests", "12",
                                        "--goodput", "ttft:%g" % slo_ttft, "tpot:%g" % slo_tpot,
                                        "--per-request", expect_rc=0)
        r = doc["results"]
        self.assertEqual(r["failed"], 4)
        self.assertEqual(doc["config"]["goodput"], {"ttft_ms": slo_ttft, "tpot_ms": slo_tpot, "e2el_ms": None})
        good = [q for q in doc["requests"] if q["ok"] and q["ttft_ms"] <= slo_ttft and
                (q["e2e_ms"] - q["ttft_ms"]) / (q["output_tokens"] - 1) <= slo_tpot]
        self.assertEqual(r["goodput"]["good_requests"], len(good))
        self.assertEqual(len(good), 8)  # failed requests are never good
        self.assertAlmostEqual(r["goodput"]["requests_per_s"], len(good) / r["duration_s"], places=6)
        self.assertIn("Request goodput", table)
        ok = [q for q in doc["requests"] if q["ok"]]
        for name, values in (("ttft_ms", [q["ttft_ms"] for q in ok]),
                             ("e2e_ms", [q["e2e_ms"] for q in ok]),
                             ("itl_ms", [g for q in ok for g in q["itl_ms"]])):
            for key, pct in (("median", 50), ("p75", 75), ("p90", 90), ("p95", 95), ("p99", 99)):
                # per-request values are rounded to 10 significant digits in the JSON
                self.assertAlmostEqual(r[name][key], percentile(values, pct), places=3, msg=name + " " + key)
        # an objective no request meets: none is good
        with FakeServer("--ttft-ms", "20", "--itl-ms", "1", "--tokens", "2") as srv:
            doc, _ = self.run_bench(srv.port, "--num-requests", "3", "--goodput", "ttft:5,e2el:100000")
        self.assertEqual(doc["results"]["goodput"]["good_requests"], 0)

    def test_vllm_json_format(self):
        with FakeServer("--ttft-ms", "15", "--itl-ms", "4", "--tokens", "5") as srv:
            with tempfile.TemporaryDirectory() as d:
                out = os.path.join(d, "v.json")
                p = subprocess.run([BENCH, "--port", str(srv.port), "--json", out, "--json-format", "vllm",
                                    "--concurrency", "3", "--num-requests", "9", "--output-len", "5",
                                    "--input-len", "7", "--metric-percentiles", "50,75,95,99",
                                    "--goodput", "ttft:100000", "--quiet"],
                                   capture_output=True, text=True, timeout=60)
                self.assertEqual(p.returncode, 0, p.stderr)
                with open(out) as f:
                    v = json.load(f)
        for k in ("duration", "completed", "total_input_tokens", "total_output_tokens", "request_throughput",
                  "request_goodput", "output_throughput", "total_token_throughput", "input_lens", "output_lens",
                  "ttfts", "itls", "errors", "max_concurrency"):
            self.assertIn(k, v)
        self.assertEqual(v["completed"], 9)
        self.assertEqual(v["total_output_tokens"], 45)
        self.assertEqual(v["input_lens"], [7] * 9)
        self.assertAlmostEqual(v["request_throughput"], 9 / v["duration"], places=6)
        self.assertAlmostEqual(v["output_throughput"], sum(v["output_lens"]) / v["duration"], places=6)
        self.assertAlmostEqual(v["request_goodput"], 9 / v["duration"], places=6)
        ttft = [t * 1e3 for t in v["ttfts"]]
        itl = [g * 1e3 for gaps in v["itls"] for g in gaps]
        for name, values in (("ttft", ttft), ("itl", itl)):
            self.assertAlmostEqual(v["mean_%s_ms" % name], statistics.fmean(values), places=3)
            self.assertAlmostEqual(v["median_%s_ms" % name], statistics.median(values), places=3)
            self.assertAlmostEqual(v["std_%s_ms" % name], statistics.pstdev(values), places=3)
            for pct in (50, 75, 95, 99):
                self.assertAlmostEqual(v["p%d_%s_ms" % (pct, name)], percentile(values, pct), places=3)
        for k in ("mean_tpot_ms", "p99_tpot_ms", "median_e2el_ms", "p95_e2el_ms"):
            self.assertIn(k, v)

    def test_duration_mode(self):
        with FakeServer("--ttft-ms", "20", "--itl-ms", "10", "--tokens", "4") as srv:
            doc, _ = self.run_bench(srv.port, "--concurrency", "2", "--duration", "0.6")
        r = doc["results"]
        self.assertGreaterEqual(r["duration_s"], 0.6)
        self.assertLess(r["duration_s"], 0.6 + 1.0)
        self.assertGreaterEqual(r["completed"], 2)
        self.assertEqual(doc["config"]["num_requests"], None)

    def test_kserve(self):
        with FakeServer("--infer-ms", "30", "--expect-datatype", "INT32") as srv:
            doc, _ = self.run_bench(srv.port, "--api", "kserve", "--model", "m", "--shape", "2,3",
                                    "--datatype", "INT32", "--concurrency", "2",
                                    "--num-requests", "6")
            srv_e2e = statistics.median(t["e2e_ms"] for t in srv.stats()["timings"])
            bad, _ = self.run_bench(srv.port, "--api", "kserve", "--model", "m", "--shape", "4",
                                    "--datatype", "FP32", "--num-requests", "2", expect_rc=1)
        r = doc["results"]
        self.assertEqual(r["completed"], 6)
        self.assertNotIn("ttft_ms", r)
        self.assertGreaterEqual(r["e2e_ms"]["min"], 29)
        self.assertWithin(r["e2e_ms"]["median"], srv_e2e, 20, 0.15, "KServe latency median")
        self.assertEqual(doc["config"]["endpoint"], "/v2/models/m/infer")
        self.assertEqual(bad["results"]["errors"]["http_status"], {"400": 2})

    def test_sharegpt_dataset_and_api_key(self):
        convs = [
            {"conversations": [{"from": "human", "value": "What is a kernel?"},
                               {"from": "gpt", "value": "x" * 40}]},
            {"conversations": [{"from": "human", "value": "Name three rivers."},
                               {"from": "gpt", "value": "y" * 80}]},
            {"conversations": [{"from": "gpt", "value": "skipped: no human turn first"}]},
        ]
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "sharegpt.jsonl")
            with open(path, "w") as f:
                for c in convs:
                    f.write(json.dumps(c) + "\n")
            with FakeServer("--ttft-ms", "5", "--itl-ms", "1", "--tokens", "0",
                            "--require-key", "s3cret") as srv:
                doc, _ = self.run_bench(srv.port, "--dataset", path, "--num-requests", "4",
                                        "--api-key", "s3cret")
                st = srv.stats()
                with open(os.path.join(d, "r.json"), "w") as f:
                    json.dump(doc, f)
        self.assertEqual(sorted(set(st["prompts"])), ["Name three rivers.", "What is a kernel?"])
        r = doc["results"]
        self.assertEqual(r["completed"], 4)
        # --tokens 0: the server sends max_tokens chunks, sized from the reply (4 chars/token)
        self.assertEqual(r["output_tokens"], 2 * (10 + 20))
        self.assertEqual(r["input_tokens_source"], "estimated")
        self.assertNotIn("s3cret", json.dumps(doc))
        self.assertTrue(doc["config"]["api_key_set"])

    def test_interrupt_reports_what_finished(self):
        import signal
        import time
        with FakeServer("--ttft-ms", "50", "--itl-ms", "100", "--tokens", "12") as srv:
            for presses, want_rc in ((1, 0), (2, 1)):
                base = srv.stats()["requests"]
                with tempfile.TemporaryDirectory() as d:
                    out = os.path.join(d, "r.json")
                    p = subprocess.Popen([BENCH, "--port", str(srv.port), "--concurrency", "2",
                                          "--num-requests", "100", "--json", out, "--quiet"],
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                    # interrupt once both first requests are mid-stream (each takes ~1.2 s)
                    deadline = time.monotonic() + 10
                    while srv.stats()["requests"] < base + 2 and time.monotonic() < deadline:
                        time.sleep(0.02)
                    time.sleep(0.1)
                    for _ in range(presses):
                        p.send_signal(signal.SIGINT)
                        time.sleep(0.1)
                    _, err = p.communicate(timeout=20)
                    self.assertEqual(p.returncode, want_rc, err)
                    self.assertIn("interrupted", err)
                    with open(out) as f:
                        doc = json.load(f)
                self.validate(doc)
                r = doc["results"]
                self.assertTrue(r["interrupted"])
                self.assertEqual(r["failed"], 0)
                # one press: the two in flight finish and count; two: they are abandoned
                self.assertEqual(r["completed"], 2 if presses == 1 else 0)
                if presses == 1:
                    self.assertEqual(r["output_tokens"], 24)

    def test_bad_options(self):
        for args in (["--concurrency", "0"], ["--api", "grpc"], ["--url", "https://x"],
                     ["--shape", "1,-2", "--api", "kserve", "--model", "m"],
                     ["--extra-body", "[1]"], ["--concurrency", "2", "--request-rate", "3"],
                     ["--goodput", "ttft"], ["--goodput", "latency:5"], ["--goodput", "ttft:5", "tpot:x"],
                     ["--turns", "3"], ["--conversations", "2", "--num-requests", "4"],
                     ["--conversations", "2", "--request-rate", "1"], ["--json-format", "csv"],
                     ["--metric-percentiles", "0,50"]):
            p = subprocess.run([BENCH] + args, capture_output=True, text=True, timeout=20)
            self.assertEqual(p.returncode, 2, args)
            self.assertIn("servd-bench:", p.stderr)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True)
    ap.add_argument("--schema", required=True)
    opts, rest = ap.parse_known_args()
    BENCH, SCHEMA = opts.bench, opts.schema
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
