"""Constrained decoding (structured outputs) through the official openai client against servd serving a
tiny random-weight Llama: whatever such a model would say, the output must obey the constraint.
json_schema at temperature 1 over several seeds parses and validates; guided_choice, guided_regex,
guided_grammar; invalid schemas and unimplemented fields are 400s naming the field; a client that
disconnects mid-stream leaves no grammar matcher behind."""
import concurrent.futures
import json
import os
import re
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from servd_harness import Servd, check, fail, metric_value, parse_args, skip, tiny_llama  # noqa: E402

a = parse_args()
try:
    import jsonschema
    import openai
except ImportError as e:
    skip(f"{e.name} is not installed (use .venv-test)")
deps = os.environ.get("SERVD_PY_DEPS") or os.path.join(os.path.dirname(os.path.dirname(a.servd)), "python-deps")
if not os.path.isdir(os.path.join(deps, "llguidance")):
    skip(f"llguidance is not installed in {deps} (scripts/install-python-deps.sh {deps})")
pkg = tiny_llama(a)
s = Servd(a, ["--model", f"{pkg}:tiny"], env={"SERVD_PY_DEPS": deps})
client = openai.OpenAI(base_url=f"{s.url}/v1", api_key="unused", max_retries=0, timeout=120)
msgs = [{"role": "user", "content": "Describe a person."}]

# json_schema (strict) at temperature 1: every seed's output parses and validates. The schema bounds
# every value, so the grammar itself ends the text well within max_tokens.
schema = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 3},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "age", "role", "tags", "ok"],
    "additionalProperties": False,
}
rf = {"type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": True}}
for seed in range(6):
    r = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=200, temperature=1.0, seed=seed,
                                       response_format=rf)
    text = r.choices[0].message.content
    try:
        doc = json.loads(text)
    except ValueError:
        fail(f"seed {seed}: not JSON: {text!r}")
    try:
        jsonschema.validate(doc, schema)
    except jsonschema.ValidationError as e:
        fail(f"seed {seed}: {text!r} does not validate: {e.message}")
    check(r.choices[0].finish_reason == "stop", f"seed {seed}: finish_reason {r.choices[0].finish_reason}")

# json_object: some JSON object (bounded by max_tokens, so only its prefix is checked when cut).
r = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=40, temperature=0,
                                   response_format={"type": "json_object"})
text = r.choices[0].message.content
check(text.startswith("{"), f"json_object: {text!r}")
if r.choices[0].finish_reason == "stop":
    check(isinstance(json.loads(text), dict), f"json_object: {text!r}")

# vLLM's fields, through extra_body, on both routes; n > 1 gives each choice its own matcher.
choices = ["red", "green", "blue"]
for seed in range(3):
    c = client.completions.create(model="tiny", prompt="Pick a colour:", max_tokens=10, temperature=1.0, seed=seed,
                                  n=2, extra_body={"guided_choice": choices})
    for ch in c.choices:
        check(ch.text in choices, f"guided_choice gave {ch.text!r}")
pattern = r"[0-9]{3}-[a-z]{2,4}"
r = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=20, temperature=1.0, seed=3,
                                   extra_body={"guided_regex": pattern})
check(re.fullmatch(pattern, r.choices[0].message.content), f"guided_regex: {r.choices[0].message.content!r}")
r = client.completions.create(model="tiny", prompt="x", max_tokens=20, temperature=1.0, seed=4,
                              extra_body={"guided_grammar": 'start: ("ab" | "cd")+ "!"'})
check(re.fullmatch(r"(ab|cd)+!", r.choices[0].text), f"guided_grammar: {r.choices[0].text!r}")
r = client.completions.create(model="tiny", prompt="x", max_tokens=60, temperature=1.0, seed=5,
                              extra_body={"guided_json": {"type": "object", "properties": {"n": {"type": "integer",
                                          "minimum": 1, "maximum": 9}}, "required": ["n"],
                                          "additionalProperties": False}})
check(json.loads(r.choices[0].text)["n"] in range(1, 10), f"guided_json: {r.choices[0].text!r}")


