"""POST /v1/responses through the official openai client against servd serving a tiny random-weight
Llama: the response object, the typed stream events in order (the client parses each by its type),
the same greedy text and prompt as the equivalent chat request, instructions as a system message,
input items, bad inputs as 400s naming the field; with llguidance, a json_schema text format and a
function tool round trip with tool_choice "required"."""
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
deps = python_deps(a)
s = Servd(a, ["--model", f"{tiny_llama_long(a, 'responses-tiny')}:tiny"], env={"SERVD_PY_DEPS": deps})
client = openai.OpenAI(base_url=f"{s.url}/v1", api_key="unused", max_retries=0, timeout=120)
greedy = dict(model="tiny", temperature=0, extra_body={"ignore_eos": True})

# Not streaming: cut at max_output_tokens, so incomplete, with the whole object's shape.
r = client.responses.create(input="Say something.", max_output_tokens=8, **greedy)
check(r.id.startswith("resp_") and r.object == "response" and r.model == "tiny", f"response: {r}")
check(r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens", f"status: {r}")
check(len(r.output) == 1 and r.output[0].type == "message" and r.output[0].role == "assistant", f"output {r.output}")
msg = r.output[0]
check(msg.id.startswith("msg_") and len(msg.content) == 1 and msg.content[0].type == "output_text", f"msg {msg}")
check(msg.content[0].annotations == [] and r.output_text == msg.content[0].text, f"text {msg}")
u = r.usage
check(u.output_tokens == 8 and u.input_tokens > 0 and u.total_tokens == u.input_tokens + 8, f"usage {u}")
check(u.input_tokens_details.cached_tokens >= 0 and u.output_tokens_details.reasoning_tokens == 0, f"usage {u}")
check(r.store is False and r.max_output_tokens == 8 and r.temperature == 0 and r.tools == [], f"echo {r}")
text = r.output_text

# The same as the equivalent chat request: same prompt tokens, same greedy text.
c = client.chat.completions.create(messages=[{"role": "user", "content": "Say something."}], max_tokens=8, **greedy)
check(c.usage.prompt_tokens == u.input_tokens, f"chat prompt {c.usage.prompt_tokens} != {u.input_tokens}")
check(c.choices[0].message.content == text, f"chat {c.choices[0].message.content!r} != {text!r}")

# Instructions are a system message first: the rendered prompt grows, and matches chat's.
ri = client.responses.create(input="Say something.", instructions="You are terse.", max_output_tokens=2, **greedy)
ci = client.chat.completions.create(messages=[{"role": "system", "content": "You are terse."},
                                              {"role": "user", "content": "Say something."}], max_tokens=2, **greedy)
check(ri.usage.input_tokens > u.input_tokens, f"instructions: {ri.usage.input_tokens} <= {u.input_tokens}")
check(ri.usage.input_tokens == ci.usage.prompt_tokens, f"instructions {ri.usage} vs chat {ci.usage}")
check(ri.instructions == "You are terse.", f"instructions echo {ri.instructions!r}")

# Input items: messages with input_text parts are the string input.
items = [{"role": "developer", "content": "You are terse."},
         {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Say "},
                                                         {"type": "input_text", "text": "something."}]}]
rl = client.responses.create(input=items, max_output_tokens=2, **greedy)
cl = client.chat.completions.create(messages=[{"role": "developer", "content": "You are terse."},
                                              {"role": "user", "content": "Say something."}], max_tokens=2, **greedy)
check(rl.usage.input_tokens == cl.usage.prompt_tokens, f"items {rl.usage} vs chat {cl.usage}")


def stream(**kw):
    """The events of a streamed response, checked for order and numbering; returns them."""
    events = list(client.responses.create(stream=True, **kw))
    check([e.sequence_number for e in events] == list(range(len(events))), "sequence numbers 0, 1, ...")
    check([e.type for e in events[:2]] == ["response.created", "response.in_progress"], f"start {events[:2]}")
    check(events[0].response.status == "in_progress" and events[0].response.output == [], f"{events[0]}")
    return events


# Streaming: the deltas are the non-streamed text, between the item's and the part's events.
ev = stream(input="Say something.", max_output_tokens=8, **greedy)
types = [e.type for e in ev]
n_delta = types.count("response.output_text.delta")
want = (["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"]
        + ["response.output_text.delta"] * n_delta
        + ["response.output_text.done", "response.content_part.done", "response.output_item.done",
           "response.incomplete"])
check(types == want, f"event order {types}")
deltas = "".join(e.delta for e in ev if e.type == "response.output_text.delta")
check(n_delta >= 1 and deltas == text, f"streamed {deltas!r} != {text!r}")
check(ev[-4].text == text and ev[-3].part.text == text and ev[-2].item.content[0].text == text, "done events' text")
item_id = ev[2].item.id
check(all(e.item_id == item_id for e in ev if hasattr(e, "item_id")), "one item id throughout")
final = ev[-1].response
check(final.id == ev[0].response.id and final.output_text == text and final.usage.output_tokens == 8, f"{final}")

