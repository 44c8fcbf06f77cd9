#!/usr/bin/env python3
"""Summarises a GGUF type sweep (gguf_sweep.sh's sweep.tsv) as a Markdown table: per type the
package / GGUF size and the medians of servd's and llama-bench's decode and prefill tok/s with their
ratios. With --doc FILE the table replaces the text between "<!-- bench-suite:SECTION:begin -->" and
"<!-- bench-suite:SECTION:end -->" there (appended under --title when the markers are missing).

    gguf_sweep_report.py SWEEP.tsv [--doc docs/performance.md] [--note TEXT] [--section gguf]
        [--title "GGUF types: ..."] [--command "scripts/bench-suite.sh --gguf sweep"]
"""
import argparse
import statistics
import time
from collections import defaultdict



def load(path):
    vals = defaultdict(list)
    order = []
    for line in open(path):
        parts = line.rstrip("\n").split("\t")
        if len(parts) != 4:
            continue
        t, metric, system, v = parts
        if t not in order:
            order.append(t)
        vals[(t, metric, system)].append(float(v))
    return order, vals


def med(vals, key):
    v = vals.get(key)
    return statistics.median(v) if v else None


def fmt(v, digits=1):
    return "-" if v is None else f"{v:.{digits}f}"


def ratio(a, b):
    return None if a is None or not b else a / b


def table(order, vals):
    rows = ["| type | GGUF MB | package / GGUF | servd decode tok/s | llama.cpp decode tok/s | decode ratio "
            "| servd prefill tok/s | llama.cpp pp512 tok/s | prefill ratio | rounds |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for t in order:
        g, p = med(vals, (t, "gguf_bytes", "-")), med(vals, (t, "package_bytes", "-"))
        sd, ld = med(vals, (t, "decode", "servd")), med(vals, (t, "decode", "llama.cpp"))
        sp, lp = med(vals, (t, "prefill", "servd")), med(vals, (t, "prefill", "llama.cpp"))
        n = len(vals.get((t, "decode", "servd"), []))
        rows.append(f"| {t} | {fmt(g and g / 1e6)} | {fmt(ratio(p, g), 3)} | {fmt(sd)} | {fmt(ld)} | "
                    f"{fmt(ratio(sd, ld), 2)}x | {fmt(sp)} | {fmt(lp)} | {fmt(ratio(sp, lp), 2)}x | {n} |")
    return "\n".join(rows)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tsv")
    ap.add_argument("--doc")
    ap.add_argument("--note", default="")
    ap.add_argument("--section", default="gguf", help="the name in the doc's bench-suite markers")
    ap.add_argument("--title", default="GGUF types: size, decode and prefill against llama.cpp")
    ap.add_argument("--command", default="scripts/bench-suite.sh --gguf sweep", help="what made the figures")
    a = ap.parse_args()
    begin, end = f"<!-- bench-suite:{a.section}:begin -->", f"<!-- bench-suite:{a.section}:end -->"
    order, vals = load(a.tsv)
    text = table(order, vals)
    print(text)
    if not a.doc:
        return
    prompt = med(vals, (order[0], "prompt_tokens", "servd")) if order else None
    body = "\n".join([
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by `{a.command}`."
        + (f" {a.note}" if a.note else ""),
        f"Medians over rounds; servd's prefill prompt is {fmt(prompt, 0)} tokens (prompt tokens over the time to "
        "the first token), llama.cpp's is llama-bench pp512; decode is 128 tokens (servd after a 5-token prompt, "
        "llama-bench tg128).", "", text])
    doc = open(a.doc).read() if __import__("os").path.exists(a.doc) else ""
    block = begin + "\n" + body + "\n" + end
    if begin in doc and end in doc and doc.index(begin) < doc.index(end):
        doc = doc[:doc.index(begin)] + block + doc[doc.index(end) + len(end):]
    else:
        doc = doc.rstrip("\n") + f"\n\n## {a.title}\n\n" + block + "\n"
    open(a.doc, "w").write(doc)


if __name__ == "__main__":
    main()
