"""Cross-encoders (BertForSequenceClassification) served at /v1/rerank, /rerank and /v1/score, against
a float64 numpy forward of the same weights (tests/bert/bert_ref.py, written from transformers'
modeling_bert) with Hugging Face `tokenizers`' ids and token type ids of the same tokenizer.json:

- a tiny random cross-encoder (always available): scores after the package's activation (sigmoid by
  default, Identity from sentence-transformers' activation_fn) within 1e-4 of the reference, for
  pairs of mixed lengths in one request; the token types reach the forward (every score is the
  typed reference's, and far from what the same ids give with type 0 throughout);
- rerank: results sorted by score, top_n, return_documents, {text} documents; the cohere client
  when installed, else requests shaped as vLLM's clients send them;
- score: 1:1, 1:N and N:N pairing as vLLM's;
- truncate_prompt_tokens (k and -1): LongestFirst truncation as Hugging Face truncates pairs; an
  over-long pair without it is a 400 naming the document;
- bad input (missing or wrong fields, empty query or list, too many documents, a mismatched
  pairing, an embedding model, a decoder, a two-label model, /v1/embeddings on a cross-encoder):
  a 400 naming the field, and the server still serves.
"""
import json
import math
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "bert"))
from servd_harness import Servd, check, fail, parse_args, skip, tiny_llama  # noqa: E402

try:
    import numpy as np
    from tokenizers import Tokenizer
except ImportError as e:
    skip(f"needs numpy and tokenizers (.venv-test; scripts/install-deps.sh): {e}")
import bert_ref  # noqa: E402
import tiny_bert as tiny  # noqa: E402

a = parse_args()
if not a.modelpkg or not os.access(a.modelpkg, os.X_OK):
    skip("modelpkg was not built")

TOL = 1e-4
MOST = tiny.POS - 1  # the engine keeps one position of the context


def pack(src, name):
    out = os.path.join(a.work, f"{name}.mpk")
    r = subprocess.run([a.modelpkg, "pack", src, "-o", out, "--name", name, "--quiet"], capture_output=True, text=True)
    if r.returncode != 0:
        fail(f"modelpkg pack {name}: {r.stderr}")
    return out


def cross_encoder(name, seed, labels=1, config=None):
    d = os.path.join(a.work, name)
    shutil.rmtree(d, ignore_errors=True)
    t = tiny.bert_tensors(np.random.default_rng(seed), "bert.", labels=labels)
    # weights of std 1 saturate the pooler's tanh (every pair near one score) and the sigmoid: scaled
    t["bert.pooler.dense.weight"] *= np.float32(0.25)
    t["classifier.weight"] *= np.float32(0.5)
    t["classifier.bias"] *= np.float32(0.1)
    tiny.make_folder(d, t, ["BertForSequenceClassification"], config, st_files=False)
    return d


def sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x))


class Ref:
    def __init__(self, folder, activation):
        self.ref = bert_ref.BertRef(folder)
        self.tok = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
        self.tok.no_padding()
        self.act = activation

    def encode(self, q, d, max_len=None):
        if max_len:
            self.tok.enable_truncation(max_len, strategy="longest_first")
        else:
            self.tok.no_truncation()
        e = self.tok.encode(q, d)
        return e.ids, e.type_ids

    def score(self, q, d, max_len=None):
        ids, types = self.encode(q, d, max_len)
        return self.act(float(self.ref.score(ids, types)[0])), ids, types

    def untyped(self, q, d):
        ids, _ = self.encode(q, d)
        return self.act(float(self.ref.score(ids, [0] * len(ids))[0]))


def words(rng, lo, hi):
    pool = ["ab", "cd", "efg", "hi", "jk", "lmn", "op", "qr", "st", "uv", "wx", "yz", "a", "bcd", "fig", "hag"]
    return " ".join(rng.choice(pool) for _ in range(rng.integers(lo, hi + 1)))


def post(s, path, body):
    st, _, raw = s.request("POST", path, json.dumps(body).encode(), {"content-type": "application/json"})
    try:
        return st, json.loads(raw)
    except ValueError:
        fail(f"{path}: {st} not JSON: {raw[:200]!r}")


def ok(s, path, body):
    st, j = post(s, path, body)
    check(st == 200, f"{path} {str(body)[:120]}: {st} {j}")
    return j


