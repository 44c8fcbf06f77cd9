#!/usr/bin/env python3
"""Recorded check (not run by ctest: llama.cpp is not a dependency): SmolLM2's tokenization by a
running llama.cpp server (`llama-server -m SmolLM2-135M-Instruct.Q4_1.gguf --port PORT`, its
/tokenize endpoint) against the ids in DIR/smollm2-gguf.expect.json, which test_tokenizer_hf
checks servd against. Equal ids here mean servd's "smollm" pre-tokenizer does what llama.cpp does.
    compare_llama_cpp.py DIR PORT
Texts are the fixture corpus decoded with errors="replace" (JSON carries no invalid UTF-8)."""
import json
import sys
import urllib.request


def tokenize(port, text):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/tokenize",
                                 data=json.dumps({"content": text, "add_special": False,
                                                  "parse_special": True}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req) as r:
        return json.load(r)["tokens"]


def main():
    d, port = sys.argv[1], int(sys.argv[2])
    exp = json.load(open(f"{d}/smollm2-gguf.expect.json"))
    total = same = 0
    for c in exp["encode"]:
        if c["add_special"]:
            continue
        text = bytes.fromhex(c["text_hex"]).decode("utf-8", errors="replace")
        got = tokenize(port, text)
        total += 1
        if got == c["ids"]:
            same += 1
        elif total - same <= 10:
            print(f"differs: {text!r}\n  llama.cpp {got}\n  servd/hf  {c['ids']}")
    print(f"llama.cpp agrees on {same} of {total} texts")
    return 0 if same == total else 1


if __name__ == "__main__":
    sys.exit(main())
