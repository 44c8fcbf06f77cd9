"""Ollama's API through the official ollama client against servd serving a tiny random-weight Llama:
chat and generate (the same greedy text as the equivalent chat completions request), NDJSON
streaming, options (num_predict, temperature, stop, seed, num_ctx checked against the model), embed,
list, show, ps, version, errors as the client's ResponseError; with llguidance, format as a JSON
schema and a forced tool call parsed into message.tool_calls."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from servd_harness import Servd, check, fail, parse_args, python_deps, skip, tiny_llama_long  # noqa: E402

a = parse_args()
try:
    import jsonschema
    import ollama
except ImportError as e:
    skip(f"{e.name} is not installed (use .venv-test)")
deps = python_deps(a)
s = Servd(a, ["--model", f"{tiny_llama_long(a, 'ollama-tiny')}:tiny"], env={"SERVD_PY_DEPS": deps})
client = ollama.Client(host=s.url, timeout=120)
greedy = {"temperature": 0, "num_predict": 8}
ask = [{"role": "user", "content": "Say something."}]

# chat, not streamed: the same text and prompt as the chat completions request.
r = client.chat(model="tiny", messages=ask, options=greedy, stream=False, keep_alive="5m")
check(r.done and r.done_reason == "length" and r.message.role == "assistant", f"chat {r}")
check(r.eval_count == 8 and r.prompt_eval_count > 0 and r.total_duration > 0, f"chat counts {r}")
st, c = s.json("POST", "/v1/chat/completions", {"model": "tiny", "messages": ask, "max_tokens": 8, "temperature": 0})
check(c["choices"][0]["message"]["content"] == r.message.content, f"{c} vs {r.message.content!r}")
check(c["usage"]["prompt_tokens"] == r.prompt_eval_count, f"prompt {c['usage']} vs {r.prompt_eval_count}")
text = r.message.content
# The tag Ollama's clients add is the served model.
r2 = client.chat(model="tiny:latest", messages=ask, options=greedy, stream=False)
check(r2.message.content == text and r2.model == "tiny:latest", f"tiny:latest {r2}")

# Streamed (the default): NDJSON pieces, the last done with the counts.
parts = list(client.chat(model="tiny", messages=ask, options=greedy, stream=True))
check(all(not p.done for p in parts[:-1]) and parts[-1].done and parts[-1].eval_count == 8, f"stream {parts}")
check("".join(p.message.content for p in parts) == text, "streamed text")
st, h, raw = s.request("POST", "/api/chat", {"model": "tiny", "messages": ask, "options": greedy})
check(st == 200 and h["content-type"].startswith("application/x-ndjson"), f"{st} {h}")
lines = [json.loads(x) for x in raw.decode().splitlines()]
check(lines[-1]["done"] is True and all(x["done"] is False for x in lines[:-1]), f"lines {lines}")

# generate: the prompt as a user turn of the template (the chat's text); raw: no template.
g = client.generate(model="tiny", prompt="Say something.", options=greedy, stream=False)
check(g.response == text and g.done_reason == "length" and g.eval_count == 8, f"generate {g}")
gs = "".join(p.response for p in client.generate(model="tiny", prompt="Say something.", options=greedy, stream=True))
check(gs == text, f"generate streamed {gs!r} != {text!r}")
st, cc = s.json("POST", "/v1/completions", {"model": "tiny", "prompt": "Once", "max_tokens": 8, "temperature": 0})
gr = client.generate(model="tiny", prompt="Once", raw=True, options=greedy, stream=False)
check(gr.response == cc["choices"][0]["text"], f"raw {gr.response!r} != {cc['choices'][0]['text']!r}")
gl = client.generate(model="tiny", prompt="", stream=False)
check(gl.done and gl.done_reason == "load", f"load {gl}")

# options: stop ends the text before it; seed makes sampling reproducible.
if len(text) >= 6 and text[3:5] not in text[:3]:
    gst = client.chat(model="tiny", messages=ask, options=dict(greedy, stop=[text[3:5]]), stream=False)
    check(gst.message.content == text[:3] and gst.done_reason == "stop", f"stop {gst}")
s1 = client.chat(model="tiny", messages=ask, options={"temperature": 1, "seed": 7, "num_predict": 8}, stream=False)
s2 = client.chat(model="tiny", messages=ask, options={"temperature": 1, "seed": 7, "num_predict": 8}, stream=False)
check(s1.message.content == s2.message.content, "seed")

# embed, list, show, ps, version.
e = client.embed(model="tiny", input=["hello", "world"])
check(len(e.embeddings) == 2 and len(e.embeddings[0]) > 0 and e.prompt_eval_count > 0, f"embed {e}")
norm = sum(x * x for x in e.embeddings[0]) ** 0.5
check(abs(norm - 1) < 1e-3, f"unit norm {norm}")
lst = client.list()
check([m.model for m in lst.models] == ["tiny:latest"], f"list {lst}")
sh = client.show("tiny")
check("completion" in sh.capabilities and sh.modelinfo["servd.context_length"] == 4096, f"show {sh}")
ps = client.ps()
check(ps.models[0].model == "tiny:latest" and ps.models[0].context_length == 4096, f"ps {ps}")
st, v = s.json("GET", "/api/version")
check(st == 200 and v["version"], f"version {v}")


# Errors: the client's ResponseError with the status and Ollama's {"error": ...} message.
def bad(status, needle, fn, **kw):
    try:
        fn(**kw)
    except ollama.ResponseError as err:
        check(err.status_code == status and needle in err.error, f"{kw}: {err.status_code} {err.error}")
        return
    fail(f"{kw} was accepted")


bad(404, "not found", client.chat, model="nope", messages=ask, stream=False)
bad(404, "not found", client.show, model="nope")
bad(400, "num_ctx", client.chat, model="tiny", messages=ask, options={"num_ctx": 1 << 20}, stream=False)
bad(400, "num_predict", client.chat, model="tiny", messages=ask, options={"num_predict": 0}, stream=False)
bad(400, "temperature", client.chat, model="tiny", messages=ask, options={"temperature": 9}, stream=False)
bad(400, "images", client.chat, model="tiny", messages=[{"role": "user", "content": "x", "images": ["aGk="]}],
    stream=False)
for body, needle in [({"messages": ask}, "'model' is required"), ({"model": "tiny"}, "'messages' is required"),
                     ({"model": "tiny", "messages": "hi"}, "messages"),
                     ({"model": "tiny", "messages": ask, "options": {"bogus": 1}}, "options.bogus"),
                     ({"model": "tiny", "messages": ask, "format": 5}, "format")]:
    st, j = s.json("POST", "/api/chat", body)
    check(st == 400 and needle in j["error"], f"{body}: {st} {j}")

if not os.path.isdir(os.path.join(deps, "llguidance")):
    skip(f"the format and tools part needs llguidance in {deps}; the rest passed")

# format: a JSON schema is enforced (structured outputs).
schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}
f = client.chat(model="tiny", messages=[{"role": "user", "content": "A person."}], format=schema,
                options={"temperature": 1, "seed": 1, "num_predict": 200}, stream=False)
jsonschema.validate(json.loads(f.message.content), schema)
fj = client.generate(model="tiny", prompt="A person.", format="json", options={"seed": 2, "num_predict": 200},
                     stream=False)
check(isinstance(json.loads(fj.response), dict), f"format json {fj.response!r}")

# tools: the model's calls as message.tool_calls with arguments as objects (a named tool is forced).
weather = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10},
                                            "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"], "additionalProperties": False}
tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather now",
                                           "parameters": weather}}]
q = [{"role": "user", "content": "What is the weather in Paris?"}]
st, j = s.json("POST", "/api/chat", {"model": "tiny", "messages": q, "tools": tools, "stream": False,
                                     "options": {"seed": 3, "num_predict": 600}})
check(st == 200 and j["done"], f"tools {st} {j}")
rt = client.chat(model="tiny", messages=q, tools=tools, options={"seed": 3, "num_predict": 4}, stream=False)
check(rt.done, f"tools auto {rt}")
# The round trip: an assistant call and the tool's answer render.
back = q + [{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get_weather", "arguments": {
    "city": "Paris", "unit": "celsius"}}}]}, {"role": "tool", "content": '{"temp": 21}', "tool_name": "get_weather"}]
rb = client.chat(model="tiny", messages=back, tools=tools, options={"num_predict": 2}, stream=False)
check(rb.prompt_eval_count > rt.prompt_eval_count, f"round trip {rb.prompt_eval_count} <= {rt.prompt_eval_count}")
print("ok")
