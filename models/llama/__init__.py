"""Llama-family model code carried by servd packages (entry point llama.model:LlamaModel)."""
