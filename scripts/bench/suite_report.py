#!/usr/bin/env python3
"""Summarizes a bench-suite run: prints the tables with servd/llama.cpp ratios, writes the "Server"
section of docs/performance.md (only the text between its markers) and the PNG plots via gnuplot.

Usage: suite_report.py --results DIR --doc FILE --img DIR [--title TEXT]
DIR holds what scripts/bench-suite.sh left there:
  server-<system>-c<N>.json   servd-bench --json output, <system> in servd, llama.cpp, fake
  decode-<system>.txt         single-stream decode tokens/s, one number per line (runs)
  kernels.txt                 bench_kernels output; its stream-read rate gives the roofline
  meta.json                   model, model_bytes, prompt lengths, threads, host
Python standard library only.
"""
import argparse
import glob
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys

BEGIN = "<!-- bench-suite:server:begin -->"
END = "<!-- bench-suite:server:end -->"


def load_server(results):
    runs = {}  # system -> {concurrency: result doc}
    for path in glob.glob(os.path.join(results, "server-*-c*.json")):
        m = re.match(r"server-(.+)-c(\d+)\.json$", os.path.basename(path))
        if not m:
            continue
        with open(path) as f:
            runs.setdefault(m.group(1), {})[int(m.group(2))] = json.load(f)
    return runs


def load_decode(results):
    out = {}
    for path in glob.glob(os.path.join(results, "decode-*.txt")):
        system = os.path.basename(path)[len("decode-"):-len(".txt")]
        vals = []
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    vals.append(float(line))
        if vals:
            out[system] = (statistics.median(vals), len(vals))
    return out


def read_bandwidth(results, model_bytes):
    """The stream-read rate (GB/s) bench_kernels measured for the buffer closest in size to the
    model: the memory bandwidth that bounds batch-1 decode. Columns are found by their headers
    ("MiB", "read GB/s"), so added columns do not matter."""
    path = os.path.join(results, "kernels.txt")
    if not os.path.exists(path) or not model_bytes:
        return None
    rows = []  # (MiB, GB/s)
    cols = None
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line.startswith("|"):
                cols = None
                continue
            cells = [c.strip() for c in line.strip("|").split("|")]
            if "MiB" in cells and "read GB/s" in cells:
                cols = (cells.index("MiB"), cells.index("read GB/s"))
                continue
            if cols and len(cells) > max(cols):
                try:
                    rows.append((float(cells[cols[0]]), float(cells[cols[1]])))
                except ValueError:
                    pass  # the |---| line
    if not rows:
        return None
    target = model_bytes / 2**20
    nearest = min(rows, key=lambda r: abs(math.log(r[0] / target)))[0]
    return max(g for m, g in rows if m == nearest)


def plot_decode(decode, roofline, img, gnuplot):
    os.makedirs(img, exist_ok=True)
    bars = [(s, decode[s][0]) for s in sorted(decode)]
    if roofline:
        bars.append(("roofline", roofline))
    dat = os.path.join(img, ".decode.dat")
    with open(dat, "w") as f:
        for i, (s, v) in enumerate(bars):
            f.write('%d "%s" %g\n' % (i, s, v))
    out = os.path.join(img, "decode-roofline.png")
    script = """
set terminal pngcairo size 640,420 font ',10'
set output '%s'
set title 'Single-stream decode against the memory roofline'
set ylabel 'tokens/s'
set yrange [0:%g]
set xrange [-0.6:%g]
set style fill solid 0.6
set boxwidth 0.6
set grid ytics
unset key
plot '%s' using 1:3:xtic(2) with boxes, '' using 1:3:(sprintf('%%.0f', $3)) with labels offset 0,1
""" % (out, 1.15 * max(v for _, v in bars), len(bars) - 0.4, dat)
    subprocess.run([gnuplot], input=script, text=True, check=True)
    os.remove(dat)
    return out


def fmt(v, digits=1):
    return "-" if v is None else ("%.*f" % (digits, v))


def ratio(a, b):
    return None if a is None or not b else a / b


