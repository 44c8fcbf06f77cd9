"""--prefix-cache-dir: a prompt served before a restart finds its KV blocks on disk after it
(usage.prompt_tokens_details.cached_tokens, servd_prefix_cache_disk_blocks_read_total) and gives the
same greedy tokens as computing it; a damaged block file is counted as rejected and the prompt is
computed instead; a foreign or garbage file in the directory is left alone or rejected, never used;
another KV dtype (another key) finds nothing."""
import glob
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from servd_harness import Servd, check, metric_value, parse_args  # noqa: E402

a = parse_args()
hd32 = os.path.join(a.work, "tiny-hd32.mpk")
if not os.path.exists(hd32):
    r = subprocess.run([a.modelpkg, "synth", "tiny-hd32", "-o", hd32, "--quiet"], capture_output=True, text=True)
    check(r.returncode == 0, f"modelpkg synth tiny-hd32: {r.stderr.strip()}")
cache = os.path.join(a.work, "prefix-dir")
shutil.rmtree(cache, ignore_errors=True)
prompt = "The quick brown fox jumps over the lazy dog. " * 6  # ~270 bytes: 16 full blocks of 16


def serve(dtype="q8_0"):
    return Servd(a, ["--model", f"{hd32}:m", "--kv-cache-dtype", dtype, "--prefix-cache-dir", cache,
                     "--access-log", "off"])


def complete(s):
    st, body = s.json("POST", "/v1/completions", {"model": "m", "prompt": prompt, "max_tokens": 6, "temperature": 0})
    check(st == 200, f"completion {st} {body}")
    details = body["usage"].get("prompt_tokens_details") or {}
    return body["choices"][0]["text"], details.get("cached_tokens", 0), body["usage"]["prompt_tokens"]


s = serve()
text0, cached, n_prompt = complete(s)
check(cached == 0, f"first time: nothing cached, got {cached}")
m = s.metrics()
written = metric_value(m, "servd_prefix_cache_disk_blocks_written_total", {"model": "m"})
check(s.stop() == 0, "exit status")
files = glob.glob(os.path.join(cache, "*", "*.kvb"))
check(len(files) >= (n_prompt - 1) // 16, f"{len(files)} block files for a {n_prompt}-token prompt (written {written})")

s = serve()
text1, cached, _ = complete(s)
check(cached == (n_prompt - 1) // 16 * 16, f"after the restart: {cached} tokens cached of {n_prompt}")
check(text1 == text0, f"same greedy text: {text1!r} vs {text0!r}")
m = s.metrics()
check(metric_value(m, "servd_prefix_cache_disk_blocks_read_total", {"model": "m"}) == (n_prompt - 1) // 16,
      f"blocks read back:\n{m}")
check(s.stop() == 0, "exit status")

# damage one file's bytes past its header, drop garbage beside the files: rejected, and computed
victim = sorted(files)[0]
with open(victim, "r+b") as f:
    f.seek(200)
    b = f.read(1)
    f.seek(200)
    f.write(bytes([b[0] ^ 0xFF]))
sub = os.path.dirname(victim)
with open(os.path.join(sub, "notes.txt"), "w") as f:
    f.write("not a block")
s = serve()
text2, cached, _ = complete(s)
check(text2 == text0, f"same text with a damaged file: {text2!r}")
m = s.metrics()
rejected = metric_value(m, "servd_prefix_cache_disk_rejected_total", {"model": "m"})
check(rejected == 1 and cached < (n_prompt - 1) // 16 * 16, f"the damaged file: rejected {rejected}, cached {cached}")
check(s.stop() == 0, "exit status")
check(os.path.basename(victim) in s.stderr() and "removed, its tokens are computed instead" in s.stderr(),
      f"the log names the file:\n{s.stderr()}")
check(os.path.exists(os.path.join(sub, "notes.txt")), "a file that is not ours is left alone")

# another dtype is another key: nothing found
s = serve("f16")
_, cached, _ = complete(s)
check(cached == 0, f"f16 after q8_0 files: {cached} cached")
check(s.stop() == 0, "exit status")
print("ok")
