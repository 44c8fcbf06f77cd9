"""Tool calling through the official openai client against servd serving a tiny random-weight Llama
(ChatML template without tool support: the tools go in a Hermes-style system preamble). Whatever such
a model would say, tool_choice "required" and a named function must give a parseable call to an
allowed function with arguments valid against its schema, at temperature 1 over several seeds;
streamed deltas reassemble to the non-streamed call of the same seed; a history with tool calls and
results renders; legacy functions map onto the same; bad inputs are 400s naming the field."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from servd_harness import Servd, check, fail, parse_args, python_deps, skip, tiny_llama_long  # noqa: E402

a = parse_args()
try:
    import jsonschema
    import openai
except ImportError as e:
    skip(f"{e.name} is not installed (use .venv-test)")
deps = python_deps(a, "llguidance")


# A ChatML template that renders tools itself, as Qwen 2.5's does (shortened).
QWEN_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools><|im_end|>\n"
    "{%- endif %}{%- for m in messages %}"
    "{%- if m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant\n{% for c in m.tool_calls %}"
    "<tool_call>\n{\"name\": \"{{ c.function.name }}\", \"arguments\": {{ c.function.arguments | tojson }}}"
    "\n</tool_call>{% endfor %}<|im_end|>\n"
    "{%- elif m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
    "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}")


pkg = tiny_llama_long(a, "tools-tiny")
qwen = tiny_llama_long(a, "tools-qwen", QWEN_TEMPLATE)
s = Servd(a, ["--model", f"{pkg}:tiny", "--model", f"{qwen}:qwen"], env={"SERVD_PY_DEPS": deps})
client = openai.OpenAI(base_url=f"{s.url}/v1", api_key="unused", max_retries=0, timeout=120)
msgs = [{"role": "user", "content": "What is the weather in Paris?"}]

# Bounded schemas: the grammar itself ends each call well within max_tokens.
weather = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 10},
    "unit": {"enum": ["celsius", "fahrenheit"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "unit", "days"], "additionalProperties": False}
clock = {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 6}}, "required": ["zone"],
         "additionalProperties": False}
tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather forecast", "parameters": weather}},
         {"type": "function", "function": {"name": "get_time", "parameters": clock}}]
schemas = {"get_weather": weather, "get_time": clock}


def check_calls(r, what, only=None, one=False):
    ch = r.choices[0]
    calls = ch.message.tool_calls
    check(calls, f"{what}: no tool_calls: {ch.message!r}")
    check(ch.finish_reason == "tool_calls", f"{what}: finish_reason {ch.finish_reason}")
    check(ch.message.content is None, f"{what}: content {ch.message.content!r} with only calls")
    if one:
        check(len(calls) == 1, f"{what}: {len(calls)} calls with parallel_tool_calls false")
    for c in calls:
        check(c.type == "function" and c.id.startswith("call_") and len(c.id) > 10, f"{what}: call {c!r}")
        check(c.function.name in schemas and (only is None or c.function.name == only),
              f"{what}: called {c.function.name!r}")
        try:
            args = json.loads(c.function.arguments)
        except ValueError:
            fail(f"{what}: arguments are not JSON: {c.function.arguments!r}")
        try:
            jsonschema.validate(args, schemas[c.function.name])
        except jsonschema.ValidationError as e:
            fail(f"{what}: {c.function.arguments!r} does not validate: {e.message}")
    return calls


for seed in range(4):
    r = client.chat.completions.create(model="tiny", messages=msgs, tools=tools, tool_choice="required",
                                       max_tokens=1200, temperature=1.0, seed=seed)
    check_calls(r, f"required, seed {seed}")
    r = client.chat.completions.create(model="tiny", messages=msgs, tools=tools, max_tokens=1200, temperature=1.0,
                                       seed=seed, tool_choice={"type": "function", "function": {"name": "get_time"}},
                                       parallel_tool_calls=False)
    check_calls(r, f"named, seed {seed}", only="get_time", one=True)


# Streaming: the deltas reassemble to the non-streamed call of the same seed, with no content.
def streamed(**kw):
    calls, content, finish = {}, "", None
    for chunk in client.chat.completions.create(model="tiny", messages=msgs, tools=tools, stream=True, **kw):
        if not chunk.choices:
            continue
        ch = chunk.choices[0]
        content += ch.delta.content or ""
        finish = ch.finish_reason or finish
        for d in ch.delta.tool_calls or []:
            if d.index not in calls:
                check(d.id and d.type == "function" and d.function.name and d.function.arguments == "",
                      f"first delta of a call carries id, type, name and empty arguments: {d!r}")
                calls[d.index] = {"id": d.id, "name": d.function.name, "arguments": ""}
            else:
                check(d.id is None and d.function.name is None, f"later delta repeats id or name: {d!r}")
                calls[d.index]["arguments"] += d.function.arguments or ""
    return [calls[i] for i in sorted(calls)], content, finish


for seed in (11, 12):
    kw = dict(tool_choice="required", max_tokens=1200, temperature=1.0, seed=seed)
    full = client.chat.completions.create(model="tiny", messages=msgs, tools=tools, **kw)
    want = [(c.function.name, c.function.arguments) for c in check_calls(full, f"stream ref, seed {seed}")]
    got, content, finish = streamed(**kw)
    check([(c["name"], c["arguments"]) for c in got] == want, f"seed {seed}: streamed {got} != {want}")
    check(content == "" and finish == "tool_calls", f"seed {seed}: streamed content {content!r}, finish {finish}")

# auto: whatever the random model says, the request succeeds; text without a call stays content.
r = client.chat.completions.create(model="tiny", messages=msgs, tools=tools, max_tokens=8, temperature=0)
check(r.choices[0].message.content is not None or r.choices[0].message.tool_calls, "auto: some answer")
got, content, finish = streamed(max_tokens=8, temperature=0)
check(content == (r.choices[0].message.content or "") or got, f"auto stream {content!r} vs {r.choices[0].message.content!r}")
# tool_choice none: plain text.
r = client.chat.completions.create(model="tiny", messages=msgs, tools=tools, tool_choice="none", max_tokens=4,
                                   temperature=0)
check(r.choices[0].message.tool_calls is None and r.choices[0].finish_reason in ("stop", "length"), "none: text")

# A history with a call and its result renders; the next turn can call again.
hist = msgs + [
    {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
        "name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius", "days": 1}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
    {"role": "user", "content": "And the time?"}]
r = client.chat.completions.create(model="tiny", messages=hist, tools=tools, tool_choice="required", max_tokens=1200,
                                   temperature=1.0, seed=3)
check_calls(r, "after a tool result")
st, tok = s.json("POST", "/tokenize", {"model": "tiny", "messages": hist})
check(st == 200 and tok["count"] > 0, f"/tokenize of a history with tool calls: {st} {tok}")

# A template that reads `tools` renders them itself (no preamble): its prompt holds the tools' JSON
# and is far shorter than the preamble's; the history's calls are rendered from their decoded arguments.
def prompt_len(model, **kw):
    return client.chat.completions.create(model=model, messages=hist, max_tokens=1, **kw).usage.prompt_tokens


bare, with_tools = prompt_len("qwen"), prompt_len("qwen", tools=tools)
tools_json = sum(len(json.dumps(t)) for t in tools)  # bytes; the tiny vocabulary merges a few pairs
check(with_tools - bare >= tools_json // 2, f"qwen template: {with_tools} - {bare} tokens for {tools_json} bytes of tools")
check(prompt_len("tiny", tools=tools) - with_tools > 200, "the preamble is used only without template support")
r = client.chat.completions.create(model="qwen", messages=hist, tools=tools, tool_choice="required", max_tokens=1200,
                                   temperature=1.0, seed=8)
check_calls(r, "qwen template")

# Legacy functions / function_call: the same machinery, answered as message.function_call.
r = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=1200, temperature=1.0, seed=5,
                                   functions=[t["function"] for t in tools], function_call={"name": "get_weather"})
fc = r.choices[0].message.function_call
check(fc and fc.name == "get_weather" and r.choices[0].finish_reason == "function_call", f"legacy: {r.choices[0]!r}")
jsonschema.validate(json.loads(fc.arguments), weather)

# Parameters with local references, as openai.pydantic_function_tool(NestedModel) writes them: a
# forced call once failed with 400 "Pointer '/$defs/Inner' does not exist" (the grammar nests the
# parameters under the call, away from the root their references point into).
nested = {"$defs": {"Place": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}},
                              "required": ["city"], "additionalProperties": False}},
          "type": "object", "properties": {"place": {"$ref": "#/$defs/Place"}},
          "required": ["place"], "additionalProperties": False}
schemas["lookup"] = nested
nested_tools = tools + [{"type": "function", "function": {"name": "lookup", "parameters": nested}}]
for seed in (21, 22):
    r = client.chat.completions.create(model="tiny", messages=msgs, tools=nested_tools, max_tokens=1200, seed=seed,
                                       temperature=1.0, tool_choice={"type": "function", "function": {"name": "lookup"}})
    check_calls(r, f"local $ref, named, seed {seed}", only="lookup")
    r = client.chat.completions.create(model="tiny", messages=msgs, tools=nested_tools, tool_choice="required",
                                       max_tokens=1200, temperature=1.0, seed=seed)
    check_calls(r, f"local $ref, required, seed {seed}")

# A forced call cut by max_tokens: no call, and none of its markup as content (it once leaked
# "<tool_call>\n{..." into message.content).
r = client.chat.completions.create(model="tiny", messages=msgs, tools=tools, tool_choice="required", max_tokens=6,
                                   temperature=1.0, seed=1)
ch = r.choices[0]
check(ch.finish_reason == "length" and not ch.message.tool_calls and not ch.message.content,
      f"cut forced call: {ch!r}")
got, content, finish = streamed(tool_choice="required", max_tokens=6, temperature=1.0, seed=1)
check(not got and content == "" and finish == "length", f"cut forced call, streamed: {got} {content!r} {finish}")


def expect_400(param, **kw):
    try:
        client.chat.completions.create(model="tiny", messages=kw.pop("messages", msgs), max_tokens=5, **kw)
    except openai.BadRequestError as e:
        err = e.body if isinstance(e.body, dict) else {}
        check(err.get("param") == param, f"{kw}: 400 names {err.get('param')!r}, not {param!r}: {err}")
        return err.get("message", "")
    fail(f"{str(kw)[:200]}: no 400")


expect_400("tools", extra_body={"tools": {"type": "function"}})
expect_400("tools[0].function.name", tools=[{"type": "function", "function": {"parameters": clock}}])
expect_400("tools[0].function.name", tools=[{"type": "function", "function": {"name": "has space"}}])
expect_400("tools[1].function", tools=[tools[1], tools[1]])
expect_400("tools[0]", tools=[{"type": "retrieval"}])
expect_400("tools[0].function.parameters", tools=[{"type": "function", "function": {"name": "f", "parameters": 3}}])
msg = expect_400("tool_choice", tools=tools, tool_choice={"type": "function", "function": {"name": "nope"}})
check("nope" in msg, f"unknown function message: {msg}")
expect_400("tool_choice", tools=tools, tool_choice="sometimes")
expect_400("tool_choice", tool_choice="required")
msg = expect_400("tools", tools=[{"type": "function", "function": {"name": f"f{i}"}} for i in range(1000)])
check("128" in msg, f"too many tools message: {msg}")
expect_400("tool_choice", tools=tools, tool_choice="required", response_format={"type": "json_object"})
expect_400("messages[1].tool_calls", messages=msgs + [{"role": "assistant", "tool_calls": [{"function": {}}]}])
expect_400("messages[0].tool_calls", messages=[{"role": "user", "content": "x", "tool_calls": []}])
expect_400("functions", tools=tools, functions=[tools[0]["function"]])
expect_400("tools", tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "nonsense"}}}],
           tool_choice="required")
try:
    client.completions.create(model="tiny", prompt="x", max_tokens=2, extra_body={"tools": tools})
    fail("tools on /v1/completions: no 400")
except openai.BadRequestError as e:
    check(e.body.get("param") == "tools", f"completions tools: {e.body}")

rc = s.stop()
check(rc == 0, f"servd exit code {rc}")
print("PASS")
