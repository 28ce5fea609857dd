"""Tokenizer (with chat template) from the HF folder or the GGUF metadata, via transformers."""
from __future__ import annotations

import os

from . import find_gguf


def load_tokenizer(model_path: str):
    from transformers import AutoTokenizer

    gguf_file = find_gguf(model_path)
    if gguf_file:
        return AutoTokenizer.from_pretrained(os.path.dirname(gguf_file), gguf_file=os.path.basename(gguf_file))
    return AutoTokenizer.from_pretrained(model_path)
