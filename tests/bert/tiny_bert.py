"""A tiny random BERT as a Hugging Face folder (transformers' names, a WordPiece tokenizer.json of
a-z, sentence-transformers' 1_Pooling (CLS), modules.json with Normalize, max_seq_length 20), for the
packing and serving tests. Weights from the caller's numpy Generator."""
import json
import os
import struct

import numpy as np

H, HEADS, INTER, LAYERS, VOCAB, POS = 16, 2, 32, 2, 40, 24

BLOCK = {  # transformers' BertLayer names -> the package's
    "attention.self.query": "self_attn.q_proj", "attention.self.key": "self_attn.k_proj",
    "attention.self.value": "self_attn.v_proj", "attention.output.dense": "self_attn.o_proj",
    "attention.output.LayerNorm": "post_attention_layernorm", "intermediate.dense": "mlp.up_proj",
    "output.dense": "mlp.down_proj", "output.LayerNorm": "post_feedforward_layernorm",
}
GLOBAL = {"embeddings.word_embeddings.weight": "model.embed_tokens.weight",
          "embeddings.position_embeddings.weight": "model.embed_positions.weight",
          "embeddings.token_type_embeddings.weight": "model.embed_token_types.weight",
          "embeddings.LayerNorm.weight": "model.embed_norm.weight",
          "embeddings.LayerNorm.bias": "model.embed_norm.bias"}


def write_safetensors(path, tensors):
    hdr, blobs, off = {}, [], 0
    for k, a in tensors.items():
        dt = {np.float32: "F32", np.int64: "I64"}[a.dtype.type]
        b = a.tobytes()
        hdr[k] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(hdr).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def bert_tensors(rng, prefix="", labels=0):
    shapes = {"embeddings.word_embeddings.weight": (VOCAB, H), "embeddings.position_embeddings.weight": (POS, H),
              "embeddings.token_type_embeddings.weight": (2, H), "embeddings.LayerNorm.weight": (H,),
              "embeddings.LayerNorm.bias": (H,)}
    for l in range(LAYERS):
        for src in BLOCK:
            rows = INTER if src == "intermediate.dense" else H
            cols = INTER if src == "output.dense" else H
            if "LayerNorm" in src:
                shapes[f"encoder.layer.{l}.{src}.weight"] = (H,)
            else:
                shapes[f"encoder.layer.{l}.{src}.weight"] = (rows, cols)
            shapes[f"encoder.layer.{l}.{src}.bias"] = (rows,)
    t = {prefix + k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
    t[prefix + "embeddings.position_ids"] = np.arange(POS, dtype=np.int64).reshape(1, POS)
    if labels:
        t["bert.pooler.dense.weight"] = rng.standard_normal((H, H)).astype(np.float32)
        t["bert.pooler.dense.bias"] = rng.standard_normal(H).astype(np.float32)
        t["classifier.weight"] = rng.standard_normal((labels, H)).astype(np.float32)
        t["classifier.bias"] = rng.standard_normal(labels).astype(np.float32)
    return t


def tokenizer_json():
    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]"] + [chr(97 + i) for i in range(26)] +
                                        ["##" + chr(97 + i) for i in range(10)])}
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
              "special": True} for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]"])]
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
            "normalizer": {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True,
                           "strip_accents": None, "lowercase": True},
            "pre_tokenizer": {"type": "BertPreTokenizer"},
            "post_processor": {"type": "BertProcessing", "sep": ["[SEP]", 3], "cls": ["[CLS]", 2]},
            "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": True},
            "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                      "max_input_chars_per_word": 100, "vocab": vocab}}


def make_folder(d, tensors, archs, extra_config=None, st_files=True):
    os.makedirs(d, exist_ok=True)
    cfg = {"architectures": archs, "model_type": "bert", "hidden_size": H, "num_attention_heads": HEADS,
           "intermediate_size": INTER, "num_hidden_layers": LAYERS, "vocab_size": VOCAB,
           "max_position_embeddings": POS, "type_vocab_size": 2, "hidden_act": "gelu", "layer_norm_eps": 1e-12,
           "position_embedding_type": "absolute"}
    cfg.update(extra_config or {})
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
    json.dump(tokenizer_json(), open(os.path.join(d, "tokenizer.json"), "w"))
    write_safetensors(os.path.join(d, "model.safetensors"), tensors)
    if st_files:
        os.makedirs(os.path.join(d, "1_Pooling"), exist_ok=True)
        json.dump({"word_embedding_dimension": H, "pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False},
                  open(os.path.join(d, "1_Pooling", "config.json"), "w"))
        json.dump([{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                   {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
                   {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}],
                  open(os.path.join(d, "modules.json"), "w"))
        json.dump({"max_seq_length": 20, "do_lower_case": False}, open(os.path.join(d, "sentence_bert_config.json"), "w"))
