"""The model families beyond Llama (Mistral, Qwen2, Qwen3, Gemma 3, Phi-3) against the independent numpy reference.

Each family is a tiny random-weight model written by make_tiny.py as a Hugging Face folder and as a
GGUF file (the conventions of llama.cpp's converter for that family), packed with `modelpkg pack`,
run through the packaged model code exactly as the engine runs it (llama_logits: paged KV cache,
prompt in chunks, greedy decoding, a second sequence one step behind in the same batches) and
compared with llama_ref.py, written from the transformers modeling files. Tolerance as in
test_llama.py: max |servd - ref| <= 2e-5 of the largest logit (f32 against float64); a dropped bias
or per-head norm, or the wrong RoPE pairing, moves logits by O(1).

Gemma 3: Hugging Face (tied, TP=2; an explicit layer_types with linear RoPE scaling; the "gemma3"
config with text_config and language_model.* tensor names) and GGUF (norms stored as 1 + w, the query
scale llama.cpp derives from head_dim, linear scaling from gemma3.rope.scaling.*): local layers use
the attention window (8 tokens of a 37-token sequence), so a window dropped or misplaced fails.

Phi-3: Hugging Face (TP=2) and GGUF (attn_qkv, ffn_up holding gate_up): the fused tensors taken as
row views, the sliding window (8) in the attention op. LongRoPE from both sources (the GGUF's
rope_factors_long/short tensors and attn_factor): a sequence within original_max_position_embeddings
(64) with the short factors, one of 80 prompt tokens in one chunk with the long ones, each against
the reference, whose short and long factors change the logits. Refusals for a fused tensor of the
wrong shape, another rope type, a partial rotary factor, LongRoPE factors of the wrong length.

Qwen2 with YaRN (factor 4 of 64 original positions) from both sources (GGUF qwen2.rope.scaling.*),
the reference's YaRN changing the logits; a YaRN config without a factor is refused, naming the key.

Also: the manifest's architecture and rope_layout per source; Mistral's context capped at its
sliding window at pack time (with the line saying so); TP=2; `servd generate` stopping at the
second of two end-of-sequence ids of generation_config.json; and packing refused, naming the
tensor or key, for a missing bias, a wrong per-head norm shape, an unexpected tensor and an unknown
model_type.

    test_families.py --logits BIN --modelpkg BIN [--servd BIN] --work DIR
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import zipfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import llama_ref  # noqa: E402
import make_tiny  # noqa: E402
import test_llama as T  # noqa: E402  (servd_logits, compare, check share its failure list)

check = T.check


def manifest(pkg):
    return json.loads(zipfile.ZipFile(pkg).read("manifest.json"))


def pack_fails(args, src, out, expect):
    r = subprocess.run([args.modelpkg, "pack", src, "-o", out, "--quiet"], capture_output=True, text=True, timeout=120)
    msg = (r.stderr or r.stdout).strip()
    check(r.returncode == 1 and expect in msg and not os.path.exists(out),
          f"pack refused: {expect!r} in {msg!r}")


def rewrite_weights(folder, fn):
    _, w = llama_ref.load_folder(folder)
    w = fn({k: v.astype(np.float32) for k, v in w.items()})
    make_tiny.write_safetensors(os.path.join(folder, "model.safetensors"), w)


def servd_logits_of(args, pkg, out, prompt, chunk):
    """T.servd_logits for another prompt: (prompt rows + decoded rows, greedy ids, the pair's rows)."""
    saved = T.PROMPT
    T.PROMPT = prompt
    try:
        return T.servd_logits(args, pkg, out, chunk=chunk)
    finally:
        T.PROMPT = saved


def compare_of(name, cfg, w, prompt, rows, gen, pair):
    saved = T.PROMPT
    T.PROMPT = prompt
    try:
        return T.compare(name, cfg, w, rows, gen, pair)
    finally:
        T.PROMPT = saved


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--logits", required=True)
    ap.add_argument("--modelpkg", required=True)
    ap.add_argument("--servd")
    ap.add_argument("--work", required=True)
    args = ap.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    py = sys.executable
    try:
        import gguf  # noqa: F401  (test-only, from .venv-test)
        have_gguf = True
    except ImportError:
        have_gguf = False
        print("note: python module gguf missing (scripts/install-deps.sh): the GGUF variants are skipped")

    # (name, family, extra make_tiny args, GGUF?, TP=2?, expected architecture, rope_layout)
    variants = [
        ("qwen2-hf-tied", "qwen2", [], False, True, "qwen2", "half"),
        ("qwen2-gguf-untied", "qwen2", ["--untied"], True, False, "qwen2", "half"),
        ("qwen2-hf-yarn", "qwen2", ["--yarn"], False, True, "qwen2", "half"),
        ("qwen2-gguf-yarn", "qwen2", ["--yarn", "--untied"], True, False, "qwen2", "half"),
        ("qwen3-hf-tied", "qwen3", [], False, True, "qwen3", "half"),
        ("qwen3-gguf-untied", "qwen3", ["--untied"], True, False, "qwen3", "half"),
        ("mistral-hf-untied", "mistral", ["--untied"], False, True, "mistral", "half"),
        ("mistral-gguf", "mistral", [], True, False, "llama", "interleaved"),
        ("gemma3-hf-tied", "gemma3", [], False, True, "gemma3", "half"),
        ("gemma3-hf-types-linear", "gemma3", ["--layer-types", "--linear-scaling"], False, False, "gemma3", "half"),
        ("gemma3-gguf-linear", "gemma3", ["--linear-scaling"], True, False, "gemma3", "half"),
        ("phi3-hf", "phi3", [], False, True, "phi3", "half"),
        ("phi3-gguf", "phi3", [], True, False, "phi3", "half"),
    ]
    for name, fam, extra, use_gguf, tp2, want_arch, want_rope in variants:
        if use_gguf and not have_gguf:
            continue
        folder = os.path.join(args.work, name)
        gg = os.path.join(args.work, name + ".gguf")
        T.run([py, os.path.join(HERE, "make_tiny.py"), folder, "--family", fam] + extra + (["--gguf", gg] if use_gguf else []))
        cfg, w = llama_ref.load_folder(folder)
        out = os.path.join(args.work, name + ".mpk")
        r = T.run([args.modelpkg, "pack", gg if use_gguf else folder, "-o", out])
        m = manifest(out)
        check(m.get("architecture") == want_arch and m.get("rope_layout") == want_rope,
              f"{name}: architecture {m.get('architecture')!r}, rope_layout {m.get('rope_layout')!r}")
        if use_gguf and fam.startswith("qwen"):  # tokenizer.ggml.pre "qwen2": digits one by one
            pre = json.loads(zipfile.ZipFile(out).read("tokenizer.json"))["pre_tokenizer"]
            check("is not known" not in r.stderr and pre["pretokenizers"][0]["pattern"]["Regex"].find("\\p{N}|") > 0,
                  f"{name}: Qwen's pre-tokenizer regex")
        if fam == "mistral" and not use_gguf:
            # servd's attention has no window: the package serves at most sliding_window tokens,
            # where full causal attention is exactly the windowed one.
            check(m["config"]["max_position_embeddings"] == 64 and "capped at 64" in r.stderr,
                  f"{name}: context capped at the sliding window ({m['config']['max_position_embeddings']}; {r.stderr.strip()!r})")
        if fam == "gemma3" and use_gguf:  # llama.cpp's query scale: head_dim^-0.5 (no query_pre_attn_scalar key)
            cfg = dict(cfg, query_pre_attn_scalar=cfg["head_dim"])
        rows, gen, pair = T.servd_logits(args, out, os.path.join(args.work, name + ".bin"))
        T.compare(name, cfg, w, rows, gen, pair)
        if tp2:
            rows2, gen2, pair2 = T.servd_logits(args, out, os.path.join(args.work, name + ".tp2.bin"), tp=2, chunk=7)
            check(gen2 == gen, f"{name}: TP=2 greedy tokens == TP=1")
            T.compare(name + " tp2", cfg, w, rows2, gen2, pair2)

    # Within the window a windowed reference equals the full one (what makes the cap exact); beyond
    # it they differ, so the reference does apply the window.
    cfg, w = llama_ref.load_folder(os.path.join(args.work, "mistral-hf-untied"))
    toks = (T.PROMPT * 4)[:80]
    win = llama_ref.forward(cfg, w, toks)
    full = llama_ref.forward(dict(cfg, sliding_window=None), w, toks)
    check(np.abs(win[:64] - full[:64]).max() < 1e-12 and np.abs(win[64:] - full[64:]).max() > 1e-3,
          "reference: the window changes nothing within 64 tokens and something beyond")

    # Gemma 3: the reference's window, (1 + w) norms and local/global RoPE each change the logits (so
    # the comparisons above would catch servd dropping one).
    cfg, w = llama_ref.load_folder(os.path.join(args.work, "gemma3-hf-tied"))
    toks = T.PROMPT
    base = llama_ref.forward(cfg, w, toks)
    for what, c2 in (("no window", dict(cfg, sliding_window=10 ** 6)), ("all global", dict(cfg, sliding_window_pattern=1)),
                     ("linear scaling", dict(cfg, rope_scaling={"rope_type": "linear", "factor": 8.0})),
                     ("query scale", dict(cfg, query_pre_attn_scalar=16))):
        check(np.abs(llama_ref.forward(c2, w, toks) - base).max() > 1e-3, f"gemma3 reference: {what} changes the logits")

    # Phi-3: the reference's window and the order within the fused tensors change the logits; LongRoPE
    # (short factors within original_max_position_embeddings, long ones beyond) changes them too.
    pcfg, pw = llama_ref.load_folder(os.path.join(args.work, "phi3-hf"))
    pbase = llama_ref.forward(pcfg, pw, T.PROMPT)
    swapped = {k: (np.concatenate(np.split(v, 2)[::-1]) if k.endswith("gate_up_proj.weight") else v) for k, v in pw.items()}
    check(np.abs(llama_ref.forward(dict(pcfg, sliding_window=None), pw, T.PROMPT) - pbase).max() > 1e-3
          and np.abs(llama_ref.forward(pcfg, swapped, T.PROMPT) - pbase).max() > 1e-3,
          "phi3 reference: the window and the gate/up order change the logits")
    folder = os.path.join(args.work, "phi3-longrope")
    gg = folder + ".gguf"
    T.run([py, os.path.join(HERE, "make_tiny.py"), folder, "--family", "phi3", "--longrope"]
          + (["--gguf", gg] if have_gguf else []))
    lcfg, lw = llama_ref.load_folder(folder)
    short, long_ = llama_ref.forward(lcfg, lw, T.PROMPT), llama_ref.forward(lcfg, lw, (T.PROMPT * 3)[:80])
    plain = dict(lcfg, rope_scaling=None)
    check(np.abs(short - llama_ref.forward(plain, lw, T.PROMPT)).max() > 1e-3
          and np.abs(long_[:len(T.PROMPT)] - llama_ref.forward(plain, lw, (T.PROMPT * 3)[:80])[:len(T.PROMPT)]).max() > 1e-3
          and np.abs(long_[:len(T.PROMPT)] - short).max() > 1e-3,
          "phi3 reference: LongRoPE's short and long factors change the logits")
    # servd with LongRoPE from both sources: short factors (37 positions), then long ones (an 80-token
    # prompt in one chunk: transformers' forward of it uses the long factors at every position).
    long_prompt = (T.PROMPT * 3)[:80]
    for src, tag in ((folder, "hf"), (gg, "gguf")):
        if tag == "gguf" and not have_gguf:
            continue
        out = os.path.join(args.work, f"phi3-longrope-{tag}.mpk")
        T.run([args.modelpkg, "pack", src, "-o", out, "--quiet"])
        rows, gen, pair = T.servd_logits(args, out, out + ".bin")
        T.compare(f"phi3-longrope-{tag} short", lcfg, lw, rows, gen, pair)
        rows, gen, pair = servd_logits_of(args, out, out + ".long.bin", long_prompt, chunk=len(long_prompt))
        compare_of(f"phi3-longrope-{tag} long", lcfg, lw, long_prompt, rows, gen, pair)

    # YaRN: the reference's scaling changes the logits (so the comparisons above would catch servd
    # dropping it).
    ycfg, yw = llama_ref.load_folder(os.path.join(args.work, "qwen2-hf-yarn"))
    check(np.abs(llama_ref.forward(ycfg, yw, T.PROMPT) - llama_ref.forward(dict(ycfg, rope_scaling=None), yw, T.PROMPT)).max()
          > 1e-3, "qwen2 reference: YaRN changes the logits")

    # A bf16 checkpoint: transformers casts sqrt(hidden) to bf16 (sqrt(48) = 6.928 -> 6.9375), and so
    # does the model code for a bf16 embedding; the f32 scale would move the logits by ~1e-3.
    bf = os.path.join(args.work, "gemma3-bf16")
    shutil.copytree(os.path.join(args.work, "gemma3-hf-tied"), bf)
    json.dump(dict(cfg, torch_dtype="bfloat16"), open(os.path.join(bf, "config.json"), "w"))
    _, w32 = llama_ref.load_folder(bf)
    make_tiny.write_safetensors(os.path.join(bf, "model.safetensors"), {k: v.astype(np.float32) for k, v in w32.items()},
                                bf16=("model.embed_tokens.weight",))
    cfg_bf, w_bf = llama_ref.load_folder(bf)
    out = os.path.join(args.work, "gemma3-bf16.mpk")
    T.run([args.modelpkg, "pack", bf, "-o", out, "--quiet"])
    rows, gen, pair = T.servd_logits(args, out, os.path.join(args.work, "gemma3-bf16.bin"))
    T.compare("gemma3-bf16", cfg_bf, w_bf, rows, gen, pair)
    f32_scale = llama_ref.forward(dict(cfg_bf, torch_dtype="float32"), w_bf, T.PROMPT)
    check(np.abs(f32_scale - llama_ref.forward(cfg_bf, w_bf, T.PROMPT)).max() > 1e-4,
          "gemma3 reference: the bf16 normalizer changes the logits")

    # "gemma3" (Gemma3ForConditionalGeneration): the text model of text_config under language_model.*
    folder = os.path.join(args.work, "gemma3-hf-tied")
    mm = os.path.join(args.work, "gemma3-multimodal")
    shutil.copytree(folder, mm)
    json.dump({"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"], "text_config": cfg,
               "vision_config": {"model_type": "siglip_vision_model"}}, open(os.path.join(mm, "config.json"), "w"))
    rewrite_weights(mm, lambda w: dict({"language_model." + k: v for k, v in w.items()},
                                       **{"vision_tower.patch.weight": np.ones(4, np.float32)}))
    out = os.path.join(args.work, "gemma3-multimodal.mpk")
    r = T.run([args.modelpkg, "pack", mm, "-o", out])
    check(manifest(out)["config"]["model_type"] == "gemma3_text" and "text_config" in r.stderr,
          f"gemma3 with text_config: packed as gemma3_text ({r.stderr.strip()!r})")
    rows, gen, pair = T.servd_logits(args, out, os.path.join(args.work, "gemma3-multimodal.bin"))
    T.compare("gemma3-multimodal", cfg, w, rows, gen, pair)

    # Several end-of-sequence ids (Qwen2.5's generation_config has [<|im_end|>, <|endoftext|>]): the
    # engine stops at the second one. It is chosen as the reference's k-th greedy token.
    if args.servd and os.path.exists(args.servd):
        text = "Hello there"
        cfg, w = llama_ref.load_folder(os.path.join(args.work, "qwen2-hf-tied"))
        ref = llama_ref.greedy(cfg, w, list(text.encode()), 12)
        k = next((i for i in range(1, 12) if ref[i] not in ref[:i]), 0)
        folder = os.path.join(args.work, "qwen2-eos")
        T.run([py, os.path.join(HERE, "make_tiny.py"), folder, "--family", "qwen2", "--eos", f"270,{ref[k]}"])
        pkg = os.path.join(args.work, "qwen2-eos.mpk")
        T.run([args.modelpkg, "pack", folder, "-o", pkg, "--quiet"])
        ids = os.path.join(args.work, "eos.ids")
        T.run([args.servd, "generate", "--model", pkg, "--prompt", text, "--max-tokens", "12", "--no-special",
               "--kv-f32", "--threads", "2", "--ids-out", ids, "--quiet"])
        got = [int(x) for x in open(ids).read().split()]
        check(got == ref[:k + 1], f"servd generate: stops at the second eos id {ref[k]}: {got} == {ref[:k + 1]}")
    else:
        print("note: no servd executable: the end-of-sequence check is skipped")

    # Bad input: each refusal names the tensor or key.
    bad = os.path.join(args.work, "bad.mpk")
    folder = os.path.join(args.work, "qwen2-bad")
    T.run([py, os.path.join(HERE, "make_tiny.py"), folder, "--family", "qwen2"])
    rewrite_weights(folder, lambda w: {k: v for k, v in w.items() if k != "model.layers.1.self_attn.k_proj.bias"})
    pack_fails(args, folder, bad, 'tensor "model.layers.1.self_attn.k_proj.bias": missing, expected shape (32,)')
    folder = os.path.join(args.work, "qwen3-bad")
    T.run([py, os.path.join(HERE, "make_tiny.py"), folder, "--family", "qwen3"])
    rewrite_weights(folder, lambda w: dict(w, **{"model.layers.0.self_attn.q_norm.weight": np.ones(16, np.float32)}))
    pack_fails(args, folder, bad, 'tensor "model.layers.0.self_attn.q_norm.weight": shape (16,), expected (32,)')
    # Qwen3 tensors under a Llama config: the code would ignore the norms.
    c = json.load(open(os.path.join(folder, "config.json")))
    rewrite_weights(folder, lambda w: dict(w, **{"model.layers.0.self_attn.q_norm.weight": np.ones(32, np.float32)}))
    json.dump(dict(c, model_type="llama", architectures=["LlamaForCausalLM"]), open(os.path.join(folder, "config.json"), "w"))
    pack_fails(args, folder, bad, 'tensor "model.layers.0.self_attn.q_norm.weight": unexpected for a llama model')
    json.dump(dict(c, model_type="qwen9"), open(os.path.join(folder, "config.json"), "w"))
    pack_fails(args, folder, bad, 'model_type "qwen9" is no known architecture; known architectures are: llama')
    json.dump(dict(c, use_sliding_window="yes"), open(os.path.join(folder, "config.json"), "w"))
    pack_fails(args, folder, bad, '"use_sliding_window": expected true or false')
    json.dump(dict(c, rope_scaling={"type": "yarn", "original_max_position_embeddings": 64}),
              open(os.path.join(folder, "config.json"), "w"))
    pack_fails(args, folder, bad, '"rope_scaling.factor": missing, expected a number >= 1 (yarn)')
    folder = os.path.join(args.work, "gemma3-bad")
    T.run([py, os.path.join(HERE, "make_tiny.py"), folder, "--family", "gemma3"])
    c = json.load(open(os.path.join(folder, "config.json")))
    for key, val, expect in (("final_logit_softcapping", 30.0, '"final_logit_softcapping": expected null'),
                             ("rope_scaling", {"rope_type": "yarn", "factor": 8.0}, 'rope_scaling type "yarn"'),
                             ("layer_types", ["full_attention"] * 5, '"layer_types": expected 6 of'),
                             ("hidden_activation", "gelu", '"hidden_activation": expected "gelu_pytorch_tanh"')):
        json.dump(dict(c, **{key: val}), open(os.path.join(folder, "config.json"), "w"))
        pack_fails(args, folder, bad, expect)
    json.dump(c, open(os.path.join(folder, "config.json"), "w"))
    rewrite_weights(folder, lambda w: {k: v for k, v in w.items() if k != "model.layers.2.post_feedforward_layernorm.weight"})
    pack_fails(args, folder, bad, 'tensor "model.layers.2.post_feedforward_layernorm.weight": missing, expected shape (48,)')

    folder = os.path.join(args.work, "phi3-bad")
    T.run([py, os.path.join(HERE, "make_tiny.py"), folder, "--family", "phi3"])
    c = json.load(open(os.path.join(folder, "config.json")))
    half = c["hidden_size"] // c["num_attention_heads"] // 2
    for key, val, expect in (("rope_scaling", {"type": "yarn", "factor": 4.0}, 'rope_scaling type "yarn": expected null'),
                             ("rope_scaling", {"type": "longrope", "short_factor": [1.0] * half,
                                               "long_factor": [1.0] * (half - 1)},
                              f'"rope_scaling.long_factor": expected a list of head_dim/2 = {half} numbers'),
                             ("partial_rotary_factor", 0.5, '"partial_rotary_factor" 0.5: expected 1.0')):
        json.dump(dict(c, **{key: val}), open(os.path.join(folder, "config.json"), "w"))
        pack_fails(args, folder, bad, expect)
    json.dump(c, open(os.path.join(folder, "config.json"), "w"))
    # qkv_proj of heads x head_dim rows only (K and V missing): (64, 64), expected (128, 64)
    rewrite_weights(folder, lambda w: dict(w, **{"model.layers.1.self_attn.qkv_proj.weight":
                                                 w["model.layers.1.self_attn.qkv_proj.weight"][:64]}))
    pack_fails(args, folder, bad, 'tensor "model.layers.1.self_attn.qkv_proj.weight": shape (64, 64), expected (128, 64)')

    # A GGUF of each architecture without its block_count (the writer's call dropped): refused, naming the key.
    if have_gguf:
        for fam in ("qwen2", "phi3", "gemma3"):
            gg = os.path.join(args.work, f"{fam}-nokey.gguf")
            T.run([py, "-c", "import sys, gguf; sys.path.insert(0, sys.argv[1]); "
                   "gguf.GGUFWriter.add_block_count = lambda self, n: None; import make_tiny; "
                   "sys.argv = ['make_tiny.py'] + sys.argv[2:]; make_tiny.main()",
                   HERE, os.path.join(args.work, f"{fam}-nokey"), "--family", fam, "--gguf", gg])
            pack_fails(args, gg, bad, f"{fam}.block_count: missing (required for a {fam} model)")

    if T.failures:
        print(f"{len(T.failures)} check(s) failed")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
