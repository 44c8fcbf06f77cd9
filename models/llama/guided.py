"""Constrained decoding hooks: llguidance computes, per generated token, the bitmask of allowed tokens
that servd's C sampler applies (masked tokens get -inf before sampling).

The engine calls these through the entry object (LlamaModel.guide_*):

- compile(kind, spec, n_vocab, eos_ids) -> grammar: checks a request's constraint and returns it as
  an llguidance grammar (JSON text) the engine keeps with the request. A bad or unsupported
  constraint raises ValueError naming the problem (HTTP 400). Runs on the engine's interpreter
  thread, before the request is queued.
- step(rows, free_ids) -> [[status, message], ...]: per row [id, grammar or None, tokens, ptr, nbytes]
  feeds the tokens generated since the last call to that sequence's matcher (created from grammar
  on its first call) and writes its next mask at ptr. status 0: mask written; 1: the grammar is
  complete (the engine ends the sequence); 2: error (message). free_ids: sequences that ended.
  Runs on the engine's guide worker thread, once per step for all constrained rows, while the
  step's forward runs (daemon/engine/guide.h says why one thread).

llguidance is a pinned PyPI wheel installed by scripts/install-python-deps.sh into a directory
servd puts on sys.path; its heavy calls drop the GIL.
"""
import json

import servd

_tok = None
_tok_key = None
_matchers = {}

# The request's kinds, as the engine numbers them (servd_guide_kind, engine.h).
KINDS = {1: "json_schema", 2: "json_object", 3: "regex", 4: "choice", 5: "grammar", 6: "tools"}

# Compact JSON: no free whitespace between tokens, the separators OpenAI's structured outputs use.
_JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def _llg():
    try:
        import llguidance
    except ImportError as e:
        raise RuntimeError("guided decoding needs the llguidance package, which is not installed "
                           "(scripts/install-python-deps.sh): " + str(e)) from None
    return llguidance


def _tokenizer(n_vocab, eos_ids):
    """The package's tokenizer.json as llguidance sees it, built once (about 1 s for 50k tokens)."""
    global _tok, _tok_key
    key = (n_vocab, tuple(eos_ids))
    if _tok is None or _tok_key != key:
        llg = _llg()
        man = servd.package.manifest
        path = (man.get("tokenizer") or {}).get("file") or "tokenizer.json"
        text = servd.package.read_file(path).decode("utf-8")
        _tok = llg.LLTokenizer(text, n_vocab=n_vocab, eos_token=list(eos_ids) or None)
        _tok_key = key
    return _tok


def _grammar(llg, kind, spec):
    if kind == "json_object":
        return llg.LLMatcher.grammar_from_json_schema({"type": "object"}, overrides=_JSON_OPTIONS)
    if kind == "json_schema":
        try:
            schema = json.loads(spec)
        except ValueError as e:
            raise ValueError("the schema is not JSON: " + str(e)) from None
        if not isinstance(schema, dict):
            raise ValueError("the schema must be a JSON object")
        return llg.LLMatcher.grammar_from_json_schema(schema, overrides=_JSON_OPTIONS)
    if kind == "regex":
        return llg.LLMatcher.grammar_from_regex(spec)
    if kind == "choice":
        choices = json.loads(spec)
        if not choices or not all(isinstance(c, str) and c for c in choices):
            raise ValueError("the choices must be a non-empty list of non-empty strings")
        return llg.grammar_from("choice", spec)
    if kind == "grammar":  # Lark, or llama.cpp's GBNF
        return llg.grammar_from("grammar", spec)
    if kind == "tools":  # a forced tool call in the family's format (tools.py)
        from . import tools
        return llg.grammar_from("lark", tools.grammar(json.loads(spec)))
    raise ValueError("unknown constraint kind " + repr(kind))


def compile(kind, spec, n_vocab, eos_ids):
    llg = _llg()
    kind = KINDS.get(kind, kind)
    tok = _tokenizer(n_vocab, eos_ids)
    grammar = _grammar(llg, kind, spec)
    is_error, messages = llg.LLMatcher.validate_grammar_with_warnings(grammar, tok)
    if is_error:
        raise ValueError(messages[0].strip() if messages else "invalid constraint")
    return grammar


def step(rows, free_ids):
    for i in free_ids:
        _matchers.pop(i, None)
    out = []
    for sid, grammar, tokens, ptr, nbytes in rows:
        m = _matchers.get(sid)
        if m is None:
            if grammar is None:
                out.append([2, "no matcher for sequence %d" % sid])
                continue
            m = _llg().LLMatcher(_tok, grammar)
            _matchers[sid] = m
        if tokens and not m.consume_tokens(tokens):
            out.append([2, m.get_error() or "the grammar rejected a token"])
            continue
        if m.is_error():
            out.append([2, m.get_error()])
            continue
        if m.is_stopped():
            out.append([1, ""])
            continue
        m.unsafe_compute_mask_ptr(ptr, nbytes)
        out.append([0, ""] if not m.is_error() else [2, m.get_error()])
    return out


def live():
    return len(_matchers)
