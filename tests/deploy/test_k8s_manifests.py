"""Every Kubernetes manifest under deploy/ (kubernetes/, kserve/, llm-d/) checked offline:

- each document parses (PyYAML) and every core kind (Deployment, Service, ConfigMap, RBAC, ...) is
  valid against the Kubernetes 1.32 OpenAPI schema, strictly (kubernetes-validate: an unknown or
  misspelled field fails);
- the custom resources (InferencePool, HTTPRoute, LeaderWorkerSet, LLMInferenceService,
  ServingRuntime, InferenceService) have the fields their controllers need, and the pod specs they
  embed are valid core PodSpecs;
- the pieces agree: an InferencePool selects the pods of a Deployment in its file, on a port they
  expose, and names its endpoint picker's Service and port; an HTTPRoute's backend is an
  InferencePool of its file; servd's KV-cache events go to the picker's Service on the port it binds;
- every servd flag in a container's args is one `servd --help` lists.
A broken copy of a manifest must fail the same checks (the validator is not a no-op)."""
import argparse
import copy
import glob
import os
import re
import subprocess
import sys

p = argparse.ArgumentParser()
p.add_argument("--servd", required=True)
p.add_argument("--source", required=True)
a = p.parse_args()


def skip(msg):
    print(f"SKIP: {msg}")
    sys.exit(77)


def fail(msg):
    print(f"FAIL: {msg}")
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)


try:
    import kubernetes_validate
    import yaml
except ImportError as e:
    skip(f"{e.name} is not installed in .venv-test (scripts/install-deps.sh)")

K8S = "1.32.0"
h = subprocess.run([a.servd, "--help"], capture_output=True, text=True)
help_text = h.stdout + h.stderr
known_flags = set(re.findall(r"(--[a-z][a-z0-9-]*)", help_text))
check("--kv-events-endpoint" in known_flags and "--otlp-traces-endpoint" in known_flags, "servd --help")


def core_errors(doc):
    try:
        kubernetes_validate.validate(doc, K8S, strict=True)
        return None
    except kubernetes_validate.ValidationError as e:
        return str(e).splitlines()[0][:300]


def pod_spec_errors(spec):
    """A pod spec embedded in a custom resource, validated as a core v1 PodTemplate."""
    return core_errors({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "x"},
                        "template": {"metadata": {"labels": {"a": "b"}}, "spec": spec}})


def get(d, *path):
    for k in path:
        if isinstance(d, list):
            d = d[k] if isinstance(k, int) and k < len(d) else None
        else:
            d = (d or {}).get(k)
        if d is None:
            return None
    return d


def servd_flags(containers):
    out = []
    for c in containers or []:
        if "servd" in str(c.get("image", "")) or "servd" in " ".join(c.get("command", [])):
            for arg in c.get("args", []):
                if arg.startswith("--"):
                    out.append(arg.split("=", 1)[0])
    return out