def server_rows(runs, system, other):
    rows = []
    for c in sorted(runs.get(system, {})):
        r = runs[system][c]["results"]
        o = runs.get(other, {}).get(c, {}).get("results") if other else None
        rows.append({
            "c": c, "ok": r["completed"], "failed": r["failed"],
            "rps": r["requests_per_s"], "tps": r.get("output_tokens_per_s"),
            "ttft50": r["ttft_ms"]["median"], "ttft99": r["ttft_ms"]["p99"],
            "tpot50": r["tpot_ms"]["median"], "itl99": r["itl_ms"]["p99"],
            "e2e99": r["e2e_ms"]["p99"],
            "other_tps": o.get("output_tokens_per_s") if o else None,
            "other_ttft99": o["ttft_ms"]["p99"] if o else None,
        })
    return rows


def server_table(rows, system, other):
    head = ("| concurrency | requests ok/failed | req/s | output tok/s | TTFT p50 / p99 (ms) "
            "| TPOT p50 (ms) | ITL p99 (ms) | E2E p99 (ms) |")
    sep = "|---:|---:|---:|---:|---:|---:|---:|---:|"
    if other:
        head += " %s output tok/s | throughput ratio %s / %s | TTFT p99 ratio |" % (other, system, other)
        sep += "---:|---:|---:|"
    lines = [head, sep]
    for r in rows:
        line = "| %d | %d/%d | %s | %s | %s / %s | %s | %s | %s |" % (
            r["c"], r["ok"], r["failed"], fmt(r["rps"], 2), fmt(r["tps"]), fmt(r["ttft50"]),
            fmt(r["ttft99"]), fmt(r["tpot50"]), fmt(r["itl99"]), fmt(r["e2e99"]))
        if other:
            line += " %s | %s | %s |" % (fmt(r["other_tps"]), fmt(ratio(r["tps"], r["other_tps"]), 2),
                                          fmt(ratio(r["ttft99"], r["other_ttft99"]), 2))
        lines.append(line)
    return "\n".join(lines)


def plot(runs, img, gnuplot):
    """Throughput and p99 latency against concurrency, one line per system."""
    os.makedirs(img, exist_ok=True)
    data_dir = os.path.join(img, ".data")
    os.makedirs(data_dir, exist_ok=True)
    series = []
    for system in sorted(runs):
        path = os.path.join(data_dir, system + ".dat")
        with open(path, "w") as f:
            f.write("# concurrency out_tok_s ttft_p99_ms e2e_p99_ms\n")
            for c in sorted(runs[system]):
                r = runs[system][c]["results"]
                f.write("%d %g %g %g\n" % (c, r.get("output_tokens_per_s", 0), r["ttft_ms"]["p99"],
                                           r["e2e_ms"]["p99"]))
        series.append((system, path))
    if not series:
        return []
    outs = [os.path.join(img, "server-throughput.png"), os.path.join(img, "server-p99-latency.png")]
    tput = ", ".join("'%s' using 1:2 with linespoints title '%s'" % (p, s) for s, p in series)
    lat = ", ".join("'%s' using 1:3 with linespoints title '%s TTFT p99', '%s' using 1:4 with "
                    "linespoints dashtype 2 title '%s E2E p99'" % (p, s, p, s) for s, p in series)
    script = """
set terminal pngcairo size 800,500 font ',10'
set logscale x 2
set grid
set key top left
set xlabel 'concurrent requests'
set output '%s'
set title 'Output token throughput'
set ylabel 'output tokens/s'
set yrange [0:*]
plot %s
set output '%s'
set title 'p99 latency'
set ylabel 'ms'
set logscale y
set yrange [*:*]
plot %s
""" % (outs[0], tput, outs[1], lat)
    subprocess.run([gnuplot], input=script, text=True, check=True)
    shutil.rmtree(data_dir)
    return outs


