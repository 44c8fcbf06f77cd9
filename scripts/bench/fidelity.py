#!/usr/bin/env python3
"""How close servd and llama.cpp each come to the exact model of a GGUF (docs/performance.md, "Fidelity
against float64").

For each GGUF (default: the default model requantized by llama-quantize into each of --types, as
scripts/bench/gguf_sweep.sh makes them, plus Gemma 3 270M Q4_K_M from PyPI):
  1. modelpkg packs it;
  2. llama-server continues each prompt greedily (--tokens, EOS ignored) and reports the log-probabilities
     of its top 20 tokens at every generated position; the prompt ids come from its /tokenize (chat
     prompts rendered by its /apply-template with the file's chat template) and go to every engine as ids;
  3. servd continues the same prompt ids greedily: tests/llama/llama_logits on the package, which runs the
     model code through the interpreters as the engine does (prompt in one step, then one token per step)
     and writes every position's logits; once per --servd-isa (SERVD_ISA);
  4. the float64 forward of the dequantized weights (tests/llama/gguf_exact.py) runs over each engine's
     sequence, so each engine's continuation is also checked against float64's greedy choice.
Metric, per type: at the generated positions where both engines still agree with float64's greedy token
(the prefix of each continuation up to the first token where either parts from float64, or where float64
ends the generation: EOS is ignored so that every prompt runs --tokens, but nothing past it counts), the
mean of |log p_engine(token) - log p_float64(token)| for the chosen token, and over float64's top 10 tokens
(the pairs llama.cpp's top 20 includes, the same pairs for both engines; llama-server gives no entry for
a token that ends inside a UTF-8 character, and such positions are left out for both). The ratio is servd's over llama.cpp's
on the same positions, with a 90% bootstrap interval over prompts. Greedy agreement: per engine, the
generated tokens equal to float64's greedy continuation before the first parting.
--tp N also runs servd's continuation through llama_logits with N tensor-parallel ranks and with one (both
the whole sequence in one step, so only the ranks differ) and reports the largest |delta log p| of the
continued token between them.

Both engines use an f16 KV cache (each one's serving default; --kv-dtype changes both) and two threads
(llama_logits' thread pool is two threads; --threads sets llama-server's).

  scripts/bench/fidelity.py [GGUF ...] [--prompts 8] [--tokens 24] [--servd-isa avx512,scalar] [--tp 3]
        [--types "Q4_1 Q4_K_M Q5_K_M Q6_K Q8_0"] [--no-gemma] [--json OUT] [--tsv OUT]
Needs .venv-test (numpy, gguf), build/tests/llama/llama_logits, build/package_format/modelpkg and
.cache/llama-cpp/bin (scripts/bench/build-llama-cpp.sh).
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "llama"))
sys.path.insert(0, os.path.join(ROOT, "scripts", "bench"))
import gemma3_270m  # noqa: E402
from bench_http import free_port, post, server  # noqa: E402
from gguf_exact import ExactModel, servd_logprobs  # noqa: E402

# Varied on purpose (code, prose, other languages and scripts, chat, lists and arithmetic) and interleaved
# so that the first --prompts of them mix every kind. A chat prompt is a list of messages.
PROMPTS = [
    "The history of the printing press begins in",
    "def merge_sorted(a, b):\n    \"\"\"Merge two sorted lists into one sorted list.\"\"\"\n",
    [{"role": "user", "content": "What are three good habits for writing maintainable code?"}],
    "La Révolution française a commencé en 1789, lorsque",
    "SELECT customer_id, SUM(amount) AS total\nFROM orders\nWHERE",
    "Im Winter fahren viele Familien in die Berge, weil",
    [{"role": "system", "content": "You are a concise assistant."},
     {"role": "user", "content": "Explain what a hash table is in two sentences."}],
    "1, 1, 2, 3, 5, 8, 13,",
    "Photosynthesis converts light energy into",
    "#include <stdio.h>\n\nint main(void) {\n",
    [{"role": "user", "content": "Write a short poem about the sea at night."}],
    "El desayuno típico en España incluye",
    "Dear hiring manager,\n\nI am writing to apply for",
    "<!DOCTYPE html>\n<html>\n<head>\n  <title>",
    [{"role": "user", "content": "How do I convert a string to an integer in Python?"}],
    "東京は日本の首都であり、",
    "The key difference between a virus and a bacterium is",
    "const express = require('express');\nconst app = express();\n",
    [{"role": "user", "content": "Quelle est la capitale de l'Australie ?"}],
    "Москва — столица России,",
    "Q: If a train travels 60 miles in 1.5 hours, what is its average speed?\nA:",
    "fn main() {\n    let v: Vec<i32> = (1..10).collect();\n",
    [{"role": "user", "content": "Give me a recipe for a quick vegetable soup."}],
    "In the beginning of the twentieth century, physicists discovered that",
]


def prompt_label(p):
    text = p[-1]["content"] if isinstance(p, list) else p
    return ("chat: " if isinstance(p, list) else "") + text.replace("\n", "\\n")[:40]


def file_type(path):
    m = re.search(r"[.-](Q\d_[01K]|Q\d_K(?:_[SML])?|IQ\d_\w+|F16|BF16)\.gguf$", os.path.basename(path), re.I)
    return m.group(1).upper() if m else os.path.basename(path)


def best_isa():
    """The ISA servd picks on this CPU when SERVD_ISA is unset (kernels/src/cpu.c's rule)."""
    flags = set()
    for line in open("/proc/cpuinfo"):
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    if {"avx2", "fma"} <= flags:
        return "avx512" if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags else "avx2"
    return "scalar"


def run_checked(cmd, what):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"fidelity: {what} failed ({r.returncode}): {(r.stderr or r.stdout).strip()[-1500:]}")


