"""KV-cache events from a running servd, read by a subscriber written from vLLM's published schema
(vllm/distributed/kv_events.py: ZMQ PUB frames [topic, seq (8 bytes big-endian), msgpack batch], a
batch [ts, [event, ...]], events as tagged arrays) with pyzmq and msgpack, not with servd's code:

- the first batch (AllBlocksCleared, sent before this subscriber connected) comes back through the
  replay socket, ended by the -1 marker;
- a prompt of known token ids gives BlockStored events for its full blocks, whose hashes are llm-d's
  (sha256 over canonical CBOR, computed here with cbor2 and hashlib), chained parent to child, with
  the tokens, the block size and the medium;
- blocks evicted to make room give BlockRemoved events naming hashes stored before;
- sequence numbers are consecutive, the topic is the configured one, and the counters in /metrics
  agree with what arrived;
- an endpoint that cannot be bound stops servd at startup with exit status 2 and names it;
- an endpoint without a wildcard is connected to: a subscriber that binds (llm-d's endpoint picker)
  gets the events, under the default topic kv@HOST@MODEL."""
import hashlib
import os
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from servd_harness import Servd, check, metric_value, parse_args, skip, tiny_llama  # noqa: E402

try:
    import cbor2
    import msgpack
    import zmq
except ImportError as e:
    skip(f"{e.name} is not installed in .venv-test (scripts/install-deps.sh)")

BLOCK = 16


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def llmd_hash(obj):
    return int.from_bytes(hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()[24:], "big")


def chain_hashes(tokens):
    parent, out = llmd_hash(""), []
    for i in range(0, len(tokens) - len(tokens) % BLOCK, BLOCK):
        parent = llmd_hash([parent, tokens[i:i + BLOCK], None])
        out.append(parent)
    return out


a = parse_args()
llama = tiny_llama(a)
pub_port, replay_port = free_port(), free_port()
ctx = zmq.Context()
sub = ctx.socket(zmq.SUB)
sub.connect(f"tcp://127.0.0.1:{pub_port}")
sub.setsockopt(zmq.SUBSCRIBE, b"")
s = Servd(a, ["--model", f"{llama}:tiny", "--kv-blocks", "12", "--speculative", "off",
              "--kv-events-endpoint", f"tcp://*:{pub_port}",
              "--kv-events-replay-endpoint", f"tcp://127.0.0.1:{replay_port}",
              "--kv-events-topic", "kv@test-pod@{model}"])

# The batch sent at load, before anyone listened: asked for through the replay socket.
# A DEALER with REQ's empty delimiter frame: a REQ socket would take only the first of the answers.
replay = ctx.socket(zmq.DEALER)
replay.connect(f"tcp://127.0.0.1:{replay_port}")
replay.send_multipart([b"", (0).to_bytes(8, "big")])
got = []
while True:
    check(replay.poll(5000), "no answer from the replay socket")
    empty, seq, payload = replay.recv_multipart()
    check(empty == b"", f"delimiter frame {empty!r}")
    if not payload:
        check(int.from_bytes(seq, "big", signed=True) == -1, f"end marker: {seq!r}")
        break
    got.append((int.from_bytes(seq, "big"), msgpack.unpackb(payload, raw=False)))
check(got and got[0][0] == 0, f"replayed batches: {got}")
ts, events = got[0][1]
check(isinstance(ts, float) and abs(ts - time.time()) < 600, f"batch timestamp {ts}")
check(events == [["AllBlocksCleared"]], f"first batch: {events}")

received = []  # (seq, event)
last_seq = 0


def drain(until, timeout=10):
    """Reads batches until until(events so far) holds."""
    global last_seq
    deadline = time.monotonic() + timeout
    while not until() and time.monotonic() < deadline:
        if not sub.poll(100):
            continue
        topic, seq, payload = sub.recv_multipart()
        check(topic == b"kv@test-pod@tiny", f"topic {topic!r}")
        n = int.from_bytes(seq, "big")
        batch = msgpack.unpackb(payload, raw=False)
        if n == 0:  # connected early enough to see it live too: the replayed batch, again
            check(batch[1] == [["AllBlocksCleared"]], f"batch 0 live: {batch}")
            continue
        check(n == last_seq + 1, f"sequence {n} after {last_seq}")
        last_seq = n
        check(isinstance(batch, list) and len(batch) == 2, f"batch shape: {batch!r}")
        received.extend(batch[1])
    check(until(), f"events did not arrive: {received}")


def stored():
    return [e for e in received if e[0] == "BlockStored"]