def check_rerank(j, ref, query, docs, model, top_n=0, with_docs=True, label=""):
    check(j["model"] == model and j["id"].startswith("rerank-"), f"{label}: head {j}")
    want = [ref.score(query, d)[0] for d in docs]
    res = j["results"]
    check(len(res) == (top_n if 0 < top_n < len(docs) else len(docs)), f"{label}: {len(res)} results")
    got = [r["relevance_score"] for r in res]
    check(got == sorted(got, reverse=True), f"{label}: results not sorted by score: {got}")
    order = sorted(range(len(docs)), key=lambda i: (-want[i], i))
    check({r["index"] for r in res} == set(order[:len(res)]) or len(res) == len(docs) or
          abs(want[order[len(res) - 1]] - want[order[len(res)]]) < TOL, f"{label}: top {len(res)} {res}")
    # the reference's order, where its scores are apart by more than the tolerance (near-ties may swap)
    for x, y in zip(res, res[1:]):
        check(want[x["index"]] > want[y["index"]] - TOL, f"{label}: {x} before {y}: reference {want}")
    for r in res:
        i = r["index"]
        check(abs(r["relevance_score"] - want[i]) < TOL, f"{label}: doc {i}: {r['relevance_score']} != {want[i]}")
        if with_docs:
            check(r["document"] == {"text": docs[i]}, f"{label}: doc {i}: {r.get('document')}")
        else:
            check("document" not in r, f"{label}: return_documents false but {r}")
    tokens = sum(len(ref.encode(query, d)[0]) for d in docs)
    check(j["usage"]["total_tokens"] == tokens, f"{label}: usage {j['usage']} != {tokens}")


