"""The gRPC listener's HTTP/2 defences, with frames written by hand on raw sockets: rapid reset
(HEADERS then RST_STREAM, over and over), a CONTINUATION flood, a header list over the advertised
limit, a client that does not speak HTTP/2. Each ends in GOAWAY, a closed connection or an error
answer on that stream only, and the server answers tritonclient.grpc on a new connection after it."""
import os
import socket
import struct
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from servd_harness import check, parse_args, skip  # noqa: E402
from grpc_start import start  # noqa: E402

a = parse_args()
try:
    import tritonclient.grpc as tc
except ImportError:
    skip("tritonclient is not installed (use .venv-test: scripts/install-deps.sh)")

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST, SETTINGS, PING, GOAWAY, CONT = 0, 1, 3, 4, 6, 7, 9
END_STREAM, END_HEADERS = 1, 4


def frame(ftype, flags, sid, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([ftype, flags]) + struct.pack(">I", sid) + payload


def hpack_int(v, prefix_bits, first=0):
    lim = (1 << prefix_bits) - 1
    if v < lim:
        return bytes([first | v])
    out = [first | lim]
    v -= lim
    while v >= 128:
        out.append(v % 128 + 128)
        v //= 128
    out.append(v)
    return bytes(out)


def hpack(headers):
    """Literal header fields without indexing, new names, no Huffman coding."""
    out = b""
    for n, v in headers:
        n, v = n.encode(), v.encode()
        out += b"\x00" + hpack_int(len(n), 7) + n + hpack_int(len(v), 7) + v
    return out


def request_headers(path="/inference.GRPCInferenceService/ServerLive", extra=()):
    return hpack([(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "x"),
                  ("content-type", "application/grpc"), ("te", "trailers")] + list(extra))


def connect(port):
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(PREFACE + frame(SETTINGS, 0, 0))
    return s


def read_frames(s, until, seconds=10):
    """Frames (type, flags, stream, payload) until until(frames) holds, the peer closes, or time runs out."""
    buf, frames = b"", []
    deadline = time.monotonic() + seconds
    s.settimeout(0.5)
    while time.monotonic() < deadline and not until(frames):
        try:
            d = s.recv(65536)
        except socket.timeout:
            continue
        except ConnectionResetError:
            frames.append(("closed",))
            break
        if not d:
            frames.append(("closed",))
            break
        buf += d
        while len(buf) >= 9:
            n = int.from_bytes(buf[:3], "big")
            if len(buf) < 9 + n:
                break
            frames.append((buf[3], buf[4], int.from_bytes(buf[5:9], "big") & 0x7FFFFFFF, buf[9:9 + n]))
            buf = buf[9 + n:]
    return frames


def ended(frames):
    return any(f[0] in (GOAWAY, "closed") for f in frames)


def still_serving(port):
    c = tc.InferenceServerClient(f"127.0.0.1:{port}")
    check(c.is_server_live(), "ServerLive on a new connection")
    c.close()


s, gport = start(a, [])

# A unary call by hand works: HEADERS, one empty message, answered with HEADERS, DATA, trailers.
c = connect(gport)
c.sendall(frame(HEADERS, END_HEADERS, 1, request_headers()) + frame(DATA, END_STREAM, 1, b"\0\0\0\0\0"))
fr = read_frames(c, lambda f: any(x[0] == HEADERS and x[2] == 1 and x[1] & END_STREAM for x in f))
check(any(x[0] == DATA and x[2] == 1 for x in fr), f"hand-made call answered with a message: {fr}")
c.close()

# Rapid reset: streams opened and reset at once, far past the burst allowed.
c = connect(gport)
burst = b"".join(frame(HEADERS, END_HEADERS, sid, request_headers()) + frame(RST, 0, sid, struct.pack(">I", 8))
                 for sid in range(1, 2 * 3000, 2))
try:
    c.sendall(burst)
except OSError:
    pass  # the server may close before it has read everything
fr = read_frames(c, ended)
check(ended(fr), "rapid reset ends in GOAWAY or a closed connection")
c.close()
still_serving(gport)

# CONTINUATION flood: one header block split over many frames.
c = connect(gport)
block = request_headers(extra=[("x-pad", "a" * 400)])
parts = [block[i:i + 20] for i in range(0, len(block), 20)]
msg = frame(HEADERS, 0, 1, parts[0]) + b"".join(frame(CONT, 0, 1, p) for p in parts[1:-1]) + \
    frame(CONT, END_HEADERS, 1, parts[-1])
try:
    c.sendall(msg)
except OSError:
    pass
fr = read_frames(c, ended)
check(ended(fr), f"{len(parts) - 1} CONTINUATION frames end the connection")
c.close()
still_serving(gport)

# Headers over the advertised 16 KiB: that stream is refused, the connection serves on.
c = connect(gport)
big = request_headers(extra=[("x-a", "a" * 9000), ("x-b", "b" * 9000)])
c.sendall(frame(HEADERS, END_STREAM, 1, big[:16000]) + frame(CONT, END_HEADERS, 1, big[16000:]) +
          frame(HEADERS, END_HEADERS, 3, request_headers()) + frame(DATA, END_STREAM, 3, b"\0\0\0\0\0"))
fr = read_frames(c, lambda f: any(x[0] == HEADERS and x[2] == 3 and x[1] & END_STREAM for x in f))
check(any(x[0] in (HEADERS, RST) and x[2] == 1 for x in fr), f"oversized headers answered on their stream: {fr}")
check(not any(x[0] == DATA and x[2] == 1 for x in fr), "no message for the oversized stream")
check(any(x[0] == DATA and x[2] == 3 for x in fr), "the next stream on the connection is served")
c.close()

# Not HTTP/2 at all.
c = socket.create_connection(("127.0.0.1", gport), timeout=10)
c.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
check(ended(read_frames(c, ended)), "an HTTP/1.1 request is not served on the gRPC port")
c.close()
still_serving(gport)

check(s.stop() == 0, "exit status after SIGTERM")
print("ok")