# A prompt of 40 known token ids: two full blocks (the last 8 tokens and the generated one do not fill a third).
prompt = [(i * 7919) % 250 + 3 for i in range(40)]
body = {"model": "tiny", "prompt": prompt, "max_tokens": 1, "temperature": 0}
st, _, data = s.request("POST", "/v1/completions", body)
check(st == 200, f"completion: {st} {data[:200]}")
want = chain_hashes(prompt)
drain(lambda: len(stored()) >= 2)
ev = stored()
check(len(ev) == 2, f"stored events: {ev}")
for i, e in enumerate(ev):
    tag, hashes, parent, tokens, block_size, lora, medium = e
    check(hashes == [want[i]], f"block {i}: hash {hashes} != llm-d's {want[i]}")
    check(parent == (want[i - 1] if i else None), f"block {i}: parent {parent}")
    check(tokens == prompt[i * BLOCK:(i + 1) * BLOCK], f"block {i}: tokens {tokens}")
    check(block_size == BLOCK and lora is None and medium == "CPU", f"block {i}: {e}")

# The same prompt again: found in the cache, nothing new stored.
st, _, _ = s.request("POST", "/v1/completions", body)
check(st == 200, "second completion")
time.sleep(0.3)
drain(lambda: True)
check(len(stored()) == 2, f"a cache hit stored blocks: {stored()}")

# Other prompts fill the 12 blocks: the first prompt's blocks are evicted, and said to be.
for k in range(6):
    other = [(k * 31 + i * 13) % 240 + 5 for i in range(40)]
    st, _, _ = s.request("POST", "/v1/completions", dict(body, prompt=other))
    check(st == 200, f"filler completion {k}")
drain(lambda: any(e[0] == "BlockRemoved" and e[1] == [want[1]] for e in received))
removed = [e for e in received if e[0] == "BlockRemoved"]
known = {e[1][0] for e in stored()}
for e in removed:
    check(len(e) == 3 and e[2] == "CPU", f"BlockRemoved shape: {e}")
    check(e[1][0] in known, f"removed a block never stored: {e}")

# Everything queued arrives (the replayed batch's one event included), nothing dropped.
text = s.metrics()
queued = metric_value(text, "servd_kv_events_queued_total", {"model": "tiny"})
dropped = metric_value(text, "servd_kv_events_dropped_total", {"model": "tiny"})
check(dropped == 0, f"dropped events: {dropped}")
drain(lambda: len(received) + 1 >= queued)
check(queued == len(received) + 1, f"queued {queued}, received {len(received)} + the replayed one")
check(s.stop() == 0, "exit status")

# A port already bound: a configuration error at startup, naming the endpoint.
taken = ctx.socket(zmq.PUB)
port = free_port()
taken.bind(f"tcp://*:{port}")
r = subprocess.run([a.servd, "--host", "127.0.0.1", "--port", "0", "--model", f"{llama}:tiny",
                    "--kv-events-endpoint", f"tcp://*:{port}"], capture_output=True, text=True, timeout=60)
check(r.returncode == 2, f"exit status {r.returncode} with the endpoint taken:\n{r.stderr}")
check(f"--kv-events-endpoint tcp://*:{port}: cannot bind" in r.stderr, f"stderr: {r.stderr}")
taken.close()

# llm-d's topology: the subscriber binds, servd connects to it (an endpoint without a wildcard).
port = free_port()
collector = ctx.socket(zmq.SUB)
collector.bind(f"tcp://127.0.0.1:{port}")
collector.setsockopt(zmq.SUBSCRIBE, b"kv@")
s3 = Servd(a, ["--model", f"{llama}:tiny", "--kv-events-endpoint", f"tcp://127.0.0.1:{port}"])
# A bound SUB sends its subscription to a new peer only once it runs (as a live subscriber does).
for _ in range(10):
    collector.poll(50)
st, _, _ = s3.request("POST", "/v1/completions", body)
check(st == 200, "completion with a connecting publisher")
got_stored = False
deadline = time.monotonic() + 10
while not got_stored and time.monotonic() < deadline:
    if collector.poll(100):
        topic, _, payload = collector.recv_multipart()
        check(topic.endswith(b"@tiny"), f"default topic {topic!r}")
        got_stored = any(e[0] == "BlockStored" and e[1] == [want[0]] for e in msgpack.unpackb(payload, raw=False)[1])
check(got_stored, "no BlockStored reached a subscriber that binds")
check(s3.stop() == 0, "exit status")
print("ok")
