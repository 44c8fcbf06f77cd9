"""Reasoning output: the markers a family's models write their thought between, from the package's chat
template, and the prompt rendered with the request's chat_template_kwargs (enable_thinking, ...).

The engine calls render() through the entry object's tool_render with an options object in place of
the tools list (LlamaModel.tool_render): {"tools": [...] or None, "chat_template_kwargs": {...}}.
It returns {"prompt", "options": True, "reasoning": {"start", "end", "opened"} or absent, and with
tools "markers" and "family" (tools.py)}; "options" tells servd this code knows the options object
(code packed before it renders the object as if it were the tools list, which servd then discards).

Families (their templates name the markers):
- <think> ... </think>: Qwen3, QwQ, DeepSeek-R1 and its distills, SmolLM3, Phi-4-reasoning
- [THINK] ... [/THINK]: Magistral
The API layer (daemon/api/reasoning.c) splits the output at the markers; "opened" says the prompt
already ends with the start marker (DeepSeek-R1's templates), so the output starts inside the thought.
A prompt that ends with the end marker (Qwen3 with enable_thinking false) has no thought to split.
"""
from . import chat

_PAIRS = (("<think>", "</think>"), ("[THINK]", "[/THINK]"))

# Keys a template gets from servd itself: chat_template_kwargs may not replace them.
_RESERVED = ("messages", "add_generation_prompt", "tools")


def markers():
    """(start, end) of this package's thought, or None: the first pair whose end marker its template
    writes (templates drop earlier turns' thoughts by splitting at it)."""
    src = chat.template_source()
    for start, end in _PAIRS:
        if end in src:
            return start, end
    return None


def state(prompt):
    """The thought's state after this prompt: {"start", "end", "opened"}, or None (no markers, or
    the prompt closed the thought already)."""
    m = markers()
    if not m:
        return None
    tail = prompt.rstrip()
    if tail.endswith(m[1]):
        return None
    return {"start": m[0], "end": m[1], "opened": tail.endswith(m[0])}


def kwargs_of(opts):
    kw = opts.get("chat_template_kwargs") or {}
    if not isinstance(kw, dict):
        raise ValueError("chat_template_kwargs must be an object")
    return {k: v for k, v in kw.items() if k not in _RESERVED}


def render(messages, add_generation_prompt, opts):
    kw = kwargs_of(opts)
    tools = opts.get("tools")
    if tools:
        from . import tools as t
        res = t.render(messages, add_generation_prompt, tools, **kw)
    else:
        res = {"prompt": chat.render(messages, add_generation_prompt, **kw)}
    res["options"] = True
    st = state(res["prompt"]) if add_generation_prompt else None
    if st:
        res["reasoning"] = st
    return res
