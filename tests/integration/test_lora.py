"""LoRA adapters on a running servd: `--lora NAME=PATH[,base=MODEL]` at startup and vLLM's
/v1/load_lora_adapter at run time, a request picks one by `model` on the OpenAI, Anthropic and
Ollama routes, /v1/models lists them with `parent`, `--max-loras` evicts idle ones least recently used
first (and reads them again when asked), load/unload under traffic loses no request, prompts sharing
a beginning under different adapters never share cached KV blocks, vllm:lora_requests_info.

Greedy text of each adapter equals the float64 reference with merged weights (tests/llama's
llama_ref.py and lora_adapters.py), detokenized by the server.
"""
import json
import os
import shutil
import subprocess
import sys
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "llama"))
from servd_harness import Servd, check, parse_args, skip  # noqa: E402

try:
    import numpy  # noqa: F401
    import llama_ref
    import lora_adapters as la
except ImportError as e:
    skip(f"numpy missing ({e}): .venv-test")

a = parse_args()
hf, pkg = os.path.join(a.work, "lora-hf"), os.path.join(a.work, "lora-tiny.mpk")
shutil.rmtree(hf, ignore_errors=True)  # packed afresh: the package carries this tree's model code
r = subprocess.run([a.modelpkg, "synth", "tiny", "--hf-out", hf, "-o", pkg, "--quiet"], capture_output=True, text=True)
check(r.returncode == 0, f"modelpkg synth: {r.stderr}")
cfg, w = llama_ref.load_folder(hf)
ad = {n: la.write_peft(os.path.join(a.work, "lora-" + n), cfg, r, alpha, seed=s, scale_b=0.2)
      for n, r, alpha, s in (("a1", 4, 8, 21), ("a2", 8, 8, 22), ("a3", 16, 32, 23))}
PROMPT = "Once upon a time, in a land far away, there lived a curious little fox who"
N = 10