def targets(a):
    """[(label, type, GGUF path)]: the files given, else the sweep (requantized into a.work)."""
    if a.gguf:
        return [(os.path.basename(g), file_type(g), g) for g in a.gguf]
    out = []
    base_type = file_type(a.base)
    for t in a.types.split():
        g = os.path.join(a.work, f"{os.path.basename(a.base).split('.')[0]}.{t}.gguf")
        if t.upper() == base_type:
            g = a.base
        elif not (os.path.exists(g) and os.path.getmtime(g) >= os.path.getmtime(a.base)):
            # Requantized from the Q4_1 base, as the sweep does: the float64 reference is that of the
            # requantized file's own weights, so each type is measured against its own exact model.
            run_checked([os.path.join(a.llama_bin, "llama-quantize"), "--allow-requantize", a.base, g + ".part", t],
                        f"llama-quantize {t}")
            os.replace(g + ".part", g)
        out.append(("SmolLM2-135M", t, g))
    if a.gemma:
        try:
            out.append(("Gemma3-270M", "Q4_K_M", gemma3_270m.fetch(a.gemma_cache)))
        except (gemma3_270m.Unavailable, ValueError) as e:
            print(f"fidelity: Gemma 3 270M left out: {e}", file=sys.stderr)
    return out


def pack(a, gguf):
    pkg = os.path.join(a.work, os.path.basename(gguf)[: -len(".gguf")] + ".mpk")
    if not (os.path.exists(pkg) and os.path.getmtime(pkg) >= os.path.getmtime(gguf)
            and os.path.getmtime(pkg) >= os.path.getmtime(a.modelpkg)):
        run_checked([a.modelpkg, "pack", gguf, "-o", pkg + ".part", "--quiet"], f"modelpkg pack {gguf}")
        os.replace(pkg + ".part", pkg)
    return pkg


def align_probs(gen, entries):
    """Per generated token its {id: logprob} of llama.cpp's top 20, or None: llama-server leaves out the
    entry of a token after which the text ends inside a UTF-8 character (a byte-level piece of CJK text),
    so entries are matched to tokens by id, in order."""
    out, j = [], 0
    for t in gen:
        if j < len(entries) and entries[j]["id"] == t:
            out.append({d["id"]: d["logprob"] for d in entries[j]["top_logprobs"]})
            j += 1
        else:
            out.append(None)
    if j != len(entries):
        raise RuntimeError(f"llama-server's {len(entries)} log-probability entries do not match its tokens {gen}")
    return out