def replace_section(doc, text):
    old = ""
    if os.path.exists(doc):
        with open(doc) as f:
            old = f.read()
    block = BEGIN + "\n" + text.rstrip("\n") + "\n" + END
    if BEGIN in old and END in old and old.index(BEGIN) < old.index(END):
        new = old[:old.index(BEGIN)] + block + old[old.index(END) + len(END):]
    else:
        if not old:
            old = "# Performance\n"
        new = old.rstrip("\n") + "\n\n" + block + "\n"
    os.makedirs(os.path.dirname(os.path.abspath(doc)), exist_ok=True)
    with open(doc, "w") as f:
        f.write(new)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--results", required=True)
    ap.add_argument("--doc", required=True)
    ap.add_argument("--img", required=True)
    ap.add_argument("--img-ref", default="img", help="image folder as the doc links it")
    args = ap.parse_args()
    meta = {}
    if os.path.exists(os.path.join(args.results, "meta.json")):
        with open(os.path.join(args.results, "meta.json")) as f:
            meta = json.load(f)
    runs = load_server(args.results)
    decode = load_decode(args.results)

    primary = next((s for s in ("servd", "llama.cpp", "fake") if s in runs), None)
    other = "llama.cpp" if "llama.cpp" in runs and primary == "servd" else None

    parts = ["## Server", ""]
    parts.append("Written by `THREADS=%s scripts/bench-suite.sh%s` on %s (%s). Load: `servd-bench`, "
                 "random prompts of %s tokens in and %s out (`ignore_eos`), output tokens counted "
                 "one per streamed chunk, %s. Each row is one run at that concurrency; the machine "
                 "may be shared, so compare ratios measured in the same run rather than absolute "
                 "numbers across runs." % (
                     meta.get("threads", "?"), " --smoke" if meta.get("smoke") else "",
                     meta.get("date", "?"), meta.get("host", "?"), meta.get("input_len", "?"),
                     meta.get("output_len", "?"),
                     "warm-up of one request per connection excluded"))
    parts.append("")
    if meta.get("model"):
        parts.append("Model: %s." % meta["model"])
        parts.append("")
    if meta.get("llama_version") and ("llama.cpp" in runs or "llama.cpp" in decode):
        parts.append("llama.cpp: version %s (vendored in llama-cpp-python, built by "
                     "`scripts/bench/build-llama-cpp.sh`), same GGUF, same threads, %s." % (
                         meta["llama_version"],
                         "extra arguments `%s`" % meta["llama_args"] if meta.get("llama_args")
                         else "default settings"))
        parts.append("")
    gnuplot = shutil.which("gnuplot")
    if decode:
        mbytes = meta.get("model_bytes") or 0
        bw = read_bandwidth(args.results, mbytes)
        roofline = bw * 1e9 / mbytes if bw and mbytes else None
        parts.append("### Single-stream decode")
        parts.append("")
        parts.append("| system | decode tokens/s (median) | runs | ratio to llama.cpp | share of roofline |")
        parts.append("|---|---:|---:|---:|---:|")
        base = decode.get("llama.cpp", (None, 0))[0]
        for system in sorted(decode):
            med, n = decode[system]
            parts.append("| %s | %.1f | %d | %s | %s |" % (
                system, med, n, fmt(ratio(med, base), 2) if system != "llama.cpp" else "1.00",
                fmt(ratio(med, roofline), 2)))
        parts.append("")
        if roofline:
            parts.append("Roofline: every weight byte read once per token at the stream-read rate "
                         "`bench_kernels` measured in this run for the buffer nearest the model's "
                         "size (%.1f GB/s), for a %.1f MiB model: %.0f tokens/s. (A model this small "
                         "partly fits in a large last-level cache, which can lift decode above it.)"
                         % (bw, mbytes / 2**20, roofline))
            parts.append("")
        if gnuplot:
            p = plot_decode(decode, roofline, args.img, gnuplot)
            parts.append("![decode-roofline](%s/%s)" % (args.img_ref, os.path.basename(p)))
            parts.append("")
    if primary:
        parts.append("### Throughput and latency against concurrency (%s)" % primary)
        parts.append("")
        parts.append(server_table(server_rows(runs, primary, other), primary, other))
        parts.append("")
        if other:
            parts.append("### %s alone" % other)
            parts.append("")
            parts.append(server_table(server_rows(runs, other, None), other, None))
            parts.append("")
    else:
        parts.append("No server was measured in this run.")
        parts.append("")
    pngs = plot(runs, args.img, gnuplot) if gnuplot and runs else []
    for p in pngs:
        parts.append("![%s](%s/%s)" % (os.path.basename(p)[:-4], args.img_ref, os.path.basename(p)))
    if pngs:
        parts.append("")
    if not gnuplot:
        parts.append("(gnuplot was not found, so no plots.)")
    text = "\n".join(parts)
    print(text)
    replace_section(args.doc, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
