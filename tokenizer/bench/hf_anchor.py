#!/usr/bin/env python3
"""Anchor for bench_tokenizer: Hugging Face `tokenizers` encoding the same corpus on one thread.
    hf_anchor.py TOKENIZER_JSON CORPUS REPS [docs|whole]
Prints one line per repetition: "<seconds> <tokens>". Test/bench only (.venv-test)."""
import os
import sys
import time

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
from tokenizers import Tokenizer  # noqa: E402

tok = Tokenizer.from_file(sys.argv[1])
with open(sys.argv[2], "rb") as f:
    text = f.read().decode("utf-8", errors="replace")
docs = [text] if len(sys.argv) > 4 and sys.argv[4] == "whole" else text.split("\n\n")  # documents of a few hundred bytes, encoded one call each as a server does
reps = int(sys.argv[3])
tok.encode(text[:100000])  # warm
for _ in range(reps):
    t0 = time.perf_counter()
    n = 0
    for d in docs:
        n += len(tok.encode(d, add_special_tokens=False).ids)
    print(f"{time.perf_counter() - t0:.6f} {n}", flush=True)
