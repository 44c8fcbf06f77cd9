"""Starts servd with --grpc-port 0 for the gRPC tests and benchmark; the gRPC port is read from
servd's stdout ("servd: grpc port N", printed before the HTTP port line the harness waits for)."""
import os
import subprocess
import time

from servd_harness import Servd, fail


def start(a, args, grpc_flag=True):
    """servd with --grpc-port 0 (or args that name the port otherwise); returns (servd, gRPC port or
    None), reading the ports from servd's stdout."""
    s = Servd.__new__(Servd)
    s.log_path = os.path.join(a.work, f"servd-grpc-{os.getpid()}-{time.monotonic_ns()}.log")
    s.log = open(s.log_path, "w")
    s.proc = subprocess.Popen([a.servd, "--host", "127.0.0.1", "--port", "0"] + (["--grpc-port", "0"] if grpc_flag else []) + args,
                              stdout=subprocess.PIPE, stderr=s.log, text=True)
    s.port = gport = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and s.port is None:
        line = s.proc.stdout.readline()
        if not line:
            break
        if line.startswith("servd: grpc port "):
            gport = int(line.split()[3])
        elif line.startswith("servd: port "):
            s.port = int(line.split()[2])
    if s.port is None or (gport is None and grpc_flag):
        s.proc.kill()
        fail(f"servd did not start with a gRPC port:\n{s.stderr()}")
    s.wait_ready(120)
    return s, gport