def llama_cpp(a, gguf, prompts):
    """Per prompt: (prompt ids, llama-server's greedy ids, per generated position {id: logprob} of its top 20,
    None where llama-server gives none)."""
    port = free_port()
    argv = [os.path.join(a.llama_bin, "llama-server"), "-m", gguf, "--host", "127.0.0.1", "--port", str(port),
            "-t", str(a.threads), "-c", "2048", "-np", "1", "-fa", "on", "-ctk", a.kv_dtype, "-ctv", a.kv_dtype,
            "--poll", "0"]
    out = []
    with server(argv, port, "/health"):
        for p in prompts:
            text = post(port, "/apply-template", {"messages": p})["prompt"] if isinstance(p, list) else p
            ids = post(port, "/tokenize", {"content": text, "add_special": True})["tokens"]
            bare = post(port, "/tokenize", {"content": text, "add_special": False})["tokens"]
            if len(ids) == len(bare) + 1 and bare[:1] == ids[:1]:
                ids = bare  # the template already starts with the BOS text: no second BOS
            res = post(port, "/completion", {"prompt": ids, "n_predict": a.tokens, "temperature": 0, "top_k": 1,
                                             "ignore_eos": True, "return_tokens": True, "n_probs": 20,
                                             "post_sampling_probs": False, "cache_prompt": False})
            out.append((ids, res["tokens"], align_probs(res["tokens"], res["completion_probabilities"])))
    return out


END_TEXTS = {"<|im_end|>", "<|endoftext|>", "<end_of_turn>", "<|eot_id|>", "<|end|>"}


def end_ids(gguf):
    """Ids that end a generation: the file's EOS/EOT ids and the usual end-of-turn pieces (llama.cpp's
    end-of-generation set, which ignore_eos keeps it from emitting)."""
    from gguf import GGUFReader
    r = GGUFReader(gguf)
    ids = set()
    for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"):
        if k in r.fields:
            ids.add(int(r.fields[k].contents()))
    f = r.fields["tokenizer.ggml.tokens"]
    ids.update(i for i, idx in enumerate(f.data) if bytes(f.parts[idx]).decode("utf-8", "replace") in END_TEXTS)
    return ids


def agree_len(gen, exact, start, ends):
    """Generated tokens equal to float64's greedy choice before the first parting, or before float64 ends
    the generation (an id of `ends`: past it both engines only continue because EOS is ignored). exact:
    log p of the engine's own sequence; row start + k predicts gen[k]."""
    for k, t in enumerate(gen):
        choice = int(np.argmax(exact[start + k]))
        if choice != t or choice in ends:
            return k
    return len(gen)


def ratio_interval(s_per, l_per, rng, n=2000):
    """90% bootstrap interval of sum(servd errors) / sum(llama.cpp errors), prompts resampled."""
    s, l_ = np.array(s_per), np.array(l_per)
    if len(s) < 2 or l_.sum() == 0:
        return None
    idx = rng.integers(0, len(s), size=(n, len(s)))
    num, den = s[idx].sum(1), l_[idx].sum(1)
    r = num[den > 0] / den[den > 0]
    return [round(float(np.percentile(r, 5)), 3), round(float(np.percentile(r, 95)), 3)]