# Many constrained rows in one step, each with its own grammar, beside unconstrained ones: the step's
# masks are computed together on the guide worker while the forward runs, and every row gets its
# own. Each output is checked against its own constraint.
def one(i):
    kind = i % 4
    if kind == 0:
        n_schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": i, "maximum": i + 5}},
                    "required": ["n"], "additionalProperties": False}
        r = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=40, temperature=1.0, seed=i,
                                           response_format={"type": "json_schema",
                                                            "json_schema": {"name": "n", "schema": n_schema}})
        v = json.loads(r.choices[0].message.content)["n"]
        check(i <= v <= i + 5, f"row {i}: n={v} outside [{i}, {i + 5}]")
    elif kind == 1:
        pat = "[a-c]{%d}" % (3 + i % 5)
        r = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=20, temperature=1.0, seed=i,
                                           extra_body={"guided_regex": pat})
        check(re.fullmatch(pat, r.choices[0].message.content), f"row {i}: {r.choices[0].message.content!r} !~ {pat}")
    elif kind == 2:
        opts = [f"opt{i}a", f"opt{i}b"]
        r = client.completions.create(model="tiny", prompt="Pick:", max_tokens=10, temperature=1.0, seed=i,
                                      extra_body={"guided_choice": opts})
        check(r.choices[0].text in opts, f"row {i}: {r.choices[0].text!r} not in {opts}")
    else:
        r = client.completions.create(model="tiny", prompt="Go", max_tokens=12, temperature=1.0, seed=i)
        check(r.choices[0].finish_reason in ("stop", "length"), f"row {i}: unconstrained {r.choices[0]}")


t0 = s.metrics()
with concurrent.futures.ThreadPoolExecutor(16) as ex:
    list(ex.map(one, range(32)))
t1 = s.metrics()
mask_s = metric_value(t1, "servd_guided_mask_seconds_total", {"model": "tiny"})
wait_s = metric_value(t1, "servd_guided_wait_seconds_total", {"model": "tiny"})
# (The tiny model's forward is shorter than the worker's wake-up, so the wait may exceed the mask time.)
check(mask_s and mask_s > 0 and wait_s is not None and wait_s >= 0, f"mask {mask_s} s, wait {wait_s} s")
check(metric_value(t1, "servd_guided_rows_total", {"model": "tiny"}) >
      metric_value(t0, "servd_guided_rows_total", {"model": "tiny"}), "constrained rows counted")


def expect_400(param, **kw):
    try:
        client.chat.completions.create(model="tiny", messages=msgs, max_tokens=5, **kw)
    except openai.BadRequestError as e:
        err = e.body if isinstance(e.body, dict) else {}
        check(err.get("param") == param, f"{kw}: 400 names {err.get('param')!r}, not {param!r}: {err}")
        return err.get("message", "")
    fail(f"{kw}: no 400")


msg = expect_400("response_format", response_format={"type": "json_schema", "json_schema": {
    "name": "x", "schema": {"type": "object", "properties": {"a": {"type": "nonsense"}}}}})
check("nonsense" in msg, f"invalid schema message: {msg}")
msg = expect_400("guided_regex", extra_body={"guided_regex": "(?<=a)b"})
check("look" in msg, f"unsupported regex message: {msg}")
expect_400("response_format.type", response_format={"type": "xml"})
expect_400("guided_regex", extra_body={"guided_json": {"type": "string"}, "guided_regex": "a"})
expect_400("guided_choice", extra_body={"guided_choice": []})
expect_400("guided_decoding_backend", extra_body={"guided_decoding_backend": "outlines"})
expect_400("guided_whitespace_pattern", extra_body={"guided_whitespace_pattern": " *"})
expect_400("logit_bias", logit_bias={"999999": 10})
r = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=3, temperature=0,
                                   extra_body={"skip_special_tokens": True, "min_tokens": 0})
check(r.choices[0].message.content is not None, "fields set to what servd does anyway are accepted")

# A client that goes away mid-stream: the request is cancelled and its matcher freed.
body = json.dumps({"model": "tiny", "messages": msgs, "max_tokens": 400, "temperature": 1.0, "stream": True,
                   "guided_regex": "[a-z]{1000}"}).encode()  # cannot end before max_tokens
sock = socket.create_connection(("127.0.0.1", s.port), timeout=30)
sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
             b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
got = b""
while got.count(b"data: ") < 5:
    chunk = sock.recv(65536)
    check(chunk, f"stream ended early: {got[-300:]!r}")
    got += chunk
live = metric_value(s.metrics(), "servd_guided_sequences", {"model": "tiny"})
check(live == 1, f"one matcher while streaming, got {live}")
sock.close()
deadline = time.monotonic() + 20
while time.monotonic() < deadline:
    t = s.metrics()
    if metric_value(t, "servd_guided_sequences", {"model": "tiny"}) == 0 and \
            metric_value(t, "servd_requests_running", {"model": "tiny"}) in (0, None):
        break
    time.sleep(0.1)
else:
    fail(f"after the disconnect: {metric_value(t, 'servd_guided_sequences', {'model': 'tiny'})} matchers left")
rows = metric_value(t, "servd_guided_rows_total", {"model": "tiny"})
check(rows and rows > 0, f"servd_guided_rows_total {rows}")
r = client.completions.create(model="tiny", prompt="x", max_tokens=10, temperature=0,
                              extra_body={"guided_choice": ["yes", "no"]})
check(r.choices[0].text in ("yes", "no"), "still serving after the disconnect")
rc = s.stop()
check(rc == 0, f"servd exit code {rc}")
print("PASS")
