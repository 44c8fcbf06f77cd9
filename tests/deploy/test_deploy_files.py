"""deploy/kubernetes/servd.yaml and deploy/docker-entrypoint.sh: the probes point where they
should, the ConfigMap's servd.json is a config servd accepts, /metrics is scraped without the API key,
and the image's entry point serves every package of its folder when given no arguments."""
import argparse
import json
import os
import shutil
import subprocess
import sys

p = argparse.ArgumentParser()
p.add_argument("--servd", required=True)
p.add_argument("--source", required=True)
p.add_argument("--work", required=True)
a = p.parse_args()
shutil.rmtree(a.work, ignore_errors=True)
os.makedirs(a.work)


def fail(msg):
    print(f"FAIL: {msg}")
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)


# ---- the image's entry point, with stand-ins for servd and modelpkg that print their arguments ----
bindir = os.path.join(a.work, "bin")
os.makedirs(bindir)
for name in ("servd", "modelpkg"):
    path = os.path.join(bindir, name)
    with open(path, "w") as f:
        f.write(f"#!/bin/sh\necho {name}; for x in \"$@\"; do echo \"$x\"; done\n")
    os.chmod(path, 0o755)
entry = os.path.join(a.source, "deploy", "docker-entrypoint.sh")
models = os.path.join(a.work, "models")
os.makedirs(models)


def run(*args):
    env = dict(os.environ, SERVD_BIN_DIR=bindir, SERVD_MODELS=models)
    r = subprocess.run(["/bin/sh", entry, *args], capture_output=True, text=True, env=env)
    return r.returncode, r.stdout.splitlines(), r.stderr


rc, out, err = run()
check(rc == 2 and "no packages" in err, f"no packages: exit {rc}, {err!r}")
for n in ("b", "a"):
    open(os.path.join(models, f"{n}.mpk"), "w").close()
open(os.path.join(models, "notes.txt"), "w").close()
rc, out, err = run()
check(rc == 0 and out[0] == "servd", f"default command: {rc} {out} {err}")
args = out[1:]
check(args[:6] == ["--host", "0.0.0.0", "--port", "8000", "--model-repository", models], f"default flags: {args}")
check(args[6:] == ["--model", f"{models}/a.mpk:a", "--model", f"{models}/b.mpk:b"], f"default models: {args}")
rc, out, _ = run("modelpkg", "pack", "x.gguf", "-o", "x.mpk")
check(rc == 0 and out == ["modelpkg", "pack", "x.gguf", "-o", "x.mpk"], f"modelpkg: {out}")
rc, out, _ = run("--port", "9000")
check(rc == 0 and out == ["servd", "--port", "9000"], f"flags: {out}")
rc, out, _ = run("servd", "--help")
check(rc == 0 and out == ["servd", "--help"], f"servd: {out}")

# ---- the Kubernetes manifest ----
try:
    import yaml
except ImportError:
    print("SKIP: PyYAML is missing: the Kubernetes manifest is not checked (the entry point passed)")
    sys.exit(77)
docs = list(yaml.safe_load_all(open(os.path.join(a.source, "deploy", "kubernetes", "servd.yaml"))))
cm = next(d for d in docs if d["kind"] == "ConfigMap")
dep = next(d for d in docs if d["kind"] == "Deployment")
c = dep["spec"]["template"]["spec"]["containers"][0]
check(c["livenessProbe"]["httpGet"]["path"] == "/v2/health/live", "liveness probe path")
check(c["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready", "readiness probe path")
cfg = json.loads(cm["data"]["servd.json"])
check(cfg.get("metrics_public") is True, "the scrape annotations need metrics_public (an API key may be set)")
ann = dep["spec"]["template"]["metadata"]["annotations"]
check(ann["prometheus.io/path"] == "/metrics", "scrape path")
grace = dep["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
check(grace > cfg["drain_timeout"] + 5, "terminationGracePeriodSeconds must exceed the drain timeout plus the preStop pause")
# servd must accept the config as written (unknown keys and bad values are errors): --help after
# --config loads and checks the file, then exits.
path = os.path.join(a.work, "servd.json")
with open(path, "w") as f:
    f.write(cm["data"]["servd.json"])
r = subprocess.run([a.servd, "--config", path, "--help"], capture_output=True, text=True, timeout=30)
check(r.returncode == 0, f"servd refuses the ConfigMap's config: {r.stderr}")
print("ok")
