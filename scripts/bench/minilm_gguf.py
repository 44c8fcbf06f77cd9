#!/usr/bin/env python3
"""Writes a sentence-transformers BERT folder (all-MiniLM-L6-v2) as a GGUF that llama.cpp's BERT
graph loads, the way its convert_hf_to_gguf.py (BertModel) writes one: f16 matrices, f32 vectors,
the WordPiece vocabulary in its phantom-space form ("##x" -> "x", "x" -> "\u2581x", "[X]" kept),
mean pooling. gguf-py only (no torch): for the llama-server anchor of bert_embeddings.py.

    minilm_gguf.py FOLDER OUT.gguf
"""
import json
import os
import sys

import numpy as np
import gguf

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "bert"))
from bert_ref import read_safetensors  # noqa: E402

BLOCK = {"attention.self.query": "attn_q", "attention.self.key": "attn_k", "attention.self.value": "attn_v",
         "attention.output.dense": "attn_output", "attention.output.LayerNorm": "attn_output_norm",
         "intermediate.dense": "ffn_up", "output.dense": "ffn_down", "output.LayerNorm": "layer_output_norm"}
GLOBAL = {"embeddings.word_embeddings": "token_embd", "embeddings.position_embeddings": "position_embd",
          "embeddings.token_type_embeddings": "token_types", "embeddings.LayerNorm": "token_embd_norm"}


def phantom(tok):
    if tok.startswith("[") and tok.endswith("]"):
        return tok
    return tok[2:] if tok.startswith("##") else "\u2581" + tok


def main():
    folder, out = sys.argv[1], sys.argv[2]
    cfg = json.load(open(os.path.join(folder, "config.json")))
    tj = json.load(open(os.path.join(folder, "tokenizer.json")))
    w = gguf.GGUFWriter(out, "bert")
    w.add_name(os.path.basename(folder.rstrip("/")))
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_layer_norm_eps(cfg.get("layer_norm_eps", 1e-12))
    w.add_causal_attention(False)
    w.add_pooling_type(gguf.PoolingType.MEAN)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    vocab = tj["model"]["vocab"]
    tokens = [None] * len(vocab)
    for t, i in vocab.items():
        tokens[i] = t
    w.add_tokenizer_model("bert")
    w.add_tokenizer_pre("default")
    w.add_token_list([phantom(t) for t in tokens])
    special = {t["id"] for t in tj.get("added_tokens", []) if t.get("special")}
    w.add_token_types([gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL for i in range(len(tokens))])
    w.add_token_type_count(cfg.get("type_vocab_size", 2))
    w.add_unk_token_id(vocab["[UNK]"])
    w.add_bos_token_id(vocab["[CLS]"])  # llama.cpp's WPM vocabulary: [CLS] is BOS, [SEP] is EOS and SEP
    w.add_eos_token_id(vocab["[SEP]"])
    w.add_sep_token_id(vocab["[SEP]"])
    w.add_pad_token_id(vocab["[PAD]"])
    if "[MASK]" in vocab:
        w.add_mask_token_id(vocab["[MASK]"])
    w.add_add_bos_token(True)
    w.add_add_eos_token(True)
    for name, t in sorted(read_safetensors(os.path.join(folder, "model.safetensors")).items()):
        if name.endswith("position_ids"):
            continue
        base, kind = name.rsplit(".", 1)
        if base in GLOBAL:
            dst = f"{GLOBAL[base]}.{kind}"
        elif base.startswith("encoder.layer."):
            n, rest = base[len("encoder.layer."):].split(".", 1)
            dst = f"blk.{n}.{BLOCK[rest]}.{kind}"
        else:
            continue  # the pooler: not used for embeddings
        # llama.cpp adds the token-type row to f32 activations directly: it stays f32, as the converter keeps it
        a = t.astype(np.float16 if t.ndim == 2 and dst != "token_types.weight" else np.float32)
        w.add_tensor(dst, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
