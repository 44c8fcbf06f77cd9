#!/usr/bin/env python3
"""A small endpoint picker for servd replicas, as llm-d's precise prefix-cache scorer routes: it
subscribes to every replica's KV-cache events (ZeroMQ, vLLM's format), keeps an index of which
replica holds which block hash, hashes each prompt's full blocks the way llm-d's indexer does
(sha256 over canonical CBOR, chained from the hash of the seed ""), and sends the request to the
replica holding the longest run of its leading blocks; ties go to the replica with the fewest
requests queued and running (vllm:num_requests_waiting + vllm:num_requests_running, the
model-server protocol's metrics), then to the one caching fewest blocks (from its events: a new
prefix goes where there is room), then at random.

As a module (tests/integration/test_kv_routing.py): Router([...]).pick(token_ids). As a script, a
demonstration: scripts/kv_router.py --replica http://h1:8000=tcp://h1:5557 --replica ... --prompt-ids
1,2,3,... prints the replica each prompt would go to. Needs pyzmq, msgpack and cbor2."""
import argparse
import hashlib
import random
import threading
import urllib.request

import cbor2
import msgpack
import zmq


def block_hashes(tokens, block_size, seed=""):
    """llm-d's chained block hashes of the full blocks of tokens."""
    def h(obj):
        return int.from_bytes(hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()[24:], "big")

    parent, out = h(seed), []
    for i in range(0, len(tokens) - len(tokens) % block_size, block_size):
        parent = h([parent, list(tokens[i:i + block_size]), None])
        out.append(parent)
    return out


class Replica:
    def __init__(self, url, events, ctx):
        self.url, self.blocks, self.lock = url.rstrip("/"), set(), threading.Lock()
        self.sub = ctx.socket(zmq.SUB)
        self.sub.connect(events)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.batches = 0

    def apply(self, payload):
        _, events = msgpack.unpackb(payload, raw=False)[:2]
        with self.lock:
            for e in events:
                if e[0] == "BlockStored":
                    self.blocks.update(e[1])
                elif e[0] == "BlockRemoved":
                    self.blocks.difference_update(e[1])
                elif e[0] == "AllBlocksCleared":
                    self.blocks.clear()
            self.batches += 1

    def load(self):
        """Requests queued and running, from /metrics (the protocol's two gauges)."""
        text = urllib.request.urlopen(self.url + "/metrics", timeout=10).read().decode()
        n = 0.0
        for line in text.splitlines():
            if line.startswith(("vllm:num_requests_waiting{", "vllm:num_requests_running{")):
                n += float(line.rsplit(" ", 1)[1])
        return n

    def prefix_blocks(self, hashes):
        with self.lock:
            n = 0
            for x in hashes:
                if x not in self.blocks:
                    break
                n += 1
            return n


class Router:
    def __init__(self, replicas, block_size=16, seed=None):
        """replicas: [(http base URL, events endpoint)]."""
        self.ctx = zmq.Context()
        self.replicas = [Replica(u, e, self.ctx) for u, e in replicas]
        self.block_size = block_size
        self.rng = random.Random(seed)
        self.stop = False
        self.poller = zmq.Poller()
        for r in self.replicas:
            self.poller.register(r.sub, zmq.POLLIN)
        self.thread = threading.Thread(target=self._listen, daemon=True)
        self.thread.start()

    def _listen(self):
        by_sock = {r.sub: r for r in self.replicas}
        while not self.stop:
            for sock, _ in self.poller.poll(50):
                _, _, payload = sock.recv_multipart()
                by_sock[sock].apply(payload)

    def pick(self, tokens):
        """(replica index, leading blocks it holds)."""
        hashes = block_hashes(tokens, self.block_size)
        held = [r.prefix_blocks(hashes) for r in self.replicas]
        best = max(held)
        cands = [i for i, n in enumerate(held) if n == best]
        for key in (lambda i: self.replicas[i].load(), lambda i: len(self.replicas[i].blocks)):
            if len(cands) > 1:
                score = {i: key(i) for i in cands}
                least = min(score.values())
                cands = [i for i in cands if score[i] == least]
        return self.rng.choice(cands), best

    def close(self):
        self.stop = True
        self.thread.join()
        for r in self.replicas:
            r.sub.close(0)
        self.ctx.term()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--replica", action="append", required=True, help="URL=EVENTS, e.g. http://h:8000=tcp://h:5557")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--prompt-ids", action="append", required=True, help="comma-separated token ids")
    a = p.parse_args()
    import time
    router = Router([tuple(x.split("=", 1)) for x in a.replica], a.block_size)
    time.sleep(0.5)  # subscriptions reach the publishers
    for ids in a.prompt_ids:
        i, n = router.pick([int(x) for x in ids.split(",")])
        print(f"{router.replicas[i].url} ({n} leading blocks cached there)")
    router.close()


if __name__ == "__main__":
    main()
