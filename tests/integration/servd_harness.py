"""Starts a real servd process for integration tests and talks plain HTTP to it.

Tests exit 77 (ctest's SKIP_RETURN_CODE) with the reason on stdout when something they need is
missing, and 1 with a message on failure.
"""
import argparse
import atexit
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

SKIP = 77


def skip(reason):
    print(f"SKIP: {reason}")
    sys.exit(SKIP)


def fail(msg):
    print(f"FAIL: {msg}")
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--servd")
    p.add_argument("--modelpkg")
    p.add_argument("--example-pack")
    p.add_argument("--examples")
    p.add_argument("--work", default=tempfile.mkdtemp(prefix="servd-it-"))
    a = p.parse_args()
    if not a.servd or not os.access(a.servd, os.X_OK):
        skip("the servd binary was not built")
    os.makedirs(a.work, exist_ok=True)
    return a


def tiny_llama(a):
    """A tiny random-weight Llama package (byte-level tokenizer, chat template) from `modelpkg synth`."""
    out = os.path.join(a.work, "tiny.mpk")
    if os.path.exists(out):
        return out
    if not a.modelpkg or not os.access(a.modelpkg, os.X_OK):
        skip("modelpkg was not built: no tiny Llama package")
    r = subprocess.run([a.modelpkg, "synth", "tiny", "-o", out, "--quiet"], capture_output=True, text=True)
    if r.returncode != 0:
        skip(f"modelpkg synth tiny failed: {r.stderr.strip()}")
    return out


