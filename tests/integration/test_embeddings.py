"""POST /v1/embeddings and completions echo with prompt logprobs, against a running servd, with the
official `openai` client, compared to an independent float64 numpy forward of the same tiny
random-weight Llama (tests/llama/llama_ref.py).

- embeddings: shapes, unit norm, the reference's pooled final-norm hidden state (last token by
  default; mean pooling and truncation to `dimensions` from a package whose config says so, and
  from a sentence-transformers 1_Pooling/config.json), equal vectors for an input alone, in batches
  of other lengths and beside generation, base64 equal to float, token-id inputs;
- echo: the prompt's logprobs (first null) equal log_softmax of the reference's logits, also for a
  prompt whose blocks are in the prefix cache; lm-eval-harness' loglikelihood request (echo,
  max_tokens 0, logprobs 1) sums to the reference; streaming with echo sends the prompt first;
- bad input: a 400 naming the field.
"""
import base64
import json
import os
import shutil
import subprocess
import sys
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "llama"))
from servd_harness import Servd, check, example_package, fail, parse_args, skip  # noqa: E402

try:
    import numpy as np
    import openai
except ImportError as e:
    skip(f"needs numpy and the openai client (.venv-test; scripts/install-deps.sh): {e}")
import llama_ref  # noqa: E402

a = parse_args()
if not a.modelpkg or not os.access(a.modelpkg, os.X_OK):
    skip("modelpkg was not built")

# One tiny Llama as a Hugging Face folder, packed three ways: as it is (last-token pooling), with
# config pooling "mean" and matryoshka_dimensions, and with a sentence-transformers 1_Pooling folder.
hf = os.path.join(a.work, "emb-hf")
shutil.rmtree(hf, ignore_errors=True)
r = subprocess.run([sys.executable, os.path.join(HERE, "..", "llama", "make_tiny.py"), hf, "--seed", "11"],
                   capture_output=True, text=True)
if r.returncode != 0:
    fail(f"make_tiny.py: {r.stderr}")


def pack(src, name):
    out = os.path.join(a.work, f"{name}.mpk")
    r = subprocess.run([a.modelpkg, "pack", src, "-o", out, "--name", name, "--quiet"], capture_output=True, text=True)
    if r.returncode != 0:
        fail(f"modelpkg pack {name}: {r.stderr}")
    return out


def variant(name, edit):
    d = os.path.join(a.work, f"emb-hf-{name}")
    shutil.rmtree(d, ignore_errors=True)
    shutil.copytree(hf, d)
    edit(d)
    return d


def mean_config(d):
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    cfg.update(pooling="mean", matryoshka_dimensions=[64, 32, 16])
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)


def cls_config(d):
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    cfg.update(pooling="cls")
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)


def st_pooling(d):
    os.makedirs(os.path.join(d, "1_Pooling"))
    with open(os.path.join(d, "1_Pooling", "config.json"), "w") as f:
        json.dump({"word_embedding_dimension": 64, "pooling_mode_cls_token": False,
                   "pooling_mode_mean_tokens": True, "pooling_mode_lasttoken": False}, f)


pkg_last = pack(hf, "emb-last")
pkg_mean = pack(variant("mean", mean_config), "emb-mean")
pkg_st = pack(variant("st", st_pooling), "emb-st")
pkg_cls = pack(variant("cls", cls_config), "emb-cls")


def two_modes(d):
    st_pooling(d)
    with open(os.path.join(d, "1_Pooling", "config.json"), "w") as f:
        json.dump({"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": True}, f)


r = subprocess.run([a.modelpkg, "pack", variant("two", two_modes), "-o", os.path.join(a.work, "two.mpk"), "--quiet"],
                   capture_output=True, text=True)
check(r.returncode != 0 and "more than one pooling mode" in r.stderr and "1_Pooling/config.json" in r.stderr,
      f"modelpkg pack of a folder whose 1_Pooling sets two modes: {r.returncode} {r.stderr!r}")
generic = example_package(a, "mlp_classifier")

cfg, w = llama_ref.load_folder(hf)
dim = cfg["hidden_size"]
# The final-norm hidden states: the reference's forward through an identity output head.
w_hidden = dict(w)
w_hidden["lm_head.weight"] = np.eye(dim)
cfg_hidden = dict(cfg, tie_word_embeddings=False)


def ref_hidden(ids):
    return llama_ref.forward(cfg_hidden, w_hidden, ids)


def ref_logprobs(ids):
    lg = llama_ref.forward(cfg, w, ids)
    m = lg.max(axis=-1, keepdims=True)
    return lg - m - np.log(np.exp(lg - m).sum(axis=-1, keepdims=True))


# The server keeps K/V in f16 (its default): logprobs move by ~2e-3 from the float64 forward, the
# normalized hidden states far less.
LP_TOL = 5e-3


def unit(v):
    return v / np.linalg.norm(v)


def close(got, want, tol, what):
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    check(got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}")
    err = float(np.max(np.abs(got - want))) if got.size else 0.0
    check(err <= tol, f"{what}: max |error| {err:.3g} > {tol}")