s = Servd(a, ["--model", f"{pkg}:tiny", "--lora", f"a1={ad['a1']}", "--lora", f"a2={ad['a2']},base=tiny",
              "--max-loras", "2"], env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"})

st, models = s.json("GET", "/v1/models")
by = {m["id"]: m for m in models["data"]}
check(st == 200 and by.get("a1", {}).get("parent") == "tiny" and by.get("a2", {}).get("root") == ad["a2"]
      and "parent" not in by["tiny"], f"/v1/models lists the adapters with parent: {models}")
st, one = s.json("GET", "/v1/models/a1")
check(st == 200 and one["parent"] == "tiny", f"/v1/models/a1: {st} {one}")

st, tok = s.json("POST", "/tokenize", {"model": "tiny", "prompt": PROMPT, "add_special_tokens": True})
check(st == 200, f"/tokenize: {st} {tok}")
ids = tok["tokens"]


def expected(name):
    weights = w if name == "tiny" else la.merged(cfg, w, ad[name])
    out = llama_ref.greedy(cfg, weights, ids, N)
    st, d = s.json("POST", "/detokenize", {"model": "tiny", "tokens": out})
    check(st == 200, f"/detokenize: {st} {d}")
    return d["prompt"]


def complete(model, prompt=PROMPT):
    st, r = s.json("POST", "/v1/completions", {"model": model, "prompt": prompt, "max_tokens": N, "temperature": 0,
                                               "ignore_eos": True})
    check(st == 200, f"completion with {model}: {st} {r}")
    check(r["model"] == model, f"the response names the adapter: {r['model']} != {model}")
    return r["choices"][0]["text"]


want = {m: expected(m) for m in ("tiny", "a1", "a2", "a3")}
check(len(set(want.values())) == 4, f"the adapters change the greedy text: {want}")
for m in ("tiny", "a1", "a2", "tiny", "a2"):  # after the base, the same prompt under an adapter: no cached blocks
    got = complete(m)
    check(got == want[m], f"{m}: greedy text {got!r} == merged float64 reference {want[m]!r}")
print("ok   --lora adapters equal their merged float64 models; no cached block crosses adapters")

# Mixed batches: 12 concurrent requests over the base and two adapters.
results, lock = [], threading.Lock()


def worker(m):
    t = complete(m)
    with lock:
        results.append((m, t))


ts = [threading.Thread(target=worker, args=(m,)) for m in ["tiny", "a1", "a2"] * 4]
[t.start() for t in ts]
[t.join() for t in ts]
bad = [(m, t) for m, t in results if t != want[m]]
check(len(results) == 12 and not bad, f"concurrent mixed requests give each adapter's own text: {bad}")
print("ok   12 concurrent requests over base, a1 and a2: each equals its adapter alone")

# Other routes pick adapters by model too.
st, h, body = s.request("POST", "/v1/messages", {"model": "a1", "max_tokens": 4,
                                                 "messages": [{"role": "user", "content": "hi"}]},
                        headers={"anthropic-version": "2023-06-01"})
check(st == 200 and json.loads(body)["model"] == "a1", f"Anthropic messages with a1: {st} {body[:200]}")
st, h, body = s.request("POST", "/api/generate", {"model": "a2", "prompt": PROMPT, "raw": True, "stream": False,
                                                  "options": {"num_predict": N, "temperature": 0}})
check(st == 200 and json.loads(body)["response"] == want["a2"][:len(json.loads(body)["response"])],
      f"Ollama generate with a2: {st} {body[:300]}")
st, h, body = s.request("POST", "/v1/completions", {"model": "nope", "prompt": "x", "max_tokens": 1})
check(st == 404, f"an unknown model or adapter is a 404: {st}")
print("ok   Anthropic and Ollama routes take adapters by model; unknown names 404")

# Run-time loading; --max-loras 2: a3 evicts the least recently used idle adapter, which is read again.
st, h, body = s.request("POST", "/v1/load_lora_adapter", {"lora_name": "a3", "lora_path": ad["a3"]})
check(st == 200 and b"added successfully" in body, f"load a3: {st} {body}")
st, h, body = s.request("POST", "/v1/load_lora_adapter", {"lora_name": "a3", "lora_path": ad["a3"]})
check(st == 400, f"loading a3 twice: {st} {body}")
for m in ("a3", "a1", "a2", "a3"):
    got = complete(m)
    check(got == want[m], f"{m} after evictions: {got!r} == {want[m]!r}")
print("ok   --max-loras 2 with three adapters: evicted adapters read again, outputs unchanged")

# Load and unload under traffic: every request of the adapters in use completes correctly.
stop = threading.Event()
errors = []


def traffic(m):
    while not stop.is_set():
        try:
            t = complete(m)
            if t != want[m]:
                errors.append((m, t))
        except SystemExit as e:  # check() failed inside the thread
            errors.append((m, str(e)))
            return


ts = [threading.Thread(target=traffic, args=(m,)) for m in ("a1", "a2", "tiny")]
[t.start() for t in ts]
for i in range(4):
    st, _, body = s.request("POST", "/v1/unload_lora_adapter", {"lora_name": "a3"})
    check(st == 200, f"unload a3 under traffic: {st} {body}")
    st, _, body = s.request("POST", "/v1/load_lora_adapter", {"lora_name": "a3", "lora_path": ad["a3"]})
    check(st == 200, f"load a3 under traffic: {st} {body}")
stop.set()
[t.join() for t in ts]
check(not errors, f"requests during load/unload: {errors[:3]}")
st, _, body = s.request("POST", "/v1/unload_lora_adapter", {"lora_name": "a3"})
check(st == 200, f"unload a3: {st}")
st, _, body = s.request("POST", "/v1/completions", {"model": "a3", "prompt": "x", "max_tokens": 1})
check(st == 404, f"an unloaded adapter is a 404: {st}")
st, _, body = s.request("POST", "/v1/unload_lora_adapter", {"lora_name": "a3"})
check(st == 404, f"unloading an unknown adapter: {st}")
bad_dir = os.path.join(a.work, "lora-bad")
la.write_peft(bad_dir, cfg, 4, 8, seed=5, layers=cfg["num_hidden_layers"] + 1)
st, _, body = s.request("POST", "/v1/load_lora_adapter", {"lora_name": "bad", "lora_path": bad_dir})
check(st == 400 and b"layers." in body and complete("a1") == want["a1"],
      f"a bad adapter is a 400 naming its tensor, nothing else affected: {st} {body[:300]}")
print("ok   load/unload under traffic lost no request; unloaded and bad adapters refused")

text = s.metrics()
lines = [l for l in text.splitlines() if l.startswith("vllm:lora_requests_info{")]
check(len(lines) == 1 and 'max_lora="2"' in lines[0] and "running_lora_adapters=" in lines[0]
      and "waiting_lora_adapters=" in lines[0], f"vllm:lora_requests_info: {lines}")
print("ok   vllm:lora_requests_info")
s.stop()

# --max-loras 1: an adapter a running request holds is never evicted; another adapter waits (429).
import http.client  # noqa: E402
s = Servd(a, ["--model", f"{pkg}:tiny", "--lora", f"a1={ad['a1']}", "--lora", f"a2={ad['a2']}", "--max-loras", "1"])
c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=120)
c.request("POST", "/v1/completions", json.dumps({"model": "a1", "prompt": PROMPT, "max_tokens": 400, "temperature": 0,
                                                 "ignore_eos": True, "stream": True}),
          {"Content-Type": "application/json"})
