#!/usr/bin/env python3
"""KServe infer latency of one generic package served in-process and with process isolation, in one
servd, in the same run: requests alternate between the two names (one keep-alive connection, one
request at a time), so both see the same machine load. Prints the median and p90 of each.

  scripts/bench/isolation_latency.py --servd build/daemon/servd --package build/models/mlp_classifier.mpk
"""
import argparse
import http.client
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

from bench_http import listening_port


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--servd", required=True)
    p.add_argument("--package", required=True)
    p.add_argument("--requests", type=int, default=200, help="per variant")
    p.add_argument("--rows", type=int, default=1)
    p.add_argument("--cols", type=int, default=64, help="features per row (mlp_classifier: 64)")
    a = p.parse_args()
    cfg = os.path.join(tempfile.mkdtemp(prefix="servd-iso-bench-"), "servd.json")
    with open(cfg, "w") as f:
        json.dump({"models": [{"path": a.package, "name": "inproc"},
                              {"path": a.package, "name": "isolated", "isolation": "process"}],
                   "access_log": "off"}, f)
    proc = subprocess.Popen([a.servd, "--config", cfg, "--port", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        port = listening_port(proc)
        if port is None:
            sys.exit("servd did not start")
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        deadline = time.monotonic() + 120
        while True:
            conn.request("GET", "/v2/health/ready")
            r = conn.getresponse()
            r.read()
            if r.status == 200:
                break
            if time.monotonic() > deadline:
                sys.exit("servd not ready")
            time.sleep(0.1)
        rng = random.Random(1)
        data = [rng.uniform(-1, 1) for _ in range(a.rows * a.cols)]
        body = json.dumps({"inputs": [{"name": "x", "shape": [a.rows, a.cols], "datatype": "FP32", "data": data}]})
        lat = {"inproc": [], "isolated": []}
        for i in range(20 + a.requests):  # 10 warm-up requests each
            for name in ("inproc", "isolated") if i % 2 == 0 else ("isolated", "inproc"):
                t0 = time.perf_counter()
                conn.request("POST", f"/v2/models/{name}/infer", body, {"Content-Type": "application/json"})
                r = conn.getresponse()
                out = r.read()
                dt = time.perf_counter() - t0
                if r.status != 200:
                    sys.exit(f"{name}: {r.status} {out[:200]}")
                if i >= 20:
                    lat[name].append(dt * 1e3)
        for name, v in lat.items():
            v.sort()
            print(f"{name:9s} n={len(v)} median {statistics.median(v):.3f} ms  p90 {v[int(0.9 * len(v))]:.3f} ms  "
                  f"min {v[0]:.3f} ms")
        d = statistics.median(lat["isolated"]) - statistics.median(lat["inproc"])
        print(f"isolation adds {d * 1e3:.0f} us to the median")
    finally:
        proc.terminate()
        proc.wait(timeout=60)


if __name__ == "__main__":
    main()
