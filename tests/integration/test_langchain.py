"""LangChain's ChatOpenAI against servd serving a tiny random-weight Llama, as an agent framework
uses it: with_structured_output by every method (json_schema, function_calling, json_mode) gives
objects that validate against the schema at temperature 1 over several seeds, bind_tools with a
required or named tool gives a parsed call, streamed tool-call chunks aggregate to a call, and a
plain invoke/stream round trip works. Whatever the random model would say, the grammar engine makes
the output valid; LangChain's own parsers are the reference."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from servd_harness import Servd, check, parse_args, python_deps, skip, tiny_llama_long  # noqa: E402

a = parse_args()
try:
    import jsonschema
    from langchain_core.messages import AIMessageChunk, HumanMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from pydantic import BaseModel, Field
except ImportError as e:
    skip(f"{e.name} is not installed (use .venv-test)")
deps = python_deps(a, "llguidance")
s = Servd(a, ["--model", f"{tiny_llama_long(a, 'langchain-tiny')}:tiny"], env={"SERVD_PY_DEPS": deps})


def chat(seed, **kw):
    return ChatOpenAI(model="tiny", base_url=f"{s.url}/v1", api_key="unused", temperature=1.0, seed=seed,
                      max_tokens=600, max_retries=0, timeout=120, **kw)


# Bounded fields: the grammar itself ends the object well within max_tokens.
class Weather(BaseModel):
    """A weather forecast request."""
    city: str = Field(max_length=10, description="the city")
    days: int = Field(ge=1, le=7)
    unit: str = Field(pattern="^(celsius|fahrenheit)$")


weather_schema = Weather.model_json_schema()

# Plain chat, then streaming: the pieces join to a string.
r = chat(0).invoke([HumanMessage("Hello")])
check(isinstance(r.content, str) and r.response_metadata.get("finish_reason") in ("stop", "length"),
      f"invoke: {r!r}")
pieces = [c.content for c in chat(0).stream("Hello")]
check(len(pieces) > 1 and all(isinstance(p, str) for p in pieces), f"stream: {pieces!r}")

for method in ("json_schema", "function_calling"):
    for seed in range(3):
        got = chat(seed).with_structured_output(Weather, method=method).invoke("Weather in Oslo for 3 days?")
        check(isinstance(got, Weather), f"{method}, seed {seed}: {got!r}")
        jsonschema.validate(got.model_dump(), weather_schema)

# json_mode asks only for a JSON object (the schema is the prompt's job), so it is checked as JSON.
for seed in range(3):
    got = chat(seed).with_structured_output(None, method="json_mode").invoke("Answer in JSON.")
    check(isinstance(got, dict), f"json_mode, seed {seed}: {got!r}")
    json.dumps(got)

# include_raw keeps the raw message next to the parsed object.
got = chat(5).with_structured_output(Weather, method="json_schema", include_raw=True).invoke("Weather?")
check(got["parsing_error"] is None and isinstance(got["parsed"], Weather), f"include_raw: {got!r}")


class TimeArgs(BaseModel):
    zone: str = Field(max_length=6, description="an IANA zone or an offset")


class WeatherArgs(BaseModel):
    city: str = Field(max_length=10)
    days: int = Field(ge=1, le=7)


# Bounded arguments (args_schema): the grammar itself ends each call well within max_tokens.
@tool(args_schema=TimeArgs)
def get_time(zone: str) -> str:
    """The current time in a time zone."""
    return "12:00"


@tool(args_schema=WeatherArgs)
def get_weather(city: str, days: int) -> str:
    """A weather forecast."""
    return "sunny"


for choice, only in (("any", None), ("get_time", "get_time")):
    for seed in range(3):
        llm = chat(seed).bind_tools([get_time, get_weather], tool_choice=choice)
        m = llm.invoke("What time is it in Paris?")
        check(m.tool_calls and not m.invalid_tool_calls, f"bind_tools {choice}, seed {seed}: {m!r}")
        for c in m.tool_calls:
            check(c["name"] in ("get_time", "get_weather") and (only is None or c["name"] == only),
                  f"bind_tools {choice}: called {c['name']}")
            check(isinstance(c["args"], dict) and c["id"], f"bind_tools {choice}: call {c!r}")
            # LangChain's tool validates the arguments against its own schema.
            {"get_time": get_time, "get_weather": get_weather}[c["name"]].invoke(c["args"])

# Streaming tool calls: chunks aggregate (LangChain's + on AIMessageChunk) to the same call as invoke.
llm = chat(7).bind_tools([get_time, get_weather], tool_choice="get_weather")
whole = llm.invoke("Weather in Rome?")
acc = None
for chunk in llm.stream("Weather in Rome?"):
    check(isinstance(chunk, AIMessageChunk), f"stream chunk {chunk!r}")
    acc = chunk if acc is None else acc + chunk
check(acc is not None and acc.tool_calls and not acc.invalid_tool_calls, f"streamed tool calls: {acc!r}")
check([(c["name"], c["args"]) for c in acc.tool_calls] == [(c["name"], c["args"]) for c in whole.tool_calls],
      f"streamed {acc.tool_calls} != invoked {whole.tool_calls}")
s.stop()
print("ok: langchain structured output (json_schema, function_calling, json_mode), bind_tools, streaming")
