"""HTTPS on the HTTP port, with a CA and certificates made here by the openssl command: curl and the
official openai client (streaming too), ALPN http/1.1 only, a SIGHUP swapping the certificate while a
stream and a keep-alive connection stay up (new connections see the new serial), a bad file at reload
keeping the old certificate, plaintext HTTP answered 400 and closed, garbage handshakes closed without
disturbing other connections, mutual TLS refusing a client without a certificate, and bad files at
startup refused with exit 2 naming the file."""
import http.client
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from servd_harness import Servd, check, fail, parse_args, skip, test_certificates, tiny_llama  # noqa: E402

a = parse_args()
if not shutil.which("curl"):
    skip("curl is needed")
d, CA, CERT, KEY = test_certificates(a, "tls")


def context(cert=None, alpn=("http/1.1",)):
    c = ssl.create_default_context(cafile=CA)
    if alpn:
        c.set_alpn_protocols(list(alpn))
    if cert:
        c.load_cert_chain(os.path.join(d, f"{cert}.pem"), os.path.join(d, f"{cert}.key"))
    return c


def conn(port, ctx=None):
    return http.client.HTTPSConnection("127.0.0.1", port, context=ctx or context(), timeout=60)


def get(c, path):
    c.request("GET", path)
    r = c.getresponse()
    return r.status, r.read()


def peer_serial(port):
    with socket.create_connection(("127.0.0.1", port), timeout=30) as raw:
        with context().wrap_socket(raw, server_hostname="127.0.0.1") as t:
            return int(t.getpeercert()["serialNumber"], 16), t.selected_alpn_protocol()


def start(args, **kw):
    s = Servd(a, args, wait_ready=False, **kw)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        check(s.proc.poll() is None, f"servd exited with {s.proc.returncode}:\n{s.stderr()}")
        try:
            c = conn(s.port, context(cert="client"))
            st, _ = get(c, "/v2/health/ready")
            c.close()
            if st == 200:
                return s
        except (OSError, ssl.SSLError):
            pass
        time.sleep(0.1)
    fail(f"servd not ready over TLS:\n{s.stderr()}")


# Bad files at startup: exit 2, the message names the file.
bad = os.path.join(d, "bad.pem")
with open(bad, "w") as f:
    f.write("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
for args, name in (([ "--tls-cert", bad, "--tls-key", KEY], bad),
                   (["--tls-cert", CERT, "--tls-key", os.path.join(d, "missing.key")], "missing.key"),
                   (["--tls-cert", CERT, "--tls-key", os.path.join(d, "b.key")], "b.key"),
                   (["--tls-cert", CERT], "--tls-key")):
    r = subprocess.run([a.servd, "--port", "0"] + args, capture_output=True, text=True, timeout=60)
    check(r.returncode == 2 and name in r.stderr, f"{args}: exit {r.returncode}, {r.stderr!r}")

pkg = tiny_llama(a)
s = start(["--model", f"{pkg}:tiny", "--tls-cert", CERT, "--tls-key", KEY], env={"SERVD_DEBUG": "1"})
base = f"https://127.0.0.1:{s.port}"
check(f"listening on https://127.0.0.1:{s.port}" in s.stderr(), "no https listening line")
check(peer_serial(s.port) == (0x1001, "http/1.1"), f"certificate A and ALPN: {peer_serial(s.port)}")

# curl: ALPN picks http/1.1 (h2 is not offered back), a completion, and an SSE stream.
r = subprocess.run(["curl", "-sv", "--cacert", CA, f"{base}/v1/models"], capture_output=True, text=True, timeout=60)
check(r.returncode == 0 and '"tiny"' in r.stdout, f"curl /v1/models: {r.returncode} {r.stdout} {r.stderr}")
check("ALPN: server accepted http/1.1" in r.stderr, f"curl ALPN: {r.stderr}")
body = json.dumps({"model": "tiny", "prompt": "tls", "max_tokens": 8, "stream": True, "ignore_eos": True})
r = subprocess.run(["curl", "-sN", "--cacert", CA, "-H", "Content-Type: application/json", "-d", body,
                    f"{base}/v1/completions"], capture_output=True, text=True, timeout=120)
events = [ln for ln in r.stdout.splitlines() if ln.startswith("data: ")]
check(r.returncode == 0 and len(events) >= 3 and events[-1] == "data: [DONE]" and '"length"' in events[-2],
      f"curl stream: {r.returncode} {r.stdout[-300:]!r} {r.stderr}")

# A client that offers only h2 is refused (no_application_protocol).
try:
    peer_serial_ctx = context(alpn=("h2",))
    with socket.create_connection(("127.0.0.1", s.port), timeout=30) as raw:
        with peer_serial_ctx.wrap_socket(raw, server_hostname="127.0.0.1"):
            fail("an h2-only client was accepted")
except ssl.SSLError as e:
    check("no application protocol" in str(e).lower(), f"h2-only client: {e}")

# The official openai client over HTTPS, plain and streaming.
try:
    import openai
except ImportError:
    openai = None
if openai:
    # The client's own HTTP client class (httpx or httpx2 by version), trusting the test CA.
    http_client = getattr(openai, "DefaultHttpx2Client", None) or openai.DefaultHttpxClient
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=120,
                           http_client=http_client(verify=context()))
    c = client.completions.create(model="tiny", prompt="Hello", max_tokens=6, temperature=0,
                                  extra_body={"ignore_eos": True})
    check(c.usage.completion_tokens == 6, f"openai over TLS: {c}")
    text = "".join(ch.choices[0].text for ch in client.completions.create(
        model="tiny", prompt="Hello", max_tokens=6, temperature=0, stream=True, extra_body={"ignore_eos": True})
        if ch.choices)
    check(text == c.choices[0].text, f"openai stream over TLS: {text!r} != {c.choices[0].text!r}")