# A stop string ends it early: completed, and the stream ends with response.completed.
if len(text) >= 6 and text[3:5] not in text[:3]:
    stop = text[3:5]
    rs = client.responses.create(input="Say something.", max_output_tokens=8, model="tiny", temperature=0,
                                 extra_body={"stop": [stop]})
    check(rs.status == "completed" and rs.incomplete_details is None and rs.output_text == text[:3],
          f"stop {stop!r}: {rs.status} {rs.output_text!r}")
    ev = stream(input="Say something.", max_output_tokens=8, model="tiny", temperature=0, extra_body={"stop": [stop]})
    check(ev[-1].type == "response.completed" and ev[-1].response.output[0].status == "completed", f"{ev[-1]}")


# Bad inputs: 400 naming the field.
def bad(param, **kw):
    try:
        client.responses.create(**{"model": "tiny", "input": "x", **kw})
    except openai.BadRequestError as e:
        check(e.status_code == 400 and e.param == param, f"{kw}: param {e.param!r} ({e.message}), want {param!r}")
        return e
    fail(f"{kw} was accepted")


e = bad("previous_response_id", previous_response_id="resp_0123")
check("keeps no responses" in e.message, e.message)
bad("reasoning", extra_body={"reasoning": {"effort": "low"}})
bad("input", input=[])
bad("input[0]", input=[{"role": "tool", "content": "x"}])
bad("max_output_tokens", max_output_tokens=0)
bad("temperature", temperature=7)
bad("text.format.type", text={"format": {"type": "yaml"}})
bad("tools[0]", tools=[{"type": "web_search"}])
bad("input", input="x" * 20000)  # longer than the context: the chat machinery's error, renamed
r = client.responses.create(input="hi", store=True, max_output_tokens=1, model="tiny")
check(r.store is False, "store: nothing is kept")

if not os.path.isdir(os.path.join(deps, "llguidance")):
    skip(f"the guided part needs llguidance in {deps} (scripts/install-python-deps.sh {deps}); the rest passed")

# json_schema text format: the output validates, and the grammar ends it (completed).
schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}
fmt = {"format": {"type": "json_schema", "name": "person", "schema": schema, "strict": True}}
for seed in range(2):
    r = client.responses.create(model="tiny", input="A person.", text=fmt, max_output_tokens=200, temperature=1.0,
                                extra_body={"seed": seed})
    check(r.status == "completed", f"json_schema seed {seed}: {r.status} {r.output_text!r}")
    try:
        jsonschema.validate(json.loads(r.output_text), schema)
    except (ValueError, jsonschema.ValidationError) as err:
        fail(f"json_schema seed {seed}: {r.output_text!r}: {err}")
    check(r.text.format.type == "json_schema", f"text echo {r.text}")
bad("text.format", text={"format": {"type": "json_schema", "name": "x", "schema": {"type": "nonsense"}}})

# Function tools: tool_choice "required" gives a call with valid arguments; its result goes back.
weather = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10},
                                            "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"], "additionalProperties": False}
tools = [{"type": "function", "name": "get_weather", "description": "Weather now", "parameters": weather}]
ask = [{"role": "user", "content": "What is the weather in Paris?"}]
kw = dict(model="tiny", input=ask, tools=tools, tool_choice="required", max_output_tokens=600, temperature=1.0,
          extra_body={"seed": 3})
r = client.responses.create(**kw)
calls = [o for o in r.output if o.type == "function_call"]
check(calls and r.status == "completed", f"required: {r.output}")
fc = calls[0]
check(fc.name == "get_weather" and fc.call_id.startswith("call_") and fc.id.startswith("fc_") and
      fc.status == "completed", f"call {fc}")
jsonschema.validate(json.loads(fc.arguments), weather)
check(r.tools[0].name == "get_weather" and r.tool_choice == "required", f"tools echo {r.tools} {r.tool_choice}")

# Streamed, the same seed gives the same call in its own events.
ev = stream(**kw)
types = [e.type for e in ev]
check("response.function_call_arguments.done" in types and types[-1] == "response.completed", f"tool events {types}")
added = [e for e in ev if e.type == "response.output_item.added" and e.item.type == "function_call"]
done = [e for e in ev if e.type == "response.function_call_arguments.done"]
check(all(x.item.arguments == "" for x in added) and [d.arguments for d in done] == [c.arguments for c in calls],
      f"streamed calls {done} != {calls}")
for d in done:
    sargs = "".join(e.delta for e in ev if e.type == "response.function_call_arguments.delta" and e.item_id == d.item_id)
    check(sargs == d.arguments, f"deltas {sargs!r} != {d.arguments!r}")
check([o.arguments for o in ev[-1].response.output if o.type == "function_call"] == [c.arguments for c in calls],
      f"completed {ev[-1].response.output}")

# The round trip: the call and its output go back as input items; the answer is a message.
back = ask + [{"type": "function_call", "call_id": fc.call_id, "name": fc.name, "arguments": fc.arguments},
              {"type": "function_call_output", "call_id": fc.call_id, "output": '{"temp": 21}'}]
r2 = client.responses.create(model="tiny", input=back, tools=tools, max_output_tokens=4, **{k: v for k, v in
                             greedy.items() if k != "model"})
check(r2.output and r2.output[0].type in ("message", "function_call"), f"round trip {r2.output}")
check(r2.usage.input_tokens > r.usage.input_tokens, f"the call and its output are in the prompt: {r2.usage}")
bad("tool_choice", tools=tools, tool_choice={"type": "mcp"})
print("ok")
