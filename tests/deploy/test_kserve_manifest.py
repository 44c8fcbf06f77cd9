"""deploy/kserve/: the ServingRuntime and InferenceServices parse as YAML (PyYAML when present, else
a structural check of the lines), declare what KServe needs (protocolVersions v2 and grpc-v2, the
model format the InferenceServices ask for, HTTP 8000 and gRPC 8001, the model from /mnt/models
where storageUri lands), and every flag of the container's args is one `servd --help` lists."""
import argparse
import os
import re
import subprocess
import sys

p = argparse.ArgumentParser()
p.add_argument("--servd", required=True)
p.add_argument("--source", required=True)
a = p.parse_args()
folder = os.path.join(a.source, "deploy", "kserve")


def fail(msg):
    print(f"FAIL: {msg}")
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)


def text(name):
    with open(os.path.join(folder, name)) as f:
        return f.read()


try:
    import yaml

    docs = [d for n in ("servingruntime.yaml", "inferenceservice.yaml") for d in yaml.safe_load_all(text(n)) if d]
except ImportError:
    yaml = None
    docs = None

rt_text, isvc_text = text("servingruntime.yaml"), text("inferenceservice.yaml")
for name, t in (("servingruntime.yaml", rt_text), ("inferenceservice.yaml", isvc_text)):
    check("\t" not in t, f"{name}: tabs are not YAML indentation")
    for i, line in enumerate(t.splitlines(), 1):
        indent = len(line) - len(line.lstrip(" "))
        check(indent % 2 == 0, f"{name}:{i}: indentation of {indent} spaces")

if docs is not None:
    rts = [d for d in docs if d["kind"] == "ServingRuntime"]
    isvcs = [d for d in docs if d["kind"] == "InferenceService"]
    check(len(rts) == 1 and len(isvcs) == 2, f"documents: {[d['kind'] for d in docs]}")
    rt = rts[0]
    check(rt["apiVersion"] == "serving.kserve.io/v1alpha1", f"runtime apiVersion: {rt['apiVersion']}")
    spec = rt["spec"]
    check({"v2", "grpc-v2"} <= set(spec["protocolVersions"]), f"protocolVersions: {spec['protocolVersions']}")
    formats = {f["name"] for f in spec["supportedModelFormats"]}
    (container,) = spec["containers"]
    check(container["name"] == "kserve-container", "KServe looks for the container named kserve-container")
    args = container["args"]
    check([p["containerPort"] for p in container["ports"]] == [8000], f"runtime ports: {container['ports']}")
    for probe in ("readinessProbe", "livenessProbe"):
        check(container[probe]["httpGet"]["port"] == 8000 and container[probe]["httpGet"]["path"].startswith("/v2/health/"),
              f"{probe}: {container[probe]}")
    protocols = set()
    for d in isvcs:
        m = d["spec"]["predictor"]["model"]
        check(d["apiVersion"] == "serving.kserve.io/v1beta1", f"isvc apiVersion: {d['apiVersion']}")
        check(m["runtime"] == rt["metadata"]["name"] and m["modelFormat"]["name"] in formats, f"isvc runtime: {m}")
        check(m["storageUri"].endswith("/"), f"storageUri is a folder holding model.mpk: {m['storageUri']}")
        protocols.add(m["protocolVersion"])
        if m["protocolVersion"] == "grpc-v2":
            check([(p["name"], p["containerPort"]) for p in m["ports"]] == [("h2c", 8001)], f"grpc ports: {m}")
    check(protocols == {"v2", "grpc-v2"}, f"isvc protocols: {protocols}")
else:
    print("note: PyYAML is not installed; checking the args from the text")
    check("kind: ServingRuntime" in rt_text and isvc_text.count("kind: InferenceService") == 2, "documents")
    check(re.search(r"protocolVersions:\n\s+- v2\n\s+- grpc-v2", rt_text), "protocolVersions v2, grpc-v2")
    args = re.findall(r"^\s+- (--\S+)$", rt_text, re.M)

# Each flag of the args is one servd knows, with the values KServe relies on.
helptext = subprocess.run([a.servd, "--help"], capture_output=True, text=True).stdout
known = set(re.findall(r"^\s+(--[a-z0-9-]+)", helptext, re.M)) | set(re.findall(r", (--[a-z0-9-]+)", helptext))
check("--port" in known and "--grpc-port" in known, f"servd --help lists its flags: {sorted(known)}")
flags = {}
for arg in args:
    check(arg.startswith("--"), f"arg {arg!r} is no flag")
    flag, _, value = arg.partition("=")
    check(flag in known, f"servd has no flag {flag} (servd --help lists {sorted(known)})")
    flags[flag] = value
check(flags.get("--host") == "0.0.0.0", f"--host: {flags.get('--host')}")
check(flags.get("--port") == "8000" and flags.get("--grpc-port") == "8001", f"ports: {flags}")
check(flags.get("--model", "").startswith("/mnt/models/") and flags["--model"].endswith(":{{.Name}}"),
      f"--model serves the storageUri's package as the InferenceService's name: {flags.get('--model')}")
print("ok")
