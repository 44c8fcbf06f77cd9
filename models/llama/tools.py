"""Tool calling: the call format of each model family, chosen by the markers of the package's chat
template and tokenizer, with its parser, its system-prompt preamble for templates that know no tools,
and the llguidance grammar that forces a call (tool_choice "required" or a named function).

Families (what the model writes when it calls):

- hermes (Hermes, Qwen 2/2.5/3, and the default): <tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>
  once per call.
- llama3 (Llama 3.1+ JSON tool calling): {"name": ..., "parameters": {...}}, optionally after
  <|python_tag|>; several calls separated by ";" or newlines.
- mistral: [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]

Special tokens (<|python_tag|>, [TOOL_CALLS]) are dropped from the detokenized text, so each parser
also takes the bare JSON at the start of the output. A forced call is constrained to the bare form
(no special-token marker), which every parser accepts.

The engine calls, through the entry object (LlamaModel.tool_*):
- render(messages, add_generation_prompt, tools, **template_kwargs) -> {"prompt": text, "markers": [...],
  "family": f} (through reasoning.render, which passes the request's chat_template_kwargs)
- parse(text, spec) -> {"content": str or None, "calls": [{"name", "arguments" (JSON text)}]}
- grammar(spec) -> llguidance grammar, spec = {"tools", "choice" ("required" or a name), "parallel"}
"""
import json

from . import chat

# A forced answer holds at most this many parallel calls: the grammar, not the model, bounds it.
MAX_PARALLEL = 8

# Compact JSON with the separators OpenAI uses (the same as structured outputs, guided.py).
_X_GUIDANCE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}

_HERMES_PREAMBLE = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{tools}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>')


def family():
    """The call format of this package, from its template's and tokenizer's markers."""
    src = chat.template_source()
    if "[TOOL_CALLS]" in src or chat.has_token("[TOOL_CALLS]"):
        return "mistral"
    if "<tool_call>" in src:
        return "hermes"
    if "<|python_tag|>" in src or ("<|start_header_id|>" in src and "tools" in src):
        return "llama3"
    return "hermes"


def _markers(fam):
    """Text that starts a call in this family's output: the API streams text before it as content."""
    if fam == "mistral":
        return ["[TOOL_CALLS]", '[{"name"']
    if fam == "llama3":
        return ["<|python_tag|>", '{"name"']
    return ["<tool_call>"]


def _functions(tools):
    return [t["function"] for t in tools]


def render(messages, add_generation_prompt, tools, **template_kwargs):
    fam = family()
    messages = [_normalize(m) for m in messages]
    if chat.supports_tools():
        prompt = chat.render(messages, add_generation_prompt, tools=tools, **template_kwargs)
    else:
        # The template knows no tools: describe them in a system message, Hermes style.
        pre = _HERMES_PREAMBLE.format(tools="\n".join(json.dumps(t, ensure_ascii=False) for t in tools))
        messages = [_flatten_tool_turn(m) for m in messages]
        if messages and messages[0].get("role") == "system":
            messages[0] = dict(messages[0], content=(messages[0].get("content") or "") + "\n\n" + pre)
        else:
            messages.insert(0, {"role": "system", "content": pre})
        prompt = chat.render(messages, add_generation_prompt, **template_kwargs)
        fam = "hermes"
    return {"prompt": prompt, "markers": _markers(fam), "family": fam}


def _normalize(m):
    """Templates index tool_call.function.arguments as a mapping (the transformers convention):
    the OpenAI wire form carries it as JSON text."""
    calls = m.get("tool_calls")
    if not calls:
        return m
    out = []
    for c in calls:
        f = dict(c.get("function") or {})
        a = f.get("arguments")
        if isinstance(a, str):
            try:
                f["arguments"] = json.loads(a) if a.strip() else {}
            except ValueError:
                pass  # not JSON: the template gets the text as the client sent it
        out.append(dict(c, function=f))
    return dict(m, tool_calls=out)


def _flatten_tool_turn(m):
    """For a template without tool support: calls and results as Hermes-style text of their turn."""
    if m.get("tool_calls"):
        text = m.get("content") or ""
        for c in m["tool_calls"]:
            f = c.get("function") or {}
            call = {"name": f.get("name"), "arguments": f.get("arguments", {})}
            text += ("\n" if text else "") + "<tool_call>\n" + json.dumps(call, ensure_ascii=False) + "\n</tool_call>"
        return {"role": "assistant", "content": text}
    if m.get("role") == "tool":
        return {"role": "user", "content": "<tool_response>\n" + (m.get("content") or "") + "\n</tool_response>"}
    return m


