"""--kv-cache-dtype (and the config's kv_cache_dtype): the load log and /metrics name the dtype and the
tokens the cache holds; the same number of blocks takes the dtype's bytes (q8_0 about half of f16);
completions are served from a q8_0 and a q4_0 cache; a quantized cache on a model whose head_dim is
not a multiple of 32 fails the start with a clear error, as does a name that is not a cache dtype."""
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from servd_harness import Servd, check, metric_value, parse_args, tiny_llama  # noqa: E402

a = parse_args()
hd32 = os.path.join(a.work, "tiny-hd32.mpk")
if not os.path.exists(hd32):
    r = subprocess.run([a.modelpkg, "synth", "tiny-hd32", "-o", hd32, "--quiet"], capture_output=True, text=True)
    check(r.returncode == 0, f"modelpkg synth tiny-hd32: {r.stderr.strip()}")

bytes_of = {}
for dtype in ("f16", "q8_0", "q4_0"):
    s = Servd(a, ["--model", f"{hd32}:m", "--kv-cache-dtype", dtype, "--kv-blocks", "64", "--access-log", "off"])
    st, body = s.json("POST", "/v1/completions", {"model": "m", "prompt": "hello there", "max_tokens": 8,
                                                  "temperature": 0})
    check(st == 200 and body["usage"]["completion_tokens"] == 8, f"{dtype}: completion {st} {body}")
    m = s.metrics()
    check(metric_value(m, "servd_kv_cache_info", {"model": "m", "dtype": dtype, "block_size": "16"}) == 1,
          f"{dtype}: servd_kv_cache_info names the dtype:\n{m}")
    check(metric_value(m, "servd_kv_cache_tokens_capacity", {"model": "m"}) == 64 * 16, f"{dtype}: tokens")
    bytes_of[dtype] = metric_value(m, "servd_kv_cache_bytes", {"model": "m"})
    check(s.stop() == 0, "exit status")
    log = s.stderr()
    check(re.search(rf"KV cache 64 blocks x 16 tokens = 1024 tokens, [0-9.]+ [kMG]B \({dtype}, 1 rank\)", log),
          f"{dtype}: the load log names the dtype and tokens:\n{log}")
# tiny-hd32: 2 layers x 2 kv heads x 32 dims; a run of 16 tokens: f16 1024 bytes, q8_0 544 (scales and
# codes), q4_0 320 (rounded to 64 bytes)
check(bytes_of["f16"] == 64 * 2 * 2 * 2 * 1024, f"f16 bytes {bytes_of['f16']}")
check(bytes_of["q8_0"] == 64 * 2 * 2 * 2 * 576, f"q8_0 bytes {bytes_of['q8_0']}")
check(bytes_of["q4_0"] == 64 * 2 * 2 * 2 * 320, f"q4_0 bytes {bytes_of['q4_0']}")

# the config file: top level, and a model's own value winning
cfg = os.path.join(a.work, "kv-dtype.json")
with open(cfg, "w") as f:
    json.dump({"kv_cache_dtype": "q8_0", "access_log": "off",
               "models": [{"path": hd32, "name": "a"}, {"path": hd32, "name": "b", "kv_cache_dtype": "bf16"}]}, f)
s = Servd(a, ["--config", cfg])
m = s.metrics()
check(metric_value(m, "servd_kv_cache_info", {"model": "a", "dtype": "q8_0", "block_size": "16"}) == 1, "a: q8_0")
check(metric_value(m, "servd_kv_cache_info", {"model": "b", "dtype": "bf16", "block_size": "16"}) == 1, "b: bf16")
check(s.stop() == 0, "exit status")

# refusals: the tiny model's head_dim is 16; q4_1 is no cache dtype
tiny = tiny_llama(a)
for args, want in ((["--model", f"{tiny}:t", "--kv-cache-dtype", "q8_0"], "head_dim is 16"),
                   (["--model", f"{tiny}:t", "--kv-cache-dtype", "q4_1"], "expected f16, bf16, q8_0, q4_0 or f32")):
    r = subprocess.run([a.servd, "--port", "0"] + args, capture_output=True, text=True, timeout=120)
    check(r.returncode != 0 and want in r.stderr, f"{args}: exit {r.returncode}, stderr:\n{r.stderr}")
print("ok")
