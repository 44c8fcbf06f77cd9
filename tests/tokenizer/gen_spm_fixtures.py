#!/usr/bin/env python3
"""SentencePiece-style BPE (byte fallback) fixtures: a small model trained here with `sentencepiece`,
as Hugging Face tokenizer.json files and as a GGUF imported by modelpkg.

    gen_spm_fixtures.py --out DIR [--modelpkg PATH]

Writes, in the format test_tokenizer_hf reads (see gen_fixtures.py):
    spm-legacy     tokenizer.json with the Prepend + Replace normalizer (Llama 2, Mistral v0.1)
    spm-first      normalizer null, Metaspace pre-tokenizer with prepend_scheme "first" (legacy=False)
    spm-split      Metaspace pre-tokenizer (split, "always") and the Metaspace decoder (older files)
    spm-added      spm-legacy with added tokens matched before and after the normalizer
    spm-ref        the spm-legacy tokenizer, ids expected as sentencepiece itself gives them
    spm-gguf       the tokenizer.json modelpkg writes for a GGUF (tokenizer.ggml.model "llama") built
                   from the same model, ids expected from the spm-legacy Hugging Face tokenizer
The Hugging Face tokenizers are built with the `tokenizers` library the way transformers'
LlamaConverter does (merges: every split of a piece into two pieces, by the piece's score).
Decoding: where a run of <0xXX> tokens is not valid UTF-8, Hugging Face's ByteFallback decoder makes
every byte of the run U+FFFD; servd replaces each maximal invalid subpart by one U+FFFD (as it does
for byte-level tokenizers, and as the incremental detokenizer can do without holding text back).
Those decode cases expect that rule (Python's bytes.decode(errors="replace")); their count is printed.
Test-only: runs with .venv-test's python (sentencepiece, tokenizers, gguf).
"""
import argparse
import io
import json
import os
import random
import subprocess
import sys
import zipfile

import sentencepiece as spm
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_fixtures as gf  # noqa: E402  (the shared corpus)

SPECIALS = ["<unk>", "<s>", "</s>"]


def train_model():
    rng = random.Random(11)
    extra = [
        "Le café coûte 3,50 € à Paris; naïve façade, jalapeño, smörgåsbord, Øresund, ﬁnancial.",
        "東京は日本の首都です。北京是中国的首都。서울은 한국의 수도입니다。",
        "Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000 2024 3.14159 -42 1e10 0xFF",
        "Emoji: 😀 😃 😄 👍 🏽 🇫🇷 ❤️ 🤖 and symbols ♥ ☺ ★ → ← ∑ ∫ √",
        "Whitespace    runs\tand\ttabs\n\nand  double  spaces   everywhere",
        "def main():\n    print('hello world')  # comment\n    return 0",
    ]
    text = " ".join(gf.FIXED) + " " + " ".join(extra * 3) + " " + " ".join(gf.random_texts(rng, 300))
    lines = [text[i:i + 180].replace("\n", " ") for i in range(0, len(text), 180)]
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=buf, model_type="bpe", vocab_size=800,
        byte_fallback=True, character_coverage=0.995, normalization_rule_name="identity",
        add_dummy_prefix=True, remove_extra_whitespaces=False, split_digits=True,
        allow_whitespace_only_pieces=True, unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
        num_threads=1, minloglevel=2)
    return buf.getvalue()


def merges_of(pieces):
    """transformers' generate_merges with the scores: (piece, score) in id order."""
    vocab = {}
    for i, (p, _) in enumerate(pieces):
        vocab.setdefault(p, i)
    scores = dict(pieces)
    merges = []
    for merge, score in scores.items():
        local = []
        for k in range(1, len(merge)):
            left, right = merge[:k], merge[k:]
            if left in vocab and right in vocab:
                local.append((left, right, score))
        local.sort(key=lambda x: (vocab[x[0]], vocab[x[1]]))
        merges.extend(local)
    merges.sort(key=lambda v: (v[2], len(v[0]), len(v[1])), reverse=True)
    return [(a, b) for a, b, _ in merges]


