"""gRPC over TLS, with a CA and certificates made here by the openssl command: tritonclient.grpc with
ssl=True (live, metadata, raw-tensor inference equal bit for bit to a plaintext servd's answer for the
same input: TLS changes the transport only), a grpcio channel with the test CA
(health Check, ALPN h2 chosen), an h2c client on the TLS port refused while others are served, a
SIGHUP swapping the certificate while a ModelStreamInfer generation and an open channel stay up (new
connections see the new serial), mutual TLS refusing a client without a certificate, and a client
that never finishes its handshake closed after read_timeout while a served one stays up."""
import os
import queue
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from servd_harness import Servd, check, example_package, fail, parse_args, skip, test_certificates, tiny_llama  # noqa: E402

a = parse_args()
try:
    import grpc
    import tritonclient.grpc as tc
    from grpc_health.v1 import health_pb2, health_pb2_grpc
except ImportError as e:
    skip(f"{e.name} is not installed (use .venv-test: scripts/install-deps.sh)")

d, CA, CERT, KEY = test_certificates(a, "grpc-tls")


def read(name):
    with open(os.path.join(d, name), "rb") as f:
        return f.read()


def channel(port, client_cert=False):
    creds = grpc.ssl_channel_credentials(root_certificates=read("ca.pem"),
                                         private_key=read("client.key") if client_cert else None,
                                         certificate_chain=read("client.pem") if client_cert else None)
    return grpc.secure_channel(f"127.0.0.1:{port}", creds)


def health(ch, timeout=30):
    return health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout).status


def peer(port):
    """(serial, ALPN) of a fresh TLS connection offering h2."""
    c = ssl.create_default_context(cafile=CA)
    c.set_alpn_protocols(["h2"])
    c.load_cert_chain(os.path.join(d, "client.pem"), os.path.join(d, "client.key"))
    with socket.create_connection(("127.0.0.1", port), timeout=30) as raw:
        with c.wrap_socket(raw, server_hostname="127.0.0.1") as t:
            return int(t.getpeercert()["serialNumber"], 16), t.selected_alpn_protocol()


def start(args):
    """servd with TLS on both ports; returns (servd, gRPC port) once gRPC health answers over TLS."""
    s = Servd.__new__(Servd)
    s.log_path = os.path.join(a.work, f"servd-grpc-tls-{os.getpid()}-{time.monotonic_ns()}.log")
    s.log = open(s.log_path, "w")
    s.proc = subprocess.Popen([a.servd, "--host", "127.0.0.1", "--port", "0", "--grpc-port", "0", "--tls-cert", CERT,
                               "--tls-key", KEY] + args, stdout=subprocess.PIPE, stderr=s.log, text=True)
    s.port = gport = None
    while s.port is None:
        line = s.proc.stdout.readline()
        if not line:
            fail(f"servd did not start:\n{s.stderr()}")
        if line.startswith("servd: grpc port "):
            gport = int(line.split()[3])
        elif line.startswith("servd: port "):
            s.port = int(line.split()[2])
    check(gport is not None, "no gRPC port line")
    ch = channel(gport, client_cert=True)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        check(s.proc.poll() is None, f"servd exited with {s.proc.returncode}:\n{s.stderr()}")
        try:
            if health(ch, timeout=5) == health_pb2.HealthCheckResponse.SERVING:
                ch.close()
                return s, gport
        except grpc.RpcError:
            pass
        time.sleep(0.2)
    fail(f"servd not serving gRPC over TLS:\n{s.stderr()}")


mlp = example_package(a, "mlp_classifier")
llama = tiny_llama(a)
s, gport = start(["--model", f"{mlp}:mlp", "--model", f"{llama}:tiny"])
check("gRPC (KServe v2, TLS)" in s.stderr(), f"no TLS gRPC line:\n{s.stderr()}")
check(peer(gport) == (0x1001, "h2"), f"certificate A and ALPN h2: {peer(gport)}")

# An h2c client on the TLS port is closed; TLS clients are served before and after it.
with grpc.insecure_channel(f"127.0.0.1:{gport}") as plain:
    try:
        health(plain, timeout=10)
        fail("an h2c client was served on the TLS port")
    except grpc.RpcError as e:
        check(e.code() == grpc.StatusCode.UNAVAILABLE, f"h2c on the TLS port: {e.code()} {e.details()}")

# tritonclient.grpc with ssl=True.
target = f"127.0.0.1:{gport}"
c = tc.InferenceServerClient(target, ssl=True, root_certificates=CA)
check(c.is_server_live() and c.is_server_ready() and c.is_model_ready("mlp"), "live/ready over TLS")
check(c.get_model_metadata("mlp").name == "mlp", "ModelMetadata over TLS")
i = tc.InferInput("x", [1, 1], "FP32")
i.set_data_from_numpy(np.array([[0.5]], dtype=np.float32))
try:
    c.infer("mlp", [i])
    fail("a wrong input width was accepted")
except tc.InferenceServerException as e:
    check("StatusCode.INVALID_ARGUMENT" in str(e.status()), f"bad width over TLS: {e}")
    d_in = int(e.message().split("(batch, ")[1].split(")")[0])

