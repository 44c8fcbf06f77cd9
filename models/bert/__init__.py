"""BERT-family encoders (package_format/src/arch_bert.c): sentence embeddings and cross-encoders."""
