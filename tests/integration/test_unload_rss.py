"""Repository load/infer/unload cycles of an in-process generic model must not make servd grow.

Each unload used to leave ~0.43 MiB of RSS behind (docs/performance.md, Reliability): the thread that
started and finalized the interpreter ended after every unload, and the namespace's libc, which never
runs its thread cleanup for host threads, kept that thread's arena and cached chunks. Here: warm-up
cycles, then CYCLES more, and servd's RSS may grow by at most BOUND_MIB per cycle over them.
"""
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from servd_harness import Servd, check, example_package, parse_args  # noqa: E402

WARMUP, CYCLES = 5, 20
BOUND_MIB = 0.15  # per cycle; before the fix 0.4-0.45, after it about 0.03 (CPython's own per finalize)

a = parse_args()
src = example_package(a, "mlp_classifier")
repo = os.path.join(a.work, "repo-unload-rss")
os.makedirs(repo, exist_ok=True)
shutil.copy(src, os.path.join(repo, "cycler.mpk"))
s = Servd(a, ["--model-repository", repo])


def rss_kib():
    with open(f"/proc/{s.proc.pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


req = {"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32", "data": [0.5] * 64}]}


def cycle():
    st, _, data = s.request("POST", "/v2/repository/models/cycler/load")
    check(st == 200, f"load: {st} {data}")
    st, body = s.json("POST", "/v2/models/cycler/infer", req)
    check(st == 200, f"infer: {st} {body}")
    st, _, data = s.request("POST", "/v2/repository/models/cycler/unload")
    check(st == 200, f"unload: {st} {data}")


for _ in range(WARMUP):
    cycle()
time.sleep(0.2)
before = rss_kib()
t0 = time.monotonic()
for _ in range(CYCLES):
    cycle()
time.sleep(0.2)
after = rss_kib()
per_cycle = (after - before) / 1024 / CYCLES
print(f"RSS {before / 1024:.1f} -> {after / 1024:.1f} MiB over {CYCLES} cycles: {per_cycle:.3f} MiB per cycle "
      f"({(time.monotonic() - t0) / CYCLES * 1000:.0f} ms per cycle)")
check(per_cycle < BOUND_MIB, f"servd grew by {per_cycle:.3f} MiB per load/unload cycle (bound {BOUND_MIB})")
rc = s.stop(timeout=60)
check(rc == 0, f"SIGTERM: exit status {rc}\n{s.stderr()}")
print("OK")
