#!/usr/bin/env python3
"""A copy-heavy workload for servd-bench (--dataset, ShareGPT JSONL) built from this repository's own
sources and docs: each request hands the model a text and asks for it back with an edit, as code
edits, reformatting and answers quoting their context do.

  scripts/bench/copy_workload.py OUT.jsonl [--n 24] [--lines 40] [--seed 0]

Kinds (in turn): a C function block with one identifier renamed; a Markdown paragraph quoted with
one word replaced; a C block reindented with tabs. Texts are cut at line boundaries to --lines."""
import argparse
import json
import os
import random
import re

root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def files(pattern_dirs, ext):
    out = []
    for d in pattern_dirs:
        for base, _, names in os.walk(os.path.join(root, d)):
            out += [os.path.join(base, n) for n in sorted(names) if n.endswith(ext)]
    return sorted(out)


def chunk(path, lines, rng):
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read().splitlines()
    if len(text) <= lines:
        return "\n".join(text)
    start = rng.randrange(0, len(text) - lines)
    return "\n".join(text[start:start + lines])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--n", type=int, default=24)
    ap.add_argument("--lines", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    c_files = files(["daemon", "kernels/src", "tokenizer", "package_format"], ".c")
    docs = files(["docs"], ".md")
    with open(a.out, "w") as out:
        for i in range(a.n):
            kind = i % 3
            if kind == 1:
                text = chunk(rng.choice(docs), a.lines // 2, rng)
                words = [w for w in re.findall(r"[A-Za-z]{5,}", text)]
                old = rng.choice(words) if words else "servd"
                ask = (f"Quote the following text exactly as it is, but replace every '{old}' with "
                       f"'{old.upper()}':\n\n{text}")
            else:
                text = chunk(rng.choice(c_files), a.lines, rng)
                idents = [w for w in re.findall(r"\b[a-z_][a-z0-9_]{4,}\b", text)
                          if w not in ("const", "return", "static", "while", "sizeof", "break", "struct")]
                old = rng.choice(idents) if idents else "value"
                if kind == 0:
                    ask = (f"Here is some C code:\n\n```c\n{text}\n```\n\nRepeat the code exactly, with "
                           f"`{old}` renamed to `{old}_v2`.")
                else:
                    ask = f"Rewrite this C code with tab indentation instead of spaces:\n\n```c\n{text}\n```"
            out.write(json.dumps({"conversations": [{"from": "human", "value": ask}]}) + "\n")


if __name__ == "__main__":
    main()
