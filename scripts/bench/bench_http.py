"""Small HTTP helpers shared by the Python benchmarks in scripts/bench and the check scripts in
scripts/: a JSON POST, a free port, the port a servd started with --port 0 listens on, waiting for
a server's health route, and a server process started and stopped around a benchmark."""
import contextlib
import http.client
import json
import socket
import subprocess
import sys
import time


def post(port, path, body, timeout=600):
    """POST body as JSON to 127.0.0.1:port; the decoded JSON answer, or RuntimeError on a non-200."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    if r.status != 200:
        raise RuntimeError(f"{path} on port {port}: {r.status} {data[:300]!r}")
    return json.loads(data)


def free_port():
    """A TCP port free on 127.0.0.1 right now (for servers that cannot pick their own)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def listening_port(proc):
    """The port a servd started with --port 0 and stdout=PIPE (text) prints ("servd: port N"), or
    None when it exits first."""
    for line in proc.stdout:
        if line.startswith("servd: port "):
            return int(line.split()[2])
    return None


def wait_http(port, path, proc, timeout=300):
    """Waits until GET path answers 200; exits the benchmark if the server died or never got ready."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"server on port {port} exited with {proc.returncode}")
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", path)
            if c.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    sys.exit(f"server on port {port} not ready after {timeout} s")


@contextlib.contextmanager
def server(argv, port, ready_path, env=None):
    """Runs argv (a server listening on port) until the block ends; yields once ready_path answers."""
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        wait_http(port, ready_path, proc)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