def hf_tokenizer(sp, form):
    pieces = [(sp.id_to_piece(i), sp.get_score(i)) for i in range(sp.get_piece_size())]
    pieces[:3] = [(p, 0.0) for p, _ in pieces[:3]]  # as LlamaConverter.vocab
    vocab = {p: i for i, (p, _) in enumerate(pieces)}
    tok = Tokenizer(models.BPE(vocab, merges_of(pieces), unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.add_special_tokens([AddedToken(s, normalized=False, special=True) for s in SPECIALS])
    strip = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                               decoders.Strip(content=" ", left=1)])
    if form == "legacy":
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
        tok.decoder = strip
    elif form == "noprefix":  # add_dummy_prefix false: no "\u2581" added, none stripped
        tok.normalizer = normalizers.Sequence([normalizers.Replace(" ", "\u2581")])
        tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    elif form == "first":
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
        tok.decoder = strip
    else:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
        tok.decoder = decoders.Sequence([decoders.ByteFallback(),
                                         decoders.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return tok


def sp_vocab(sp):
    """tokens, scores and token types as llama.cpp's _set_vocab_sentencepiece writes them."""
    tokens, scores, types = [], [], []
    for i in range(sp.get_piece_size()):
        tokens.append(sp.id_to_piece(i).encode())
        scores.append(sp.get_score(i))
        t = 1
        if sp.is_unknown(i):
            t = 2
        elif sp.is_control(i):
            t = 3
        elif sp.is_unused(i):
            t = 5
        elif sp.is_byte(i):
            t = 6
        types.append(t)
    return tokens, scores, types


def make_gguf(path, tokens, scores, types, bos=1, eos=2, unk=0, add_bos=True, add_eos=False, space_prefix=None):
    """A llama GGUF with the given SentencePiece vocabulary and a complete one-layer model of zeros
    (modelpkg checks every tensor against the config before it packs)."""
    import gguf
    import numpy as np
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(1)
    w.add_context_length(256)
    w.add_embedding_length(8)
    w.add_feed_forward_length(16)
    w.add_head_count(2)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(bos)
    w.add_eos_token_id(eos)
    w.add_unk_token_id(unk)
    w.add_add_bos_token(add_bos)
    w.add_add_eos_token(add_eos)
    if space_prefix is not None:
        w.add_add_space_prefix(space_prefix)
    w.add_tensor("token_embd.weight", np.zeros((len(tokens), 8), dtype=np.float32))
    w.add_tensor("output_norm.weight", np.ones(8, dtype=np.float32))
    shapes = {"attn_norm": (8,), "ffn_norm": (8,), "attn_q": (8, 8), "attn_k": (8, 8), "attn_v": (8, 8),
              "attn_output": (8, 8), "ffn_gate": (16, 8), "ffn_up": (16, 8), "ffn_down": (8, 16)}
    for name, shape in shapes.items():
        w.add_tensor(f"blk.0.{name}.weight", np.zeros(shape, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def texts():
    """gen_fixtures' corpus, random word salads (with the special tokens' texts, metaspace characters
    and byte-token spellings in the input) and more random code points."""
    out = list(gf.corpus())
    rng = random.Random(5)
    words = ["hello", "world", " ", "  ", "   ", "\t", "\n", "café", "naïve", "Øresund", "日本", "中文", "한국",
             "😀", "👍🏽", "123", "4567", "3.14", "the", "The", "THE", "don't", ",", ".", "!", "\u00a0", "\u3000",
             "<s>", "</s>", "<unk>", "\u2581", "\u2581\u2581x", "<0x41>", "a\u2581b", "<", ">", "0x"]
    for _ in range(1000):
        out.append("".join(rng.choice(words) for _ in range(rng.randint(1, 12))).encode())
    out += [t.encode() for t in gf.random_codepoints(rng, 300)]
    return out


def py_decode(tok_json_pieces, ids, skip, specials, first_rule):
    """Reference decode: pieces with the metaspace as a space, <0xXX> as bytes, the leading space
    dropped as the decoder does, invalid UTF-8 replaced by maximal subparts."""
    out = b""
    first = True
    strip = 1
    for i in ids:
        if skip and i in specials:
            continue
        p = tok_json_pieces[i]
        is_byte = len(p) == 6 and p.startswith("<0x") and p.endswith(">")
        b = bytes([int(p[3:5], 16)]) if is_byte else p.replace("\u2581", " ").encode()
        if first_rule == "metaspace":
            if first and not is_byte:
                b = b.lstrip(b" ")
            first = False
        elif first_rule == "strip":
            while strip and b.startswith(b" "):
                b = b[1:]
                strip -= 1
            if b:
                strip = 0
        out += b
    return out.decode("utf-8", errors="replace")


def expectations(tok, name, out_dir, sp=None, spm_ids=False, rule="strip", tok_path=None):
    path = tok_path or os.path.join(out_dir, name + ".json")
    if tok_path is None:
        tok.save(path)
    j = json.load(open(path, encoding="utf-8"))
    specials = {a["id"] for a in j["added_tokens"] if a["special"]}
    pieces = {v: k for k, v in j["model"]["vocab"].items()}
    for a in j["added_tokens"]:
        pieces[a["id"]] = a["content"]
        if a["normalized"] and j["normalizer"]:  # decoded from the normalized content (legacy form)
            pieces[a["id"]] = "\u2581" + a["content"].replace(" ", "\u2581")
    enc, diff_sp, n_sp, n_rt = [], 0, 0, 0
    for raw in texts():
        text = raw.decode("utf-8", errors="replace")
        valid = True
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            valid = False
        for add in (False, True):
            ids = tok.encode(text, add_special_tokens=add).ids
            sp_ok = sp is not None and not add and not any(s in text for s in SPECIALS)
            if sp_ok:
                n_sp += 1
                sids = sp.encode(text)
                if sids != ids:
                    diff_sp += 1
                    if diff_sp <= 3:
                        print(f"{name}: sentencepiece differs for {text!r}: {sids} vs {ids}", file=sys.stderr)
                if spm_ids:
                    ids = sids
            elif spm_ids:
                continue
            roundtrip = (valid and not add and tok.decode(ids, skip_special_tokens=False) == text
                         and not any(s in text for s in SPECIALS))
            if sp_ok and valid:
                # where sentencepiece round-trips, Hugging Face does too (and servd must)
                sp_rt = sp.decode(sp.encode(text)) == text
                assert roundtrip or not sp_rt, (name, text)
            n_rt += roundtrip
            enc.append({"text_hex": raw.hex(), "add_special": add, "roundtrip": roundtrip, "ids": ids})
    rng = random.Random(99)
    n = tok.get_vocab_size(with_added_tokens=True)
    dec, deviations = [], 0
    for _ in range(600):
        k = rng.randint(0, 12)
        # byte tokens often, so that runs of them (valid and not) are common
        ids = [rng.randrange(3, 3 + 256) if rng.random() < 0.4 else rng.randrange(n) for _ in range(k)]
        for skip in (False, True):
            hf = tok.decode(ids, skip_special_tokens=skip)
            ref = py_decode(pieces, ids, skip, specials, rule)
            if hf != ref:
                assert "\ufffd" in hf, (name, ids, hf, ref)  # only invalid byte runs may differ
                deviations += 1
            dec.append({"ids": ids, "skip_special": skip, "text_hex": ref.encode("utf-8").hex()})
    print(f"{name}: {len(enc)} encode cases ({n_rt} round trips), sentencepiece compared on {n_sp} ({diff_sp} differ); "
          f"{len(dec)} decode cases, {deviations} with invalid byte runs (U+FFFD rule)", file=sys.stderr)
    with open(os.path.join(out_dir, name + ".expect.json"), "w") as f:
        json.dump({"tokenizer": os.path.basename(path), "vocab_size": n, "encode": enc, "decode": dec}, f)
    return diff_sp


def llama_cpp_vocab(vocab_gguf, name, out_dir, modelpkg):
    """A real SentencePiece vocabulary from llama.cpp's test vocabularies (Llama 2, Phi-3): the GGUF's
    tokenizer rewritten as a llama GGUF, imported by modelpkg; expected ids from llama.cpp's recorded
    .inp/.out cases (made with transformers) and, for the common corpus, from Hugging Face tokenizers
    on modelpkg's tokenizer.json (which must agree with the recorded cases)."""
    import gguf
    r = gguf.GGUFReader(vocab_gguf)

    def arr(key):
        f = r.fields[key]
        return [f.parts[i] for i in f.data]

    def scalar(key, default):
        f = r.fields.get(key)
        return default if f is None else f.parts[f.data[0]][0].item()

    tokens = [bytes(p) for p in arr("tokenizer.ggml.tokens")]
    scores = [float(p[0]) for p in arr("tokenizer.ggml.scores")]
    types = [int(p[0]) for p in arr("tokenizer.ggml.token_type")]
    gg = os.path.join(out_dir, name + ".gguf")
    make_gguf(gg, tokens, scores, types, scalar("tokenizer.ggml.bos_token_id", 1), scalar("tokenizer.ggml.eos_token_id", 2),
              scalar("tokenizer.ggml.unknown_token_id", 0), bool(scalar("tokenizer.ggml.add_bos_token", True)),
              bool(scalar("tokenizer.ggml.add_eos_token", False)))
    pkg = os.path.join(out_dir, name + ".mpk")
    subprocess.check_call([modelpkg, "pack", gg, "-o", pkg, "--quiet"])
    path = os.path.join(out_dir, name + ".json")
    with zipfile.ZipFile(pkg) as z, open(path, "wb") as f:
        f.write(z.read("tokenizer.json"))
    os.remove(gg)
    os.remove(pkg)
    tok = Tokenizer.from_file(path)
    inp = open(vocab_gguf + ".inp", encoding="utf-8").read().split("\n__ggml_vocab_test__\n")
    outs = open(vocab_gguf + ".out", encoding="utf-8").read().split("\n")
    recorded = []
    for text, ids in zip(inp, outs):
        want = [int(x) for x in ids.split()]
        assert tok.encode(text, add_special_tokens=False).ids == want, (name, text)
        recorded.append({"text_hex": text.encode().hex(), "add_special": False, "roundtrip": False, "ids": want})
    expectations(tok, name, out_dir, tok_path=path)
    exp_path = os.path.join(out_dir, name + ".expect.json")
    exp = json.load(open(exp_path))
    exp["encode"] = recorded + exp["encode"]
    with open(exp_path, "w") as f:
        json.dump(exp, f)
    print(f"{name}: {len(recorded)} recorded llama.cpp cases agree with Hugging Face", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--modelpkg")
    ap.add_argument("--llama-cpp-vocab", nargs=2, metavar=("GGUF", "NAME"), action="append", default=[],
                    help="a llama.cpp test vocabulary (with .inp/.out next to it): only this fixture")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    if a.llama_cpp_vocab:
        for gg, name in a.llama_cpp_vocab:
            llama_cpp_vocab(gg, name, a.out, a.modelpkg)
        return 0
    model = train_model()
    sp = spm.SentencePieceProcessor(model_proto=model)
    legacy = hf_tokenizer(sp, "legacy")
    bad = expectations(legacy, "spm-legacy", a.out, sp=sp)
    expectations(legacy, "spm-ref", a.out, sp=sp, spm_ids=True, tok_path=os.path.join(a.out, "spm-legacy.json"))
    expectations(hf_tokenizer(sp, "first"), "spm-first", a.out)
    added = hf_tokenizer(sp, "legacy")
    # added tokens matched before the normalizer ("world", with lstrip/rstrip) and after it ("hello",
    # and "\u2581the", which only the normalized text contains)
    added.add_tokens([AddedToken("hello", normalized=True, special=False),
                      AddedToken("\u2581the", normalized=True, special=False),
                      AddedToken("world", normalized=False, special=False, lstrip=True, rstrip=True)])
    expectations(added, "spm-added", a.out)
    expectations(hf_tokenizer(sp, "split"), "spm-split", a.out, rule="metaspace")
    if a.modelpkg:
        gg = os.path.join(a.out, "spm.gguf")
        make_gguf(gg, *sp_vocab(sp))
        pkg = os.path.join(a.out, "spm.mpk")
        subprocess.check_call([a.modelpkg, "pack", gg, "-o", pkg])
        with zipfile.ZipFile(pkg) as z:
            data = z.read("tokenizer.json")
        path = os.path.join(a.out, "spm-gguf.json")
        with open(path, "wb") as f:
            f.write(data)
        # modelpkg's tokenizer.json must be a valid Hugging Face file giving the same ids
        imported = Tokenizer.from_file(path)
        expectations(legacy, "spm-gguf", a.out, tok_path=path)
        for raw in texts():
            t = raw.decode("utf-8", errors="replace")
            assert imported.encode(t).ids == legacy.encode(t).ids, t
        # tokenizer.ggml.add_space_prefix false (sentencepiece's add_dummy_prefix off)
        make_gguf(gg, *sp_vocab(sp), add_bos=False, space_prefix=False)
        subprocess.check_call([a.modelpkg, "pack", gg, "-o", pkg, "--quiet"])
        path = os.path.join(a.out, "spm-gguf-noprefix.json")
        with zipfile.ZipFile(pkg) as z, open(path, "wb") as f:
            f.write(z.read("tokenizer.json"))
        noprefix = hf_tokenizer(sp, "noprefix")
        noprefix.post_processor = None
        expectations(noprefix, "spm-gguf-noprefix", a.out, tok_path=path, rule="none")
    return 0 if bad == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
