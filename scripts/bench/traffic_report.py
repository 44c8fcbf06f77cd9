#!/usr/bin/env python3
"""Ratios and targets of scripts/bench/traffic.sh from its servd-bench JSON results.

  traffic_report.py --one FILE     one line: req/s, output tok/s, TTFT p50, ITL p50/p99
  traffic_report.py [--ms MS] DIR  the table: each load's two sides, medians over rounds, ratios
                                   and whether each target holds
"""
import argparse
import glob
import json
import os
import re
import statistics
import sys


def load(path):
    with open(path) as f:
        r = json.load(f)["results"]
    return {"rps": r["requests_per_s"], "tps": r["output_tokens_per_s"], "ttft50": r["ttft_ms"]["median"],
            "itl50": r["itl_ms"]["median"], "itl99": r["itl_ms"]["p99"], "tpot50": r["tpot_ms"]["median"],
            "failed": r["failed"], "completed": r["completed"]}


def one_line(m):
    return ("%d ok, %d failed, %.3f req/s, %.1f out tok/s, TTFT p50 %.0f ms, ITL p50 %.1f p99 %.1f ms, "
            "TPOT p50 %.1f ms" % (m["completed"], m["failed"], m["rps"], m["tps"], m["ttft50"], m["itl50"],
                                   m["itl99"], m["tpot50"]))


def rounds(d, prefix):
    """{round: metrics} for files named prefix-<round>.json."""
    out = {}
    for p in glob.glob(os.path.join(d, prefix + "-*.json")):
        m = re.search(r"-(\d+)\.json$", p)
        if m:
            out[int(m.group(1))] = load(p)
    return out


def paired(d, a, b, f):
    """Median over rounds of f(metrics_a, metrics_b), over rounds that have both; None without any."""
    ra, rb = rounds(d, a), rounds(d, b)
    vals = [f(ra[k], rb[k]) for k in sorted(ra) if k in rb]
    return (statistics.median(vals), len(vals)) if vals else (None, 0)


def median_of(d, name, key):
    r = rounds(d, name)
    return statistics.median(m[key] for m in r.values()) if r else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--one")
    ap.add_argument("--ms", default="100")
    ap.add_argument("dir", nargs="?")
    a = ap.parse_args()
    if a.one:
        print(one_line(load(a.one)))
        return 0
    d = a.dir
    rows = []

    def check(name, value, target, ok, n, detail):
        rows.append((name, "-" if value is None else "%.3g" % value, target,
                     "-" if value is None else ("yes" if ok(value) else "NO"), n, detail))

    v, n = paired(d, "shared-servd", "shared-llama", lambda s, l: s["rps"] / l["rps"])
    check("shared: req/s servd / llama-server", v, ">= 3", lambda x: x >= 3, n,
          "servd %s, llama %s req/s" % (fmt(median_of(d, "shared-servd", "rps")), fmt(median_of(d, "shared-llama", "rps"))))
    t = median_of(d, "shared-servd", "ttft50")
    check("shared: servd TTFT p50 (s)", None if t is None else t / 1e3, "<= 0.25", lambda x: x <= 0.25,
          len(rounds(d, "shared-servd")), "llama TTFT p50 %s ms" % fmt(median_of(d, "shared-llama", "ttft50")))
    v, n = paired(d, "chat-servd", "chat-llama", lambda s, l: s["rps"] / l["rps"])
    check("chat: req/s servd / llama-server", v, ">= 2", lambda x: x >= 2, n,
          "servd %s, llama %s req/s" % (fmt(median_of(d, "chat-servd", "rps")), fmt(median_of(d, "chat-llama", "rps"))))
    b, u = "streams-ms%s" % a.ms, "streams-ms0"
    r = rounds(d, b)
    v = statistics.median(m["itl99"] / m["itl50"] for m in r.values()) if r else None
    check("streams: ITL p99 / p50 (bounded)", v, "<= 3", lambda x: x <= 3, len(r),
          "unbounded: %s" % fmt(statistics.median(m["itl99"] / m["itl50"] for m in rounds(d, u).values())
                                if rounds(d, u) else None))
    v, n = paired(d, b, u, lambda x, y: x["tps"] / y["tps"])
    check("streams: output tok/s bounded / unbounded", v, ">= 0.9", lambda x: x >= 0.9, n,
          "%s vs %s tok/s" % (fmt(median_of(d, b, "tps")), fmt(median_of(d, u, "tps"))))
    v, n = paired(d, "miss-on", "miss-off", lambda x, y: x["tpot50"] / y["tpot50"] - 1)
    check("miss: TPOT p50 cache on / off - 1", v, "< 0.02", lambda x: x < 0.02, n,
          "%s vs %s ms" % (fmt(median_of(d, "miss-on", "tpot50")), fmt(median_of(d, "miss-off", "tpot50"))))
    book = []
    for p in sorted(glob.glob(os.path.join(d, "book-*.txt"))):
        with open(p) as f:
            kv = dict(l.split() for l in f if l.strip())
        book.append(float(kv["bookkeeping_ns_per_step"]))
    step = median_of(d, "miss-off", "tpot50")
    v = statistics.median(book) / (step * 1e6) if book and step else None
    check("miss: scheduler bookkeeping / decode step", v, "< 0.02", lambda x: x < 0.02, len(book),
          "%s ns a step (cache on - off, no model) / TPOT p50 %s ms" % (fmt(statistics.median(book) if book else None),
                                                                      fmt(step)))
    print("| measure | value | target | met | rounds | detail |")
    print("|---|---:|---|---|---:|---|")
    for row in rows:
        print("| %s | %s | %s | %s | %d | %s |" % row)
    return 0


def fmt(x):
    return "-" if x is None else "%.3g" % x


if __name__ == "__main__":
    sys.exit(main())
