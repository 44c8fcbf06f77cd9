"""Tensor parallelism over HTTP when one rank's forward raises: that request gets a 500 (code
"model_error", the exception in the message) instead of hanging the engine, and the server keeps
serving: the same greedy request gives the same text before and after (the oracle for "the ranks'
communicator was reset"). The package is `modelpkg synth tiny` packed with the project's Llama code
plus a subclass that raises on rank 1 for a prompt step of exactly 13 tokens."""
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from servd_harness import Servd, check, parse_args, skip  # noqa: E402

FAULTY_PY = """\
import servd
from .model import LlamaModel


class Faulty(LlamaModel):
    def forward(self, batch):
        if servd.rank() == 1 and batch.n_tokens == 13:
            raise RuntimeError("injected failure on rank 1")
        return super().forward(batch)
"""

a = parse_args()
if not a.modelpkg or not os.access(a.modelpkg, os.X_OK):
    skip("modelpkg was not built")
src_code = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "models", "llama")
hf = os.path.join(a.work, "tp-fault-hf")
code = os.path.join(a.work, "tp-fault-code", "llama")
pkg = os.path.join(a.work, "tp-fault.mpk")
shutil.rmtree(os.path.dirname(code), ignore_errors=True)
shutil.copytree(src_code, code, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
with open(os.path.join(code, "faulty.py"), "w") as f:
    f.write(FAULTY_PY)
for cmd in ([a.modelpkg, "synth", "tiny", "--dtype", "f32", "--hf-out", hf, "--quiet"],
            [a.modelpkg, "pack", hf, "-o", pkg, "--code", code, "--entry-point", "llama.faulty:Faulty",
             "--dtype", "f32", "--quiet"]):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    check(r.returncode == 0, f"{' '.join(cmd)}: {r.stderr}")

s = Servd(a, ["--model", f"{pkg}:tp", "--tp", "2"])


def complete(ids):
    return s.json("POST", "/v1/completions", {"model": "tp", "prompt": ids, "max_tokens": 6, "temperature": 0})


st, before = complete([3, 4, 5, 6, 7])
check(st == 200, f"before: {st} {before}")
for attempt in range(2):
    st, body = complete(list(range(3, 16)))  # 13 tokens: rank 1 raises in the prefill step
    check(st == 500, f"rank failure: expected 500, got {st} {body}")
    err = body["error"]
    check(err["code"] == "model_error" and err["type"] == "server_error", f"error shape: {body}")
    check("injected failure on rank 1" in err["message"] and "RuntimeError" in err["message"], f"message: {body}")
    st, after = complete([3, 4, 5, 6, 7])
    check(st == 200, f"after the failure: {st} {after}")
    check(after["choices"][0]["text"] == before["choices"][0]["text"],
          f"text changed after the failure: {before['choices'][0]['text']!r} -> {after['choices'][0]['text']!r}")
check(s.request("GET", "/v2/health/ready")[0] == 200, "ready after the failures")
rc = s.stop()
check(rc == 0, f"SIGTERM: exit status {rc}")
print("OK")