else:
    print("note: the openai package is not installed; its part is skipped")

# Plaintext HTTP to the TLS port: a plaintext 400, then the connection closes.
with socket.create_connection(("127.0.0.1", s.port), timeout=30) as p:
    p.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
    got = b""
    while True:
        chunk = p.recv(4096)
        if not chunk:
            break
        got += chunk
    check(got.startswith(b"HTTP/1.1 400 ") and b"HTTPS port" in got, f"plaintext to the TLS port: {got[:200]!r}")

# A stream and a keep-alive connection opened on certificate A stay up across garbage handshakes and
# a SIGHUP that installs certificate B.
keep = conn(s.port)
check(get(keep, "/v2/health/live")[0] == 200, "keep-alive request")
sc = conn(s.port)
sc.request("POST", "/v1/completions", body=json.dumps({"model": "tiny", "prompt": "reload", "max_tokens": 200,
                                                       "ignore_eos": True, "stream": True}),
           headers={"Content-Type": "application/json"})
sr = sc.getresponse()
check(sr.status == 200, f"stream: {sr.status}")
check(sr.readline().startswith(b"data: "), "stream's first event")

for junk in (b"\x16\x03\x01\x00\x05hello" + os.urandom(200), os.urandom(512), b"\x16\x03\x03\xff\xff" + b"A" * 100):
    with socket.create_connection(("127.0.0.1", s.port), timeout=30) as g:
        try:
            g.sendall(junk)
            while g.recv(4096):
                pass  # an alert, perhaps; then the close
        except ConnectionResetError:
            pass

shutil.copy(os.path.join(d, "b.pem"), CERT)
shutil.copy(os.path.join(d, "b.key"), KEY)
s.proc.send_signal(signal.SIGHUP)
deadline = time.monotonic() + 10
while "TLS certificate reloaded" not in s.stderr() and time.monotonic() < deadline:
    time.sleep(0.05)
check("TLS certificate reloaded" in s.stderr() and "servd-b" in s.stderr(), f"reload log:\n{s.stderr()}")
check(peer_serial(s.port)[0] == 0x2002, f"after SIGHUP a new connection sees serial {peer_serial(s.port)[0]:#x}")
check(keep.sock.getpeercert()["serialNumber"] == "1001", "the old connection still holds certificate A")
check(get(keep, "/v2/health/live")[0] == 200, "keep-alive connection after the reload")
rest = sr.read()
sc.close()
lines = [ln for ln in rest.split(b"\n") if ln.startswith(b"data: ")]
check(len(lines) >= 2 and lines[-1] == b"data: [DONE]" and b'"length"' in lines[-2],
      f"stream across the reload: {rest[-200:]!r}")

# A file that does not load at reload: the old (B) certificate keeps serving, with a log line.
with open(CERT, "w") as f:
    f.write("garbage\n")
s.proc.send_signal(signal.SIGHUP)
deadline = time.monotonic() + 10
while "TLS reload failed" not in s.stderr() and time.monotonic() < deadline:
    time.sleep(0.05)
check("TLS reload failed" in s.stderr() and CERT in s.stderr(), f"failed reload log:\n{s.stderr()}")
check(peer_serial(s.port)[0] == 0x2002, "a failed reload keeps the previous certificate")
check(get(keep, "/v2/health/live")[0] == 200, "serving after a failed reload")
keep.close()
log = s.stderr()
check("debug:" in log and "TLS handshake failed" in log, f"no debug line for the garbage handshakes:\n{log}")
check(s.stop() == 0, f"servd exit:\n{s.stderr()}")

# Mutual TLS: a client without a certificate is refused, one with a certificate the CA signed is served.
shutil.copy(os.path.join(d, "a.pem"), CERT)
shutil.copy(os.path.join(d, "a.key"), KEY)
m = start(["--tls-cert", CERT, "--tls-key", KEY, "--tls-ca", CA])
try:
    c = conn(m.port)
    st, _ = get(c, "/v2/health/live")
    fail(f"a client without a certificate was answered {st}")
except (ssl.SSLError, ConnectionError, http.client.RemoteDisconnected) as e:
    print(f"without a client certificate: {e!r}")
c = conn(m.port, context(cert="client"))
check(get(c, "/v2/health/live")[0] == 200, "client certificate accepted")
c.close()
r = subprocess.run(["curl", "-s", "--cacert", CA, "--cert", os.path.join(d, "client.pem"), "--key",
                    os.path.join(d, "client.key"), "-o", "/dev/null", "-w", "%{http_code}",
                    f"https://127.0.0.1:{m.port}/v2/health/live"], capture_output=True, text=True, timeout=60)
check(r.stdout == "200", f"curl with a client certificate: {r.stdout} {r.stderr}")
r = subprocess.run(["curl", "-s", "--cacert", CA, f"https://127.0.0.1:{m.port}/v2/health/live"],
                   capture_output=True, text=True, timeout=60)
check(r.returncode != 0, f"curl without a client certificate: {r.returncode} {r.stdout}")
check(m.stop() == 0, f"servd exit:\n{m.stderr()}")
print("ok")