def tiny_llama_long(a, name, template=None, context=4096):
    """The tiny Llama with a longer context (`context` tokens) and optionally its own chat template:
    with its byte-level tokenizer a tools preamble alone is some 700 tokens, more than the 512 of
    `modelpkg synth tiny`."""
    hf, out = os.path.join(a.work, name + "-hf"), os.path.join(a.work, name + ".mpk")
    if os.path.exists(out):
        return out
    if not a.modelpkg or not os.access(a.modelpkg, os.X_OK):
        skip("modelpkg was not built: no tiny Llama package")
    r = subprocess.run([a.modelpkg, "synth", "tiny", "--hf-out", hf, "-o", out + ".short", "--quiet"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        skip(f"modelpkg synth tiny failed: {r.stderr.strip()}")
    edits = [("config.json", "max_position_embeddings", context)]
    if template:
        edits.append(("tokenizer_config.json", "chat_template", template))
    for fname, key, value in edits:
        path = os.path.join(hf, fname)
        with open(path) as f:
            cfg = json.load(f)
        cfg[key] = value
        with open(path, "w") as f:
            json.dump(cfg, f)
    r = subprocess.run([a.modelpkg, "pack", hf, "-o", out, "--quiet"], capture_output=True, text=True)
    check(r.returncode == 0, f"modelpkg pack: {r.stderr.strip()}")
    return out


def python_deps(a, need=None):
    """The directory of servd's run-time Python packages (scripts/install-python-deps.sh) that the
    test's servd gets as SERVD_PY_DEPS; skips when the package `need` is not installed there."""
    deps = os.environ.get("SERVD_PY_DEPS") or os.path.join(os.path.dirname(os.path.dirname(a.servd)), "python-deps")
    if need and not os.path.isdir(os.path.join(deps, need)):
        skip(f"{need} is not installed in {deps} (scripts/install-python-deps.sh {deps})")
    return deps


def test_certificates(a, name):
    """A directory of test certificates made by the openssl command (skips without it): a CA
    (ca.pem/ca.key), server certificates a and b for localhost and 127.0.0.1 (serials 0x1001 and
    0x2002, for telling a reload apart), a client certificate for mutual TLS, and cert.pem/key.pem,
    the files a servd under test is started with (a copy of a; swap in b to test a reload).
    Returns (directory, CA, CERT, KEY) as paths."""
    if not shutil.which("openssl"):
        skip("the openssl command is needed to make the test certificates")
    d = os.path.join(a.work, f"{name}-{os.getpid()}")
    os.makedirs(d, exist_ok=True)

    def sh(*args):
        r = subprocess.run(args, cwd=d, capture_output=True, text=True)
        if r.returncode != 0:
            fail(f"{' '.join(args)}: {r.stderr}")

    def make_cert(cert, cn, serial, ext):
        sh("openssl", "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout",
           f"{cert}.key", "-out", f"{cert}.csr", "-subj", f"/CN={cn}")
        with open(os.path.join(d, f"{cert}.ext"), "w") as f:
            f.write(ext)
        sh("openssl", "x509", "-req", "-in", f"{cert}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-set_serial",
           serial, "-days", "2", "-extfile", f"{cert}.ext", "-out", f"{cert}.pem")

    sh("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout",
       "ca.key", "-out", "ca.pem", "-days", "2", "-subj", f"/CN=servd {name} test CA")
    server_ext = "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"
    make_cert("a", "servd-a", "0x1001", server_ext)
    make_cert("b", "servd-b", "0x2002", server_ext)
    make_cert("client", "servd-client", "0x3003", "extendedKeyUsage=clientAuth\n")
    ca, cert, key = (os.path.join(d, n) for n in ("ca.pem", "cert.pem", "key.pem"))
    shutil.copy(os.path.join(d, "a.pem"), cert)
    shutil.copy(os.path.join(d, "a.key"), key)
    return d, ca, cert, key


def example_package(a, name):
    """An example generic package (models/examples/<name>), built by the servd_examples target."""
    path = os.path.join(a.examples or "", f"{name}.mpk")
    if os.path.exists(path):
        return path
    if a.example_pack and os.access(a.example_pack, os.X_OK):
        os.makedirs(a.examples, exist_ok=True)
        r = subprocess.run([a.example_pack, name, path], capture_output=True, text=True)
        if r.returncode == 0:
            return path
    skip(f"example package {name}.mpk is missing (build the servd_examples target)")


class Servd:
    def __init__(self, a, args, env=None, wait_ready=True, ready_timeout=180):
        self.log_path = os.path.join(a.work, f"servd-{os.getpid()}-{time.monotonic_ns()}.log")
        self.log = open(self.log_path, "w")
        e = dict(os.environ)
        e.update(env or {})
        self.proc = subprocess.Popen([a.servd, "--host", "127.0.0.1", "--port", "0"] + args, stdout=subprocess.PIPE,
                                     stderr=self.log, env=e, text=True)
        atexit.register(self._kill_if_running)  # a failed check exits the test: no servd outlives it
        self.port = None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            if line.startswith("servd: port "):
                self.port = int(line.split()[2])
                break
        if self.port is None:
            self.proc.kill()
            fail(f"servd did not start:\n{self.stderr()}")
        if wait_ready:
            self.wait_ready(ready_timeout)

    def stderr(self):
        if not self.log.closed:
            self.log.flush()
        with open(self.log_path) as f:
            return f.read()

    def wait_ready(self, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                fail(f"servd exited with {self.proc.returncode} while starting:\n{self.stderr()}")
            try:
                st, _, _ = self.request("GET", "/v2/health/ready")
                if st == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        fail(f"servd not ready after {timeout} s:\n{self.stderr()}")

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def request(self, method, path, body=None, headers=None, timeout=120):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        h = dict(headers or {})
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
            h.setdefault("Content-Type", "application/json")
        c.request(method, path, body=body, headers=h)
        r = c.getresponse()
        data = r.read()
        c.close()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, data

    def json(self, method, path, body=None, headers=None):
        st, h, data = self.request(method, path, body, headers)
        try:
            return st, json.loads(data) if data else None
        except ValueError:
            fail(f"{method} {path}: response is not JSON: {data[:200]!r}")

    def metrics(self, headers=None):
        st, _, data = self.request("GET", "/metrics", headers=headers)
        check(st == 200, f"/metrics answered {st}")
        return data.decode()

    def _kill_if_running(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self, sig=signal.SIGTERM, timeout=60):
        if sig is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            fail(f"servd did not exit within {timeout} s of signal {sig}:\n{self.stderr()}")
        self.log.close()
        return rc


def metric_value(text, name, labels):
    """The value of one sample, e.g. metric_value(t, "servd_kv_cache_blocks_used", {"model": "tiny"})."""
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in text.splitlines():
        if line.startswith(f"{name}{{") and line.split("}")[0] == f"{name}{{{want}":
            return float(line.rsplit(" ", 1)[1])
    return None


def raw_socket(port):
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    return s
