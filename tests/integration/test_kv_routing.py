"""Two servd replicas behind a small endpoint picker that routes by their KV-cache events and
metrics (scripts/kv_router.py, as llm-d's precise prefix-cache scorer), against random routing, on a
shared-prefix workload: 8 system prompts of 16 blocks, each request one of them plus a question of
its own. Each replica's KV cache holds half of the prefixes, so random routing makes both
replicas cycle through all of them and evict, while prefix routing keeps each prefix on one.

Targets: a request whose prefix some replica holds lands on one that holds it >= 90% of the time
(the replica's own account: cached_tokens covers the prefix), and the prefix-cache hit rate
(cached / prompt tokens) is >= 1.8x random routing's."""
import importlib.util
import os
import random
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from servd_harness import Servd, check, parse_args, skip, tiny_llama_long  # noqa: E402

try:
    import cbor2  # noqa: F401
    import msgpack  # noqa: F401
    import zmq  # noqa: F401
except ImportError as e:
    skip(f"{e.name} is not installed in .venv-test (scripts/install-deps.sh)")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
spec = importlib.util.spec_from_file_location("kv_router", os.path.join(ROOT, "scripts", "kv_router.py"))
kv_router = importlib.util.module_from_spec(spec)
spec.loader.exec_module(kv_router)

BLOCK, GROUPS, PREFIX_BLOCKS, SUFFIX, REQUESTS = 16, 8, 16, 24, 200
KV_BLOCKS = 72  # 8 prefixes x 16 blocks = 128: one replica holds half of them, and a request's own


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


a = parse_args()
llama = tiny_llama_long(a, "tiny-1k", context=1024)
rng = random.Random(7)
prefixes = [[rng.randrange(3, 250) for _ in range(PREFIX_BLOCKS * BLOCK)] for _ in range(GROUPS)]
workload = []
for i in range(REQUESTS):
    g = rng.randrange(GROUPS)
    workload.append((g, prefixes[g] + [rng.randrange(3, 250) for _ in range(SUFFIX)]))


def run(policy):
    ports = [free_port() for _ in range(2)]
    reps = [Servd(a, ["--model", f"{llama}:tiny", "--kv-blocks", str(KV_BLOCKS), "--speculative", "off",
                      "--kv-events-endpoint", f"tcp://*:{p}"]) for p in ports]
    router = kv_router.Router([(r.url, f"tcp://127.0.0.1:{p}") for r, p in zip(reps, ports)], BLOCK, seed=1)
    time.sleep(0.5)  # the subscriptions reach the publishers
    pick_rng = random.Random(3)
    prompt = cached = 0
    held_requests = landed = 0
    for g, tokens in workload:
        if policy == "prefix":
            i, n = router.pick(tokens)
        else:
            i, n = pick_rng.randrange(2), 0
        # Does some replica hold this prefix now (from the events)?
        hashes = kv_router.block_hashes(tokens, BLOCK)[:PREFIX_BLOCKS]
        someone = any(r.prefix_blocks(hashes) == PREFIX_BLOCKS for r in router.replicas)
        st, body = reps[i].json("POST", "/v1/completions",
                                {"model": "tiny", "prompt": tokens, "max_tokens": 1, "temperature": 0})
        check(st == 200, f"{policy}: completion {st} {body}")
        c = body["usage"]["prompt_tokens_details"]["cached_tokens"]
        prompt += body["usage"]["prompt_tokens"]
        cached += c
        if someone:
            held_requests += 1
            landed += c >= PREFIX_BLOCKS * BLOCK
        # The events of this request reach the router before the next decision, as a busy cluster's
        # would between requests to the same prefix.
        deadline = time.monotonic() + 2
        want = set(kv_router.block_hashes(tokens, BLOCK))
        while time.monotonic() < deadline and not want <= router.replicas[i].blocks:
            time.sleep(0.005)
    router.close()
    for r in reps:
        check(r.stop() == 0, "replica exit status")
    return cached / prompt, (landed / held_requests if held_requests else 0.0), held_requests


hit_prefix, landed, n_held = run("prefix")
hit_random, landed_random, _ = run("random")
print(f"prefix routing: hit rate {hit_prefix:.3f}, landed on the holder {landed:.3f} of {n_held} requests; "
      f"random: hit rate {hit_random:.3f} (landed {landed_random:.3f}); ratio {hit_prefix / max(hit_random, 1e-9):.2f}")
check(landed >= 0.90, f"requests landing on the replica holding their prefix: {landed:.3f} < 0.90")
check(hit_prefix >= 1.8 * hit_random, f"hit rate {hit_prefix:.3f} is not 1.8x random's {hit_random:.3f}")
print("ok")
