"""BERT encoder packages (modelpkg packs them: weights under canonical names, the WordPiece
tokenizer, pooling, normalization and max_seq_length in the config; docs/models.md).

The encoder forward is not built yet: it needs servd ops that do not exist (LayerNorm with bias,
GELU with erf, and attention without the causal mask over packed sequences). Until they exist a
BERT package is refused at load with this reason, never served with wrong vectors.
"""
import servd


class BertModel:
    def __init__(self):
        cfg = dict(servd.package.config)
        raise RuntimeError(
            "bert: servd cannot run BERT encoders yet (the package of "
            f"{cfg.get('num_hidden_layers', '?')} layers is complete, but the forward needs the "
            "layernorm, gelu and bidirectional attention ops, which are not built)")