def measure(a, label, qtype, gguf):
    t0 = time.monotonic()
    pkg = pack(a, gguf)
    prompts = PROMPTS[: a.prompts]
    llama = llama_cpp(a, gguf, prompts)
    t1 = time.monotonic()
    servd = {}  # isa -> per prompt (log p rows, greedy ids)
    for isa in a.isas:
        env = dict(os.environ, SERVD_ISA=isa)
        servd[isa] = [servd_logprobs(a.llama_logits, pkg, ids, decode=a.tokens, kv_dtype=a.kv_dtype, env=env)
                      for ids, _, _ in llama]
    tp = None
    if a.tp > 1:
        env = dict(os.environ, SERVD_ISA=a.isas[0])
        d_chosen, d_top = [], []
        try:
            for (ids, _, _), (_, gen) in zip(llama, servd[a.isas[0]]):
                seq = ids + gen
                one = servd_logprobs(a.llama_logits, pkg, seq, kv_dtype=a.kv_dtype, env=env)[0]
                many = servd_logprobs(a.llama_logits, pkg, seq, tp=a.tp, kv_dtype=a.kv_dtype, env=env)[0]
                for k, t in enumerate(gen):
                    row = len(ids) - 1 + k
                    d_chosen.append(abs(many[row, t] - one[row, t]))
                    top = np.argsort(-one[row])[:10]
                    d_top.append(float(np.abs(many[row, top] - one[row, top]).max()))
            tp = {"n": a.tp, "isa": a.isas[0], "positions": len(d_chosen), "max_chosen": float(np.max(d_chosen)),
                  "mean_chosen": float(np.mean(d_chosen)), "max_top10": float(np.max(d_top)),
                  "positions_over_1e-3": int(np.sum(np.array(d_chosen) > 1e-3))}
        except RuntimeError as e:
            tp = {"n": a.tp, "error": str(e).splitlines()[-1][-300:]}
    t2 = time.monotonic()
    model = ExactModel(gguf)
    ends = end_ids(gguf)
    exact_of = {}

    def exact(seq):
        key = tuple(seq)
        if key not in exact_of:
            exact_of[key] = model.logprobs(seq)
        return exact_of[key]
    results = []
    rng = np.random.default_rng(0)
    for isa in a.isas:
        s_per, l_per, s10_per, l10_per, s_all, l_all, s10_all, l10_all = [], [], [], [], [], [], [], []
        missing = no_logprob = agree_s = agree_l = full_s = full_l = 0
        rows = []
        for p, (ids, lgen, tops), (srows, sgen) in zip(prompts, llama, servd[isa]):
            start = len(ids) - 1
            xl, xs = exact(ids + lgen), exact(ids + sgen)
            al, as_ = agree_len(lgen, xl, start, ends), agree_len(sgen, xs, start, ends)
            n = min(al, as_)  # both equal float64's greedy tokens here, hence each other's
            es, el, es10, el10 = [], [], [], []
            for k in range(n):
                row, t = start + k, lgen[k]
                if tops[k] is None:
                    no_logprob += 1
                    continue
                es.append(abs(srows[row, t] - xl[row, t]))
                el.append(abs(tops[k][t] - xl[row, t]))
                for u in np.argsort(-xl[row])[:10]:
                    if int(u) not in tops[k]:
                        missing += 1
                        continue
                    es10.append(abs(srows[row, u] - xl[row, u]))
                    el10.append(abs(tops[k][int(u)] - xl[row, u]))
            s_per.append(sum(es)), l_per.append(sum(el)), s10_per.append(sum(es10)), l10_per.append(sum(el10))
            s_all += es
            l_all += el
            s10_all += es10
            l10_all += el10
            agree_s, agree_l = agree_s + as_, agree_l + al
            full_s, full_l = full_s + (as_ == a.tokens), full_l + (al == a.tokens)
            rows.append({"prompt": prompt_label(p), "prompt_tokens": len(ids), "counted": n, "servd_agree": as_,
                         "llama_cpp_agree": al, "servd_mean": float(np.mean(es)) if es else None,
                         "llama_cpp_mean": float(np.mean(el)) if el else None, "servd_ids": sgen, "llama_cpp_ids": lgen})
        sm, lm = (float(np.mean(x)) if x else float("nan") for x in (s_all, l_all))
        s10, l10 = (float(np.mean(x)) if x else float("nan") for x in (s10_all, l10_all))
        results.append({
            "model": label, "type": qtype, "gguf": os.path.basename(gguf), "isa": isa, "kv_dtype": a.kv_dtype,
            "prompts": len(prompts), "tokens": a.tokens, "positions": len(s_all),
            "agreeing_positions_without_llama_cpp_logprob": no_logprob,
            "servd_mean": sm, "llama_cpp_mean": lm, "ratio": sm / lm if lm else None,
            "ratio_ci90": ratio_interval(s_per, l_per, rng),
            "servd_max": float(np.max(s_all)) if s_all else None, "llama_cpp_max": float(np.max(l_all)) if l_all else None,
            "top10": {"pairs": len(s10_all), "not_in_llama_cpp_top20": missing, "servd_mean": s10,
                      "llama_cpp_mean": l10, "ratio": s10 / l10 if l10 else None,
                      "ratio_ci90": ratio_interval(s10_per, l10_per, rng)},
            "greedy_agreement": {"servd": agree_s, "llama_cpp": agree_l, "of": len(prompts) * a.tokens,
                                 "servd_full_prompts": full_s, "llama_cpp_full_prompts": full_l},
            "tp": tp if isa == a.isas[0] else None,
            "seconds": {"llama_cpp": round(t1 - t0, 1), "servd": round(t2 - t1, 1),
                        "float64": round(time.monotonic() - t2, 1)},
            "per_prompt": rows})
    return results