def problems(path, docs):
    """Every problem with one file's documents, as strings."""
    errs = []
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d["kind"], []).append(d)
        kind, name = d["kind"], get(d, "metadata", "name")
        group = d["apiVersion"].split("/")[0] if "/" in d["apiVersion"] else ""
        where = f"{path}: {kind} {name}"
        core = "." not in group or group in ("rbac.authorization.k8s.io", "networking.k8s.io", "policy")
        if core:
            e = core_errors(d)
            if e:
                errs.append(f"{where}: {e}")
            for c in get(d, "spec", "template", "spec", "containers") or []:
                for f in servd_flags([c]):
                    if f not in known_flags:
                        errs.append(f"{where}: servd has no flag {f}")
            continue
        pods = []
        if kind == "InferencePool":
            if not get(d, "spec", "selector", "matchLabels"):
                errs.append(f"{where}: spec.selector.matchLabels")
            if not get(d, "spec", "targetPorts", 0, "number"):
                errs.append(f"{where}: spec.targetPorts[].number")
            if not (get(d, "spec", "endpointPickerRef", "name") and get(d, "spec", "endpointPickerRef", "port", "number")):
                errs.append(f"{where}: spec.endpointPickerRef name and port.number")
        elif kind == "HTTPRoute":
            refs = [b for r in get(d, "spec", "rules") or [] for b in r.get("backendRefs", [])]
            if not get(d, "spec", "parentRefs") or not refs:
                errs.append(f"{where}: parentRefs and backendRefs")
        elif kind == "LeaderWorkerSet":
            t = get(d, "spec", "leaderWorkerTemplate")
            if not t or not isinstance(t.get("size"), int) or t["size"] < 1:
                errs.append(f"{where}: spec.leaderWorkerTemplate.size")
            pods = [get(t, "workerTemplate", "spec"), get(t, "leaderTemplate", "spec")]
        elif kind == "LLMInferenceService":
            if not get(d, "spec", "model", "uri"):
                errs.append(f"{where}: spec.model.uri")
            pods = [get(d, "spec", "template")]
        elif kind == "ServingRuntime":
            pods = [{"containers": get(d, "spec", "containers")}]
        elif kind == "InferenceService":
            if not get(d, "spec", "predictor", "model", "runtime"):
                errs.append(f"{where}: spec.predictor.model.runtime")
        else:
            errs.append(f"{where}: a kind this test does not know ({d['apiVersion']})")
        for spec in pods:
            if spec is None:
                continue
            e = pod_spec_errors(spec)
            if e:
                errs.append(f"{where}: pod spec: {e}")
            for f in servd_flags(spec.get("containers")):
                if f not in known_flags:
                    errs.append(f"{where}: servd has no flag {f}")
    # The pieces agree with each other.
    deployments = by_kind.get("Deployment", [])
    services = {get(s, "metadata", "name"): s for s in by_kind.get("Service", [])}
    for pool in by_kind.get("InferencePool", []):
        sel = get(pool, "spec", "selector", "matchLabels") or {}
        port = get(pool, "spec", "targetPorts", 0, "number")
        pods = [get(dp, "spec", "template") for dp in deployments
                if sel and sel.items() <= (get(dp, "spec", "template", "metadata", "labels") or {}).items()]
        if not pods:
            errs.append(f"{path}: InferencePool selects no Deployment's pods ({sel})")
        for t in pods:
            ports = [cp.get("containerPort") for c in get(t, "spec", "containers") for cp in c.get("ports", [])]
            if port not in ports:
                errs.append(f"{path}: InferencePool targets port {port}, the pods expose {ports}")
        epp = get(pool, "spec", "endpointPickerRef")
        svc = services.get(epp["name"])
        if not svc or epp["port"]["number"] not in [x.get("port") for x in get(svc, "spec", "ports")]:
            errs.append(f"{path}: endpointPickerRef {epp} names no Service port of the file")
    pools = {get(x, "metadata", "name") for x in by_kind.get("InferencePool", [])}
    for route in by_kind.get("HTTPRoute", []):
        for r in get(route, "spec", "rules") or []:
            for b in r.get("backendRefs", []):
                if b.get("kind") == "InferencePool" and b.get("name") not in pools:
                    errs.append(f"{path}: HTTPRoute backend {b['name']} is no InferencePool of the file")
    for dp in deployments:
        for c in get(dp, "spec", "template", "spec", "containers") or []:
            for arg in c.get("args", []):
                m = re.fullmatch(r"--kv-events-endpoint=tcp://([a-z0-9.-]+):(\d+)", arg)
                if m and m.group(1) in services:
                    ports = [x.get("port") for x in get(services[m.group(1)], "spec", "ports")]
                    if int(m.group(2)) not in ports:
                        errs.append(f"{path}: KV events to {m.group(1)}:{m.group(2)}, its Service has {ports}")
                    cm = " ".join(str(get(x, "data")) for x in by_kind.get("ConfigMap", []))
                    if f"tcp://*:{m.group(2)}" not in cm:
                        errs.append(f"{path}: the endpoint picker's config binds no tcp://*:{m.group(2)}")
    return errs


files = sorted(glob.glob(os.path.join(a.source, "deploy", "**", "*.yaml"), recursive=True))
check(len(files) >= 6, f"manifests found: {files}")
kinds = set()
for f in files:
    with open(f) as fh:
        docs = [d for d in yaml.safe_load_all(fh) if d]
    check(docs, f"{f}: no documents")
    errs = problems(os.path.relpath(f, a.source), docs)
    check(not errs, "\n".join(errs))
    kinds |= {d["kind"] for d in docs}
    print(f"ok {os.path.relpath(f, a.source)}: {', '.join(d['kind'] for d in docs)}")
for k in ["InferencePool", "HTTPRoute", "LeaderWorkerSet", "LLMInferenceService", "Deployment", "Service"]:
    check(k in kinds, f"no {k} under deploy/")

# The checks fail on broken copies.
with open(os.path.join(a.source, "deploy", "llm-d", "inferencepool.yaml")) as fh:
    pool_docs = [d for d in yaml.safe_load_all(fh) if d]
broken = copy.deepcopy(pool_docs)
broken[0]["spec"]["template"]["spec"]["containers"][0]["portz"] = []
check(problems("broken", broken), "a misspelled Deployment field passed")
broken = copy.deepcopy(pool_docs)
broken[1]["spec"]["selector"]["matchLabels"] = {"app": "nothing"}
check(problems("broken", broken), "an InferencePool selecting no pods passed")
broken = copy.deepcopy(pool_docs)
broken[0]["spec"]["template"]["spec"]["containers"][0]["args"].append("--no-such-flag")
check(problems("broken", broken), "an unknown servd flag passed")
with open(os.path.join(a.source, "deploy", "kubernetes", "leaderworkerset.yaml")) as fh:
    lws = [d for d in yaml.safe_load_all(fh) if d]
lws[0]["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]["resources"]["limit"] = {}
check(problems("broken", lws), "a misspelled field in a LeaderWorkerSet's pod passed")
print("ok")
