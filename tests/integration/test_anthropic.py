"""POST /v1/messages and /v1/messages/count_tokens through the official anthropic client against servd
serving a tiny random-weight Llama: the message object, the same greedy text and prompt as the
equivalent chat request, Anthropic's stream events in order (the SDK's stream helper assembles the
final message from them), stop sequences, count_tokens, the key as x-api-key, errors as the SDK's
exception classes in Anthropic's error shape; with llguidance, tool_choice any and tool give a valid
tool_use (streamed the same), and the tool_result round trip renders."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from servd_harness import Servd, check, fail, parse_args, python_deps, skip, tiny_llama_long  # noqa: E402

a = parse_args()
try:
    import anthropic
    import jsonschema
except ImportError as e:
    skip(f"{e.name} is not installed (use .venv-test)")
deps = python_deps(a)
KEY = "sk-test-anthropic"
s = Servd(a, ["--model", f"{tiny_llama_long(a, 'anthropic-tiny')}:tiny", "--api-key", KEY],
          env={"SERVD_PY_DEPS": deps})
client = anthropic.Anthropic(base_url=s.url, api_key=KEY, max_retries=0, timeout=120)
greedy = dict(model="tiny", extra_body={"temperature": 0, "ignore_eos": True})
ask = [{"role": "user", "content": "Say something."}]
auth = {"Authorization": f"Bearer {KEY}"}

# Not streaming: cut at max_tokens, with the whole object's shape.
r = client.messages.create(messages=ask, max_tokens=8, **greedy)
check(r.id.startswith("msg_") and r.type == "message" and r.role == "assistant" and r.model == "tiny", f"{r}")
check(r.stop_reason == "max_tokens" and r.stop_sequence is None, f"stop: {r}")
check(len(r.content) == 1 and r.content[0].type == "text", f"content {r.content}")
u = r.usage
check(u.output_tokens == 8 and u.input_tokens + u.cache_read_input_tokens > 0 and
      u.cache_creation_input_tokens == 0, f"usage {u}")
text = r.content[0].text

# The same as the equivalent chat request: same prompt tokens, same greedy text.
st, c = s.json("POST", "/v1/chat/completions", {"model": "tiny", "messages": ask, "max_tokens": 8, "temperature": 0,
                                                "ignore_eos": True}, auth)
check(st == 200, f"chat {st} {c}")
check(c["usage"]["prompt_tokens"] == u.input_tokens + u.cache_read_input_tokens, f"prompt {c['usage']} vs {u}")
check(c["choices"][0]["message"]["content"] == text, f"chat {c['choices'][0]['message']['content']!r} != {text!r}")
# The same prompt again is read from the prefix cache, and says so.
r2 = client.messages.create(messages=ask, max_tokens=1, **greedy)
check(r2.usage.cache_read_input_tokens > 0, f"no cache read on a repeated prompt: {r2.usage}")
check(r2.usage.input_tokens + r2.usage.cache_read_input_tokens == c["usage"]["prompt_tokens"], f"{r2.usage}")

# The system prompt, as a string or as text blocks, is the chat's system message.
rs = client.messages.create(messages=ask, system="You are terse.", max_tokens=2, **greedy)
rb = client.messages.create(messages=ask, system=[{"type": "text", "text": "You are terse."}], max_tokens=2, **greedy)
st, cs = s.json("POST", "/v1/chat/completions", {"model": "tiny", "max_tokens": 2, "messages": [
    {"role": "system", "content": "You are terse."}] + ask}, auth)
total = lambda m: m.usage.input_tokens + m.usage.cache_read_input_tokens  # noqa: E731
check(total(rs) == total(rb) == cs["usage"]["prompt_tokens"], f"system {rs.usage} {rb.usage} {cs['usage']}")

# count_tokens: the prompt the request would run.
n = client.messages.count_tokens(model="tiny", messages=ask, system="You are terse.")
check(n.input_tokens == total(rs), f"count_tokens {n.input_tokens} != {total(rs)}")


def raw_events(body):
    """The raw server-sent events of a streamed request: [(event, data)]."""
    st, h, data = s.request("POST", "/v1/messages", dict(body, stream=True),
                            {"x-api-key": KEY, "anthropic-version": "2023-06-01"})
    check(st == 200 and h["content-type"].startswith("text/event-stream"), f"stream {st} {h}")
    out = []
    for chunk in data.decode().split("\n\n"):
        if not chunk.strip():
            continue
        lines = dict(line.split(": ", 1) for line in chunk.split("\n"))
        d = json.loads(lines["data"])
        check(d["type"] == lines["event"], f"event {lines['event']} carries type {d['type']}")
        out.append((lines["event"], d))
    return out


# Streaming, raw: Anthropic's exact sequence.
ev = raw_events({"model": "tiny", "messages": ask, "max_tokens": 8, "temperature": 0, "ignore_eos": True})
types = [e for e, _ in ev]
nd = types.count("content_block_delta")
check(types == ["message_start", "ping", "content_block_start"] + ["content_block_delta"] * nd +
      ["content_block_stop", "message_delta", "message_stop"], f"event order {types}")
check("".join(d["delta"]["text"] for e, d in ev if e == "content_block_delta") == text, "streamed text")
check(ev[0][1]["message"]["content"] == [] and ev[0][1]["message"]["stop_reason"] is None, f"{ev[0]}")
check(ev[-2][1]["delta"]["stop_reason"] == "max_tokens" and ev[-2][1]["usage"]["output_tokens"] == 8, f"{ev[-2]}")

# Streaming through the SDK's helper: the final message it assembles is the non-streamed one.
with client.messages.stream(messages=ask, max_tokens=8, **greedy) as stream:
    streamed = "".join(stream.text_stream)
    final = stream.get_final_message()
check(streamed == text and final.content[0].text == text and final.stop_reason == "max_tokens", f"{final}")
check(final.usage.output_tokens == 8 and final.id.startswith("msg_"), f"final {final}")

# A stop sequence ends it early: stop_reason stop_sequence naming it, streamed or not.
if len(text) >= 6 and text[3:5] not in text[:3]:
    stop = text[3:5]
    rs = client.messages.create(messages=ask, max_tokens=8, model="tiny", extra_body={"temperature": 0}, stop_sequences=["@@", stop])
    check(rs.stop_reason == "stop_sequence" and rs.stop_sequence == stop and rs.content[0].text == text[:3],
          f"stop {stop!r}: {rs}")
    with client.messages.stream(messages=ask, max_tokens=8, model="tiny", extra_body={"temperature": 0},
                                stop_sequences=[stop]) as stream:
        fs = stream.get_final_message()
    check(fs.stop_reason == "stop_sequence" and fs.stop_sequence == stop and fs.content[0].text == text[:3], f"{fs}")
# Without a stop sequence met, the end is end_turn or max_tokens, never stop_sequence.
re_ = client.messages.create(messages=ask, max_tokens=4, model="tiny", extra_body={"temperature": 0}, stop_sequences=["\x01\x02"])
check(re_.stop_reason in ("end_turn", "max_tokens") and re_.stop_sequence is None, f"{re_}")


# Errors: the SDK's exception classes, in Anthropic's shape.
def bad(cls, needle, **kw):
    try:
        client.messages.create(**{"model": "tiny", "max_tokens": 4, "messages": ask, **kw})
    except cls as e:
        body = e.body
        check(body["type"] == "error" and needle in body["error"]["message"], f"{kw}: {body}")
        return e
    fail(f"{kw} was accepted")


e = bad(anthropic.BadRequestError, "image content is not supported", messages=[{"role": "user", "content": [
    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}])
check(e.body["error"]["type"] == "invalid_request_error", f"{e.body}")
bad(anthropic.BadRequestError, "matches no tool_use", messages=[{"role": "user", "content": [
    {"type": "tool_result", "tool_use_id": "toolu_x", "content": "42"}]}])
bad(anthropic.BadRequestError, "not a content block type", messages=[{"role": "user", "content": [
    {"type": "hologram"}]}])
bad(anthropic.BadRequestError, "temperature", extra_body={"temperature": 1.5})
bad(anthropic.BadRequestError, "maximum context length", max_tokens=100000)
e = bad(anthropic.NotFoundError, "does not exist", model="claude-nonexistent")
check(e.body["error"]["type"] == "not_found_error", f"{e.body}")
try:
    anthropic.Anthropic(base_url=s.url, api_key="wrong", max_retries=0).messages.create(model="tiny", max_tokens=1,
                                                                                        messages=ask)
    fail("a wrong key was accepted")
except anthropic.AuthenticationError as e:
    check(e.body["error"]["type"] == "authentication_error", f"{e.body}")
# Required fields missing or mistyped: a 400 in Anthropic's shape (the SDK would not send these).
for body, needle in [({"model": "tiny", "messages": ask}, "'max_tokens' is required"),
                     ({"model": "tiny", "max_tokens": 4}, "'messages' is required"),
                     ({"max_tokens": 4, "messages": ask}, "'model' is required"),
                     ({"model": "tiny", "max_tokens": "4", "messages": ask}, "max_tokens"),
                     ({"model": "tiny", "max_tokens": 4, "messages": "hi"}, "messages"),
                     ({"model": "tiny", "max_tokens": 4, "messages": [{"role": "user"}]}, "content"),
                     ("{not json", "JSON")]:
    st, j = s.json("POST", "/v1/messages", body, {"x-api-key": KEY})
    check(st == 400 and j["type"] == "error" and j["error"]["type"] == "invalid_request_error" and
          needle in j["error"]["message"], f"{body}: {st} {j}")
st, j = s.json("GET", "/v1/messages", None, {"x-api-key": KEY})
check(st == 405 and j["type"] == "error", f"GET: {st} {j}")

if not os.path.isdir(os.path.join(deps, "llguidance")):
    skip(f"the tools part needs llguidance in {deps} (scripts/install-python-deps.sh {deps}); the rest passed")

# Tools: tool_choice any gives a tool_use with input valid against its schema; stop_reason tool_use.
weather = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10},
                                            "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"], "additionalProperties": False}
tools = [{"name": "get_weather", "description": "Weather now", "input_schema": weather}]
q = [{"role": "user", "content": "What is the weather in Paris?"}]
kw = dict(model="tiny", messages=q, tools=tools, max_tokens=600, extra_body={"seed": 3, "temperature": 1.0})
r = client.messages.create(tool_choice={"type": "any"}, **kw)
uses = [b for b in r.content if b.type == "tool_use"]
check(uses and r.stop_reason == "tool_use", f"any: {r}")
for b in uses:
    check(b.id.startswith("toolu_") and b.name == "get_weather", f"tool_use {b}")
    jsonschema.validate(b.input, weather)

# Streamed with the same seed: the SDK assembles the same calls from input_json_delta events.
with client.messages.stream(tool_choice={"type": "any"}, **kw) as stream:
    fs = stream.get_final_message()
check([(b.name, b.input) for b in fs.content if b.type == "tool_use"] == [(b.name, b.input) for b in uses] and
      fs.stop_reason == "tool_use", f"streamed {fs.content} != {uses}")

# A named tool: that tool, one call with disable_parallel_tool_use.
r = client.messages.create(tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True}, **kw)
uses = [b for b in r.content if b.type == "tool_use"]
check(len(uses) == 1 and uses[0].name == "get_weather" and r.stop_reason == "tool_use", f"tool: {r.content}")
jsonschema.validate(uses[0].input, weather)

# The round trip: the assistant's content and a tool_result go back; the answer renders.
back = q + [{"role": "assistant", "content": [b.model_dump() for b in r.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": '{"temp": 21}'}]}]
r3 = client.messages.create(model="tiny", messages=back, tools=tools, max_tokens=4, extra_body={"temperature": 0})
check(r3.content and r3.stop_reason in ("end_turn", "max_tokens", "tool_use"), f"round trip {r3}")
check(total(r3) > total(r), f"the call and its result are in the prompt: {r3.usage} vs {r.usage}")
n = client.messages.count_tokens(model="tiny", messages=back, tools=tools)
check(n.input_tokens == total(r3), f"count_tokens with tools {n.input_tokens} != {total(r3)}")
# tool_choice none: the tools are not shown, so the prompt is the plain one.
rn = client.messages.create(tool_choice={"type": "none"}, **dict(kw, max_tokens=2))
rp = client.messages.create(model="tiny", messages=q, max_tokens=2)
check(total(rn) == total(rp) and all(b.type == "text" for b in rn.content), f"none {rn.usage} vs {rp.usage}")
bad(anthropic.BadRequestError, "not among the tools", tools=tools, tool_choice={"type": "tool", "name": "nope"})
bad(anthropic.BadRequestError, "no server tools", tools=[{"type": "web_search_20250305", "name": "web_search"}])
print("ok")