def fmt(x, nd=4):
    return "-" if x is None or x != x else f"{x:.{nd}f}"


def table(results):
    head = (f"{'model':13s} {'type':7s} {'isa':7s} {'pos':>4s} {'servd':>7s} {'llama':>7s} {'ratio':>6s} {'90% CI':>13s}"
            f" {'top10 s':>8s} {'top10 l':>8s} {'ratio':>6s}  {'agree s/l of N':>16s}  TP max|d| (>1e-3)")
    lines = [head]
    for r in results:
        ci = r["ratio_ci90"]
        g, t10, tp = r["greedy_agreement"], r["top10"], r["tp"]
        tps = "" if not tp else f"TP={tp['n']} " + (tp["error"] if "error" in tp else
                                                    f"{tp['max_chosen']:.4f} ({tp['positions_over_1e-3']}/{tp['positions']})")
        lines.append(f"{r['model']:13s} {r['type']:7s} {r['isa']:7s} {r['positions']:4d} {fmt(r['servd_mean']):>7s} "
                     f"{fmt(r['llama_cpp_mean']):>7s} {fmt(r['ratio'], 3):>6s} "
                     f"{'-' if not ci else f'[{ci[0]:.2f}, {ci[1]:.2f}]':>13s} {fmt(t10['servd_mean']):>8s} "
                     f"{fmt(t10['llama_cpp_mean']):>8s} {fmt(t10['ratio'], 3):>6s}  "
                     f"{g['servd']:>4d}/{g['llama_cpp']:<4d} of {g['of']:<4d}  {tps}")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("gguf", nargs="*", help="GGUF files (llama or gemma3); default: the sweep")
    ap.add_argument("--base", default=os.path.join(ROOT, ".cache", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--types", default="Q4_1 Q4_K_M Q5_K_M Q6_K Q8_0", help="the sweep's types of --base")
    ap.add_argument("--no-gemma", dest="gemma", action="store_false", help="leave Gemma 3 270M out of the sweep")
    ap.add_argument("--gemma-cache", default=os.path.join(ROOT, ".cache", "gemma3-270m"))
    ap.add_argument("--prompts", type=int, default=8, help=f"how many of the {len(PROMPTS)} prompts")
    ap.add_argument("--tokens", type=int, default=24, help="greedy tokens per prompt")
    ap.add_argument("--servd-isa", default="default",
                    help="comma-separated: default (the best this CPU runs), scalar, avx2, avx512 (SERVD_ISA "
                    "of servd's runs; TP uses the first)")
    ap.add_argument("--tp", type=int, default=0, help="also compare servd at TP=N with TP=1")
    ap.add_argument("--kv-dtype", default="f16", choices=["f16", "f32", "bf16", "q8_0", "q4_0"],
                    help="both engines' KV cache (llama.cpp: -ctk/-ctv)")
    ap.add_argument("--threads", type=int, default=2, help="llama-server threads")
    ap.add_argument("--llama-bin", default=os.path.join(ROOT, ".cache", "llama-cpp", "bin"))
    ap.add_argument("--llama-logits", default=os.path.join(ROOT, "build", "tests", "llama", "llama_logits"))
    ap.add_argument("--modelpkg", default=os.path.join(ROOT, "build", "package_format", "modelpkg"))
    ap.add_argument("--work", default=os.path.join(ROOT, "build", "fidelity"))
    ap.add_argument("--json", help="results as JSON (default WORK/fidelity.json)")
    ap.add_argument("--tsv", help="the table as TSV (default WORK/fidelity.tsv)")
    a = ap.parse_args()
    names = [x.strip() for x in a.servd_isa.split(",") if x.strip()]
    bad = [x for x in names if x not in ("default", "scalar", "avx2", "avx512")]
    if bad or not names:
        ap.error(f"--servd-isa: {bad or a.servd_isa!r}: expected default, scalar, avx2 or avx512")
    best = best_isa()
    a.isas = list(dict.fromkeys(best if x == "default" else x for x in names))  # the default is the best ISA
    order = ["scalar", "avx2", "avx512"]
    if any(order.index(x) > order.index(best) for x in a.isas):
        ap.error(f"--servd-isa: this CPU runs up to {best}")
    if not 1 <= a.prompts <= len(PROMPTS):
        ap.error(f"--prompts: 1..{len(PROMPTS)}")
    if a.tokens < 1:
        ap.error("--tokens: at least 1")
    for path, what in ((os.path.join(a.llama_bin, "llama-server"), "scripts/bench/build-llama-cpp.sh"),
                       (a.llama_logits, "cmake --build build --target llama_logits"),
                       (a.modelpkg, "cmake --build build --target modelpkg")):
        if not os.access(path, os.X_OK):
            sys.exit(f"fidelity: no {path} ({what} makes it)")
    os.makedirs(a.work, exist_ok=True)
    print(f"load average at start: {' '.join(open('/proc/loadavg').read().split()[:3])}", flush=True)
    results = []
    for label, qtype, g in targets(a):
        rs = measure(a, label, qtype, g)
        results += rs
        for r in rs:
            print(table([r]).splitlines()[1], f"  ({sum(r['seconds'].values()):.0f} s)", flush=True)
        write(a, best, results)  # after every type: a later failure keeps what was measured
    print(f"load average at end: {' '.join(open('/proc/loadavg').read().split()[:3])}")
    print(table(results))
    print(f"wrote {a.json or os.path.join(a.work, 'fidelity.json')}")


def write(a, best, results):
    json_path = a.json or os.path.join(a.work, "fidelity.json")
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "")
    json.dump({"cpu": cpu, "best_isa": best, "prompts": [prompt_label(p) for p in PROMPTS[: a.prompts]],
               "results": results},
              open(json_path, "w"), indent=1)
    cols = ["model", "type", "isa", "positions", "servd_mean", "llama_cpp_mean", "ratio"]
    with open(a.tsv or os.path.join(a.work, "fidelity.tsv"), "w") as f:
        f.write("\t".join(cols + ["top10_servd", "top10_llama_cpp", "agree_servd", "agree_llama_cpp", "agree_of",
                                  "tp_max_chosen"]) + "\n")
        for r in results:
            tp = r["tp"] or {}
            f.write("\t".join(str(r[c]) for c in cols) + f"\t{r['top10']['servd_mean']}\t{r['top10']['llama_cpp_mean']}"
                    f"\t{r['greedy_agreement']['servd']}\t{r['greedy_agreement']['llama_cpp']}"
                    f"\t{r['greedy_agreement']['of']}\t{tp.get('max_chosen', '')}\n")


if __name__ == "__main__":
    main()