def main():  # noqa: C901
    rng = np.random.default_rng(5)
    ce = cross_encoder("tiny-ce", 11)
    ident = cross_encoder("tiny-ce-id", 12, config={
        "sentence_transformers": {"activation_fn": "torch.nn.modules.linear.Identity"}})
    two = cross_encoder("tiny-ce-2", 13, labels=2)
    emb = os.path.join(a.work, "tiny-emb")
    shutil.rmtree(emb, ignore_errors=True)
    tiny.make_folder(emb, tiny.bert_tensors(np.random.default_rng(7)), ["BertModel"])
    args = []
    for name, folder in (("ce", ce), ("ce-id", ident), ("ce2", two), ("emb", emb)):
        args += ["--model", f"{pack(folder, name)}:{name}"]
    args += ["--model", f"{tiny_llama(a)}:llm"]
    s = Servd(a, args)
    ref = Ref(ce, sigmoid)
    ref_id = Ref(ident, lambda x: x)

    # mixed lengths in one request, through both rerank paths; token types proven by the margin
    query = "ab cd efg"
    docs = [words(rng, 0 if i == 0 else 1, 8) for i in range(24)]
    docs = [d for d in docs if len(ref.encode(query, d)[0]) <= MOST]
    check(len(docs) >= 16, f"only {len(docs)} documents fit")
    for path in ("/v1/rerank", "/rerank"):
        check_rerank(ok(s, path, {"model": "ce", "query": query, "documents": docs}), ref, query, docs, "ce",
                     label=path)
    # raw logits (the Identity model, whose scores are checked below): type 1 for the second text moves
    # them well past the tolerance, so matching the typed reference proves the types reached the model
    apart = [abs(ref_id.score(query, d)[0] - ref_id.untyped(query, d)) for d in docs]
    check(sum(x > 20 * TOL for x in apart) >= 0.8 * len(docs), f"token types barely change the reference: {apart}")
    # one document at a time gives the same numbers (a row's result does not depend on its batch)
    for d in docs[:4]:
        j = ok(s, "/v1/rerank", {"model": "ce", "query": query, "documents": [d]})
        check(abs(j["results"][0]["relevance_score"] - ref.score(query, d)[0]) < TOL, f"alone: {d!r}")
    # B changes the answer: one query, documents that differ only in their words
    j = ok(s, "/v1/rerank", {"model": "ce", "query": "hi jk", "documents": ["ab", "yz", "ab yz", "yz ab"]})
    scores = {r["index"]: r["relevance_score"] for r in j["results"]}
    check(len({round(v, 6) for v in scores.values()}) == 4, f"documents do not change the scores: {scores}")
    check_rerank(j, ref, "hi jk", ["ab", "yz", "ab yz", "yz ab"], "ce", label="B texts")
    # top_n, return_documents, {text} documents
    check_rerank(ok(s, "/v1/rerank", {"model": "ce", "query": query, "documents": docs, "top_n": 3}), ref, query,
                 docs, "ce", top_n=3, label="top_n 3")
    check_rerank(ok(s, "/v1/rerank", {"model": "ce", "query": query, "documents": docs[:5], "top_n": 50,
                                      "return_documents": False}), ref, query, docs[:5], "ce", with_docs=False,
                 label="return_documents false")
    check_rerank(ok(s, "/v1/rerank", {"model": "ce", "query": query, "documents": [{"text": d} for d in docs[:6]]}),
                 ref, query, docs[:6], "ce", label="{text} documents")
    # Identity from the config: raw logits
    check_rerank(ok(s, "/v1/rerank", {"model": "ce-id", "query": query, "documents": docs}), ref_id, query, docs,
                 "ce-id", label="identity")
    print(f"rerank: {len(docs)} documents of mixed lengths within {TOL} of float64 (sigmoid and identity)")

    # /v1/score: 1:1, 1:N, N:N
    j = ok(s, "/v1/score", {"model": "ce", "text_1": query, "text_2": docs[0]})
    check(j["object"] == "list" and j["id"].startswith("score-") and j["model"] == "ce" and "created" in j, str(j))
    check(j["data"][0]["object"] == "score" and j["data"][0]["index"] == 0, str(j))
    check(abs(j["data"][0]["score"] - ref.score(query, docs[0])[0]) < TOL, f"score 1:1 {j}")
    j = ok(s, "/v1/score", {"model": "ce", "text_1": [query], "text_2": docs[:7]})
    check([d["index"] for d in j["data"]] == list(range(7)), f"1:N indices {j}")
    for d, t in zip(j["data"], docs[:7]):
        check(abs(d["score"] - ref.score(query, t)[0]) < TOL, f"score 1:N {d} for {t!r}")
    firsts = [words(rng, 1, 4) for _ in range(6)]
    j = ok(s, "/v1/score", {"model": "ce", "text_1": firsts, "text_2": docs[:6]})
    tokens = 0
    for d, q, t in zip(j["data"], firsts, docs[:6]):
        want, ids, _ = ref.score(q, t)
        tokens += len(ids)
        check(abs(d["score"] - want) < TOL, f"score N:N {d} for {q!r}, {t!r}")
    check(j["usage"]["prompt_tokens"] == tokens and j["usage"]["total_tokens"] == tokens, f"usage {j['usage']}")
    print("score: 1:1, 1:N and N:N within tolerance")

    # truncation: LongestFirst as Hugging Face's, k and -1; without it a 400 naming the document
    long_doc = " ".join(["abcdefg hijklmn"] * 6)
    check(len(ref.encode(query, long_doc)[0]) > MOST, "the long document is not long")
    st, j = post(s, "/v1/rerank", {"model": "ce", "query": query, "documents": [docs[0], long_doc]})
    check(st == 400 and j["error"]["param"] == "documents[1]" and "truncate_prompt_tokens" in j["error"]["message"],
          f"over-long pair: {st} {j}")
    for k, n in ((12, 12), (-1, MOST)):
        j = ok(s, "/v1/rerank", {"model": "ce", "query": query, "documents": [long_doc],
                                 "truncate_prompt_tokens": k})
        want, ids, _ = ref.score(query, long_doc, n)
        check(len(ids) == n, f"reference truncation: {len(ids)}")
        check(abs(j["results"][0]["relevance_score"] - want) < TOL and j["usage"]["total_tokens"] == n,
              f"truncate_prompt_tokens {k}: {j}")
        j = ok(s, "/v1/score", {"model": "ce", "text_1": long_doc, "text_2": query, "truncate_prompt_tokens": k})
        check(abs(j["data"][0]["score"] - ref.score(long_doc, query, n)[0]) < TOL, f"score truncate {k}: {j}")
    print("truncate_prompt_tokens: ok")

    # Cohere's clients when installed (v1 posts to /v1/rerank, v2 to /v2/rerank); else requests as
    # vLLM's clients send them (urllib)
    want = sorted(((ref.score(query, d)[0], -i) for i, d in enumerate(docs[:5])), reverse=True)[:2]
    try:
        import cohere
        for client, label in ((cohere.Client(api_key="none", base_url=s.url), "cohere v1"),
                              (cohere.ClientV2(api_key="none", base_url=s.url), "cohere v2")):
            r = client.rerank(model="ce", query=query, documents=docs[:5], top_n=2)
            check([x.index for x in r.results] == [-i for _, i in want], f"{label}: {r.results}")
            check(all(abs(x.relevance_score - w) < TOL for x, (w, _) in zip(r.results, want)), f"{label}: {r}")
        print("cohere clients (v1, v2): ok")
    except ImportError:
        print("cohere client not installed (scripts/install-deps.sh): urllib only")
    import urllib.request
    req = urllib.request.Request(s.url + "/v1/rerank", json.dumps(
        {"model": "ce", "query": query, "documents": docs[:5], "top_n": 2}).encode(),
        {"Content-Type": "application/json", "User-Agent": "python-requests/2.32"})
    check_rerank(json.loads(urllib.request.urlopen(req, timeout=30).read()), ref, query, docs[:5], "ce", top_n=2,
                 label="urllib")

    # bad input: a 400 naming the field
    many = ["ab"] * 513
    for path, body, param, what in [
        ("/v1/rerank", {"model": "ce", "documents": ["ab"]}, "query", "required"),
        ("/v1/rerank", {"model": "ce", "query": "", "documents": ["ab"]}, "query", "empty"),
        ("/v1/rerank", {"model": "ce", "query": ["ab"], "documents": ["ab"]}, "query", "string"),
        ("/v1/rerank", {"model": "ce", "query": "ab"}, "documents", "required"),
        ("/v1/rerank", {"model": "ce", "query": "ab", "documents": []}, "documents", "empty"),
        ("/v1/rerank", {"model": "ce", "query": "ab", "documents": "ab"}, "documents", "list"),
        ("/v1/rerank", {"model": "ce", "query": "ab", "documents": ["ab", 5]}, "documents[1]", "string"),
        ("/v1/rerank", {"model": "ce", "query": "ab", "documents": [{"txt": "ab"}]}, "documents[0]", "string"),
        ("/v1/rerank", {"model": "ce", "query": "ab", "documents": many}, "documents", "at most 512"),
        ("/v1/rerank", {"model": "ce", "query": "ab", "documents": ["ab"], "top_n": -1}, "top_n", "integer"),
        ("/v1/rerank", {"model": "ce", "query": "ab", "documents": ["ab"], "top_n": "2"}, "top_n", "integer"),
        ("/v1/rerank", {"model": "ce", "query": "ab", "documents": ["ab"], "return_documents": "yes"},
         "return_documents", "true or false"),
        ("/v1/rerank", {"model": "ce", "query": "ab", "documents": ["ab"], "truncate_prompt_tokens": 0},
         "truncate_prompt_tokens", "-1 or at least 1"),
        ("/v1/rerank", {"model": "emb", "query": "ab", "documents": ["ab"]}, "model", "not a cross-encoder"),
        ("/v1/rerank", {"model": "llm", "query": "ab", "documents": ["ab"]}, "model", "not a cross-encoder"),
        ("/v1/rerank", {"model": "ce2", "query": "ab", "documents": ["ab"]}, "model", "2 labels"),
        ("/v1/score", {"model": "ce", "text_2": "ab"}, "text_1", "required"),
        ("/v1/score", {"model": "ce", "text_1": "ab", "text_2": []}, "text_2", "empty"),
        ("/v1/score", {"model": "ce", "text_1": ["ab", "cd", "ef"], "text_2": ["ab", "cd"]}, "text_2", "1:N"),
        ("/v1/score", {"model": "ce", "text_1": [1], "text_2": "ab"}, "text_1[0]", "string"),
        ("/v1/score", {"model": "ce", "text_1": "ab", "text_2": {"a": 1}}, "text_2", "list"),
        ("/v1/score", {"model": "ce", "text_1": "", "text_2": "ab"}, "text_1", "empty"),
        ("/v1/embeddings", {"model": "ce", "input": "ab"}, "model", "cross-encoder"),
    ]:
        st, j = post(s, path, body)
        err = j.get("error", {}) if isinstance(j, dict) else {}
        check(st == 400 and err.get("param") == param and what in err.get("message", ""),
              f"bad input {path} {str(body)[:80]}: {st} {j}")
    st, j = post(s, "/v1/rerank", {"model": "nope", "query": "ab", "documents": ["ab"]})
    check(st == 404, f"unknown model: {st} {j}")
    st, _, raw = s.request("POST", "/v1/rerank", b"{not json", {"content-type": "application/json"})
    check(st == 400, f"bad JSON: {st} {raw[:200]}")
    check_rerank(ok(s, "/v1/rerank", {"model": "ce", "query": query, "documents": docs[:3]}), ref, query, docs[:3],
                 "ce", label="after the bad inputs")
    print("bad input: 400s naming the field; still serving")
    s.stop()
    print("ok")


main()
