"""LiteLLM's OpenAI-compatible provider (`openai/<model>` with api_base) against servd serving a tiny
random-weight Llama, as a gateway uses it: plain and streamed chat, tools with tool_choice required
and named (a parseable call, arguments valid against the schema, over several seeds),
response_format json_schema (the content validates) and json_object (the content parses), and
embeddings (shapes, unit norm, the same vectors as the official client returns). LiteLLM's response
objects and parsers are the reference."""
import json
import math
import os
import sys

# LiteLLM fetches a price table from the network at import; the local copy it ships is enough.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from servd_harness import Servd, check, fail, parse_args, python_deps, skip, tiny_llama_long  # noqa: E402

a = parse_args()
try:
    import jsonschema
    import litellm
    import openai
except ImportError as e:
    skip(f"{e.name} is not installed (use .venv-test)")
deps = python_deps(a, "llguidance")
s = Servd(a, ["--model", f"{tiny_llama_long(a, 'litellm-tiny')}:tiny"], env={"SERVD_PY_DEPS": deps})
base = dict(model="openai/tiny", api_base=f"{s.url}/v1", api_key="unused", timeout=120, num_retries=0)

r = litellm.completion(messages=[{"role": "user", "content": "Hello"}], max_tokens=8, temperature=0, **base)
check(isinstance(r.choices[0].message.content, str) and r.usage.completion_tokens > 0, f"completion: {r}")
text = "".join(c.choices[0].delta.content or "" for c in litellm.completion(
    messages=[{"role": "user", "content": "Hello"}], max_tokens=8, temperature=0, stream=True, **base))
check(text == r.choices[0].message.content, f"streamed {text!r} != {r.choices[0].message.content!r}")

weather = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 10},
    "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"], "additionalProperties": False}
clock = {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 6}}, "required": ["zone"],
         "additionalProperties": False}
tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": weather}},
         {"type": "function", "function": {"name": "get_time", "description": "Time", "parameters": clock}}]
schemas = {"get_weather": weather, "get_time": clock}
msgs = [{"role": "user", "content": "What is the weather in Paris?"}]

for seed in range(3):
    for choice, only in (("required", None), ({"type": "function", "function": {"name": "get_time"}}, "get_time")):
        r = litellm.completion(messages=msgs, tools=tools, tool_choice=choice, max_tokens=600, temperature=1.0,
                               seed=seed, **base)
        calls = r.choices[0].message.tool_calls
        check(calls and r.choices[0].finish_reason == "tool_calls", f"tools {choice}, seed {seed}: {r}")
        for c in calls:
            check(c.function.name in schemas and (only is None or c.function.name == only), f"called {c.function.name}")
            jsonschema.validate(json.loads(c.function.arguments), schemas[c.function.name])

for seed in range(3):
    r = litellm.completion(messages=msgs, max_tokens=600, temperature=1.0, seed=seed, **base,
                           response_format={"type": "json_schema",
                                            "json_schema": {"name": "weather", "schema": weather, "strict": True}})
    jsonschema.validate(json.loads(r.choices[0].message.content), weather)
    r = litellm.completion(messages=msgs, max_tokens=200, temperature=1.0, seed=seed, **base,
                           response_format={"type": "json_object"})
    content = r.choices[0].message.content
    if r.choices[0].finish_reason == "stop":  # a json_object may run past max_tokens at temperature 1
        json.loads(content)

# Embeddings: LiteLLM's vectors equal the official client's for the same inputs.
inputs = ["The capital of France", "is Paris"]
e = litellm.embedding(input=inputs, **{k: v for k, v in base.items() if k != "num_retries"})
check(len(e.data) == 2 and e.usage.prompt_tokens > 0, f"embedding: {e}")
client = openai.OpenAI(base_url=f"{s.url}/v1", api_key="unused", max_retries=0, timeout=120)
ref = client.embeddings.create(model="tiny", input=inputs)
for got, want in zip(e.data, ref.data):
    vec = got["embedding"]
    norm = math.sqrt(sum(x * x for x in vec))
    check(abs(norm - 1.0) < 1e-4, f"embedding norm {norm}")
    if max(abs(x - y) for x, y in zip(vec, want.embedding)) > 1e-6:
        fail("litellm and openai embeddings differ")
s.stop()
print("ok: litellm chat, stream, tools, json_schema, json_object, embeddings")
