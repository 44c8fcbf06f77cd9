"""deploy/servd.service: StartLimit* in [Unit] (in [Service] systemd ignores them and a config
error restarts for ever), no restart on a configuration error, and `systemd-analyze verify` clean
(skipped with the reason where systemd-analyze is missing)."""
import argparse
import os
import shutil
import subprocess
import sys

p = argparse.ArgumentParser()
p.add_argument("--servd", required=True)
p.add_argument("--source", required=True)
p.add_argument("--work", required=True)
a = p.parse_args()
unit_path = os.path.join(a.source, "deploy", "servd.service")


def fail(msg):
    print(f"FAIL: {msg}")
    sys.exit(1)


def sections(text):
    """{section: {key: value}} of a unit file (the last assignment of a key wins, as in systemd)."""
    out, cur = {}, None
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            cur = out.setdefault(line[1:-1], {})
        elif "=" in line and cur is not None:
            k, v = line.split("=", 1)
            cur[k.strip()] = v.strip()
    return out


unit = open(unit_path).read()
s = sections(unit)
for key in ("StartLimitIntervalSec", "StartLimitBurst"):
    if key not in s.get("Unit", {}):
        fail(f"{key} is not in [Unit]")
    if key in s.get("Service", {}):
        fail(f"{key} is in [Service], where systemd ignores it")
if s["Service"].get("Restart") != "on-failure" or "2" not in s["Service"].get("RestartPreventExitStatus", "").split():
    fail("expected Restart=on-failure with RestartPreventExitStatus=2 (a configuration error is not retried)")
if not s["Service"].get("ExecStart", "").startswith("/usr/local/bin/servd "):
    fail("ExecStart does not run /usr/local/bin/servd")

tool = shutil.which("systemd-analyze")
if not tool:
    print("SKIP: systemd-analyze is missing (the static checks above passed)")
    sys.exit(77)
# verify also checks that ExecStart's program exists: point it at the servd built here.
os.makedirs(a.work, exist_ok=True)
copy = os.path.join(a.work, "servd.service")
with open(copy, "w") as f:
    f.write(unit.replace("/usr/local/bin/servd", os.path.abspath(a.servd)))
r = subprocess.run([tool, "verify", "--man=no", copy], capture_output=True, text=True)
out = (r.stdout + r.stderr).strip()
if r.returncode != 0 or out:
    fail(f"systemd-analyze verify (exit {r.returncode}):\n{out}")
print("ok")
