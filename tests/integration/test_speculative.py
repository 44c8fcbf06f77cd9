"""Speculative decoding changes nothing a client sees: the same requests to servd with
--speculative off (the reference), ngram (drafts on every step where the request's own text offers
some, to exercise verify rows) and auto give the same texts, tokens, finish reasons and logprobs,
for greedy decoding, seeded sampling (one draw per emitted token: the same seed gives the same text,
so the sampled distribution is the reference's), stop strings, max_tokens, penalties, n > 1 and
streaming. With drafting on, the spec_decode counters move consistently and the KV blocks of
rejected drafts all come back."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from servd_harness import Servd, check, metric_value, parse_args, tiny_llama  # noqa: E402

a = parse_args()
llama = tiny_llama(a)

PROMPTS = ["hello hello hello hello hello", "abc abd abc abd abc abd", "The quick brown fox jumps over",
           "1 2 3 4 1 2 3 4 1 2 3", "x"]


def requests():
    """(path, body) pairs: each answered identically with and without speculation."""
    out = []
    for p in PROMPTS:
        out.append(("/v1/completions", {"prompt": p, "max_tokens": 64, "temperature": 0, "logprobs": 2}))
        out.append(("/v1/completions", {"prompt": p, "max_tokens": 40, "temperature": 0, "frequency_penalty": 0.3,
                                        "repetition_penalty": 1.1}))
    for seed in range(12):
        out.append(("/v1/completions", {"prompt": PROMPTS[seed % len(PROMPTS)], "max_tokens": 48,
                                        "temperature": 0.9, "top_p": 0.95, "seed": seed}))
    out.append(("/v1/completions", {"prompt": PROMPTS[0], "max_tokens": 5, "temperature": 0}))
    out.append(("/v1/completions", {"prompt": PROMPTS[1], "max_tokens": 32, "temperature": 1.0, "n": 3,
                                    "seed": 5}))
    out.append(("/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPTS[3]}], "max_tokens": 48,
                                         "temperature": 0}))
    return out


def stream_text(s, body):
    st, _, data = s.request("POST", "/v1/completions", dict(body, stream=True))
    check(st == 200, f"stream: {st} {data[:200]!r}")
    text, finish = "", None
    for line in data.decode().splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        c = json.loads(line[6:])["choices"][0]
        text += c.get("text") or ""
        finish = c.get("finish_reason") or finish
    return text, finish


def answers(s, stops):
    got = []
    for path, body in requests():
        st, r = s.json("POST", path, dict(body, model="tiny"))
        check(st == 200, f"{path} {body}: {st} {r}")
        for c in r["choices"]:
            lp = c.get("logprobs") or {}
            text = c["message"]["content"] if "message" in c else c["text"]
            got.append((text, c["finish_reason"], lp.get("tokens"), lp.get("token_logprobs"),
                        lp.get("top_logprobs")))
    for i, stop in enumerate(stops):
        body = {"model": "tiny", "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": 64, "temperature": 0,
                "stop": [stop]}
        st, r = s.json("POST", "/v1/completions", body)
        check(st == 200, f"stop {stop!r}: {st} {r}")
        got.append((r["choices"][0]["text"], r["choices"][0]["finish_reason"], None, None, None))
        got.append(stream_text(s, body) + (None, None, None))
    return got


def same(ref, got, mode):
    check(len(ref) == len(got), f"{mode}: {len(got)} answers, the reference {len(ref)}")
    for i, (r, g) in enumerate(zip(ref, got)):
        check(r[0] == g[0], f"{mode}, answer {i}: text differs:\n  off: {r[0]!r}\n  {mode}: {g[0]!r}")
        check(r[1] == g[1], f"{mode}, answer {i}: finish {g[1]} against {r[1]}")
        check(r[2] == g[2], f"{mode}, answer {i}: logprob tokens differ")
        if r[3] is not None:
            for j, (x, y) in enumerate(zip(r[3], g[3])):
                check(abs(x - y) <= 2e-3, f"{mode}, answer {i}, token {j}: logprob {y} against {x}")


def run(mode, stops):
    s = Servd(a, ["--model", f"{llama}:tiny", "--speculative", mode])
    got = answers(s, stops)
    text = s.metrics()
    s.stop()
    return got, text


ref, _ = run("off", [])
# Stop strings from the middle of the reference's greedy texts, so that they do match.
stops = []
for t, *_ in ref[0:2 * len(PROMPTS):2]:
    if len(t) >= 12:
        stops.append(t[6:9])
check(stops, f"no greedy text long enough for a stop string: {[r[0] for r in ref[:4]]}")
ref, _ = run("off", stops)

for mode in ["ngram", "auto"]:
    got, text = run(mode, stops)
    same(ref, got, mode)
    labels = {"model_name": "tiny"}
    drafts = metric_value(text, "vllm:spec_decode_num_drafts_total", labels)
    drafted = metric_value(text, "vllm:spec_decode_num_draft_tokens_total", labels)
    accepted = metric_value(text, "vllm:spec_decode_num_accepted_tokens_total", labels)
    per_pos = sum(metric_value(text, "vllm:spec_decode_num_accepted_tokens_per_pos_total",
                               dict(labels, position=str(p))) for p in range(8))
    if mode == "ngram":
        check(drafts > 0 and drafted >= drafts, f"ngram drafted nothing: {drafts} rows, {drafted} tokens")
        check(accepted > 0, "no draft was ever accepted on repetitive prompts")
    check(accepted <= drafted, f"{mode}: {accepted} accepted of {drafted}")
    check(per_pos == accepted, f"{mode}: accepted by position sum to {per_pos}, not {accepted}")
    check(metric_value(text, "servd_kv_cache_blocks_used", {"model": "tiny"}) == 0,
          f"{mode}: KV blocks still held once idle")
    print(f"{mode}: {int(drafts)} verify rows, {int(accepted)} of {int(drafted)} drafts accepted")
print("ok")
