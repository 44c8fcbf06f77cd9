"""`servd --model FILE.gguf` and `--model HF_FOLDER`: packed once into the package cache, then reused.

A tiny random-weight Llama (tests/llama/make_tiny.py) as a GGUF file and a Hugging Face folder:
- the first start packs the GGUF ("built" in the log) and serves it; the second reuses the entry
  ("reused", the cache folder's mtime and listing unchanged); a changed source is packed again and
  its old entry removed; `servd generate --model FILE.gguf` reuses the same entry;
- two servd started together on a Hugging Face folder with the default cache folder
  ($XDG_CACHE_HOME/servd/packages, made 0700) pack it once between them;
- a text file and an unusable cache folder are refused (exit 2) with messages saying what to do.
"""
import os
import shutil
import stat
import subprocess
import sys
import threading

from servd_harness import Servd, check, fail, parse_args, skip

HERE = os.path.dirname(os.path.abspath(__file__))
MAKE_TINY = os.path.join(HERE, "..", "llama", "make_tiny.py")

a = parse_args()
try:
    import numpy  # noqa: F401  (make_tiny.py writes the fixtures with it)
except ImportError:
    skip("numpy is missing: make_tiny.py cannot write the tiny model")

work = os.path.join(a.work, "direct-model")
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
hf, gguf = os.path.join(work, "tiny-hf"), os.path.join(work, "tiny.gguf")
r = subprocess.run([sys.executable, MAKE_TINY, hf, "--gguf", gguf], capture_output=True, text=True)
check(r.returncode == 0, f"make_tiny.py failed: {r.stderr}")
cache = os.path.join(work, "cache")


def serve(model, extra=(), env=None):
    """Starts servd on `model`, checks that it completes a prompt, stops it and returns its log."""
    s = Servd(a, ["--model", f"{model}:tiny", "--access-log", "off"] + list(extra), env=env)
    st, body = s.json("POST", "/v1/completions", {"model": "tiny", "prompt": "hello", "max_tokens": 3})
    check(st == 200 and body["choices"][0]["text"] is not None, f"completion answered {st}: {body}")
    log = s.stderr()
    check(s.stop() == 0, f"servd did not exit cleanly:\n{s.stderr()}")
    return log


def entries(d):
    return sorted(n for n in os.listdir(d) if n.endswith(".mpk"))


# 1. First start packs; the second reuses and leaves the cache folder as it was.
log = serve(gguf, ["--package-cache", cache])
check("package cache: built" in log and "package cache: reused" not in log, f"first start did not pack:\n{log}")
check(stat.S_IMODE(os.stat(cache).st_mode) == 0o700, f"cache folder mode {oct(os.stat(cache).st_mode)}")
first = entries(cache)
check(len(first) == 1 and first[0].startswith("tiny-"), f"cache entries after the first start: {first}")
mtime = os.stat(cache).st_mtime_ns
log = serve(gguf, ["--package-cache", cache])
check("package cache: reused" in log and "package cache: built" not in log, f"second start did not reuse:\n{log}")
check(os.stat(cache).st_mtime_ns == mtime and entries(cache) == first, "the second start changed the cache folder")

# 2. servd generate takes the GGUF too, through the same entry.
r = subprocess.run([a.servd, "generate", "--model", gguf, "--package-cache", cache, "--prompt", "hi",
                    "--max-tokens", "2", "--quiet"], capture_output=True, text=True, timeout=300)
check(r.returncode == 0 and "reused" in r.stderr, f"servd generate: {r.returncode}\n{r.stderr}")

# 3. A changed source (new mtime) is packed again; the old entry goes.
os.utime(gguf, (1_000_000_000, 1_000_000_000))
log = serve(gguf, ["--package-cache", cache])
check("package cache: built" in log, f"a changed source was not packed again:\n{log}")
now = entries(cache)
check(len(now) == 1 and now != first, f"cache entries after the change: {first} -> {now}")

# 4. Two servd at once on a Hugging Face folder, default cache folder: one packs, the other waits and reuses.
xdg = os.path.join(work, "xdg")
logs = [None, None]


def start(i):
    try:
        logs[i] = serve(hf, env={"XDG_CACHE_HOME": xdg})
    except SystemExit:  # check() failed in this thread: the main thread reports the missing log
        pass


threads = [threading.Thread(target=start, args=(i,)) for i in range(2)]
for t in threads:
    t.start()
for t in threads:
    t.join()
check(all(logs), "one of the two servd on the Hugging Face folder failed (see above)")
joined = "\n".join(logs)
check(joined.count("package cache: built") == 1 and joined.count("package cache: reused") == 1,
      f"two servd at once did not pack exactly once:\n{joined}")
default_dir = os.path.join(xdg, "servd", "packages")
check(len(entries(default_dir)) == 1, f"default cache folder: {os.listdir(default_dir)}")
check(stat.S_IMODE(os.stat(default_dir).st_mode) == 0o700, "default cache folder is not 0700")


def refused(args, *want):
    r = subprocess.run([a.servd, "--port", "0"] + args, capture_output=True, text=True, timeout=60)
    check(r.returncode == 2, f"servd {args}: exit {r.returncode}, expected 2:\n{r.stderr}")
    for w in want:
        check(w in r.stderr, f"servd {args}: the error does not say {w!r}:\n{r.stderr}")


# 5. Neither a package, a GGUF file nor a model folder: says what servd accepts and how to pack.
text = os.path.join(work, "notes.gguf")
with open(text, "w") as f:
    f.write("not a model\n")
refused(["--model", text], "modelpkg pack", "GGUF file", "config.json")
refused(["--model", work], "without config.json", "modelpkg pack")

# 6. A cache folder servd cannot make or write.
refused(["--model", gguf, "--package-cache", os.path.join(text, "packages")], "--package-cache", "modelpkg pack")
if os.geteuid() != 0:  # root writes anywhere
    ro = os.path.join(work, "read-only")
    os.makedirs(ro, mode=0o500)
    refused(["--model", gguf, "--package-cache", ro], "cannot write", "--package-cache")
print("OK")
