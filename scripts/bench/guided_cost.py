#!/usr/bin/env python3
"""What constrained decoding costs: output tokens per second of the same chat requests, free and
under a grammar, at 1 and at 32 concurrent streams, on one servd, in the same run, alternating
rounds (free, constrained, constrained, free, ...).

    scripts/bench/guided_cost.py --servd build/daemon/servd [--mpk .cache/smollm2-135m-instruct-q4_1.mpk]
        [--streams 1,32] [--rounds 5] [--max-tokens 64]

Every request generates exactly --max-tokens tokens (ignore_eos), so both sides decode the same
number of tokens and only the grammar differs. The grammars are ones that never force the end:
a regex of words (`guided_regex`), a JSON array of at least 200 records with free-length strings
(the common case, where llguidance's slicer answers inside a string at once) and a JSON array of at
least 200 strings of at most 12 characters (the costly case: a bounded string makes llguidance
walk the whole token trie, ~0.2-0.3 ms a row), each computing a 49152-bit token mask per row per
step, as any constrained request does. The masks are computed while the step's forward runs
(daemon/engine/guide.h); the script prints servd_guided_wait_seconds_total, what steps still waited. Prints each round, the medians and the ratio constrained / free
(1.0 is free of cost; the target is >= 0.90).
"""
import argparse
import concurrent.futures
import http.client
import os
import statistics
import sys
import time

from bench_http import post, server

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROMPTS = ["List some fruits.", "Name animals of the forest.", "Which colours are in a rainbow?",
           "Write words about the sea.", "What do people eat for breakfast?", "Name cities in Europe.",
           "Which tools does a carpenter use?", "List musical instruments."]
GRAMMARS = {
    "regex": {"guided_regex": "([a-z]+ )+"},
    "json_records": {"response_format": {"type": "json_schema", "json_schema": {
        "name": "records", "schema": {"type": "array", "minItems": 200, "items": {
            "type": "object", "properties": {"name": {"type": "string"}, "note": {"type": "string"}},
            "required": ["name", "note"], "additionalProperties": False}}}}},
    "json_short_strings": {"response_format": {"type": "json_schema", "json_schema": {
        "name": "words", "schema": {"type": "array", "minItems": 200, "items": {"type": "string", "maxLength": 12}}}}},
}


def body(i, max_tokens, grammar):
    b = {"model": "m", "messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
         "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    b.update(GRAMMARS.get(grammar, {}))
    return b


def one_round(port, streams, max_tokens, grammar):
    """streams requests at once; output tokens per second over the round's wall time."""
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(streams) as ex:
        rs = list(ex.map(lambda i: post(port, "/v1/chat/completions", body(i, max_tokens, grammar)), range(streams)))
    dt = time.perf_counter() - t0
    tokens = sum(r["usage"]["completion_tokens"] for r in rs)
    if tokens != streams * max_tokens:
        sys.exit(f"{grammar}: {tokens} tokens, expected {streams * max_tokens} (a grammar ended a request early)")
    return tokens / dt


def guided_metrics(port):
    """servd's constrained-decoding counters: masks computed, seconds computing, seconds waited."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    c.close()
    names = {"servd_guided_rows_total": "rows", "servd_guided_mask_seconds_total": "mask",
             "servd_guided_wait_seconds_total": "wait"}
    out = {v: 0.0 for v in names.values()}
    for line in text.splitlines():
        name = line.split("{")[0]
        if name in names:
            out[names[name]] += float(line.rsplit(" ", 1)[1])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--servd", required=True)
    ap.add_argument("--mpk", default=os.path.join(ROOT, ".cache/smollm2-135m-instruct-q4_1.mpk"))
    ap.add_argument("--streams", default="1,32")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--port", type=int, default=18941)
    a = ap.parse_args()
    deps = os.environ.get("SERVD_PY_DEPS") or os.path.join(os.path.dirname(os.path.dirname(a.servd)), "python-deps")
    env = dict(os.environ, SERVD_PY_DEPS=deps)
    argv = [a.servd, "--host", "127.0.0.1", "--port", str(a.port), "--model", a.mpk + ":m"]
    with server(argv, a.port, "/v2/health/ready", env):
        for streams in (int(s) for s in a.streams.split(",")):
            kinds = ["free"] + list(GRAMMARS)
            for k in kinds:  # warm-up: grammar compile caches, buffers at this batch size
                one_round(a.port, streams, 8, k)
            rates = {k: [] for k in kinds}
            for r in range(a.rounds):
                for k in kinds if r % 2 == 0 else reversed(kinds):
                    rates[k].append(one_round(a.port, streams, a.max_tokens, k))
                    print(f"streams {streams:3d} round {r} {k:12s} {rates[k][-1]:8.1f} tok/s", flush=True)
            free = statistics.median(rates["free"])
            line = " ".join(f"{k} {statistics.median(rates[k]):.1f} tok/s ({statistics.median(rates[k]) / free:.2f}x)"
                            for k in GRAMMARS)
            print(f"streams {streams}: median free {free:.1f} tok/s, {line}", flush=True)
            m = guided_metrics(a.port)
            print(f"streams {streams}: so far {m['rows']:.0f} masks, {m['mask']:.2f} s computing them beside the "
                  f"forward, {m['wait']:.3f} s waited for after it", flush=True)


if __name__ == "__main__":
    main()