models = ["--model", pkg_last, "--model", pkg_mean, "--model", pkg_st, "--model", pkg_cls]
srv = Servd(a, models + ["--model", generic + ":mlp_classifier"])
client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
try:
    def ids_of(text):
        st, _, body = srv.request("POST", "/tokenize", {"model": "emb-last", "prompt": text})
        check(st == 200, f"/tokenize: {st} {body!r}")
        return json.loads(body)["tokens"]

    texts = ["The quick brown fox", "jumps", "over the lazy dog, again and again and again"]
    ids = [ids_of(t) for t in texts]

    # ---- shapes, norm, the reference ---------------------------------------------------------------
    res = client.embeddings.create(model="emb-last", input=texts)  # the client asks for base64
    check(res.object == "list" and res.model == "emb-last", f"response: {res.object} {res.model}")
    check([d.index for d in res.data] == [0, 1, 2], f"indices {[d.index for d in res.data]}")
    check(all(d.object == "embedding" and len(d.embedding) == dim for d in res.data), "data entries")
    check(res.usage.prompt_tokens == sum(map(len, ids)), f"usage.prompt_tokens {res.usage.prompt_tokens}")
    for t, i, d in zip(texts, ids, res.data):
        v = np.asarray(d.embedding)
        check(abs(np.linalg.norm(v) - 1) < 1e-5, f"{t!r}: norm {np.linalg.norm(v)}")
        close(v, unit(ref_hidden(i)[-1]), 2e-4, f"{t!r}: last-token embedding vs the float64 reference")

    # ---- base64 equals float; token ids equal text -------------------------------------------------
    flt = client.embeddings.create(model="emb-last", input=texts, encoding_format="float")
    b64 = client.embeddings.create(model="emb-last", input=texts, encoding_format="base64")
    for k in range(3):
        raw = np.frombuffer(base64.b64decode(b64.data[k].embedding), dtype="<f4")
        check(np.array_equal(raw, np.asarray(flt.data[k].embedding, dtype=np.float32)), f"base64 != float ({k})")
    one = client.embeddings.create(model="emb-last", input=ids[0], encoding_format="float")
    many = client.embeddings.create(model="emb-last", input=ids, encoding_format="float")
    check(one.data[0].embedding == flt.data[0].embedding, "token ids give another vector than their text")
    check([d.embedding for d in many.data] == [d.embedding for d in flt.data], "lists of token ids")

    # ---- the same input alone, in batches of other compositions, beside generation ------------------
    alone = np.asarray(client.embeddings.create(model="emb-last", input=texts[2],
                                                encoding_format="float").data[0].embedding)
    batches = [[texts[2], texts[0]], [texts[1], texts[2]] * 3, ["x" * 100, texts[2], "y"]]
    got = []

    def embed_into(inputs):
        r = client.embeddings.create(model="emb-last", input=inputs, encoding_format="float")
        got.append([np.asarray(d.embedding) for d, s in zip(r.data, inputs) if s == texts[2]])

    def generate():
        client.completions.create(model="emb-last", prompt="generation beside embeddings", max_tokens=24)

    threads = [threading.Thread(target=embed_into, args=(b,)) for b in batches] + \
        [threading.Thread(target=generate) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check(len(got) == len(batches), "a concurrent embeddings request failed")
    for vs in got:
        for v in vs:
            close(v, alone, 1e-5, "the same input in another batch")

    # ---- mean pooling, dimensions ----------------------------------------------------------------------
    for model in ("emb-mean", "emb-st"):
        r = client.embeddings.create(model=model, input=texts[:2], encoding_format="float")
        for i, d in zip(ids, r.data):
            close(d.embedding, unit(ref_hidden(i).mean(axis=0)), 2e-4, f"{model}: mean-pooled embedding")
    r = client.embeddings.create(model="emb-mean", input=texts[0], dimensions=16, encoding_format="float")
    close(r.data[0].embedding, unit(ref_hidden(ids[0]).mean(axis=0)[:16]), 2e-4, "dimensions 16")
    r = client.embeddings.create(model="emb-cls", input=texts, encoding_format="float")
    for i, d in zip(ids, r.data):
        close(d.embedding, unit(ref_hidden(i)[0]), 2e-4, "CLS-pooled embedding")

    # ---- prompts computed in chunks of 8 tokens over several steps: the same vectors ------------------
    chunked = Servd(a, models + ["--max-batch-tokens", "8"])
    try:
        c2 = openai.OpenAI(base_url=chunked.url + "/v1", api_key="unused", max_retries=0)
        pooled = {"emb-last": lambda h: h[-1], "emb-mean": lambda h: h.mean(axis=0), "emb-cls": lambda h: h[0]}
        for model, want in pooled.items():
            r = c2.embeddings.create(model=model, input=texts, encoding_format="float")
            for i, d in zip(ids, r.data):
                close(d.embedding, unit(want(ref_hidden(i))), 2e-4, f"{model}: embedding computed in chunks of 8")
        r = c2.completions.create(model="emb-last", prompt=texts[2], max_tokens=0, echo=True, logprobs=0)
        ref = ref_logprobs(ids[2])
        close(r.choices[0].logprobs.token_logprobs[1:], [ref[t - 1, ids[2][t]] for t in range(1, len(ids[2]))],
              LP_TOL, "prompt logprobs computed in chunks of 8 tokens")
    finally:
        chunked.stop()

    # ---- bad input ------------------------------------------------------------------------------------
    def bad(body, param, code=None, status=400):
        st, _, raw = srv.request("POST", "/v1/embeddings", body)
        err = json.loads(raw).get("error", {}) if raw else {}
        check(st == status and err.get("param") == param and (code is None or err.get("code") == code),
              f"{body!r}: expected {status} naming {param!r} ({code}), got {st} {raw[:300]!r}")

    bad({"model": "emb-last", "input": []}, "input")
    bad({"model": "emb-last", "input": ""}, "input")
    bad({"model": "emb-last"}, "input")
    bad({"model": "emb-last", "input": [[1, 2], [9999]]}, "input")
    bad({"model": "emb-last", "input": "z" * 400}, "input", "context_length_exceeded")
    bad({"model": "emb-last", "input": "a", "dimensions": 16}, "dimensions")
    bad({"model": "emb-mean", "input": "a", "dimensions": 65}, "dimensions")
    bad({"model": "emb-last", "input": "a", "encoding_format": "int8"}, "encoding_format")
    bad({"model": "mlp_classifier", "input": "a"}, "model")

    # ---- echo with prompt logprobs -------------------------------------------------------------------
    prompt = "A prompt that spans more than two blocks of sixteen tokens each, to be cached."
    pids = ids_of(prompt)
    ref = ref_logprobs(pids)
    want = [ref[t - 1, pids[t]] for t in range(1, len(pids))]
    client.completions.create(model="emb-last", prompt=prompt, max_tokens=2)  # its blocks are now cached
    for logprobs in (1, 5):
        r = client.completions.create(model="emb-last", prompt=prompt, max_tokens=0, echo=True, logprobs=logprobs)
        c = r.choices[0]
        check(c.text == prompt and r.usage.completion_tokens == 0, f"echo, max_tokens 0: {c.text!r}")
        lp = c.logprobs
        check(len(lp.tokens) == len(pids) and lp.token_logprobs[0] is None and lp.top_logprobs[0] is None,
              "echo logprobs: one entry per prompt token, the first null")
        close(lp.token_logprobs[1:], want, LP_TOL, f"prompt logprobs (logprobs={logprobs})")
        check("".join(lp.tokens) == prompt and lp.text_offset == [sum(map(len, lp.tokens[:k])) for k in
                                                                  range(len(pids))], "tokens and text_offset")
        for t in range(1, len(pids)):
            # Keyed by token text: byte tokens that decode alike ("\ufffd") share one entry, the last.
            top = sorted(lp.top_logprobs[t].values(), reverse=True)
            best = np.sort(ref[t - 1])[::-1][:logprobs]
            check(0 < len(top) <= logprobs, f"top_logprobs at {t}: {len(top)} entries")
            check(all(np.min(np.abs(best - v)) <= LP_TOL for v in top), f"top_logprobs at {t}: {top} vs {best}")

    # lm-eval-harness loglikelihood: context + continuation, the continuation's logprob sum.
    context, cont = "Question: what is two plus two? Answer:", " four"
    r = client.completions.create(model="emb-last", prompt=context + cont, max_tokens=0, echo=True, logprobs=1,
                                  temperature=0)
    lp = r.choices[0].logprobs
    cids = ids_of(context + cont)
    ref = ref_logprobs(cids)
    n_ctx = len(ids_of(context))
    start = next(k for k, off in enumerate(lp.text_offset) if off >= len(context))
    check(start == n_ctx, f"continuation starts at token {start}, expected {n_ctx}")
    got_sum = sum(lp.token_logprobs[start:])
    want_sum = sum(ref[t - 1, cids[t]] for t in range(n_ctx, len(cids)))
    check(abs(got_sum - want_sum) < LP_TOL * (len(cids) - n_ctx),
          f"loglikelihood {got_sum} vs float64 reference {want_sum}")

    # Echo with generation, plain and streamed (vLLM: the prompt is the first chunk).
    full = client.completions.create(model="emb-last", prompt=prompt, max_tokens=6, echo=True, logprobs=0,
                                     temperature=0)
    text = full.choices[0].text
    check(text.startswith(prompt) and len(full.choices[0].logprobs.tokens) == len(pids) + 6, f"echo: {text!r}")
    chunks = list(client.completions.create(model="emb-last", prompt=prompt, max_tokens=6, echo=True, temperature=0,
                                            stream=True))
    check(chunks[0].choices[0].text == prompt, f"the first streamed chunk is not the prompt: {chunks[0]!r}")
    check("".join(c.choices[0].text for c in chunks if c.choices) == text, "streamed echo != non-streamed")
    plain = client.completions.create(model="emb-last", prompt=prompt, max_tokens=0, echo=True)
    check(plain.choices[0].text == prompt and plain.choices[0].logprobs is None, "echo without logprobs")
finally:
    srv.stop()
print("PASS")