resp = c.getresponse()
first = resp.readline()
st, _, body = s.request("POST", "/v1/completions", {"model": "a2", "prompt": PROMPT, "max_tokens": 2})
rest = resp.read().decode()
c.close()
check(resp.status == 200 and first.startswith(b"data:") and "[DONE]" in rest and '"error"' not in rest,
      f"the streaming a1 request ran to its end: {resp.status} {rest[-200:]}")
check(st == 429, f"a2 while a1's only slot is held: 429, got {st} {body[:200]}")
check(complete("a2") == want["a2"] and complete("a1") == want["a1"],
      "once a1's request ended, a2 evicts it, and a1 is read again")
s.stop()
print("ok   --max-loras 1: an adapter in use is never evicted; the other adapter waits with a 429")

# Off unless enabled; a bad --lora stops startup naming the tensor.
s = Servd(a, ["--model", f"{pkg}:tiny"])
st, _, body = s.request("POST", "/v1/load_lora_adapter", {"lora_name": "a3", "lora_path": ad["a3"]})
check(st == 404 and b"VLLM_ALLOW_RUNTIME_LORA_UPDATING" in body, f"runtime loading off by default: {st} {body}")
s.stop()
r = subprocess.run([a.servd, "--host", "127.0.0.1", "--port", "0", "--model", f"{pkg}:tiny", "--lora",
                    f"bad={bad_dir}"], capture_output=True, text=True, timeout=120)
check(r.returncode != 0 and "layers." in r.stderr and "lora_A" in r.stderr,
      f"servd --lora with a bad adapter exits non-zero naming the tensor: {r.returncode} {r.stderr[-400:]}")
print("ok   runtime loading off by default; a bad --lora stops startup")

# A package whose model code predates adapters (no lora_info hook) is refused, not served as the base.
old_code = os.path.join(a.work, "old-code", "llama")
shutil.rmtree(os.path.dirname(old_code), ignore_errors=True)
shutil.copytree(os.path.join(HERE, "..", "..", "models", "llama"), old_code,
                ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "CMakeLists.txt"))
src = open(os.path.join(old_code, "model.py")).read()
open(os.path.join(old_code, "model.py"), "w").write(src.replace("def lora_info(self):", "def _no_lora_info(self):"))
old_pkg = os.path.join(a.work, "old-code.mpk")
r = subprocess.run([a.modelpkg, "pack", hf, "-o", old_pkg, "--code", old_code, "--quiet"], capture_output=True,
                   text=True)
check(r.returncode == 0, f"pack with the old model code: {r.stderr}")
r = subprocess.run([a.servd, "--host", "127.0.0.1", "--port", "0", "--model", f"{old_pkg}:tiny", "--lora",
                    f"a1={ad['a1']}"], capture_output=True, text=True, timeout=120)
check(r.returncode != 0 and "applies no LoRA adapters" in r.stderr,
      f"model code without adapters: --lora refused: {r.returncode} {r.stderr[-300:]}")
print("ok   a package whose model code applies no adapters refuses them")
print("all LoRA serving checks passed")
