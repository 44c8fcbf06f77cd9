"""A tool, not a test: greedy completions of prompts that share a long beginning, served by servd with
the prefix cache on and off (the default model unless --model), compared token for token, with the
largest difference of a chosen token's log-probability. Requests go one at a time, so with the cache
on every prompt after the first reuses the shared blocks (cached_tokens is printed). Then the first
prompt's token ids cut to 16q+1 .. 16q+16 tokens, each sent twice: the second time all but the last 1
to 16 tokens are cached, so the rest is computed as a chunk of that many rows (one row: the matmul's
single-row tiles).

usage: python3 tests/llama/prefix_cache_vs_off.py [--servd build/daemon/servd] [--model PKG]
"""
import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request

root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ap = argparse.ArgumentParser()
ap.add_argument("--servd", default=os.path.join(root, "build", "daemon", "servd"))
ap.add_argument("--model", default=os.path.join(root, ".cache", "smollm2-135m-instruct-q4_1.mpk"))
ap.add_argument("--port", type=int, default=18533)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--tokens", type=int, default=32)
a = ap.parse_args()

SYSTEM = ("You are a helpful assistant for a public library. Answer questions about opening hours, "
          "borrowing rules, late fees, events for children and adults, the reading room, printing and "
          "scanning, the digital catalogue and e-books. Be concise and polite; if you do not know an "
          "answer, say so and suggest asking the front desk. Opening hours: Monday to Friday 9 to 20, "
          "Saturday 10 to 16, closed on Sunday. Loans last three weeks and can be renewed twice. ") * 3
QUESTIONS = ["When are you open on Saturday?", "How long can I keep a book?", "Do you have events for kids?",
             "Can I print documents here?", "What happens if I return a book late?",
             "Where is the reading room?"]


def post(path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{a.port}{path}", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)


def serve(extra):
    p = subprocess.Popen([a.servd, "--model", a.model, "--port", str(a.port), "--threads", str(a.threads),
                          "--access-log", "off"] + extra, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(600):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{a.port}/v2/health/ready", timeout=1)
            return p
        except Exception:
            time.sleep(0.1)
    p.kill()
    sys.exit("servd did not become ready")


def run(extra):
    p = serve(extra)
    out = []
    try:
        history = ""
        for q in QUESTIONS:
            prompt = f"{SYSTEM}\nQuestion: {q}\nAnswer:"
            r = post("/v1/completions", {"prompt": prompt, "max_tokens": a.tokens, "temperature": 0,
                                         "logprobs": 0, "ignore_eos": True})
            out.append((prompt, r))
            history = prompt + r["choices"][0]["text"]
        # A second turn resends the whole first exchange.
        prompt = f"{history}\nQuestion: And on Sunday?\nAnswer:"
        out.append((prompt, post("/v1/completions", {"prompt": prompt, "max_tokens": a.tokens, "temperature": 0,
                                                     "logprobs": 0, "ignore_eos": True})))
        ids = post("/tokenize", {"prompt": out[0][0], "add_special_tokens": False})["tokens"]
        q = (len(ids) - 17) // 16
        for left in range(1, 17):
            cut = ids[:16 * q + left]
            body = {"prompt": cut, "max_tokens": a.tokens, "temperature": 0, "logprobs": 0, "ignore_eos": True}
            post("/v1/completions", body)  # with the cache on, this computes the blocks the next one finds
            out.append((cut, post("/v1/completions", body)))
    finally:
        p.terminate()
        p.wait()
    return out


on, off = run([]), run(["--no-prefix-cache"])
worst, same = 0.0, 0
for (prompt, r1), (_, r0) in zip(on, off):
    c1, c0 = r1["choices"][0], r0["choices"][0]
    t1, t0 = c1["logprobs"]["tokens"], c0["logprobs"]["tokens"]
    n = next((i for i, (x, y) in enumerate(zip(t1, t0)) if x != y), None)
    lp1, lp0 = c1["logprobs"]["token_logprobs"], c0["logprobs"]["token_logprobs"]
    upto = n if n is not None else len(lp1)
    d = max((abs(x - y) for x, y in zip(lp1[:upto], lp0[:upto])), default=0.0)
    worst = max(worst, d)
    same += n is None
    print(f"prompt {r1['usage']['prompt_tokens']:4d} tokens, cached {r1['usage']['prompt_tokens_details']['cached_tokens']:4d}: "
          f"{'identical' if n is None else f'first difference at token {n}'}, "
          f"max |logprob on - off| {d:.2e}")
print(f"{same} of {len(on)} completions identical; largest chosen-token logprob difference {worst:.2e}")
