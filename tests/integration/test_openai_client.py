"""The official openai Python client against servd serving a tiny random-weight Llama: completions
and chat, streaming and not, usage, n, seed, stop, logprobs, errors; vLLM's tokenizer routes."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from servd_harness import Servd, check, parse_args, skip, tiny_llama  # noqa: E402

a = parse_args()
try:
    import openai
except ImportError:
    skip("the openai package is not installed (use .venv-test)")
pkg = tiny_llama(a)
s = Servd(a, ["--model", f"{pkg}:tiny"])
client = openai.OpenAI(base_url=f"{s.url}/v1", api_key="unused", max_retries=0, timeout=120)

models = client.models.list()
check([m.id for m in models.data] == ["tiny"], f"models: {models}")
check(client.models.retrieve("tiny").id == "tiny", "models.retrieve")

# Completions, not streaming; greedy output is deterministic.
c = client.completions.create(model="tiny", prompt="Hello there", max_tokens=12, temperature=0, extra_body={"ignore_eos": True})
check(c.id.startswith("cmpl-") and c.object == "text_completion" and c.model == "tiny", f"completion: {c}")
check(len(c.choices) == 1 and isinstance(c.choices[0].text, str), "choices")
check(c.choices[0].finish_reason == "length", f"finish_reason {c.choices[0].finish_reason}")
check(c.usage.completion_tokens == 12, f"usage {c.usage}")
check(c.usage.prompt_tokens > 0 and c.usage.total_tokens == c.usage.prompt_tokens + 12, f"usage {c.usage}")
greedy = c.choices[0].text
c2 = client.completions.create(model="tiny", prompt="Hello there", max_tokens=12, temperature=0, extra_body={"ignore_eos": True})
check(c2.choices[0].text == greedy, "greedy decoding is deterministic")

# Streaming gives the same text as one piece.
parts, finish, usage = [], None, None
for chunk in client.completions.create(model="tiny", prompt="Hello there", max_tokens=12, temperature=0, stream=True,
                                       stream_options={"include_usage": True}, extra_body={"ignore_eos": True}):
    if chunk.usage:
        usage = chunk.usage
    for ch in chunk.choices:
        parts.append(ch.text)
        finish = ch.finish_reason or finish
check("".join(parts) == greedy, f"streamed {''.join(parts)!r} != {greedy!r}")
check(finish == "length" and usage and usage.completion_tokens == 12, f"stream end: {finish} {usage}")

# Seeded sampling is reproducible; n gives n choices.
kw = dict(model="tiny", prompt="Once", max_tokens=10, temperature=0.9, seed=1234, n=2, extra_body={"ignore_eos": True})
r1 = client.completions.create(**kw)
r2 = client.completions.create(**kw)
check(sorted(ch.index for ch in r1.choices) == [0, 1], f"n=2 indices: {r1.choices}")
check([ch.text for ch in r1.choices] == [ch.text for ch in r2.choices], "seeded sampling is reproducible")
check(r1.usage.completion_tokens == 20, f"n=2 usage: {r1.usage}")

# Stop strings: the text ends before the first occurrence.
if len(greedy) >= 6:
    stop = greedy[3:5]
    cut = greedy[: greedy.find(stop)]
    c3 = client.completions.create(model="tiny", prompt="Hello there", max_tokens=12, temperature=0, stop=[stop])
    check(c3.choices[0].text == cut and c3.choices[0].finish_reason == "stop",
          f"stop {stop!r}: {c3.choices[0].text!r} {c3.choices[0].finish_reason} (want {cut!r})")

# Completions logprobs.
c4 = client.completions.create(model="tiny", prompt="Hi", max_tokens=4, temperature=0, logprobs=3, extra_body={"ignore_eos": True})
lp = c4.choices[0].logprobs
check(len(lp.token_logprobs) == 4 and all(x <= 0 for x in lp.token_logprobs), f"logprobs: {lp}")
check(all(len(t) == 3 for t in lp.top_logprobs), f"top_logprobs: {lp.top_logprobs}")
# Greedy picks the most likely token: its logprob is the largest of the top ones.
check(all(abs(lp.token_logprobs[i] - max(lp.top_logprobs[i].values())) < 1e-4 for i in range(4)), "greedy = top-1")

# Chat, not streaming and streaming.
msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say something."}]
r = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=8, temperature=0, extra_body={"ignore_eos": True})
check(r.id.startswith("chatcmpl-") and r.object == "chat.completion", f"chat: {r}")
check(r.choices[0].message.role == "assistant" and isinstance(r.choices[0].message.content, str), "chat message")
check(r.usage.completion_tokens == 8, f"chat usage {r.usage}")
text, roles, usage = "", 0, None
for chunk in client.chat.completions.create(model="tiny", messages=msgs, max_tokens=8, temperature=0, stream=True,
                                            stream_options={"include_usage": True}, extra_body={"ignore_eos": True}):
    check(chunk.object == "chat.completion.chunk", "chunk object")
    if chunk.usage:
        usage = chunk.usage
    for ch in chunk.choices:
        roles += ch.delta.role == "assistant"
        text += ch.delta.content or ""
check(text == r.choices[0].message.content, f"chat stream {text!r} != {r.choices[0].message.content!r}")
check(roles == 1 and usage and usage.completion_tokens == 8, f"chat stream role/usage: {roles} {usage}")
r = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=3, logprobs=True, top_logprobs=2,
                                   extra_body={"ignore_eos": True})
content = r.choices[0].logprobs.content
check(len(content) == 3 and all(len(e.top_logprobs) == 2 for e in content), f"chat logprobs: {content}")
r = client.chat.completions.create(model="tiny", messages=msgs, max_completion_tokens=2, extra_body={"ignore_eos": True})
check(r.usage.completion_tokens == 2, "max_completion_tokens")

# Prefix caching: a prompt sent again reuses its full KV blocks (16 tokens each), reported as
# usage.prompt_tokens_details.cached_tokens, with the same greedy text; the metrics count the hits.
long_prompt = "The quick brown fox jumps over the lazy dog, and then it runs far away. " * 6
first = client.completions.create(model="tiny", prompt=long_prompt, max_tokens=8, temperature=0,
                                  extra_body={"ignore_eos": True})
again = client.completions.create(model="tiny", prompt=long_prompt, max_tokens=8, temperature=0,
                                  extra_body={"ignore_eos": True})
n_prompt = again.usage.prompt_tokens
cached = again.usage.prompt_tokens_details.cached_tokens
check(first.usage.prompt_tokens_details.cached_tokens == 0, f"first: {first.usage}")
check(cached == (n_prompt - 1) // 16 * 16 and cached > 0, f"cached_tokens {cached} of {n_prompt}")
check(again.choices[0].text == first.choices[0].text, "the cache changed the greedy text")
# n = 2 choices of a new prompt: one computes the prompt, the other waits for it and shares its blocks.
two = client.completions.create(model="tiny", prompt="Two choices: " + long_prompt, max_tokens=4, n=2, temperature=0,
                                extra_body={"ignore_eos": True})
cached2 = two.usage.prompt_tokens_details.cached_tokens
check(cached2 == (two.usage.prompt_tokens - 1) // 16 * 16, f"n=2 cached_tokens {cached2} of {two.usage.prompt_tokens}")
check(two.choices[0].text == two.choices[1].text, "greedy choices differ")
metrics = s.metrics()
hits = [ln for ln in metrics.splitlines() if ln.startswith('servd_prefix_cache_hits_total{model="tiny"}')]
check(hits and float(hits[0].split()[-1]) >= cached, f"prefix cache metrics: {hits}")

# Errors come back as the client's exception types.
for bad in [dict(temperature=-1), dict(max_tokens=-1), dict(top_p=5), dict(n=0), dict(presence_penalty=9)]:
    try:
        client.completions.create(model="tiny", prompt="x", **{**{"max_tokens": 2}, **bad})
        check(False, f"{bad} was accepted")
    except openai.BadRequestError as e:
        check(e.status_code == 400 and e.body and e.body.get("message"), f"{bad}: {e}")
try:
    client.completions.create(model="nope", prompt="x")
    check(False, "unknown model accepted")
except openai.NotFoundError as e:
    check(e.status_code == 404, str(e))
try:
    client.completions.create(model="tiny", prompt="x", max_tokens=100000)
    check(False, "max_tokens beyond the context accepted")
except openai.BadRequestError as e:
    check("context length" in str(e), str(e))

# vLLM's tokenizer routes.
st, body = s.json("POST", "/tokenize", {"model": "tiny", "prompt": "hello", "add_special_tokens": False})
check(st == 200 and body["count"] == len(body["tokens"]) > 0 and body["max_model_len"] > 0, f"tokenize: {body}")
st, back = s.json("POST", "/detokenize", {"model": "tiny", "tokens": body["tokens"]})
check(st == 200 and back["prompt"] == "hello", f"detokenize: {back}")
st, body = s.json("POST", "/tokenize", {"model": "tiny", "messages": msgs})
check(st == 200 and body["count"] > 0, f"tokenize messages: {body}")

check(s.stop() == 0, "exit status after SIGTERM")
print("ok")
