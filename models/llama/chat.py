"""Chat templates: the package's Jinja template rendered the way Hugging Face transformers does.

The template comes from, in order: the manifest's "chat_template", the archive entry named by the
manifest's "chat_template_file" (or "chat_template.jinja"), or "chat_template" of the tokenizer config
entry (manifest tokenizer.config, else "tokenizer_config.json"). Special tokens the templates
use (bos_token, eos_token, ...) come from the manifest's "special_tokens" or tokenizer_config.json.
"""
import json
from datetime import datetime

import servd

_compiled = None
_extra = None
_source = ""
_tools_var = False
_added = None
_tcfg = {}


def _tokstr(v):
    if isinstance(v, dict):  # tokenizer_config.json AddedToken form
        return v.get("content", "")
    return v if isinstance(v, str) else ""


def _read_json(path):
    try:
        return json.loads(servd.package.read_file(path))
    except Exception:  # absent or not JSON: the other sources apply
        return {}


def _load():
    global _compiled, _extra, _source, _tools_var, _tcfg
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    man = servd.package.manifest
    tok = man.get("tokenizer") or {}
    tcfg = _read_json(tok.get("config") or "tokenizer_config.json")
    src = man.get("chat_template")
    for path in (man.get("chat_template_file"), "chat_template.jinja"):
        if src or not path:
            continue
        try:
            src = servd.package.read_file(path).decode("utf-8")
        except Exception:  # absent: the next source applies
            src = None
    if not src:
        src = tcfg.get("chat_template")
    if isinstance(src, list):  # named templates: use "default"
        src = next((t["template"] for t in src if t.get("name") == "default"), None)
    if not src:
        raise ValueError("chat template: the package has none (manifest chat_template, "
                         "chat_template.jinja or tokenizer_config.json)")

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    _compiled = env.from_string(src)
    _source = src
    # A template that reads `tools` renders them itself (the transformers convention); others get
    # them as a system-prompt preamble (tools.py).
    from jinja2 import meta
    _tools_var = "tools" in meta.find_undeclared_variables(env.parse(src))
    _tcfg = tcfg

    special = dict(man.get("special_tokens") or {})
    extra = {}
    for k in ("bos_token", "eos_token", "unk_token", "pad_token"):
        v = _tokstr(special.get(k)) or _tokstr(tcfg.get(k))
        extra[k] = v
    _extra = extra


def _added_tokens(tok, tcfg):
    names = [_tokstr(v) for v in (tcfg.get("added_tokens_decoder") or {}).values()]
    try:
        tj = json.loads(servd.package.read_file(tok.get("file") or "tokenizer.json"))
        names += [t.get("content", "") for t in tj.get("added_tokens") or []]
    except Exception:  # no tokenizer.json (a GGUF package): the template's markers decide
        pass
    return [n for n in names if n]


def template_source():
    if _compiled is None:
        _load()
    return _source


def supports_tools():
    if _compiled is None:
        _load()
    return _tools_var


def has_token(text):
    """Whether text is an added token of the tokenizer (read on first use: tokenizer.json is large)."""
    global _added
    if _compiled is None:
        _load()
    if _added is None:
        _added = frozenset(_added_tokens(servd.package.manifest.get("tokenizer") or {}, _tcfg))
    return text in _added


def render(messages, add_generation_prompt=True, **kwargs):
    if _compiled is None:
        _load()
    ctx = dict(_extra)
    ctx.update(kwargs)
    return _compiled.render(messages=messages, add_generation_prompt=bool(add_generation_prompt), **ctx)