x = np.array([[((r * 5 + j * 3) % 13 - 6) / 6.0 for j in range(d_in)] for r in range(4)], dtype=np.float32)
i = tc.InferInput("x", list(x.shape), "FP32")
i.set_data_from_numpy(x)
r = c.infer("mlp", [i])
probs = r.as_numpy("probs").astype(np.float64)
check(probs.shape[0] == 4 and np.allclose(probs.sum(axis=1), 1.0, atol=1e-5), f"probs over TLS: {probs}")
check(r.as_numpy("label").tolist() == probs.argmax(axis=1).tolist(), "label is the argmax of probs")
# The same input over plaintext gRPC on another servd gives the same numbers bit for bit: TLS changes
# the transport only.
p = subprocess.Popen([a.servd, "--host", "127.0.0.1", "--port", "0", "--grpc-port", "0", "--model", f"{mlp}:mlp"],
                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
pport = None
while pport is None:
    line = p.stdout.readline()
    if not line:
        fail("the plaintext servd did not start")
    if line.startswith("servd: grpc port "):
        pport = int(line.split()[3])
pc = tc.InferenceServerClient(f"127.0.0.1:{pport}")
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    try:
        if pc.is_model_ready("mlp"):
            break
    except tc.InferenceServerException:
        pass
    time.sleep(0.2)
plain_probs = pc.infer("mlp", [i]).as_numpy("probs")
p.terminate()
p.wait(timeout=60)
check(np.array_equal(plain_probs, r.as_numpy("probs")), "TLS and plaintext answers agree")

# A ModelStreamInfer generation and an open channel on certificate A stay up across garbage
# handshakes and a SIGHUP that installs certificate B.
keep = channel(gport)
check(health(keep) == health_pb2.HealthCheckResponse.SERVING, "open channel")
events = queue.Queue()
c.start_stream(callback=lambda result, error: events.put((result, error)))
txt = tc.InferInput("text_input", [1], "BYTES")
txt.set_data_from_numpy(np.array([b"reload"], dtype=object))
mt = tc.InferInput("max_tokens", [1], "INT32")
mt.set_data_from_numpy(np.array([200], dtype=np.int32))
stream_in = [txt, mt]
for name, dt, v in (("stream", bool, True), ("temperature", np.float32, 0.0)):
    t = tc.InferInput(name, [1], {bool: "BOOL", np.float32: "FP32"}[dt])
    t.set_data_from_numpy(np.array([v], dtype=dt))
    stream_in.append(t)
c.async_stream_infer("tiny", stream_in, request_id="s1", enable_empty_final_response=True)
res, err = events.get(timeout=120)
check(err is None, f"first streamed piece: {err}")

for junk in (b"\x16\x03\x01\x00\x05hello" + os.urandom(200), os.urandom(512), b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"):
    with socket.create_connection(("127.0.0.1", gport), timeout=30) as g:
        try:
            g.sendall(junk)
            while g.recv(4096):
                pass
        except ConnectionResetError:
            pass

shutil.copy(os.path.join(d, "b.pem"), CERT)
shutil.copy(os.path.join(d, "b.key"), KEY)
s.proc.send_signal(signal.SIGHUP)
deadline = time.monotonic() + 10
while "TLS certificate reloaded" not in s.stderr() and time.monotonic() < deadline:
    time.sleep(0.05)
check("TLS certificate reloaded" in s.stderr(), f"reload log:\n{s.stderr()}")
check(peer(gport)[0] == 0x2002, f"after SIGHUP a new gRPC connection sees serial {peer(gport)[0]:#x}")
check(health(keep) == health_pb2.HealthCheckResponse.SERVING, "the open channel after the reload")
pieces, final = 1, False
while not final:
    res, err = events.get(timeout=120)
    check(err is None, f"streamed piece after the reload: {err}")
    final = res.get_response().parameters["triton_final_response"].bool_param
    pieces += 1
check(pieces >= 3, f"the stream went on across the reload ({pieces} responses)")
c.stop_stream()
keep.close()
c.close()
check(s.stop() == 0, f"servd exit:\n{s.stderr()}")

# Mutual TLS: a grpcio client without a certificate is refused; one the CA signed is served, and so
# is tritonclient.grpc with its certificate.
shutil.copy(os.path.join(d, "a.pem"), CERT)
shutil.copy(os.path.join(d, "a.key"), KEY)
conf = os.path.join(d, "servd.json")
with open(conf, "w") as f:
    f.write('{"read_timeout": 1.5}')
m, mport = start(["--model", f"{mlp}:mlp", "--tls-ca", CA, "--config", conf])
silent = socket.create_connection(("127.0.0.1", mport), timeout=30)
t0 = time.monotonic()
with channel(mport) as anon:
    try:
        health(anon, timeout=10)
        fail("a client without a certificate was served")
    except grpc.RpcError as e:
        check(e.code() == grpc.StatusCode.UNAVAILABLE, f"without a client certificate: {e.code()} {e.details()}")
with channel(mport, client_cert=True) as ok:
    check(health(ok) == health_pb2.HealthCheckResponse.SERVING, "client certificate accepted")
mc = tc.InferenceServerClient(f"127.0.0.1:{mport}", ssl=True, root_certificates=CA,
                              private_key=os.path.join(d, "client.key"),
                              certificate_chain=os.path.join(d, "client.pem"))
check(np.array_equal(mc.infer("mlp", [i]).as_numpy("probs"), plain_probs), "mTLS inference")
mc.close()
# The silent client is closed once read_timeout has passed; a client that finished its handshake is not.
try:
    got = silent.recv(100)
except ConnectionResetError:
    got = b""
waited = time.monotonic() - t0
check(got == b"" and 1.0 < waited < 20, f"a client without a handshake: {got!r} after {waited:.1f} s")
silent.close()
with channel(mport, client_cert=True) as ok:
    check(health(ok) == health_pb2.HealthCheckResponse.SERVING, "a handshaken channel")
    time.sleep(2)
    check(health(ok) == health_pb2.HealthCheckResponse.SERVING, "a handshaken channel after read_timeout")
check(m.stop() == 0, f"servd exit:\n{m.stderr()}")
print("ok")
