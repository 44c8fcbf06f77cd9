"""SIGTERM after a chat request unloads the language model promptly: the chat template (jinja2, which
imports `threading`) must not leave Py_FinalizeEx waiting for an HTTP worker thread. Before the fix
the log said "models did not unload within 5 s"."""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from servd_harness import Servd, check, parse_args, tiny_llama  # noqa: E402

a = parse_args()
pkg = tiny_llama(a)
s = Servd(a, ["--model", f"{pkg}:tiny"])
for _ in range(2):
    st, body = s.json("POST", "/v1/chat/completions",
                      {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    check(st == 200, f"chat: {st} {body}")
t0 = time.monotonic()
rc = s.stop(timeout=60)
log = s.stderr()
check(rc == 0, f"SIGTERM: exit status {rc}\n{log}")
check("did not unload" not in log, f"the model did not unload:\n{log}")
check("model 'tiny' unloaded" in log, f"no unload message:\n{log}")
print(f"OK (exit {time.monotonic() - t0:.2f} s after SIGTERM)")
