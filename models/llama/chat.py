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
    global _compiled, _extra
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

    special = dict(man.get("special_tokens") or {})
    extra = {}
    for k in ("bos_token", "eos_token", "unk_token", "pad_token"):
        v = _tokstr(special.get(k)) or _tokstr(tcfg.get(k))
        extra[k] = v
    _extra = extra


def render(messages, add_generation_prompt=True, **kwargs):
    if _compiled is None:
        _load()
    ctx = dict(_extra)
    ctx.update(kwargs)
    return _compiled.render(messages=messages, add_generation_prompt=bool(add_generation_prompt), **ctx)