# ---- parsing -------------------------------------------------------------------------------------

def _call(obj, names, key):
    """{"name", "arguments" (JSON text)} from a decoded call, or None when it is no call of ours."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    if names and obj["name"] not in names:
        return None
    args = obj.get(key, obj.get("arguments", obj.get("parameters", {})))
    if isinstance(args, str):  # some models write the arguments as JSON text already
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return {"name": obj["name"], "arguments": json.dumps(args, ensure_ascii=False, separators=(", ", ": "))}


def _json_values(text):
    """Consecutive JSON values at the start of text (separated by whitespace, ';' or ','), and where
    the first thing that is no JSON value begins."""
    dec = json.JSONDecoder()
    vals, i, n = [], 0, len(text)
    while True:
        j = i
        while j < n and text[j] in " \t\r\n;,":
            j += 1
        if j >= n:
            return vals, n
        try:
            v, end = dec.raw_decode(text, j)
        except ValueError:
            return vals, i
        vals.append(v)
        i = end


def _parse_hermes(text, names):
    calls, content, pos = [], [], 0
    while True:
        s = text.find("<tool_call>", pos)
        if s < 0:
            content.append(text[pos:])
            break
        content.append(text[pos:s])
        e = text.find("</tool_call>", s)
        body = text[s + len("<tool_call>"):e if e >= 0 else len(text)]
        try:
            c = _call(json.loads(body), names, "arguments")
        except ValueError:
            c = None
        if c is None:  # not a call after all: the text stays content
            content.append(text[s:e + len("</tool_call>") if e >= 0 else len(text)])
        else:
            calls.append(c)
        if e < 0:
            break
        pos = e + len("</tool_call>")
    return "".join(content), calls


def _parse_json_calls(text, names, key):
    """Llama 3 / Mistral: the output starts (after its marker) with the call(s) as JSON."""
    stripped = text.lstrip()
    for marker in ("<|python_tag|>", "[TOOL_CALLS]"):
        if stripped.startswith(marker):
            stripped = stripped[len(marker):]
    vals, end = _json_values(stripped)
    flat = []
    for v in vals:
        flat.extend(v if isinstance(v, list) else [v])
    calls = [_call(v, names, key) for v in flat]
    if not calls or any(c is None for c in calls):
        return text, []
    return stripped[end:], calls


def parse(text, spec):
    names = {f["name"] for f in _functions(spec.get("tools") or [])}
    fam = spec.get("family") or family()
    if fam == "hermes":
        content, calls = _parse_hermes(text, names)
    else:
        content, calls = _parse_json_calls(text, names, "parameters" if fam == "llama3" else "arguments")
        if not calls:  # models fine-tuned on another family's format
            content, calls = _parse_hermes(text, names)
    if not spec.get("parallel", True):
        calls = calls[:1]
    content = content.strip()
    return {"content": content if content or not calls else None, "calls": calls}


# ---- forcing a call --------------------------------------------------------------------------------

def _call_schema(f, key):
    params = f.get("parameters") or {"type": "object", "properties": {}}
    return {"type": "object", "properties": {"name": {"const": f["name"]}, key: params},
            "required": ["name", key], "additionalProperties": False}


def grammar(spec, fam=None):
    """A Lark grammar (llguidance's dialect) whose every sentence is one call, or with parallel calls
    one or more, to the allowed functions, with arguments valid against their parameter schemas."""
    fam = fam or spec.get("family") or family()
    funcs = _functions(spec["tools"])
    choice = spec.get("choice", "required")
    if choice != "required":
        funcs = [f for f in funcs if f["name"] == choice]
        if not funcs:
            raise ValueError("tool_choice names an unknown function: " + repr(choice))
    key = "parameters" if fam == "llama3" else "arguments"
    schemas = [_call_schema(f, key) for f in funcs]
    schema = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    schema = dict(schema, **{"x-guidance": _X_GUIDANCE})
    many = bool(spec.get("parallel", True))
    more = "{0,%d}" % (MAX_PARALLEL - 1)
    rules = ["call: %json " + json.dumps(schema, ensure_ascii=False)]
    if fam == "hermes":
        rules.append('one: "<tool_call>\\n" call "\\n</tool_call>"')
        rules.insert(0, 'start: one ("\\n" one)' + more if many else "start: one")
    elif fam == "mistral":
        rules.insert(0, 'start: "[" call (", " call)' + more + ' "]"' if many else 'start: "[" call "]"')
    else:
        rules.insert(0, 'start: call ("; " call)' + more if many else "start: call")
    return "\n".join(rules) + "\n"
